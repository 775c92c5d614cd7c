"""Rotary position embedding of q and k in one Triton kernel, and `fuse_rotary`, which puts it under a model.

transformers' attention forwards call their modeling module's `apply_rotary_pos_emb`. `fuse_rotary` puts a dispatcher
there (once per modeling module, while some patched model uses it; the original comes back after the last one's
undo) that calls the kernels only inside an attention module of a patched model: forward hooks on those modules set
the model's choice (`cuda_launch`) in a context variable for the duration of their call. Every other caller (another
model of the same family, unpatched or undone) gets transformers' own function. The choice is per model and undone
with it; no module global holds it.

On CUDA the patched RoPE launches the same formula as a CUDA kernel when the layout suits it (quant.kernels.cuda.rope,
csrc/include/oscar_rope.cuh, same bits); this kernel is the fallback and the one CI runs under the interpreter.

transformers applies RoPE as `q * cos + rotate_half(q) * sin` (and the same for k): ten elementwise kernels per layer (4
multiplies, 2 adds, 2 negations, 2 concatenations). At batch 1 they cost a decode step about as much as the OScaR
attention saves beside them (docs/PERFORMANCE.md, Layer kernels). The kernel does one (batch, position) per program,
every q and k head, and reproduces transformers' bits for fp16/bf16: each product is rounded to the input dtype, then
their sum (a product of two 16-bit floats is exact in float32, so float32 math then one rounding is torch's result for
each op).
"""

from __future__ import annotations

import contextvars
import sys

import torch
import triton
import triton.language as tl

from quant.kernels.patches import Patches
from quant.kernels.triton_norm import INTERPRET, _round
from quant.traits import ModelTraits

DTYPES = (torch.float16, torch.bfloat16)


@triton.jit
def _rotate(x_ptr, o_ptr, c, s, h, d, half, n_heads, d_model, sx_h, so_h, INTERPRET: tl.constexpr):
    """o[h, d] = round(round(x[h, d] c[d]) + round(rot(x)[h, d] s[d])), rot(x)[d] = -x[d + D/2] | x[d - D/2]."""
    mask = (h < n_heads)[:, None] & (d < d_model)[None, :]
    x = tl.load(x_ptr + h[:, None] * sx_h + d[None, :], mask=mask, other=0.0)
    partner = tl.where(d < half, d + half, d - half)
    xp = tl.load(x_ptr + h[:, None] * sx_h + partner[None, :], mask=mask, other=0.0).to(tl.float32)
    rot = tl.where((d < half)[None, :], -xp, xp)
    dt = x_ptr.dtype.element_ty
    a = _round(x.to(tl.float32) * c[None, :], dt, INTERPRET).to(tl.float32)
    b = _round(rot * s[None, :], dt, INTERPRET).to(tl.float32)
    tl.store(o_ptr + h[:, None] * so_h + d[None, :], _round(a + b, dt, INTERPRET), mask=mask)


@triton.jit(
    do_not_specialize=[
        "sq_b",
        "sq_h",
        "sq_l",
        "sk_b",
        "sk_h",
        "sk_l",
        "sc_b",
        "sc_l",
        "soq_b",
        "soq_h",
        "soq_l",
        "sok_b",
        "sok_h",
        "sok_l",
    ]
)
def rope_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    oq_ptr,
    ok_ptr,
    length,
    hq,
    hk,
    d_model,
    sq_b,
    sq_h,
    sq_l,
    sk_b,
    sk_h,
    sk_l,
    sc_b,
    sc_l,
    soq_b,
    soq_h,
    soq_l,
    sok_b,
    sok_h,
    sok_l,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Program (b, l): all hq query heads and hk key heads at that position. Last dims contiguous."""
    pid = tl.program_id(0)
    b = (pid // length).to(tl.int64)
    pos = (pid % length).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    h = tl.arange(0, BLOCK_H)
    c = tl.load(cos_ptr + b * sc_b + pos * sc_l + d, mask=d < d_model, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + b * sc_b + pos * sc_l + d, mask=d < d_model, other=0.0).to(tl.float32)
    half = d_model // 2
    _rotate(
        q_ptr + b * sq_b + pos * sq_l,
        oq_ptr + b * soq_b + pos * soq_l,
        c,
        s,
        h,
        d,
        half,
        hq,
        d_model,
        sq_h,
        soq_h,
        INTERPRET,
    )
    _rotate(
        k_ptr + b * sk_b + pos * sk_l,
        ok_ptr + b * sok_b + pos * sok_l,
        c,
        s,
        h,
        d,
        half,
        hk,
        d_model,
        sk_h,
        sok_h,
        INTERPRET,
    )


def supported(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1) -> bool:
    """Whether `rope` takes these inputs: q [B, Hq, L, D], k [B, Hk, L, D], cos/sin [B or 1, L, D], one fp16/bf16
    dtype, D even, last dims contiguous, no autograd, unsqueeze_dim 1 (transformers' decoder layout)."""
    if unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.shape != cos.shape:
        return False
    b, _, length, d = q.shape
    if (
        k.shape[0] != b
        or k.shape[2:] != (length, d)
        or d % 2
        or cos.shape[1:] != (length, d)
        or cos.shape[0] not in (1, b)
    ):
        return False
    if any(t.dtype != q.dtype or t.device != q.device or t.stride(-1) != 1 for t in (k, cos, sin)):
        return False
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, cos, sin))
    return q.dtype in DTYPES and q.stride(-1) == 1 and cos.stride() == sin.stride() and not grad


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q * cos + rotate_half(q) * sin, the same for k), cos/sin broadcast over heads, with transformers' rounding.
    Inputs as `supported` requires; the outputs take q's and k's strides (as torch's elementwise ops would)."""
    if not supported(q, k, cos, sin):
        raise ValueError(
            f"rope: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)}, cos {tuple(cos.shape)} "
            f"{cos.dtype}: need q/k [B, H, L, D] and cos/sin [B or 1, L, D] of one fp16/bf16 dtype, "
            "even D, contiguous last dims, no autograd"
        )
    b, hq, length, d = q.shape
    oq, ok = torch.empty_like(q), torch.empty_like(k)
    if q.numel() == 0 or k.numel() == 0:
        return oq, ok
    sc_b = 0 if cos.shape[0] == 1 else cos.stride(0)
    args = (
        q,
        k,
        cos,
        sin,
        oq,
        ok,
        length,
        hq,
        k.shape[1],
        d,
        *(q.stride(i) for i in (0, 1, 2)),
        *(k.stride(i) for i in (0, 1, 2)),
        sc_b,
        cos.stride(1),
        *(oq.stride(i) for i in (0, 1, 2)),
        *(ok.stride(i) for i in (0, 1, 2)),
    )
    block_h, block_d = triton.next_power_of_2(max(hq, k.shape[1])), triton.next_power_of_2(d)
    meta = dict(BLOCK_H=block_h, BLOCK_D=block_d, INTERPRET=INTERPRET, num_warps=4 if block_h * block_d <= 4096 else 8)
    if not INTERPRET:  # no multiply-add contraction: each product is rounded on its own, as torch does
        meta["enable_fp_fusion"] = False
    if q.is_cuda and q.device.index != torch.cuda.current_device():  # Triton launches on the current device
        with torch.cuda.device(q.device):
            rope_kernel[(b * length,)](*args, **meta)
    else:
        rope_kernel[(b * length,)](*args, **meta)
    return oq, ok


# The RoPE launch of the patched attention running now: None (transformers' own), True (the CUDA kernel where it takes
# the inputs, else the Triton one) or False (the Triton kernel). Set by the forward hooks of `fuse_rotary`.
_LAUNCH: contextvars.ContextVar[bool | None] = contextvars.ContextVar("oscar_rope_launch", default=None)
# Modeling modules whose apply_rotary_pos_emb is the dispatcher: name -> (transformers' function, models using it).
_DISPATCHED: dict[str, list] = {}


def _dispatcher(original):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        launch = _LAUNCH.get()
        if launch is not None and q.is_cuda and supported(q, k, cos, sin, unsqueeze_dim):
            from quant.kernels import cuda

            if launch and cuda.layer_kernels_on(q.device) and cuda.rope_takes(q, k, cos, sin):  # one C++ launch
                return cuda.rope(q, k, cos, sin)
            return rope(q, k, cos, sin)
        return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)

    apply_rotary_pos_emb.oscar_original = original
    apply_rotary_pos_emb.__doc__ = (
        "Inside an attention of a model patched by quant.kernels.triton_rope.fuse_rotary: "
        "quant.kernels.cuda.rope or triton_rope on CUDA; else transformers' own "
        "(oscar_original)."
    )
    return apply_rotary_pos_emb


def _install(name: str, mod) -> None:
    """Put the dispatcher on modeling module `name` (once), counting one more model that uses it."""
    if name not in _DISPATCHED or not hasattr(mod.apply_rotary_pos_emb, "oscar_original"):  # (put back by hand)
        _DISPATCHED[name] = [mod.apply_rotary_pos_emb, 0]
        mod.apply_rotary_pos_emb = _dispatcher(mod.apply_rotary_pos_emb)
    _DISPATCHED[name][1] += 1


def _release(name: str) -> None:
    """One model less uses the dispatcher on `name`; the last one puts transformers' function back."""
    entry = _DISPATCHED.get(name)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _DISPATCHED[name]
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod.apply_rotary_pos_emb, "oscar_original", None) is entry[0]:
            mod.apply_rotary_pos_emb = entry[0]


def _hooks(launch: bool):
    """A forward pre-hook that selects `launch` while the module runs and the forward hook that takes it back."""
    tokens: list = []  # one per call in progress (a module called inside its own call would nest)

    def pre_hook(module, args, kwargs):
        tokens.append(_LAUNCH.set(launch))

    def post_hook(module, args, output):
        if tokens:
            _LAUNCH.reset(tokens.pop())

    return pre_hook, post_hook


def fuse_rotary(
    model: torch.nn.Module, traits: ModelTraits, cuda_launch: bool = True, patches: Patches | None = None
) -> list[str]:
    """Route the RoPE of `model`'s attention modules through `rope` on CUDA: those of a class `traits.attention` lists
    whose modeling module `traits.rope` lists (its `apply_rotary_pos_emb` is the rotate-half formula).

    The modeling module's `apply_rotary_pos_emb` becomes the dispatcher (see the module docstring), and each such
    attention module gets forward hooks that select the kernels while it runs: the CUDA kernel where `cuda_launch` and
    `quant.kernels.cuda.layer_kernels_on`, else the Triton one. The kernel gives transformers' bits, so the
    replacement is invisible except in speed. Recorded in `patches` (`undo()` removes the hooks and, after the last
    patched model's undo, the dispatcher). A module already hooked is skipped. Returns the modeling modules this call
    routed (once each)."""
    patches = patches if patches is not None else Patches()
    routed: list[str] = []
    for module in model.modules():
        name = type(module).__module__
        mod = sys.modules.get(name)
        if (
            ModelTraits.name(type(module)) not in traits.attention
            or name not in traits.rope
            or not callable(getattr(mod, "apply_rotary_pos_emb", None))
            or _hooked(module)
        ):
            continue
        pre, post = _hooks(cuda_launch)
        handles = [
            module.register_forward_pre_hook(pre, with_kwargs=True),
            module.register_forward_hook(post, always_call=True),
        ]
        patches.set(module, "_oscar_rope_hooks", handles)
        patches.on_undo(lambda hs=handles: [h.remove() for h in hs])
        if name not in routed:
            routed.append(name)
    for name in routed:
        _install(name, sys.modules[name])
        patches.on_undo(lambda n=name: _release(n))
    patches.add("rope", len(routed))
    return routed


def _hooked(module: torch.nn.Module) -> bool:
    return "_oscar_rope_hooks" in module.__dict__
