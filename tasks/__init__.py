"""Task registry: name -> "module:attribute" of a Task object (see tasks.base.Task), imported lazily."""

from __future__ import annotations

import importlib

TASKS: dict[str, str] = {
    "ppl": "tasks.ppl:TASK",
    "ppl-4k": "tasks.ppl:TASK_LONG",
    "ocrbench": "tasks.ocrbench:TASK",
    "mmau-pro": "tasks.mmau_pro:TASK",
    "asr": "tasks.asr:TASK",
}


def list_tasks() -> list[str]:
    return sorted(TASKS)


def get_task(name: str):
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(list_tasks())}")
    module_name, attr = TASKS[name].split(":")
    return getattr(importlib.import_module(module_name), attr)
