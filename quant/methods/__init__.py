"""Method registry: one entry per method file, and the named presets the CLI accepts.

Adding a method = one file with a frozen config (+ its cache layer) and one line in METHODS.
"""

from __future__ import annotations

import dataclasses

from quant.methods.base import MethodConfig
from quant.methods.bf16 import BF16Config
from quant.methods.kivi import KIVIConfig
from quant.methods.oscar import OScaRConfig
from quant.methods.oscar_guarded import OScaRGuardedConfig
from quant.methods.oscar_rope import OScaRPairwiseConfig, OScaRPreRoPEConfig
from quant.methods.ott import OTTConfig
from quant.methods.quarot import QuaRotConfig
from quant.methods.rotatekv import RotateKVConfig
from quant.methods.together_oscar import TogetherOSCARConfig
from quant.methods.turboquant import TurboQuantConfig

METHODS: dict[str, type[MethodConfig]] = {
    cls.method: cls
    for cls in (
        BF16Config,
        KIVIConfig,
        QuaRotConfig,
        RotateKVConfig,
        OTTConfig,
        TurboQuantConfig,
        OScaRConfig,
        OScaRPairwiseConfig,
        OScaRPreRoPEConfig,
        OScaRGuardedConfig,
        TogetherOSCARConfig,
    )
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
    "kivi-own-paper": (
        "kivi",
        {"residual_length": 128, "group_size": 32, "value_flush": "fifo", "zero_point": "float"},
    ),
    "quarot-own-paper": ("quarot", {"residual_length": 0, "zero_point": "integer", "clip_ratio": 0.95}),
    "rotatekv-own-paper": ("rotatekv", {"residual_length": 0, "zero_point": "integer", "clip_ratio": 0.8}),
    "turboquant-own-paper": ("turboquant", {"residual_length": 0, "outlier_split": "channels"}),
    # Together AI's OSCAR (arXiv 2605.17757, not OScaR) as its eval scripts run it: 64 sink + 256 recent exact tokens
    "together-oscar-own-paper": ("together-oscar", {"sink_tokens": 64, "residual_length": 256, "flush": "ring8"}),
}

# Named options measured against the comparison (same window, one setting changed), and a baseline run within its
# budget (Together AI's OSCAR, whose own budget is an own-paper preset).
VARIANTS: dict[str, tuple[str, dict]] = {
    "oscar-float-zero": ("oscar", {**PAPER, "group_size": 32, "zero_point": "float"}),  # ours: the float minimum
    # the 3-bit share on rotated coordinates: a split that protects no outlier
    "turboquant-rotated-split": ("turboquant", {**PAPER, "outlier_split": "rotated"}),
    # ours: OScaR with its key rotation fitted to RoPE (quant/methods/oscar_rope.py)
    "oscar-pairwise": ("oscar-pairwise", {**PAPER_INT, "group_size": 32}),
    "oscar-prerope": ("oscar-prerope", {**PAPER_INT, "group_size": 32}),
    # ours: per sequence, layer and KV head, the key rotation rho predicts best (quant/methods/oscar_guarded.py)
    "oscar-guarded": ("oscar-guarded", {**PAPER_INT, "group_size": 32}),
    # Together AI's OSCAR (quant/methods/together_oscar.py), its own quantizer within the comparison's FP budget
    "together-oscar": ("together-oscar", {**PAPER, "sink_tokens": 0, "flush": "block"}),
}

PRESETS: dict[str, tuple[str, dict]] = {**PAPER_COMPARISON, **OWN_PAPER, **VARIANTS}
GROUPS: dict[str, list[str]] = {
    "all": list(PAPER_COMPARISON),
    "own-paper": ["bf16", *OWN_PAPER],
    "variants": list(VARIANTS),
}


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
    return (
        "paper-comparison"
        if name in PAPER_COMPARISON
        else "own-paper"
        if name in OWN_PAPER
        else "variant"
        if name in VARIANTS
        else "custom"
    )


def get_method(name: str | MethodConfig, **overrides) -> MethodConfig:
    """A preset by name, with field overrides (e.g. get_method("oscar", group_size=64)). Text values (the command
    line's) are parsed against the field's type (`coerce`); a value of the wrong type is refused."""
    if isinstance(name, MethodConfig):
        cls, base, preset = type(name), name.name, {}
        fields = {f.name: getattr(name, f.name) for f in dataclasses.fields(cls)}
    elif name in PRESETS:
        method, preset = PRESETS[name]
        cls, base, fields = METHODS[method], name, {}
    else:
        raise KeyError(f"unknown quantization method {name!r}; known presets: {', '.join(PRESETS)}")
    known = [f.name for f in dataclasses.fields(cls) if f.name != "name"]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"{base}: unknown option(s) {unknown}; {cls.method} takes {sorted(known)}")
    typed = {key: coerce(cls, key, value, base) for key, value in overrides.items()}
    return cls(**{**fields, **preset, **typed, "name": base})


# What a bool option accepts on the command line; nothing else is a bool.
TRUE, FALSE = ("true", "1", "on"), ("false", "0", "off")


def coerce(cls: type[MethodConfig], key: str, value, where: str = ""):
    """`value` as field `key` of `cls` takes it: text is parsed by the field's declared type (bool: true/false/1/0/
    on/off; int; float), other values must already have that type. A ValueError names the field, the value
    and what is allowed."""
    kind = _field_types(cls)[key]
    prefix = f"{where or cls.method}: {key}={value!r}"
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower() if isinstance(value, (str, int)) else None
        if text in TRUE or text in FALSE:
            return text in TRUE
        raise ValueError(f"{prefix} is not a boolean; use one of {', '.join(TRUE + FALSE)}")
    if kind in ("int", "float"):
        number = int if kind == "int" else float
        if isinstance(value, bool):
            parsed = None
        elif isinstance(value, int) or (kind == "float" and isinstance(value, float)):
            return number(value)
        else:
            parsed = _parse_number(number, value)
        if parsed is None:
            what = "an integer; {} takes a whole number" if kind == "int" else "a number; {} takes a decimal number"
            raise ValueError(f"{prefix} is not {what.format(key)}")
        return parsed
    if kind == "str":
        if isinstance(value, str):
            return value.strip()
        raise ValueError(f"{prefix} is not text; {key} takes a name (the method's check lists the allowed ones)")
    return value


def _parse_number(number: type, value) -> int | float | None:
    """`value` (text) parsed as `number` (int or float); None when it is not text or does not parse."""
    if not isinstance(value, str):
        return None
    try:
        return number(value.strip())
    except ValueError:
        return None


def _field_types(cls: type[MethodConfig]) -> dict[str, str]:
    """Each field's declared type as a name: the configs declare bool, int, float or str (annotations are strings
    under `from __future__ import annotations`)."""
    out = {}
    for f in dataclasses.fields(cls):
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        out[f.name] = kind.split("|")[0].strip()
    return out


def parse_overrides(text: str | None) -> dict[str, str]:
    """'group_size=64,token_norm=false' -> {"group_size": "64", "token_norm": "false"}: the command line's text;
    get_method parses each value against its field's type."""
    out = {}
    for item in filter(None, (x.strip() for x in (text or "").split(","))):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep or not key:
            raise ValueError(f"--quant-opts item {item!r} must look like field=value (e.g. group_size=64)")
        if key in out:
            raise ValueError(f"--quant-opts sets {key} twice")
        out[key] = value
    return out


def preset_of(method: MethodConfig) -> MethodConfig | None:
    """The preset `method` was made from (its name), or None for a name that is not a preset."""
    return get_method(method.name) if method.name in PRESETS else None


def changed_fields(method: MethodConfig) -> dict:
    """The fields where `method` differs from its preset, in declaration order (all of them for a non-preset)."""
    preset = preset_of(method)
    return {
        f.name: getattr(method, f.name)
        for f in dataclasses.fields(method)
        if f.name != "name" and (preset is None or getattr(method, f.name) != getattr(preset, f.name))
    }


def label(method: MethodConfig) -> str:
    """What ran, as a name for result files and tables: the preset's name when the config equals the preset, else
    the name with each changed field, e.g. 'oscar+group_size=64' (a name that is not a preset: 'custom-<method>'
    and every field)."""
    changed = changed_fields(method)
    base = method.name if method.name in PRESETS else f"custom-{method.method}"
    return base + "".join(f"+{k}={_text(v)}" for k, v in changed.items())


def _text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
