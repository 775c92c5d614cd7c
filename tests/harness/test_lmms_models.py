"""The lmms-eval model classes on tiny replicas, through lmms-eval's own registry and request type."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("lmms_eval")
from lmms_eval.api.instance import Instance  # noqa: E402
from lmms_eval.models.registry_v2 import ModelRegistryV2  # noqa: E402
from PIL import Image  # noqa: E402

from harness import lmms  # noqa: E402

DOCS = {
    "ocr": {"test": [{"image": Image.new("RGB", (40, 32), (200, 40, 40)), "q": "What colour is this?"}]},
    "mmau": {
        "test": [{"audio": {"array": np.sin(np.linspace(0, 2000, 44100)).astype(np.float32), "sampling_rate": 44100}}]
    },
}


def request(task, context, visual_key, gen_kwargs):
    args = (context, gen_kwargs, lambda doc: [doc[visual_key]], 0, task, "test")
    return Instance("generate_until", args, idx=0, metadata={"task": task, "doc_id": 0, "repeats": 1})


def registry() -> ModelRegistryV2:
    reg = ModelRegistryV2()
    for manifest in lmms.manifests():
        reg.register_manifest(manifest)
    return reg


def test_registry_resolves_every_family():
    reg = registry()
    assert reg.get_model_class("oscar_qwen3_vl") is lmms.OscarQwen3VL
    assert reg.get_model_class("oscar_llava").default_model == "llava-v1.6-7b"
    assert reg.get_model_class("oscar_qwen3_omni").default_model == "qwen3-omni-30b-a3b"


def test_generate_until_on_image_and_audio_and_survives_clean():
    model = (
        registry()
        .get_model_class("oscar_qwen3_vl")
        .create_from_arg_string(
            "model=tiny-qwen3-vl,quant=oscar,quant_options=group_size=32;residual_length=128,max_new_tokens=5"
        )
    )
    model.task_dict = DOCS
    assert model.method.name == "oscar" and model.method.group_size == 32
    first = model.generate_until([request("ocr", "What colour is this?", "image", {"until": ["\n\n"]})])
    assert len(first) == 1 and isinstance(first[0], str)
    model.clean()  # lmms-eval calls this after a run; the object must still answer afterwards
    again = model.generate_until([request("ocr", "What colour is this?", "image", {"until": ["\n\n"]})])
    assert again == first  # greedy, same seed-0 replica

    omni = lmms.OscarEvalLMM(model="tiny-qwen3-omni", quant="kivi", max_new_tokens=4)
    omni.task_dict = DOCS
    assert len(omni.generate_until([request("mmau", "What is heard?", "audio", {})])) == 1


def test_failures_raise_instead_of_empty_answers():
    model = lmms.OscarEvalLMM(model="tiny-llava", quant="oscar", max_new_tokens=3)
    model.task_dict = DOCS
    with pytest.raises(RuntimeError, match="task mmau doc 0"):  # LLaVA takes no audio
        model.generate_until([request("mmau", "What is heard?", "audio", {})])


def test_bad_arguments_are_named():
    with pytest.raises(KeyError, match="known presets"):
        lmms.OscarEvalLMM(model="tiny-llava", quant="int1")
    with pytest.raises(ValueError, match="model name"):
        lmms.OscarEvalLMM()
    assert lmms.cut_at_stops("a cat\n\nQ: next", ["\n\n"]) == "a cat"


def test_entry_point_loads_after_our_module_without_a_cycle():
    """Importing harness.lmms first (as the tests and `python -m` do) and then lmms-eval's model registry
    once asked for `manifests` of a half-imported module; the registry must list every oscar model."""
    code = (
        "import harness.lmms, lmms_eval.models as m; "
        "print(sorted(k for k in m.AVAILABLE_MODELS if k.startswith('oscar')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Failed to load model entry-point" not in proc.stdout + proc.stderr
    listed = proc.stdout.strip().splitlines()[-1]
    assert listed == str(["oscar_eval", "oscar_llava", "oscar_qwen3_omni", "oscar_qwen3_vl"])


def test_batch_size_answers_as_one_at_a_time():
    """lmms-eval's batch_size: requests share a left-padded generate and each gets its own batch-1 answer."""
    docs = {"ocr": {"test": [{"image": Image.new("RGB", (40 + 8 * i, 32), (200, 40 + 50 * i, 40))} for i in range(3)]}}

    def requests():
        return [
            Instance(
                "generate_until",
                (f"Read line {i} of this sign. " * (i + 1), {}, lambda doc: [doc["image"]], i, "ocr", "test"),
                idx=0,
                metadata={"task": "ocr", "doc_id": i, "repeats": 1},
            )
            for i in range(3)
        ]

    answers = {}
    for size in (1, 3):
        model = lmms.OscarEvalLMM(model="tiny-qwen3-vl", quant="oscar", max_new_tokens=5, batch_size=size)
        model.task_dict = docs
        answers[size] = model.generate_until(requests())
        assert str(model.device) == "cpu"
    assert answers[3] == answers[1] and len(answers[1]) == 3


@pytest.mark.parametrize("preset", ["together-oscar", "together-oscar-own-paper"])
def test_together_oscar_answers_as_the_harness_does(preset):
    """Together AI's OSCAR at both full-precision budgets through the plugin: its calibrated rotation is made from the
    model the plugin loaded, the prompt outgrows the budget (tokens are packed), and the answer is the harness's own
    for the same prompt."""
    from harness import models
    from harness.runner import answer
    from tasks.contract import Generate

    context = "Read the sign and say what it says. " + "The market opens at nine and closes at five. " * 60
    docs = {"ocr": {"test": [{"image": Image.new("RGB", (40, 32), (200, 40, 40))}]}}
    model = lmms.OscarEvalLMM(model="tiny-llava", quant=preset, max_new_tokens=6)
    model.task_dict = docs
    budget = model.method.sink_tokens + model.method.residual_length
    assert (model.method.sink_tokens, model.method.residual_length) == ((64, 256) if "own" in preset else (0, 128))
    got = model.generate_until([request("ocr", context, "image", {})])

    prompt = lmms.to_prompt(context, [docs["ocr"]["test"][0]["image"]])
    plugin = model.runner.run([Generate(prompt, 6)])[0]
    assert plugin.input_tokens > budget + 128 and plugin.kv_bytes["quantized"] > 0  # past the budget: packed
    own = answer(models.load("tiny-llava"), [prompt], preset, max_new_tokens=6)[0]
    assert got == [own.text] and plugin.tokens == own.tokens
