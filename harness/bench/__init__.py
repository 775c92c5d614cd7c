"""`oscar-eval bench`: kernel and end-to-end decode benchmarks (GPU), JSON under results/bench/ + a table.

Kernels: OScaR INT2 decode attention (CUDA and Triton) against the best BF16 decode on the same GPU
(SDPA flash and cuDNN with enable_gqa, optionally compiled FlexAttention), one query token, for the KV
shapes of the target models. Time = median of triton.testing.do_bench (which flushes L2 between runs by
zero-filling a buffer, leaving it dirty), and for the graph step and the SDPA baselines also after a read-only flush
("clean", the L2 state a model's attention meets after the weight GEMMs; `clean_l2_us`).
Effective bandwidth = bytes the step must read (packed codes, scales, norms, window) / time; copy
bandwidth is measured in the same run. With the CUDA backend each point also records the floors of
harness/bench/floor.py (a bare stream of the same bytes, an empty launch of the same grid) and the ceiling they allow
against the best BF16. Pack: a 128-token flush block (per decode step = 1/128 of it)
and a whole prefill (bytes read + written / time).
End to end: a Qwen3-8B-shaped Qwen3ForCausalLM with random bf16 weights, caches filled directly at the
target length, one decode step through model.forward: BF16 (preallocated cache, SDPA) vs OScaR
(packed cache, the kernels through AttentionInterface).
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

from harness.bench import harnesses
from harness.bench.caches import kv_bytes, make_cache, repeat_step
from harness.bench.timing import POINTS, SHAPES, _graph_us, _median_us, capture_graph, clean_l2_us, copy_bandwidth  # noqa: F401

E2E_CONTEXTS = "4096,32768,131072"
GENERATE_CONTEXTS = "4096,32768"


def add_arguments(p) -> None:
    p.add_argument(
        "--what",
        choices=["kernels", "e2e", "generate", "all", "peers", "eval"],
        default="all",
        help="peers: this project's decode against the peers' own (harness/bench/peers.py); eval: the harness "
        "against lmms-eval's own model classes (harness/bench/harnesses.py); neither is in all",
    )
    harnesses.add_arguments(p)
    p.add_argument(
        "--peer",
        action="append",
        default=None,
        metavar="NAME[=PATH]",
        help="with --what peers: a peer's checkout or install (oscar=PATH, kivi=PATH, lmdeploy, vllm); "
        "repeatable. Its default points are the issue's five Qwen3-8B ones",
    )
    p.add_argument(
        "--peers-doc",
        default="docs/PERFORMANCE.md",
        help="with --what peers: the document whose Peers section is rewritten ('' for none)",
    )
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {list(SHAPES)}")
    p.add_argument("--points", default=POINTS, help="comma list of BATCHxCONTEXT")
    p.add_argument(
        "--backends",
        default="cuda,triton",
        help="OScaR variants to time: cuda, triton, or backend:opt=value,... (e.g. cuda:min_blocks=2)",
    )
    p.add_argument("--flex", action="store_true", help="also time compiled FlexAttention (slow to compile)")
    p.add_argument("--e2e-contexts", default=E2E_CONTEXTS)
    p.add_argument("--e2e-steps", type=int, default=20)
    p.add_argument(
        "--e2e-points",
        default="16x8192",
        help="comma list of BATCHxCONTEXT timed end to end besides batch 1 at --e2e-contexts",
    )
    p.add_argument(
        "--generate-contexts",
        default=GENERATE_CONTEXTS,
        help="prompt lengths for the generate benchmark (make eval's path)",
    )
    p.add_argument("--generate-tokens", type=int, default=256, help="new tokens per generate call")
    p.add_argument(
        "--out",
        default=None,
        help="JSON path (default results/bench/runs/bench-<time>.json, git-ignored; "
        "the reference of a GPU kind is results/bench/<gpu-kind>.json)",
    )
    p.add_argument(
        "--against",
        default=None,
        help="an older bench JSON of the same GPU: after the run, report the "
        "changes and exit 1 on a slowdown beyond --max-slowdown (oscar-eval bench-check)",
    )
    p.add_argument("--max-slowdown", default="5%", help="with --against: tolerated slowdown per point")
    p.add_argument(
        "--kernels",
        default=None,
        help="kernel options, as for oscar-eval eval (quant.kernels.KernelOptions; "
        "the environment's OSCAR_* overrides apply first)",
    )


def bf16_baselines(q, k, v, flex: bool) -> dict:
    """Times (us) of the BF16 decodes; a backend that cannot run records its error instead. Each SDPA backend is
    timed as called (eager: at short contexts that is the host's dispatch as much as the GPU's work) and, like the
    OScaR kernels, as a CUDA-graph replay after both flushes (`_graph`, `_graph_clean`): the ratios compare graph
    with graph (summarize)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    res = {}
    for name, backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):

        def run(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        try:
            run()
            res[name] = _median_us(run)
            res[f"{name}_clean"] = clean_l2_us(run)
        except RuntimeError as e:
            res[name] = f"error: {str(e).splitlines()[0][:160]}"
            continue
        res[f"{name}_graph"] = _graph_us(run)
        res[f"{name}_graph_clean"] = _graph_us(run, clean=True)
    if flex:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        # One compile per shape: past dynamo's default recompile limit (8) flex_attention silently falls
        # back to an unfused implementation, whose times are not FlexAttention's.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
        compiled = torch.compile(flex_attention, dynamic=False)
        try:
            compiled(q, k, v, enable_gqa=True)
            res["flex"] = _median_us(lambda: compiled(q, k, v, enable_gqa=True))
        except Exception as e:  # noqa: BLE001  (compile failures come in many types; record, go on)
            res["flex"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return res


def kernel_point(
    shape: str, batch: int, ctx: int, backends: list[str], flex: bool, res_tokens: int = 64, wide: bool = True
) -> dict:
    """One (shape, batch, context) point: BF16 baselines, OScaR pack and decode per backend (`wide`: the CUDA decode
    may take its 8-warp build, KernelOptions.wide_decode)."""
    import torch

    from quant.kernels import pack_kv
    from quant.kernels.common import bytes_read
    from quant.kernels.reference import relative_error
    from quant.packed import PackedKV
    from quant.primitives import hadamard

    hq, hkv, d = SHAPES[shape]
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(batch * 7 + ctx)
    bf = torch.bfloat16
    q = torch.randn(batch, hq, 1, d, device=dev, generator=g).to(bf)
    k = torch.randn(batch, hkv, ctx, d, device=dev, generator=g).to(bf)
    v = torch.randn(batch, hkv, ctx, d, device=dev, generator=g).to(bf)
    row = {"shape": shape, "batch": batch, "context": ctx, "bf16_bytes": 2 * k.nbytes}
    row.update(bf16_baselines(q, k, v, flex))
    tq = ctx - res_tokens  # packed tokens; the window holds the rest (a multiple of 128 below)
    tq -= tq % 128
    # OScaR's default: V's rotation folded into v_proj/o_proj (quant/fold.py), so the pack rotates the keys only and
    # the decode leaves its output in the values' basis. "_online" rows: V rotated in the cache as well.
    kq, vq, norms = pack_kv(k[:, :, :tq], v[:, :, :tq], backend="cuda", rotate_values=False)
    kv = PackedKV(
        kq,
        vq,
        norms,
        k[:, :, tq:].contiguous(),
        v[:, :, tq:].contiguous(),
        hadamard(d, device=dev),
        values_rotated=False,
    )
    row["oscar_bytes"] = bytes_read(kv)
    for suffix, rv in (("", False), ("_online", True)):
        row[f"pack_prefill{suffix}_us"] = _median_us(
            lambda rv=rv: pack_kv(k[:, :, :tq], v[:, :, :tq], backend="cuda", rotate_values=rv), 5, 20
        )
    row["pack_prefill_bytes"] = 2 * k[:, :, :tq].nbytes + bytes_read(
        PackedKV(kq, vq, norms, k[:, :, :0], v[:, :, :0], None)
    )
    blk_k, blk_v = k[:, :, :128].contiguous(), v[:, :, :128].contiguous()
    row["pack_block128_us"] = _median_us(lambda: pack_kv(blk_k, blk_v, backend="cuda", rotate_values=False))
    if "cuda" in backends:  # what any kernel pays to stream these bytes and launch this grid (floor.py)
        from harness.bench.floor import floor_point
        from quant.kernels.cuda import launch_plan

        plan = row["cuda_plan"] = launch_plan(q, kv, wide=wide)
        try:
            row.update(floor_point(row["oscar_bytes"], plan["ctas"], build=(plan["min_blocks"], plan["warps"])))
        except Exception as e:  # noqa: BLE001  (a floor that cannot run leaves the point without a ceiling)
            row["floor_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    # Each backend reads the codes in its own order, as the packed cache keeps them for it (the CUDA "frag" order,
    # Triton's "tl"; tq is whole 128-token blocks): converted once here, not inside the timed call.
    tl = dataclasses.replace(kv, k=kv.k.to_order("tl"), v=kv.v.to_order("tl"))
    outs = {}
    for be in backends:
        fn = _decode_fn(be, q, kv if be.partition(":")[0] == "cuda" else tl, d**-0.5, wide)
        try:
            outs[be] = fn()
        except Exception as e:  # noqa: BLE001  (one backend failing must not hide the others' numbers)
            row[f"oscar_{be}_us"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            continue
        row[f"oscar_{be}_us"] = _median_us(fn)
        row[f"oscar_{be}_graph_us"] = _graph_us(fn)  # GPU time without the Python launch overhead
        row[f"oscar_{be}_graph_clean_us"] = _graph_us(fn, clean=True)
    if len(outs) > 1:  # agreement of the first two variants (e.g. CUDA vs Triton), relative L2
        (na, a), (nb, b) = list(outs.items())[:2]
        row[f"rel_diff_{na}_vs_{nb}"] = relative_error(a.float(), b.float())
    return row


def _decode_fn(variant: str, q, kv, scaling, wide: bool = True):
    """variant: 'cuda' | 'triton' | 'cuda:min_blocks=2,waves=1' (options of the backend's launcher)."""
    from quant.kernels import decode_attention

    backend, _, opts = variant.partition(":")
    options = {k: (float(v) if "." in v else int(v)) for k, v in (o.split("=") for o in opts.split(",") if o)}
    options.setdefault("wide", wide)
    return lambda: decode_attention(q, kv, scaling, backend=backend, **options)


def _best(row: dict, keys: tuple[str, ...]) -> tuple[float, str | None]:
    found = {k: row[k] for k in keys if isinstance(row.get(k), float)}
    return (min(found.values()), min(found, key=found.get)) if found else (math.nan, None)


def summarize(row: dict, copy_bw: float) -> dict:
    """Best BF16, speedups and bandwidth fractions of one kernel row. Eager OScaR times are compared with eager BF16
    ones, graph replays with graph replays (the BF16 eager times where a row has no graph ones: older bench files),
    each flush with the same flush."""
    best, name = _best(row, ("sdpa_flash", "sdpa_cudnn", "flex"))
    best_clean, _ = _best(row, ("sdpa_flash_clean", "sdpa_cudnn_clean"))
    graph, graph_name = _best(row, ("sdpa_flash_graph", "sdpa_cudnn_graph"))
    graph_clean, _ = _best(row, ("sdpa_flash_graph_clean", "sdpa_cudnn_graph_clean"))
    if graph_name is None:
        graph, graph_name, graph_clean = best, name, best_clean
    out = {
        "best_bf16_us": best,
        "best_bf16": name,
        "best_bf16_clean_us": best_clean,
        "best_bf16_graph_us": graph,
        "best_bf16_graph": graph_name,
        "best_bf16_graph_clean_us": graph_clean,
    }
    for key, t in list(row.items()):
        if key.startswith("oscar_") and key.endswith("_us") and isinstance(t, float):
            be = key[len("oscar_") : -len("_us")]
            ref = (graph_clean if be.endswith("_clean") else graph) if "_graph" in be else best
            out[f"speedup_{be}"] = ref / t
            out[f"bw_frac_{be}"] = row["oscar_bytes"] / (t * 1e-6) / copy_bw
    best, best_clean = graph, graph_clean  # the floors below are graph replays too
    if isinstance(row.get("floor_read_us"), float):  # the most any decode of these bytes could gain
        out["ceiling_speedup"] = best / row["floor_read_us"]
        out["ceiling_speedup_clean"] = best_clean / row["floor_read_clean_us"]
    attention = row.get("oscar_cuda_us")  # an error's text where the CUDA decode failed: the row is kept, unrated
    out["pack_step_frac_of_cuda_attention"] = (
        (row["pack_block128_us"] / 128) / attention if isinstance(attention, float) else math.nan
    )
    out["pack_prefill_bw_frac"] = row["pack_prefill_bytes"] / (row["pack_prefill_us"] * 1e-6) / copy_bw
    if isinstance(row.get("pack_prefill_online_us"), float):  # V rotated in the pack too (value_rotation=online)
        online_s = row["pack_prefill_online_us"] * 1e-6
        out["pack_prefill_online_bw_frac"] = row["pack_prefill_bytes"] / online_s / copy_bw
    return out


def run_kernels(args, copy_bw: float) -> list[dict]:
    import torch

    rows = []
    backends = [b for b in args.backends.split(",") if b]
    wide = bench_kernels(args).wide_decode
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            raise SystemExit(f"unknown shape {shape!r}; choose from {list(SHAPES)}")
        for point in args.points.split(","):
            batch, ctx = (int(x) for x in point.lower().split("x"))
            try:
                row = kernel_point(shape, batch, ctx, backends, args.flex, wide=wide)
                row.update(summarize(row, copy_bw))
            except torch.cuda.OutOfMemoryError as e:
                row = {"shape": shape, "batch": batch, "context": ctx, "error": f"OOM: {str(e)[:120]}"}
            rows.append(row)
            print(_kernel_line(row), flush=True)
            torch.cuda.empty_cache()
    return rows


def _kernel_line(r: dict) -> str:
    """shape BxL | bf16 flash / cudnn us | per OScaR variant: us, graph us, speedup, bandwidth fraction."""
    if "error" in r:
        return f"{r['shape']:>18} {r['batch']:>3}x{r['context']:<6} {r['error']}"
    num = lambda x, w=".1f": format(x, w) if isinstance(x, float) else "-"  # noqa: E731
    parts = [
        f"{r['shape']:>18} {r['batch']:>3}x{r['context']:<6} flash {num(r.get('sdpa_flash'))} "
        f"g{num(r.get('sdpa_flash_graph'))} cudnn {num(r.get('sdpa_cudnn'))} g{num(r.get('sdpa_cudnn_graph'))}"
        + (f" flex {num(r.get('flex'))}" if "flex" in r else "")
    ]
    for key in r:
        if key.startswith("oscar_") and key.endswith("_us") and not key.endswith(("_graph_us", "_graph_clean_us")):
            be = key[len("oscar_") : -len("_us")]
            parts.append(
                f"| {be} {num(r[key])} g{num(r.get(f'oscar_{be}_graph_us'))}"
                f" x{num(r.get(f'speedup_{be}'), '.2f')} bw{num(r.get(f'bw_frac_{be}'), '.2f')}"
                f" clean-L2 g{num(r.get(f'oscar_{be}_graph_clean_us'))}"
                f" x{num(r.get(f'speedup_{be}_graph_clean'), '.2f')}"
            )
    if "floor_read_us" in r:
        parts.append(
            f"| read floor {num(r['floor_read_us'])} / {num(r.get('floor_read_clean_us'))} ceiling "
            f"x{num(r.get('ceiling_speedup'), '.2f')} / x{num(r.get('ceiling_speedup_clean'), '.2f')}"
        )
    parts.append(
        f"| pack/step {num(r.get('pack_step_frac_of_cuda_attention'), '.3f')} prefill-bw "
        f"{num(r.get('pack_prefill_bw_frac'), '.2f')} "
        f"(V online {num(r.get('pack_prefill_online_bw_frac'), '.2f')})"
    )
    return " ".join(parts)


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


def bench_kernels(args):
    """The run's quant.kernels.KernelOptions: `--kernels` over the environment's overrides; the e2e and generate
    benchmarks decode OScaR on the first of `--backends`."""
    from harness.options import kernel_options

    first = [b for b in getattr(args, "backends", "cuda").split(",") if b][0].partition(":")[0]
    return kernel_options(getattr(args, "kernels", None), first)


def environment(kernels=None) -> dict:
    """The GPU, versions and the run's kernel options (the e2e model's layer kernels, the decode builds)."""
    import torch
    import transformers
    import triton

    from harness.results import kernel_switches

    p = torch.cuda.get_device_properties(0)
    return {
        "device": p.name,
        "sms": p.multi_processor_count,
        "memory_bytes": p.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        **{k: v for k, v in kernel_switches(kernels).items() if k != "cuda_graphs"},
    }


def main(args) -> int:
    import torch

    if args.what == "eval":  # runs on a CPU too (a tiny preset)
        return run_harnesses(args)
    if not torch.cuda.is_available():
        print("oscar-eval bench needs a CUDA GPU (the kernels and the timings are GPU-only); none is visible")
        return 2
    if args.what == "peers":
        from harness.bench.peers import run_peers

        return run_peers(args)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out or f"results/bench/runs/bench-{stamp}.json")
    result = {"date": stamp, "environment": environment(bench_kernels(args)), "copy_bandwidth_Bps": copy_bandwidth()}
    print(f"{result['environment']['device']}: copy {result['copy_bandwidth_Bps'] / 1e12:.2f} TB/s", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.what in ("kernels", "all"):
        result["kernels"] = run_kernels(args, result["copy_bandwidth_Bps"])
        out.write_text(json.dumps(result, indent=1, default=str))  # kept even if the e2e part dies
    if args.what in ("e2e", "all"):
        result["e2e"] = run_e2e(args)
        out.write_text(json.dumps(result, indent=1, default=str))
    if args.what in ("generate", "all"):
        result["generate"] = run_generate(args)
        out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {out}")
    from harness.bench import check as bench_check

    print(bench_check.format_for_bench(result))
    if args.against:
        changes = bench_check.compare(
            bench_check.load(args.against), result, bench_check.parse_slowdown(args.max_slowdown)
        )
        print(f"against {args.against}:")
        print(bench_check.format_changes(changes, bench_check.parse_slowdown(args.max_slowdown)))
        return 1 if any(c["regression"] for c in changes) else 0
    return 0


def run_harnesses(args) -> int:
    """--what eval: the side-by-side (harness/bench/harnesses.py) in a bench JSON of its own."""
    import torch

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out or f"results/bench/runs/bench-{stamp}.json")
    cpu = {"device": "cpu", "torch": torch.__version__}
    env = environment(bench_kernels(args)) if torch.cuda.is_available() else cpu
    result = {"date": stamp, "environment": env, "eval": harnesses.run_eval(args)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    print(f"wrote {out}")
    return 0
