"""Decode-time linear layers on the CUDA GEMV kernel (csrc/include/oscar_gemv.cuh), and `fuse_linears`, which
puts them under a transformers model.

A decode step at batch 1 multiplies one token by every weight matrix: a stream of 16 GB for a Qwen3-8B shape.
cuBLAS runs most of those shapes as a split-K GEMM and a second reduction kernel; the q/k/v and output
projections reach ~1.5-2.6 TB/s (run 49's profile). The kernel here reads each weight once with all of K in one
CTA and writes the rounded result directly, and the MLP's silu(gate(x)) * up(x) is one launch instead of four.
The kernel takes up to 8 tokens (`MAX_TOKENS`) in fp16/bf16, but beats cuBLAS only up to 2 (`FAST_TOKENS`, run
50-51: at 3-8 tokens the activation reloads and the FMAs catch up with the weight stream, and cuBLAS's tensor
cores win), so patched models use it for 1-2 tokens (a batch-1 or batch-2 decode step); everything else
(prefill, larger batches, training, CPU) goes to torch.

Numerics: float32 accumulation and one rounding per output, as a cuBLAS GEMM; only the summation order differs,
so results are within the error of torch's own bf16 GEMM against float64 (tests/test_kernels_linear.py), not bit
for bit. The gated MLP rounds g, silu(g), u and silu(g) * u to the dtype, as transformers' separate kernels do.
"""
from __future__ import annotations

import os
import types
import warnings

import torch
import torch.nn.functional as F

DTYPES = (torch.float16, torch.bfloat16)
MAX_TOKENS = 8
FAST_TOKENS = 2
# Dense MLPs whose forward is exactly down_proj(act_fn(gate_proj(x)) * up_proj(x)) (transformers 5.x, checked
# against the installed source by tests/test_kernels_linear.py); fused only when act_fn is SiLU.
MLP_CLASSES = {
    "llama": ("LlamaMLP",),
    "mistral": ("MistralMLP",),
    "qwen2": ("Qwen2MLP",),
    "qwen3": ("Qwen3MLP",),
    "qwen3_moe": ("Qwen3MoeMLP",),
    "qwen3_vl": ("Qwen3VLTextMLP",),
    "qwen3_vl_moe": ("Qwen3VLMoeTextMLP",),
    "qwen3_omni_moe": ("Qwen3OmniMoeThinkerTextMLP",),
    "smollm3": ("SmolLM3MLP",),
}
SILU = ("SiLU", "SiLUActivation")  # torch.nn.SiLU, transformers.activations.SiLUActivation


def enabled() -> bool:
    """OSCAR_FUSED_LINEAR=0 keeps torch's linear layers (A/B timing, or to rule the kernel out)."""
    return os.environ.get("OSCAR_FUSED_LINEAR", "1") != "0"


def rows_per_cta(n: int, device: torch.device) -> int:
    """Output rows per CTA: 4 (four weight rows' loads in flight per thread) while that still gives >= 4 CTAs per
    SM, else fewer, so that small projections (k/v: 1024 rows) still spread over every SM. OSCAR_GEMV_ROWS forces
    a value (sweeps)."""
    forced = os.environ.get("OSCAR_GEMV_ROWS")
    if forced:
        return int(forced)
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
    return all(w.dtype == x.dtype and w.device == x.device and w.dim() == 2 and w.shape[1] == k and w.is_contiguous()
               and w.data_ptr() % 16 == 0 and w.shape == weights[0].shape for w in weights)


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
        raise ValueError(f"fused_linear: x {tuple(x.shape)} {x.dtype} on {x.device} with weights {shapes}: need "
                         f"CUDA fp16/bf16, contiguous [N, K] weights of x's dtype, K % 8 == 0, 1 to {MAX_TOKENS} "
                         "tokens, no autograd (use torch.nn.functional.linear otherwise)")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           rows: int | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [..., K] of 1 to MAX_TOKENS tokens on the GEMV kernel -> [..., N]."""
    _check(x, weight)
    if bias is not None and (bias.dtype != x.dtype or bias.shape != (weight.shape[0],)):
        raise ValueError(f"fused_linear: bias {tuple(bias.shape)} {bias.dtype}: need [{weight.shape[0]}] {x.dtype}")
    from quant.kernels.cuda import load_linear

    n = weight.shape[0]
    out = load_linear().gemv(_rows(x), weight, _empty(x), _empty(x) if bias is None else bias.contiguous(), False,
                             rows or rows_per_cta(n, x.device))
    return out.view(*x.shape[:-1], n)


def silu_mul(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, rows: int | None = None) -> torch.Tensor:
    """silu(x w_gate^T) * (x w_up^T), rounded step by step as transformers' MLP, in one launch -> [..., N]."""
    _check(x, w_gate, w_up)
    from quant.kernels.cuda import load_linear

    n = w_gate.shape[0]
    out = load_linear().gemv(_rows(x), w_gate, w_up, _empty(x), True, rows or rows_per_cta(n, x.device))
    return out.view(*x.shape[:-1], n)


_BUILD_FAILED: list[str] = []


def _kernel_ready() -> bool:
    """Whether the extension is built (or builds now). A patched model on a machine where it cannot build (no
    nvcc, an old GPU) warns once and keeps torch's layers instead of failing the run."""
    if _BUILD_FAILED:
        return False
    try:
        from quant.kernels.cuda import load_linear

        load_linear()
        return True
    except Exception as e:  # noqa: BLE001 - any build or import error means: use torch
        _BUILD_FAILED.append(f"{type(e).__name__}: {e}")
        warnings.warn(f"quant.kernels.fused_linear: the GEMV extension did not build ({_BUILD_FAILED[0][:300]}); "
                      "linear layers stay on torch (set OSCAR_FUSED_LINEAR=0 to silence this)", stacklevel=3)
        return False


def _linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Instance forward of a patched nn.Linear: the kernel for 1-2 token CUDA inputs, torch's otherwise."""
    if (supported(x, self.weight, tokens=FAST_TOKENS) and (self.bias is None or self.bias.dtype == x.dtype)
            and _kernel_ready()):
        return linear(x, self.weight, self.bias)
    return F.linear(x, self.weight, self.bias)


def _mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Instance forward of a patched SiLU MLP: gate and up in one launch for 1-2 token CUDA inputs."""
    gate, up = self.gate_proj, self.up_proj
    if (gate.bias is None and up.bias is None and supported(x, gate.weight, up.weight, tokens=FAST_TOKENS)
            and _kernel_ready()):
        return self.down_proj(silu_mul(x, gate.weight, up.weight))
    return type(self).forward(self, x)


def mlp_classes() -> set[str]:
    """Qualified names "transformers.models.qwen3.modeling_qwen3.Qwen3MLP" of MLP_CLASSES."""
    return {f"transformers.models.{m}.modeling_{m}.{c}" for m, names in MLP_CLASSES.items() for c in names}


def _fusable_mlp(module: torch.nn.Module, qualified: set[str]) -> bool:
    cls = type(module)
    return (f"{cls.__module__}.{cls.__name__}" in qualified and type(getattr(module, "act_fn", None)).__name__ in SILU
            and all(type(getattr(module, p, None)) is torch.nn.Linear for p in ("gate_proj", "up_proj", "down_proj")))


def fuse_linears(model: torch.nn.Module) -> dict[str, int]:
    """Route `model`'s nn.Linear layers (exact class) and allow-listed SiLU MLPs through the GEMV kernel for
    CUDA inputs of 1 to FAST_TOKENS tokens. Sets instance `forward`s (bound methods: deepcopy rebinds them); a module whose
    forward is already overridden (by this, or by accelerate's hooks) is left alone, so it is idempotent.
    Returns {"linear": n, "mlp": n} patched now."""
    qualified, counts = mlp_classes(), {"linear": 0, "mlp": 0}
    for module in model.modules():
        if "forward" in module.__dict__:
            continue
        if type(module) is torch.nn.Linear:
            module.forward = types.MethodType(_linear_forward, module)
            counts["linear"] += 1
        elif _fusable_mlp(module, qualified):
            module.forward = types.MethodType(_mlp_forward, module)
            counts["mlp"] += 1
    return counts
