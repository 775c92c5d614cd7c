"""Attention over OScaR's packed cache: the plain torch reference (the oracle and the CPU path).

It reads a `quant.packed.PackedKV` exactly as a fused kernel does (quantized part in the rotated basis,
token norms on the scores, FP residual window merged by log-sum-exp), so kernels in quant/kernels are
drop-in replacements selected by `quant.kernels.decode_attention(..., backend=...)`.
"""

from __future__ import annotations

import torch

from quant.packed import PackedKV


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def packed_attention_reference(query: torch.Tensor, kv: PackedKV, scaling: float) -> torch.Tensor:
    """query [B, Hq, Lq, D] (the newest Lq tokens of the sequence, causal among themselves) ->
    [B, Hq, Lq, D] in query.dtype, computed in float32.

    s_j = scaling * ((q @ Hd) . k_unit_hat_j) * n_j over the packed tokens j;
    s_r = scaling * q . k_res_r over the residual window (causal among the Lq new tokens);
    out = softmax([s_j ; s_r]) @ [v_hat_j @ Hd ; v_res_r], as two partial softmaxes merged by log-sum-exp
    (v_hat_j itself when kv.values_rotated is False: the model's weights carry V's rotation).
    """
    b, hq, lq, d = query.shape
    groups = hq // kv.k_res.shape[1]
    q = query.float()
    total = kv.seq_len
    q_pos = torch.arange(total - lq, total, device=q.device)[:, None]
    parts = []
    if kv.k is not None:
        q_rot = q @ kv.hadamard if kv.hadamard is not None else q
        k_unit = _repeat_kv(kv.k.dequantize(), groups)
        s = (q_rot @ k_unit.transpose(-1, -2)) * scaling
        if kv.norms is not None:
            s = s * kv.norms[:, None, None, :]
        s = s.masked_fill(torch.arange(kv.num_quantized, device=q.device)[None, :] > q_pos, float("-inf"))
        v_rot = _repeat_kv(kv.v.dequantize(), groups)
        parts.append((s, v_rot, kv.hadamard if kv.values_rotated else None))
    r = kv.k_res.shape[-2]
    if r:
        s = (q @ _repeat_kv(kv.k_res.float(), groups).transpose(-1, -2)) * scaling
        s = s.masked_fill(torch.arange(kv.num_quantized, total, device=q.device)[None, :] > q_pos, float("-inf"))
        parts.append((s, _repeat_kv(kv.v_res.float(), groups), None))
    return _merge(parts).to(query.dtype)


def _merge(parts) -> torch.Tensor:
    """Combine partial attentions (scores, values, basis) by log-sum-exp, as split-KV kernels do."""
    outs, lses = [], []
    for s, v, basis in parts:
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isfinite(m), m, 0))  # a fully masked row gives p = 0
        denom = p.sum(-1, keepdim=True)
        o = (p @ v) / denom.clamp_min(1e-30)
        outs.append(o @ basis if basis is not None else o)
        lses.append(m + denom.log())  # -inf for a fully masked row: weight 0 below
    lse = torch.stack(lses)
    weights = torch.softmax(lse, dim=0)
    return sum(w * o for w, o in zip(weights, outs))
