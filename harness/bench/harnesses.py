"""`oscar-eval bench --what eval`: the harness against lmms-eval's own model classes, on the same items, the same
weights and the same device.

What an evaluator runs instead of `oscar-eval eval` is lmms-eval with its native model class: transformers'
`generate` with its default cache, lmms-eval's own batching and image processing. This bench saves the model's
seeded random weights once as a checkpoint with the processor the project builds offline (`save_checkpoint`), then
answers the task's first items with
- lmms-eval's native class loading that checkpoint (NATIVE: `qwen3_vl`, `llava_hf`), BF16, its own cache;
- the project's runner behind its lmms-eval plugin (harness/lmms.py) loading the same checkpoint, once per method:
  the runner `oscar-eval eval` runs (its cache, kernels, CUDA graphs and batch-invariant mode as the defaults pick),
  behind the same `generate_until` API.
Both get the same lmms-eval Instances (the task's prompt text and images, its max_new_tokens, greedy) at every batch
size asked for that the class supports (lmms-eval's `llava_hf` answers one request at a time). Like for like: each
system answers the first batch once untimed (its one-time costs: `setup_s`), then every item timed; loading is
timed apart. Per row: items/s and generated tokens/s of the timed span, peak device memory within it, the mean
prompt tokens each system built (lmms-eval's image processing may size an image differently from the adapter's:
the column shows whether the prompts match) and the share of answers equal to the native class's at the same batch.
"""

from __future__ import annotations

import functools
import gc
import importlib
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tasks.common import COMPLETE_MARKER, cache_root, ensure_built


@dataclass(frozen=True)
class Native:
    module: str
    cls: str
    name: str  # the name lmms-eval registers it under (--model)
    max_batch: int | None  # None: any
    needs: tuple[str, ...] = ()  # modules the class needs beyond lmms-eval's own (its processor's parts)


# lmms-eval's own class for each family that has one
NATIVE = {
    # AutoProcessor builds Qwen3-VL's video processor, which needs torchvision (never on a CPU machine: its CUDA build
    # breaks transformers there)
    "qwen3_vl": Native("lmms_eval.models.simple.qwen3_vl", "Qwen3_VL", "qwen3_vl", None, ("torchvision",)),
    "llava": Native("lmms_eval.models.simple.llava_hf", "LlavaHf", "llava_hf", 1),
}
PLUGIN = {"qwen3_vl": "OscarQwen3VL", "llava": "OscarLlava"}
TASK, SPLIT = "oscar_bench", "test"


def add_arguments(p) -> None:
    p.add_argument(
        "--eval-model",
        default="qwen3-vl-8b",
        help=f"with --what eval: a registered model of a family in {sorted(NATIVE)} (its tiny preset runs on a CPU)",
    )
    p.add_argument("--eval-task", default="ocrbench", help="with --what eval: the task whose items are answered")
    p.add_argument("--eval-data", default="generated-large", help="with --what eval: the task's data")
    p.add_argument("--eval-limit", type=int, default=16, help="with --what eval: the first N items")
    p.add_argument("--eval-batches", default="1,16", help="with --what eval: batch sizes (comma list)")
    p.add_argument("--eval-quant", default="bf16,oscar", help="with --what eval: the plugin's methods (comma list)")
    p.add_argument("--eval-max-new-tokens", type=int, default=None, help="with --what eval: default: the task's")
    p.add_argument(
        "--eval-checkpoint",
        default=None,
        help="with --what eval: the folder of the saved random weights (default: the project's cache, "
        "$OSCAR_EVAL_CACHE/checkpoints/<model>-seed<seed>); written once, reused after",
    )
    p.add_argument("--eval-seed", type=int, default=0)


def save_checkpoint(model: str, folder: Path, device: str, seed: int = 0) -> Path:
    """The model's seeded random weights (its tiny preset's for a tiny model) and processor saved under `folder`, as
    a checkpoint transformers' from_pretrained and lmms-eval's classes load. A folder that holds one is reused; a new
    one is written whole or not at all (tasks.common.ensure_built)."""
    from harness import models as M

    if (folder / "config.json").is_file():
        return folder

    def build(tmp: Path) -> None:
        print(f"saving {model}'s random weights (seed {seed}) to {folder}", flush=True)
        adapter = M.load(model, weights="random", device=device, seed=seed)
        adapter.model.save_pretrained(tmp)
        save_processor(adapter.processor, tmp)
        (tmp / COMPLETE_MARKER).touch()

    ensure_built(folder.name, build, root=folder.parent)
    _release()
    return folder


def save_processor(processor, folder: Path) -> None:
    """processor.save_pretrained, leaving out the parts this machine's transformers could not build (Qwen3-VL's video
    processor needs torchvision, which a CPU machine must not install): transformers' save reads every part the
    processor class declares, and fails on a missing one."""
    present = [n for n in processor.get_attributes() if getattr(processor, n, None) is not None]
    if len(present) < len(processor.get_attributes()):
        processor.get_attributes = lambda: present  # this object only: the adapter that holds it is dropped after
    processor.save_pretrained(folder)


def instances(model: str, task_name: str, data: str, limit: int, max_new_tokens: int | None):
    """(lmms-eval Instances, their docs, the requests) of the task's first `limit` items: one Instance a request,
    the prompt text as the context, its images as the doc's visuals."""
    from lmms_eval.api.instance import Instance

    import tasks as T

    task = T.get_task(task_name)
    requests = [r for item in task.load(data, limit) for r in task.requests(item)]
    docs, out = [], []
    for i, r in enumerate(requests):
        if r.prompt.audios:
            raise ValueError(f"{task_name}: audio prompts have no native lmms-eval class here; pick an image task")
        docs.append({"visuals": list(r.prompt.images)})
        kwargs = {
            "max_new_tokens": max_new_tokens or r.max_new_tokens,
            "temperature": 0,
            "do_sample": False,
            "until": list(r.stop) or ["\n\n"],
        }
        args = (r.prompt.text, kwargs, _visuals, i, TASK, SPLIT)
        out.append(Instance("generate_until", args, idx=0, metadata={"task": TASK, "doc_id": i, "repeats": 1}))
    return out, docs, requests


def _visuals(doc):
    return doc["visuals"]


class Counter:
    """Prompt and generated tokens of the calls it wraps (a native class's `generate`, the plugin's runner)."""

    def __init__(self):
        self.prompt = self.generated = self.rows = 0

    def wrap_generate(self, model):
        inner = model.generate

        def generate(*args, **kwargs):
            out = inner(*args, **kwargs)
            ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
            if ids is not None:
                self.rows += ids.shape[0]
                self.prompt += int(mask.sum()) if mask is not None else ids.numel()
                self.generated += (out.shape[1] - ids.shape[1]) * ids.shape[0]
            return out

        model.generate = generate

    def wrap_runner(self, runner):
        inner = runner.generate

        def generate(batch):
            responses = inner(batch)
            self.rows += len(responses)
            self.prompt += sum(r.input_tokens or 0 for r in responses)
            self.generated += sum(r.new_tokens or 0 for r in responses)
            return responses

        runner.generate = generate


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def check_native(native: Native) -> None:
    """The native class imports here, with what it needs: checked before a checkpoint is saved or a model loads, and
    named when it does not (lmms-eval's registry imports `evaluate`, hence `datasets` and pyarrow)."""
    missing = [m for m in native.needs if importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(f"lmms-eval's {native.name} class needs {', '.join(missing)}, which is not installed here")
    try:
        importlib.import_module(native.module)
    except ImportError as err:
        raise SystemExit(
            f"lmms-eval's {native.name} class does not import here ({type(err).__name__}: {err}); install "
            "lmms-eval with its dependencies: pip install lmms-eval==0.7.3"
        ) from err


def _native(family: str, folder: Path, device: str, batch: int):
    spec = NATIVE[family]
    cls = getattr(importlib.import_module(spec.module), spec.cls)
    if family == "qwen3_vl":
        return cls(
            pretrained=str(folder), device=device, device_map=device, batch_size=batch, attn_implementation="sdpa"
        )
    # llava_hf's default device_map "" is refused by transformers 5: name the device. It sends the prompt as one
    # string, which the project's saved template (typed content parts, as transformers' processors take) renders
    # empty: give it lmms-eval's own Vicuna template, its choice for a tokenizer without one
    module = importlib.import_module(spec.module)
    return cls(
        pretrained=str(folder),
        device=device,
        device_map=device,
        dtype="bfloat16",
        batch_size=batch,
        attn_implementation="sdpa",
        chat_template=module.VICUNA_CHAT_TEMPLATE,
    )


def _plugin(family: str, model: str, folder: Path, device: str, batch: int, method: str, max_new_tokens: int):
    from harness import lmms
    from harness import models as M

    # a tiny preset has no files: it loads the same seeded weights the checkpoint holds
    path = None if M.get_spec(model).hub_id.startswith("random:") else str(folder)
    cls = getattr(lmms, PLUGIN[family])
    return cls(
        model=model,
        quant=method,
        model_path=path,
        device=device,
        dtype="bf16",
        batch_size=batch,
        max_new_tokens=max_new_tokens,
    )


def time_system(make, reqs, docs, batch: int, device: str, hook) -> dict[str, Any]:
    """Load (timed apart), answer the first batch untimed, then every request timed; the answers and figures."""
    t0 = time.perf_counter()
    lm = make()
    lm.task_dict = {TASK: {SPLIT: docs}}
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    lm.generate_until(reqs[:batch])
    _sync(device)
    setup_s = time.perf_counter() - t0
    counter = Counter()
    hook(lm, counter)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    answers = lm.generate_until(reqs)
    _sync(device)
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    if hasattr(lm, "clean"):
        lm.clean()
    del lm
    _release()
    return {
        "load_s": load_s,
        "setup_s": setup_s,
        "wall_s": wall,
        "items_per_s": len(reqs) / wall,
        "new_tokens_per_s": counter.generated / wall,
        "prompt_tokens_mean": counter.prompt / counter.rows if counter.rows else None,
        "peak_bytes": peak,
        "answers": answers,
    }


def run_eval(args) -> dict[str, Any]:
    """Every system at every batch; the table printed, the rows returned (answers left out)."""
    from harness import models as M

    model = args.eval_model
    family = M.get_spec(model).family
    if family not in NATIVE:
        raise SystemExit(
            f"--eval-model {model}: family {family!r} has no native lmms-eval class here; "
            f"pick a model of {sorted(NATIVE)}"
        )
    check_native(NATIVE[family])
    device = getattr(args, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
    folder = Path(args.eval_checkpoint or cache_root() / "checkpoints" / f"{model}-seed{args.eval_seed}")
    save_checkpoint(model, folder, device, args.eval_seed)
    reqs, docs, requests = instances(model, args.eval_task, args.eval_data, args.eval_limit, args.eval_max_new_tokens)
    new_tokens = args.eval_max_new_tokens or requests[0].max_new_tokens
    batches = [int(b) for b in str(args.eval_batches).split(",") if b.strip()]
    methods = [m.strip() for m in args.eval_quant.split(",") if m.strip()]
    native = NATIVE[family]
    rows, native_answers = [], {}
    for batch in batches:
        if native.max_batch is None or batch <= native.max_batch:
            print(f"lmms-eval {native.name}, batch {batch} ...", flush=True)
            make = functools.partial(_native, family, folder, device, batch)
            row = time_system(make, reqs, docs, batch, device, lambda lm, c: c.wrap_generate(lm.model))
            native_answers[batch] = row["answers"]
            rows.append(
                {"system": f"lmms-eval {native.name}", "method": "bf16 (transformers' cache)", "batch": batch, **row}
            )
        for method in methods:
            print(f"oscar-eval plugin {method}, batch {batch} ...", flush=True)
            make = functools.partial(_plugin, family, model, folder, device, batch, method, new_tokens)
            row = time_system(make, reqs, docs, batch, device, lambda lm, c: c.wrap_runner(lm.runner))
            rows.append({"system": "oscar-eval (lmms-eval plugin)", "method": method, "batch": batch, **row})
    for row in rows:
        ref = native_answers.get(row["batch"])
        answers = row.pop("answers")
        row["same_answers_as_native"] = (
            sum(a == b for a, b in zip(answers, ref)) / len(ref) if ref is not None else None
        )
    print(table(rows))
    return {
        "model": model,
        "weights": f"random, seed {args.eval_seed}",
        "task": args.eval_task,
        "data": args.eval_data,
        "items": len(reqs),
        "max_new_tokens": new_tokens,
        "device": device,
        "rows": rows,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = ["system", "method", "batch", "items/s", "new tok/s", "prompt tok", "peak GiB", "setup s", "same answers"]
    lines = [head]
    for r in rows:
        same = r["same_answers_as_native"]
        lines.append(
            [
                r["system"],
                r["method"],
                str(r["batch"]),
                f"{r['items_per_s']:.3f}",
                f"{r['new_tokens_per_s']:.1f}",
                f"{r['prompt_tokens_mean']:.0f}" if r["prompt_tokens_mean"] is not None else "-",
                f"{r['peak_bytes'] / 2**30:.2f}" if r["peak_bytes"] is not None else "-",
                f"{r['setup_s']:.1f}",
                f"{same:.0%}" if same is not None else "-",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines)
