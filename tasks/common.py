"""Pieces every task folder shares: where generated sets live, building one atomically, and the
`data` argument's three meanings (None = official data, "generated" = the project's set, else a path)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

COMPLETE_MARKER = "COMPLETE"

# Audio tasks resample every clip to this rate (MMAU-Pro; the audio towers of the omni models read 16 kHz).
AUDIO_SAMPLE_RATE = 16_000


def cache_root() -> Path:
    """$OSCAR_EVAL_CACHE, else ~/.cache/oscar-eval."""
    return Path(os.environ.get("OSCAR_EVAL_CACHE") or Path.home() / ".cache" / "oscar-eval").expanduser()


def ensure_built(name: str, build: Callable[[Path], Any], root: Path | None = None) -> Path:
    """The folder `root/name`, built first by `build(folder)` when it lacks the COMPLETE marker (which
    `build` writes last). Built in a temporary folder and renamed, so parallel runs never see half a set."""
    final = (root or cache_root()) / name
    if (final / COMPLETE_MARKER).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        build(tmp)
        if final.exists():  # an incomplete leftover from a killed run
            shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    except OSError:
        if not (final / COMPLETE_MARKER).exists():  # lost a race only if someone else finished
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_items(
    data: str | None,
    limit: int | None,
    *,
    load_path: Callable[[Path], list],
    load_official: Callable[[], list],
    generated: Callable[[], Path],
    generated_large: Callable[[], Path] | None = None,
) -> list[dict[str, Any]]:
    """Items from `data`: None = official data, "generated" = the generated set, "generated-large" = that set with
    items at the real benchmark's sizes (long prompts: for speed and memory), else a path."""
    if data == "generated":
        items = load_path(generated())
    elif data == "generated-large" and generated_large is not None:
        items = load_path(generated_large())
    elif data is None:
        items = load_official()
    else:
        items = load_path(Path(data))
    return items if limit is None else items[:limit]


def load_official(name: str, env_path: str, hub_id: str, how_to: str, load_path: Callable[[Path], list]) -> list:
    """The official data from the folder/file in $env_path, else the warm HF cache; a clear error otherwise."""
    from tasks.base import TaskDataError

    if os.environ.get(env_path):
        return load_path(Path(os.environ[env_path]))
    snapshot = hub_snapshot(hub_id)
    if snapshot is None:
        raise TaskDataError(f"{name} data not found: {env_path} is unset and {hub_id} is not in the HF cache; {how_to}")
    return load_path(snapshot)


def hub_snapshot(repo_id: str) -> Path | None:
    """The local snapshot folder of a hub dataset in the HF cache, or None (never downloads)."""
    try:
        from huggingface_hub import snapshot_download

        # HF_HUB_CACHE is read here, not at import, so a caller can redirect it at run time
        return Path(
            snapshot_download(
                repo_id, repo_type="dataset", local_files_only=True, cache_dir=os.environ.get("HF_HUB_CACHE")
            )
        )
    except Exception:  # LocalEntryNotFoundError, or huggingface_hub missing: both mean "not cached"
        return None


def audio_problem(head: bytes, size: int) -> str | None:
    """What is wrong with an audio file that decoders read without complaint, from its first 12 bytes and its size: a
    RIFF/WAVE file shorter than its header declares (cut off in a copy or a download) decodes as the few samples
    left. None when nothing is seen (a header of unknown size, 0 or 0xFFFFFFFF, as streamed WAVs write, is not
    checked)."""
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        riff = int.from_bytes(head[4:8], "little")
        if 0 < riff < 0xFFFFFFFF and size < riff + 8:
            return f"truncated: its RIFF header declares {riff + 8} bytes, the file holds {size}"
    return None


def decode_failure(exc: BaseException) -> str:
    """A decoder's exception as a reason: its type and message, or, where it gives none (audioread's NoBackendError),
    what that means."""
    text = str(exc).strip()
    if text:
        return f"{type(exc).__name__}: {text}"
    return f"{type(exc).__name__} (no installed decoder reads it: not an audio file, or corrupt)"
