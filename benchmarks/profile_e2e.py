"""Where the GPU time of one end-to-end decode step goes: the Qwen3-8B-shaped model of `oscar-eval bench --what
e2e`, BF16 and OScaR caches, kernels grouped by kind (weights' GEMMs, attention, pack, the small elementwise,
norm and rotary kernels), per step:

    python3 -m benchmarks.profile_e2e --context 131072 --steps 5 --out prof.json

Kernel times come from torch.profiler (CUPTI) over eager steps; the graph step time (the whole step replayed as
one CUDA graph) is measured too, so graph time - kernel time is what the launches between kernels cost.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

KINDS = (  # first match wins (lower-case substrings of the kernel name)
    ("attention", ("decode_split", "flash", "fmha", "cudnn", "sdpa", "attn", "attention")),
    ("pack", ("oscar::pack_kernel",)),
    ("norm", ("rms_norm_kernel",)),  # quant/kernels/triton_norm.py
    ("rope", ("rope_kernel",)),  # quant/kernels/triton_rope.py
    ("gemm", ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitk")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def summarize_kernels(events: list[tuple[str, float]], steps: int, top: int = 12) -> dict:
    """events: (kernel name, GPU microseconds) over `steps` steps -> per-step totals and counts by kind, and the
    `top` kernels by time."""
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, us in events:
        for table, key in ((by_kind, kind_of(name)), (by_name, name)):
            table[key][0] += us
            table[key][1] += 1
    per = max(steps, 1)
    kinds = {k: {"us": v[0] / per, "kernels": v[1] / per} for k, v in sorted(by_kind.items(), key=lambda x: -x[1][0])}
    names = sorted(by_name.items(), key=lambda x: -x[1][0])[:top]
    return {
        "steps": steps,
        "kernel_us": sum(v["us"] for v in kinds.values()),
        "kernels": sum(v["kernels"] for v in kinds.values()),
        "by_kind": kinds,
        "top": [{"name": n[:120], "us": v[0] / per, "count": v[1] / per, "kind": kind_of(n)} for n, v in names],
    }


def profile_kind(model, cfg, kind: str, batch: int, ctx: int, steps: int, backend: str) -> dict:
    import torch
    from torch.nn.attention import sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    from harness.bench.caches import make_cache, repeat_step
    from harness.bench.e2e import _sdpa_order
    from harness.bench.timing import _graph_us
    from quant.kernels import KernelOptions

    cache = make_cache(kind, cfg, batch, ctx, steps + 8, KernelOptions(backend=backend))
    tok = torch.randint(0, cfg.vocab_size, (batch, 1), device="cuda")
    step = lambda: model(tok, past_key_values=cache, use_cache=True, logits_to_keep=1)  # noqa: E731
    with torch.inference_mode(), sdpa_kernel(_sdpa_order(), set_priority=True):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
        reset = repeat_step(cache)
        graph = _graph_us(lambda: (reset(), step()))
    events = [(e.name, e.device_time) for e in prof.events() if e.device_type.name == "CUDA" and e.device_time > 0]
    row = {"kind": kind, "batch": batch, "context": ctx, "graph_step_us": graph, **summarize_kernels(events, steps)}
    cache = None  # frees the cache before the next kind
    torch.cuda.empty_cache()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=131072)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--backend", default="cuda")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from harness.bench.e2e import build_model, prepare, qwen3_8b_config

    cfg = qwen3_8b_config()
    model = build_model(cfg)
    with prepare(model):
        rows = [profile_kind(model, cfg, kind, a.batch, a.context, a.steps, a.backend) for kind in ("bf16", "oscar")]
    for r in rows:
        g = r["graph_step_us"]
        print(
            f"{r['kind']:>5} {r['batch']}x{r['context']}: graph step {g / 1e3 if isinstance(g, float) else g} ms, "
            f"kernels {r['kernel_us'] / 1e3:.2f} ms in {r['kernels']:.0f} launches"
        )
        for k, v in r["by_kind"].items():
            print(f"    {k:>10} {v['us'] / 1e3:8.3f} ms  {v['kernels']:6.0f} kernels")
        for t in r["top"]:
            print(f"    {t['us']:9.1f} us {t['count']:5.0f}x  {t['kind']:>9}  {t['name'][:90]}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
