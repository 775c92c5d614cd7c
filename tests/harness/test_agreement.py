"""Agreement of generated tokens with BF16 (harness.stats.token_agreement), shown by the leaderboard and compare:
the share of items with equal tokens and the mean first divergent step over the items that differ, on hand-made
result pairs; older results without `tokens` fall back to their digests (the share, no step)."""

from __future__ import annotations

import json

import pytest

from harness import results as R
from harness import stats
from harness.cli import main as cli
from harness.report import tables as T
from tests.harness.test_results_factory import make_result

BF16 = [[5, 6, 7, 2], [9, 9, 2], [1, 2, 3, 4, 5, 2], [8, 2], [4, 4, 4, 2]]
# item 0 equal; 1 differs at its 2nd token; 2 at its 5th; 3 stops where BF16 goes on (its 3rd token is BF16's end:
# the step after its end); 4 equal
OTHER = [[5, 6, 7, 2], [9, 3, 2], [1, 2, 3, 4, 6, 2], [8], [4, 4, 4, 2]]


def with_tokens(method: str, tokens: list, **kw) -> dict:
    r = make_result(method, [1] * len(tokens), **kw)
    for sample, t in zip(r["samples"], tokens):
        sample["tokens"] = t
        sample["tokens_sha1"] = "sha-" + ",".join(map(str, t))
    return r


@pytest.mark.parametrize(
    "a, b, step",
    [
        ([1, 2, 3], [1, 2, 3], None),
        ([1, 2, 3], [4, 2, 3], 1),
        ([1, 2, 3], [1, 2, 4], 3),
        ([1, 2], [1, 2, 3], 3),  # one answer the other's beginning: the token after the shorter's end
        ([], [7], 1),
        ([[1, 2], [3, 4]], [[1, 2], [3, 5]], 2),  # an item of two requests: the first that differs, counted in it
        ([[1, 2], [3, 4]], [[1, 2], [3, 4]], None),
    ],
)
def test_first_divergence(a, b, step):
    assert stats.first_divergence(a, b) == step


def test_share_and_mean_first_step_on_a_hand_made_pair():
    ref, other = with_tokens("bf16", BF16), with_tokens("kivi", OTHER)
    got = stats.token_agreement(ref["samples"], other["samples"])
    assert got == {"n": 5, "same": 2, "share": 0.4, "diverged": 3, "mean_first": (2 + 5 + 2) / 3, "by": "tokens"}
    other["samples"][1]["error"] = "generation failed"  # a failed item is left out of both counts
    got = stats.token_agreement(ref["samples"], other["samples"])
    assert (got["n"], got["same"], got["mean_first"]) == (4, 2, (5 + 2) / 2)
    same = stats.token_agreement(ref["samples"], ref["samples"])
    assert (same["share"], same["mean_first"]) == (1.0, None)


def test_older_results_fall_back_to_the_digests():
    ref, other = with_tokens("bf16", BF16), with_tokens("kivi", OTHER)
    for sample in other["samples"]:
        del sample["tokens"]
    got = stats.token_agreement(ref["samples"], other["samples"])
    assert got == {"n": 5, "same": 2, "share": 0.4, "diverged": 3, "mean_first": None, "by": "tokens_sha1"}
    for sample in other["samples"]:
        del sample["tokens_sha1"]
    assert stats.token_agreement(ref["samples"], other["samples"]) is None  # a task that generates nothing


def test_the_leaderboard_shows_agreement_against_bf16_of_the_same_items():
    runs = [with_tokens("bf16", BF16), with_tokens("kivi", OTHER), with_tokens("oscar", BF16)]
    for r in runs:
        r["model"]["replica"] = False
        r["_path"] = f"results/runs/handmade/tiny-model/{r['method']['name']}.json"
    table = T.result_table(("handmade", "generated", "tiny-model"), runs)
    same, first = table.header.index(T.SAME_TOKENS), table.header.index(T.FIRST_DIVERGENCE)
    assert [(row[same], row[first]) for row in table.rows] == [("–", "–"), ("40% of 5", "3"), ("100% of 5", "–")]
    runs[1]["task"]["data_fingerprint"] = "other items"  # not BF16's items: nothing to compare
    assert T.result_table(("handmade", "generated", "tiny-model"), runs).rows[1][same] == "–"
    for r in runs:  # no tokens and no digests (perplexity): no columns
        for sample in r["samples"]:
            sample.pop("tokens"), sample.pop("tokens_sha1")
    assert T.SAME_TOKENS not in T.result_table(("handmade", "generated", "tiny-model"), runs).header


def test_compare_prints_and_writes_the_agreement(tmp_path, capsys):
    a = str(R.write_result(with_tokens("bf16", BF16), tmp_path / "a.json"))
    b = str(R.write_result(with_tokens("kivi", OTHER), tmp_path / "b.json"))
    assert cli(["compare", a, b, "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "generated tokens: B's equal A's in 2 of 5 items (40.0%); where they differ (3 items), the first " in out
    assert "number 3.0 on average (1: the first generated)" in out
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["agreement"]["same"] == 2 and report["agreement"]["by"] == "tokens"
