"""quant.kernels.triton_moe: the batch-invariant MoE experts, against a float64 reference of the gated experts on
awkward shapes (reduction and output sizes off the tiles, an expert with more pairs than a block, experts no token
picked), and the invariance itself: each token alone gives the bits it gets in the batch (on the CPU, to the host BLAS's
rounding of a tile's tail rows, which the interpreter's tl.dot inherits). transformers' own expert
loop on the real Qwen3-Omni thinker class is the second reference. On the CPU under Triton's interpreter in float32
and float16, in bfloat16 on a GPU."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from quant.kernels.triton_moe import BLOCK_M, experts  # noqa: E402

CASES = [  # tokens, hidden, intermediate, experts, top-k
    (5, 96, 80, 6, 2),
    (BLOCK_M + 7, 130, 48, 3, 2),  # one expert gets more pairs than a block
    (1, 64, 32, 8, 3),
]


def reference(x, gate_up, down, idx, w):
    x, gate_up, down, w = (t.double() for t in (x, gate_up, down, w))
    inter = down.shape[2]
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            gu = gate_up[e] @ x[t]
            h = torch.nn.functional.silu(gu[:inter]) * gu[inter:]
            out[t] += w[t, j] * (down[e] @ h)
    return out


def _dtypes():
    if torch.cuda.is_available():
        return [("cuda", torch.bfloat16, 3e-2)]
    return [("cpu", torch.float32, 1e-5), ("cpu", torch.float16, 5e-3)]


def _inputs(tokens, hidden, inter, n_exp, k, device, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    gate_up = torch.randn(n_exp, 2 * inter, hidden, generator=g) / hidden**0.5
    down = torch.randn(n_exp, hidden, inter, generator=g) / inter**0.5
    logits = torch.randn(tokens, n_exp, generator=g)
    logits[:, -1] = -1e9  # the last expert is never picked: its programs find no pairs
    if tokens > BLOCK_M:  # expert 0 gets every token: more pairs than one block
        logits[:, 0] = logits.max(-1).values + 1.0
    weights, idx = torch.softmax(logits, -1).topk(k, -1)  # distinct experts per token, as a router picks them
    x, gate_up, down, weights = (t.to(device=device, dtype=dtype) for t in (x, gate_up, down, weights))
    return x, gate_up, down, idx.to(device), weights


@pytest.mark.parametrize("device,dtype,tol", _dtypes())
@pytest.mark.parametrize("tokens,hidden,inter,n_exp,k", CASES)
def test_experts_match_float64_and_each_token_alone(device, dtype, tol, tokens, hidden, inter, n_exp, k):
    x, gate_up, down, idx, w = _inputs(tokens, hidden, inter, n_exp, k, device, dtype, seed=tokens + hidden)
    out = experts(x, gate_up, down, idx, w)
    ref = reference(x.cpu(), gate_up.cpu(), down.cpu(), idx.cpu(), w.cpu())
    assert out.shape == x.shape and out.dtype == dtype
    assert (out.cpu().double() - ref).abs().max() / ref.abs().max() < tol
    for t in range(tokens):
        alone = experts(x[t : t + 1], gate_up, down, idx[t : t + 1], w[t : t + 1])
        if device == "cuda":
            assert torch.equal(alone, out[t : t + 1]), f"token {t} moved with the batch"
        else:  # the interpreter's tl.dot is the host BLAS, whose micro-kernels round a tile's tail rows differently
            ulp = torch.finfo(dtype).eps * out.abs().max()
            assert (alone - out[t : t + 1]).abs().max() <= 4 * ulp, f"token {t} moved with the batch"


def test_experts_forward_matches_the_thinker_experts_loop():
    """The registered implementation on transformers' Qwen3-Omni thinker experts gives what the class's own eager
    loop gives (float32: the same sums up to rounding; a GPU's tensor cores multiply float32 as TF32)."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m

    from harness.models.qwen3_omni.synthetic import tiny
    from quant.kernels.triton_moe import NAME, register

    config = tiny()[0].thinker_config.text_config
    device = "cuda" if torch.cuda.is_available() else "cpu"
    module = m.Qwen3OmniMoeThinkerTextSparseMoeBlock(config).eval()
    torch.manual_seed(0)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.1)
    module = module.to(device)
    x = torch.randn(1, 9, config.hidden_size, device=device)
    register()
    before = config._experts_implementation_internal
    try:
        config._experts_implementation_internal = "eager"
        with torch.no_grad():
            eager = module(x)
        config._experts_implementation_internal = NAME
        with torch.no_grad():
            ours = module(x)
    finally:
        config._experts_implementation_internal = before
    assert (ours - eager).abs().max() <= (1e-5 if device == "cpu" else 2e-2) * eager.abs().max()


def test_experts_refuse_mismatched_weights():
    x = torch.randn(2, 16)
    with pytest.raises(ValueError, match=r"gate_up \[E, 2I, H\]"):
        experts(x, torch.randn(2, 10, 16), torch.randn(2, 16, 4), torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1))


def test_supports_names_the_experts_it_computes():
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m

    from harness.models.qwen3_omni.synthetic import tiny
    from quant.kernels.triton_moe import experts_forward, supports

    module = m.Qwen3OmniMoeThinkerTextExperts(tiny()[0].thinker_config.text_config)
    assert supports(module)
    module.has_bias = True
    assert not supports(module)
    with pytest.raises(ValueError, match="batch_invariant=off"):
        experts_forward(module, torch.zeros(1, 4), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1))
