"""Reading LongBench-E's official files offline.

The data is the hub dataset THUDM/LongBench's data.zip, unzipped: `data/<name>_e.jsonl` for the 13 sets
(tasks/longbench_e/prompts.py: DATASETS, in pred.py's order). A path may be that folder, the folder above it, or the
zip itself. For `data=None` the path comes from $LONGBENCH_PATH, else from a warm Hugging Face cache of the hub dataset
(its data.zip, read in place; nothing is downloaded).

Each line is one row: `input`, `context`, `answers` (list), `length` (words of input + context + answers), `dataset`,
`language`, `all_classes` (trec's class list, else null), `_id`. An item is the row plus "id" (`<set>/<_id>`), "dataset"
(the set's name without `_e`, also its category), "all_classes" (the file's last row's: eval.py keeps the last row's
value of the prediction file) and "source" (`file:line`). A line that is not such a row becomes an item with
"load_error" (file and line number), which fails alone when the run asks for it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any, Iterable

from tasks import common
from tasks.base import TaskDataError
from tasks.longbench_e.prompts import DATASETS

HUB_ID = "THUDM/LongBench"
ENV_PATH = "LONGBENCH_PATH"
HOW_TO = (
    f"download data.zip of the hub dataset {HUB_ID} (huggingface.co/datasets/{HUB_ID}/resolve/main/data.zip) on a "
    f"machine with network, unzip it, and pass --data <folder> (or set {ENV_PATH}) to the folder holding "
    "data/qasper_e.jsonl; or use --data generated for the project's small set"
)
FIELDS = ("input", "context", "answers", "length", "all_classes", "_id")


def file_name(dataset: str) -> str:
    return f"{dataset}_e.jsonl"


def load_items(data: str | None, limit: int | None = None, datasets: Iterable[str] = DATASETS) -> list[dict[str, Any]]:
    """Items of `datasets` (in the official order) from `data`: None = the official data, "generated" = the project's
    set, else a path."""
    from tasks.longbench_e.generate import ensure_generated

    names = tuple(datasets)
    return common.load_items(
        data,
        limit,
        load_path=lambda path: load_path(path, names),
        load_official=lambda: load_official(names),
        generated=ensure_generated,
    )


def load_official(datasets: tuple[str, ...] = DATASETS) -> list[dict[str, Any]]:
    """From $LONGBENCH_PATH, else the hub dataset's data.zip in a warm HF cache; else a one-line fix."""
    if os.environ.get(ENV_PATH):
        return load_path(Path(os.environ[ENV_PATH]), datasets)
    snapshot = common.hub_snapshot(HUB_ID)
    if snapshot is not None and (snapshot / "data.zip").is_file():
        return load_path(snapshot / "data.zip", datasets)
    raise TaskDataError(f"LongBench-E data not found ({ENV_PATH} unset, {HUB_ID} not in the HF cache): {HOW_TO}")


def _lines_of_zip(path: Path, datasets: tuple[str, ...]) -> dict[str, tuple[str, list[str]]]:
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise TaskDataError(f"cannot open {str(path)!r} as a zip ({exc}); {HOW_TO}") from exc
    with archive:
        members = {Path(m).name: m for m in archive.namelist()}
        out = {}
        for name in datasets:
            member = members.get(file_name(name))
            if member is None:
                raise TaskDataError(f"{str(path)!r} holds no {file_name(name)}; {HOW_TO}")
            with archive.open(member) as f:
                text = io.TextIOWrapper(f, encoding="utf-8").read()
            out[name] = (f"{path}:{member}", text.splitlines())
        return out


def _lines_of_folder(path: Path, datasets: tuple[str, ...]) -> dict[str, tuple[str, list[str]]]:
    out = {}
    for name in datasets:
        candidates = [path / file_name(name), path / "data" / file_name(name)]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise TaskDataError(
                f"LongBench-E file {file_name(name)} not found in {str(path)!r} nor in its data/ folder; {HOW_TO}"
            )
        try:
            out[name] = (str(found), found.read_text(encoding="utf-8").splitlines())
        except (OSError, UnicodeDecodeError) as exc:
            raise TaskDataError(f"cannot read {str(found)!r} ({exc}); {HOW_TO}") from exc
    return out


def load_path(path: Path, datasets: tuple[str, ...] = DATASETS) -> list[dict[str, Any]]:
    """Every set's items from a folder (files in it or in its data/) or a zip; a missing file is a TaskDataError."""
    path = Path(path).expanduser()
    if not path.exists():
        raise TaskDataError(f"LongBench-E path {str(path)!r} does not exist; {HOW_TO}")
    lines = _lines_of_zip(path, datasets) if path.is_file() else _lines_of_folder(path, datasets)
    items: list[dict[str, Any]] = []
    for name in datasets:
        where, text = lines[name]
        items += read_rows(name, where, text)
    return items


def _row_problem(row: Any) -> str | None:
    """Why a parsed line is not a LongBench row, or None."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not an object"
    missing = [k for k in FIELDS if k not in row]
    if missing:
        return f"lacks {missing}"
    if not isinstance(row["answers"], list) or not row["answers"]:
        return "answers is not a non-empty list"
    if isinstance(row["length"], bool) or not isinstance(row["length"], (int, float)):
        return f"length {row['length']!r} is not a number"
    if not all(isinstance(row[k], str) for k in ("input", "context")):
        return "input and context must be strings"
    return None


def read_rows(dataset: str, where: str, lines: list[str]) -> list[dict[str, Any]]:
    """One item per non-blank line of a set's file (`where` names it in errors)."""
    parsed: list[tuple[int, Any, str | None]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            parsed.append((number, None, f"not JSON ({exc})"))
            continue
        parsed.append((number, row, _row_problem(row)))
    good = [row for _, row, problem in parsed if problem is None]
    all_classes = good[-1]["all_classes"] if good else None
    items, seen = [], {}
    for number, row, problem in parsed:
        source = f"{where}:{number}"
        uid = f"{dataset}/{row['_id']}" if problem is None else f"{dataset}/line{number}"
        if problem is None and uid in seen:
            problem, uid = f"_id {row['_id']!r} repeats line {seen[uid]}", f"{uid}#line{number}"
        if problem is not None:
            items.append({"id": uid, "dataset": dataset, "category": dataset, "source": source, "load_error": problem})
            continue
        seen[uid] = number
        items.append(
            {
                "id": uid,
                "dataset": dataset,
                "category": dataset,
                "source": source,
                "input": row["input"],
                "context": row["context"],
                "answers": list(row["answers"]),
                "length": row["length"],
                "all_classes": all_classes,
                "_id": row["_id"],
            }
        )
    return items


def fingerprint(items: list[dict[str, Any]]) -> str:
    """sha256 over every item's fields that prompts and scoring read."""
    h = hashlib.sha256()
    for item in items:
        fields = [item.get(k) for k in ("id", "input", "context", "answers", "length", "all_classes", "load_error")]
        h.update(json.dumps(fields, ensure_ascii=False).encode())
    return h.hexdigest()
