"""What an eval costs, per item and per run (harness/models/cost.py, the loop in harness/run.py, results.cost_figures),
and how results of random weights are labelled and kept apart from the real checkpoint's."""

from __future__ import annotations

import pytest

from harness import loop, run
from harness import results as R
from harness.models import MODELS
from harness.models.cost import GenerationClock, generation_cost
from harness.models.qwen3_vl.adapter import Qwen3VLAdapter
from harness.models.synthetic import load_random
from tests.harness.test_shapes import SHRINK


def test_clock_splits_prefill_from_decode():
    clock = GenerationClock()
    clock.put("prompt")
    clock.put("token 1")
    clock.put("token 2")
    clock.end()
    prefill, decode = clock.times()
    assert (prefill, decode) == (clock.first - clock.started, clock.finished - clock.first)
    assert prefill >= 0 and decode >= 0
    idle = GenerationClock()
    idle.put("prompt")
    assert idle.times()[1] == 0.0  # no new token: the whole call is prefill


def test_item_cost_sums_calls_and_keeps_the_largest_peak():
    from tasks.contract import Response

    responses = [
        Response(
            cost=generation_cost(
                {"prefill_s": 1.0, "decode_s": 2.0, "kernel_steps": 3, "peak_cuda_bytes": 10}, 4, {"total": 100}
            )
        ),
        Response(
            cost=generation_cost(
                {"prefill_s": 0.5, "decode_s": 1.0, "kernel_steps": 1, "peak_cuda_bytes": 30}, 2, {"total": 50}
            )
        ),
    ]
    assert loop.item_cost(responses) == {
        "prefill_s": 1.5,
        "decode_s": 3.0,
        "kernel_steps": 4,
        "peak_cuda_bytes": 30,
        "new_tokens": 6,
        "decode_steps": 4,
        "kv_bytes": 100,
        "calls": 2,
    }
    assert loop.item_cost([Response()]) is None  # no generate call (a Score request)


def test_run_figures_from_item_costs():
    records = [
        {
            "id": "a",
            "loop_s": 2.0,
            "cost": {"prefill_s": 1.0, "decode_s": 2.0, "decode_steps": 8, "kernel_steps": 8, "peak_cuda_bytes": 5},
        },
        {
            "id": "b",
            "loop_s": 2.0,
            "cost": {"prefill_s": 1.0, "decode_s": 2.0, "decode_steps": 8, "kernel_steps": 0, "peak_cuda_bytes": 9},
        },
    ]
    figures = R.cost_figures(records, 4.0)
    assert figures == {
        "items_per_s": 0.5,
        "items_per_s_steady": 0.5,
        "prefill_s": 2.0,
        "decode_s": 4.0,
        "decode_steps_per_s": 4.0,
        "kernel_step_share": 0.5,
        "peak_item_cuda_bytes": 9,
    }
    assert R.cost_figures([{"id": "a", "loop_s": 1.0}], 1.0) == {"items_per_s": 1.0}


def test_a_warmed_run_times_every_item_and_reports_its_setup_apart():
    # Batch 2, three calls: without a warm-up the first call's items are left out of the steady rate; a GPU run
    # warmed up first (setup_s on the first timed record of each session: here two sessions) counts every item.
    costs = [{"batch": 2, "ttft_s": t, "prefill_reused": r} for t, r in ((4.0, 0), (4.0, 0), (1.0, 1), (1.0, 1))]
    records = [{"id": str(i), "loop_s": s, "cost": c} for i, (s, c) in enumerate(zip((3.0, 3.0, 1.0, 1.0), costs))]
    assert R.cost_figures(records, 8.0)["items_per_s_steady"] == 1.0  # 2 items in 2 s
    records[0]["setup_s"], records[2]["setup_s"] = 5.0, 0.5
    figures = R.cost_figures(records, 8.0)
    assert figures["items_per_s_steady"] == 0.5 and figures["setup_s"] == 5.5  # 4 items in 8 s
    # Time to first token: the items whose prefill another method ran do not count (theirs was a copy)
    assert figures["ttft_s_median"] == 4.0


@pytest.fixture(scope="module")
def shrunk_qwen3_vl():
    """qwen3-vl-8b's processor settings and token ids on a narrow, 2-layer random model (CPU)."""
    return load_random(
        Qwen3VLAdapter, MODELS["qwen3-vl-8b"], device="cpu", dtype="float32", overrides=SHRINK["qwen3_vl"]
    )


def test_eval_with_random_weights_records_costs_and_is_labelled(tmp_path, shrunk_qwen3_vl):
    from tasks.ocrbench import OCRBenchTask

    out = str(tmp_path / "{task}" / "{model}" / "{method}.json")
    results = run.evaluate(
        "qwen3-vl-8b",
        "oscar,bf16",
        task=OCRBenchTask(max_new_tokens=3),
        data="generated",
        limit=2,
        out=out,
        adapter=shrunk_qwen3_vl,
    )
    for result in results:
        assert result["model"]["weights"] == "random" and not result["model"]["replica"]
        assert any("random weights" in note for note in result["notes"])
        path = tmp_path / "ocrbench.generated" / "qwen3-vl-8b.random" / f"{result['method']['name']}.first2.json"
        assert R.read_result(path) == result  # schema-valid, and apart from the real checkpoint's folder
        for sample in result["samples"]:
            cost = sample["cost"]
            assert cost["calls"] == 1 and cost["new_tokens"] == sample["new_tokens"] == 3
            assert cost["decode_steps"] == 2 and cost["kernel_steps"] == 0  # CPU, torch backend: no kernel path
            assert cost["prefill_s"] > 0 and cost["decode_s"] > 0 and cost["kv_bytes"] > 0
        system = result["system"]
        assert system["items_per_s"] > 0 and system["decode_steps_per_s"] > 0
        assert system["kernel_step_share"] == 0.0 and system["peak_item_cuda_bytes"] is None


def test_kernel_steps_count_the_packed_decode_steps():
    """On the Triton backend (the interpreter on CPU) every decode step of OScaR hands the attention packed codes."""
    import quant
    from harness.models.text.adapter import TextAdapter
    from harness.runner import answer
    from quant.kernels import KernelOptions
    from tasks.contract import Prompt

    text = {k: v for k, v in SHRINK["qwen3_vl"]["text_config"].items()}
    adapter = load_random(TextAdapter, MODELS["qwen3-8b"], device="cpu", dtype="float32", overrides=text)
    triton = KernelOptions(backend="triton")
    oscar = answer(adapter, [Prompt("Hello")], quant.get_method("oscar"), 4, kernels=triton)[0].cost
    assert oscar["decode_steps"] == 4 - 1 == oscar["kernel_steps"]
    kivi = answer(adapter, [Prompt("Hello")], quant.get_method("kivi"), 4, kernels=triton)[0].cost
    assert kivi["kernel_steps"] == 0


def test_tiny_replicas_say_random_weights_and_keep_their_folder():
    info = {"name": "tiny-qwen3-vl", "replica": True, "weights": "random"}
    assert R.model_dir(info) == "tiny-qwen3-vl"
    assert R.model_dir({"name": "qwen3-vl-8b", "replica": False, "weights": "real"}) == "qwen3-vl-8b"
    assert R.model_dir({"name": "qwen3-vl-8b", "replica": False}) == "qwen3-vl-8b"  # older files: real
