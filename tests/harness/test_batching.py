"""Batched generation: prompts of different lengths (images of different sizes, clips of different lengths) in one
left-padded generate give each prompt its batch-1 answer, for every multimodal family and for the eval loop."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from harness.models import tiny
from harness.models.batching import collate, row_tokens
from harness.runner import answer
from tasks.contract import Prompt
from tests.harness.test_adapters import QUESTION, scene, voice


def prompts_for(adapter) -> list[Prompt]:
    """Three prompts of different lengths for the family's modality."""
    if adapter.spec.family == "qwen3_omni":
        return [
            Prompt(QUESTION, audios=[voice(3.0)]),
            Prompt("Name the sound.", audios=[voice(1.2)]),
            Prompt(QUESTION[:60], audios=[voice(2.0), voice(0.8)]),
        ]
    small = scene().resize((48, 36), Image.Resampling.BICUBIC)
    return [
        Prompt(QUESTION, images=[scene()]),
        Prompt("What is written?", images=[small]),
        Prompt(QUESTION[:70], images=[scene().rotate(90, expand=True)]),
    ]


@pytest.mark.parametrize("family", ["llava", "qwen3_vl", "qwen3_omni"])
@pytest.mark.parametrize("method", ["oscar", "kivi"])
def test_batched_answers_equal_batch1_answers(family, method):
    adapter = tiny(family)
    prompts = prompts_for(adapter)
    lengths = {int(adapter.build_inputs(p)["input_ids"].shape[1]) for p in prompts}
    assert len(lengths) == 3 and max(lengths) > 128  # padded, and long enough to quantize part of the prompt
    batched = answer(adapter, prompts, method, max_new_tokens=6)
    for prompt, got in zip(prompts, batched):
        [alone] = answer(adapter, [prompt], method, max_new_tokens=6)
        assert (got.text, got.new_tokens, got.input_tokens) == (alone.text, alone.new_tokens, alone.input_tokens)
        assert got.tokens_sha1 == alone.tokens_sha1 and len(got.tokens_sha1) == 16
        assert got.modality_tokens == alone.modality_tokens
        assert got.kv_bytes["total"] == alone.kv_bytes["total"] and got.cost["batch"] == 3


@pytest.mark.parametrize("family", ["llava", "qwen3_vl", "qwen3_omni"])
def test_batched_answers_on_the_kernel_path(family):
    """The same on the kernel path (Triton, interpreted on the CPU): the rows decode as one stacked layer with
    per-sequence lengths (quant/rows.py), multimodal position ids included."""
    from quant.kernels import KernelOptions

    adapter = tiny(family)
    triton = KernelOptions(backend="triton")
    prompts = prompts_for(adapter)
    batched = answer(adapter, prompts, "oscar", max_new_tokens=6, kernels=triton)
    assert all(got.cost["kernel_steps"] == got.cost["decode_steps"] > 0 for got in batched)
    for prompt, got in zip(prompts, batched):
        [alone] = answer(adapter, [prompt], "oscar", max_new_tokens=6, kernels=triton)
        assert (got.text, got.new_tokens, got.kv_bytes["total"]) == (
            alone.text,
            alone.new_tokens,
            alone.kv_bytes["total"],
        )


def test_collate_left_pads_positions_and_pads_media():
    a = {
        "input_ids": torch.tensor([[5, 6, 7]]),
        "attention_mask": torch.ones(1, 3, dtype=torch.long),
        "input_features": torch.ones(1, 2, 4),
        "feature_attention_mask": torch.ones(1, 4, dtype=torch.long),
    }
    b = {
        "input_ids": torch.tensor([[8]]),
        "attention_mask": torch.ones(1, 1, dtype=torch.long),
        "input_features": torch.ones(2, 2, 6),
        "feature_attention_mask": torch.ones(2, 6, dtype=torch.long),
    }
    out = collate([a, b], pad_token_id=0)
    assert out["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert out["input_features"].shape == (3, 2, 6) and out["input_features"][0, :, 4:].abs().sum() == 0
    assert out["feature_attention_mask"].tolist()[0] == [1, 1, 1, 1, 0, 0]


def test_row_tokens_stop_at_each_rows_end():
    new = torch.tensor([[4, 9, 1, 0, 0], [4, 5, 6, 7, 8]])
    assert [r.tolist() for r in row_tokens(new, {1})] == [[4, 9, 1], [4, 5, 6, 7, 8]]


def test_a_batch_with_a_failing_prompt_answers_the_others():
    """A prompt that cannot be built (here: images given to a text-only processor path) fails alone: the runner
    retries the batch one request at a time, and only that request's response carries the error."""
    adapter = tiny("llava")
    good = prompts_for(adapter)[:2]
    bad = Prompt("two images where the family takes one?", images=["not an image"])
    out = answer(adapter, [good[0], bad, good[1]], "oscar", max_new_tokens=3)
    assert out[1].error and "failed" in out[1].error and out[0].error is None and out[2].error is None
    assert [r.tokens_sha1 for r in (out[0], out[2])] == [r.tokens_sha1 for r in answer(adapter, good, "oscar", 3)]


def test_eval_loop_batches_and_records_the_same_predictions(tmp_path):
    from harness.run import evaluate

    adapter = tiny("llava")
    runs = {}
    for size in (None, 4):  # None: the model's GPU batch size on a GPU, 1 on the CPU
        out = str(tmp_path / f"b{size or 'default'}" / "{task}" / "{model}" / "{method}.json")
        runs[size] = evaluate(
            "tiny-llava",
            "oscar",
            task="ocrbench",
            data="generated",
            limit=6,
            out=out,
            adapter=adapter,
            batch_size=size,
        )[0]
    one, four = (
        [(s["id"], s["prediction"], s["scores"], s["tokens_sha1"]) for s in r["samples"]] for r in (runs[None], runs[4])
    )
    assert one == four and runs[4]["metrics"] == runs[None]["metrics"]
    assert runs[None]["system"]["batch_size"] == 1
    assert runs[4]["system"]["batch_size"] == 4 and runs[4]["samples"][0]["cost"]["batch"] == 4
    assert runs[4]["system"]["kv_bytes"] == runs[None]["system"]["kv_bytes"]
    for r in runs.values():  # time to first token and per output token, per item and their medians
        assert all(s["cost"]["ttft_s"] > 0 for s in r["samples"]) and r["system"]["ttft_s_median"] > 0
        assert r["system"]["tpot_s_median"] > 0


@pytest.mark.parametrize("method", ["oscar", "kivi", "bf16"])
def test_a_row_that_ends_early_counts_only_its_own_tokens_bytes(method):
    """In a batch a row that chose its end token keeps being fed pads until the longest row ends; its KV bytes are
    read when it ended, so they equal what it stores alone (each item's bytes at any batch size)."""
    import quant
    from harness.models import traits_of
    from harness.runner import Generate, Runner

    adapter = tiny("llava")
    texts = [QUESTION, "What is written?", "Name the colours in this picture, please.", QUESTION[:40]]
    # the seeded random weights choose "k" at other steps in two of these answers and never in the others
    requests = [Generate(Prompt(t), max_new_tokens=30, stop=("k",)) for t in texts]
    with Runner(adapter, quant.get_method(method), None, traits_of("tiny-llava")) as runner:
        batched = runner.run(requests)
        alone = [runner.run([r])[0] for r in requests]
    assert len({r.new_tokens for r in batched}) > 1, "the rows must end at different steps for the check to mean much"
    for got, own in zip(batched, alone):
        assert got.tokens == own.tokens and got.cost["batch"] == 4
        assert got.kv_bytes == own.kv_bytes
