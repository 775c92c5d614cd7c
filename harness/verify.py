"""`oscar-eval verify`: replay the first items of results that only a code change made stale; where every replayed
record is the recorded one, bit for bit (timings aside), the result takes this checkout's code digests.

A change to the eval loop or to a file every method shares stales every result that ran through it, whether or not
it changes what they computed (harness/provenance.py cannot tell: it digests code, it does not run it). Rerunning
them all is hours of CPU; replaying a few items of each, with the same model, method, task, data, seed, backend and
batch size, and comparing each record with the recorded one is what a careful researcher would do by hand. A result
that replays exactly is rewritten with the current digests and records the check (`code_check`: items replayed,
of how many, the commit, the parts that had changed); one that does not stays stale, and the first difference is
said. It is a sample: a change that moves only later items is not seen (`--items N` replays more; a number at least
the result's replays it whole). The replay runs whole batches of the original's batch size (a row's numbers depend on
the shapes of its batch), so it rounds `--items` up to one.

Only results whose every stale reason is a changed code part are replayed: a preset that drifted, a task version
that moved or a missing fingerprint needs a real rerun (`oscar-eval eval ... --force`). Only plain runs of real
weights on this kind of device are replayed (no `@` settings in the name, no custom data folder).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import results as R

# What a record holds that the clock or the run's grouping decides, not the method: left out of the comparison.
TIMING = ("loop_s", "wall_s", "cost", "setup_s", "prefill_reused")
DEFAULT_ITEMS = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", help="result files (default: every result under --runs-dir)")
    p.add_argument("--runs-dir", default=str(R.RUNS_DIR))
    p.add_argument("--items", type=int, default=DEFAULT_ITEMS, help="items replayed per result (its first ones)")
    p.add_argument("--dry-run", action="store_true", help="say what would be replayed, replay nothing")


def main(args: argparse.Namespace) -> int:
    if args.items < 1:
        print("error: --items must be at least 1", file=sys.stderr)
        return 2
    paths = [Path(p) for p in args.paths] or R.find_results(Path(args.runs_dir))
    groups: dict[tuple, list[tuple[Path, dict[str, Any]]]] = {}
    for path in paths:
        r = R.read_result(path)
        why = why_not(r)
        if why == "current":
            continue
        if why:
            print(f"{path}: not replayed: {why}", file=sys.stderr)
            continue
        groups.setdefault(run_key(r), []).append((path, r))
    if not groups:
        print("nothing to replay: no result is stale by its code alone", file=sys.stderr)
        return 0
    failed = 0
    for key, members in groups.items():
        names = ", ".join(r["method"]["preset"] for _, r in members)
        n = replayed_items(members, args.items)
        print(f"{key[0]} {key[1]} ({key[2]}): replaying the first {n} items of {names}", file=sys.stderr)
        if not args.dry_run:
            failed += replay(members, args.items)
    return 1 if failed else 0


def why_not(result: dict[str, Any]) -> str | None:
    """None when `result` can be replayed; "current" when it is up to date; else why it cannot."""
    from harness import provenance

    reasons = provenance.stale_reasons(result)
    if not reasons:
        return "current"
    now = provenance.current_parts(result)
    code = provenance.code_changes(result, now) if now is not None and result.get("code") is not None else []
    if not code or reasons != code:  # something besides the code parts: a drifted preset, a task version
        return "; ".join(reasons) + " (a rerun, not a replay: oscar-eval eval ... --force)"
    if result["method"]["name"] != result["method"]["preset"]:
        return f"not a plain run of a preset ({result['method']['name']})"
    if result["model"].get("weights", "real") != "real":
        return "random weights (speed and memory runs: rerun them on their GPU)"
    if result["task"]["data"] not in ("official", "generated"):
        return f"data {result['task']['data']!r} is a folder of its own (pass it to oscar-eval eval)"
    device = str(result["system"].get("device") or "cpu")
    here = "cuda" if _has_cuda() else "cpu"
    if device.split(":")[0] != here:
        return f"it ran on {device}, this machine runs {here}"
    return None


def run_key(result: dict[str, Any]) -> tuple:
    """What the results replayed in one `evaluate` call share: the model (loaded once) and the run's settings."""
    return (
        result["model"]["name"],
        result["task"]["name"],
        result["task"]["data"],
        result["seed"],
        result["backend"],
        int(result["system"].get("batch_size") or 1),
    )


def replay(members: list[tuple[Path, dict[str, Any]]], items: int, adapter: Any = None, task: Any = None) -> int:
    """Replay the first `items` items of each result of one group, compare, rewrite the ones that match; returns how
    many did not. `adapter` / `task`: an already loaded model, a task object (default: loaded by name)."""
    from harness import provenance, run
    from harness.results import utc_now

    model, name, data, seed, backend, batch = run_key(members[0][1])
    items = replayed_items(members, items)
    with tempfile.TemporaryDirectory(prefix="oscar-verify-") as tmp:
        replayed = run.evaluate(
            model,
            ",".join(r["method"]["preset"] for _, r in members),
            task=task if task is not None else name,
            data=None if data == "official" else data,
            limit=items,
            seed=seed,
            backend=backend,
            batch_size=batch,
            out=str(Path(tmp) / "{method}.json"),
            force=True,
            n_resamples=20,
            adapter=adapter,
        )
    failed = 0
    for (path, old), new in zip(members, replayed):
        difference = first_difference(old, new)
        if difference:
            failed += 1
            print(f"{path}: stays stale, the replay differs: {difference}", file=sys.stderr)
            continue
        changed = [p for p in sorted(old["code"]) if old["code"][p] != new["code"].get(p)]
        old["code"] = {part: new["code"][part] for part in new["code"]}
        old["code_check"] = {
            "items": len(new["samples"]),
            "of": old["task"]["n_items"],
            "commit": new["environment"].get("git_commit"),
            "date": utc_now(),
            "parts": changed,
        }
        R.write_result(old, path)
        reasons = provenance.stale_reasons(old)
        state = "current" if not reasons else "still stale: " + "; ".join(reasons)
        print(f"{path}: {len(new['samples'])} items replayed exactly; {state}", file=sys.stderr)
    return failed


def replayed_items(members: list[tuple[Path, dict[str, Any]]], items: int) -> int:
    """`items` rounded up to whole batches of the group's batch size (a row's numbers depend on the shapes of the
    batch it ran in), at most the results' items."""
    batch = run_key(members[0][1])[-1]
    return min(-(-items // batch) * batch, min(r["task"]["n_items"] for _, r in members))


def first_difference(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """The first way the replay `new` differs from the result `old` on the items it replayed, timings aside."""
    if old["model"]["weight_hash"] != new["model"]["weight_hash"]:
        return f"other weights ({old['model']['weight_hash']} -> {new['model']['weight_hash']})"
    if old["method"]["config"] != new["method"]["config"]:
        return "another method config"
    recorded = {str(s["id"]): s for s in old["samples"]}
    for sample in new["samples"]:
        was = recorded.get(str(sample["id"]))
        if was is None:
            return f"item {sample['id']} is not in the result"
        a, b = _without_timing(was), _without_timing(sample)
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            return f"item {sample['id']}: {', '.join(keys)}"
    return None


def _without_timing(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in TIMING}


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
