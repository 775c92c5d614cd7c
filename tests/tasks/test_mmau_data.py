"""MMAU-Pro data: the generated set, audio from folder or zip, clear errors, prompt snapshot."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from tasks.base import TaskDataError
from tasks.mmau_pro import TASK, VERSION, aif, data, excluded_reason, generate, prompt_text


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    return generate.ensure_generated(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def items(generated):
    return data.load_path(generated)


def test_generated_set_schema_and_coverage(items):
    categories = {i["category"] for i in items}
    assert categories == {"sound", "music", "sound-music", "open", "instruction following"}
    assert {i["task_identifier"] for i in items if i["category"] == "instruction following"} == set(aif.CHECKERS)
    assert any(len(i["audio_path"]) > 1 for i in items)  # several clips per item in some
    assert {i["category"] for i in items[:5]} == categories  # interleaved: a short prefix covers all
    for i in items:
        if i["category"] not in ("open", "instruction following"):
            assert i["answer"] in i["choices"] and len(i["choices"]) > 1
    assert {
        "length_type",
        "perceptual_skills",
        "reasoning_skills",
        "transcription",
        "task_classification",
        "sub-cat",
    } <= set(items[0])


def test_generated_set_is_seeded(generated, items, tmp_path):
    rows = generate.build(tmp_path)
    assert [r["id"] for r in rows] == [i["id"] for i in items]
    for item in items:
        for rel in item["audio_path"]:
            assert (tmp_path / rel).read_bytes() == (generated / rel).read_bytes()
    assert data.fingerprint(data.load_path(tmp_path)) == data.fingerprint(items)


def test_clips_are_16k_mono_float32_and_carry_the_signal(items):
    by_id = {i["id"]: i for i in items}
    louder = next(i for i in items if i["question"].startswith("Which of the two clips is louder"))
    quiet, loud = data.load_clips(louder)
    assert quiet.dtype == np.float32 and quiet.ndim == 1 and len(quiet) == data.SAMPLE_RATE
    assert np.sqrt((loud**2).mean()) > 5 * np.sqrt((quiet**2).mean())
    tone = data.load_clips(by_id[next(k for k, i in by_id.items() if i["answer"] == "a steady pure tone")])[0]
    spectrum = np.abs(np.fft.rfft(tone))
    assert abs(np.argmax(spectrum) * data.SAMPLE_RATE / len(tone) - 440.0) < 2.0


def test_audio_read_from_data_zip(generated, tmp_path):
    import shutil

    shutil.copy(generated / "test.parquet", tmp_path / "test.parquet")
    with zipfile.ZipFile(tmp_path / "data.zip", "w") as archive:
        for wav in sorted((generated / "data").glob("*.wav")):
            archive.write(wav, f"data/{wav.name}")
    zipped = data.load_path(tmp_path)
    plain = data.load_path(generated)
    assert zipped[2]["audio_zip"] is not None
    for a, b in zip(zipped[:4], plain[:4]):
        assert all(np.array_equal(x, y) for x, y in zip(data.load_clips(a), data.load_clips(b)))


def test_resampling_and_stereo_are_handled(tmp_path):
    import soundfile as sf

    t = np.arange(44_100) / 44_100
    stereo = np.stack([np.sin(2 * np.pi * 1000 * t), np.zeros_like(t)], axis=1).astype(np.float32)
    sf.write(tmp_path / "x.flac", stereo, 44_100)
    clip = data.decode_clip((tmp_path / "x.flac").read_bytes())
    assert clip.shape == (data.SAMPLE_RATE,) and clip.dtype == np.float32
    assert abs(np.argmax(np.abs(np.fft.rfft(clip))) - 1000) <= 1  # 1 s at 16 kHz: bin = Hz


def test_missing_and_bad_audio_name_the_item(items, tmp_path):
    item = dict(items[0], audio_root=str(tmp_path), audio_zip=None)
    with pytest.raises(TaskDataError, match=f"item {item['id']}: audio 'data/gen-0000-0.wav' not found"):
        data.load_clips(item)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "gen-0000-0.wav").write_bytes(b"RIFF garbage")
    with pytest.raises(TaskDataError, match="could not be decoded"):
        data.load_clips(item)
    with pytest.raises(TaskDataError, match="no audio_path"):
        data.load_clips(dict(item, audio_path=[]))


def test_missing_official_data_names_hub_id_and_env_var(monkeypatch, tmp_path):
    monkeypatch.delenv(data.ENV_PATH, raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(TaskDataError) as err:
        TASK.load(None)
    assert data.HUB_ID in str(err.value) and data.ENV_PATH in str(err.value)
    with pytest.raises(TaskDataError, match="parquet not found"):
        data.load_path(tmp_path)


def test_only_closed_items_without_two_choices_are_excluded(items):
    """The official evaluator filters out closed items with fewer than two choices and scores every other row."""
    closed = next(i for i in items if i["category"] == "music")
    assert excluded_reason(closed) is None
    assert excluded_reason(dict(closed, answer=" ")) is None  # an empty reference is still scored
    assert "leaves out closed items with fewer than two" in excluded_reason(dict(closed, choices=["only one"]))
    aif_item = next(i for i in items if i["category"] == "instruction following")
    assert excluded_reason(aif_item) is None and excluded_reason(dict(aif_item, task_identifier="Haiku")) is None
    assert excluded_reason(dict(aif_item, choices=[])) is None  # only closed categories need choices


def test_prompt_text_snapshot(items):
    """The exact text `requests` puts in Prompt.text, per kind of item."""
    closed = next(i for i in items if i["question"] == "Which chord is played in the audio?")
    options = "\n".join(f"{letter}. {c}" for letter, c in zip("ABCD", closed["choices"]))
    assert prompt_text(closed) == "Which chord is played in the audio?\n\n" + options
    assert prompt_text({"category": "sound", "question": "Q?", "choices": ["x", "y"]}) == "Q?\n\nA. x\nB. y"
    assert prompt_text({"category": "open", "question": "Describe it.", "choices": ["x", "y"]}) == "Describe it."
    aif_item = {"category": "instruction following", "question": "Describe. No commas.", "choices": []}
    assert prompt_text(aif_item) == "Describe. No commas."
    multi = next(i for i in items if len(i["audio_path"]) == 2 and i["category"] == "sound-music")
    prompt = TASK.requests(multi)[0].prompt
    assert prompt.text == f"{multi['question']}\n\nA. {multi['choices'][0]}\nB. {multi['choices'][1]}"
    assert len(prompt.audios) == 2 and not prompt.images
    assert TASK.version == VERSION == 2 and TASK.max_new_tokens == 128
