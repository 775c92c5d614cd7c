"""`oscar-eval bench-check NEW [--against OLD]`: a `make bench` JSON read against the kernel issue's targets, and
against an older bench JSON of the same GPU (speed regressions between code versions fail loudly).

Targets (the numbers the kernels must show on one H100, in one bench JSON): decode attention against the best BF16 of
the same file at 1 x 128K and 16 x 32K (>= 4.5x), 64 x 4K (>= 3.5x) and 1 x 4K (not slower); effective bandwidth
(packed bytes / time, as a fraction of the device-to-device copy bandwidth) >= 0.75 at 1 x 128K and 16 x 32K; the
pack of one decode step <= 10% of the attention at 32K; a 128K prefill packed at >= 50% of copy bandwidth; end to end
(Qwen3-8B shape) a 1 x 128K step >= 1.6x faster, the largest batch that fits >= 4.5x the BF16 tokens/s, KV >= 5.3x
smaller.

Each decode target is read per model shape, with the graph time after both L2 flushes (dirty: do_bench's zero-fill;
clean: a read-only flush, what a model's decode step sees) and beside the bare-stream ceiling of the same file
(best BF16 / the time a kernel that only reads the bytes takes, harness.bench.floor): a target above that ceiling
is out of reach for any kernel of these bytes on that GPU, and is marked so.

Exit status: 0; 1 when --against finds a regression beyond --max-slowdown (or, with --require-targets, when a target
is missed); 2 on bad input (unreadable file, no kernel rows, different GPUs).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from harness.bench.reference import BenchFileError, load, num, ratio, reference_paths


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("new", help="a `make bench` JSON (the reference of a GPU kind: results/bench/<gpu>.json)")
    p.add_argument(
        "--against",
        default=None,
        help="an older bench JSON of the same GPU, or 'reference': the file "
        "under --reference-dir recorded on the same GPU; report every change, "
        "fail (exit 1) on a slowdown beyond --max-slowdown",
    )
    p.add_argument(
        "--max-slowdown",
        default="5%",
        help="tolerated slowdown per point (default 5%%: above the run-to-run noise of graph replays of the same code)",
    )
    p.add_argument(
        "--reference-dir",
        default="results/bench",
        help="where --against reference looks: one <gpu-kind>.json per GPU kind",
    )
    p.add_argument("--backend", default="cuda", help="the OScaR backend the targets are read for (cuda or triton)")
    p.add_argument("--require-targets", action="store_true", help="also fail (exit 1) when a target is missed")
    p.add_argument(
        "--all",
        action="store_true",
        help="list every time of both runs, not only the gated ones that moved by more than --max-slowdown",
    )


def reference_for(data: dict, reference_dir: Path) -> Path:
    """The reference bench JSON under reference_dir recorded on the same GPU as `data` (environment.device)."""
    device = (data.get("environment") or {}).get("device")
    files = reference_paths(reference_dir)
    for path in files:
        if (load(path).get("environment") or {}).get("device") == device:
            return path
    kinds = ", ".join(p.name for p in files) or "none"
    raise BenchFileError(
        f"no reference for {device} under {reference_dir}/ (there: {kinds}); commit this GPU's "
        f"bench JSON as {reference_dir}/<gpu-kind>.json to gate against it"
    )


def parse_slowdown(text: str) -> float:
    """'5%' or '0.05' -> 0.05."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise BenchFileError(f"--max-slowdown {text!r}: give a fraction (0.05) or a percentage (5%)") from None
    if value < 0:
        raise BenchFileError(f"--max-slowdown {text!r} is negative")
    return value


# ---------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    name: str
    threshold: float
    higher_is_better: bool = True

    def met(self, value: float | None) -> bool | None:
        if value is None:
            return None
        return value >= self.threshold if self.higher_is_better else value <= self.threshold


def kernel_row(data: dict, shape: str, batch: int, ctx: int) -> dict | None:
    for r in data.get("kernels") or []:
        if (r.get("shape"), r.get("batch"), r.get("context")) == (shape, batch, ctx) and "error" not in r:
            return r
    return None


def shapes(data: dict) -> list[str]:
    return list(dict.fromkeys(r["shape"] for r in data.get("kernels") or [] if "shape" in r))


DECODE = [((1, 131072), 4.5), ((16, 32768), 4.5), ((64, 4096), 3.5), ((1, 4096), 1.0)]
BANDWIDTH = [(1, 131072), (16, 32768)]


def status(target: Target, flushes: list[tuple[float | None, float | None]], beyond: str = "the bare stream") -> str:
    """flushes: (value, bare-stream ceiling) after the dirty and the clean flush. "met" when every measured flush meets
    the target, "met (clean only)" when only the clean one does, else "MISSED"; "beyond the bare stream" where each
    flush that misses has a ceiling below the target too (no kernel of these bytes could meet it there), "beyond the
    bare stream after the dirty flush" where only the dirty flush's is (so no kernel meets the row after both);
    `beyond` names the ceiling."""
    measured = [(v, c) for v, c in flushes if v is not None]
    if not measured:
        return "no data"
    missed = [(v, c) for v, c in measured if not target.met(v)]
    if not missed:
        return "met"
    text = "met (clean only)" if len(measured) == 2 and target.met(measured[1][0]) else "MISSED"
    out_of_reach = [c is not None and not target.met(c) for _, c in missed]
    if all(out_of_reach):
        text += f", beyond {beyond}"
    elif len(measured) == 2 and missed[0] == measured[0] and out_of_reach[0]:
        text += f", beyond {beyond} after the dirty flush"
    return text


def target_rows(data: dict, backend: str = "cuda") -> list[dict]:
    """One row per (target, shape): measured dirty / clean, the bare-stream ceiling, met or not."""
    rows = []

    def add(what, shape, target, dirty, clean=None, ceiling=None, ceiling_clean=None):
        rows.append(
            {
                "target": what,
                "shape": shape,
                "threshold": target.threshold,
                "higher_is_better": target.higher_is_better,
                "dirty": dirty,
                "clean": clean,
                "ceiling": ceiling,
                "ceiling_clean": ceiling_clean,
                "status": status(target, [(dirty, ceiling), (clean, ceiling_clean)]),
            }
        )

    for shape in shapes(data):
        for (batch, ctx), need in DECODE:
            r = kernel_row(data, shape, batch, ctx)
            if r is None:
                continue
            label = f"decode {batch} x {ctx // 1024}K vs best BF16" + (" (not slower)" if need == 1.0 else "")
            add(
                label,
                shape,
                Target(label, need),
                num(r.get(f"speedup_{backend}_graph")),
                num(r.get(f"speedup_{backend}_graph_clean")),
                num(r.get("ceiling_speedup")),
                num(r.get("ceiling_speedup_clean")),
            )
        for batch, ctx in BANDWIDTH:
            r = kernel_row(data, shape, batch, ctx)
            if r is None:
                continue
            copy_bw = num(data.get("copy_bandwidth_Bps"))
            floor = [num(r.get(k)) for k in ("floor_read_us", "floor_read_clean_us")]
            ceil = [
                r["oscar_bytes"] / (f * 1e-6) / copy_bw if f and copy_bw and num(r.get("oscar_bytes")) else None
                for f in floor
            ]
            label = f"effective bandwidth {batch} x {ctx // 1024}K (of copy)"
            add(
                label,
                shape,
                Target(label, 0.75),
                num(r.get(f"bw_frac_{backend}_graph")),
                num(r.get(f"bw_frac_{backend}_graph_clean")),
                *ceil,
            )
        for r in data.get("kernels") or []:
            if r.get("shape") == shape and r.get("context") == 32768 and "error" not in r:
                label = f"pack per step {r['batch']} x 32K (of attention)"
                add(label, shape, Target(label, 0.10, False), num(r.get("pack_step_frac_of_cuda_attention")))
        r = kernel_row(data, shape, 1, 131072)
        if r is not None:
            label = "pack of a 128K prefill (of copy bandwidth)"
            add(label, shape, Target(label, 0.50), num(r.get("pack_prefill_bw_frac")))
    rows += e2e_target_rows(data)
    return rows


def e2e_target_rows(data: dict) -> list[dict]:
    e2e = [r for r in data.get("e2e") or [] if "error" not in r]
    if not e2e:
        return []

    def find(kind, pred):
        return next((r for r in e2e if r.get("kind") == kind and pred(r)), None)

    rows = []
    at = lambda r: r.get("batch") == 1 and r.get("context") == 131072  # noqa: E731
    bf, oq = find("bf16", at), find("oscar", at)
    if bf and oq:
        cap = kv_format_cap(E2E_KV_HEADS * E2E_HEAD_DIM, 131072)
        for label, value, need, ceiling, beyond in [
            (
                "e2e step 1 x 128K vs BF16 (graph)",
                ratio(bf.get("graph_step_ms"), oq.get("graph_step_ms")),
                1.6,
                None,
                "",
            ),
            (
                "e2e KV memory 1 x 128K, smaller by",
                ratio(bf.get("kv_bytes"), oq.get("kv_bytes")),
                5.3,
                cap,
                "the format's cap",
            ),
        ]:
            t = Target(label, need)
            rows.append(
                {
                    "target": label,
                    "shape": "qwen3-8b (e2e)",
                    "threshold": need,
                    "higher_is_better": True,
                    "dirty": value,
                    "clean": None,
                    "ceiling": ceiling,
                    "ceiling_clean": None,
                    "status": status(t, [(value, ceiling)], beyond),
                }
            )
    big = lambda r: r.get("largest") and r.get("context") == 131072  # noqa: E731
    bf, oq = find("bf16", big), find("oscar", big)
    if bf and oq:
        label = f"e2e tokens/s, largest 128K batch ({bf.get('batch')} vs {oq.get('batch')} seqs)"
        value = ratio(
            oq.get("graph_tokens_per_s", oq.get("tokens_per_s")), bf.get("graph_tokens_per_s", bf.get("tokens_per_s"))
        )
        t = Target(label, 4.5)
        rows.append(
            {
                "target": label,
                "shape": "qwen3-8b (e2e)",
                "threshold": 4.5,
                "higher_is_better": True,
                "dirty": value,
                "clean": None,
                "ceiling": None,
                "ceiling_clean": None,
                "status": status(t, [(value, None)]),
            }
        )
    return rows


# The e2e model's KV shape (Qwen3-8B: 8 KV heads of 128; harness/bench/__init__.py's e2e config).
E2E_KV_HEADS, E2E_HEAD_DIM = 8, 128


def kv_format_cap(kv_channels: int, tokens: int) -> float:
    """How much smaller than bf16 OScaR's cache can be at `tokens` tokens, with OScaRConfig's defaults: per token and
    layer 2 x kv_channels codes of `bits`, an fp16 scale and zero per `group_size` of them (keys per channel over
    tokens, values per token over channels), one fp32 token norm; plus the bf16 window of `residual_length` tokens
    (Qwen3-8B at 128K: 4096 bytes a token against 772, 5.28x; 16/3 = 5.33x without the norms and the window)."""
    from quant.methods.oscar import OScaRConfig

    c = OScaRConfig()
    bf16 = 2 * kv_channels * 2
    packed = 2 * kv_channels * c.bits / 8 + 2 * kv_channels * 4 / c.group_size + 4
    return tokens * bf16 / (tokens * packed + c.residual_length * bf16)


# ---------------------------------------------------------------- against an older bench JSON


GPU_BOUND_PACK_US = 100.0  # eager pack calls shorter than this time the host's launches more than the GPU


def _timings(data: dict) -> dict[tuple, tuple[float, bool]]:
    """Every comparable time of a bench JSON (lower is better): (section, what, point...) -> (value, gated).

    Gated (a slowdown fails the check): OScaR's graph-replayed decode times and e2e steps (GPU time), and prefill
    packs long enough to be GPU-bound. Reported only: the BF16 baselines (not our code, but they say how far the
    machine differed between runs), eager times (host-bound at short contexts: they follow the host's launch speed
    more than the code) and `generate`'s wall time per token (whole calls with sampling and captures: they move
    between runs of the same code by more than a gate tolerates)."""
    out = {}
    for r in data.get("kernels") or []:
        if "error" in r:
            continue
        point = (r.get("shape"), r.get("batch"), r.get("context"))
        for key, v in r.items():
            if num(v) is None:
                continue
            if key.startswith("oscar_") and key.endswith(("_graph_us", "_graph_clean_us")):
                out[("kernel", key, *point)] = (float(v), True)
            elif key == "pack_prefill_us":
                out[("kernel", key, *point)] = (float(v), float(v) >= GPU_BOUND_PACK_US)
            elif (
                key.startswith("sdpa_")
                or (key.startswith("oscar_") and key.endswith("_us"))
                or key == "pack_block128_us"
            ):
                out[("kernel", key, *point)] = (float(v), False)
    for r in data.get("e2e") or []:
        if "error" not in r and num(r.get("graph_step_ms")) is not None:
            out[("e2e", f"{r['kind']} graph_step_ms", r.get("batch"), r.get("context"))] = (
                float(r["graph_step_ms"]),
                r["kind"] != "bf16",
            )
    for r in data.get("generate") or []:  # wall time of whole generate calls (sampling, captures): reported only
        if "error" not in r and num(r.get("decode_ms_per_token")) is not None:
            out[("generate", f"{r['kind']} ms/token", 1, r.get("context"))] = (float(r["decode_ms_per_token"]), False)
    return out


def compare(old: dict, new: dict, max_slowdown: float) -> list[dict]:
    """Changes of every time both runs have; `regression` where a gated time (_timings) grew by more than
    max_slowdown."""
    dev = [(d.get("environment") or {}).get("device") for d in (old, new)]
    if dev[0] and dev[1] and dev[0] != dev[1]:
        raise BenchFileError(
            f"the runs are on different GPUs ({dev[0]} vs {dev[1]}): their times do not compare; "
            "bench the older code on the same GPU"
        )
    a, b = _timings(old), _timings(new)
    rows = []
    for key in a.keys() & b.keys():
        change = b[key][0] / a[key][0] - 1
        gated = a[key][1] and b[key][1]
        rows.append(
            {
                "section": key[0],
                "what": key[1],
                "point": key[2:],
                "old": a[key][0],
                "new": b[key][0],
                "change": change,
                "gated": gated,
                "regression": gated and change > max_slowdown,
            }
        )
    order = {"kernel": 0, "e2e": 1, "generate": 2}
    rows.sort(key=lambda r: (order[r["section"]], str(r["point"][0]), r["point"][1:], r["what"]))
    return rows


# ---------------------------------------------------------------- printing


def _f(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def format_targets(rows: list[dict]) -> str:
    lines = [f"{'target':<52} {'shape':<20} {'need':>6} {'dirty':>7} {'clean':>7} {'ceiling':>15}  status"]
    for r in rows:
        need = ("<= " if not r["higher_is_better"] else ">= ") + format(r["threshold"], "g")
        ceil = (
            "-"
            if r["ceiling"] is None and r["ceiling_clean"] is None
            else f"{_f(r['ceiling'])} / {_f(r['ceiling_clean'])}"
        )
        lines.append(
            f"{r['target']:<52} {r['shape']:<20} {need:>6} {_f(r['dirty'], '.3g'):>7} "
            f"{_f(r['clean'], '.3g'):>7} {ceil:>15}  {r['status']}"
        )
    missed = [r for r in rows if r["status"].startswith("MISSED")]
    clean_only = [r for r in rows if r["status"].startswith("met (clean only)")]
    lines.append(
        f"{len(rows) - len(missed) - len(clean_only)} of {len(rows)} met after both flushes, "
        f"{len(clean_only)} after the read-only one only, {len(missed)} missed; "
        f"ceiling = best BF16 / bare-stream read of the same bytes, dirty / clean (KV: the format's cap)"
    )
    return "\n".join(lines)


def format_changes(rows: list[dict], max_slowdown: float, show_all: bool = False) -> str:
    lines = [f"{'section':<9} {'point':<32} {'what':<34} {'old':>10} {'new':>10} {'change':>8}"]
    shown = [r for r in rows if show_all or (r["gated"] and abs(r["change"]) > max_slowdown)]
    for r in shown:
        pt = " ".join(str(x) for x in r["point"])
        flag = "  REGRESSION" if r["regression"] else ("" if r["gated"] else "  (not gated)")
        lines.append(
            f"{r['section']:<9} {pt:<32} {r['what']:<34} {r['old']:>10.2f} {r['new']:>10.2f} "
            f"{100 * r['change']:>+7.1f}%{flag}"
        )
    n_reg = sum(r["regression"] for r in rows)
    gated = [r["change"] for r in rows if r["gated"]]
    geo = math.exp(sum(math.log1p(c) for c in gated) / len(gated)) - 1 if gated else math.nan
    if n_reg:
        lines.append(
            "re-measure a flagged point before blaming the code (oscar-eval bench --what kernels --shapes S "
            "--points BxT, on a fresh machine if it repeats): a graph replay after do_bench's dirty flush "
            "can move by process and machine with the same code; its eager and clean times are steadier"
        )
    lines.append(
        f"{len(rows)} times in both runs, {len(gated)} of them gated (GPU-bound OScaR times: geometric mean "
        f"change {100 * geo:+.1f}%, {n_reg} regression(s) beyond {100 * max_slowdown:g}%)"
        + ("" if show_all else "; --all lists every time, the BF16 baselines and eager times too")
    )
    return "\n".join(lines)


def main(args) -> int:
    try:
        new = load(args.new)
        if not new.get("kernels") and not new.get("e2e"):
            raise BenchFileError(f"{args.new}: no kernel or e2e rows to check")
        max_slowdown = parse_slowdown(args.max_slowdown)
        targets = target_rows(new, args.backend)
        print(
            f"{args.new} ({(new.get('environment') or {}).get('device', 'unknown GPU')}, {new.get('date', '')}), "
            f"backend {args.backend}:"
        )
        print(format_targets(targets))
        code = 0
        if args.require_targets and any(r["status"].startswith("MISSED") for r in targets):
            code = 1
        if args.against:
            if args.against == "reference":
                args.against = str(reference_for(new, Path(args.reference_dir)))
            old = load(args.against)
            changes = compare(old, new, max_slowdown)
            print(f"\nagainst {args.against} ({old.get('date', '')}):")
            print(format_changes(changes, max_slowdown, args.all))
            if any(r["regression"] for r in changes):
                code = 1
        return code
    except BenchFileError as e:
        print(f"bench-check: {e}")
        return 2


def format_for_bench(data: dict, backend: str = "cuda") -> str:
    """The targets table `oscar-eval bench` prints after a run."""
    return format_targets(target_rows(data, backend))
