"""What a whole benchmark costs on a GPU, extrapolated from measured items of real-size models (random weights:
the speed and memory of the real architecture, harness/models/shapes.py).

Per (model, GPU): each method's measured items/s (steady: without the run's first call, whose one-time costs are no
item's) and the largest per-item peak memory, and the hours the whole benchmark would take at that rate (OCRBench
1,000 items, MMAU-Pro 5,305). An extrapolation: the measured items are the generated set's, whose prompts lie in the
benchmark's range but not in its exact mix.
"""

from __future__ import annotations

from typing import Any

BENCHMARK_ITEMS = {"ocrbench": 1000, "mmau-pro": 5305}
GIB = 2**30


def measured_at_size(r: dict[str, Any]) -> bool:
    """A real-size model (not a tiny replica) measured on a GPU, for a task with a known full size."""
    model, system = r["model"], r["system"]
    return (
        model.get("weights") == "random"
        and not model.get("replica")
        and r["task"]["name"] in BENCHMARK_ITEMS
        and bool(system.get("items_per_s"))
        and bool(r["environment"].get("gpu"))
    )


def cost_rows(runs: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[list[str]]]:
    """{(task, model, gpu): rows [method, batch, items measured, s/item, whole benchmark, peak GPU memory]}."""
    out: dict[tuple[str, str, str], list[list[str]]] = {}
    for r in runs:
        if not measured_at_size(r):
            continue
        s, task = r["system"], r["task"]["name"]
        rate = s.get("items_per_s_steady") or s["items_per_s"]  # one-time costs are no item's
        hours = BENCHMARK_ITEMS[task] / rate / 3600
        peak = s.get("peak_item_cuda_bytes") or (s.get("peak_memory") or {}).get("cuda_bytes")
        decode = (
            "kernels"
            if (s.get("kernel_step_share") or 0) >= 0.5
            else ("graphs" if (s.get("graph_decode_share") or 0) >= 0.5 else "reference, eager")
        )
        key = (task, r["model"]["name"], r["environment"].get("gpu") or "?")
        out.setdefault(key, []).append(
            [
                r["method"]["name"],
                str(s.get("batch_size", 1)),
                str(len(r["samples"])),
                f"{1 / rate:.2f}",
                f"{hours:.2f} h",
                decode,
                f"{peak / GIB:.2f} GiB" if peak else "–",
            ]
        )
    return out


HEADER = [
    "method",
    "batch",
    "items measured",
    "s/item (steady)",
    "whole benchmark (extrapolated)",
    "decode",
    "peak GPU memory",
]
