"""What every task gives the harness.

A task is data plus pure functions: `load` returns items (dicts with a unique "id"), `requests` turns one item into
what to ask a model (tasks/contract.py: Generate, Score), `record` turns the item and its responses into a record
(prediction + scores), `aggregate` turns records into metrics. A task never calls a model: the eval loop batches the
requests of many items and runs them (harness/run.py, harness/runner.py). Aggregation never mutates module state, so
scoring twice in one process gives the same numbers.
"""

from __future__ import annotations

from typing import Any, Protocol

from tasks.contract import Request, Response


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

    def requests(self, item: dict[str, Any]) -> list[Request]:
        """What to ask for `item` (its prompts built here, once). Raises TaskDataError naming the item when it
        cannot be asked (an unreadable image or clip); an empty list for an item left out of every number."""

    def record(self, item: dict[str, Any], responses: list[Response], error: str | None = None) -> dict[str, Any]:
        """One record from the item's responses (in the order of `requests`): {"id", "prediction",
        "scores": {metric: float}, "category", ...}. `error`: why the item's requests could not be built (then
        `responses` is empty); a response may carry its own error. A failed item gives {"id", "error": "<what and
        which item>"} (plus whatever the official scorer does with a missing answer), never an exception."""

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """{"metrics": {name: value}, "categories": {category: {metric: value, "n": int}}}."""

    def data_fingerprint(self, items: list[dict[str, Any]]) -> str:
        """A hash that changes when the items change."""

    # Requests per model call when the run does not say (--batch-size), or None: the model's own default. Perplexity
    # windows are scored several at a time by default (their forwards are the work; rows of one length, no padding).
    default_batch_size: int | None = None

    def check_ready(self) -> None:
        """Called by the eval loop once before the first item. Raises TaskNotReady naming what is missing and
        how to fix it, so a scorer that cannot load stops the run before any item, not at the first item that
        needs it; cheap when all is there (it loads nothing heavy twice). Default: nothing to check."""

    def notes(self) -> list[str]:
        """Lines the result file carries about how this run's numbers may be read (e.g. a stand-in scorer: a
        pipeline check, not a score). Default: none."""
        return []


def failure_summary(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Failed records grouped by why: {failure kind: {"n": count, "first": first error text}}; the kind
    is the record's "failure" field when the task sets one, else "error"."""
    out: dict[str, dict[str, Any]] = {}
    for record in records:
        if "error" in record:
            group = out.setdefault(str(record.get("failure") or "error"), {"n": 0, "first": record["error"]})
            group["n"] += 1
    return out
