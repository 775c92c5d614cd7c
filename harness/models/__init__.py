"""Model registry: short name -> hub id, family, adapter class, default task.

Adapters are imported lazily, so listing models never imports a model family's code.
Weights load offline: from `model_path` (or the MODEL_PATH environment variable) or a warm HF cache.
"""
from __future__ import annotations

import importlib

from harness.models.base import ModelSpec


def _spec(name, hub_id, family, adapter, task, gpu_batch_size=1):
    return name, ModelSpec(name, hub_id, family, adapter, task, gpu_batch_size)


# Prompts per generate on a GPU (ModelSpec.gpu_batch_size), by model size. 7-8B models: 16, measured on an H100 with
# Qwen3-VL-8B (OCRBench generated sets, steady items/s at batch 16: 8-12x batch 1, docs/GPUS.md), where a batch of 16
# page-sized prompts (up to 3.8K tokens) keeps BF16's cache near 10 GiB beside 17 GiB of weights. The 30B Omni model's
# weights take 63 GiB of an 80 GiB card and its audio prompts reach 12K tokens (1.1 GiB of BF16 cache each): 4.
SMALL, LARGE = 16, 4


MODELS: dict[str, ModelSpec] = dict(
    [
        _spec("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "text", "harness.models.text:TextAdapter", "ppl"),
        _spec("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "text", "harness.models.text:TextAdapter", "ppl",
              SMALL),
        _spec("qwen3-8b", "Qwen/Qwen3-8B", "text", "harness.models.text:TextAdapter", "ppl", SMALL),
        _spec("llava-v1.6-7b", "llava-hf/llava-v1.6-vicuna-7b-hf", "llava", "harness.models.llava:LlavaAdapter",
              "ocrbench", SMALL),
        _spec("llava-v1.6-mistral-7b", "llava-hf/llava-v1.6-mistral-7b-hf", "llava",
              "harness.models.llava:LlavaAdapter", "ocrbench", SMALL),
        _spec("qwen3-vl-4b", "Qwen/Qwen3-VL-4B-Instruct", "qwen3_vl", "harness.models.qwen3_vl:Qwen3VLAdapter",
              "ocrbench", SMALL),
        _spec("qwen3-vl-8b", "Qwen/Qwen3-VL-8B-Instruct", "qwen3_vl", "harness.models.qwen3_vl:Qwen3VLAdapter",
              "ocrbench", SMALL),
        # Tiny random-weight replicas of the real classes (tests and pipeline demos; not model quality).
        _spec("tiny-llava", "random:tiny-llava-next", "llava", "harness.models.tiny:TinyLlavaAdapter", "ocrbench"),
        _spec("tiny-qwen3-vl", "random:tiny-qwen3-vl", "qwen3_vl", "harness.models.tiny:TinyQwen3VLAdapter",
              "ocrbench"),
        _spec("tiny-qwen3-omni", "random:tiny-qwen3-omni", "qwen3_omni", "harness.models.tiny:TinyQwen3OmniAdapter",
              "mmau-pro"),
        _spec("qwen3-omni-30b-a3b", "Qwen/Qwen3-Omni-30B-A3B-Instruct", "qwen3_omni",
              "harness.models.qwen3_omni:Qwen3OmniAdapter", "mmau-pro", LARGE),
    ]
)


def list_models() -> list[str]:
    return sorted(MODELS)


def get_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(list_models())}")
    return MODELS[name]


def check_weights(name: str, model_path: str | None, weights: str) -> None:
    """Raise the ModelLoadError `load` would raise (hub id, MODEL_PATH / --model-path, `hf download`) when `name`'s
    real weights are not here, without loading them: the eval loop calls it before it loads items, so a run that
    lacks both the model and the data names the model first, in seconds. The lookup is the adapters' own (text.py's
    weights_source, common.resolve_weights); random weights and the tiny replicas need no files and pass."""
    from harness.models.common import check_weights as check_choice

    check_choice(weights)
    spec = get_spec(name)
    if weights == "random" or spec.hub_id.startswith("random:"):
        return
    if spec.family == "text":
        from harness.models.text import find_weights

        find_weights(spec, model_path)
    else:
        from harness.models.common import resolve_weights

        resolve_weights(spec.hub_id, model_path)


def load(name: str, kernels=None, **options):
    """Load a registered model and return its adapter. Options: model_path, device, dtype, device_map, weights
    ("real", or "random": the published architecture with seeded random weights), seed.

    `kernels` (quant.kernels.KernelOptions; default: the defaults) says which of the project's layer kernels a GPU
    model gets (quant.kernels.patch_model: RMSNorm, RoPE and decode-sized linear layers) and goes to every cache
    the adapter makes (the decode backend, CUDA graphs, the decode builds).
    """
    from quant.kernels.options import KernelOptions

    spec = get_spec(name)
    module_name, class_name = spec.adapter.split(":")
    adapter_cls = getattr(importlib.import_module(module_name), class_name)
    if options.get("weights") == "random" and not spec.hub_id.startswith("random:"):
        # the published architecture with seeded random weights, made on the device (harness/models/shaped.py)
        from harness.models.shaped import load_random

        if spec.family == "text":
            from harness.models.text import default_device

            options["device"] = default_device(options.get("device"))
        adapter = load_random(adapter_cls, spec, device=options.get("device"), dtype=options.get("dtype"),
                              device_map=options.get("device_map"), seed=options.get("seed", 0))
    else:
        adapter = adapter_cls.load(spec, **options)
    adapter.kernels = kernels or KernelOptions()
    from quant.kernels import patch_model

    patch_model(adapter.model, adapter.kernels)
    return adapter
