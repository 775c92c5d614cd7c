"""niah end to end through the harness's eval loop on the tiny Qwen3-VL replica (a multimodal model's text path, its
byte-level tokenizer): the task is bound to the loaded model and sized in its tokens, BF16 and OScaR run every item,
the results carry the length, depth, variant and cluster of each record and the length x depth cells; a length above
the model's maximum context is refused before any item runs; the leaderboard draws the heat map from the results."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest

from harness import run as R
from harness.models import tiny
from harness.report import html as report_html
from harness.report import leaderboard, tables
from harness.report import niah as report_niah
from tasks.niah import NiahTask, score

LENGTH = 768
NEW_TOKENS = 4  # random weights: a few tokens exercise decoding as well as 128 would


@pytest.fixture(scope="module")
def adapter():
    return tiny("qwen3_vl")


@pytest.fixture(scope="module")
def results(adapter, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    task = NiahTask(LENGTH, name="niah-768", rounds=1, max_new_tokens=NEW_TOKENS)
    return R.evaluate(
        "qwen3-vl-4b",
        "bf16,oscar",
        task=task,
        adapter=adapter,
        out=str(out / "{task}" / "{model}" / "{method}.json"),
    ), out


def test_bf16_and_oscar_run_every_item(results):
    done, out = results
    assert [r["method"]["name"] for r in done] == ["bf16", "oscar"]
    for result in done:
        assert result["task"]["name"] == "niah-768" and result["task"]["settings"]["length"] == LENGTH
        assert result["primary_metric"] == "string_match_all" and result["n_errors"] == 0
        assert result["metrics"]["string_match_all"]["higher_is_better"]
        samples = result["samples"]
        assert len(samples) == 8 and {s["variant"] for s in samples} == set(score.VARIANTS)
        for s in samples:
            assert s["length"] == LENGTH and s["depth"] in score.DEPTHS and s["cluster"]
            assert s["category"] == score.cell_label(LENGTH, s["depth"])
            assert s["input_tokens"] + NEW_TOKENS <= LENGTH and s["input_tokens"] > LENGTH - 200
            assert s["scores"]["string_match_all"] == score.item_score(s["prediction"], s["answers"])
        expected = score.aggregate(samples)
        assert result["metrics"]["string_match_all"]["value"] == expected["metrics"]["string_match_all"]
        assert {c: v["metrics"]["string_match_all"] for c, v in result["categories"].items()} == {
            c: v["string_match_all"] for c, v in expected["categories"].items()
        }
        written = json.loads(next(out.rglob(f"niah-768/*/{result['method']['name']}.json")).read_text())
        assert written["metrics"] == result["metrics"]
    oscar = done[1]["system"]
    assert oscar["bits_per_element"] < done[0]["system"]["bits_per_element"]  # a quantized cache did hold the input


def test_a_length_above_the_models_maximum_is_refused_before_any_item(adapter, tmp_path):
    assert adapter.text_config.max_position_embeddings == 4096
    with pytest.raises(ValueError) as err:
        R.evaluate(
            "qwen3-vl-4b",
            "bf16",
            task=NiahTask(8192, rounds=1, max_new_tokens=NEW_TOKENS),
            adapter=adapter,
            out=str(tmp_path / "{method}.json"),
        )
    assert str(err.value) == (
        "qwen3-vl-4b: niah-8k needs a context of 8192 tokens, above the model's maximum of 4096 "
        "(its config's max_position_embeddings); run a shorter niah task"
    )
    assert not list(tmp_path.iterdir())  # no result, no progress file


def test_the_registry_has_a_task_per_length():
    import tasks as T

    lengths = {name: T.get_task(name).length for name in T.list_tasks() if name.startswith("niah-")}
    assert lengths == {
        "niah-4k": 4096,
        "niah-8k": 8192,
        "niah-16k": 16384,
        "niah-32k": 32768,
        "niah-64k": 65536,
        "niah-128k": 131072,
    }


def as_trained(result, length):
    """A copy of a replica's result presented as one of trained weights at another length (the leaderboard draws
    only those): the records are the run's, their length relabelled."""
    r = copy.deepcopy(result)
    r["model"].update(replica=False, weights="real")
    r["task"]["name"] = f"niah-{length // 1024}k"
    r["_path"] = f"results/runs/{r['task']['name']}/{r['model']['name']}/{r['method']['name']}.json"
    for s in r["samples"]:
        s["length"], s["category"] = length, score.cell_label(length, s["depth"])
    return r


def test_the_leaderboard_draws_the_heat_map(results):
    done, _ = results
    runs = [as_trained(r, length) for r in done for length in (4096, 8192)]
    board = leaderboard.build_board(runs, None, {})
    md = leaderboard.markdown(board)
    assert f"### niah · {done[0]['model']['name']}: string_match_all by context length" in md
    for r in done:
        overall = score.aggregate(r["samples"])["metrics"]["string_match_all"]
        assert f"| {r['method']['name']} | {tables.fmt(overall)} | {tables.fmt(overall)} |" in md
        for s in r["samples"]:  # each item is alone in its cell: the cell shows its score and (1)
            row = score.depth_label(score.depth_bin(s["depth"]))
            cell = f"{s['scores']['string_match_all']:.4g} (1)"
            assert f"| {row} | {cell} | {cell} |" in md
    assert "niah ·" not in leaderboard.markdown(board, short=True)  # the README's short section leaves it out
    page = report_html.render(board)
    assert 'id="niah"' in page and page.count('<img class="plot"') >= 1
    empty = SimpleNamespace(results=[], methods=[])
    assert report_niah.html_section(empty) == "" and report_niah.markdown_sections(empty) == []
