"""Decode-time linear layers on the CUDA GEMV kernel (csrc/include/oscar_gemv.cuh), and `fuse_linears`, which
puts them under a transformers model.

A decode step at batch 1 multiplies one token by every weight matrix: a stream of 16 GB for a Qwen3-8B shape. cuBLAS
runs most of those shapes as a split-K GEMM and a second reduction kernel, which leaves the q/k/v and output projections
below the copy bandwidth (docs/PERFORMANCE.md, Layer kernels). The kernel here reads each weight once with all
of K in one CTA and writes the rounded result directly; the MLP's silu(gate(x)) * up(x) is one launch instead of four,
and an attention's q, k and v projections are one launch instead of three (`_qkv_forward`; the attention classes the
model's quant.traits.ModelTraits lists).
The kernel takes up to 8 tokens (`MAX_TOKENS`) in fp16/bf16, but beats cuBLAS only up to 2 (`FAST_TOKENS`; from 3 tokens
the activation reloads and the FMAs catch up with the weight stream, and cuBLAS's tensor cores win), so patched models
use it for 1-2 tokens (a batch-1 or batch-2 decode step); everything else (prefill, larger batches, training, CPU) goes
to torch.

Numerics: float32 accumulation and one rounding per output, as a cuBLAS GEMM; only the summation order differs,
so results are within the error of torch's own bf16 GEMM against float64 (tests/kernels/test_kernels_linear.py), not bit
for bit. The gated MLP rounds g, silu(g), u and silu(g) * u to the dtype, as transformers' separate kernels do.
"""

from __future__ import annotations

import functools
import types

import torch
import torch.nn.functional as F

from quant.kernels.patches import Patches
from quant.traits import ModelTraits

DTYPES = (torch.float16, torch.bfloat16)
MAX_TOKENS = 8
FAST_TOKENS = 2
SILU = ("SiLU", "SiLUActivation")  # torch.nn.SiLU, transformers.activations.SiLUActivation


def rows_per_cta(n: int, device: torch.device) -> int:
    """Output rows per CTA: 4 (four weight rows' loads in flight per thread) while that still gives >= 4 CTAs per
    SM, else fewer, so that small projections (k/v: 1024 rows) still spread over every SM. FORCED_ROWS, when set,
    overrides the choice (benchmarks/sweep_linear.py)."""
    return FORCED_ROWS or _default_rows(n, device)


FORCED_ROWS: int | None = None


@functools.lru_cache(maxsize=None)
def _default_rows(n: int, device: torch.device) -> int:  # once per shape: the decode path is Python-bound in eager
    from quant.kernels.common import num_sms

    ctas = 4 * num_sms(device)
    return next((r for r in (4, 2) if -(-n // r) >= ctas), 1)


def supported(x: torch.Tensor, *weights: torch.Tensor, tokens: int = MAX_TOKENS) -> bool:
    """Whether `linear` / `silu_mul` take x [..., K] with these [N, K] weights: CUDA, one fp16/bf16 dtype,
    contiguous weights, K % 8 == 0, 1 to `tokens` rows of x, no autograd."""
    k = x.shape[-1] if x.dim() else 0
    if not (x.is_cuda and x.dtype in DTYPES and k and k % 8 == 0 and 0 < x.numel() // k <= min(tokens, MAX_TOKENS)):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or any(w.requires_grad for w in weights)):
        return False  # the kernel has no backward
    return all(
        w.dtype == x.dtype
        and w.device == x.device
        and w.dim() == 2
        and w.shape[1] == k
        and w.is_contiguous()
        and w.data_ptr() % 16 == 0
        for w in weights
    )


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as [M, K] with a contiguous last dim, 16-byte aligned rows (a view when the strides allow)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1 or x2.stride(0) % 8 or x2.data_ptr() % 16:
        x2 = x2.contiguous() if x2.data_ptr() % 16 == 0 else x2.clone(memory_format=torch.contiguous_format)
    return x2


_EMPTY: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _empty(like: torch.Tensor) -> torch.Tensor:
    key = (like.device, like.dtype)
    if key not in _EMPTY:
        _EMPTY[key] = torch.empty(0, dtype=like.dtype, device=like.device)
    return _EMPTY[key]


def _check(x: torch.Tensor, *weights: torch.Tensor) -> None:
    if not supported(x, *weights):
        shapes = ", ".join(f"{tuple(w.shape)} {w.dtype}" for w in weights)
        raise ValueError(
            f"fused_linear: x {tuple(x.shape)} {x.dtype} on {x.device} with weights {shapes}: need "
            f"CUDA fp16/bf16, contiguous [N, K] weights of x's dtype, K % 8 == 0, 1 to {MAX_TOKENS} "
            "tokens, no autograd (use torch.nn.functional.linear otherwise)"
        )


def linears(
    x: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor | None] | None = None,
    rows: int | None = None,
) -> list[torch.Tensor]:
    """[F.linear(x, w, b) for w, b in zip(weights, biases)] for 1 to 3 weights of one input x [..., K] of 1 to
    MAX_TOKENS tokens, in one launch of the GEMV kernel -> one [..., N_s] tensor per weight."""
    biases = [None] * len(weights) if biases is None else list(biases)
    _check(x, *weights)
    if not 1 <= len(weights) == len(biases) <= 3:
        raise ValueError(f"fused_linear: {len(weights)} weights and {len(biases)} biases: need 1 to 3 of each")
    for w, b in zip(weights, biases):
        if b is not None and (b.dtype != x.dtype or b.shape != (w.shape[0],)):
            raise ValueError(f"fused_linear: bias {tuple(b.shape)} {b.dtype}: need [{w.shape[0]}] {x.dtype}")
    return _launch(x, weights, [None if b is None else b.contiguous() for b in biases], rows=rows)


def _launch(
    x: torch.Tensor, weights, biases, w_up: torch.Tensor | None = None, rows: int | None = None
) -> list[torch.Tensor]:
    """The kernel call, inputs already checked (`linears`, `silu_mul`, or a patched forward's `supported`)."""
    from quant.kernels.cuda import load_layers

    none = _empty(x)
    n = sum(w.shape[0] for w in weights)
    outs = load_layers().gemv(
        _rows(x),
        list(weights),
        [none if b is None else b for b in biases],
        none if w_up is None else w_up,
        rows or rows_per_cta(n, x.device),
    )
    return [o.view(*x.shape[:-1], o.shape[-1]) for o in outs]


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, rows: int | None = None
) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., K] of 1 to MAX_TOKENS tokens on the GEMV kernel -> [..., N]."""
    return linears(x, [weight], [bias], rows)[0]


def silu_mul(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """silu(x w_gate^T) * (x w_up^T), rounded step by step as transformers' MLP, in one launch -> [..., N]."""
    _check(x, w_gate, w_up)
    if w_gate.shape != w_up.shape:
        raise ValueError(f"fused_linear: gate {tuple(w_gate.shape)} and up {tuple(w_up.shape)} weights differ")
    return _launch(x, [w_gate], [None], w_up, rows)[0]


def _kernel_ready() -> bool:
    """Whether the extension is built (or builds now); where it cannot build, one warning and torch's layers."""
    from quant.kernels.cuda import layers_ready

    return layers_ready()


def _bias_ok(bias: torch.Tensor | None, x: torch.Tensor) -> bool:
    return bias is None or (bias.dtype == x.dtype and bias.is_contiguous())


def _linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Instance forward of a patched nn.Linear: the kernel for 1-2 token CUDA inputs, torch's otherwise."""
    if supported(x, self.weight, tokens=FAST_TOKENS) and _bias_ok(self.bias, x) and _kernel_ready():
        return _launch(x, [self.weight], [self.bias])[0]
    return F.linear(x, self.weight, self.bias)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Instance forward of a patched SiLU MLP: gate and up in one launch for 1-2 token CUDA inputs."""
    gate, up = self.gate_proj, self.up_proj
    if (
        gate.bias is None
        and up.bias is None
        and gate.weight.shape == up.weight.shape
        and supported(x, gate.weight, up.weight, tokens=FAST_TOKENS)
        and _kernel_ready()
    ):
        return self.down_proj(_launch(x, [gate.weight], [None], up.weight)[0])
    return type(self).forward(self, x)


def _qkv_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Instance forward of a patched attention's q_proj: q, k and v in one launch for 1-2 token CUDA inputs. k and v
    wait in the stash shared with k_proj and v_proj, which the attention's forward calls next on this same tensor;
    called with any other tensor, they compute their own."""
    k_proj, v_proj, stash = self.oscar_qkv
    projs = (self, k_proj, v_proj)
    stash.clear()
    if (
        supported(x, *(p.weight for p in projs), tokens=FAST_TOKENS)
        and all(_bias_ok(p.bias, x) for p in projs)
        and _kernel_ready()
    ):
        q, k, v = _launch(x, [p.weight for p in projs], [p.bias for p in projs])
        stash.extend([x, k, v])
        return q
    return _linear_forward(self, x)


def _stashed_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Instance forward of a patched attention's k_proj or v_proj: what q_proj computed for this very tensor (the
    stash holds a reference to it, so identity cannot be reused), else its own product."""
    stash, slot = self.oscar_stash
    if stash and stash[0] is x and stash[slot] is not None:
        out, stash[slot] = stash[slot], None
        if stash[1] is None and stash[2] is None:
            stash.clear()
        return out
    return _linear_forward(self, x)


def _listed(module: torch.nn.Module, qualified: tuple[str, ...], *linears: str) -> bool:
    # The module is part of the name: a remote-code class may reuse a listed name with another forward.
    return ModelTraits.name(type(module)) in qualified and all(
        type(getattr(module, p, None)) is torch.nn.Linear and "forward" not in vars(getattr(module, p)) for p in linears
    )


def _fusable_mlp(module: torch.nn.Module, qualified: tuple[str, ...]) -> bool:
    return (
        _listed(module, qualified, "gate_proj", "up_proj", "down_proj")
        and type(getattr(module, "act_fn", None)).__name__ in SILU
    )


def _fuse_qkv(attn: torch.nn.Module, patches: Patches) -> None:
    q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
    stash: list = []  # [x, k(x), v(x)] between q_proj's call and k_proj's / v_proj's
    patches.set(q, "oscar_qkv", (k, v, stash))  # a tuple: not registered as submodules
    patches.set(k, "oscar_stash", (stash, 1))
    patches.set(v, "oscar_stash", (stash, 2))
    patches.set(q, "forward", types.MethodType(_qkv_forward, q))
    patches.set(k, "forward", types.MethodType(_stashed_forward, k))
    patches.set(v, "forward", types.MethodType(_stashed_forward, v))


def fuse_linears(model: torch.nn.Module, traits: ModelTraits, patches: Patches | None = None) -> dict[str, int]:
    """Route `model`'s nn.Linear layers (exact class), the SiLU MLPs of a class `traits.mlp` lists (gate, up, SiLU and
    the product in one launch) and the q/k/v projections of the attentions `traits.attention` lists (one launch)
    through the GEMV kernel for CUDA inputs of 1 to FAST_TOKENS tokens; everything else stays on torch. Sets instance
    `forward`s (bound methods: deepcopy rebinds them) recorded in `patches` (quant.kernels.patches.Patches: `undo()`
    takes them back); a module whose forward is already overridden (by this, or by accelerate's hooks) is left alone,
    so it is idempotent. Returns {"linear": n, "mlp": n, "qkv": n} patched now (q/k/v counted once per attention)."""
    patches = patches if patches is not None else Patches()
    counts = {"linear": 0, "mlp": 0, "qkv": 0}
    for module in model.modules():  # parents come before their children
        if "forward" in module.__dict__:
            continue
        if _listed(module, traits.attention, "q_proj", "k_proj", "v_proj"):
            _fuse_qkv(module, patches)
            counts["qkv"] += 1
        elif type(module) is torch.nn.Linear:
            patches.set(module, "forward", types.MethodType(_linear_forward, module))
            counts["linear"] += 1
        elif _fusable_mlp(module, traits.mlp):
            patches.set(module, "forward", types.MethodType(_mlp_forward, module))
            counts["mlp"] += 1
    for kind, n in counts.items():
        patches.add(kind, n)
    return counts
