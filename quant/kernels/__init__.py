"""Fast OScaR kernels: decode attention over the packed cache and the fused append/pack.

Backends (same numbers up to rounding, chosen at run time):
- "cuda":   csrc/ through torch.utils.cpp_extension (quant.kernels.cuda), needs a CUDA GPU (sm_80+) and nvcc;
- "triton": quant.kernels.triton_decode / triton_pack, any GPU Triton supports, or the CPU under
            TRITON_INTERPRET=1 (what CI runs, small shapes only);
- "torch":  the reference (quant.attention.packed_attention_reference, quant.packed.pack_reference).
`default_backend(device)` picks "cuda" on a CUDA device when nvcc is there, else "triton" on CUDA, else
"torch"; a run chooses another through its `quant.kernels.options.KernelOptions` (backend=...).
"""

from __future__ import annotations

import importlib

import torch

from quant.kernels.options import BACKENDS, KernelOptions, default_backend

__all__ = ["BACKENDS", "KernelOptions", "default_backend", "decode_attention", "pack_kv", "valid_part"]


def _module(backend: str, kind: str):
    if backend not in ("cuda", "triton"):
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {BACKENDS}")
    name = "quant.kernels.cuda" if backend == "cuda" else f"quant.kernels.triton_{kind}"
    return importlib.import_module(name)


# Tokens of every split in the batch-invariant mode: the split-KV plan then depends on no other row (a row of n tokens
# has ceil(n / this) splits whatever the batch; the launch's other splits are empty for it and merge as exact zeros).
INVARIANT_SPLIT_TOKENS = 1024


def decode_attention(query, kv, scaling: float, backend: str | None = None, **options):
    """Attention of query [B, Hq, Lq, D] over a quant.packed.PackedKV -> [B, Hq, Lq, D] (query dtype).

    options: kv_lens, res_lens (valid tokens per sequence), split_tokens (split-KV size), wide (the CUDA backend may
    take its 8-warp build for few-row steps), invariant (KernelOptions.batch_invariant: a row's arithmetic the same
    whatever the other rows of the batch: INVARIANT_SPLIT_TOKENS a split).
    """
    backend = backend or default_backend(query.device)
    wide = options.pop("wide", True)  # the CUDA build choice (KernelOptions.wide_decode); other backends have one
    invariant = options.pop("invariant", False)  # KernelOptions.batch_invariant: each row's plan its own
    if backend == "torch":
        from quant.attention import packed_attention_reference

        kv_lens, res_lens = options.get("kv_lens"), options.get("res_lens")
        # sequences of different lengths, or any batch in the batch-invariant mode: one by one
        if query.shape[0] > 1 and (invariant or _differ(kv_lens) or _differ(res_lens)):
            return torch.cat(
                [
                    decode_attention(
                        query[b : b + 1],
                        row_of(kv, b),
                        scaling,
                        "torch",
                        kv_lens=None if kv_lens is None else kv_lens[b : b + 1],
                        res_lens=None if res_lens is None else res_lens[b : b + 1],
                    )
                    for b in range(query.shape[0])
                ]
            )
        return packed_attention_reference(query, valid_part(kv, kv_lens, res_lens), scaling)
    if backend == "cuda":
        options.update(wide=wide, invariant=invariant)
    elif invariant:  # Triton: one split size for every row and batch (its plan otherwise sizes splits by the grid)
        options.setdefault("split_tokens", INVARIANT_SPLIT_TOKENS)
    return _module(backend, "decode").decode_attention(query, kv, scaling, **options)


def _differ(lens) -> bool:
    return lens is not None and len(set(torch.as_tensor(lens).reshape(-1).tolist())) > 1


def row_of(kv, b: int):
    """Sequence b of a PackedKV, as a batch of one (views)."""
    from dataclasses import replace

    one = lambda t: t[b : b + 1]  # noqa: E731
    return replace(
        kv,
        k=None if kv.k is None else kv.k.map(one),
        v=None if kv.v is None else kv.v.map(one),
        norms=None if kv.norms is None else kv.norms[b : b + 1],
        k_res=kv.k_res[b : b + 1],
        v_res=kv.v_res[b : b + 1],
    )


def valid_part(kv, kv_lens=None, res_lens=None):
    """kv cut to its valid tokens (buffers kept at capacity hold more), for the reference attention, which takes
    one length for the whole batch: lengths that differ between sequences raise (decode_attention's torch backend
    attends such a batch one sequence at a time). Reads the lengths back."""
    from dataclasses import replace

    def one(lens, what):
        if lens is None:
            return None
        values = torch.as_tensor(lens).reshape(-1).tolist()
        if len(set(values)) > 1:
            raise ValueError(
                f"the torch reference attention takes one {what} for the whole batch, got {values}: "
                "use a kernel backend (cuda, triton) for sequences of different lengths"
            )
        return values[0] if values else None

    t, r = one(kv_lens, "kv_lens"), one(res_lens, "res_lens")
    if t is not None and kv.k is not None and t < kv.k.num_tokens:
        if t % kv.k.group:
            raise ValueError(
                f"the torch reference cuts the packed tokens at whole {kv.k.group}-token groups, got "
                f"kv_lens {t}: use a kernel backend (cuda, triton), which masks inside a group"
            )
        if kv.k.order != "natural":  # a kernel's order permutes inside blocks: cut in the natural one
            kv = replace(kv, k=kv.k.to_order("natural"), v=kv.v.to_order("natural"))
        if t == 0:
            kv = replace(kv, k=None, v=None, norms=None)
        else:
            kq, g = kv.k, kv.k.group
            k = replace(
                kq,
                codes=kq.codes[:, :, : t * kq.bits // 32],
                scale=kq.scale[:, :, : t // g],
                zero=kq.zero[:, :, : t // g],
            )
            v = kv.v.map(lambda x: x[:, :, :t])
            kv = replace(kv, k=k, v=v, norms=kv.norms[:, :t] if kv.norms is not None else None)
    if r is not None and r < kv.k_res.shape[-2]:
        kv = replace(kv, k_res=kv.k_res[:, :, :r], v_res=kv.v_res[:, :, :r])
    return kv


def pack_kv(
    k,
    v,
    rotate: bool = True,
    token_norm: bool = True,
    backend: str | None = None,
    rotate_values: bool | None = None,
    zero_point: str = "float",
):
    """OScaR pack of a block K, V [B, H, T, D] (T % 32 == 0) on a kernel backend: (k_q, v_q, norms), the layout of
    the reference quant.packed.pack_reference.
    rotate_values (default: rotate) = False packs V as it comes: the model's weights carry its rotation
    (quant/fold.py). zero_point: "float" (the minimum) or "integer" (quant.primitives.asym_quantize)."""
    backend = backend or default_backend(k.device)
    rotate_values = rotate if rotate_values is None else rotate_values
    if backend == "torch":  # the reference packer is quant.packed's: this package never imports quant.methods
        raise ValueError(
            "pack_kv packs with a kernel backend (cuda, triton); the torch reference pack is "
            "quant.packed.pack_reference (quant.methods.oscar.pack_block picks between them)"
        )
    if zero_point not in ("float", "integer"):
        raise ValueError(f"zero_point must be 'float' or 'integer', got {zero_point!r}")
    return _module(backend, "pack").pack_kv(k, v, rotate, token_norm, rotate_values, zero_point)


def patch_model(model, options: KernelOptions | None, traits):
    """Route a GPU model's RMSNorms, RoPE and decode-sized linear layers through the project's kernels, as `options`
    asks (fused_norm, fused_rope, fused_linear; layer_kernels: CUDA or Triton launches for norms and RoPE), for the
    classes the model family's `traits` (quant.traits.ModelTraits) lists. A model without CUDA weights, or a machine
    without triton, is left alone. Returns the quant.kernels.patches.Patches: `counts` (patched of each kind) and
    `undo()`, which restores the model's modules exactly. quant.prepare_model calls it; PreparedModel.undo undoes it."""
    from quant.kernels.patches import Patches

    options = options or KernelOptions()
    patches = Patches()
    if not any(p.is_cuda for p in model.parameters()):
        return patches  # a CPU model would only ever take the fallback: leave it (and triton's import) alone
    try:
        from quant.kernels import fused_linear, triton_norm, triton_rope
    except ImportError:  # no triton (the optional `kernels` extra)
        return patches
    cuda_launch = options.layer_kernels == "cuda"
    if options.fused_rope:
        triton_rope.fuse_rotary(model, traits, cuda_launch, patches)
    if options.fused_linear and not options.batch_invariant:  # the GEMV sums otherwise than the mode's blocked GEMM
        fused_linear.fuse_linears(model, traits, patches)
    if options.fused_norm:
        triton_norm.fuse_rms_norms(model, traits, cuda_launch, patches)
    return patches
