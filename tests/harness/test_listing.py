"""`oscar-eval list methods`: every preset, with the groups `--quant` takes it in and what its bits mean."""

from __future__ import annotations

import argparse

import quant
from harness import listing
from quant.methods import GROUPS, PRESETS


def test_methods_lists_every_preset_with_its_groups():
    lines = listing.list_methods(argparse.Namespace())
    assert lines[0].split() == ["name", "group", "code", "bits", "family"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:-1]}
    assert list(rows) == list(PRESETS)  # the own-paper presets and the variants too, not only `all`
    for name, (groups, bits, family) in rows.items():
        assert groups.split(",") == [g for g in GROUPS if name in GROUPS[g]]
        assert family == quant.get_method(name).method
        assert float(bits) == getattr(quant.get_method(name), "bits", 16)
    assert rows["bf16"][0] == "all,own-paper" and rows["kivi-own-paper"][0] == "own-paper"
    assert rows["oscar-float-zero"][0] == "variants"
    # code bits, and the last line says so: TurboQuant+'s 2.25 is 2.5 bits per element at head dim 128
    assert rows["turboquant"][1] == "2.25" and lines[-1] == listing.CODE_BITS_NOTE
    assert "2.5 bits per element at head dim 128" in lines[-1]


def test_an_unfinished_run_beside_its_result_is_resumed_with_force_as_eval_says(tmp_path):
    """A killed --force rerun leaves its progress beside the up-to-date result, which a plain rerun skips: `list`
    says --force, as `oscar-eval eval` does; an unfinished run alone resumes with its command."""
    from harness import progress as PF

    PF.open_progress(tmp_path / "kivi.partial.jsonl", {"model": "m"}).add({"id": "a", "scores": {}})
    PF.open_progress(tmp_path / "oscar.partial.jsonl", {"model": "m"}).add({"id": "a", "scores": {}})
    (tmp_path / "kivi.json").write_text("{}")  # the result beside the first
    assert listing._how_to_resume(tmp_path / "kivi.partial.jsonl") == "rerun its command with --force to resume"
    assert listing._how_to_resume(tmp_path / "kivi.rank1.partial.jsonl") == "rerun its command with --force to resume"
    assert listing._how_to_resume(tmp_path / "oscar.partial.jsonl") == "rerun its command to resume"


def test_upgrade_fingerprints_rewrites_up_to_date_results_only(tmp_path, capsys):
    import json
    from pathlib import Path

    from harness import provenance

    root = Path(__file__).resolve().parents[2]
    fresh = tmp_path / "ppl" / "smollm2-135m" / "oscar.json"
    fresh.parent.mkdir(parents=True)
    before = json.loads((root / "results/runs/ppl/smollm2-135m/oscar.json").read_text())
    before["code"] = provenance.current_parts(before, scheme="sha256:")  # as a result of the first scheme records it
    fresh.write_text(json.dumps(before))
    assert provenance.scheme_of(before["code"]) == "sha256:" and provenance.stale_reasons(before) == []
    stale = json.loads(fresh.read_text())
    stale["code"]["task"] = "sha256:0000000000000000"
    (fresh.parent / "kivi.json").write_text(json.dumps(stale))
    assert listing.upgrade_fingerprints(tmp_path) == 0
    assert "1 results now record definitions digests; 1 stale ones left" in capsys.readouterr().out
    after = json.loads(fresh.read_text())
    assert all(v.startswith(provenance.DEFS) for v in after["code"].values()) and set(after["code"]) == set(
        before["code"]
    )
    assert {k: v for k, v in after.items() if k != "code"} == {k: v for k, v in before.items() if k != "code"}
    assert provenance.stale_reasons(after) == []
    assert json.loads((fresh.parent / "kivi.json").read_text())["code"]["task"] == "sha256:0000000000000000"
