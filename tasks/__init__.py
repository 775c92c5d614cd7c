"""Task registry: name -> "module:attribute" of a Task object (see tasks.base.Task), imported lazily."""

from __future__ import annotations

import importlib

TASKS: dict[str, str] = {
    "ppl": "tasks.ppl:TASK",
    "ppl-4k": "tasks.ppl:TASK_LONG",
    "ocrbench": "tasks.ocrbench:TASK",
    "mmau-pro": "tasks.mmau_pro:TASK",
    "asr": "tasks.asr:TASK",
    # RULER's needle-in-a-haystack, one task per context length (tasks/niah)
    "niah-4k": "tasks.niah:TASK_4K",
    "niah-8k": "tasks.niah:TASK_8K",
    "niah-16k": "tasks.niah:TASK_16K",
    "niah-32k": "tasks.niah:TASK_32K",
    "niah-64k": "tasks.niah:TASK_64K",
    "niah-128k": "tasks.niah:TASK_128K",
    "longbench-e": "tasks.longbench_e:TASK",
    "longbench-e-oscar": "tasks.longbench_e:TASK_OSCAR",
}


def list_tasks() -> list[str]:
    return sorted(TASKS)


def get_task(name: str):
    if name not in TASKS:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(list_tasks())}")
    module_name, attr = TASKS[name].split(":")
    return getattr(importlib.import_module(module_name), attr)
