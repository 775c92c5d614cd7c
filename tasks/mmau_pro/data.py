"""Finding and reading MMAU-Pro offline.

`data=None` (the official data) looks, in order, at MMAU_PRO_PATH and at the warm Hugging Face
cache of the hub dataset `gamma-lab-umd/MMAU-Pro` (local files only). A path is a folder holding
`test.parquet` plus the audio (a `data/` folder, or `data.zip` as downloaded: both hold paths such as
`data/xxx.wav`), or the parquet file itself. MMAU_PRO_AUDIO overrides where the audio is (a folder
or a zip).

Items keep the official columns (`id, audio_path, question, answer, choices, category,
task_identifier, kwargs, ...`), normalized: `audio_path` is always a list, `choices` a list,
`kwargs` a dict, and `audio_root` / `audio_zip` say where clips are read from. Clips are decoded
only when an item runs (`load_clips`), as 16 kHz mono float32, so one missing file fails that item.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from tasks import common
from tasks.base import TaskDataError
from tasks.common import audio_problem, decode_failure
from tasks.mmau_pro.aif import clean_kwargs

HUB_ID = "gamma-lab-umd/MMAU-Pro"
ENV_PATH = "MMAU_PRO_PATH"
ENV_AUDIO = "MMAU_PRO_AUDIO"
SAMPLE_RATE = common.AUDIO_SAMPLE_RATE
HOW_TO = (
    f"point {ENV_PATH} (or --data) at a folder with test.parquet and the audio (data/ or data.zip) of "
    f"the hub dataset {HUB_ID}, or warm the HF cache with it; use data='generated' for the project's small set"
)
_LIST_COLUMNS = ("choices", "perceptual_skills", "reasoning_skills")


def load_items(data: str | None, limit: int | None = None) -> list[dict[str, Any]]:
    """Items from `data` (None = official data, "generated" = the generated set, "generated-large" = that set after
    its long items, else a path)."""
    from tasks.mmau_pro.generate import ensure_generated, ensure_generated_large

    return common.load_items(
        data,
        limit,
        load_path=load_path,
        load_official=load_official,
        generated=ensure_generated,
        generated_large=ensure_generated_large,
    )


def load_official() -> list[dict[str, Any]]:
    """The real items from MMAU_PRO_PATH or the warm HF cache; a clear error otherwise."""
    return common.load_official("MMAU-Pro", ENV_PATH, HUB_ID, HOW_TO, load_path)


def _audio_source(folder: Path) -> tuple[Path, Path | None]:
    """(audio root folder, data.zip or None) for data next to `folder`, MMAU_PRO_AUDIO first."""
    override = os.environ.get(ENV_AUDIO)
    if override:
        p = Path(override).expanduser()
        return (p.parent, p) if p.suffix == ".zip" else (p, None)
    zip_path = folder / "data.zip"
    return folder, (zip_path if zip_path.exists() else None)


def load_path(path: Path) -> list[dict[str, Any]]:
    """Items from a test.parquet file or a folder holding one."""
    import pyarrow.parquet as pq

    path = Path(path).expanduser()
    parquet = path if path.suffix == ".parquet" else path / "test.parquet"
    if not parquet.exists():
        raise TaskDataError(f"MMAU-Pro parquet not found at {str(parquet)!r}; {HOW_TO}")
    rows = pq.read_table(parquet).to_pylist()
    root, zip_path = _audio_source(parquet.parent)
    return [_row_to_item(i, row, root, zip_path, parquet) for i, row in enumerate(rows)]


def _row_to_item(index: int, row: dict[str, Any], root: Path, zip_path: Path | None, where: Path) -> dict[str, Any]:
    missing = [k for k in ("id", "audio_path", "question", "answer", "choices", "category") if k not in row]
    if missing:
        raise TaskDataError(f"{str(where)!r}: row {index} lacks columns {missing}; expected the {HUB_ID} schema")
    item = dict(row)
    paths = row["audio_path"]
    item["audio_path"] = [paths] if isinstance(paths, str) else list(paths or [])
    for column in _LIST_COLUMNS:
        item[column] = [str(c) for c in (row.get(column) or [])]
    item["id"] = str(row["id"])
    # A null reference stays None: the official judge prompt shows it as "None", and no choice equals it.
    item["answer"] = None if row["answer"] is None else str(row["answer"])
    item["task_identifier"] = row.get("task_identifier") or ""
    try:
        item["kwargs"] = clean_kwargs(row.get("kwargs"))
    except ValueError as exc:
        raise TaskDataError(f"{str(where)!r}: row {index} (id {item['id']}): {exc}") from exc
    item["audio_root"] = str(root)
    item["audio_zip"] = str(zip_path) if zip_path else None
    return item


@lru_cache(maxsize=4)
def _zip_index(zip_path: str) -> tuple[zipfile.ZipFile, dict[str, str]]:
    """An open zip and {member path without leading "./" or "/": member name}."""
    archive = zipfile.ZipFile(zip_path)
    return archive, {n.lstrip("./"): n for n in archive.namelist() if not n.endswith("/")}


def _read_clip_bytes(item: dict[str, Any], rel: str) -> bytes:
    """Raw bytes of one clip: the file under audio_root, else the member of audio_zip."""
    file = Path(item["audio_root"]) / rel
    if file.is_file():
        return file.read_bytes()
    if item.get("audio_zip"):
        archive, members = _zip_index(item["audio_zip"])
        name = members.get(rel.lstrip("./"))
        if name is not None:
            return archive.read(name)
    where = f"{file}" + (f" or {item['audio_zip']}" if item.get("audio_zip") else "")
    raise TaskDataError(
        f"item {item['id']}: audio {rel!r} not found (looked in {where}); extract data.zip of {HUB_ID} "
        f"next to test.parquet or set {ENV_AUDIO} to the folder or zip"
    )


def decode_clip(raw: bytes) -> np.ndarray:
    """Audio bytes (wav/flac/ogg/mp3...) -> mono float32 at 16 kHz, shape [samples]."""
    import soundfile as sf

    try:
        samples, rate = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)
        samples = samples.mean(axis=1)
    except (sf.LibsndfileError, RuntimeError):  # formats libsndfile lacks: librosa's fallback readers
        import librosa

        samples, rate = librosa.load(io.BytesIO(raw), sr=None, mono=True)
    if rate != SAMPLE_RATE:
        import librosa

        samples = librosa.resample(samples, orig_sr=rate, target_sr=SAMPLE_RATE)
    return np.ascontiguousarray(samples, dtype=np.float32)


def load_clips(item: dict[str, Any]) -> list[np.ndarray]:
    """Every clip of an item, in order; TaskDataError naming the item for a missing/unreadable one."""
    if not item["audio_path"]:
        raise TaskDataError(f"item {item['id']}: no audio_path; MMAU-Pro items need at least one clip")
    clips = []
    for rel in item["audio_path"]:
        raw = _read_clip_bytes(item, rel)
        problem = audio_problem(raw[:12], len(raw))
        if problem:
            raise TaskDataError(f"item {item['id']}: audio {rel!r} is {problem}")
        try:
            clip = decode_clip(raw)
        except Exception as exc:  # decoders raise many types; all mean "this file is bad"
            why = decode_failure(exc)
            raise TaskDataError(f"item {item['id']}: audio {rel!r} could not be decoded: {why}") from exc
        if clip.size == 0:
            raise TaskDataError(f"item {item['id']}: audio {rel!r} is empty")
        clips.append(clip)
    return clips


def fingerprint(items: list[dict[str, Any]]) -> str:
    """sha256 over the scored fields of every item and its audio paths (not the audio bytes: the
    real set's audio is 47 GB)."""
    h = hashlib.sha256()
    keys = ("id", "question", "answer", "choices", "category", "task_identifier", "audio_path")
    for item in items:
        # A parquet struct gives None for every absent kwargs field: None and absent are the same data.
        kwargs = {k: v for k, v in (item.get("kwargs") or {}).items() if v is not None}
        fields = [item.get(k) for k in keys[:-1]] + [kwargs, item.get("audio_path")]
        h.update(json.dumps(fields, sort_keys=True, ensure_ascii=False, default=str).encode())
    return h.hexdigest()
