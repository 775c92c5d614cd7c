"""How the bench times a GPU call, shared by the bench, its floors and the peers bench: medians of do_bench
(L2 flushed by a zero fill, "dirty"), medians after a read-only flush ("clean"), CUDA-graph replays, the copy
bandwidth; and the head shapes and points timed."""

from __future__ import annotations

SHAPES = {  # name: (query heads, KV heads, head_dim)
    "qwen3-8b": (32, 8, 128),
    "llava-7b": (32, 32, 128),
    "qwen3-omni-thinker": (32, 4, 128),
}
POINTS = "1x1024,1x4096,1x32768,1x131072,16x32768,64x4096"


def _median_us(fn, warmup=25, rep=100) -> float:
    import triton.testing

    return 1e3 * triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


_FLUSH = {}


def clean_l2_us(fn, reps: int = 100) -> float:
    """Median GPU time (us) of fn after an L2 flush that leaves only clean lines: a 256 MB buffer is read (summed),
    not written. do_bench's flush zero-fills its buffer, so up to the whole L2 (50 MB on an H100) is dirty when the
    timed kernel starts and its reads first force those lines back to DRAM: a tax on every kernel, a larger share of
    a shorter one (docs/PERFORMANCE.md). In a model's decode step the attention follows the weight GEMMs, which only
    read: the state a real step meets."""
    import torch

    buf = _FLUSH.get("read")
    if buf is None:
        buf = _FLUSH["read"] = torch.ones(2**26, dtype=torch.float32, device="cuda")
    for _ in range(10):  # warm-up in the same rhythm (clocks, allocator, lazy inits)
        buf.sum()
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for a, b in zip(starts, ends):
        buf.sum()
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    times = sorted(1e3 * a.elapsed_time(b) for a, b in zip(starts, ends))
    return times[len(times) // 2]


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (1 GiB buffer)."""
    import torch

    x = torch.empty(2**28, dtype=torch.float32, device="cuda").normal_()
    y = torch.empty_like(x)
    us = _median_us(lambda: y.copy_(x))
    return 2 * 2**30 / (us * 1e-6)


def capture_graph(fn, n: int = 1):
    """A CUDA graph of n calls of fn, captured after one call on a side stream (its allocations and lazy setup)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    return g


def _graph_us(fn, clean: bool = False) -> float | str:
    """Median time of a CUDA-graph replay of fn (the kernels alone, no Python between them); clean: after a
    read-only L2 flush (`clean_l2_us`), else do_bench's."""
    try:
        g = capture_graph(fn)
        return clean_l2_us(g.replay) if clean else _median_us(g.replay)
    except Exception as e:  # noqa: BLE001
        return f"error: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
