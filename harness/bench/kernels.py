"""`oscar-eval bench --what kernels`: OScaR's INT2 decode attention (CUDA and Triton) against the best BF16 decode on
the same GPU, per KV shape and point, with the floors and ceilings of harness/bench/floor.py, and the pack.
Time = median of triton.testing.do_bench (which flushes L2 between runs by zero-filling a buffer, leaving it dirty),
and for the graph step and the SDPA baselines also after a read-only flush ("clean", the L2 state a model's
attention meets after the weight GEMMs; `clean_l2_us`). Effective bandwidth = bytes the step must read (packed
codes, scales, norms, window) / time; copy bandwidth is measured in the same run. Pack: a 128-token flush block (per
decode step = 1/128 of it) and a whole prefill (bytes read + written / time)."""

from __future__ import annotations

import dataclasses
import math

from harness.bench.timing import SHAPES, _graph_us, _median_us, clean_l2_us


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
        from quant.kernels.cuda import launch_plan, row_kernel

        plan = launch_plan(q, kv, wide=wide)
        row["cuda_plan"] = {
            **plan.launch_record(),
            "kernel": "row" if row_kernel(plan.tokens, plan.splits, plan.window_cta, kv.rotate_out) else "split",
        }
        try:
            row.update(floor_point(row["oscar_bytes"], plan.ctas, build=(plan.min_blocks, plan.warps)))
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


def bench_kernels(args):
    """The run's quant.kernels.KernelOptions: `--kernels` over the environment's overrides; the e2e and generate
    benchmarks decode OScaR on the first of `--backends`."""
    from harness.options import kernel_options

    first = [b for b in getattr(args, "backends", "cuda").split(",") if b][0].partition(":")[0]
    return kernel_options(getattr(args, "kernels", None), first)
