"""Time the decode-time linear layers (quant/kernels/fused_linear.py) against torch (cuBLAS) on one model's
projection shapes: each call captured in a CUDA graph and replayed after a read-only L2 flush (a decode step
streams every weight once, so none is in L2 when its GEMM starts). Prints a table, writes JSON:

    python3 -m benchmarks.sweep_linear --tokens 1,4,8 --rows 0,1,2,4 --out linear.json

rows 0 is `rows_per_cta`'s choice. "gate_up" is the MLP's silu(gate(x)) * up(x): torch's four kernels against one;
"qkv" the attention's three projections of one input: torch's three GEMMs against one launch.
Bandwidth is weight bytes / time (compare the GPU's copy bandwidth, `copy_bandwidth_Bps` in results/bench/<gpu>.json).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from harness.bench.timing import _graph_us
from quant.kernels import fused_linear

# name: (N, K) of nn.Linear weights [N, K]; Qwen3-8B (hidden 4096, 32 q / 8 kv heads of 128, MLP 12288).
QWEN3_8B = {
    "q_proj": (4096, 4096),
    "k_proj": (1024, 4096),
    "qkv": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up": (12288, 4096),
    "down_proj": (4096, 12288),
    "lm_head": (151936, 4096),
}


def time_shape(name: str, n: int, k: int, tokens: int, rows: list[int]) -> dict:
    g = torch.Generator(device="cuda").manual_seed(n + k + tokens)
    x = torch.randn(tokens, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * k**-0.5).to(torch.bfloat16)
    gated = name == "gate_up"
    w_up = (torch.randn(n, k, device="cuda", generator=g) * k**-0.5).to(torch.bfloat16) if gated else None
    weight_bytes = w.numel() * 2 * (2 if gated else 1)
    parts = list(w.split([n * 2 // 3, n // 6, n // 6])) if name == "qkv" else None  # 4096 / 1024 / 1024 rows
    if gated:
        torch_fn = lambda: F.silu(F.linear(x, w)) * F.linear(x, w_up)  # noqa: E731
    elif parts:
        torch_fn = lambda: [F.linear(x, p) for p in parts]  # noqa: E731
    else:
        torch_fn = lambda: F.linear(x, w)  # noqa: E731
    row = {"name": name, "n": n, "k": k, "tokens": tokens, "weight_bytes": weight_bytes}
    with torch.inference_mode():
        ref = (torch.cat(torch_fn(), dim=-1) if parts else torch_fn()).double()
        row["torch_us"] = _graph_us(torch_fn, clean=True)
        for r in rows:
            if gated:
                fn = lambda r=r: fused_linear.silu_mul(x, w, w_up, rows=r or None)  # noqa: E731
            elif parts:
                fn = lambda r=r: fused_linear.linears(x, parts, rows=r or None)  # noqa: E731
            else:
                fn = lambda r=r: fused_linear.linear(x, w, rows=r or None)  # noqa: E731
            out = torch.cat(fn(), dim=-1) if parts else fn()
            err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
            row[f"rows{r}_us"] = _graph_us(fn, clean=True)
            row[f"rows{r}_max_rel_diff_vs_torch"] = err
    for key in [k for k in row if k.endswith("_us") and isinstance(row[k], float)]:
        row[key.replace("_us", "_tbps")] = weight_bytes / (row[key] * 1e-6) / 1e12
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="1,4,8")
    p.add_argument("--rows", default="0,1,2,4", help="rows per CTA to time (0: the default choice)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    out = []
    print(
        f"{'shape':>10} {'N':>7} {'K':>6} {'tok':>3} | {'torch us':>9} TB/s | "
        + " | ".join(f"rows{r} us  TB/s" for r in rows)
    )
    for tokens in (int(t) for t in args.tokens.split(",")):
        for name, (n, k) in QWEN3_8B.items():
            r = time_shape(name, n, k, tokens, rows)
            out.append(r)
            cells = [f"{r[f'rows{x}_us']:8.1f} {r[f'rows{x}_tbps']:5.2f}" for x in rows]
            print(
                f"{name:>10} {n:>7} {k:>6} {tokens:>3} | {r['torch_us']:9.1f} {r['torch_tbps']:4.2f} | "
                + " | ".join(cells),
                flush=True,
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(),
                    "rows_default": {
                        name: fused_linear.rows_per_cta(n, torch.device("cuda")) for name, (n, _) in QWEN3_8B.items()
                    },
                    "results": out,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
