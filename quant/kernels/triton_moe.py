"""MoE experts whose sums do not depend on the batch: the batch-invariant mode's experts on a GPU.

A MoE layer sends each token to its top-k experts. transformers' grouped GEMM (`grouped_mm`) sizes its tiles by how
many tokens every expert got from the whole batch, so a token's sums move with the other tokens; its eager loop over
experts takes each expert's token count to the host (a sync per expert and layer, so no CUDA graph) and multiplies
a count of rows that again depends on the batch. Here the (token, expert) pairs are sorted by expert on the device
and one program computes a tile of output columns of one expert for that expert's pairs, in blocks of BLOCK_M rows
with a fixed walk over the reduction dimension: a row's dot products are the same instructions in the same order
whoever else is in its block, and no count leaves the device, so CUDA graphs capture the layer.

    out = experts(x [T, H], gate_up [E, 2I, H], down [E, H, I], top_k_index [T, k], top_k_weights [T, k])

computes, for each token, sum_j w_j * down_e(silu(gate_e(x)) * up_e(x)) over its experts e = top_k_index[t, j], in
the order of j, with the rounding of transformers' expert loop: each projection's output rounded to the weights'
dtype before the activation, the product and the weighted sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 16  # (token, expert) pairs a block: the smallest tensor-core tile
BLOCK_N = 32  # output columns a program: enough programs to stream one token's experts at decode
BLOCK_K = 128  # reduction step

NAME = "oscar_batch_invariant"  # the experts implementation registered with transformers (register())


@triton.jit
def _expert_linear(
    x_ptr, rows_ptr, w_ptr, offs_ptr, out_ptr, N, K,
    sx, sw_e, sw_n, so,
    GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Expert `program_id(0)`, output columns [pid1 * BLOCK_N, +BLOCK_N): for its pairs p in [offs[e], offs[e + 1]),
    out[p] = x[rows[p]] @ w[e, cols]^T. GATED: w holds gate rows [0, N) and up rows [N, 2N); out = silu(gate) * up."""
    e = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.load(offs_ptr + e)
    end = tl.load(offs_ptr + e + 1)
    kk = tl.arange(0, BLOCK_K)
    w_base = w_ptr + e.to(tl.int64) * sw_e
    for m0 in range(start, end, BLOCK_M):
        p = m0 + tl.arange(0, BLOCK_M)
        live = p < end
        src = tl.load(rows_ptr + p, mask=live, other=0).to(tl.int64)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + kk
            a = tl.load(x_ptr + src[:, None] * sx + k[None, :], mask=live[:, None] & (k < K)[None, :], other=0.0)
            wmask = (k < K)[:, None] & (n < N)[None, :]
            w = tl.load(w_base + n[None, :].to(tl.int64) * sw_n + k[:, None], mask=wmask, other=0.0)
            acc = tl.dot(a, w, acc)
            if GATED:
                w_up = tl.load(w_base + (n + N)[None, :].to(tl.int64) * sw_n + k[:, None], mask=wmask, other=0.0)
                acc_up = tl.dot(a, w_up, acc_up)
        dtype = out_ptr.dtype.element_ty
        if GATED:  # transformers' rounding: each projection, then silu, then the product, in the weights' dtype
            g = acc.to(dtype).to(tl.float32)
            act = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
            res = (act * acc_up.to(dtype).to(tl.float32)).to(dtype)
        else:
            res = acc.to(dtype)
        tl.store(out_ptr + p[:, None].to(tl.int64) * so + n[None, :], res, mask=live[:, None] & (n < N)[None, :])


def _launch(x, rows, w, offsets, n_out, gated):
    out = torch.empty(rows.shape[0], n_out, device=x.device, dtype=w.dtype)
    grid = (w.shape[0], triton.cdiv(n_out, BLOCK_N))
    _expert_linear[grid](
        x, rows, w, offsets, out, n_out, w.shape[2],
        x.stride(0), w.stride(0), w.stride(1), out.stride(0),
        GATED=gated, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )  # fmt: skip
    return out


def experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """See the module docstring. x [T, H]; gate_up [E, 2I, H] (gate rows first); down [E, H, I]; top_k_index and
    top_k_weights [T, k]. Returns [T, H] in x's dtype."""
    if gate_up.dim() != 3 or down.dim() != 3 or gate_up.shape[1] != 2 * down.shape[2]:
        raise ValueError(
            f"experts need gate_up [E, 2I, H] and down [E, H, I]; got {tuple(gate_up.shape)} and {tuple(down.shape)}"
        )
    tokens, k = top_k_index.shape
    num_experts = gate_up.shape[0]
    x = x.to(gate_up.dtype).contiguous()
    gate_up, down = gate_up.contiguous(), down.contiguous()
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, on the device
    sorted_ids = flat[order]
    bounds = torch.arange(num_experts + 1, device=x.device, dtype=sorted_ids.dtype)
    offsets = torch.searchsorted(sorted_ids, bounds).to(torch.int32)
    rows = (order // k).to(torch.int32)
    hidden = _launch(x, rows, gate_up, offsets, down.shape[2], gated=True)
    identity = torch.arange(rows.shape[0], device=x.device, dtype=torch.int32)
    y_sorted = _launch(hidden, identity, down, offsets, down.shape[1], gated=False)
    y = torch.empty_like(y_sorted)
    y[order] = y_sorted
    y = y.view(tokens, k, -1)
    weights = top_k_weights.to(y.dtype)
    out = (y[:, 0] * weights[:, 0, None]).float()  # each pair weighted in the weights' dtype, summed in float32
    for j in range(1, k):
        out = out + (y[:, j] * weights[:, j, None]).float()
    return out.to(x.dtype)


def supports(module) -> bool:
    """Whether `module` (a transformers experts module) is what `experts` computes: gated, bias-free experts with
    SiLU, stored [E, out, in] (the Qwen3-MoE family, the Qwen3-Omni thinker)."""
    act = getattr(getattr(module, "config", None), "hidden_act", "silu")
    return (
        not getattr(module, "has_bias", False)
        and getattr(module, "has_gate", True)
        and not getattr(module, "is_transposed", False)
        and not getattr(module, "has_post_expert_norm", False)
        and act in ("silu", "swish")
        and getattr(module, "gate_up_proj", None) is not None
        and getattr(module, "down_proj", None) is not None
    )


def experts_forward(module, hidden_states, top_k_index, top_k_weights):
    """transformers' experts-implementation signature (integrations.moe.ExpertsInterface) over `experts`."""
    if not supports(module):
        raise ValueError(
            f"{type(module).__name__}: the batch-invariant experts take gated, bias-free SiLU experts stored "
            "[E, out, in]; run this model with --kernels batch_invariant=off"
        )
    return experts(hidden_states, module.gate_up_proj, module.down_proj, top_k_index, top_k_weights)


def register() -> str:
    """Register experts_forward with transformers' experts interface; returns its name."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(NAME, experts_forward)
    return NAME
