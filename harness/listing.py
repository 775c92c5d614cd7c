"""`oscar-eval list [models|methods|tasks|runs]`: what can be evaluated, and what has been."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from harness import progress as PF
from harness import results as R

WHAT = ("models", "methods", "tasks", "runs")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("what", nargs="?", choices=WHAT + ("all",), default="all")
    p.add_argument("--runs-dir", default=str(R.RUNS_DIR))
    p.add_argument(
        "--upgrade-fingerprints",
        action="store_true",
        help="rewrite the code digests of every up-to-date result in the current scheme (definitions, which a move "
        "of code between files keeps); run it before moving code, so the move stales nothing",
    )


def main(args: argparse.Namespace) -> int:
    if args.upgrade_fingerprints:
        return upgrade_fingerprints(Path(args.runs_dir))
    sections = WHAT if args.what == "all" else (args.what,)
    for name in sections:
        print(f"{name}:")
        try:
            lines = LISTERS[name](args)
        except (ImportError, R.ResultFileError) as err:  # one broken part must not hide the others
            print(f"  (cannot list {name}: {err})", file=sys.stderr)
            continue
        print("\n".join(f"  {line}" for line in lines) if lines else "  (none)")
    return 0


def list_models(args) -> list[str]:
    from harness import models as M

    rows = [
        (s.name, s.family, s.default_task, str(s.gpu_batch_size), s.hub_id)
        for s in (M.get_spec(n) for n in M.list_models())
    ]
    return _columns(rows, ("name", "family", "default task", "GPU batch", "hub id"))


def list_methods(args) -> list[str]:
    """Every preset with the groups `--quant` takes it in (bf16 is in two), its code bits and its family."""
    from quant.methods import GROUPS, PRESETS, get_method

    rows = []
    for name in PRESETS:
        method = get_method(name)
        groups = ",".join(g for g, names in GROUPS.items() if name in names)
        rows.append((name, groups, R.number(getattr(method, "bits", None)), getattr(method, "method", "")))
    return _columns(rows, ("name", "group", "code bits", "family")) + [CODE_BITS_NOTE]


# A config's `bits` cannot know the head dim, which sets how much its norms and scales add per element.
CODE_BITS_NOTE = (
    "code bits: per element, before scales, zero points and norms (turboquant's 2.25 is 2.5 bits per "
    "element at head dim 128 with its two fp16 norms a token); a result's bits per element count "
    "everything stored"
)


def list_tasks(args) -> list[str]:
    import tasks

    rows = []
    for name in tasks.list_tasks():
        try:
            t = tasks.get_task(name)
            rows.append((name, f"v{t.version}", ",".join(t.modalities)))
        except ImportError as err:  # a task whose optional dependency is missing still shows up
            rows.append((name, "?", f"not importable: {err}"))
    return _columns(rows, ("name", "version", "modalities"))


def list_runs(args) -> list[str]:
    """Every result with its primary metric and whether it is what this checkout computes (harness/provenance.py);
    then progress files of runs that did not finish."""
    from harness import provenance

    rows, stale = [], []
    root = Path(args.runs_dir)
    for path in R.find_results(root):
        r = R.read_result(path)
        m = r["metrics"][r["primary_metric"]]
        reasons = provenance.stale_reasons(r)
        rows.append(
            (str(path), r["primary_metric"], R.number(m["value"]), m["n"], r["date"], "stale" if reasons else "current")
        )
        stale += [f"{path}: {'; '.join(reasons)}"] if reasons else []
    lines = _columns(rows, ("file", "metric", "value", "n", "date", "status"))
    lines += [f"stale (`oscar-eval eval ... --force` reruns one): {len(stale)} of {len(rows)}"] + stale if stale else []
    unfinished = sorted(root.rglob("*.partial.jsonl")) if root.exists() else []
    lines += [
        f"unfinished: {p} ({PF.progress_count(p)} items recorded; {_how_to_resume(p)}, or delete it)"
        for p in unfinished
    ]
    return lines


def upgrade_fingerprints(root: Path) -> int:
    """Rewrite each up-to-date result of the first digest scheme with this checkout's digests in the current one:
    being up to date, it ran this very code, whose definitions digest is therefore its own. A stale result is left
    as it is (its old code cannot be digested again)."""
    from harness import provenance

    upgraded = stale = 0
    for path in R.find_results(root):
        r = R.read_result(path)
        if provenance.scheme_of(r.get("code")) == provenance.DEFS:
            continue
        if provenance.stale_reasons(r) or (now := provenance.current_parts(r, provenance.DEFS)) is None:
            stale += 1
            continue
        r["code"] = {part: now[part] for part in r["code"]}  # the parts it recorded, no more
        R.write_result(r, path)
        upgraded += 1
    print(f"{upgraded} results now record definitions digests; {stale} stale ones left as they are")
    return 0


def _how_to_resume(progress: Path) -> str:
    """What resumes an unfinished run: its command again, or with --force where an up-to-date result sits beside it
    (a forced rerun that was killed: without --force the command skips the result), as `oscar-eval eval` says."""
    stem = re.sub(r"(\.rank\d+)?\.partial\.jsonl$", "", progress.name)
    beside = progress.with_name(f"{stem}.json")
    return "rerun its command with --force to resume" if beside.exists() else "rerun its command to resume"


def _columns(rows, header) -> list[str]:
    table = [tuple(header)] + [
        tuple("-" if c is None else (f"{c:.4g}" if isinstance(c, float) else str(c)) for c in row) for row in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table] if rows else []


LISTERS = {"models": list_models, "methods": list_methods, "tasks": list_tasks, "runs": list_runs}
