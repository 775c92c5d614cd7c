"""Decode accuracy along long splits: a kernel's error against the float64 oracle stays within 2x the error of a
float32 torch reference rounded to the output dtype (FlashAttention's rule, `attention_f32`), also where one CTA
(or one Triton program) reads a whole long row. An error that grows with the tokens a split reads (something summed
in low precision, or a large offset cancelled at the end) shows here first: such rows put the most terms into one
running sum."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from quant.kernels.reference import (
    attention_f32,
    attention_f64,
    random_packed_kv,
    relative_error,
)
from quant.packed import PackedKV
from quant.primitives import hadamard

WINDOW = 64  # full-precision window tokens, as the bench's points keep


def issue_cache(b: int, hkv: int, t: int, d: int, seed: int) -> tuple[PackedKV, torch.Generator]:
    """Random bf16 K/V (plain normal, as the bench draws them) packed by the CUDA pack with V's rotation in the
    weights (OScaR's default), plus a bf16 window of WINDOW tokens: the bench's decode inputs."""
    from quant.kernels import cuda as kcuda

    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(b, hkv, t + WINDOW, d, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(b, hkv, t + WINDOW, d, device="cuda", generator=g).to(torch.bfloat16)
    kq, vq, norms = kcuda.pack_kv(k[:, :, :t], v[:, :, :t], rotate_values=False)
    kv = PackedKV(
        kq,
        vq,
        norms,
        k[:, :, t:].contiguous(),
        v[:, :, t:].contiguous(),
        hadamard(d, device="cuda"),
        values_rotated=False,
    )
    return kv, g


def check_rule(out: torch.Tensor, q: torch.Tensor, kv: PackedKV, scaling: float, what: str) -> float:
    """Assert the 2x rule; returns the kernel's error over the budget (for the message of a caller)."""
    assert torch.isfinite(out).all(), what
    ref = attention_f64(q.cpu(), kv, scaling)
    err, budget = relative_error(out, ref), relative_error(attention_f32(q.cpu(), kv, scaling), ref)
    assert err <= 2 * budget, f"{what}: kernel error {err:.3e} > 2 x float32 reference error {budget:.3e}"
    return err / budget


@pytest.mark.cuda_kernels
@pytest.mark.parametrize(
    "tokens,group,lq,d",
    [
        (32768, 4, 1, 128),  # one CTA a row through decode_split_kernel (past the row kernel's 24576 tokens)
        (24576, 4, 1, 128),  # decode_row_kernel: the window in the same state after the groups
        (32768, 8, 2, 128),  # 16 query rows: two head tiles
        (32768, 8, 1, 64),
    ],
)
@pytest.mark.parametrize("build", ["narrow", "wide"])
def test_cuda_decode_one_long_split_per_row(tokens, group, lq, d, build):
    # The issue's shape (random bf16 q/K/V, the CUDA pack, a 64-token window) with every row forced into one split:
    # each warp's accumulators take 8K tokens (narrow) or 4K (wide). With an offset in the value codes the error here
    # grew with the split (0.72% in one 32K split for codes 0..3, where the float32 reference is 0.17%).
    from quant.kernels import cuda as kcuda

    kv, g = issue_cache(2, 2, tokens, d, seed=tokens + group + d)
    q = torch.randn(2, 2 * group, lq, d, device="cuda", generator=g).to(torch.bfloat16)
    opts = {"min_blocks": 1, "warps": 8} if build == "wide" else {"min_blocks": 3, "warps": 4}
    out = kcuda.decode_attention(q, kv, d**-0.5, split_tokens=tokens, window_cta=False, **opts)
    check_rule(out, q, kv, d**-0.5, f"{build} {tokens} tokens in one split, {group * lq} query rows, d {d}")


@pytest.mark.cuda_kernels
def test_cuda_decode_planned_splits_long_rows():
    # The planner's own split at a bench-like point (4 x 32K of Qwen3-8B's 8 KV heads: one or two long splits a row),
    # at a batch-1 row of many splits, and at long rows of one query row a KV head (LLaVA-like: on 132 SMs one wave of
    # 12-warp CTAs, 4 splits of 16K tokens a row, the window folded), all within the rule.
    from quant.kernels import cuda as kcuda
    from quant.kernels.common import num_sms

    for b, hkv, group, t in ((4, 8, 4, 32640), (1, 8, 4, 32640), (1, 33, 1, 65536)):
        kv, g = issue_cache(b, hkv, t, 128, seed=b * t)
        q = torch.randn(b, group * hkv, 1, 128, device="cuda", generator=g).to(torch.bfloat16)
        if group == 1 and num_sms(q.device) == 132:
            assert kcuda.launch_plan(q, kv).warps == kcuda.WIDE_LONG[1]
        check_rule(kcuda.decode_attention(q, kv, 128**-0.5), q, kv, 128**-0.5, f"{b} x {t} planned")


def test_triton_decode_one_long_split_per_row():
    # The same property for the Triton decode, under the interpreter on a CPU machine: one program a row reads 4096
    # packed tokens (32 blocks of 128) and the window. The query goes in as float32 (the kernel reads it as the
    # window's bf16), so the kernel writes float32 and the output is rounded to bf16 here: the interpreter's own
    # float32 -> bf16 cast truncates (twice the rounding error of round-to-nearest, which the GPU does).
    pytest.importorskip("triton")
    from quant.kernels import triton_decode

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for d, seed in ((64, 5), (128, 6)):
        kv = random_packed_kv(1, 2, 4096, WINDOW, d, seed=seed, device=dev, rotate_values=False)
        q = torch.randn(1, 8, 1, d, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        out = triton_decode.decode_attention(q.float().to(dev), kv, d**-0.5, split_tokens=4096)
        assert out.dtype == torch.float32
        check_rule(out.to(torch.bfloat16), q, kv, d**-0.5, f"triton, d {d}, 4096 tokens in one split")
