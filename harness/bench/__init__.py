"""`oscar-eval bench`: the GPU benchmarks' command line, JSON under results/bench/ and a table.

--what kernels (harness/bench/kernels.py): OScaR's INT2 decode attention (CUDA and Triton) against the best BF16
decode on the same GPU, per KV shape and point, with floors and ceilings (harness/bench/floor.py), and the pack.
--what e2e / generate (harness/bench/e2e.py): one decode step of a Qwen3-8B-shaped model with each cache, and make
eval's generate path. --what peers (harness/bench/peers.py): the decode against the peers' own. --what eval
(harness/bench/harnesses.py): the harness against lmms-eval's own model classes. The bench gate that compares two
runs is harness/bench/check.py (`oscar-eval bench-check`).
"""

from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from pathlib import Path

from harness.bench import harnesses
from harness.bench.e2e import run_e2e, run_generate
from harness.bench.kernels import bench_kernels, run_kernels
from harness.bench.timing import POINTS, SHAPES, copy_bandwidth

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
