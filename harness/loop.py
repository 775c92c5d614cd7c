"""One method's run: resume or start its progress file, warm up on a GPU, answer the items batch by batch through
the runner (harness/runner.py), record each item as it is scored, write the result (harness/run.py decides what
runs; harness/record.py aggregates the records)."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path
from typing import Any

from harness import distributed as D
from harness import progress as PF
from harness import results as R
from harness.record import aggregate_with_ci


def check_progress(runs: list[tuple["RunContext", Path]]) -> None:
    """Before any method runs: a progress file of other settings where one of `runs` would write (and no up-to-date
    result beside it, where it is a leftover that is only reported) would stop the run at that method's turn, maybe
    hours in. Raise now, naming every such file."""
    clashes = []
    for ctx, path in runs:
        current = path.exists() and not _differences(path, ctx)
        for progress in [] if current else PF.progress_paths(path):
            diff = PF.progress_diff(progress, ctx.identity())
            if diff:
                clashes.append(f"{progress} ({'; '.join(diff)})")
    if clashes:
        raise R.ResultFileError(
            f"{len(clashes)} unfinished run(s) with different settings are recorded where this run writes: "
            + "; ".join(clashes)
            + ". Rerun with --restart to discard them, or --out to write elsewhere"
        )


class RunContext:
    """Everything that identifies one (model, method, task, data, seed) run."""

    def __init__(
        self,
        model,
        model_info,
        method,
        task,
        items,
        data,
        limit,
        fingerprint,
        seed,
        backend,
        kernels=None,
        batch_size: int = 1,
        n_total: int | None = None,
    ):
        self.model, self.model_info, self.method, self.task = model, model_info, method, task
        self.batch_size = batch_size
        self.items, self.data, self.limit, self.fingerprint, self.seed = items, data, limit, fingerprint, seed
        self.n_total = len(items) if n_total is None else n_total
        # Methods without a kernel decode run the torch reference whatever was asked.
        self.backend = backend if method.kernel_decode else "torch"
        self.kernels = kernels
        self.code: dict[str, str] | None = None  # harness.provenance.code_parts of the run
        self.traits = None  # quant.traits.ModelTraits of the model's family (what preparing it may touch)
        self.prefills = None  # harness.scoring.Prefills shared by the methods of one model
        self.tags: list[str] = []  # run_tags: the settings in which this run differs from its preset's plain run

    @property
    def label(self) -> str:
        """The method as it ran: its preset's name, or the name with the fields that differ (quant.methods.label),
        then each setting of the run that differs from a plain run (run_tags) after an "@"."""
        from quant.methods import label

        return label(self.method) + "".join(f"@{tag}" for tag in self.tags)

    @property
    def result_name(self) -> str:
        """The result file's stem: the label, and `.first<N>` when the items are the first N of a larger set, so a
        partial run never takes the place of a whole one."""
        partial = len(self.items) < self.n_total
        return self.label + (f".first{len(self.items)}" if partial else "")

    def identity(self) -> dict[str, Any]:
        """What must match for recorded items to be reused (the limit may change between sessions)."""
        return {
            "model": self.model,
            "weight_hash": self.model_info["weight_hash"],
            "method": R.jsonable(self.method.to_dict()),
            "task": self.task.name,
            "task_version": int(self.task.version),
            "data": self.data,
            "seed": self.seed,
            "backend": self.backend,
            "code": self.code,
        }


def run_method(
    ctx: RunContext, adapter, path: Path, restart: bool, force: bool, n_resamples: int, ranks: D.Ranks = D.Ranks()
) -> dict[str, Any]:
    """Run (or resume, or skip when up to date) one method; write and return its result. Several ranks: each runs
    its shard, rank 0 merges the records and writes the result (harness/distributed.py)."""
    if path.exists() and not force:  # --restart discards unfinished progress; it does not rerun a current result
        differences = _differences(path, ctx)
        if not differences:
            if ranks.main:
                print(f"{path}: up to date, skipped (--force reruns it)", file=sys.stderr)
                _report_orphans(path, discard=restart)
            return R.read_result(path)
        if ranks.main:
            print(
                f"{path}: rerunning, the result there differs from this run: {'; '.join(differences)}", file=sys.stderr
            )
    # --restart discards recorded items; --force reruns but resumes items recorded by this very run (same config and
    # code), and discards only progress of another one
    progress = D.open_progress(path, ctx.identity(), restart, ranks, replace_other=force)
    if (progress.records or progress.failed) and ranks.main:
        again = f"; {progress.failed} that failed are tried again" if progress.failed else ""
        print(
            f"{path}: resuming, {len(progress.records)} of {len(ctx.items)} items already recorded{again}",
            file=sys.stderr,
        )
    R.reset_peak_memory()
    _seed_everything(ctx.seed)
    shard = D.shard(ctx.items, ranks)
    if any(str(item["id"]) not in progress.done_ids for item in shard):
        from harness.runner import Runner

        with Runner(adapter, ctx.method, ctx.kernels, ctx.traits, ctx.prefills) as runner:
            _run_items(ctx, runner, progress, shard, f" rank {ranks.rank}/{ranks.world_size}" if ranks.parallel else "")
    ids = [str(item["id"]) for item in ctx.items]
    figures = D.gather_figures(ranks, adapter, progress.records, shard)
    records = D.gather_records(progress.records, shard, ids, ranks)
    return D.on_main(ranks, lambda: _write(ctx, adapter, path, records, n_resamples, figures))


def _write(
    ctx: RunContext,
    adapter,
    path: Path,
    records: list[dict[str, Any]],
    n_resamples: int,
    figures: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """Aggregate the finished run's records (all ranks'), write its result and remove the progress files."""
    D.check_complete(records, [str(item["id"]) for item in ctx.items])
    if records and all("error" in r for r in records):  # a score of 0 would hide the cause
        raise RuntimeError(
            f"{ctx.task.name} with {ctx.method.name}: all {len(records)} items failed, "
            f"no result written; first: {records[0]['error']} (fix the cause and run the same command again: "
            "failed items are tried again)"
        )
    result = build_result(ctx, adapter, records, n_resamples)
    if figures is not None:
        D.record_parallel(result, figures)
    R.write_result(result, path)
    D.remove_progress(path)
    print(f"{path}: written ({len(records)} items)", file=sys.stderr)
    return result


def _differences(path: Path, ctx: RunContext) -> list[str]:
    """What the result at `path` ran otherwise than `ctx` would (empty: it is up to date): config, task version,
    data, seed, backend, weights, the batch-invariant mode, and each part of the code (harness/provenance.py)."""
    try:
        old = R.read_result(path)
    except R.ResultFileError as err:
        return [f"it cannot be read ({err})"]
    now = {
        "config": R.jsonable(ctx.method.to_dict()),
        "task version": int(ctx.task.version),
        "data": ctx.fingerprint,
        "seed": ctx.seed,
        "backend": ctx.backend,
        "weights": ctx.model_info["weight_hash"],
        "batch invariance": bool(getattr(ctx.kernels, "batch_invariant", False)),  # answers move with the batch
    }
    then = {
        "config": old["method"]["config"],
        "task version": old["task"]["version"],
        "data": old["task"]["data_fingerprint"],
        "seed": old["seed"],
        "backend": old["backend"],
        "weights": old["model"]["weight_hash"],
        "batch invariance": bool((old["environment"].get("kernels") or {}).get("batch_invariant")),
    }
    out = [
        f"{k}" + (f" {then[k]!r} -> {now[k]!r}" if k in ("seed", "backend", "task version", "batch invariance") else "")
        for k in now
        if now[k] != then[k]
    ]
    from harness.provenance import code_changes

    return out + code_changes(old, ctx.code or {})


def _report_orphans(path: Path, discard: bool = False) -> None:
    """Say so when an unfinished run's progress sits beside an up-to-date result (a forced rerun that was killed);
    `discard` (--restart): delete it, and say that."""
    for progress in PF.progress_paths(path):
        n = PF.progress_count(progress)
        n = "unreadable" if n is None else f"{n} items"
        if discard:
            progress.unlink(missing_ok=True)
            print(f"{progress}: an unfinished run's progress ({n}) discarded (--restart)", file=sys.stderr)
            continue
        print(
            f"{progress}: an unfinished run's progress ({n}) is left here; rerun with --force to resume "
            "it, --restart to discard it",
            file=sys.stderr,
        )


def _seed_everything(seed: int) -> None:
    """Same seed before every method, so a method's numbers do not depend on the order of --quant."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _run_items(
    ctx: RunContext, runner, progress: PF.Progress, items: list[dict[str, Any]] | None = None, where: str = ""
) -> None:
    """Run `items` (default: all of ctx.items; a rank: its shard) that `progress` has not recorded yet: `batch_size`
    items at a time, their requests answered together by `runner` (harness/runner.py), each record written as soon
    as it is scored."""
    from tqdm import tqdm

    items = ctx.items if items is None else items
    done = progress.done_ids
    todo = [item for item in items if str(item["id"]) not in done]
    label = f"{ctx.model} {ctx.method.name} {ctx.task.name}{where}"
    mine = {str(item["id"]) for item in items}
    errors = sum(1 for r in progress.records if "error" in r and str(r["id"]) in mine)
    on_gpu = str(getattr(runner.adapter, "device", "cpu")).startswith("cuda")
    setup_s = warm_up(ctx, runner, todo[: ctx.batch_size]) if todo and on_gpu else None
    with tqdm(
        total=len(items), initial=len(items) - len(todo), desc=label, unit="item", file=sys.stderr, dynamic_ncols=True
    ) as bar:
        for first in range(0, len(todo), ctx.batch_size):
            for record in _run_chunk(ctx, runner, todo[first : first + ctx.batch_size]):
                if setup_s is not None:  # the first timed record carries the warm-up (results.cost_figures)
                    record["setup_s"], setup_s = setup_s, None
                progress.add(record)
                errors += "error" in record
                bar.set_postfix(errors=errors, refresh=False)
                bar.update(1)


def warm_up(ctx: RunContext, runner, chunk: list[dict[str, Any]]) -> float:
    """Answer `chunk`'s requests once, untimed and unrecorded, before a GPU run times anything; returns its seconds.

    A method's first calls on a GPU pay what later calls do not: Triton compiles at new shapes, the CUDA extensions'
    loading, the allocator's growth, cuBLAS's first plans. Whichever method ran first in a process paid them for
    those after it, so items/s depended on the method's place in the run. Warming each method on the run's own first
    batch (the same shapes and token budgets as its timed calls) leaves those costs here. The warm-up neither keeps
    nor reuses the run's shared prefills (its timed call runs its own, as it would have), and the seeds are set
    again after it."""
    from tasks.base import TaskDataError

    requests = []
    for item in chunk:
        try:
            requests += list(ctx.task.requests(item))
        except TaskDataError:  # the timed call records it
            pass
    start = time.perf_counter()
    kept = runner.prompts, runner.prefills
    runner.prompts = runner.prefills = None
    try:
        runner.run(requests)
    finally:
        runner.prompts, runner.prefills = kept
    if str(getattr(runner.adapter, "device", "cpu")).startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    _seed_everything(ctx.seed)
    return time.perf_counter() - start


def _run_chunk(ctx: RunContext, runner, chunk: list[dict[str, Any]]):
    """Records of `chunk`'s items: their requests built once, answered in one runner call, scored by the task. Each
    record's loop_s is its share of the call plus its own scoring."""
    from tasks.base import TaskDataError

    start = time.perf_counter()
    asked = []  # (item, its requests, why they could not be built)
    for item in chunk:
        try:
            asked.append((item, list(ctx.task.requests(item)), None))
        except TaskDataError as exc:  # a bad item (unreadable image, clip): recorded, the run goes on
            asked.append((item, [], str(exc)))
    responses = runner.run([r for _, requests, _ in asked for r in requests])
    share = (time.perf_counter() - start) / len(chunk)
    at = 0
    for item, requests, error in asked:
        own, at = responses[at : at + len(requests)], at + len(requests)
        scored = time.perf_counter()
        try:
            record = ctx.task.record(item, own, error)
        except Exception as err:  # a bug, not a bad item (tasks record those): stop here
            raise RuntimeError(
                f"{ctx.task.name} item {item['id']!r} with {ctx.method.name}: "
                f"{type(err).__name__}: {err} (finished items are kept; rerun to resume)"
            ) from err
        record = R.jsonable(record)
        generated = [r.tokens for r in own if r.text is not None]
        if generated and "tokens" not in record:  # what the model generated, for agreement with another method's run
            record["tokens"] = generated[0] if len(generated) == 1 else generated
        cost = item_cost(own)
        if cost is not None:
            record["cost"] = R.jsonable(cost)
        record["id"] = str(record.get("id", item["id"]))
        record["loop_s"] = share + time.perf_counter() - scored  # the loop's clock, the same for every task
        record.setdefault("wall_s", record["loop_s"])  # model time when the task recorded it
        yield record


def item_cost(responses) -> dict[str, Any] | None:
    """The summed cost of an item's responses (None: none recorded one). Times, tokens and steps add up; peak memory,
    KV bytes and the batch size take the largest."""
    costs = [r.cost for r in responses if r.cost]
    if not costs:
        return None
    total: dict[str, Any] = {}
    for cost in costs:
        for key, value in cost.items():
            if key in ("peak_cuda_bytes", "kv_bytes", "batch"):
                total[key] = value if total.get(key) is None else max(total[key], value or 0)
            else:
                total[key] = total.get(key, 0) + value
    return total


def build_result(ctx: RunContext, adapter, records: list[dict[str, Any]], n_resamples: int) -> dict[str, Any]:
    """Assemble the schema-v1 result of one finished run (see harness/schema.json)."""
    metrics, categories = aggregate_with_ci(ctx.task, records, n_resamples, ctx.seed)
    primary = getattr(ctx.task, "primary_metric", None) or next(iter(metrics))
    if primary not in metrics:
        raise ValueError(f"task {ctx.task.name}: primary metric {primary!r} is not among {sorted(metrics)}")
    return {
        "schema_version": R.SCHEMA_VERSION,
        "date": R.utc_now(),
        "seed": ctx.seed,
        "model": ctx.model_info,
        "method": {
            "name": ctx.label,
            "preset": ctx.method.name,
            "config": R.jsonable(ctx.method.to_dict()),
            "bits": R.number(getattr(ctx.method, "bits", None)),
        },
        "backend": ctx.backend,
        "task": {
            "name": ctx.task.name,
            "version": int(ctx.task.version),
            "data": R.data_kind(ctx.data),
            "data_fingerprint": ctx.fingerprint,
            "n_items": len(ctx.items),
            "n_total": ctx.n_total,
            "limit": ctx.limit,
            "settings": R.jsonable(ctx.task.describe()) if hasattr(ctx.task, "describe") else {},
        },
        "primary_metric": primary,
        "metrics": metrics,
        "categories": categories,
        "samples": records,
        "system": {**R.system_figures(records, adapter), "batch_size": ctx.batch_size},
        "environment": R.environment(ctx.kernels),
        "code": ctx.code or {},
        "n_errors": sum(1 for r in records if "error" in r),
        "notes": R.notes(ctx.model_info, ctx.data) + list(getattr(ctx.task, "notes", lambda: [])()),
    }
