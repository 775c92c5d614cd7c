"""`oscar-eval eval`: run a task on a model with one or more KV-cache methods and write result files.

    oscar-eval eval --model smollm2-135m --quant all [--task ppl] [--limit 20]

The model loads once; each method then runs every item (skipping items a crashed run already
recorded, see harness/results.py), aggregates with the task's own `aggregate`, adds bootstrap
intervals (harness/stats.py), system figures and the environment, and writes one validated result
per method. A summary table closes the run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from harness import distributed as D
from harness import results as R
from harness import stats
from harness.loop import RunContext, check_progress, run_method
from harness.options import kernel_options
from harness.record import scoring_for

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
