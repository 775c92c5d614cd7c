"""The batch-invariant mode (KernelOptions.batch_invariant, quant/invariant.py): each prompt's generated tokens and
every step's logits are bit for bit those of the prompt alone, whatever else shares its batch, for every method and
each multimodal family (the Qwen3-Omni thinker's MoE included); outside the mode they are not."""

from __future__ import annotations

import pytest
import torch

import quant
from harness.models import tiny, traits_of
from harness.runner import Runner
from quant.invariant import BLOCK, blocked_linear, key_span
from quant.kernels.options import KernelOptions
from tasks.contract import Generate
from tests.harness.test_batching import prompts_for

PAPER = ["bf16", "kivi", "quarot", "rotatekv", "ott", "turboquant", "oscar"]
NEW_TOKENS = 4


def generate(adapter, prompts, method, kernels):
    """(responses, per-step logits [B, V] of generate's steps) of one batch."""
    steps = []

    def keep(module, args, output):
        steps.append(output.logits[:, -1].clone())

    hook = adapter.generator.register_forward_hook(keep)
    try:
        with Runner(adapter, quant.get_method(method), kernels, traits_of(adapter.spec.name)) as runner:
            responses = runner.run([Generate(p, NEW_TOKENS) for p in prompts])
    finally:
        hook.remove()
    return responses, steps[-NEW_TOKENS:]  # the invariant prefill's own forwards come first


def assert_rows_are_alone(adapter, prompts, method, kernels):
    batched, steps = generate(adapter, prompts, method, kernels)
    for b, prompt in enumerate(prompts):
        [alone], alone_steps = generate(adapter, [prompt], method, kernels)
        assert alone.error is None and batched[b].error is None
        assert batched[b].tokens_sha1 == alone.tokens_sha1
        for step, alone_step in zip(steps, alone_steps):
            assert torch.equal(step[b : b + 1], alone_step), f"{method}: row {b}'s logits moved with the batch"
    return batched


@pytest.mark.parametrize("family", ["llava", "qwen3_vl", "qwen3_omni"])
def test_every_method_gives_each_row_its_logits_alone(family):
    adapter = tiny(family)
    prompts = prompts_for(adapter)
    for method in PAPER:
        assert_rows_are_alone(adapter, prompts, method, KernelOptions(batch_invariant=True))


def test_without_the_mode_logits_move_with_the_batch():
    """The reason for the mode: the padded batch's prefill and the decode GEMMs of another M round otherwise."""
    adapter = tiny("qwen3_vl")
    prompts = prompts_for(adapter)
    _, steps = generate(adapter, prompts, "bf16", KernelOptions())
    _, alone = generate(adapter, prompts[1:2], "bf16", KernelOptions())
    assert not all(torch.equal(s[1:2], a) for s, a in zip(steps, alone))


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="Triton's interpreter runs on CPU-only machines; a GPU runs the test below"
)
@pytest.mark.parametrize("family", ["llava", "qwen3_omni"])
@pytest.mark.parametrize("method", ["oscar", "bf16"])
def test_kernel_path_rows_are_alone(method, family):
    """On the Triton kernel path (interpreted on the CPU): OScaR's decode kernel with the per-row split plan, BF16's
    steps, the thinker's MoE on the Triton experts (quant.kernels.triton_moe); the rows stack into one layer and still
    get their logits alone."""
    adapter = tiny(family)
    batched = assert_rows_are_alone(
        adapter, prompts_for(adapter), method, KernelOptions(backend="triton", batch_invariant=True)
    )
    if method == "oscar":
        assert all(r.cost["kernel_steps"] > 0 for r in batched)


def test_the_mode_picks_the_experts_whatever_the_model_was_loaded_with():
    # The thinker's experts in the mode: the Triton ones on the kernel path, also where the model was loaded with
    # transformers' eager loop; the eager loop on the torch path; every config as it was after the restore.
    from quant.kernels.triton_moe import NAME
    from quant.prepare import _configs, _invariant_experts

    model = tiny("qwen3_omni").model
    moe = [c for c in _configs(model) if getattr(c, "_experts_implementation_internal", None) is not None]
    assert moe
    for loaded in ("eager", "grouped_mm"):
        for backend, want in (("triton", NAME), ("torch", "eager")):
            for c in moe:
                c._experts_implementation_internal = loaded
            before = _invariant_experts(model, KernelOptions(backend=backend))
            assert all(c._experts_implementation_internal == want for c in moe), (loaded, backend)
            for config, impl in before:
                config._experts_implementation_internal = impl
            assert all(c._experts_implementation_internal == loaded for c in moe)


def test_blocked_linear_rows_do_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(96, 80, generator=g), torch.randn(96, generator=g)
    x = torch.randn(2 * BLOCK + 3, 1, 80, generator=g)
    full = blocked_linear(x, w, bias)
    assert full.shape == (2 * BLOCK + 3, 1, 96)
    for n in (1, 4, BLOCK, BLOCK + 1):
        assert torch.equal(blocked_linear(x[:n], w, bias), full[:n])
    ref = x.double() @ w.double().T + bias.double()
    assert torch.allclose(full.double(), ref, atol=1e-4)


def test_key_span_reads_left_padding_windows_and_refuses_holes():
    keys = 10
    mask = torch.zeros(3, 1, 1, keys, dtype=torch.bool)
    mask[0, ..., 4:] = True  # left padding
    mask[1, ..., :] = True
    mask[2, ..., 2:6] = True  # a window ending before the last key
    assert [key_span(mask, b, keys) for b in range(3)] == [(4, 10), (0, 10), (2, 6)]
    additive = torch.where(mask, 0.0, float("-inf"))
    assert [key_span(additive, b, keys) for b in range(3)] == [(4, 10), (0, 10), (2, 6)]
    mask[1, ..., 5] = False
    with pytest.raises(ValueError, match="contiguous"):
        key_span(mask, 1, keys)


def test_the_mode_is_a_recorded_kernel_option():
    opts = KernelOptions.parse("batch_invariant=on")
    assert opts.batch_invariant and opts.to_dict()["batch_invariant"] is True
    assert KernelOptions.from_env({"OSCAR_BATCH_INVARIANT": "1"}).batch_invariant
    with pytest.raises(ValueError, match="batch_invariant"):
        KernelOptions.parse("batch_invariant=maybe")


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_omni"])
@pytest.mark.parametrize("method", ["oscar", "bf16"])
def test_gpu_kernel_path_logits_at_batch_1_and_8(method, family):
    """On a GPU (CUDA kernels, CUDA graphs, the layer kernels, the Triton MoE experts): a batch of 8 prompts of
    different lengths gives each its batch-1 logits bit for bit."""
    adapter = tiny(family, device="cuda", dtype="bfloat16")
    prompts = (prompts_for(adapter) * 3)[:8]
    assert_rows_are_alone(adapter, prompts, method, KernelOptions(batch_invariant=True))


def test_the_mode_keeps_sdpa_off_cudnn_on_a_gpu_until_undo():
    # cuDNN's per-shape plans made a run's first method pay for the later ones (quant.invariant): the mode holds the
    # switch from prepare to undo on a GPU, and leaves it alone elsewhere.
    from quant.invariant import without_cudnn_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        with without_cudnn_attention(torch.device("cpu")):
            assert torch.backends.cuda.cudnn_sdp_enabled()
        with without_cudnn_attention(torch.device("cuda")):
            assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.gpu
def test_a_prepared_gpu_model_in_the_mode_runs_sdpa_without_cudnn():
    adapter, traits = tiny("qwen3_vl", device="cuda", dtype="bfloat16"), traits_of("tiny-qwen3-vl")
    torch.backends.cuda.enable_cudnn_sdp(True)
    with quant.prepare_model(adapter.generator, "kivi", KernelOptions(batch_invariant=True), traits):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with quant.prepare_model(adapter.generator, "kivi", KernelOptions(batch_invariant=False), traits):
        assert torch.backends.cuda.cudnn_sdp_enabled()


def hidden_in_batches(adapter, target, fillers, kernels, draws: int = 3, seed: int = 0, sizes=(2, 8)):
    """For `draws` seeded (batch size in `sizes`, inclusive; position) pairs: whether `target`, placed at that
    position among `fillers` (cycled), got its batch-1 tokens and its batch-1 logits at every step, bit for bit."""
    rng = torch.Generator().manual_seed(seed)
    [alone], alone_steps = generate(adapter, [target], "oscar", kernels)
    out = []
    for _ in range(draws):
        size = int(torch.randint(sizes[0], sizes[1] + 1, (1,), generator=rng))
        where = int(torch.randint(0, size, (1,), generator=rng))
        batch = [fillers[i % len(fillers)] for i in range(size - 1)]
        batch.insert(where, target)
        responses, steps = generate(adapter, batch, "oscar", kernels)
        same = responses[where].tokens_sha1 == alone.tokens_sha1 and all(
            torch.equal(s[where : where + 1], a) for s, a in zip(steps, alone_steps)
        )
        out.append((size, where, same))
    return out


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_prompt_hidden_anywhere_in_any_batch_gets_its_batch1_logits(device):
    """As serving engines test their batch invariance: one prompt at a random place in batches of random size, its
    logits at batch 1 against batch N bit for bit; and the negative control: without the mode some draw moves."""
    dtype = "bfloat16" if device == "cuda" else None
    adapter = tiny("qwen3_vl", device=device, dtype=dtype)
    target, *fillers = prompts_for(adapter)
    on = hidden_in_batches(adapter, target, fillers, KernelOptions(batch_invariant=True))
    assert all(same for *_, same in on), f"(size, position, same) with the mode on: {on}"
    # The control: without the mode some draw moves. On a GPU the tiny model's products over 2-8 rows can all give
    # batch 1's numbers exactly, so there the control's batches reach past 16 rows.
    sizes = (2, 8) if device == "cpu" else (17, 32)
    off = hidden_in_batches(adapter, target, fillers, KernelOptions(batch_invariant=False), sizes=sizes)
    assert not all(same for *_, same in off), f"the control cannot fail: mode off kept every row alone: {off}"
