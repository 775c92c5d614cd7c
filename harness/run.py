"""`oscar-eval eval`: run a task on a model with one or more KV-cache methods and write result files.

    oscar-eval eval --model smollm2-135m --quant all [--task ppl] [--limit 20]

The model loads once; each method then runs every item (skipping items a crashed run already
recorded, see harness/results.py), aggregates with the task's own `aggregate`, adds bootstrap
intervals (harness/stats.py), system figures and the environment, and writes one validated result
per method. A summary table closes the run.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from harness import distributed as D
from harness import results as R
from harness import stats

# Counts some tasks return among their metrics; the result has them as n_items / n_errors instead.
COUNT_KEYS = frozenset({"n", "n_items", "n_errors", "n_unscored", "failed", "windows", "tokens", "empty_references"})
DEFAULT_OUT = str(R.RUNS_DIR / "{task}" / "{model}" / "{method}.json")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="registered model name (oscar-eval list models)")
    p.add_argument("--quant", required=True, help="method preset, comma-separated presets, or 'all'")
    p.add_argument("--task", default=None, help="task name; default: the model's default task")
    p.add_argument("--limit", type=int, default=None, help="first N items only")
    p.add_argument("--data", default=None, help="None: official data; 'generated': the project's small set; or a path")
    p.add_argument("--model-path", default=None, help="local weights directory (else MODEL_PATH / HF cache)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="bf16 | fp16 | fp32 | auto")
    p.add_argument("--device-map", default=None, help="e.g. 'auto' to spread a large model over GPUs")
    p.add_argument(
        "--weights",
        default="real",
        choices=("real", "random"),
        help="real: the checkpoint's weights; random: its published architecture with seeded random "
        "weights made on the device (speed, memory and code path only; harness/models/synthetic.py)",
    )
    p.add_argument(
        "--quant-opts", default=None, help="method field overrides, e.g. 'group_size=64,residual_length=256'"
    )
    p.add_argument(
        "--backend",
        default=None,
        help="attention backend: torch | triton | cuda (default: the device's best); the same as --kernels backend=...",
    )
    p.add_argument(
        "--kernels",
        default=None,
        help="kernel options, e.g. 'cuda_graphs=off,wide_decode=off' (quant.kernels.KernelOptions; the "
        "environment's OSCAR_* overrides apply first)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="requests per model call, every task: prompts per generate (left-padded; each gets its batch-1 "
        "tokens, quant/rows.py), perplexity windows per forward. Default: the task's (ppl: 8 windows, "
        "ppl-4k: 2), else the model's measured GPU batch size on a GPU (`oscar-eval list`), else 1",
    )
    p.add_argument("--out", default=DEFAULT_OUT, help="result path template with {task} {model} {method}")
    p.add_argument("--restart", action="store_true", help="discard an unfinished run's progress file")
    p.add_argument("--force", action="store_true", help="rerun even when an up-to-date result exists")
    p.add_argument("--resamples", type=int, default=stats.DEFAULT_RESAMPLES, help="bootstrap resamples for intervals")


def main(args: argparse.Namespace) -> int:
    try:
        done = evaluate(
            model=args.model,
            quant=args.quant,
            task=args.task,
            limit=args.limit,
            data=args.data,
            model_path=args.model_path,
            device=args.device,
            dtype=args.dtype,
            device_map=args.device_map,
            weights=args.weights,
            backend=args.backend,
            quant_opts=args.quant_opts,
            seed=args.seed,
            out=args.out,
            restart=args.restart,
            force=args.force,
            n_resamples=args.resamples,
            kernels=kernel_options(args.kernels, args.backend),
            batch_size=args.batch_size,
        )
    except (KeyError, ValueError, RuntimeError, OSError) as err:  # bad names, missing data/weights, bad files
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"oscar-eval eval: error: {message}", file=sys.stderr)
        return 2
    finally:
        D.finish()  # under torchrun: leave the process group (harness/distributed.py)
    if D.ranks_from_env().main:
        print(summary_table(done))
    return 0


def kernel_options(text: str | None = None, backend: str | None = None, environ=None):
    """The run's quant.kernels.KernelOptions: the defaults, then the environment's OSCAR_* overrides (read here,
    once), then `--kernels`; `--backend X` is `--kernels backend=X` (both, disagreeing: ValueError)."""
    from quant.kernels.options import KernelOptions

    if backend:
        asked = KernelOptions.parse(text).backend if text else None
        if asked and asked != backend:
            raise ValueError(f"--backend {backend} and --kernels backend={asked} disagree; give one of them")
        text = ",".join(filter(None, [text, f"backend={backend}"]))
    return KernelOptions.parse(text, KernelOptions.from_env(os.environ if environ is None else environ))


def own_paper_suffix(name: str, methods) -> str:
    """'-own-paper' for a preset of the methods' own paper settings (and the BF16 run beside them): their results go to
    a folder of their own (results/runs/<task>-own-paper/), never into a table with the paper comparison."""
    from quant.methods import setting_of

    own = setting_of(name) == "own-paper"
    beside = name == "bf16" and any(setting_of(m.name) == "own-paper" for m in methods)
    return "-own-paper" if own or beside else ""


def resolve(model: str, quant: str, task: str | None, backend: str | None, quant_opts: str | None = None):
    """Check every name before anything heavy loads; unknown names raise KeyError listing valid ones."""
    import quant as Q
    import tasks as T
    from harness import models as M
    from quant.methods import expand_presets

    spec = M.get_spec(model)
    names = expand_presets(quant)  # presets and groups: all (the paper comparison), own-paper, variants
    if not names:
        raise ValueError("--quant is empty; give a method preset, a comma-separated list, or 'all'")
    overrides = Q.parse_overrides(quant_opts)
    if backend:
        from quant.kernels import BACKENDS

        if backend not in BACKENDS:
            raise ValueError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    methods = [Q.get_method(name, **overrides) for name in names]
    # A Task object (tests, notebooks: e.g. PerplexityTask(context=64)) is used as given.
    task_obj = T.get_task(task or spec.default_task) if task is None or isinstance(task, str) else task
    M.refuse_unreadable(task_obj, spec.name)  # before any weights load
    return spec, methods, task_obj


def evaluate(
    model: str,
    quant: str,
    task: Any = None,
    limit: int | None = None,
    data: str | None = None,
    model_path: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    weights: str = "real",
    device_map: str | None = None,
    backend: str | None = None,
    quant_opts: str | None = None,
    seed: int = 0,
    out: str = DEFAULT_OUT,
    restart: bool = False,
    force: bool = False,
    n_resamples: int = stats.DEFAULT_RESAMPLES,
    adapter: Any = None,
    kernels: Any = None,
    batch_size: int | None = None,
) -> list[dict[str, Any]]:
    """Run `task` on `model` for each method of `quant`; return the written results (one per method).

    `adapter` lets a caller that already holds a loaded adapter (tests, notebooks) skip loading; `kernels`
    (quant.kernels.KernelOptions, default: the defaults with `backend`) go to each method's runner (harness/runner.py:
    the prepared model, its caches and graphs); `batch_size` requests share one model call (prompts: each gets its
    batch-1 tokens; None: the task's default_batch_size, else the model's ModelSpec.gpu_batch_size on a GPU, else 1).
    Under torchrun each rank runs a shard of the items on its own device and rank 0 writes the results
    (harness/distributed.py); every rank returns them.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be a positive number of items, got {limit}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"--batch-size must be a positive number of prompts, got {batch_size}")
    spec, methods, task_obj = resolve(model, quant, task, backend, quant_opts)
    from harness.models.common import check_device, parse_dtype

    parse_dtype(dtype)  # a bad name is refused here, not after the weights load
    check_device(device, (kernels.backend if kernels else None) or backend, device_map)
    ranks, device = D.start(device, device_map)
    from quant import invariant
    from quant.kernels.options import KernelOptions

    kernels = kernels or KernelOptions()
    if backend:
        kernels = kernels.replace(backend=backend)
    if adapter is None:  # missing weights are named before anything else (the data, a judge) is looked at
        from harness import models as M

        M.check_weights(spec.name, model_path, weights)
    binds = hasattr(task_obj, "bind")  # sizes its items in the model's tokens (niah): they load after the model
    if not binds:
        items, n_total = D.main_first(ranks, lambda: load_items(task_obj, data, limit))  # rank 0 builds generated sets
    if adapter is None:
        from harness import models as M

        adapter = M.load(
            spec.name,
            weights=weights,
            seed=seed,
            model_path=model_path,
            device=device,
            dtype=dtype,
            device_map=device_map,
        )
    if binds:
        task_obj = bind_to_model(task_obj, adapter, spec.name)
        items, n_total = D.main_first(ranks, lambda: load_items(task_obj, data, limit))
    model_info = R.model_info(adapter)
    task_obj = scoring_for(task_obj, model_info)
    getattr(task_obj, "check_ready", lambda: None)()  # the task's own models (a judge), before the first item
    # record what will actually run: kernels on a GPU, the torch reference elsewhere
    model_device = next(adapter.model.parameters()).device
    backend = kernels.backend_for(model_device)
    kernels = invariant.resolve(kernels, adapter.generator)  # the mode's default, decided for this model
    if batch_size is None:
        batch_size = getattr(task_obj, "default_batch_size", None) or (
            spec.gpu_batch_size if model_device.type == "cuda" else 1
        )
    fingerprint = task_obj.data_fingerprint(items)
    # custom data is told apart by its content (the whole set's, whatever --limit), never by its folder's name
    n_total_fingerprint = (
        task_obj.data_fingerprint(task_obj.load(data, None)) if R.data_kind(data) == "custom" else None
    )
    D.check_same(ranks, (fingerprint, model_info["weight_hash"]), "the items' fingerprint and the weight hash")
    methods = runnable_methods(methods, adapter, spec.name)
    written = []
    from harness.models import traits_of
    from harness.prefill_store import RunPrefills
    from harness.provenance import parts_for

    prefills = RunPrefills()  # the exact prompt forwards of Score and Generate requests, shared by this run's methods
    plain = invariant.resolve(KernelOptions(), adapter.generator)  # the kernel options a plain run has here
    runs = []
    for method in methods:
        ctx = RunContext(
            spec.name,
            model_info,
            method,
            task_obj,
            items,
            data,
            limit,
            fingerprint,
            seed,
            backend,
            kernels,
            batch_size,
            n_total,
        )
        ctx.traits, ctx.prefills = traits_of(spec.name), prefills
        ctx.tags = run_tags(ctx, plain, model_device, n_resamples)
        ctx.code = parts_for(method, task_obj, adapter, ctx.backend, model_info.get("weights", "real"))
        path = Path(
            out.format(
                task=R.task_dir(task_obj.name, data, n_total_fingerprint) + own_paper_suffix(method.name, methods),
                model=R.model_dir(model_info),
                method=ctx.result_name,
            )
        )
        runs.append((ctx, path))
    if not (restart or force):
        check_progress(runs)
    for ctx, path in runs:
        written.append(run_method(ctx, adapter, path, restart, force, n_resamples, ranks))
    return written


def check_progress(runs: list[tuple["RunContext", Path]]) -> None:
    """Before any method runs: a progress file of other settings where one of `runs` would write (and no up-to-date
    result beside it, where it is a leftover that is only reported) would stop the run at that method's turn, maybe
    hours in. Raise now, naming every such file."""
    clashes = []
    for ctx, path in runs:
        current = path.exists() and not _differences(path, ctx)
        for progress in [] if current else R.progress_paths(path):
            diff = R.progress_diff(progress, ctx.identity())
            if diff:
                clashes.append(f"{progress} ({'; '.join(diff)})")
    if clashes:
        raise R.ResultFileError(
            f"{len(clashes)} unfinished run(s) with different settings are recorded where this run writes: "
            + "; ".join(clashes)
            + ". Rerun with --restart to discard them, or --out to write elsewhere"
        )


def runnable_methods(methods: list, adapter, model: str) -> list:
    """The methods that can run on the loaded model, checked before any item (MethodConfig.cannot_run): with several,
    each one that cannot is skipped with one line saying why, and leaves no progress file; with none left, a
    ValueError."""
    why = {m.name: reason for m in methods if (reason := m.cannot_run(adapter.model))}
    if why and len(why) == len(methods):
        raise ValueError(f"{model}: " + "; ".join(why.values()))
    for name, reason in why.items():
        print(f"{model}: skipping {name}: {reason}", file=sys.stderr)
    return [m for m in methods if m.name not in why]


def run_tags(ctx: "RunContext", plain, device, n_resamples: int) -> list[str]:
    """The settings of `ctx`'s run that differ from a plain run of its preset, as "name=value": each gives the result
    a name and a file of its own (`oscar@seed=1.json`), so no such run replaces the preset's result. A plain run:
    seed 0, the default bootstrap, real weights on the CPU (where their results are made; random weights measure
    speed and memory, on whatever device runs them), the device's default backend and the kernel options' defaults
    (`plain`)."""
    from quant.kernels.options import default_backend

    tags = [f"seed={ctx.seed}"] if ctx.seed != 0 else []
    if ctx.model_info.get("weights", "real") == "real" and device.type != "cpu":
        tags.append(f"device={device.type}")
    if ctx.backend != (default_backend(device) if ctx.method.kernel_decode else "torch"):
        tags.append(f"backend={ctx.backend}")
    asked, default = ctx.kernels.to_dict(), plain.to_dict()
    tags += [f"{k}={_value(asked[k])}" for k in sorted(asked) if k != "backend" and asked[k] != default[k]]
    if n_resamples != stats.DEFAULT_RESAMPLES:
        tags.append(f"resamples={n_resamples}")
    return tags


def _value(v) -> str:
    return {True: "on", False: "off"}.get(v, str(v)) if isinstance(v, bool) else str(v)


def bind_to_model(task, adapter, model: str):
    """`task.bind(count, max_context)`: the task as sized for this model. count(prompt) is the number of input tokens
    the model is given for a prompt (the adapter's own inputs: chat template and answer prefix in); max_context is
    the model's (text) config's max_position_embeddings. A length the model cannot hold is refused here, before any
    item runs."""
    config = getattr(adapter, "text_config", None)
    max_context = getattr(config, "max_position_embeddings", None)

    def count(prompt) -> int:
        return int(adapter.build_inputs(prompt)["input_ids"].shape[-1])

    try:
        return task.bind(count, max_context)
    except ValueError as err:
        raise ValueError(f"{model}: {err}") from None


def load_items(task, data: str | None, limit: int | None) -> tuple[list[dict[str, Any]], int]:
    """(the run's items, how many the whole set holds). With a limit the whole set is loaded first to count it (the
    limited load comes last: a task may keep the order of what it loaded last)."""
    n_total = len(task.load(data, None)) if limit is not None else None
    items = task.load(data, limit)
    if not items:
        raise ValueError(f"task {task.name} loaded no items (data={data!r}, limit={limit})")
    return items, len(items) if n_total is None else n_total


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
    for progress in R.progress_paths(path):
        n = R.progress_count(progress)
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
    ctx: RunContext, runner, progress: R.Progress, items: list[dict[str, Any]] | None = None, where: str = ""
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


def scoring_for(task, model_info: dict[str, Any]):
    """The task as this model's run scores it: a task that scores with models of its own (MMAU-Pro's judge) gets the
    registry to find them by name (tasks.contract.ModelSource); a shape-real model with random weights answers noise,
    so such a task gets a copy that does not run them."""
    random_size = model_info.get("weights") == "random" and not model_info.get("replica")
    if random_size and getattr(task, "model_scoring", False):
        task = copy.copy(task)
        task.model_scoring = False
    if getattr(task, "models", False) is None:
        from harness.models.source import RegistrySource

        task = copy.copy(task)
        task.models = RegistrySource()
    return task


def aggregate_with_ci(task, records, n_resamples: int, seed: int):
    """(metrics, categories) in the schema's shape; intervals from a bootstrap over the task's aggregate. A run
    whose items were all left unscored (`scoring_for`) gets its primary metric as null."""
    agg = task.aggregate(records)
    point = {k: R.number(v) for k, v in agg["metrics"].items() if R.is_number(v) and k not in COUNT_KEYS}
    unscored = bool(agg["metrics"].get("n_unscored"))
    if not point and not unscored:
        raise ValueError(f"task {task.name}: aggregate() returned no numeric metric ({agg['metrics']!r})")

    def statistics(rs):
        m = task.aggregate(rs)["metrics"]
        return {k: R.number(m.get(k)) for k in point}

    cis = stats.bootstrap_cis(records, statistics, n_resamples=n_resamples, seed=seed) if point else {}
    method = stats.ci_method_text(n_resamples)
    metrics = {
        k: {
            "value": v,
            "ci_low": cis[k][0],
            "ci_high": cis[k][1],
            "ci_method": method,
            "higher_is_better": R.higher_is_better(k, task),
            "n": len(records),
        }
        for k, v in point.items()
    }
    clusters = stats.clusters_of(records)  # items in clusters (a source dataset, a clip, a haystack): that interval too
    if clusters is not None and point:
        within = stats.bootstrap_cis_clustered(records, clusters, statistics, n_resamples=n_resamples, seed=seed)
        n = len(set(clusters))
        text = stats.ci_method_clustered_text(n, n_resamples)
        for k in point:
            metrics[k]["clustered"] = {"ci_low": within[k][0], "ci_high": within[k][1], "ci_method": text, "n": n}
    primary = getattr(task, "primary_metric", None)
    if unscored and primary and primary not in metrics:  # items left unscored (`scoring_for`): no value to give
        metrics[primary] = {
            "value": None,
            "ci_low": None,
            "ci_high": None,
            "ci_method": "not scored",
            "higher_is_better": R.higher_is_better(primary, task),
            "n": len(records),
        }
    categories = {}
    for cat, values in (agg.get("categories") or {}).items():
        n = int(values.get("n", sum(1 for r in records if r.get("category") == cat)))
        nums = {k: R.number(v) for k, v in values.items() if k != "n" and R.is_number(v)}
        categories[str(cat)] = {"n": n, "metrics": nums}
    return metrics, categories


def summary_table(results: list[dict[str, Any]]) -> str:
    """Plain-text table: one row per method with the primary metric, its interval and the system figures."""
    head = ["method", "metric", "value", "95% CI", "n", "bits/elt", "KV MiB", "tok/s", "wall s"]
    rows = [head]
    for r in results:
        m = r["metrics"][r["primary_metric"]]
        s = r["system"]
        ci = f"[{_fmt(m['ci_low'])}, {_fmt(m['ci_high'])}]" if m["ci_low"] is not None else "-"
        kv = s["kv_bytes"]["total"]
        rows.append(
            [
                r["method"]["name"],
                r["primary_metric"],
                _fmt(m["value"]),
                ci,
                str(m["n"]),
                _fmt(s["bits_per_element"]),
                _fmt(kv / 2**20 if kv is not None else None),
                _fmt(s["tokens_per_s"]),
                _fmt(s["wall_s"]),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    from tasks.base import failure_summary

    lines += [
        f"{r['method']['name']}: {f['n']} of {len(r['samples'])} items failed ({why}); first: {f['first']}"
        for r in results
        for why, f in failure_summary(r["samples"]).items()
    ]
    lines += [
        f"{r['method']['name']}: {p['world_size']} ranks ({', '.join(p['devices'])}): "
        f"{_fmt(p['items_per_s'])} items/s side by side, {_fmt(r['system']['items_per_s'])} per device"
        for r in results
        for p in [r["system"].get("parallel")]
        if p
    ]
    return "\n".join(lines)


def _fmt(x) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if abs(x) < 1e5 else f"{x:.3e}"
