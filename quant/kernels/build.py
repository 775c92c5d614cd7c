"""Build the CUDA extensions ahead of their first use, one nvcc process each, in parallel.

A decode build takes 50-90 s of nvcc; a first `make eval` or `make bench` on a GPU would otherwise build them one after
the other as it meets them. Each build lands in `cuda.cache_dir()` under its specialization's name, where `cuda.load`
finds it:

    python3 -m quant.kernels.build                      # the decode's NARROW, WIDE and WIDE_LONG builds, head dims
                                                        # 128 and 64, and the layer kernels (GEMV, RMSNorm, RoPE)
    python3 -m quant.kernels.build 128:3 128:1:12 --no-layers

A spec is HEAD_DIM:MIN_BLOCKS[:WARPS] (warps 4 unless given; `cuda.NARROW` is 3:4, `cuda.WIDE` 1:8, `cuda.WIDE_LONG`
1:12). Exits 1 if a build fails, after the last lines of its log.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch


def default_specs() -> list[str]:
    from quant.kernels.cuda import NARROW, WIDE, WIDE_LONG

    return [f"{d}:{b}:{w}" for b, w in (NARROW, WIDE, WIDE_LONG) for d in (128, 64)]


def parse_spec(spec: str) -> tuple[int, int, int]:
    """'128:1:12' -> (head_dim 128, min_blocks 1, warps 12); warps default to 4."""
    parts = spec.split(":")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if (
        len(values) not in (2, 3)
        or values[0] not in (64, 128)
        or values[1] < 1
        or values[-1] < 1
        or (len(values) == 3 and values[2] not in (4, 8, 12))
    ):
        raise ValueError(
            f"bad build spec {spec!r}: HEAD_DIM:MIN_BLOCKS[:WARPS] with head dim 64 or 128, min_blocks "
            ">= 1 and warps 4, 8 or 12 (e.g. 128:3 or 128:1:12)"
        )
    return values[0], values[1], values[2] if len(values) == 3 else 4


def build_one(spec: str) -> str:
    """Build one spec in this process ('layers' for the layer kernels); returns the build's name."""
    from quant.kernels import cuda

    if spec == "layers":
        return cuda.load_layers().__name__
    d, b, w = parse_spec(spec)
    return cuda.load(d, min_blocks=b, warps=w).__name__


def build_name(spec: str, arch: str) -> str:
    """The cache name of one spec's build ('layers' for the layer kernels) for the target arch `arch`."""
    from quant.kernels import cuda

    if spec == "layers":
        return cuda.layers_name(arch)
    d, b, w = parse_spec(spec)
    return cuda.specialization_name(d, arch, b, w)


def build_notice(specs: list[str], arch: str) -> str | None:
    """The line said before the builds of `specs` that are not cached (None: all are): the workers' output comes at
    their end, so the parallel builds would otherwise be a silent minute or two."""
    from quant.kernels import cuda

    todo = [s for s in specs if not cuda.is_built(build_name(s, arch))]
    if not todo:
        return None
    return (
        f"building {', '.join(todo)} for sm_{arch} with nvcc, in parallel: about a minute or two, once; later "
        f"runs reuse them from {cuda.cache_dir()}"
    )


def build_all(specs: list[str], layers: bool = True, timeout: float = 600) -> int:
    """Run one `--one SPEC` process per build at once; print each one's name and seconds. Returns how many failed."""
    jobs = [*specs, *(["layers"] if layers else [])]
    t0 = time.time()
    procs = {
        spec: subprocess.Popen(
            [sys.executable, "-m", "quant.kernels.build", "--one", spec],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for spec in jobs
    }
    failed = 0
    for spec, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=max(1.0, timeout - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"\n(timed out after {timeout:.0f} s)"
        lines = out.strip().splitlines()
        if proc.returncode == 0 and lines:
            print(f"{spec:>9}  {lines[-1]}", flush=True)
        else:
            failed += 1
            print(f"{spec:>9}  FAILED (exit {proc.returncode}); the end of its log:", flush=True)
            print("\n".join("           " + line for line in lines[-25:]), flush=True)
    print(f"{len(jobs) - failed} of {len(jobs)} builds ready in {time.time() - t0:.0f} s", flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "specs", nargs="*", help="HEAD_DIM:MIN_BLOCKS[:WARPS] (default: NARROW, WIDE and WIDE_LONG at 128 and 64)"
    )
    p.add_argument("--no-layers", action="store_true", help="skip the layer kernels (GEMV, RMSNorm, RoPE)")
    p.add_argument("--timeout", type=float, default=600, help="seconds for all builds together")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a worker: build this one spec here
    a = p.parse_args(argv)
    if a.one:
        t = time.time()
        name = build_one(a.one)
        print(f"built {name} in {time.time() - t:.0f} s")
        return 0
    specs = a.specs or default_specs()
    try:
        for spec in specs:
            parse_spec(spec)  # a bad spec fails here, before any nvcc
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(
            "error: no CUDA GPU here: the extensions are built for the GPU they run on (cuda.target_arch). Without "
            "one, `pytest tests/kernels/test_csrc.py` compiles the sources for sm_90a with nvcc.",
            file=sys.stderr,
        )
        return 1
    from quant.kernels import cuda

    try:
        notice = build_notice([*specs, *([] if a.no_layers else ["layers"])], cuda.target_arch())
    except RuntimeError:  # a GPU too old for the kernels: every worker fails and reports why
        notice = None
    if notice:
        print(notice, file=sys.stderr, flush=True)
    return 1 if build_all(specs, layers=not a.no_layers, timeout=a.timeout) else 0


if __name__ == "__main__":
    sys.exit(main())
