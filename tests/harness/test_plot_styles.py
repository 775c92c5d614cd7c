"""The leaderboard page's plots tell every method apart: one (colour, marker) per preset, the same on every plot."""

from __future__ import annotations

from harness import report_html
from quant.methods import PRESETS


def test_every_preset_gets_its_own_style():
    style = report_html.colours(list(PRESETS))
    assert set(style) == set(PRESETS)
    assert len(set(style.values())) == len(PRESETS)  # distinct (colour, marker) pairs
    assert len({c for c, _ in style.values()}) == len(PRESETS)  # and, among the presets, distinct colours
    assert len({m for _, m in style.values()}) == len(PRESETS)  # and distinct markers
    # a method looks the same whichever others share the page
    assert report_html.colours(["oscar-float-zero", "bf16"]) == {m: style[m] for m in ("oscar-float-zero", "bf16")}


def test_methods_of_no_preset_take_unused_styles():
    names = [*PRESETS, "my-oscar", "my-kivi", "my-oscar"]
    style = report_html.colours(names)
    assert len(set(style.values())) == len(set(names))
    assert style["my-oscar"] not in report_html.PRESET_STYLES.values()
