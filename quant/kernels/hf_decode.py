"""Decode through transformers on the fast kernels: the attention function of the kernel path.

`packed_attention` is an AttentionInterface function ("oscar_packed"): when a cache layer hands it a
`PackedStep` (packed K/V plus lengths; quant.methods.oscar.OScaRLayer on the kernel path) instead of key/value
tensors, it runs the decode kernel; given a `DenseStep` (BF16's fixed buffers plus lengths), SDPA over the buffers
with a length mask; otherwise it is SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.kernels import decode_attention
from quant.packed import PackedKV


@dataclass
class PackedStep:
    """What a packed layer hands the attention function: the layer's PackedKV (buffers at capacity) and
    the valid lengths per sequence, int32 [B] on the device."""

    kv: PackedKV
    kv_lens: torch.Tensor | None
    res_lens: torch.Tensor
    backend: str | None = None  # None: quant.kernels.default_backend
    wide: bool = True  # the run's KernelOptions.wide_decode
    invariant: bool = False  # the run's KernelOptions.batch_invariant: a split plan per row (quant.kernels.cuda)


@dataclass
class DenseStep:
    """What a fixed-shape BF16 layer hands the attention function: K, V buffers [B, H, capacity, D] and the valid
    tokens per sequence, int32 [B] on the device."""

    k: torch.Tensor
    v: torch.Tensor
    lengths: torch.Tensor
    invariant: bool = False  # the run's KernelOptions.batch_invariant (quant.kernels.triton_dense)


def dense_step_attention(query, step: DenseStep, scaling: float) -> torch.Tensor:
    """SDPA of query [B, Hq, Lq, D] over a DenseStep's buffers, tokens at or past each sequence's length masked
    (Lq = 1: every valid token is in the past). Returns [B, Hq, Lq, D]. In the batch-invariant mode, the Triton
    kernel that sums each sequence in splits of its own (quant.kernels.triton_dense)."""
    if step.invariant:
        from quant.kernels.triton_dense import dense_decode

        return dense_decode(query, step.k, step.v, step.lengths, scaling)
    pos = torch.arange(step.k.shape[-2], device=query.device)
    mask = (pos[None, :] < step.lengths[:, None])[:, None, None, :]
    return torch.nn.functional.scaled_dot_product_attention(
        query,
        step.k.to(query.dtype),
        step.v.to(query.dtype),
        attn_mask=mask,
        scale=scaling,
        enable_gqa=query.shape[1] != step.k.shape[1],
    )


def packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """AttentionInterface function: PackedStep or PackedKV (what a cache layer's update returns at decode)
    -> decode kernel (backend: quant.kernels.default_backend unless the step names one); tensors -> SDPA.
    Returns [B, Lq, Hq, D] as transformers' attention functions do."""
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    if isinstance(key, PackedStep):
        out = decode_attention(
            query,
            key.kv,
            scaling,
            backend=key.backend,
            wide=key.wide,
            invariant=key.invariant,
            kv_lens=key.kv_lens,
            res_lens=key.res_lens,
        )
        return out.transpose(1, 2).contiguous(), None
    if isinstance(key, PackedKV):
        return decode_attention(query, key, scaling).transpose(1, 2).contiguous(), None
    if isinstance(key, DenseStep):
        return dense_step_attention(query, key, scaling).transpose(1, 2).contiguous(), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=query.shape[2] > 1,
        **kwargs,
    )


def decode_mask(batch_size: int, q_length: int, kv_length: int, *args, attention_mask=None, **kwargs):
    """sdpa_mask, except None for one new token per sequence without a padding mask: that token sees every
    cached token, so the mask is all true. (sdpa_mask drops such masks itself when it can inspect them, but
    not while a CUDA graph is being captured: the captured BF16 step then runs SDPA with a materialized mask,
    a slower kernel, and replays slower than the eager step.)"""
    from transformers.masking_utils import sdpa_mask

    if q_length == 1 and attention_mask is None:
        return None
    return sdpa_mask(batch_size, q_length, kv_length, *args, attention_mask=attention_mask, **kwargs)


def register(name: str = "oscar_packed") -> str:
    """Register `packed_attention` with transformers; load a model with attn_implementation=name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, packed_attention)
    # Without a mask function of its own the mask is silently None and left padding breaks on prefill.
    AttentionMaskInterface.register(name, decode_mask)
    return name
