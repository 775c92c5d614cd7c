"""Finding and reading speech with reference transcripts, offline.

`data` (the task's `load`):
- None: the folder or saved dataset in $ASR_PATH, else the recordings of Debian's `pocketsphinx-testdata` (BSD-2:
  ten read English utterances, 16 kHz, with transcripts: five card names, five sentences of a LibriVox reading of
  Sense and Sensibility; categories "cards" and "librivox").
- "generated": the project's synthesised set (tasks/asr/generate.py).
- a path: a folder where each audio file (`AUDIO_SUFFIXES`) has its transcript beside it, `<name>.txt` next to
  `<name>.wav` (subfolders allowed: an item's id is its path without the suffix, its category its folder); or a
  dataset saved with `datasets.save_to_disk` (a folder with dataset_info.json) with an `audio` column and a
  transcript column (`TEXT_COLUMNS`), its "test" split when it holds several.

Items: {"id", "reference", "category", and where the audio is: "audio" (a file) or "dataset" + "split" + "row"}.
Clips are decoded only when an item runs (`load_clip`), as 16 kHz mono float32, so one bad file fails that item.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from tasks import common
from tasks.base import TaskDataError
from tasks.common import audio_problem, decode_failure

ENV_PATH = "ASR_PATH"
SAMPLE_RATE = common.AUDIO_SAMPLE_RATE
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3")
TEXT_COLUMNS = ("text", "transcript", "transcription", "sentence")
POCKETSPHINX_DIR = Path("/usr/share/pocketsphinx/test/data")
# (category, transcript file, audio folder) of the pocketsphinx-testdata recordings; transcript lines read
# "<s> words </s> (utterance id)" and the audio is <audio folder>/<utterance id>.wav
POCKETSPHINX_SETS = (
    ("cards", "cards/cards.transcription", "cards"),
    ("librivox", "librivox/transcription", "librivox"),
)
HOW_TO = (
    f"set {ENV_PATH} (or --data) to a folder of <name>.wav + <name>.txt or to a saved dataset with audio and text "
    "columns, install Debian's pocketsphinx-testdata (apt-get install pocketsphinx-testdata), or use "
    "--data generated"
)


def load_items(data: str | None, limit: int | None, generated_size: int) -> list[dict[str, Any]]:
    """Items from `data` (None: $ASR_PATH, else pocketsphinx-testdata; "generated": the project's set of
    `generated_size` utterances; else a path)."""
    from tasks.asr.generate import ensure_generated

    return common.load_items(
        data,
        limit,
        load_path=load_path,
        load_official=load_official,
        generated=lambda: ensure_generated(generated_size),
    )


def load_official() -> list[dict[str, Any]]:
    """$ASR_PATH when set, else the pocketsphinx-testdata recordings; TaskDataError naming the fixes otherwise."""
    if os.environ.get(ENV_PATH):
        return load_path(Path(os.environ[ENV_PATH]))
    if POCKETSPHINX_DIR.is_dir():
        return load_pocketsphinx(POCKETSPHINX_DIR)
    raise TaskDataError(f"asr data not found: {ENV_PATH} is unset and {POCKETSPHINX_DIR} does not exist; {HOW_TO}")


def load_path(path: Path) -> list[dict[str, Any]]:
    """Items of a saved dataset (a folder with dataset_info.json, or a DatasetDict's dataset_dict.json) or of a
    folder of audio files with transcripts."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise TaskDataError(f"asr data {str(path)!r} is not a folder; {HOW_TO}")
    if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
        return load_saved_dataset(path)
    return load_folder(path)


def load_folder(folder: Path) -> list[dict[str, Any]]:
    """One item per audio file under `folder` (sorted by path), its transcript the `.txt` file of the same name."""
    audio = sorted(p for p in folder.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES and p.is_file())
    if not audio:
        raise TaskDataError(f"asr: no audio files ({', '.join(AUDIO_SUFFIXES)}) under {str(folder)!r}; {HOW_TO}")
    items = []
    for file in audio:
        transcript = file.with_suffix(".txt")
        if not transcript.is_file():
            raise TaskDataError(f"asr: {str(file)!r} has no transcript {transcript.name!r} beside it; {HOW_TO}")
        rel = file.relative_to(folder).with_suffix("")
        items.append(
            {
                "id": rel.as_posix(),
                "reference": transcript.read_text(encoding="utf-8").strip(),
                "category": rel.parent.as_posix() if rel.parent != Path(".") else None,
                "audio": str(file),
            }
        )
    return items


def load_pocketsphinx(root: Path) -> list[dict[str, Any]]:
    """The pocketsphinx-testdata recordings that have transcripts (POCKETSPHINX_SETS), in the files' order."""
    items = []
    for category, transcript_file, audio_folder in POCKETSPHINX_SETS:
        lines = (root / transcript_file).read_text(encoding="utf-8").splitlines()
        for line in filter(str.strip, lines):
            match = re.fullmatch(r"\s*<s>(.*)</s>\s*\((\S+)\)\s*", line)
            if match is None:
                raise TaskDataError(f"asr: {root / transcript_file}: unexpected line {line!r}")
            utterance = match.group(2)
            items.append(
                {
                    "id": f"{category}/{utterance}",
                    "reference": " ".join(match.group(1).split()),
                    "category": category,
                    "audio": str(root / audio_folder / f"{utterance}.wav"),
                }
            )
    return items


@lru_cache(maxsize=4)
def _saved_dataset(path: str, split: str | None):
    """A saved dataset (one split of a DatasetDict) with its audio column left undecoded ({"bytes", "path"}): the
    clips are decoded here, with soundfile, not by datasets' own decoder."""
    import datasets

    loaded = datasets.load_from_disk(path)
    if isinstance(loaded, datasets.DatasetDict):
        if split is None:
            raise TaskDataError(f"asr: {path!r} holds splits {sorted(loaded)}: name one")
        loaded = loaded[split]
    if "audio" not in loaded.column_names:
        raise TaskDataError(f"asr: the dataset at {path!r} has no 'audio' column (columns: {loaded.column_names})")
    return loaded.cast_column("audio", datasets.Audio(decode=False))


def load_saved_dataset(path: Path) -> list[dict[str, Any]]:
    """Items of a dataset saved with save_to_disk: its "test" split (or its only split), the first TEXT_COLUMNS column
    as the reference, an "id" column as the id when there is one (else the row number)."""
    split = None
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
        if "test" not in splits and len(splits) != 1:
            raise TaskDataError(f"asr: {str(path)!r} holds splits {splits} and none is 'test'; save one split")
        split = "test" if "test" in splits else splits[0]
    dataset = _saved_dataset(str(path), split)
    text_column = next((c for c in TEXT_COLUMNS if c in dataset.column_names), None)
    if text_column is None:
        raise TaskDataError(
            f"asr: the dataset at {str(path)!r} has none of the transcript columns {TEXT_COLUMNS} "
            f"(columns: {dataset.column_names})"
        )
    texts = list(dataset[text_column])
    ids = [str(i) for i in dataset["id"]] if "id" in dataset.column_names else [str(i) for i in range(len(texts))]
    where = {"dataset": str(path), "split": split, "fingerprint": dataset._fingerprint}
    return [
        {"id": ids[i], "reference": (texts[i] or "").strip(), "category": None, "row": i, **where}
        for i in range(len(texts))
    ]


def decode(source: str | io.BytesIO) -> np.ndarray:
    """An audio file or its bytes -> mono float32 at 16 kHz, shape [samples]. soundfile first; librosa's readers for
    formats libsndfile lacks."""
    import soundfile as sf

    try:
        samples, rate = sf.read(source, dtype="float32", always_2d=True)
        samples = samples.mean(axis=1)
    except (sf.LibsndfileError, RuntimeError):
        import librosa

        if isinstance(source, io.BytesIO):
            source.seek(0)
        with warnings.catch_warnings():  # its fallback's deprecation notes; a failure raises, and the item says so
            warnings.simplefilter("ignore")
            samples, rate = librosa.load(source, sr=None, mono=True)
    if rate != SAMPLE_RATE:
        import librosa

        samples = librosa.resample(samples, orig_sr=rate, target_sr=SAMPLE_RATE)
    return np.ascontiguousarray(samples, dtype=np.float32)


def load_clip(item: dict[str, Any]) -> np.ndarray:
    """The item's clip as 16 kHz mono float32; TaskDataError naming the item when it is missing, unreadable or empty."""
    if "audio" in item:
        where = item["audio"]
        if not Path(where).is_file():
            raise TaskDataError(f"item {item['id']}: audio file {where!r} not found")
        source: str | io.BytesIO = where
    else:
        cell = _saved_dataset(item["dataset"], item["split"])[item["row"]]["audio"]
        where = f"row {item['row']} of {item['dataset']}"
        if cell.get("bytes"):
            source = io.BytesIO(cell["bytes"])
        elif cell.get("path") and Path(cell["path"]).is_file():
            source = cell["path"]
        else:
            raise TaskDataError(f"item {item['id']}: {where} holds no audio bytes and no readable path")
    if isinstance(source, io.BytesIO):
        problem = audio_problem(source.getvalue()[:12], len(source.getvalue()))
    else:
        with open(source, "rb") as f:
            problem = audio_problem(f.read(12), Path(source).stat().st_size)
    if problem:
        raise TaskDataError(f"item {item['id']}: audio {where!r} is {problem}")
    try:
        clip = decode(source)
    except Exception as exc:  # decoders raise many types; all mean "this file is bad"
        raise TaskDataError(f"item {item['id']}: audio {where!r} could not be decoded: {decode_failure(exc)}") from exc
    if clip.size == 0:
        raise TaskDataError(f"item {item['id']}: audio {where!r} is empty")
    return clip


def fingerprint(items: list[dict[str, Any]]) -> str:
    """sha256 over each item's id, reference and audio: a file's bytes, a saved dataset's own fingerprint and row."""
    h = hashlib.sha256()
    for item in items:
        if "audio" in item:
            file = Path(item["audio"])
            audio = hashlib.sha1(file.read_bytes()).hexdigest() if file.is_file() else "missing"
        else:
            audio = f"{item['fingerprint']}:{item['split']}:{item['row']}"
        h.update(json.dumps([item["id"], item["reference"], audio], ensure_ascii=False).encode())
    return h.hexdigest()
