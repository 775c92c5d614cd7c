"""`oscar-eval bench --what peers --peer NAME=PATH ...`: this project's decode against its peers', in one process.

Nothing of a peer lives in this repository: the user points at a checkout (or an install) of each, and the bench
builds what needs building (into the kernel cache, `quant.kernels.cuda.cache_dir()/peers`), fills each peer's cache
with the peer's own pack function and times one decode step of each as its own code runs it, beside BF16 (SDPA
cuDNN and flash) and this project's CUDA decode, with `make bench`'s method: one step captured in a CUDA graph and
replayed, the median after do_bench's dirty L2 flush and after a read-only flush. Random bf16 q/K/V drawn as
`make bench` draws them (Qwen3-8B's 32 query / 8 KV heads of 128 by default), converted to a peer's dtype where it
takes another.

Peers (NAME of --peer):
- oscar: the official OScaR (ZunhaiSu/OScaR-KV-Quant). Its extension `oscar_cuda` is built from the checkout
  (csrc/oscar; CUTLASS in libs/cutlass: `git submodule update --init`), the cache is packed by its
  `kvcache_pack_int` (2 bits, k-channel groups of 32, the keys' Hadamard and token norms) and a step is what its
  Qwen3 decode runs: the query's Hadamard (`preprocess_k_cache`) and `fwd_kvcache_int` with its 256-token residual
  buffer, fp16 (its kernels' dtype).
- kivi: KIVI (jy-yuan/KIVI). Its `kivi_gemv` extension is built from quant/csrc, the cache packed by
  `triton_quantize_and_pack_along_last_dim` (2 bits, groups of 32, a 128-token full-precision window), and a step is
  the attention of models/llama_kivi.py: `cuda_bmm_fA_qB_outer` for the packed scores and values, torch matmuls for
  the window, an fp32 softmax; fp16. Its GEMV launches on the legacy default stream, which a CUDA graph cannot
  capture unless patched, so KIVI is timed eagerly (as it runs), and the tables mark it as not like-for-like with
  the replayed columns.
- lmdeploy, vllm: their packages, installed or at PATH (put on sys.path). The bench checks that they import; a
  peer that does not is marked "not available on this machine" with the import's error. Timing their decode kernels
  is not implemented here (no machine this project runs on has them), so a peer that imports is marked "not timed".

Each peer's bits per element (its packed codes, scales, zeros and norms over the K and V elements they hold) and
version (`git rev-parse` of a checkout, else the package's version) go into the JSON (results/bench/peers-<time>.json)
and into the "Peers" section of docs/PERFORMANCE.md (`--peers-doc`), which this command rewrites and nothing else.
This module times and writes; the peers' loaders are harness/bench/peer_code.py.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from harness.bench.peer_code import KNOWN, NOT_AVAILABLE, REPO, Peer, git_version, load_peers, parse_peers

TITLES = {"oscar": "OScaR official", "kivi": "KIVI", "lmdeploy": "LMDeploy", "vllm": "vLLM"}
PEER_POINTS = "1x4096,1x32768,1x131072,16x32768,64x4096"
PEER_SHAPES = "qwen3-8b"
# Why a row timed eagerly is marked: its time holds the host's launches between its kernels, which a graph replay
# does not, so it bounds the peer's kernels from above and does not compare with the replayed columns.
EAGER_MARK = "not like-for-like: timed eagerly, not graph-replayed"
EAGER_NOTE = (
    "(eager): timed as it runs, not graph-replayed, so not like-for-like with the other columns: its time "
    "includes the host's launches between its kernels, which a replay removes. The peers table says why it "
    "ran eagerly."
)


def time_step(fn, graph: bool) -> dict:
    """{'us': dirty, 'clean_us': clean, 'mode': 'graph' | 'eager'} with `make bench`'s timers."""
    from harness.bench.timing import _graph_us, _median_us, clean_l2_us

    if graph:
        dirty, clean = _graph_us(fn), _graph_us(fn, clean=True)
        if isinstance(dirty, float) and isinstance(clean, float):
            return {"us": dirty, "clean_us": clean, "mode": "graph"}
    return {"us": _median_us(fn), "clean_us": clean_l2_us(fn), "mode": "eager"}


def peer_point(shape: str, batch: int, ctx: int, peers: list[Peer]) -> dict:
    """One point: BF16 SDPA, this project's CUDA decode and every ready peer, each with its error against the BF16
    SDPA output (the unquantized attention: how far its quantization moves the result)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from harness.bench.timing import SHAPES, _graph_us
    from quant.kernels import decode_attention, pack_kv
    from quant.kernels.common import bytes_read
    from quant.kernels.reference import relative_error
    from quant.packed import PackedKV
    from quant.primitives import hadamard

    hq, hkv, d = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(batch * 7 + ctx)  # the draws of `make bench`'s kernel_point
    q = torch.randn(batch, hq, 1, d, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(batch, hkv, ctx, d, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(batch, hkv, ctx, d, device="cuda", generator=g).to(torch.bfloat16)
    row = {"shape": shape, "batch": batch, "context": ctx}
    with sdpa_kernel(SDPBackend.MATH):
        exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):

        def run(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        row[name] = {"us": _graph_us(run), "clean_us": _graph_us(run, clean=True), "mode": "graph", "bits": 16.0}
    tq = ctx - 64 - (ctx - 64) % 128  # the bench's 64-token window (rounded to whole 128-token blocks)
    kq, vq, norms = pack_kv(k[:, :, :tq], v[:, :, :tq], backend="cuda", rotate_values=False)
    kv = PackedKV(
        kq,
        vq,
        norms,
        k[:, :, tq:].contiguous(),
        v[:, :, tq:].contiguous(),
        hadamard(d, device="cuda"),
        values_rotated=False,
    )

    def ours():
        return decode_attention(q, kv, d**-0.5, backend="cuda")

    packed_bytes = bytes_read(PackedKV(kq, vq, norms, k[:, :, :0], v[:, :, :0], None))
    row["project"] = {
        **time_step(ours, True),
        "bits": 8 * packed_bytes / (2 * batch * hkv * tq * d),
        "rel_err_vs_exact": relative_error(ours().float(), exact),
    }
    for peer in peers:
        if peer.error:
            continue
        try:
            step = peer.impl.step(q, k, v)
            out = step.fn()
            row[peer.name] = {
                **time_step(step.fn, step.graph),
                "bits": step.bits,
                "note": step.note,
                "rel_err_vs_exact": relative_error(out.float(), exact),
            }
            del step, out
        except Exception as e:  # noqa: BLE001  (one peer failing at one point must not lose the others)
            row[peer.name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
        torch.cuda.empty_cache()
    return row


def status_cell(error: str) -> str:
    """A table cell for a peer that did not run: why, in short (the notes below the table give the whole reason)."""
    if error.startswith(NOT_AVAILABLE):
        return NOT_AVAILABLE
    return "not timed" if error.startswith("not timed") else "did not build"


def _cell(entry: dict | None, key: str = "us") -> str:
    if entry is None:
        return "-"
    if "error" in entry:
        return "failed (see JSON)"
    t = entry.get(key)
    if not isinstance(t, float):
        return "failed (see JSON)"
    return f"{t:.1f}" + (" (eager)" if entry.get("mode") == "eager" else "")


def format_section(result: dict) -> str:
    """The "## Peers" section of docs/PERFORMANCE.md from a peers JSON."""
    peers = result["peers"]
    cols = [("bf16", "BF16 (best SDPA)"), ("project", "this project")] + [(p["name"], TITLES[p["name"]]) for p in peers]
    env = result["environment"]
    lines = [
        "## Peers",
        "",
        (
            f"One decode step (one query token) of each peer beside BF16 and this project, timed in one process by "
            f"`oscar-eval bench --what peers` on {env['device']} (torch {env['torch']}, CUDA {env['cuda']}) on "
            f"{result['date'][:8]}: graph replays (eager where a peer's launches cannot be captured, marked), "
            "medians in us, as `make bench` times. Random bf16 q/K/V, Qwen3-8B's 32 query / 8 KV heads of 128; "
            "each peer's cache filled by its own pack, converted to its dtype (fp16 for the official OScaR and "
            'KIVI). Regenerate with `make bench OPTS="--what peers --peer oscar=PATH --peer kivi=PATH --peer '
            'lmdeploy --peer vllm"`.'
        ),
        "",
    ]
    for key, title in (("us", "after do_bench's dirty L2 flush"), ("clean_us", "after a read-only L2 flush")):
        lines += [
            f"**Times {title}** (us):",
            "",
            "| point | " + " | ".join(t for _, t in cols) + " |",
            "|---" * (len(cols) + 1) + "|",
        ]
        for row in (r for r in result["points"] if "error" not in r):
            best = min(
                (row[n] for n in ("sdpa_cudnn", "sdpa_flash") if isinstance(row[n].get(key), float)),
                key=lambda e: e[key],
                default=None,
            )
            errors = {p["name"]: p["error"] for p in peers if p.get("error")}
            cells = [_cell(best, key)] + [
                status_cell(errors[n]) if n in errors else _cell(row.get(n), key) for n, _ in cols[1:]
            ]
            lines.append(f"| {row['batch']} x {row['context'] // 1024}K | " + " | ".join(cells) + " |")
        lines.append("")
    eager = {
        n
        for row in result["points"]
        if "error" not in row
        for n, _ in cols[1:]
        if isinstance(row.get(n), dict) and row[n].get("mode") == "eager"
    }
    if eager:
        lines += [EAGER_NOTE, ""]
    lines += [
        (
            "**The peers** (bits per element: the packed part's codes, scales, zeros and norms over its K and V "
            "elements, at the longest point; error: relative L2 against the unquantized attention in float32 at "
            "that point, which says the peer computed attention over its own 2-bit cache):"
        ),
        "",
        "| peer | version | bits per element | error vs exact | how it ran |",
        "|---|---|---|---|---|",
    ]
    last = max((r for r in result["points"] if "error" not in r), key=lambda r: r["batch"] * r["context"], default={})
    proj = last.get("project", {})
    how = (f"**{EAGER_MARK}**; " if "project" in eager else "") + "CUDA decode, 64-token bf16 window"
    lines.append(
        f"| this project | {result['project_version']} | {proj.get('bits', float('nan')):.3f} | "
        f"{proj.get('rel_err_vs_exact', float('nan')):.3f} | {how} |"
    )
    for p in peers:
        e = last.get(p["name"], {})
        if p.get("error"):
            lines.append(f"| {TITLES[p['name']]} | {p['version']} | - | - | {p['error']} |")
        elif "error" in e or not e:
            lines.append(f"| {TITLES[p['name']]} | {p['version']} | - | - | failed: {e.get('error', 'no result')} |")
        else:
            how = "; ".join(x for x in ((f"**{EAGER_MARK}**" if p["name"] in eager else ""), e.get("note", "")) if x)
            lines.append(
                f"| {TITLES[p['name']]} | {p['version']} | {e['bits']:.3f} | {e['rel_err_vs_exact']:.3f} | {how} |"
            )
    return "\n".join(lines) + "\n"


def write_section(doc: Path, section: str) -> None:
    """Replace the "## Peers" section of `doc` (up to the next "## " heading or the end), or append one."""
    text = doc.read_text() if doc.exists() else ""
    start = text.find("\n## Peers\n")
    if start < 0:
        doc.write_text(text.rstrip("\n") + "\n\n" + section)
        return
    nxt = text.find("\n## ", start + 1)
    rest = text[nxt:] if nxt >= 0 else ""
    doc.write_text(text[: start + 1] + section + rest)


def run_peers(args) -> int:
    """The --what peers entry of `oscar-eval bench`."""
    import torch

    from harness.bench.timing import POINTS, SHAPES

    specs = parse_peers(args.peer or [])
    if not specs:
        raise SystemExit("--what peers needs at least one --peer NAME=PATH (NAME: " + ", ".join(KNOWN) + ")")
    points = PEER_POINTS if args.points == POINTS else args.points
    shapes = PEER_SHAPES if args.shapes == ",".join(SHAPES) else args.shapes
    peers = load_peers(specs)
    p = torch.cuda.get_device_properties(0)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    result = {
        "date": stamp,
        "environment": {
            "device": p.name,
            "sms": p.multi_processor_count,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "project_version": git_version(REPO) or "unknown",
        "peers": [
            {"name": x.name, "version": x.version, "path": str(x.path) if x.path else None, "error": x.error}
            for x in peers
        ],
        "points": [],
    }
    out = Path(args.out or f"results/bench/peers-{stamp}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    for shape in shapes.split(","):
        for point in points.split(","):
            batch, ctx = (int(x) for x in point.lower().split("x"))
            try:
                row = peer_point(shape, batch, ctx, peers)
            except torch.cuda.OutOfMemoryError as e:
                row = {"shape": shape, "batch": batch, "context": ctx, "error": f"OOM: {str(e)[:120]}"}
            result["points"].append(row)
            print(
                json.dumps(
                    {
                        k: (
                            v
                            if not isinstance(v, dict)
                            else {a: b for a, b in v.items() if a in ("us", "clean_us", "mode", "bits", "error")}
                        )
                        for k, v in row.items()
                    }
                ),
                flush=True,
            )
            out.write_text(json.dumps(result, indent=1, default=str))
            torch.cuda.empty_cache()
    section = format_section(result)
    print(section)
    if args.peers_doc:
        write_section(Path(args.peers_doc), section)
        print(f"wrote {out} and the Peers section of {args.peers_doc}")
    return 0
