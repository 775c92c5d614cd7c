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

# The paper comparison (the default, what `--quant all` runs): every method as OScaR's evaluation framework runs
# it, so only the quantizer differs. One full-precision window of R = 128 tokens, block flushed (the framework
# flushes K and V every R tokens and quantizes nothing with R = 0), and an integer zero point (the framework's
# KVQuantizer: zero = round(-min / scale)). Each preset names every setting it relies on.
PAPER = {"residual_length": 128}
PAPER_INT = {**PAPER, "zero_point": "integer"}
PAPER_COMPARISON: dict[str, tuple[str, dict]] = {
    "bf16": ("bf16", {}),
    "kivi": ("kivi", {**PAPER_INT, "group_size": 32, "value_flush": "block"}),
    "quarot": ("quarot", {**PAPER_INT, "clip_ratio": 0.95}),
    "rotatekv": ("rotatekv", {**PAPER_INT, "clip_ratio": 0.8}),
    "ott": ("ott", {**PAPER_INT, "group_size": 32, "outlier_tokens": 5}),
    "turboquant": ("turboquant", {**PAPER, "outlier_split": "channels"}),
    "oscar": ("oscar", {**PAPER_INT, "group_size": 32}),
    "oscar-rotation-only": ("oscar", {**PAPER_INT, "group_size": 32, "token_norm": False}),
    "oscar-scaling-only": ("oscar", {**PAPER_INT, "group_size": 32, "rotation": "none"}),
}

# Each method as its own paper and code run it (suffix "-own-paper": never in one table with the comparison).
# OTT has none: its code is not public, and the settings its paper is summarized with (groups of 128 tokens, a
# 32-token window) cannot hold per-channel key groups, whose window must be a multiple of the group.
OWN_PAPER: dict[str, tuple[str, dict]] = {
    "kivi-own-paper": ("kivi", {"residual_length": 128, "group_size": 32, "value_flush": "fifo",
                                "zero_point": "float"}),
    "quarot-own-paper": ("quarot", {"residual_length": 0, "zero_point": "integer", "clip_ratio": 0.95}),
    "rotatekv-own-paper": ("rotatekv", {"residual_length": 0, "zero_point": "integer", "clip_ratio": 0.8}),
    "turboquant-own-paper": ("turboquant", {"residual_length": 0, "outlier_split": "channels"}),
}

# Named options measured against the comparison (same window, one setting changed).
VARIANTS: dict[str, tuple[str, dict]] = {
    "oscar-float-zero": ("oscar", {**PAPER, "group_size": 32, "zero_point": "float"}),  # ours: the float minimum
    # the 3-bit share on rotated coordinates: a split that protects no outlier
    "turboquant-rotated-split": ("turboquant", {**PAPER, "outlier_split": "rotated"}),
}

PRESETS: dict[str, tuple[str, dict]] = {**PAPER_COMPARISON, **OWN_PAPER, **VARIANTS}
GROUPS: dict[str, list[str]] = {"all": list(PAPER_COMPARISON), "own-paper": ["bf16", *OWN_PAPER],
                                 "variants": list(VARIANTS)}


def list_methods(group: str = "all") -> list[str]:
    """The presets of a group: "all" (the paper comparison), "own-paper" or "variants"."""
    if group not in GROUPS:
        raise KeyError(f"unknown preset group {group!r}; groups: {', '.join(GROUPS)}")
    return list(GROUPS[group])


def expand_presets(text: str) -> list[str]:
    """'all', 'own-paper', 'variants' or a comma-separated list of presets and groups -> preset names."""
    names = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        names += list_methods(item) if item in GROUPS else [item]
    return list(dict.fromkeys(names))


def setting_of(name: str) -> str:
    """Which table a preset belongs to: "paper-comparison", "own-paper" or "variant" (unknown names: "custom")."""
    return ("paper-comparison" if name in PAPER_COMPARISON else "own-paper" if name in OWN_PAPER
            else "variant" if name in VARIANTS else "custom")


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
