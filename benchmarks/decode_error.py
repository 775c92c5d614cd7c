"""The CUDA decode's error and time at chosen points, for one or several builds of the kernel side by side:

    python3 -m benchmarks.decode_error --points 1x32768,16x8192,4x32768,1x131072,16x32768 --out err.json
    python3 -m benchmarks.decode_error --builds "default=,stages5=-DOSCAR_STAGES=5"   # NAME=FLAGS, ...

Inputs are the bench's (random bf16 q/K/V of the shape, the CUDA pack, V's rotation in the weights, a 64-token
window). Error: relative L2 against the float64 oracle over the same packed cache (quant/kernels/reference.py);
the budget is the error of a float32 torch reference rounded to the output dtype against that oracle, and the rule
is error <= 2 x budget (FlashAttention's). "single" rows force every row into one split (one CTA reads the whole
row: the longest running sums). Time: median microseconds of a CUDA-graph replay after do_bench's L2 flush (dirty)
and after a read-only flush (clean), as `oscar-eval bench` times its points. Each build is its own extension
(OSCAR_KERNEL_FLAGS, quant/kernels/cuda/loader.py), loaded into this one process, so the builds meet the same inputs,
GPU and clocks.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch

from benchmarks.sweep_splits import SHAPES, inputs
from harness.bench.timing import _graph_us
from quant.kernels import cuda
from quant.kernels.reference import attention_f32, attention_f64, relative_error


def use_build(flags: str) -> None:
    """Make the next decode load (or build) the extension of these OSCAR_KERNEL_FLAGS (`cuda.load` keys on them)."""
    os.environ["OSCAR_KERNEL_FLAGS"] = flags


def measure(q, kv, scaling: float, single: bool, timed: bool) -> tuple[torch.Tensor, dict]:
    """(the decode's output, its graph times in us when timed)."""

    def run():
        if single:
            return cuda.decode_attention(q, kv, scaling, split_tokens=kv.k.num_tokens, window_cta=False)
        return cuda.decode_attention(q, kv, scaling)

    out = run()
    return out, ({"dirty_us": _graph_us(run), "clean_us": _graph_us(run, clean=True)} if timed else {})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", choices=list(SHAPES))
    p.add_argument("--points", default="1x32768,16x8192,4x32768,1x131072,16x32768")
    p.add_argument("--single", default="2x32768", help="points whose rows also run as one split each ('' for none)")
    p.add_argument("--builds", default="default=", help="NAME=FLAGS,... (FLAGS: OSCAR_KERNEL_FLAGS of that build)")
    p.add_argument("--no-time", action="store_true", help="errors only")
    p.add_argument("--no-error", action="store_true", help="times only (no float64 oracle: large points)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    builds = [b.partition("=")[::2] for b in a.builds.split(",")]
    scaling = SHAPES[a.shape][2] ** -0.5
    print(
        f"{torch.cuda.get_device_name()}, {a.shape}: error vs float64 (budget: 2 x the float32 reference's); "
        "graph replay us dirty / clean"
    )
    rows = []
    cases = [(pt, False) for pt in a.points.split(",") if pt] + [(pt, True) for pt in a.single.split(",") if pt]
    for point, single in cases:
        b, ctx = (int(v) for v in point.lower().split("x"))
        q, kv = inputs(a.shape, b, ctx)  # packed by the default build (sweep_splits.default_build)
        ref = None if a.no_error else attention_f64(q, kv, scaling)
        budget = math.nan if a.no_error else relative_error(attention_f32(q, kv, scaling), ref)
        row = {"point": point, "single_split": single, "f32_reference_error": budget}
        for name, flags in builds:
            use_build(flags)
            out, times = measure(q, kv, scaling, single, timed=not a.no_time)
            err = math.nan if ref is None else relative_error(out, ref)
            row[name] = {"flags": flags, "error": err, "ratio": err / budget, **times}
        rows.append(row)
        cells = "  ".join(
            f"{n}:"
            + ("" if a.no_error else f" {row[n]['error']:.3%} ({row[n]['ratio']:.2f}x)")
            + (f" {row[n]['dirty_us']:.1f}/{row[n]['clean_us']:.1f}" if "dirty_us" in row[n] else "")
            for n, _ in builds
        )
        ref_cell = "" if a.no_error else f"f32 ref {budget:.3%}  "
        print(f"{point:>10}{' one split' if single else '':10}  {ref_cell}{cells}", flush=True)
        del q, kv, ref
        torch.cuda.empty_cache()
    use_build("")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "shape": a.shape, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
