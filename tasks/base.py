"""What every task gives the harness.

A task is data plus pure functions: `load` returns items (dicts with a unique "id"), `run_item` turns
one item into a record (prediction + scores), `aggregate` turns records into metrics. Aggregation
never mutates module state, so scoring twice in one process gives the same numbers.
"""
from __future__ import annotations

from typing import Any, Protocol


class TaskDataError(RuntimeError):
    """The task's data could not be found or read; the message names the item or path and the fix."""


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
