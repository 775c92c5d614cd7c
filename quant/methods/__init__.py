"""Method registry: one entry per method file, and the named presets the CLI accepts.

Adding a method = one file with a frozen config (+ its cache layer) and one line in METHODS.
"""
from __future__ import annotations

import dataclasses

from quant.methods.base import MethodConfig
from quant.methods.bf16 import BF16Config
from quant.methods.kivi import KIVIConfig
from quant.methods.oscar import OScaRConfig
from quant.methods.ott import OTTConfig
from quant.methods.quarot import QuaRotConfig
from quant.methods.rotatekv import RotateKVConfig
from quant.methods.turboquant import TurboQuantConfig

METHODS: dict[str, type[MethodConfig]] = {
    cls.method: cls
    for cls in (BF16Config, KIVIConfig, QuaRotConfig, RotateKVConfig, OTTConfig, TurboQuantConfig, OScaRConfig)
}

# preset name -> (method, paper-default overrides)
PRESETS: dict[str, tuple[str, dict]] = {
    "bf16": ("bf16", {}),
    "kivi": ("kivi", {}),
    "quarot": ("quarot", {}),
    "rotatekv": ("rotatekv", {}),
    "ott": ("ott", {}),
    "turboquant": ("turboquant", {}),
    "oscar": ("oscar", {}),
    "oscar-rotation-only": ("oscar", {"token_norm": False}),
    "oscar-scaling-only": ("oscar", {"rotation": "none"}),
}


def list_methods() -> list[str]:
    return list(PRESETS)


def get_method(name: str | MethodConfig, **overrides) -> MethodConfig:
    """A preset by name, with field overrides (e.g. get_method("oscar", group_size=64))."""
    if isinstance(name, MethodConfig):
        return dataclasses.replace(name, **overrides) if overrides else name
    if name not in PRESETS:
        raise KeyError(f"unknown quantization method {name!r}; known presets: {', '.join(PRESETS)}")
    method, preset = PRESETS[name]
    cls = METHODS[method]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"{name}: unknown option(s) {sorted(unknown)}; {method} takes {sorted(known - {'name'})}")
    return cls(name=name, **{**preset, **overrides})


def parse_overrides(text: str | None) -> dict:
    """'group_size=64,token_norm=false' -> {"group_size": 64, "token_norm": False} (CLI helper)."""
    out = {}
    for item in filter(None, (text or "").split(",")):
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value")
        key, value = (s.strip() for s in item.split("=", 1))
        lowered = value.lower()
        if lowered in ("true", "false"):
            out[key] = lowered == "true"
        else:
            try:
                out[key] = int(value)
            except ValueError:
                try:
                    out[key] = float(value)
                except ValueError:
                    out[key] = value
    return out
