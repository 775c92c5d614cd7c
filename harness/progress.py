"""Progress files: a run's records as they are scored, one JSON line each after a header with the run's identity,
beside the result they become (<method>.partial.jsonl, or one per rank of a data-parallel run). A run resumes from
its file; a file of another identity is refused."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.results import ResultFileError


def progress_path(result_path: Path | str, rank: int | None = None) -> Path:
    """The progress file of a result: <method>.partial.jsonl, or <method>.rank<r>.partial.jsonl for rank r of a
    data-parallel run."""
    p = Path(result_path)
    stem = p.name[: -len(".json")] if p.name.endswith(".json") else p.name
    return p.with_name(f"{stem}.partial.jsonl" if rank is None else f"{stem}.rank{int(rank)}.partial.jsonl")


def progress_paths(result_path: Path | str) -> list[Path]:
    """The progress files of a result that exist now: the one-process file and every rank's, sorted."""
    plain = progress_path(result_path)
    stem = plain.name[: -len(".partial.jsonl")]
    ranks = {}
    for p in plain.parent.glob(f"{stem}.rank*.partial.jsonl"):
        match = re.fullmatch(rf"{re.escape(stem)}\.rank(\d+)\.partial\.jsonl", p.name)
        if match:
            ranks[int(match.group(1))] = p
    return ([plain] if plain.exists() else []) + [ranks[r] for r in sorted(ranks)]


def _append_line(path: Path, obj: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _identity_diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """'key: old -> new' for each differing key; nested dicts (the method's config, the code parts) key by key."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _identity_diff(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return out


class Progress:
    """The records of one run so far; `add` appends and syncs one record."""

    def __init__(self, path: Path, identity: dict[str, Any], records: list[dict[str, Any]], failed: int = 0):
        self.path, self.identity, self.records = path, identity, records
        self.failed = failed  # items whose recorded attempt failed: not in `records`, so a resumed run tries them again

    @property
    def done_ids(self) -> set[str]:
        return {str(r["id"]) for r in self.records}

    def add(self, record: dict[str, Any]) -> None:
        _append_line(self.path, {"record": record})
        self.records.append(record)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def open_progress(path: Path | str, identity: dict[str, Any], restart: bool = False) -> Progress:
    """Open (resume) or create a progress file for a run with this identity."""
    path = Path(path)
    if restart:
        path.unlink(missing_ok=True)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _append_line(path, {"header": identity})
        return Progress(path, identity, [])
    header, records = _read_progress(path)
    diff = _identity_diff(header, identity)
    if diff:
        raise ResultFileError(
            f"{path}: an unfinished run with different settings is recorded here ({'; '.join(diff)}); "
            "rerun with --restart to discard it, or --out to write elsewhere"
        )
    # an item's last line counts, and a failed attempt is tried again: its cause (a missing file, a full disk) may have
    # been fixed since
    last = {str(r["id"]): r for r in records}
    kept = [r for r in last.values() if "error" not in r]
    return Progress(path, identity, kept, failed=len(last) - len(kept))


def progress_diff(path: Path, identity: dict[str, Any]) -> list[str]:
    """How the run recorded in the progress file `path` differs from `identity` (empty: the same run); an unreadable
    file differs."""
    try:
        header, _ = _read_progress(path)
    except (ResultFileError, OSError, KeyError, TypeError) as err:
        return [f"unreadable ({err})"]
    return _identity_diff(header, identity)


def progress_count(path: Path) -> int | None:
    """How many items the progress file `path` records, None when it cannot be read."""
    try:
        return len(_read_progress(path)[1])
    except (ResultFileError, OSError, KeyError, TypeError):
        return None


def _read_progress(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = path.read_text(encoding="utf-8").splitlines()
    objs = []
    for i, line in enumerate(lines):
        try:
            objs.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # the write in flight when the process died: that item reruns
                break
            raise ResultFileError(
                f"{path}: line {i + 1} is not JSON; delete the file or rerun with --restart"
            ) from None
    if not objs or "header" not in objs[0]:
        raise ResultFileError(f"{path}: no header line; delete the file or rerun with --restart")
    by_id: dict[str, dict[str, Any]] = {}
    for obj in objs[1:]:
        by_id[str(obj["record"]["id"])] = obj["record"]  # a repeated id (rerun after error) keeps the last
    return objs[0]["header"], list(by_id.values())


def records_in_order(records: Iterable[dict[str, Any]], ids: list[str]) -> list[dict[str, Any]]:
    """Records sorted into the task's item order (resumed runs append out of order)."""
    by_id = {str(r["id"]): r for r in records}
    return [by_id[i] for i in ids if i in by_id]
