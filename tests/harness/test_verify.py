"""`oscar-eval verify` (harness/verify.py) on the real SmolLM2 model and short perplexity windows: a result staled
by a code change alone is replayed and, where its records come back bit for bit, takes the current digests; a
record that differs keeps it stale; what needs a real rerun is not replayed."""

from __future__ import annotations

import argparse

from harness import provenance, run, verify
from harness import results as R
from tests.harness.test_run import adapter, task  # noqa: F401 - fixtures


def written(tmp_path, adapter, task, quant="bf16,kivi"):  # noqa: F811
    out = str(tmp_path / "{method}.json")
    return [
        (tmp_path / f"{r['method']['name']}.first3.json", r)
        for r in run.evaluate("smollm2-135m", quant, task=task, limit=3, out=out, adapter=adapter)
    ]


def staled(path):
    r = R.read_result(path)
    r["code"]["model"] = "defs:0000000000000000"  # as a change to the eval loop leaves it
    R.write_result(r, path)
    return r


def test_a_result_staled_by_code_alone_is_replayed_and_made_current(tmp_path, adapter, task, capsys):  # noqa: F811
    results = written(tmp_path, adapter, task)
    members = [(path, staled(path)) for path, _ in results]
    assert all(verify.why_not(r) is None for _, r in members)
    assert verify.replay(members, 1, adapter=adapter, task=task) == 0  # rounded up to the batch of 3
    for (path, _), (_, original) in zip(members, results):
        now = R.read_result(path)
        assert not provenance.stale_reasons(now) and now["code"] == original["code"]
        assert now["code_check"]["items"] == 3 and now["code_check"]["of"] == 3
        assert now["code_check"]["parts"] == ["model"]
        assert now["samples"] == original["samples"] and now["metrics"] == original["metrics"]  # nothing else moved
    assert "3 items replayed exactly; current" in capsys.readouterr().err


def test_a_record_that_differs_keeps_the_result_stale(tmp_path, adapter, task, capsys):  # noqa: F811
    [(path, _)] = written(tmp_path, adapter, task, "kivi")
    r = staled(path)
    r["samples"][0]["scores"]["nll_sum"] += 1e-9  # a result this code would not give
    R.write_result(r, path)
    assert verify.replay([(path, R.read_result(path))], 2, adapter=adapter, task=task) == 1
    assert f"item {r['samples'][0]['id']}: scores" in capsys.readouterr().err
    assert provenance.stale_reasons(R.read_result(path))


def test_what_needs_a_rerun_is_not_replayed(tmp_path, adapter, task, capsys):  # noqa: F811
    [(path, result)] = written(tmp_path, adapter, task, "kivi")
    assert verify.why_not(result) == "current"
    r = staled(path)
    r["task"]["version"] -= 1
    assert "a rerun, not a replay" in verify.why_not(r)
    r = staled(path)
    r["method"]["name"] = "kivi@seed=1"
    assert verify.why_not(r).startswith("not a plain run")
    R.write_result(R.read_result(path) | {"task": r["task"] | {"version": r["task"]["version"] - 1}}, path)
    args = argparse.Namespace(paths=[str(path)], runs_dir=str(tmp_path), items=2, dry_run=True)
    assert verify.main(args) == 0
    err = capsys.readouterr().err
    assert "not replayed" in err and "nothing to replay" in err
