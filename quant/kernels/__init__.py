"""Fast OScaR kernels: decode attention over the packed cache and the fused append/pack.

Backends (same numbers up to rounding, chosen at run time):
- "cuda":   csrc/ through torch.utils.cpp_extension (quant.kernels.cuda), needs a CUDA GPU (sm_80+) and nvcc;
- "triton": quant.kernels.triton_decode / triton_pack, any GPU Triton supports, or the CPU under
            TRITON_INTERPRET=1 (what CI runs, small shapes only);
- "torch":  the reference (quant.attention.packed_attention_reference, quant.methods.oscar.pack_block).
`default_backend(device)` picks "cuda" on a CUDA device when nvcc is there, else "triton" on CUDA, else
"torch". The environment variable OSCAR_KERNEL_BACKEND overrides it.
"""
from __future__ import annotations

import functools
import importlib
import os
import shutil

import torch

BACKENDS = ("cuda", "triton", "torch")


def default_backend(device: torch.device | str) -> str:
    forced = os.environ.get("OSCAR_KERNEL_BACKEND")
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"OSCAR_KERNEL_BACKEND={forced!r}; choose one of {BACKENDS}")
        return forced
    if torch.device(device).type != "cuda":
        return "torch"
    if _has_nvcc():
        return "cuda"
    _warn_triton_fallback()
    return "triton"


@functools.lru_cache(maxsize=None)
def _warn_triton_fallback() -> None:  # once per process
    import warnings

    warnings.warn("CUDA GPU without nvcc: OScaR decodes with the Triton kernels, 1.4-1.5x slower than the CUDA ones at "
                  "long contexts (README, Speed). Put the CUDA toolkit's nvcc on PATH (or set CUDA_HOME) for the CUDA "
                  "kernels, or set OSCAR_KERNEL_BACKEND=triton to choose Triton and silence this.", stacklevel=3)


@functools.lru_cache(maxsize=None)
def _has_nvcc() -> bool:  # once per process: a PATH search on every decode step's layer would cost host time
    return shutil.which("nvcc") is not None or bool(os.environ.get("CUDA_HOME"))


def _module(backend: str, kind: str):
    if backend not in ("cuda", "triton"):
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {BACKENDS}")
    name = "quant.kernels.cuda" if backend == "cuda" else f"quant.kernels.triton_{kind}"
    return importlib.import_module(name)


def decode_attention(query, kv, scaling: float, backend: str | None = None, **options):
    """Attention of query [B, Hq, Lq, D] over a quant.packed.PackedKV -> [B, Hq, Lq, D] (query dtype).

    options: kv_lens, res_lens (valid tokens per sequence), split_tokens (split-KV size).
    """
    backend = backend or default_backend(query.device)
    if backend == "torch":
        from quant.attention import packed_attention_reference

        kv = valid_part(kv, options.get("kv_lens"), options.get("res_lens"))
        return packed_attention_reference(query, kv, scaling)
    return _module(backend, "decode").decode_attention(query, kv, scaling, **options)


def valid_part(kv, kv_lens=None, res_lens=None):
    """kv cut to its valid tokens (buffers kept at capacity hold more), for the reference attention, which takes
    one length for the whole batch: lengths that differ between sequences raise. Reads the lengths back."""
    from dataclasses import replace

    def one(lens, what):
        if lens is None:
            return None
        values = torch.as_tensor(lens).reshape(-1).tolist()
        if len(set(values)) > 1:
            raise ValueError(f"the torch reference attention takes one {what} for the whole batch, got {values}: "
                             "use a kernel backend (cuda, triton) for sequences of different lengths")
        return values[0] if values else None

    t, r = one(kv_lens, "kv_lens"), one(res_lens, "res_lens")
    if t is not None and kv.k is not None and t < kv.k.num_tokens:
        if t % kv.k.group:
            raise ValueError(f"the torch reference cuts the packed tokens at whole {kv.k.group}-token groups, got "
                             f"kv_lens {t}: use a kernel backend (cuda, triton), which masks inside a group")
        if kv.k.order != "natural":  # a kernel's order permutes inside blocks: cut in the natural one
            kv = replace(kv, k=kv.k.to_order("natural"), v=kv.v.to_order("natural"))
        if t == 0:
            kv = replace(kv, k=None, v=None, norms=None)
        else:
            kq, g = kv.k, kv.k.group
            k = replace(kq, codes=kq.codes[:, :, :t * kq.bits // 32], scale=kq.scale[:, :, :t // g],
                        zero=kq.zero[:, :, :t // g])
            v = kv.v.map(lambda x: x[:, :, :t])
            kv = replace(kv, k=k, v=v, norms=kv.norms[:, :t] if kv.norms is not None else None)
    if r is not None and r < kv.k_res.shape[-2]:
        kv = replace(kv, k_res=kv.k_res[:, :, :r], v_res=kv.v_res[:, :, :r])
    return kv


def pack_kv(k, v, rotate: bool = True, token_norm: bool = True, backend: str | None = None,
            rotate_values: bool | None = None):
    """OScaR pack of a block K, V [B, H, T, D] (T % 32 == 0): (k_q, v_q, norms) as oscar.pack_block.
    rotate_values (default: rotate) = False packs V as it comes: the model's weights carry its rotation
    (quant/fold.py)."""
    backend = backend or default_backend(k.device)
    rotate_values = rotate if rotate_values is None else rotate_values
    if backend == "torch":
        from quant.methods.oscar import OScaRConfig, pack_block
        from quant.primitives import hadamard

        cfg = OScaRConfig(rotation="hadamard" if rotate else "none", token_norm=token_norm)
        return pack_block(k, v, cfg, hadamard(k.shape[-1], device=k.device) if rotate else None,
                          rotate_values=rotate_values)
    return _module(backend, "pack").pack_kv(k, v, rotate, token_norm, rotate_values)
