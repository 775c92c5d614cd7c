"""`oscar-eval bench --what e2e` and `--what generate`: a Qwen3-8B-shaped Qwen3ForCausalLM with random bf16
weights, caches filled directly at the target length, one decode step through model.forward: BF16 (preallocated
cache, SDPA) against OScaR (packed cache, the kernels through AttentionInterface); and make eval's generate path at
chosen prompt lengths."""

from __future__ import annotations

import time

from harness.bench.caches import kv_bytes, make_cache, repeat_step
from harness.bench.kernels import bench_kernels
from harness.bench.timing import _graph_us


def qwen3_8b_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-6,
        max_position_embeddings=262144,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
    )


def build_model(cfg):
    """Random-weight bf16 Qwen3 model on the GPU, attention through quant.kernels.hf_decode.packed_attention. Layer
    kernels and a method's folding come with `prepare` (quant.prepare_model), undone after each use."""
    import torch
    from transformers import Qwen3ForCausalLM

    from quant.kernels.hf_decode import register

    name = register()
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = Qwen3ForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    model.config._attn_implementation = name
    return model


def prepare(model, method: str = "bf16", kernels=None):
    """quant.prepare_model of the bench's Qwen3 model for `method` with the layer kernels `kernels`
    (quant.kernels.KernelOptions) asks for (RMSNorms, RoPE and decode-sized linear layers); "bf16" folds nothing, so
    caches made from the config alone (the BF16 and OScaR points of `e2e_point`) share it. Undo it when done."""
    import quant
    from harness.models import traits_of

    return quant.prepare_model(model, quant.get_method(method), kernels, traits_of("qwen3-8b"))


def _sdpa_order():
    from torch.nn.attention import SDPBackend

    # BF16 layers go through SDPA: prefer cuDNN, then flash (the fastest BF16 decodes, KERNELS.md).
    return [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def decode_step_ms(model, cache, batch: int, steps: int) -> tuple[float, float | str]:
    """(eager, graph) time of one decode step in ms. Eager: median wall time of model.forward of one token
    per sequence (synchronized; includes Python). Graph: the same step captured once in a CUDA graph and
    replayed (the GPU time; each replay rewrites the same cache slot, which speed does not depend on)."""
    import torch
    from torch.nn.attention import sdpa_kernel

    tok = torch.randint(0, model.config.vocab_size, (batch, 1), device="cuda")
    step = lambda: model(tok, past_key_values=cache, use_cache=True, logits_to_keep=1)  # noqa: E731
    times = []
    with torch.inference_mode(), sdpa_kernel(_sdpa_order(), set_priority=True):
        for i in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            if i >= 3:  # warm-up steps: allocator, kernel builds, cuDNN plans
                times.append(time.perf_counter() - t0)
        reset = repeat_step(cache)  # every replay writes the slot the captured step wrote

        def replayable():
            reset()
            return step()

        graph = _graph_us(replayable)
    return 1e3 * sorted(times)[len(times) // 2], graph / 1e3 if isinstance(graph, float) else graph


def e2e_point(model, cfg, kind, batch, ctx, steps, kernels) -> dict:
    import torch

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    cache = make_cache(kind, cfg, batch, ctx, steps, kernels)
    kv = kv_bytes(cache)
    ms, graph_ms = decode_step_ms(model, cache, batch, steps)
    row = {
        "kind": kind,
        "batch": batch,
        "context": ctx,
        "step_ms": ms,
        "tokens_per_s": batch / ms * 1e3,
        "graph_step_ms": graph_ms,
        "kv_bytes": kv,
        "peak_bytes": torch.cuda.max_memory_allocated(),
    }
    if isinstance(graph_ms, float):
        row["graph_tokens_per_s"] = batch / graph_ms * 1e3
    del cache
    torch.cuda.empty_cache()
    return row


def batch_that_fits(per_seq: int, other: int, total: int, slack: int = 2 * 2**30) -> int:
    """Sequences whose caches fit in `total` device bytes beside `other` (weights, activations, workspace: what a
    batch-1 step at the same context peaks at besides its cache), keeping `slack` for the CUDA context, cuBLAS
    workspaces and allocator rounding."""
    return max(1, int((total - other - slack) // per_seq))


def largest_batch(model, cfg, kind, ctx, steps, kernels, probe: dict | None = None) -> dict:
    """Tokens/s at the largest batch whose cache fits: sized from a batch-1 step at the same context (its cache bytes
    per sequence, and its peak memory besides the cache), then stepped down one sequence at a time on OOM.

    The probe must be at the real context: a cache's fixed parts (OScaR's 128-token bf16 window, the capacity
    rounding) weigh far more in a short sequence than in a long one, so a shorter probe undercounts what fits."""
    import torch

    if probe is None or probe.get("context") != ctx or probe.get("batch") != 1:
        probe = e2e_point(model, cfg, kind, 1, ctx, 5, kernels)
    per_seq = probe["kv_bytes"]
    batch = batch_that_fits(per_seq, probe["peak_bytes"] - per_seq, torch.cuda.mem_get_info()[1])
    while batch >= 1:
        try:
            return e2e_point(model, cfg, kind, batch, ctx, steps, kernels)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            batch -= 1
    return {"kind": kind, "context": ctx, "error": "batch 1 does not fit"}


def run_e2e(args) -> list[dict]:
    cfg = qwen3_8b_config()
    kernels = bench_kernels(args)
    model = build_model(cfg)
    with prepare(model, "bf16", kernels):
        return _e2e_rows(args, model, cfg, kernels)


def _e2e_rows(args, model, cfg, kernels) -> list[dict]:
    import torch

    rows = []
    points = [(1, int(c)) for c in args.e2e_contexts.split(",")]
    points += [(int(b), int(c)) for b, c in (p.lower().split("x") for p in args.e2e_points.split(",") if p)]
    for batch, ctx in points:
        for kind in ("bf16", "oscar"):
            try:
                rows.append(e2e_point(model, cfg, kind, batch, ctx, args.e2e_steps, kernels))
            except Exception as e:  # noqa: BLE001  (one failing point must not lose the others)
                torch.cuda.empty_cache()
                error = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                rows.append({"kind": kind, "batch": batch, "context": ctx, "error": error})
            print(_e2e_line(rows[-1]), flush=True)
    ctx = max(int(c) for c in args.e2e_contexts.split(","))
    for kind in ("bf16", "oscar"):
        probe = next(
            (r for r in rows if r["kind"] == kind and r["context"] == ctx and r.get("batch") == 1 and "error" not in r),
            None,
        )
        rows.append(
            {**largest_batch(model, cfg, kind, ctx, max(8, args.e2e_steps // 2), kernels, probe), "largest": True}
        )
        print(_e2e_line(rows[-1]), flush=True)
    return rows


def generate_point(model, kind: str, ctx: int, new: int, kernels=None) -> dict:
    """One greedy `generate` of `new` tokens after a random `ctx`-token prompt, the way `make eval` runs it:
    the model prepared for "bf16" or "oscar" (quant.prepare_model: BF16's fixed buffers, OScaR's kernel path and its
    values' rotation folded in), decode steps replayed as CUDA graphs (quant.engine), or eager for the "-eager" kinds.
    The same machinery for both methods: the comparison is like for like. Wall times; decode ms/token =
    (generate of `new` tokens - generate of 1 token) / (new - 1), the best of two of each."""
    import contextlib

    import torch

    from quant.engine import GraphDecoder

    method, eager = kind.removesuffix("-eager"), kind.endswith("-eager")
    prompt = torch.randint(0, model.config.vocab_size, (1, ctx), generator=torch.Generator().manual_seed(ctx))
    prompt = prompt.to("cuda")
    counts = {}

    def run(n: int) -> float:
        cache = prepared.make_cache()
        dec = contextlib.nullcontext() if eager else GraphDecoder(model, cache)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode(), dec:
            model.generate(prompt, past_key_values=cache, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        torch.cuda.synchronize()
        if not eager:
            counts.update(dec.counts)
        return time.perf_counter() - t0

    with prepare(model, method, kernels) as prepared:
        run(3)  # warm-up: kernel builds, cuDNN plans, the allocator
        first = min(run(1) for _ in range(2))
        total = min(run(new) for _ in range(2))
    ms = 1e3 * (total - first) / (new - 1)
    return {
        "kind": kind,
        "context": ctx,
        "new_tokens": new,
        "prefill_s": first,
        "generate_s": total,
        "decode_ms_per_token": ms,
        "tokens_per_s": 1e3 / ms,
        "graph_counts": counts or None,
    }


def run_generate(args) -> list[dict]:
    import torch

    kernels = bench_kernels(args)
    model = build_model(qwen3_8b_config())
    rows = []
    for ctx in (int(c) for c in args.generate_contexts.split(",") if c):
        for kind in ("bf16-eager", "bf16", "oscar-eager", "oscar"):
            try:
                rows.append(generate_point(model, kind, ctx, args.generate_tokens, kernels))
            except torch.cuda.OutOfMemoryError as err:
                rows.append({"kind": kind, "context": ctx, "error": f"out of memory: {str(err).splitlines()[0]}"})
            torch.cuda.empty_cache()
            r = rows[-1]
            print(
                f"generate {kind:>11} 1x{ctx:<6} "
                + (
                    r["error"]
                    if "error" in r
                    else f"prefill {r['prefill_s']:6.2f} s  decode {r['decode_ms_per_token']:7.2f} ms/token "
                    f"({r['tokens_per_s']:6.1f} tok/s)  graphs {r['graph_counts']}"
                ),
                flush=True,
            )
    return rows


def _e2e_line(r: dict) -> str:
    if "error" in r:
        return f"e2e {r['kind']:>5} ctx {r['context']}: {r['error']}"
    g = r.get("graph_step_ms")
    g = f"{g:8.2f}" if isinstance(g, float) else str(g)[:60]
    return (
        f"e2e {r['kind']:>5} {r['batch']:>3}x{r['context']:<6} step {r['step_ms']:8.2f} ms (graph {g}) "
        f"{r['tokens_per_s']:9.1f} tok/s  KV {r['kv_bytes'] / 2**30:7.2f} GiB  "
        f"peak {r['peak_bytes'] / 2**30:6.2f} GiB"
    )
