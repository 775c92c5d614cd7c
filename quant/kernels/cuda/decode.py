"""The OScaR decode attention's launch on the CUDA kernel (csrc/oscar_bindings.cu `decode`): the inputs checked and
laid out, a DecodePlan (quant/kernels/cuda/plan.py `make_plan`), the merge's arrival counters, the binding, which
reads the inputs and the plan by field name."""

from __future__ import annotations

import torch

from quant.kernels.common import DecodeInputs, DecodePlan, num_sms, prepare_decode
from quant.kernels.cuda.loader import load
from quant.kernels.cuda.plan import make_plan
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
    plan: DecodePlan | None = None,
) -> torch.Tensor:
    """OScaR decode attention with the CUDA kernels. query [B, Hq, Lq, D] -> [B, Hq, Lq, D] (query dtype).

    Same contract as quant.kernels.triton_decode.decode_attention; needs (Hq / Hkv) * Lq <= 16. The kernel reads codes
    in the "frag" order (what pack_kv writes); a cache in the natural order is converted first (correct but slow).
    plan: a ready DecodePlan for these inputs' shape (`launch_plan`, `make_plan`); else `make_plan` makes one, each
    given setting overriding the planner's: min_blocks, warps: the build, CTAs an SM and warps a CTA (default
    `specialization`'s choice: NARROW, or WIDE for steps of a few rows, see `wide_plan`; given either, the other
    defaults to NARROW's); waves: force a split-KV plan of that many waves of the device's resident CTAs (SMs *
    min_blocks) instead of `plan_splits`. window_cta: give the full-precision window its own CTA, scheduled first
    (default: when one wave holds it beside >= 8 splits per row, see `separate_window`), else it is folded into the
    last split's CTA. order: which CTAs the block scheduler starts first (`cta_order`). merge_group: 0 merges the
    splits in one level, G > 0 in two (groups of G splits first; needs window_cta); default `merge_plan`'s choice.
    invariant: the batch-invariant mode's plan (`make_plan`). trace (diagnostics): an int64 CUDA tensor of
    (splits + 1) * B * Hkv * 8 that receives per-CTA %globaltimer stamps (benchmarks/sweep_splits.py).
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
    if plan is None:
        plan = make_plan(
            x.tokens,
            x.batch * x.kv_heads,
            num_sms(query.device),
            x.group * x.lq,
            x.residual,
            x.head_dim,
            min_blocks,
            warps,
            wide,
            window_cta,
            split_tokens,
            waves,
            order,
            merge_group,
            invariant,
        )
    return launch(x, plan, scaling, kv.hadamard is not None, kv.rotate_out, trace).to(query.dtype)


def launch(
    x: DecodeInputs,
    plan: DecodePlan,
    scaling: float,
    rotate: bool,
    rotate_out: bool,
    trace: torch.Tensor | None = None,
) -> torch.Tensor:
    """The decode kernel's launch on prepared inputs (`prepare_decode` in the "frag" order) with a plan made for
    their shape: the plan's build, the merge's arrival counters, the binding. Returns the output in q's dtype
    (benchmarks/sweep_splits.py times this alone, inside a CUDA graph)."""
    if (plan.tokens, plan.rows) != (x.tokens, x.batch * x.kv_heads):
        raise ValueError(
            f"the plan was made for {plan.rows} rows of {plan.tokens} tokens, the inputs hold "
            f"{x.batch * x.kv_heads} of {x.tokens}: plan again (make_plan)"
        )
    mod = load(x.head_dim, min_blocks=plan.min_blocks, warps=plan.warps)
    if not all(_aligned(r) for r in (x.k_res, x.v_res)):  # the kernel reads the window with 16-byte loads
        x.k_res, x.v_res = x.k_res.contiguous(), x.v_res.contiguous()
    if x.q.data_ptr() % 16:  # and the query with 16-byte loads
        x.q = x.q.clone()
    counters = _counters(x.q.device, plan.rows * (1 + plan.merge_groups))
    no_trace = _NO_TRACE[x.q.device] if trace is None else trace
    return mod.decode(x, plan, counters, no_trace, float(scaling), rotate, rotate_out)


def launch_plan(
    query: torch.Tensor, kv: PackedKV, min_blocks: int | None = None, warps: int | None = None, wide: bool = True
) -> DecodePlan:
    """The DecodePlan `decode_attention` makes for these inputs (recorded per point by `oscar-eval bench`, with
    `row_kernel`: whether it launches decode_row_kernel)."""
    x = prepare_decode(query, kv, rotate_query=False, order="frag")
    return make_plan(
        x.tokens, x.batch * x.kv_heads, num_sms(query.device), x.group * x.lq, x.residual, x.head_dim,
        min_blocks, warps, wide,
    )  # fmt: skip


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
