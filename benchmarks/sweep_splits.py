"""Time the CUDA decode kernel alone over split plans (a diagnostic for the split-KV planner).

For each point B x context of a head shape, the decode inputs are prepared once and the raw extension call
is captured in a CUDA graph; its replay is timed with the L2 flushed before every launch (as in
`oscar-eval bench`: do_bench's zero-fill, which leaves the L2 dirty, and a read-only flush, "clean-L2"), and back to
back (20 launches per graph, L2 warm). Prints a table, writes JSON:

    python3 -m benchmarks.sweep_splits --points 1x4096,1x131072 --out sweep.json

With --trace, the planned launch also records per-CTA %globaltimer stamps (start, query ready, main loop
done, partial written and counted, merge done) and the table gets a timeline summary (microseconds from the
first CTA's start): when CTAs start, how long their phases take, when the merges end. The traced launch follows
two warm launches (kernel code and some data in L2); with --trace-flush it follows a read-only flush instead, the
state of the clean-L2 timing and of a model's step, where the merge's code comes from DRAM (docs/PERFORMANCE.md,
"Design choices in the kernel code").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch

from harness.bench.timing import capture_graph, clean_l2_us
from quant.kernels import cuda, pack_kv
from quant.kernels.common import num_sms, prepare_decode
from quant.packed import PackedKV
from quant.primitives import hadamard

SHAPES = {"qwen3-8b": (32, 8, 128), "llava-7b": (32, 32, 128), "qwen3-omni-thinker": (32, 4, 128)}


def inputs(shape: str, batch: int, ctx: int, res_tokens: int = 64, rotate_values: bool = False, lq: int = 1):
    """The decode inputs of `oscar-eval bench`'s kernel points: V's rotation in the model's weights (OScaR's default,
    quant/fold.py), so the kernel leaves its output in V's basis; rotate_values=True: V rotated in the cache too.
    lq: query tokens a sequence (a speculative decoding step verifies several; they are the window's last lq)."""
    hq, hkv, d = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(batch * 7 + ctx)
    q = torch.randn(batch, hq, lq, d, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(batch, hkv, ctx, d, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(batch, hkv, ctx, d, device="cuda", generator=g).to(torch.bfloat16)
    tq = ctx - res_tokens
    tq -= tq % 128
    with default_build():  # an experiment's OSCAR_KERNEL_FLAGS are for the decode: the pack needs no build of its own
        kq, vq, norms = pack_kv(k[:, :, :tq], v[:, :, :tq], backend="cuda", rotate_values=rotate_values)
    kv = PackedKV(
        kq,
        vq,
        norms,
        k[:, :, tq:].contiguous(),
        v[:, :, tq:].contiguous(),
        hadamard(d, device="cuda"),
        values_rotated=rotate_values,
    )
    return q, kv


@contextlib.contextmanager
def default_build():
    """OSCAR_KERNEL_FLAGS cleared inside: the CUDA kernels loaded there are the default build's."""
    flags = os.environ.pop("OSCAR_KERNEL_FLAGS", None)
    try:
        yield
    finally:
        if flags is not None:
            os.environ["OSCAR_KERNEL_FLAGS"] = flags


def time_plan(
    q,
    kv,
    splits: int | None,
    min_blocks: int = 3,
    window: bool | None = None,
    balance: bool = False,
    order: int | None = None,
    merge_group: int | None = None,
    warps: int = 4,
) -> dict:
    """window: the window's own CTA (True), folded into the last split's (False), or the planner's choice;
    balance: a given split count is sized like the planner's (cuda.plan_splits), else split equally;
    order: the CTAs' launch order (cuda.cta_order; None: the planner's); merge_group: the merge's groups
    (cuda.merge_plan; None: the planner's); min_blocks and warps: the build (cuda.NARROW 3, 4; cuda.WIDE 1, 8;
    cuda.WIDE_LONG 1, 12)."""
    import triton.testing

    x = prepare_decode(q, kv, rotate_query=False, order="frag")
    rows, sms = x.batch * x.kv_heads, num_sms(q.device)
    split_tokens = None  # the planner's
    if splits is not None:
        window = cuda.separate_window(rows, sms * min_blocks) if window is None else window
        if balance:  # this many splits, sized as the planner does (a folded window weighed in)
            split_tokens, _ = cuda.plan_splits(
                x.tokens, rows, sms * min_blocks, block=32, want=splits, window=0 if window else x.residual
            )
        else:  # equal splits
            split_tokens = max(32, -(-x.tokens // (splits * 32)) * 32)
    plan = cuda.make_plan(
        x.tokens, rows, sms, x.group * x.lq, x.residual, x.head_dim, min_blocks, warps,
        window_cta=window, split_tokens=split_tokens, order=order, merge_group=merge_group,
    )  # fmt: skip

    def fn():
        return cuda.launch(x, plan, q.shape[-1] ** -0.5, True, kv.rotate_out)

    one, many = capture_graph(fn, 1), capture_graph(fn, 20)
    flushed = 1e3 * triton.testing.do_bench(one.replay, warmup=25, rep=200, return_mode="median")
    clean = clean_l2_us(one.replay)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    many.replay()
    torch.cuda.synchronize()
    start.record()
    for _ in range(10):
        many.replay()
    end.record()
    torch.cuda.synchronize()
    warm = 1e3 * start.elapsed_time(end) / 200
    return {
        **plan.launch_record(),
        "flushed_us": flushed,
        "clean_us": clean,
        "warm_us": warm,
    }


def trace_plan(
    q,
    kv,
    min_blocks: int = 3,
    order: int | None = None,
    merge_group: int | None = None,
    flush: bool = False,
    warps: int = 4,
) -> dict:
    """One planned launch with per-CTA stamps; returns the phase summary (us) and the raw stamps. flush: the traced
    launch follows a read-only L2 flush (as `clean_l2_us` times it: data and kernel code out of L2), else two
    launches of the same decode (a warm L2)."""
    x = prepare_decode(q, kv, rotate_query=False, order="frag")
    plan = cuda.make_plan(
        x.tokens, x.batch * x.kv_heads, num_sms(q.device), x.group * x.lq, x.residual, x.head_dim, min_blocks, warps,
        order=order, merge_group=merge_group,
    )  # fmt: skip
    # the binding asks for (splits + 1) rows of stamps per (b, kv head) whatever the window's placement
    trace = torch.zeros((plan.splits + 1) * plan.rows * 8, dtype=torch.int64, device=q.device)
    buf = torch.ones(2**26, dtype=torch.float32, device=q.device) if flush else None
    for i in range(3):  # warm, then the traced launch is the last
        trace.zero_()
        if buf is not None and i == 2:
            buf.sum()
        cuda.decode_attention(q, kv, q.shape[-1] ** -0.5, trace=trace, plan=plan)
    torch.cuda.synchronize()
    ctas = plan.ctas
    stamps = trace[: ctas * 8].view(ctas, 8).cpu()
    return {
        "ctas": ctas,
        "splits": plan.splits,
        "window_cta": plan.window_cta,
        "order": plan.order,
        **summarize_trace(stamps),
        "stamps": stamps.tolist() if ctas <= 512 else None,
    }


def summarize_trace(stamps: torch.Tensor) -> dict:
    """Phase summary of per-CTA stamps [CTAs, 8] (the kernel's trace_stamp: 0 start, 1 query ready, 2 main
    loop done, 3 partial written and counted (a window CTA: its window partial written; decode_row_kernel: its window
    attended and the row's output written), 6 the last CTA of a two-level
    merge's group: its group merged and counted, 5 the merge's partials loaded and summed, 4 merge done, 7 SM id;
    0 = not reached). Each phase as [min, median, p90, max] in us, times
    from the first CTA's start. CTAs without a quantized split (a separate window CTA) report their window under
    window_us; tail_us: from the last split's partial to the end of the last merge."""
    t = stamps.double()
    t0 = t[:, 0].min()
    rel = (t[:, :5] - t0) / 1e3  # ns -> us
    quant, merged = t[:, 1] > 0, t[:, 4] > 0

    def pct(v):
        v = v.sort().values
        return [round(float(v[int(f * (len(v) - 1))]), 2) for f in (0.0, 0.5, 0.9, 1.0)] if len(v) else []

    ends = torch.where(merged, rel[:, 4], torch.where(t[:, 6] > 0, (t[:, 6] - t0) / 1e3, rel[:, 3]))
    return {
        "sms_used": int(t[:, 7].unique().numel()),
        "start_us": pct(rel[:, 0]),
        "query_us": pct((rel[:, 1] - rel[:, 0])[quant]),
        "loop_us": pct((rel[:, 2] - rel[:, 1])[quant]),
        "partial_us": pct((rel[:, 3] - rel[:, 2])[quant]),
        "window_us": pct((rel[:, 3] - rel[:, 0])[~quant]),
        "cta_end_us": pct(rel[:, 3]),
        "merge_us": pct((rel[:, 4] - torch.maximum(rel[:, 3], (t[:, 6] - t0) / 1e3))[merged]),
        "merge_loads_us": pct(((t[:, 5] - torch.maximum(t[:, 3], t[:, 6])) / 1e3)[merged & (t[:, 5] > 0)]),
        "group_merge_us": pct(((t[:, 6] - t[:, 3]) / 1e3)[t[:, 6] > 0]),
        "tail_us": round(float(ends.max() - rel[:, 3][quant].max()), 2) if bool(quant.any()) else None,
        "end_us": round(float(ends.max()), 2),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", choices=list(SHAPES))
    p.add_argument("--points", default="1x4096,1x32768,1x131072,16x32768,64x4096")
    p.add_argument("--splits", default="1,2,4,8,16,24,32,48,64,96", help="split counts to try besides the planner's")
    p.add_argument("--min-blocks", type=int, default=3)
    p.add_argument(
        "--warps",
        type=int,
        default=4,
        choices=[4, 8, 12],
        help="warps of a CTA (the build: --min-blocks 3 --warps 4 is cuda.NARROW, 1 and 8 cuda.WIDE, 1 and 12 "
        "cuda.WIDE_LONG)",
    )
    p.add_argument(
        "--window",
        choices=["auto", "cta", "folded"],
        default="auto",
        help="the window's placement: the planner's choice, its own CTA, or in the last split's CTA",
    )
    p.add_argument(
        "--balance",
        action="store_true",
        help="size the --splits counts like the planner (a folded window weighed in), not equally",
    )
    p.add_argument(
        "--orders",
        default="plan",
        help="CTA launch orders to time each plan in, comma-separated: plan (cuda.cta_order's choice), "
        "0 (row by row), 1 (each row's window or window-carrying CTA first), 2 (those last)",
    )
    p.add_argument(
        "--merge-groups",
        default="plan",
        help="merge groups to time each plan with, comma-separated: plan (cuda.merge_plan's choice), 0 (one "
        "level), G (two levels, groups of G splits; with the window's own CTA)",
    )
    p.add_argument("--trace", action="store_true", help="per-CTA timeline of the planned launch")
    p.add_argument(
        "--trace-flush",
        action="store_true",
        help="trace the launch after a read-only L2 flush (the clean-L2 timing's state), not warm",
    )
    p.add_argument("--lq", type=int, default=1, help="query tokens a sequence (speculative decoding: 2-4)")
    p.add_argument(
        "--rotate-values",
        action="store_true",
        help="V rotated in the cache (the merge rotates the output back), not in the model's weights",
    )
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def sweep_point(a, b: int, ctx: int, window, orders, merges) -> list[dict]:
    """Every plan of one point B x context timed (and traced with --trace), each printed as it ends."""
    rows = []
    q, kv = inputs(a.shape, b, ctx, rotate_values=a.rotate_values, lq=a.lq)
    for s in [None] + [int(v) for v in a.splits.split(",") if v]:
        if s is not None and s * 128 > ctx * 2:
            continue
        for order in orders:
            for merge in merges:
                r = {
                    "shape": a.shape,
                    "batch": b,
                    "context": ctx,
                    "lq": a.lq,
                    "planned": s is None,
                    **time_plan(q, kv, s, a.min_blocks, window, a.balance, order, merge, a.warps),
                }
                rows.append(r)
                print(
                    f"{a.shape} {b:>3}x{ctx:<6}{f' lq {a.lq}' if a.lq > 1 else ''} splits {r['splits']:>4} "
                    f"({r['split_tokens']:>6} tok, "
                    f"{r['ctas']:>5} CTAs, order {r['order']}, merge groups {r['merge_group']})"
                    f"{' plan' if r['planned'] else '     '} flushed {r['flushed_us']:8.1f} us"
                    f"  clean-L2 {r['clean_us']:8.1f} us  warm {r['warm_us']:8.1f} us",
                    flush=True,
                )
    if a.trace:
        order = None if orders == [None] else orders[-1]
        for merge in merges:
            tr = trace_plan(q, kv, a.min_blocks, order, merge, a.trace_flush, a.warps)
            rows.append({"shape": a.shape, "batch": b, "context": ctx, "merge_group": merge, "trace": tr})
            print(
                f"  trace (merge groups {merge}) {tr['ctas']} CTAs on {tr['sms_used']} SMs (us, "
                f"min/median/p90/max): start {tr['start_us']} query {tr['query_us']} loop {tr['loop_us']} "
                f"partial {tr['partial_us']} window {tr['window_us']} cta end {tr['cta_end_us']} "
                f"group merge {tr['group_merge_us']} merge {tr['merge_us']} (loads {tr['merge_loads_us']}) "
                f"tail {tr['tail_us']} last end {tr['end_us']:.2f}",
                flush=True,
            )
    del q, kv
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    a = parse_args()
    window = {"auto": None, "cta": True, "folded": False}[a.window]
    orders = [None if o == "plan" else int(o) for o in a.orders.split(",")]
    merges = [None if m == "plan" else int(m) for m in a.merge_groups.split(",")]
    rows = []
    for point in a.points.split(","):
        b, ctx = (int(v) for v in point.lower().split("x"))
        rows += sweep_point(a, b, ctx, window, orders, merges)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(
                {
                    "gpu": torch.cuda.get_device_name(),
                    "min_blocks": a.min_blocks,
                    "warps": a.warps,
                    "rotate_values": a.rotate_values,
                    "kernel_flags": os.environ.get("OSCAR_KERNEL_FLAGS", ""),
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
