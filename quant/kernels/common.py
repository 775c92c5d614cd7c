"""Checks and preparation shared by the Triton and CUDA backends (the dispatch layer).

`prepare_decode` turns (query, PackedKV) into flat, contiguous, checked tensors in the dtypes the
kernels read; `choose_split` picks the split-KV size. Kernels never see a tensor this file has not
checked, so a bad shape fails here with a message instead of reading out of bounds on the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from quant.packed import PackedKV

TOKEN_GROUP = 32  # tokens per key scale group (and channels per value group) that the kernels read
SUPPORTED_HEAD_DIMS = (64, 128)


@dataclass
class DecodeInputs:
    """Kernel-ready views. Shapes: q, qr [B, Hq, Lq, D]; keys codes [B, Hkv, T/16, D] int32, scale/zero
    [B, Hkv, T/32, D] fp16; values codes [B, Hkv, T, D/16], scale/zero [B, Hkv, T, D/32]; norms fp32
    [B, T]; k_res, v_res [B, Hkv, Tr, D] (last dim contiguous); kv_lens, res_lens int32 [B]; hd fp32 [D, D]."""

    q: torch.Tensor
    qr: torch.Tensor
    kc: torch.Tensor
    ks: torch.Tensor
    kz: torch.Tensor
    vc: torch.Tensor
    vs: torch.Tensor
    vz: torch.Tensor
    norms: torch.Tensor
    k_res: torch.Tensor
    v_res: torch.Tensor
    kv_lens: torch.Tensor
    res_lens: torch.Tensor
    hd: torch.Tensor
    batch: int
    kv_heads: int
    group: int
    lq: int
    head_dim: int
    tokens: int  # T, quantized tokens stored (padded length)
    residual: int  # Tr


_FULL_LENS: dict[tuple, torch.Tensor] = {}


def _full_lens(batch: int, value: int, device) -> torch.Tensor:
    """int32 [batch] filled with `value`, made once per (device, batch, value): a step that passes no lengths
    then launches the kernel alone (no fill kernels in a captured decode step). Never cached while a CUDA graph
    is being captured (a tensor made then is only written when the graph replays)."""
    device = torch.device(device)
    key = (device, batch, value)
    t = _FULL_LENS.get(key)
    if t is None:
        t = torch.full((batch,), value, dtype=torch.int32, device=device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            if len(_FULL_LENS) >= 256:
                _FULL_LENS.clear()
            _FULL_LENS[key] = t
    return t


def _lens(lens, default: int, batch: int, limit: int, what: str, device) -> torch.Tensor:
    if lens is None:
        return _full_lens(batch, default, device)
    on_host = not (isinstance(lens, torch.Tensor) and lens.is_cuda)
    lens = torch.as_tensor(lens).reshape(-1)
    if lens.numel() != batch:
        raise ValueError(f"{what} must have one entry per sequence ({batch}), got {lens.numel()}")
    # Range checks only for host lengths: reading device lengths back would stall every decode step.
    if on_host and lens.numel() and (int(lens.min()) < 0 or int(lens.max()) > limit):
        raise ValueError(f"{what} must lie in [0, {limit}] (the stored tokens), got {lens.tolist()}")
    return lens.to(device=device, dtype=torch.int32).contiguous()


def _check_packed(kv: PackedKV, b: int, hkv: int, d: int) -> None:
    k, v = kv.k, kv.v
    if k.bits != 2 or v.bits != 2 or k.group != TOKEN_GROUP or v.group != TOKEN_GROUP:
        raise ValueError(
            f"the kernels read INT2 with groups of {TOKEN_GROUP}; got keys {k.bits} bits group "
            f"{k.group}, values {v.bits} bits group {v.group}: use backend='torch' for this config"
        )
    if k.axis != -2 or v.axis != -1:
        raise ValueError(
            f"keys must be grouped along tokens (axis -2) and values along channels (axis -1), got {k.axis}, {v.axis}"
        )
    t = k.num_tokens
    expect = {
        "key codes": (k.codes, (b, hkv, t // 16, d)),
        "value codes": (v.codes, (b, hkv, t, d // 16)),
        "key scale": (k.scale, (b, hkv, t // 32, d)),
        "value scale": (v.scale, (b, hkv, t, d // 32)),
    }
    for name, (x, shape) in expect.items():
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {shape} for the PackedKV layout")


def _check_window(lq: int, tr: int, res_lens) -> None:
    """The kernels mask causally inside the window only, so of the Lq new tokens only the first may be packed (it sees
    every packed token, itself the last); where a flush packed more of them, the torch path masks packed tokens too.
    Host lengths are checked; device lengths are trusted (reading them back would stall every decode step)."""
    if lq == 1 or (isinstance(res_lens, torch.Tensor) and res_lens.is_cuda):
        return
    short = min([tr] if res_lens is None else [int(r) for r in torch.as_tensor(res_lens).reshape(-1)], default=lq)
    if short < lq - 1:
        raise ValueError(
            f"{lq} query tokens but only {short} in the full-precision window (a flush just packed "
            f"{lq - short} of them; the kernels need >= {lq - 1} there): use backend='torch' for this step"
        )


def _no_packed(dev) -> tuple[torch.Tensor, ...]:
    """Stand-ins for the codes, scales, zeros and norms of a cache that packed nothing yet (no kernel reads them)."""
    i32, f16 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.float16, device=dev)
    kc, ks, kz = torch.zeros(1, **i32), torch.zeros(1, **f16), torch.zeros(1, **f16)
    return kc, ks, kz, kc, ks, kz, torch.ones(1, dtype=torch.float32, device=dev)


def prepare_decode(
    query: torch.Tensor, kv: PackedKV, kv_lens=None, res_lens=None, rotate_query: bool = True, order: str = "natural"
) -> DecodeInputs:
    """Check and flatten one layer's decode inputs (see DecodeInputs). query [B, Hq, Lq, D].
    rotate_query=False leaves qr empty (a kernel that rotates the query itself). order: the code order the
    kernel reads (quant/packed.py); codes stored in the other order are converted (a slow fallback)."""
    if query.dim() != 4:
        raise ValueError(f"query must be [B, Hq, Lq, D], got shape {tuple(query.shape)}")
    b, hq, lq, d = query.shape
    hkv, tr = kv.k_res.shape[1], kv.k_res.shape[2]
    if d not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim {d} is not compiled; supported: {SUPPORTED_HEAD_DIMS}")
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    if tuple(kv.k_res.shape) != (b, hkv, tr, d) or kv.v_res.shape != kv.k_res.shape:
        raise ValueError(
            f"residual K/V must be [B={b}, Hkv, Tr, D={d}], got {tuple(kv.k_res.shape)} and {tuple(kv.v_res.shape)}"
        )
    _check_window(lq, tr, res_lens)
    dev = query.device
    if kv.k is None:
        t = 0
        kc, ks, kz, vc, vs, vz, norms = _no_packed(dev)
    else:
        _check_packed(kv, b, hkv, d)
        t = kv.k.num_tokens
        kq, vq = kv.k.to_order(order), kv.v.to_order(order)
        kc, ks, kz = (x.contiguous() for x in (kq.codes, kq.scale, kq.zero))
        vc, vs, vz = (x.contiguous() for x in (vq.codes, vq.scale, vq.zero))
        norms = kv.norms if kv.norms is not None else torch.ones(b, t, device=dev)
        norms = norms.to(torch.float32).contiguous()
    hd = kv.hadamard if kv.hadamard is not None else torch.eye(d, device=dev)
    hd = hd.to(device=dev, dtype=torch.float32).contiguous()
    k_res, v_res = kv.k_res, kv.v_res
    if k_res.stride(-1) != 1 or v_res.stride(-1) != 1:
        k_res, v_res = k_res.contiguous(), v_res.contiguous()
    q = query.to(k_res.dtype if k_res.dtype in (torch.float16, torch.bfloat16) else torch.float16)
    if k_res.dtype != q.dtype:
        k_res, v_res = k_res.to(q.dtype), v_res.to(q.dtype)
    qr = (query.float() @ hd).to(torch.float16).contiguous() if rotate_query else query.new_empty(0)
    return DecodeInputs(
        q.contiguous(),
        qr,
        kc,
        ks,
        kz,
        vc,
        vs,
        vz,
        norms,
        k_res,
        v_res,
        _lens(kv_lens, t, b, t, "kv_lens", dev),
        _lens(res_lens, tr, b, tr, "res_lens", dev),
        hd,
        b,
        hkv,
        hq // hkv,
        lq,
        d,
        t,
        tr,
    )


@dataclass(frozen=True)
class DecodePlan:
    """One decode launch's plan for `rows` (batch x KV heads) of `tokens` packed tokens: the split-KV plan (splits of
    split_tokens tokens), where the full-precision window goes (its own CTA, else folded into the last split's), which
    CTAs start first (order: quant.kernels.cuda.plan's ORDER_*), how the partials merge (merge_group 0: one level, G:
    groups of G splits first) and the build that runs it (min_blocks CTAs an SM of `warps` warps). A step plans once
    for all its layers (they share the lengths). The CUDA binding reads it by field name (csrc/oscar_bindings.cu);
    the Triton launch reads the splits (its window always has its own program)."""

    tokens: int
    rows: int
    splits: int
    split_tokens: int
    window_cta: bool = True
    order: int = 0
    merge_group: int = 0
    min_blocks: int = 1
    warps: int = 4

    @property
    def merge_groups(self) -> int:
        """Second-level merge groups a row (0: one level)."""
        return -(-self.splits // self.merge_group) if self.merge_group and self.window_cta else 0

    @property
    def ctas(self) -> int:
        """CTAs (programs) of the launch's grid: each row's splits, plus its window's own; one a row without splits."""
        return (self.splits + self.window_cta if self.splits else 1) * self.rows

    def launch_record(self) -> dict:
        """The launch as a bench row records it: the build, splits, window, order and merge, and the grid's CTAs."""
        return {
            **{f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("tokens", "rows")},
            "ctas": self.ctas,
        }


def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def choose_split(tokens: int, rows: int, block: int, sms: int, waves: float = 3) -> tuple[int, int]:
    """Split-KV plan: (split_tokens, num_splits) so that rows * splits fills about `waves` waves of
    `sms` resident programs, each split a multiple of `block` tokens. rows = B * Hkv."""
    if tokens == 0:
        return block, 0
    want = max(1, math.ceil(waves * sms / max(rows, 1)))
    split = max(block, math.ceil(tokens / want / block) * block)
    return split, math.ceil(tokens / split)


def padded_rows(group: int, lq: int) -> int:
    """Rows of the score tile: GROUP * Lq padded to a power of two >= 16 (the tensor-core M)."""
    return max(16, 1 << (group * lq - 1).bit_length())


def bytes_read(kv: PackedKV) -> int:
    """Bytes one decode step must read: packed codes, scales and norms, plus the residual window."""
    total = sum(t.nbytes for q in (kv.k, kv.v) if q is not None for t in (q.codes, q.scale, q.zero))
    if kv.norms is not None:
        total += kv.norms.nbytes
    return total + kv.k_res.nbytes + kv.v_res.nbytes
