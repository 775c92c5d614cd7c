"""What every task gives the harness.

A task is data plus pure functions: `load` returns items (dicts with a unique "id"), `run_item` turns
one item into a record (prediction + scores), `aggregate` turns records into metrics. Aggregation
never mutates module state, so scoring twice in one process gives the same numbers.
"""
from __future__ import annotations

from typing import Any, Protocol


class TaskDataError(RuntimeError):
    """The task's data could not be found or read; the message names the item or path and the fix."""


class TaskNotReady(RuntimeError):
    """Something the task scores with (a judge, an embedder) is missing; the message names it and the fix."""


class Task(Protocol):
    name: str
    version: int  # bumped whenever the prompt or the metric changes
    modalities: tuple[str, ...]  # input modalities the task needs, e.g. ("image", "text")

    def load(self, data: str | None, limit: int | None) -> list[dict[str, Any]]:
        """Items in a fixed order. `data`: None = the official data (local copy / warm HF cache),
        "generated" = the project's seeded small set, or a path."""

    def run_item(self, adapter: Any, method: Any, item: dict[str, Any]) -> dict[str, Any]:
        """One record: {"id", "prediction", "scores": {metric: float}, "category", ...}.
        A bad item returns {"id", "error": "<what and which item>"} instead of raising."""

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """{"metrics": {name: value}, "categories": {category: {metric: value, "n": int}}}."""

    def data_fingerprint(self, items: list[dict[str, Any]]) -> str:
        """A hash that changes when the items change."""

    def check_ready(self) -> None:
        """Called by the eval loop once before the first item. Raises TaskNotReady naming what is missing and
        how to fix it, so a scorer that cannot load stops the run before any item, not at the first item that
        needs it; cheap when all is there (it loads nothing heavy twice). Default: nothing to check."""

    def notes(self) -> list[str]:
        """Lines the result file carries about how this run's numbers may be read (e.g. a stand-in scorer: a
        pipeline check, not a score). Default: none."""
        return []


# What each model family's adapter reads (harness.models: their build_inputs refuse anything else).
FAMILY_READS: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "llava": ("image", "text"),
    "qwen3_vl": ("image", "text"),
    "qwen3_omni": ("audio", "image", "text"),
}


def refuse_unreadable(task: Any, model: str, specs: dict[str, Any]) -> None:
    """ValueError when model `model` (a key of `specs`, name -> ModelSpec) cannot read every modality
    `task.modalities` needs; the message names the models that can. Called before any weights load."""
    needs = set(getattr(task, "modalities", ()))
    family = specs[model].family
    if family not in FAMILY_READS:
        raise ValueError(f"model family {family!r} of {model} is missing from tasks.base.FAMILY_READS; "
                         "add what it reads")
    missing = needs - set(FAMILY_READS[family])
    if missing:
        able = sorted(name for name, spec in specs.items() if needs <= set(FAMILY_READS.get(spec.family, ())))
        raise ValueError(f"{model} cannot run {task.name}: it reads {', '.join(FAMILY_READS[family])}, the task needs "
                         f"{', '.join(sorted(needs))} (no {', '.join(sorted(missing))}); "
                         f"models that can: {', '.join(able) or 'none'}")


def failure_summary(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Failed records grouped by why: {failure kind: {"n": count, "first": first error text}}; the kind
    is the record's "failure" field when the task sets one, else "error"."""
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        if "error" in record:
            group = out.setdefault(str(record.get("failure") or "error"), {"n": 0, "first": record["error"]})
            group["n"] += 1
    return out
