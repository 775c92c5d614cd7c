"""The leaderboard's speed and memory: the reference `make bench` JSON of each GPU kind under results/bench/, read
with harness.bench.reference (load_bench; the bench gate's targets are `oscar-eval bench-check`'s, never shown here),
as tables: the end-to-end decode of the Qwen3-8B shape, BF16 against OScaR (e2e_table), and the decode attention
kernels' times (kernel_table).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.bench import reference as bench_reference
from harness.report.tables import GiB, Table, fmt


def load_bench(bench_dir: Path) -> dict[str, dict[str, Any]]:
    """{GPU kind: its reference bench JSON (harness.bench's format), with the file's path in '_path'} for every
    <kind>.json directly under bench_dir (harness.bench.reference.reference_paths: never a bench run). A file that is
    not a bench result, a bench run's file, or a second reference of one GPU stops the build with the names."""
    out: dict[str, dict[str, Any]] = {}
    by_device: dict[str, Path] = {}
    for path in bench_reference.reference_paths(bench_dir):
        data = bench_reference.load(path)
        device = (data.get("environment") or {}).get("device")
        if device and device in by_device:
            raise bench_reference.BenchFileError(
                f"{by_device[device]} and {path}: two bench references of one GPU ({device}); keep one "
                f"<gpu-kind>.json per GPU kind (bench runs belong in {bench_dir}/runs/)"
            )
        by_device.setdefault(device, path)
        data["_path"] = str(path)
        out[path.stem] = data
    return out


@dataclass
class Speed:
    """One GPU kind's bench reference as tables, and the data its plots draw."""

    gpu: str
    data: dict[str, Any]
    e2e: Table | None
    kernels: Table | None


def e2e_table(gpu: str, data: dict[str, Any]) -> Table | None:
    """The end-to-end decode of the bench's Qwen3-8B-shaped model (random weights: speed and memory do not depend on
    their values), BF16 against OScaR per batch and context: graph step, tokens/s, KV cache and peak GPU memory."""
    e2e = [r for r in data.get("e2e") or [] if "error" not in r]
    pairs = {}
    for r in e2e:
        pairs.setdefault((bool(r.get("largest")), r.get("context")), {})[r["kind"]] = r
    rows = []
    for (largest, ctx), by in sorted(pairs.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        bf, oq = by.get("bf16"), by.get("oscar")
        if not (bf and oq):
            continue
        tps = [r.get("graph_tokens_per_s", r.get("tokens_per_s")) for r in (bf, oq)]
        rows.append(
            [
                f"{ctx // 1024}K" + (" (largest batch that fits)" if largest else ""),
                f"{bf['batch']} / {oq['batch']}",
                fmt(bf.get("graph_step_ms"), 3),
                fmt(oq.get("graph_step_ms"), 3),
                fmt(tps[0], 3),
                fmt(tps[1], 3),
                ratio_text(bench_reference.ratio(tps[1], tps[0])),
                gib(bf.get("kv_bytes")),
                gib(oq.get("kv_bytes")),
                gib(bf.get("peak_bytes")),
                gib(oq.get("peak_bytes")),
            ]
        )
    if not rows:
        return None
    header = [
        "context",
        "batch BF16 / OScaR",
        "step ms BF16",
        "step ms OScaR",
        "tok/s BF16",
        "tok/s OScaR",
        "tok/s ratio",
        "KV GiB BF16",
        "KV GiB OScaR",
        "peak GiB BF16",
        "peak GiB OScaR",
    ]
    device = (data.get("environment") or {}).get("device", gpu)
    return Table(
        f"Decode end to end, Qwen3-8B shape, {device}",
        header,
        rows,
        note=f"{data['_path']}: CUDA graph replays of one decode step over a filled cache; peak: the GPU's.",
    )


def ratio_text(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


def gib(n: Any) -> str:
    x = bench_reference.num(n)
    return fmt(x / GiB if x is not None else None, 3)


KERNEL_COLUMNS = {
    "oscar_cuda_graph_us": "OScaR CUDA",
    "oscar_cuda_graph_clean_us": "OScaR CUDA, clean L2",
    "oscar_triton_graph_us": "OScaR Triton",
    "best_bf16_graph_us": "best BF16",
    "best_bf16_graph_clean_us": "best BF16, clean L2",
    "speedup_cuda_graph": "speedup",
    "floor_read_us": "read floor",
    "floor_read_clean_us": "read floor, clean L2",
}
SHAPE_ORDER = ("qwen3-8b", "llava-7b", "qwen3-omni-thinker")


def kernel_table(gpu: str, data: dict[str, Any]) -> Table | None:
    """Decode attention per point (shape, batch, context): CUDA graph replay times in us, a column per
    KERNEL_COLUMNS."""
    points = [k for k in data.get("kernels") or [] if "error" not in k]
    points.sort(key=lambda k: (shape_rank(k.get("shape")), k.get("batch", 0), k.get("context", 0)))
    rows = [
        [str(k.get("shape")), str(k.get("batch")), str(k.get("context"))]
        + [fmt(bench_reference.num(k.get(key)), 3) for key in KERNEL_COLUMNS]
        for k in points
    ]
    if not rows:
        return None
    return Table(
        f"Decode attention, us, {(data.get('environment') or {}).get('device', gpu)}",
        ["shape", "batch", "context", *KERNEL_COLUMNS.values()],
        rows,
        note="CUDA graph replays after do_bench's L2 flush, or after a read-only flush (clean L2: what a "
        "model's decode step sees); speedup: best BF16 / OScaR CUDA; read floor: a bare stream of the "
        "same packed bytes, what no decode goes below.",
    )


def shape_rank(shape: str | None) -> tuple[int, str]:
    return (SHAPE_ORDER.index(shape), "") if shape in SHAPE_ORDER else (len(SHAPE_ORDER), str(shape))
