"""The generated MMAU-Pro set's long items ("generated-large"): minutes of audio, one item over 8K audio tokens on
Qwen3-Omni, first in the set and in the official layout."""

from __future__ import annotations

import wave

from tasks.mmau_pro import data as mmau_data
from tasks.mmau_pro import generate, score
from tests.harness.test_shapes import omni_audio_tokens


def test_long_items_come_first_with_their_clip_lengths(tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_EVAL_CACHE", str(tmp_path))
    items = mmau_data.load_items("generated-large")
    n_long = len(generate.LONG_ITEMS)
    assert [it["id"] for it in items[:n_long]] == [f"long-{n:04d}" for n in range(n_long)]
    assert len(items) == n_long + len(mmau_data.load_items("generated"))
    folder = tmp_path / f"mmau-pro-generated-large-v{generate.GENERATOR_VERSION}"
    tokens = []
    for item, (durations, *_, category) in zip(items, generate.LONG_ITEMS):
        seconds = []
        for rel in item["audio_path"]:
            with wave.open(str(folder / rel)) as f:
                seconds.append(f.getnframes() / f.getframerate())
        assert seconds == list(durations) and item["category"] == category
        tokens.append(sum(omni_audio_tokens(s) for s in seconds))
    assert max(tokens) > 8192  # the three 300-second clips: 11,700 audio tokens
    assert {score.kind(it) for it in items[:n_long]} == {"closed", "open", "aif"}
    assert mmau_data.load_clips(items[0])  # readable by the task's own loader
