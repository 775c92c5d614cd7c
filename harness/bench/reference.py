"""Reading the bench JSONs `make bench` writes: one file (load), the reference of each GPU kind under results/bench/
(reference_paths: <gpu-kind>.json, never a bench run's file) and the numbers they record (num, ratio).

Shared by the bench gate (harness.bench.check, `oscar-eval bench-check`) and the leaderboard's speed and memory
tables (harness.report), which reads the references without depending on the gate.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any


class BenchFileError(ValueError):
    """A bench JSON that cannot be read or compared; the message says which and why."""


def load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise BenchFileError(f"{p}: no such file (bench JSONs are written by `make bench` under results/bench/)")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise BenchFileError(f"{p}: not JSON ({e}); was the bench run cut off while writing?") from e
    if not isinstance(data, dict) or not any(k in data for k in ("kernels", "e2e", "generate", "eval")):
        raise BenchFileError(f"{p}: not a `make bench` result (no kernels, e2e, generate or eval section)")
    return data


# How `oscar-eval bench` names a run it writes (harness/bench/__init__.py): bench-<UTC time>.json.
RUN_NAME = re.compile(r"bench-\d{8}T\d{6}Z")


def reference_paths(reference_dir: Path) -> list[Path]:
    """The GPU kinds' references: every <gpu-kind>.json directly under reference_dir (not its runs/ folder). A bench
    run's file there (bench-<time>.json) is refused: a run is no GPU kind."""
    paths = sorted(reference_dir.glob("*.json")) if reference_dir.is_dir() else []
    runs = [p for p in paths if RUN_NAME.fullmatch(p.stem)]
    if runs:
        raise BenchFileError(
            f"{runs[0]}: a bench run, not a GPU kind's reference; runs belong in "
            f"{reference_dir}/runs/ (git-ignored), a reference is {reference_dir}/<gpu-kind>.json"
        )
    return paths


def num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def ratio(a: Any, b: Any) -> float | None:
    a, b = num(a), num(b)
    return a / b if a is not None and b else None
