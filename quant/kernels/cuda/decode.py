"""The OScaR decode attention's launch on the CUDA kernel (csrc/oscar_bindings.cu `decode`): the inputs checked and
laid out, the plan (quant/kernels/cuda/plan.py), the merge's arrival counters."""

from __future__ import annotations

import torch

from quant.kernels.common import num_sms, prepare_decode
from quant.kernels.cuda.loader import load
from quant.kernels.cuda.plan import (
    NARROW,
    ORDER_ROWS,
    ORDER_SPECIAL_FIRST,
    ORDER_SPECIAL_LAST,
    WIDE_LONG_MAX_QUERY_ROWS,
    cta_order,
    merge_plan,
    plan_launch,
    row_kernel,
)
from quant.packed import PackedKV

_SYLVESTER_CHECKED: dict[tuple[int, int], bool] = {}


def _is_sylvester(hd: torch.Tensor) -> bool:
    """The kernels rotate with a butterfly: Hd must be the natural-order Sylvester Hadamard (checked once
    per tensor, so the per-step path does not synchronize)."""
    key = (hd.data_ptr(), hd.shape[0])
    if key not in _SYLVESTER_CHECKED:
        from quant.primitives import hadamard

        ref = hadamard(hd.shape[0], device=hd.device, dtype=torch.float32)
        _SYLVESTER_CHECKED[key] = bool(torch.allclose(hd.float(), ref, atol=1e-6))
    return _SYLVESTER_CHECKED[key]


def decode_attention(
    query: torch.Tensor,
    kv: PackedKV,
    scaling: float,
    kv_lens=None,
    res_lens=None,
    split_tokens: int | None = None,
    min_blocks: int | None = None,
    waves: float | None = None,
    trace: torch.Tensor | None = None,
    window_cta: bool | None = None,
    order: int | None = None,
    merge_group: int | None = None,
    warps: int | None = None,
    wide: bool = True,
    invariant: bool = False,
) -> torch.Tensor:
    """OScaR decode attention with the CUDA kernels. query [B, Hq, Lq, D] -> [B, Hq, Lq, D] (query dtype).

    Same contract as quant.kernels.triton_decode.decode_attention; needs (Hq / Hkv) * Lq <= 16. The kernel reads codes
    in the "frag" order (what pack_kv writes); a cache in the natural order is converted first (correct but slow).
    min_blocks: CTAs per SM the build's register budget allows with up to 8 query rows per KV head, warps: of a CTA
    (together a specialization; default `specialization`'s choice: NARROW, or WIDE for steps of a few rows, see
    `wide_plan`; given either, the other defaults to NARROW's); waves: force a split-KV plan of that many waves of the
    device's resident CTAs (SMs * min_blocks) instead of `plan_splits`. window_cta: give the full-precision window its
    own CTA, scheduled first (default: when one wave holds it beside >= 8 splits per row, see `separate_window`), else
    it is folded into the last split's CTA. trace (diagnostics): an int64 CUDA tensor of (splits + 1) * B * Hkv * 8 that
    receives per-CTA %globaltimer stamps (benchmarks/sweep_splits.py).
    order: which CTAs the block scheduler starts first (`cta_order`; default: the planner's). merge_group: 0 merges the
    splits in one level, G > 0 in two (groups of G splits first; needs window_cta); default `merge_plan`'s choice.
    invariant (the batch-invariant mode): a plan that depends on no other row: the NARROW build, splits of
    INVARIANT_SPLIT_TOKENS (a row's splits past its length are empty and merge as exact zeros), the window in its own
    CTA and a one-level merge, whose accumulators take the splits in the same order whatever their count.
    """
    if kv.hadamard is not None and not _is_sylvester(kv.hadamard):
        raise ValueError(
            "the CUDA kernels rotate with the Sylvester Hadamard; this cache uses another "
            "rotation: use backend='triton' or 'torch'"
        )
    x = prepare_decode(query, kv, kv_lens, res_lens, rotate_query=False, order="frag")
    if x.group * x.lq > 16:
        raise ValueError(
            f"(Hq / Hkv) * Lq = {x.group * x.lq} query rows per KV head exceed the 16 rows of one "
            "tensor-core tile: use backend='triton' or fewer speculative tokens"
        )
    rows, sms, query_rows = x.batch * x.kv_heads, num_sms(query.device), x.group * x.lq
    if invariant:  # one plan for any batch: NARROW, fixed splits, the window's own CTA, a one-level merge
        from quant.kernels import INVARIANT_SPLIT_TOKENS

        min_blocks, warps = NARROW
        split_tokens = split_tokens or INVARIANT_SPLIT_TOKENS
        window_cta, merge_group, order = True, 0, ORDER_ROWS
    min_blocks, warps, split_tokens, splits, window_cta = plan_launch(
        x.tokens, rows, sms, query_rows, x.residual, min_blocks, warps, wide, window_cta, split_tokens, waves
    )
    if warps > 8 and query_rows > WIDE_LONG_MAX_QUERY_ROWS:
        raise ValueError(
            f"a {warps}-warp decode build holds up to {WIDE_LONG_MAX_QUERY_ROWS} query rows per KV head, got "
            f"{query_rows}: use warps=4 or 8"
        )
    window_cta = bool(window_cta)
    if order is None:
        order = cta_order(rows, splits, window_cta, sms * min_blocks, sms)
    elif order not in (ORDER_ROWS, ORDER_SPECIAL_FIRST, ORDER_SPECIAL_LAST):
        raise ValueError(
            f"order must be {ORDER_ROWS} (row by row), {ORDER_SPECIAL_FIRST} (each row's window or "
            f"window-carrying CTA first) or {ORDER_SPECIAL_LAST} (those last), got {order!r}"
        )
    if merge_group is None:
        merge_group = merge_plan(splits, query_rows, x.head_dim, window_cta, 32 * warps)
    elif merge_group < 0:
        raise ValueError(f"merge_group must be >= 0, got {merge_group}")
    groups = -(-splits // merge_group) if merge_group and window_cta else 0
    mod = load(x.head_dim, min_blocks=min_blocks, warps=warps)
    if not all(_aligned(r) for r in (x.k_res, x.v_res)):  # the kernel reads the window with 16-byte loads
        x.k_res, x.v_res = x.k_res.contiguous(), x.v_res.contiguous()
    if x.q.data_ptr() % 16:  # and the query with 16-byte loads
        x.q = x.q.clone()
    out = mod.decode(
        x.q,
        x.kc,
        x.ks,
        x.kz,
        x.vc,
        x.vs,
        x.vz,
        x.norms,
        x.k_res,
        x.v_res,
        x.kv_lens,
        x.res_lens,
        _counters(query.device, rows * (1 + groups)),
        x.tokens,
        splits,
        split_tokens,
        float(scaling),
        kv.hadamard is not None,
        kv.rotate_out,
        window_cta,
        order,
        merge_group,
        _NO_TRACE[query.device] if trace is None else trace,
    )
    return out.to(query.dtype)


def launch_plan(
    query: torch.Tensor, kv: PackedKV, min_blocks: int | None = None, warps: int | None = None, wide: bool = True
) -> dict:
    """The decode's planned launch for these inputs, as `decode_attention` makes it: the build (min_blocks, warps),
    splits, their tokens, the window's placement, the CTA order, the merge's groups, the grid's CTAs and the kernel
    ("row": decode_row_kernel, else decode_split_kernel; recorded per point by `oscar-eval bench`)."""
    x = prepare_decode(query, kv, rotate_query=False, order="frag")
    rows, sms = x.batch * x.kv_heads, num_sms(query.device)
    min_blocks, warps, split, splits, window_cta = plan_launch(
        x.tokens, rows, sms, x.group * x.lq, x.residual, min_blocks, warps, wide
    )
    return {
        "min_blocks": min_blocks,
        "warps": warps,
        "splits": splits,
        "split_tokens": split,
        "window_cta": window_cta,
        "order": cta_order(rows, splits, window_cta, sms * min_blocks, sms),
        "merge_group": merge_plan(splits, x.group * x.lq, x.head_dim, window_cta, 32 * warps),
        "ctas": (splits + window_cta if splits else 1) * rows,
        "kernel": "row" if row_kernel(x.tokens, splits, window_cta, kv.rotate_out) else "split",
    }


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in t.stride()[:3])


_COUNTERS: dict[torch.device, torch.Tensor] = {}


class _EmptyPerDevice(dict):
    def __missing__(self, device):
        self[device] = torch.empty(0, dtype=torch.int64, device=device)
        return self[device]


_NO_TRACE = _EmptyPerDevice()


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """Arrival counters of the split merge, n = B Hkv (1 + merge groups per row); the kernel returns each to 0 itself
    (zeroed once, a decode step is one launch, graph-capturable). One buffer per device: decode calls on one device must
    not run concurrently on different streams."""
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[device] = buf
    return buf
