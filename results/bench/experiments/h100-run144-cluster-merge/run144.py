"""Run 144: the cluster merge (decode_cluster_kernel) against the planned launch at batch-1 points.
python3 .cache/run144.py OUT.json [shapes]"""
import json
import sys
import time

import torch

from quant.kernels import cuda
from quant.kernels.common import num_sms, prepare_decode
from quant.kernels.sweep_splits import inputs, summarize_trace, time_plan

T, F = True, False
VARIANTS = {
    ("qwen3-8b", 1, 4096): [(11, T, 12), (11, T, 4), (12, F, 12), (16, F, 16), (15, T, 16), (8, F, 8), (7, T, 8)],
    ("qwen3-8b", 1, 32768): [(15, T, 16), (16, F, 16), (31, T, 16), (32, F, 16), (47, T, 16), (48, F, 16), (31, T, 8)],
    ("qwen3-8b", 1, 131072): [(31, T, 16), (32, F, 16), (47, T, 16), (48, F, 16), (15, T, 16), (16, F, 16),
                              (31, T, 8), (32, F, 8)],
    ("qwen3-omni-thinker", 1, 4096): [(15, T, 16), (16, F, 16), (31, T, 16), (32, F, 16), (7, T, 8), (8, F, 8)],
    ("qwen3-omni-thinker", 1, 32768): [(31, T, 16), (32, F, 16), (63, T, 16), (64, F, 16), (95, T, 16)],
    ("qwen3-omni-thinker", 1, 131072): [(63, T, 16), (64, F, 16), (95, T, 16), (96, F, 16), (31, T, 16), (32, F, 16)],
    ("llava-7b", 1, 4096): [(3, T, 4), (4, F, 4), (7, T, 8), (8, F, 8)],
    ("llava-7b", 1, 32768): [(8, F, 8), (7, T, 8), (12, F, 12), (4, F, 4)],
    ("llava-7b", 1, 131072): [(8, F, 8), (7, T, 8), (12, F, 12)],
}


def traced(q, kv, splits, window, cluster):
    x = prepare_decode(q, kv, rotate_query=False, order="frag")
    rows = x.batch * x.kv_heads
    split_tokens = max(32, -(-x.tokens // (splits * 32)) * 32)
    trace = torch.zeros((splits + 1) * rows * 8, dtype=torch.int64, device=q.device)
    for _ in range(3):
        trace.zero_()
        cuda.decode_attention(q, kv, q.shape[-1] ** -0.5, split_tokens=split_tokens, window_cta=window,
                              cluster=cluster, trace=trace)
    torch.cuda.synchronize()
    ctas = (splits + window) * rows
    s = summarize_trace(trace[:ctas * 8].view(ctas, 8).cpu())
    return {k: v for k, v in s.items()}


def main():
    out_path = sys.argv[1]
    shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    rows_out = []
    for (shape, b, ctx), variants in VARIANTS.items():
        if shapes and shape not in shapes:
            continue
        q, kv = inputs(shape, b, ctx)
        x = prepare_decode(q, kv, rotate_query=False, order="frag")
        plan = time_plan(q, kv, None)
        ref = cuda.decode_attention(q, kv, q.shape[-1] ** -0.5).float()
        print(f"{shape} {b}x{ctx} tokens {x.tokens}: plan {plan['splits']} splits window_cta {plan['window_cta']} "
              f"{plan['flushed_us']:.1f} / {plan['clean_us']:.1f} / {plan['warm_us']:.1f}", flush=True)
        rows_out.append({"shape": shape, "batch": b, "context": ctx, "variant": "plan", **plan})
        for splits, window, cluster in variants:
            split_tokens = max(32, -(-x.tokens // (splits * 32)) * 32)
            if -(-x.tokens // split_tokens) != splits or (splits + window) % cluster:
                print(f"   skip {splits} {window} {cluster}: splits round to {-(-x.tokens // split_tokens)}")
                continue
            try:
                r = time_plan(q, kv, splits, window=window, cluster=cluster)
                o = cuda.decode_attention(q, kv, q.shape[-1] ** -0.5, split_tokens=split_tokens, window_cta=window,
                                          cluster=cluster).float()
                r["max_diff_vs_plan"] = float((o - ref).abs().max() / ref.abs().max())
                tr = traced(q, kv, splits, window, cluster) if cluster == 16 or splits in (31, 32, 63, 64) else None
            except Exception as e:  # noqa: BLE001
                print(f"   {splits} {window} {cluster}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                rows_out.append({"shape": shape, "batch": b, "context": ctx, "splits": splits, "window_cta": window,
                                 "cluster": cluster, "error": str(e)[:500]})
                continue
            print(f"   {splits:>3} splits window_cta {window!s:5} cluster {cluster:>2}: {r['flushed_us']:.1f} / "
                  f"{r['clean_us']:.1f} / {r['warm_us']:.1f}  diff {r['max_diff_vs_plan']:.1e}"
                  + (f"  trace end {tr['end_us']} loop {tr['loop_us']} cta_end {tr['cta_end_us']}" if tr else ""),
                  flush=True)
            rows_out.append({"shape": shape, "batch": b, "context": ctx, "variant": "cluster", **r, "trace": tr})
        json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows_out}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
