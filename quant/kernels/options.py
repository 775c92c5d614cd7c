"""The kernel choices of a run, as one typed object passed down and recorded in results.

`KernelOptions` is what a caller decides about the fast path; the library never reads the environment for it.
`oscar-eval` builds one from `--kernels k=v,...` over the environment's overrides (`from_env`, read once at the
command line), hands it to the model loader (the layer kernels it patches in) and to every cache (the decode
backend, its CUDA graphs and its builds), and writes `to_dict()` into the result's `environment.kernels`.

    KernelOptions()                                  # the defaults: the fastest path the device has
    KernelOptions.parse("backend=triton,cuda_graphs=off")
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import torch

BACKENDS = ("cuda", "triton", "torch")
LAYER_KERNELS = ("cuda", "triton")

# Environment overrides (read by `from_env` only, at the command line): variable -> field.
ENV = {
    "OSCAR_KERNEL_BACKEND": "backend",
    "OSCAR_CUDA_GRAPHS": "cuda_graphs",
    "OSCAR_FUSED_NORM": "fused_norm",
    "OSCAR_FUSED_ROPE": "fused_rope",
    "OSCAR_FUSED_LINEAR": "fused_linear",
    "OSCAR_LAYER_KERNELS": "layer_kernels",
    "OSCAR_WIDE_DECODE": "wide_decode",
    "OSCAR_BATCH_INVARIANT": "batch_invariant",
}
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


@dataclass(frozen=True)
class KernelOptions:
    """backend: the attention/pack kernels of methods that have them (None: the device's best, see
    `quant.kernels.default_backend`); cuda_graphs: decode steps replay CUDA graphs inside `generate`; fused_norm,
    fused_rope, fused_linear: a GPU model's RMSNorms, RoPE and decode-sized linear layers run on the project's
    kernels; layer_kernels: those norms and RoPE launch the CUDA ("cuda") or the Triton ("triton") kernels (the
    same formula; the C++ launch costs microseconds less); wide_decode: few-row decode steps may take the 8-warp
    CUDA build (`quant.kernels.cuda.wide_plan`); batch_invariant: each sequence's tokens and logits are those of
    the same prompt alone, at any batch size (quant/invariant.py: prompts prefilled one by one, decode-step GEMMs in
    fixed row blocks, attention and the decode kernels' split plans per row); None ("auto"): where it costs little,
    `quant.invariant.on_by_default`, decided by the runner and recorded as decided."""

    backend: str | None = None
    cuda_graphs: bool = True
    fused_norm: bool = True
    fused_rope: bool = True
    fused_linear: bool = True
    layer_kernels: str = "cuda"
    wide_decode: bool = True
    batch_invariant: bool | None = None

    def __post_init__(self):
        if self.backend is not None and self.backend not in BACKENDS:
            raise ValueError(f"kernel option backend={self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.layer_kernels not in LAYER_KERNELS:
            raise ValueError(
                f"kernel option layer_kernels={self.layer_kernels!r}: choose one of {', '.join(LAYER_KERNELS)}"
            )
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type.startswith("bool") and not (isinstance(value, bool) or (value is None and "None" in f.type)):
                raise ValueError(f"kernel option {f.name} must be true or false, got {value!r}")

    def replace(self, **changes) -> "KernelOptions":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def backend_for(self, device) -> str:
        """The backend that runs on `device`: the chosen one, else the device's default."""
        return self.backend or default_backend(device)

    @classmethod
    def parse(cls, text: str | None, base: "KernelOptions | None" = None) -> "KernelOptions":
        """'backend=triton,cuda_graphs=off' over `base` (default: the defaults); unknown names are refused."""
        base = base or cls()
        if not text:
            return base
        changes = {}
        for part in text.replace(";", ",").split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ValueError(f"kernel option {part.strip()!r} is not name=value; names: {', '.join(_names())}")
            name, value = (s.strip() for s in part.split("=", 1))
            changes[name] = value
        return base.replace(**_typed(changes, "--kernels"))

    @classmethod
    def from_env(cls, environ: Mapping[str, str], base: "KernelOptions | None" = None) -> "KernelOptions":
        """`base` with the OSCAR_* overrides set in `environ` (ENV names them)."""
        changes = {field: environ[var] for var, field in ENV.items() if environ.get(var)}
        return (base or cls()).replace(**_typed(changes, "environment"))


def _names() -> list[str]:
    return [f.name for f in dataclasses.fields(KernelOptions)]


def _typed(changes: dict[str, str], where: str) -> dict[str, Any]:
    types = {f.name: f.type for f in dataclasses.fields(KernelOptions)}
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name not in types:
            raise ValueError(f"unknown kernel option {name!r} ({where}); names: {', '.join(_names())}")
        if types[name].startswith("bool"):
            low = value.lower()
            auto = "None" in types[name] and low == "auto"
            if low not in _TRUE + _FALSE and not auto:
                choices = "on/off (1/0, true/false)" + (" or auto" if "None" in types[name] else "")
                raise ValueError(f"kernel option {name}={value!r} ({where}): use {choices}")
            out[name] = None if auto else low in _TRUE
        else:
            out[name] = None if value.lower() in ("", "auto", "none") and name == "backend" else value
    return out


def default_backend(device: torch.device | str) -> str:
    """The fastest backend `device` has: "cuda" on a CUDA GPU with nvcc, "triton" on one without, else "torch"."""
    if torch.device(device).type != "cuda":
        return "torch"
    if _has_nvcc():
        return "cuda"
    _warn_triton_fallback()
    return "triton"


@functools.lru_cache(maxsize=None)
def _warn_triton_fallback() -> None:  # once per process
    warnings.warn(
        "CUDA GPU without nvcc: OScaR decodes with the Triton kernels, 1.2-1.8x slower than the CUDA ones "
        "(docs/PERFORMANCE.md). Put the CUDA toolkit's nvcc on PATH (or set CUDA_HOME) for the CUDA kernels, "
        "or choose Triton (--kernels backend=triton, or OSCAR_KERNEL_BACKEND=triton for oscar-eval) to "
        "silence this.",
        stacklevel=3,
    )


@functools.lru_cache(maxsize=None)
def _has_nvcc() -> bool:  # once per process: a PATH search on every decode step's layer would cost host time
    return shutil.which("nvcc") is not None or bool(os.environ.get("CUDA_HOME"))
