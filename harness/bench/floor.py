"""The decode kernel's floors: what any kernel pays, on this GPU and timed the same way, to stream the bytes one
decode step must read and to launch a grid of the decode's shape. They estimate the speedup a decode kernel can
reach over a BF16 baseline (`ceiling = BF16 time / read floor`) before any of its own work is counted. An estimate,
not a proof: a better streaming kernel than the floor's own may exist.

    python3 -m benchmarks.floors --points 1x131072,16x32768,64x4096 --out floor.json

The read floor streams a buffer of exactly the step's packed bytes (random data) once, 16-byte words, 8 in flight
per thread, each CTA a contiguous range, at several CTA counts (2-8 per SM of 128 threads, 2 and 4 of 256), two
ways: non-caching loads into registers, and the decode's path (cp.async into shared memory with the L2
evict-first policy); the best is the floor. The launch floor is an empty grid of the decode's planned CTA count with
its shared memory. Both are CUDA-graph replays timed after do_bench's zero-fill flush (dirty L2) and after a
read-only flush (clean), like the decode in `oscar-eval bench` (harness/bench/__init__.py).
"""

from __future__ import annotations

import torch

CTAS_PER_SM = (2, 4, 8)


def _sink(device) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.int32, device=device)


def read_floor(nbytes: int, device="cuda", ctas_per_sm=CTAS_PER_SM) -> dict:
    """Best time (us) to stream `nbytes` (rounded up to 16) once: {"read_us", "read_clean_us", "read_config",
    "read_all": [[ctas, threads, async, dirty, clean], ...]}. Each CTA count runs with plain non-caching loads into
    registers and with the decode kernel's path, cp.async into shared memory under the L2 evict-first policy."""
    from harness.bench.timing import _graph_us
    from quant.kernels import cuda
    from quant.kernels.common import num_sms

    mod = cuda.load(128)
    words = -(-nbytes // 16)
    buf = torch.randint(-(2**31), 2**31 - 1, (4 * words,), dtype=torch.int32, device=device)
    sink = _sink(device)
    sms = num_sms(torch.device(device))
    configs = [(sms * c, 128) for c in ctas_per_sm] + [(sms * 2, 256), (sms * 4, 256)]
    rows = []
    for ctas, threads in configs:
        for async_ in (False, True):

            def fn(ctas=ctas, threads=threads, async_=async_):
                mod.read_floor(buf, sink, ctas, threads, async_)

            rows.append([ctas, threads, async_, _graph_us(fn), _graph_us(fn, clean=True)])
    inf = float("inf")
    best = min(rows, key=lambda r: r[4] if isinstance(r[4], float) else inf)
    best_dirty = min(rows, key=lambda r: r[3] if isinstance(r[3], float) else inf)
    name = lambda r: f"{r[0]} CTAs x {r[1]} {'cp.async evict-first' if r[2] else 'ld.global.nc'}"  # noqa: E731
    return {
        "read_us": best_dirty[3],
        "read_clean_us": best[4],
        "read_config": name(best),
        "read_dirty_config": name(best_dirty),
        "read_all": rows,
    }


def launch_floor(ctas: int, device="cuda", build: tuple[int, int] | None = None) -> dict:
    """Time (us) of an empty grid of `ctas` CTAs with the threads and shared memory of the decode build `build`
    ((min_blocks, warps): cuda.NARROW, 128 threads, by default; cuda.WIDE 256, cuda.WIDE_LONG 384)."""
    from harness.bench.timing import _graph_us
    from quant.kernels import cuda

    min_blocks, warps = build or cuda.NARROW
    mod = cuda.load(128, min_blocks=min_blocks, warps=warps)
    sink = _sink(device)

    def fn():
        mod.empty_launch(sink, ctas, 32 * warps, mod.decode_smem_bytes)

    fn()
    return {"launch_us": _graph_us(fn), "launch_clean_us": _graph_us(fn, clean=True), "launch_ctas": ctas}


def planned_launch(q, kv) -> tuple[int, tuple[int, int]]:
    """CTAs and build (min_blocks, warps) of the decode's planned launch for these inputs (`cuda.launch_plan`)."""
    from quant.kernels import cuda

    plan = cuda.launch_plan(q, kv)
    return plan["ctas"], (plan["min_blocks"], plan["warps"])


def floor_point(nbytes: int, ctas: int, device="cuda", build: tuple[int, int] | None = None) -> dict:
    """Both floors of one decode step, keys prefixed "floor_" (as `oscar-eval bench` records them); the launch floor
    with the threads and shared memory of the decode build `build` (cuda.NARROW by default)."""
    return {f"floor_{k}": v for k, v in {**read_floor(nbytes, device), **launch_floor(ctas, device, build)}.items()}
