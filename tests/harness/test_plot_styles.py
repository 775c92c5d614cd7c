"""The leaderboard page's plots tell every method apart: one (colour, marker) per preset, the same on every plot,
measured or published, OScaR's red for OScaR alone; and they write numbers plain, as the tables do."""

from __future__ import annotations

from harness.report import html as report_html
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


def figures(monkeypatch) -> list:
    """The matplotlib figures the plots draw, caught before they become PNGs."""
    import matplotlib

    matplotlib.use("Agg")
    caught: list = []
    monkeypatch.setattr(report_html, "png", caught.append)
    return caught


def test_published_charts_colour_each_method_as_the_measured_ones(monkeypatch):
    """One method -> colour map for the whole page: TurboQuant+ in the paper's chart is TurboQuant's colour, never the
    red that means OScaR on every other chart."""
    import json
    from pathlib import Path

    from matplotlib.colors import to_hex

    paper = json.loads((Path(__file__).resolve().parents[2] / "results" / "paper.json").read_text())
    style = report_html.colours(list(PRESETS))
    caught = figures(monkeypatch)
    for bench in paper["benchmarks"]:
        report_html.published_plot(bench, style)
        drawn = {c.get_label(): to_hex(c.patches[0].get_facecolor()) for c in caught.pop().axes[0].containers}
        labels = bench.get("method_labels", {})
        assert drawn == {labels.get(m, m): style[m][0] for m in bench["methods"]}
        assert drawn["TurboQuant+"] == style["turboquant"][0] != style["oscar"][0]


def test_oscars_colour_is_oscars_alone():
    oscar = report_html.PRESET_STYLES["oscar"][0]
    assert [m for m, (c, _) in report_html.PRESET_STYLES.items() if c == oscar] == ["oscar"]
    assert oscar not in report_html.OTHER_COLOURS
    method_colours = {c for c, _ in report_html.PRESET_STYLES.values()} | set(report_html.OTHER_COLOURS)
    for key, (label, colour, _) in report_html.SPEED_SERIES.items():
        if key.startswith("oscar"):
            assert colour == oscar, label
        elif key.startswith("best_bf16"):
            assert colour == report_html.PRESET_STYLES["bf16"][0], label
        else:  # the read floor is no method
            assert colour not in method_colours, label


def test_chart_numbers_are_plain(monkeypatch):
    """Bar labels and tick labels as the tables write numbers: 1756, not 1.76e+03, 10^3 or an offset."""
    from pathlib import Path

    from harness.bench import check as bench_check

    data = bench_check.load(Path(__file__).resolve().parents[2] / "results" / "bench" / "h100.json")
    caught = figures(monkeypatch)
    report_html.memory_plot(data)
    report_html.speed_plot(data)
    texts = []
    for fig in caught:
        fig.canvas.draw()
        for ax in fig.axes:
            texts += [t.get_text() for t in ax.texts]  # bar labels
            for axis in (ax.xaxis, ax.yaxis):
                texts += [t.get_text() for minor in (False, True) for t in axis.get_ticklabels(minor=minor)]
                texts.append(axis.get_offset_text().get_text())
    bar_labels = [t.get_text() for ax in caught[0].axes for t in ax.texts]
    assert any(len(t) >= 4 and t.isdigit() for t in bar_labels)  # thousands of tokens/s, written out
    for text in texts:
        assert "e+" not in text and "e-" not in text and "^" not in text and "times" not in text, text
