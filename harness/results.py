"""Result files: the JSON Schema, validation on write and read, predictable paths, resume, migration.

Layout (relative to the repository root, all predictable from the run's names):
    results/runs/<task>[.<data>]/<model>/<method>.json          final result (schema: harness/schema.json)
    results/runs/<task>[.<data>]/<model>/<method>.partial.jsonl progress while running (git-ignored)
    results/runs/<task>[.<data>]/<model>/<method>.rank<r>.partial.jsonl  rank r's under torchrun (distributed.py)
`<data>` is omitted for the official data and is `generated` or `custom` otherwise, so runs on the
project's small generated sets never overwrite runs on the real benchmark.

The progress file is JSON lines: first {"header": identity}, then one {"record": ...} per finished item,
each flushed and fsync'ed, so a crash loses at most the item in flight. A rerun with the same identity
skips the recorded ids; a different identity is refused (the message names the fields that differ).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import jsonschema

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA_PATH = Path(str(importlib.resources.files("harness"))) / "schema.json"  # package data, in the wheel too
SCHEMA_VERSION = 1
RUNS_DIR = Path("results") / "runs"
# Metrics where smaller is better; a task may add names with a `lower_is_better` attribute.
LOWER_IS_BETTER = frozenset({"ppl", "perplexity", "nll", "loss", "wer", "cer", "bpb", "error_rate"})


class ResultFileError(ValueError):
    """A result or progress file is invalid, from another schema version, or from another run."""


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        return json.load(f)


def validate(result: dict[str, Any], where: str = "result") -> None:
    """Raise ResultFileError naming the first offending field (as a JSON path) and the rule it breaks."""
    validator = jsonschema.Draft202012Validator(schema(), format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(result), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        field = "$" + "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ResultFileError(f"{where}: {field}: {err.message}{more}; see {SCHEMA_PATH.name} in results/")


def higher_is_better(metric: str, task: Any = None) -> bool:
    lower = set(LOWER_IS_BETTER) | set(getattr(task, "lower_is_better", ()) or ())
    return metric.lower() not in lower


def data_kind(data: str | None) -> str:
    """'official' for the benchmark's own data, 'generated' / 'generated-large' for the project's sets (the second
    with items at the real benchmark's sizes), else 'custom'."""
    if data is None or data == "official":
        return "official"
    return data if data in ("generated", "generated-large") else "custom"


def task_dir(task_name: str, data: str | None, fingerprint: str | None = None) -> str:
    """The result folder of a task's data: the task's name, with the kind of data after a "." and, for custom data,
    the first 8 digits of its content digest (`fingerprint`: two folders of other items never share a folder)."""
    kind = data_kind(data)
    if kind == "custom" and fingerprint:
        kind += "-" + fingerprint.split(":")[-1][:8]
    return task_name if kind == "official" else f"{task_name}.{kind}"


def run_path(task_name: str, data: str | None, model: str, method: str, root: Path | str = RUNS_DIR) -> Path:
    for label, value in (("task", task_name), ("model", model), ("method", method)):
        if not value or "/" in value or value.startswith("."):
            raise ValueError(f"{label} name {value!r} cannot be used in a result path (no '/', no leading '.')")
    return Path(root) / task_dir(task_name, data) / model / f"{method}.json"


# ---------------------------------------------------------------- writing and reading final results


def write_result(result: dict[str, Any], path: Path | str) -> Path:
    """Validate, then write atomically (temp file + rename) so readers never see half a file."""
    path = Path(path)
    validate(result, where=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, sort_keys=False, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)
    return path


# Migrations from schema version v to v + 1: {v: function(result) -> result}. None exist yet: version 1
# is the first published schema. A file older than the oldest migration is refused.
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


def migrate(result: dict[str, Any], where: str = "result") -> dict[str, Any]:
    """Bring a result to SCHEMA_VERSION through MIGRATIONS, or raise a message saying what to do."""
    version = result.get("schema_version") if isinstance(result, dict) else None
    if not isinstance(version, int):
        raise ResultFileError(f"{where}: not an oscar-eval result file (no integer 'schema_version')")
    if version > SCHEMA_VERSION:
        raise ResultFileError(
            f"{where}: written with result schema v{version}, this oscar-eval reads up to v{SCHEMA_VERSION}; "
            "upgrade oscar-eval (git pull; pip install -e .) to read it"
        )
    while version < SCHEMA_VERSION:
        if version not in MIGRATIONS:
            raise ResultFileError(
                f"{where}: result schema v{version} has no migration to v{SCHEMA_VERSION}; "
                "rerun the evaluation (oscar-eval eval ...) to write a current file"
            )
        result = MIGRATIONS[version](result)
        version += 1
        result["schema_version"] = version
    return result


def read_result(path: Path | str) -> dict[str, Any]:
    """Load, migrate and validate one result file."""
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
    except FileNotFoundError:
        raise ResultFileError(f"{path}: no such result file") from None
    except json.JSONDecodeError as e:
        raise ResultFileError(f"{path}: not valid JSON ({e})") from None
    result = migrate(result, where=str(path))
    validate(result, where=str(path))
    return result


def find_results(root: Path | str = RUNS_DIR) -> list[Path]:
    """Every final result file under root, sorted (progress and temp files excluded)."""
    root = Path(root)
    if not root.exists():
        return []
    return sorted(p for p in root.rglob("*.json") if p.is_file())


# ---------------------------------------------------------------- progress files (resume)


# ---------------------------------------------------------------- what a result records about its run


def jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy/torch scalars -> Python numbers, NaN/inf -> None, tuples -> lists,
    anything else unknown (dtypes, paths) -> its string."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "tolist"):  # numpy / torch scalars and arrays
        return jsonable(obj.tolist())
    return str(obj)


def is_number(x: Any) -> bool:
    return isinstance(jsonable(x), (int, float)) and not isinstance(jsonable(x), bool)


def number(x: Any) -> float | None:
    """A finite float, or None for missing / NaN / non-numeric values."""
    x = jsonable(x)
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def weight_hash(model: Any, sample: int = 4096) -> str:
    """sha256 over each parameter's name, shape, dtype and `sample` evenly strided elements (as fp32).

    A sample, not every byte: hashing all 16 GB of an 8B model would cost longer than many runs;
    any retraining, re-quantization or different random init changes the sampled values. The model must be as
    loaded: runners give it back so (harness/runner.py: quant.prepare_model is undone on close).
    """
    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            flat = p.detach().reshape(-1)
            step = max(1, flat.numel() // sample)
            h.update(f"{name}|{tuple(p.shape)}|{p.dtype}|".encode())
            h.update(flat[::step][:sample].to(torch.float32).cpu().numpy().tobytes())
    return "sha256-sampled:" + h.hexdigest()


def model_info(adapter: Any) -> dict[str, Any]:
    spec = adapter.spec
    config = getattr(adapter.model, "config", None)
    return {
        "name": spec.name,
        "hub_id": spec.hub_id,
        "family": spec.family,
        "revision": getattr(config, "_commit_hash", None),
        "weight_hash": weight_hash(adapter.model),
        # Replicas are registered as "tiny-<family>" (harness/models/tiny.py) or flag themselves.
        "replica": bool(
            getattr(adapter, "replica", False) or getattr(spec, "replica", False) or spec.name.startswith("tiny-")
        ),
        # "random": seeded random weights (shape-real models, harness/models/synthetic.py; tiny replicas): the run
        # measures speed, memory and the code path, never accuracy.
        "weights": getattr(adapter, "weights", "real"),
    }


def model_dir(info: dict[str, Any]) -> str:
    """The result folder of a model: its name, with ".random" for a shape-real model with random weights, so such a
    run never overwrites (or passes for) the real checkpoint's result. Tiny replicas keep their own names."""
    random = info.get("weights") == "random" and not info.get("replica")
    return f"{info['name']}.random" if random else info["name"]


def notes(model: dict[str, Any], data: str | None) -> list[str]:
    out = []
    if model["replica"]:
        out.append("tiny random-weight replica: shows the pipeline works, not model quality")
    elif model.get("weights") == "random":
        out.append(
            "shape-real model with seeded random weights: speed, memory and the code path taken; its scores "
            "mean nothing and never enter accuracy tables"
        )
    if data_kind(data).startswith("generated"):
        out.append("the project's generated test set in the benchmark's schema, not the benchmark's data")
    return out


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def kv_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean measured cache bytes per item (total, quantized, full precision, per modality) and the largest."""
    kvs = [r["kv_bytes"] for r in records if isinstance(r.get("kv_bytes"), dict) and r["kv_bytes"]]
    out: dict[str, Any] = {
        k: _mean([number(kv.get(k)) for kv in kvs if number(kv.get(k)) is not None])
        for k in ("total", "quantized", "full_precision")
    }
    totals = [number(kv.get("total")) for kv in kvs if number(kv.get("total")) is not None]
    out["max_total"] = max(totals) if totals else None
    per_mod: dict[str, list[float]] = {}
    for kv in kvs:
        for mod, n in (kv.get("per_modality") or {}).items():
            if number(n) is not None:
                per_mod.setdefault(mod, []).append(number(n))
    out["per_modality"] = {mod: _mean(v) for mod, v in per_mod.items()}
    return out


def _tokens(record: dict[str, Any]) -> tuple[int, int]:
    """(tokens processed, tokens generated) of one record: input positions (input_tokens, else the sum
    of modality_tokens, else scored n_tokens) plus generated ones."""
    new = int(record.get("new_tokens") or 0)
    if "input_tokens" in record:
        return int(record["input_tokens"]) + new, new
    if record.get("modality_tokens"):
        return sum(int(n) for n in record["modality_tokens"].values()) + new, new
    return int(number((record.get("scores") or {}).get("n_tokens")) or 0) + new, new


def system_figures(records: list[dict[str, Any]], adapter: Any) -> dict[str, Any]:
    """KV bytes, bits per element, wall time, throughput, peak memory, device (schema: system)."""
    loop = sum(number(r.get("loop_s")) or 0.0 for r in records)
    wall = sum(number(r.get("wall_s")) or 0.0 for r in records)
    processed, generated = (sum(t) for t in zip(*(_tokens(r) for r in records))) if records else (0, 0)
    bpe = [number(r.get("bits_per_element", (r.get("kv_bytes") or {}).get("bits_per_element"))) for r in records]
    bpe = [b for b in bpe if b is not None]
    decode_steps = sum(max(int(r.get("new_tokens") or 0) - 1, 0) for r in records)
    graphed = sum(int(r.get("graph_steps") or 0) for r in records)
    costs = cost_figures(records, loop)
    memory = peak_memory()  # each generate resets the allocator's peak: the run's is the largest item's
    if costs.get("peak_item_cuda_bytes") is not None:
        memory["cuda_bytes"] = max(costs["peak_item_cuda_bytes"], memory["cuda_bytes"] or 0)
    return {
        "kv_bytes": kv_summary(records),
        "bits_per_element": _mean(bpe),
        "wall_s": loop,
        "tokens_per_s": processed / wall if processed and wall > 0 else None,
        "new_tokens_per_s": generated / wall if generated and wall > 0 else None,
        "graph_decode_share": graphed / decode_steps if decode_steps else None,
        **costs,
        "peak_memory": memory,
        "device": str(getattr(adapter, "device", None) or next(adapter.model.parameters()).device),
    }


def cost_figures(records: list[dict[str, Any]], loop_s: float) -> dict[str, Any]:
    """Run-level cost from the items' `cost` records (harness/models/cost.py): items per second of the loop's clock,
    summed prefill and decode seconds, decode steps per second of decode time, the share of decode steps on the
    kernel path, the largest per-item GPU peak. Only items_per_s when no item recorded a cost.
    items_per_s_steady: where the run warmed up first (a GPU run, harness.loop.warm_up: its seconds are `setup_s`,
    carried by the first timed record of each process) every item; else it leaves out the first generate call's
    items (its batch): what a method pays once per run is not per item, and a whole benchmark's time is the steady
    rate's. TTFT counts the items that ran their own prefill (not one another method of the run ran for them)."""
    out: dict[str, Any] = {"items_per_s": len(records) / loop_s if records and loop_s > 0 else None}
    setups = [number(r["setup_s"]) or 0.0 for r in records if "setup_s" in r]
    first = records[0].get("cost") if records else None
    skip = 0 if setups else int(first.get("batch") or 1) if isinstance(first, dict) else 1
    if setups:
        out["setup_s"] = sum(setups)
    rest = [number(r.get("loop_s")) for r in records[skip:]]
    if rest and all(t is not None for t in rest) and sum(rest) > 0:
        out["items_per_s_steady"] = len(rest) / sum(rest)
    costs = [r["cost"] for r in records if isinstance(r.get("cost"), dict)]
    if not costs:
        return out
    prefill = sum(number(c.get("prefill_s")) or 0.0 for c in costs)
    decode = sum(number(c.get("decode_s")) or 0.0 for c in costs)
    steps = sum(int(c.get("decode_steps") or 0) for c in costs)
    kernel = sum(int(c.get("kernel_steps") or 0) for c in costs)
    peaks = [int(c["peak_cuda_bytes"]) for c in costs if c.get("peak_cuda_bytes") is not None]
    for name in ("ttft_s", "tpot_s"):  # per item as serving engines report them; the median: a batch's are shared
        own = [c for c in costs if not (name == "ttft_s" and c.get("prefill_reused"))]
        values = sorted(v for c in own if (v := number(c.get(name))) is not None)
        if values:
            out[f"{name}_median"] = statistics.median(values)
    out.update(
        prefill_s=prefill,
        decode_s=decode,
        decode_steps_per_s=steps / decode if steps and decode > 0 else None,
        kernel_step_share=kernel / steps if steps else None,
        peak_item_cuda_bytes=max(peaks) if peaks else None,
    )
    return out


def reset_peak_memory() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> dict[str, int | None]:
    """Peak resident set of this process (model load included: Linux reports it in KiB) and the CUDA
    allocator's peak since the method started (reset_peak_memory), None without a GPU."""
    import resource

    import torch

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    cuda = int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return {"cpu_rss_bytes": int(rss), "cuda_bytes": cuda}


PACKAGES = ("oscar-eval", "torch", "transformers", "triton", "accelerate", "numpy", "gguf", "librosa", "jsonschema")


def environment(kernels=None) -> dict[str, Any]:
    """Versions, machine, git state and the run's kernel options as given (quant.kernels.KernelOptions.to_dict();
    what each does: `kernel_switches`)."""
    import torch

    from quant.kernels.options import KernelOptions

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    commit, dirty = git_state()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "gpu": gpu,
        "packages": versions,
        "git_commit": commit,
        "git_dirty": dirty,
        "kernels": (kernels or KernelOptions()).to_dict(),
    }


def kernel_switches(options=None) -> dict[str, bool]:
    """The run's kernel options (quant.kernels.KernelOptions; default: the defaults) as the booleans a result
    records (the backend is recorded beside them). fused_norm / fused_rope / fused_linear: the model-level kernels
    harness.models.load puts under a model on a GPU (the fused linear layers sum in another order than cuBLAS, so GPU
    results with and without them can differ in the last bits); cuda_norm_rope: the norms and RoPE launch the CUDA
    kernels rather than the Triton ones (another summation order in the norm); cuda_graphs: kernel-path decode steps
    replay CUDA graphs (the same numbers, less host time); wide_decode: decode steps of a few rows may run the 8-warp
    CUDA build (another split plan, so other last bits). They act on a GPU only."""
    from quant.kernels.options import KernelOptions

    o = options or KernelOptions()
    return {
        "fused_norm": o.fused_norm,
        "fused_rope": o.fused_rope,
        "fused_linear": o.fused_linear,
        "cuda_graphs": o.cuda_graphs,
        "cuda_norm_rope": o.layer_kernels == "cuda",
        "wide_decode": o.wide_decode,
    }


def cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return platform.processor() or None


def git_state() -> tuple[str | None, bool | None]:
    """(HEAD commit, tracked files modified?) of the checkout holding this code; (None, None) outside one (an
    installed wheel: the folder above the package is site-packages, which may sit inside some other repository)."""
    if not (REPO_ROOT / ".git").exists():
        return None, None

    def git(*args):
        return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "--verify", "HEAD")
        if head.returncode != 0:
            return None, None
        status = git("status", "--porcelain", "--untracked-files=no")
        return head.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        return None, None
