"""The project's small MMAU-Pro-style set: synthesized audio, in the hub dataset's layout.

Writes <cache>/mmau-pro-generated-v<GENERATOR_VERSION>/test.parquet (the official columns) and
data/<n>.wav (16 kHz mono 16-bit PCM, via the standard library `wave`), <cache> being
$OSCAR_EVAL_CACHE or ~/.cache/oscar-eval. Clips are tones, chords, noise, sweeps and note sequences
made with numpy; some items have two clips. Questions: closed form (categories "sound", "music",
"sound-music"), open ("open") and one instruction-following item per official AIF rule. Items are
interleaved by category so the first few cover every kind. One seed: the same set every time.
`build_large` ("generated-large") puts LONG_ITEMS first: clips of minutes, one item with three 300-second clips
(over 11K audio tokens on Qwen3-Omni), for speed and memory at the lengths of MMAU-Pro's long items.
"""

from __future__ import annotations

import random
import wave
from pathlib import Path
from typing import Any

import numpy as np

from tasks.common import AUDIO_SAMPLE_RATE as SAMPLE_RATE
from tasks.common import COMPLETE_MARKER, ensure_built

GENERATOR_VERSION = 1
SEED = 20250819
NOTES = {
    "C4": 261.63,
    "D4": 293.66,
    "E4": 329.63,
    "F4": 349.23,
    "G4": 392.00,
    "A3": 220.00,
    "A4": 440.00,
    "B3": 246.94,
    "D3": 146.83,
    "F3": 174.61,
}
CHORDS = {
    "C major": ("C4", "E4", "G4"),
    "A minor": ("A3", "C4", "E4"),
    "G major": ("G4", "B3", "D4"),
    "D minor": ("D3", "F3", "A3"),
}
SOUNDS = ("a steady pure tone", "white noise", "a rising pitch sweep", "silence")


def _t(seconds: float) -> np.ndarray:
    return np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE


def tone(freq: float, seconds: float, amp: float = 0.3) -> np.ndarray:
    """A sine with 10 ms fades (no clicks), float32 [samples]."""
    y = amp * np.sin(2 * np.pi * freq * _t(seconds))
    fade = min(len(y) // 2, SAMPLE_RATE // 100)
    ramp = np.linspace(0.0, 1.0, fade)
    y[:fade] *= ramp
    y[len(y) - fade :] *= ramp[::-1]
    return y.astype(np.float32)


def chord(names: tuple[str, ...], seconds: float) -> np.ndarray:
    return (sum(tone(NOTES[n], seconds, 0.2) for n in names)).astype(np.float32)


def sweep(f0: float, f1: float, seconds: float) -> np.ndarray:
    """Linear chirp from f0 to f1 Hz: phase = 2 pi (f0 t + (f1 - f0) t^2 / (2 T))."""
    t = _t(seconds)
    return (0.3 * np.sin(2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * seconds)))).astype(np.float32)


def noise(seconds: float, rng: np.random.Generator, amp: float = 0.2) -> np.ndarray:
    return (amp * rng.standard_normal(len(_t(seconds)))).astype(np.float32)


def sequence(names: list[str], note_seconds: float = 0.35, gap: float = 0.08) -> np.ndarray:
    silence = np.zeros(int(gap * SAMPLE_RATE), np.float32)
    return np.concatenate([np.concatenate([tone(NOTES[n], note_seconds), silence]) for n in names])


def sound_clip(label: str, rng: np.random.Generator) -> np.ndarray:
    return {
        "a steady pure tone": lambda: tone(440.0, 1.2),
        "white noise": lambda: noise(1.2, rng),
        "a rising pitch sweep": lambda: sweep(200.0, 1200.0, 1.2),
        "silence": lambda: np.zeros(len(_t(1.2)), np.float32),
    }[label]()


def write_wav(path: Path, samples: np.ndarray) -> None:
    """16-bit PCM mono WAV at SAMPLE_RATE."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(SAMPLE_RATE)
        f.writeframes(pcm.tobytes())


def _closed(rng: random.Random, question: str, answer: str, options: list[str], clips, category: str, sub: str):
    options = options[:]
    rng.shuffle(options)
    return {
        "question": question,
        "answer": answer,
        "choices": options,
        "clips": clips,
        "category": category,
        "sub-cat": sub,
    }


def closed_items(rng: random.Random, nrng: np.random.Generator) -> dict[str, list[dict[str, Any]]]:
    sound = [
        _closed(
            rng,
            "Which best describes the sound in the audio?",
            label,
            list(SOUNDS),
            [sound_clip(label, nrng)],
            "sound",
            "sound identification",
        )
        for label in ("white noise", "a rising pitch sweep", "a steady pure tone")
    ]
    music = [
        _closed(
            rng, "Which chord is played in the audio?", name, list(CHORDS), [chord(CHORDS[name], 1.5)], "music", "chord"
        )
        for name in ("C major", "A minor")
    ]
    count = rng.choice((3, 4))
    notes = [rng.choice(list(NOTES)) for _ in range(count)]
    music.append(
        _closed(
            rng,
            "How many notes are played in the audio?",
            ("three", "four")[count - 3],
            ["two", "three", "four", "five"],
            [sequence(notes)],
            "music",
            "counting",
        )
    )
    multi = [
        _closed(
            rng,
            "Which of the two clips is louder?",
            "the second clip",
            ["the first clip", "the second clip"],
            [tone(330.0, 1.0, 0.05), tone(330.0, 1.0, 0.5)],
            "sound-music",
            "multi-audio loudness",
        ),
        _closed(
            rng,
            "Which of the two clips has the higher pitch?",
            "the first clip",
            ["the first clip", "the second clip"],
            [tone(880.0, 1.0), tone(220.0, 1.0)],
            "sound-music",
            "multi-audio pitch",
        ),
    ]
    return {"sound": sound, "music": music, "sound-music": multi}


def open_items(nrng: np.random.Generator) -> list[dict[str, Any]]:
    return [
        {
            "question": "Describe what you hear in the audio.",
            "answer": "Three notes rising in pitch: C, E and G, played one after another.",
            "choices": [],
            "clips": [sequence(["C4", "E4", "G4"])],
            "category": "open",
            "sub-cat": "description",
        },
        {
            "question": "How do the two clips differ?",
            "answer": "The first clip is a steady tone; the second clip is noise.",
            "choices": [],
            "clips": [tone(440.0, 1.0), noise(1.0, nrng)],
            "category": "open",
            "sub-cat": "comparison",
        },
        {
            "question": "What happens to the pitch during the audio?",
            "answer": "The pitch rises steadily from low to high.",
            "choices": [],
            "clips": [sweep(150.0, 1500.0, 1.5)],
            "category": "open",
            "sub-cat": "description",
        },
    ]


# (task_identifier, instruction appended to the base question, kwargs) - one per official rule.
AIF_RULES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("Include Keywords", "Include the keywords: tone, pitch.", {"keywords": "tone, pitch"}),
    ("Keyword Frequency", "Use the word 'sound' exactly 2 times.", {"keyword": "sound", "N": 2}),
    ("Forbidden Words", "Do not use the words: music, song.", {"forbidden_words": "music, song"}),
    ("Number Paragraphs", "Answer in exactly 2 paragraphs separated by ***.", {"N": 2}),
    ("Number Words (at least)", "Answer in at least 12 words.", {"N": 12}),
    ("Number Words (at most)", "Answer in at most 8 words.", {"N": 8}),
    ("Number Words (range)", "Answer in 5 to 15 words.", {"N1": 5, "N2": 15}),
    ("Number Sentences (at least)", "Answer in at least 2 sentences.", {"N": 2}),
    ("Number Sentences (at most)", "Answer in at most 1 sentence.", {"N": 1}),
    ("Number Sentences (range)", "Answer in 2 to 3 sentences.", {"N1": 2, "N2": 3}),
    ("Postscript", "End with a postscript starting with P.S.", {"postscript_marker": "P.S."}),
    ("Number Placeholder", "Include at least 2 placeholders in square brackets, like [name].", {"N": 2}),
    ("Number Bullets", "Answer with exactly 3 bullet points using '* '.", {"N": 3}),
    ("Title", "Give your answer a title wrapped in double angular brackets, like <<title>>.", {}),
    ("Minimum Number Highlighted Section", "Highlight at least 2 parts with asterisks, like *this*.", {"N": 2}),
    ("Multiple Sections", "Use 2 sections, each starting with 'Section'.", {"N": 2, "section_splitter": "Section"}),
    ("Repeat Prompt", "First repeat this request word for word, then answer.", {}),
    ("Two Responses", "Give two different answers separated by ******.", {}),
    ("All Uppercase", "Answer in capital letters only.", {}),
    ("All Lowercase", "Answer in lowercase letters only.", {}),
    ("All-capital Words (at least)", "Use at least 2 words in all capital letters.", {"N": 2}),
    ("All-capital Words (at most)", "Use at most 1 word in all capital letters.", {"N": 1}),
    ("All-capital Words (range)", "Use 1 to 3 words in all capital letters.", {"N1": 1, "N2": 3}),
    ("Start Checker", "Start your answer with 'I hear'.", {"start_phrase": "I hear"}),
    ("End Checker", "End your answer with 'that is all'.", {"end_phrase": "that is all"}),
    ("Quotation", "Wrap your whole answer in double quotation marks.", {}),
    ("No Commas", "Do not use any commas.", {}),
)


def aif_items(nrng: np.random.Generator) -> list[dict[str, Any]]:
    makers = (
        lambda: tone(440.0, 1.0),
        lambda: sweep(300.0, 900.0, 1.0),
        lambda: noise(1.0, nrng),
        lambda: chord(CHORDS["C major"], 1.0),
    )
    return [
        {
            "question": f"Describe the audio. {instruction}",
            "answer": "",
            "choices": [],
            "clips": [makers[i % 4]()],
            "category": "instruction following",
            "sub-cat": identifier,
            "task_identifier": identifier,
            "kwargs": kwargs,
        }
        for i, (identifier, instruction, kwargs) in enumerate(AIF_RULES)
    ]


def interleave(groups: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Round-robin over the groups, so any prefix spans every group early."""
    out = []
    for i in range(max(len(g) for g in groups)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def _schema():
    import pyarrow as pa

    text, ints = pa.string(), pa.int64()
    kwargs = pa.struct(
        [
            ("keywords", text),
            ("keyword", text),
            ("N", ints),
            ("forbidden_words", text),
            ("N1", ints),
            ("N2", ints),
            ("postscript_marker", text),
            ("section_splitter", text),
            ("start_phrase", text),
            ("end_phrase", text),
        ]
    )
    columns = [
        ("id", text),
        ("audio_path", pa.list_(text)),
        ("question", text),
        ("answer", text),
        ("choices", pa.list_(text)),
        ("category", text),
        ("task_identifier", text),
        ("kwargs", kwargs),
        ("length_type", text),
        ("perceptual_skills", pa.list_(text)),
        ("reasoning_skills", pa.list_(text)),
        ("transcription", text),
        ("task_classification", text),
        ("sub-cat", text),
    ]
    return pa.schema(columns)


def write_rows(target: Path, items: list[dict[str, Any]], prefix: str, length_type: str) -> list[dict[str, Any]]:
    """Each item's clips as data/<prefix>-<n>-<k>.wav under `target`, and its row in the official columns."""
    (target / "data").mkdir(parents=True, exist_ok=True)
    kinds = {"open": "open-ended", "instruction following": "instruction following"}
    rows = []
    for n, item in enumerate(items):
        paths = []
        for k, clip in enumerate(item["clips"]):
            paths.append(f"data/{prefix}-{n:04d}-{k}.wav")
            write_wav(target / paths[-1], clip)
        rows.append(
            {
                "id": f"{prefix}-{n:04d}",
                "audio_path": paths,
                "task_identifier": item.get("task_identifier"),
                "kwargs": item.get("kwargs"),
                "length_type": length_type,
                "perceptual_skills": [],
                "reasoning_skills": [],
                "transcription": None,
                "task_classification": kinds.get(item["category"], "closed-ended"),
                **{k: item[k] for k in ("question", "answer", "choices", "category", "sub-cat")},
            }
        )
    return rows


def build(target: Path, seed: int = SEED) -> list[dict[str, Any]]:
    """Write test.parquet and data/*.wav into `target`; return the parquet rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    closed = closed_items(rng, nrng)
    items = interleave([closed["sound"], closed["music"], closed["sound-music"], open_items(nrng), aif_items(nrng)])
    rows = write_rows(target, items, "gen", "short")
    pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), target / "test.parquet")
    (target / COMPLETE_MARKER).write_text(str(GENERATOR_VERSION))
    return rows


def ensure_generated(root: Path | None = None) -> Path:
    """The generated set's folder, built first when missing (see tasks.common.ensure_built)."""
    return ensure_built(f"mmau-pro-generated-v{GENERATOR_VERSION}", build, root)


# (seconds of each clip, question, answer, choices, category, kind) of the long items, in this order first.
LONG_ITEMS: tuple[tuple[tuple[float, ...], str, str, tuple[str, ...], str], ...] = (
    ((120.0,), "Which best describes the sound in the audio?", "a steady pure tone", tuple(SOUNDS), "sound"),
    (
        (300.0,),
        "Describe what you hear in the audio.",
        "A steady tone with noise that slowly rises in pitch.",
        (),
        "open",
    ),
    (
        (300.0, 300.0, 300.0),
        "Which of the three clips is the loudest?",
        "the third clip",
        ("the first clip", "the second clip", "the third clip"),
        "sound-music",
    ),
    ((200.0,), "Describe the audio. Answer in at most 8 words.", "", (), "instruction following"),
)


def long_clip(seconds: float, k: int, nrng: np.random.Generator) -> np.ndarray:
    """A slow sweep under noise, louder for a later clip of an item (clip k)."""
    return (0.3 * (k + 1) * sweep(200.0, 800.0, seconds) / 3 + noise(seconds, nrng, 0.02)).astype(np.float32)


def build_large(target: Path, seed: int = SEED) -> list[dict[str, Any]]:
    """LONG_ITEMS (first: `--limit 4` takes exactly them), then the generated set, in the official layout."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = build(target, seed)
    nrng = np.random.default_rng(seed + 1)
    items = []
    for durations, question, answer, choices, category in LONG_ITEMS:
        aif = category == "instruction following"
        items.append(
            {
                "question": question,
                "answer": answer,
                "choices": list(choices),
                "category": category,
                "sub-cat": "long audio",
                "clips": [long_clip(s, k, nrng) for k, s in enumerate(durations)],
                "task_identifier": "Number Words (at most)" if aif else None,
                "kwargs": {"N": 8} if aif else None,
            }
        )
    rows = write_rows(target, items, "long", "long") + rows
    pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), target / "test.parquet")
    return rows


def ensure_generated_large(root: Path | None = None) -> Path:
    """The generated set with its long items first (`build_large`), built first when missing."""
    return ensure_built(f"mmau-pro-generated-large-v{GENERATOR_VERSION}", build_large, root)
