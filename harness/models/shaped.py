"""Shape-real models: the published architecture of a registered checkpoint (harness/models/shapes.py) with seeded
random weights, the real processor classes with the real settings, and the project's own tokenizer.

Speed, memory and the code path taken do not depend on the weights' values, so `--weights random` measures what an
eval of the real checkpoint costs without the checkpoint. What differs from the real model:
- the tokenizer is byte-level (every UTF-8 byte one token, the checkpoint's special tokens at their real ids), so a
  question takes more text tokens than the real BPE gives it; image and audio placeholders are exact, because the
  real image processor / feature extractor with the real settings expands them;
- the chat templates are short ones in each family's format (tiny.py), not the checkpoints' own;
- random weights rarely emit an end token, so answers run to max_new_tokens: the worst case of decode time.

The weights are created on the target device in its dtype (default bf16): the model is constructed under
`torch.device(device)`, so no CPU copy is ever made, and transformers' own initialisation draws them from the global
generator seeded with `seed` (normal(0, initializer_range) matrices, unit norms, and the RoPE buffers computed as
in a real load). Results carry model.weights = "random" (harness/results.py).
"""
from __future__ import annotations

import copy

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlavaNextConfig,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2VLImageProcessorPil,
    Qwen3Config,
    Qwen3OmniMoeConfig,
    Qwen3OmniMoeProcessor,
    Qwen3VLConfig,
    Qwen3VLProcessor,
    WhisperFeatureExtractor,
)

from harness.models.common import parse_dtype, without_video
from harness.models.shapes import shape
from harness.models.tiny import LLAVA_TEMPLATE, QWEN_TEMPLATE

FAMILY_CONFIGS = {"llava": LlavaNextConfig, "qwen3_vl": Qwen3VLConfig, "qwen3_omni": Qwen3OmniMoeConfig}
TEXT_CONFIGS = {"qwen3": Qwen3Config, "llama": LlamaConfig, "mistral": MistralConfig}
LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant"
    "<|end_header_id|>\n\n{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# ----------------------------------------------------------------------------- configs
def merged(base: dict, overrides: dict | None) -> dict:
    """A deep copy of `base` with `overrides` applied: nested dicts merge key by key, other values replace."""
    out = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def build_config(name: str, family: str, overrides: dict | None = None):
    """The transformers config of `name`'s published architecture (`overrides`: tests shrink widths/depths)."""
    values = merged(shape(name)["config"], overrides)
    if family == "text":
        values = dict(values)
        return TEXT_CONFIGS[values.pop("model_type")](**values)
    return FAMILY_CONFIGS[family](**values)


def model_class(family: str, config):
    """The class `from_pretrained` would build for this family (text: the causal LM of the config's type)."""
    from transformers import AutoModelForCausalLM

    from harness.models.llava import LlavaAdapter
    from harness.models.qwen3_omni import Qwen3OmniAdapter
    from harness.models.qwen3_vl import Qwen3VLAdapter

    if family == "text":
        return AutoModelForCausalLM._model_mapping[type(config)]
    return {"llava": LlavaAdapter, "qwen3_vl": Qwen3VLAdapter, "qwen3_omni": Qwen3OmniAdapter}[family].model_class


def build_model(name: str, family: str, device="meta", dtype=torch.bfloat16, seed: int = 0,
                overrides: dict | None = None):
    """`name`'s architecture with weights created on `device` in `dtype`, drawn with `seed`.

    device "meta" allocates nothing (parameter counts, shapes). Any other device gets every tensor allocated there
    directly: 8B parameters in bf16 take 16 GB of that device and none of the host's.
    """
    config = build_config(name, family, overrides)
    cls = model_class(family, config)
    torch.manual_seed(seed)  # seeds the CPU and every CUDA generator: the same weights on every run of a device kind
    with torch.device(device):
        model = cls._from_config(config, dtype=parse_dtype(dtype))
    return model.eval()


def count_parameters(model, skip: tuple[str, ...] = ()) -> int:
    """Parameters of `model` (tied tensors once), leaving out names containing any string of `skip`."""
    seen, total = set(), 0
    for pname, p in model.named_parameters(remove_duplicate=True):
        if id(p) in seen or any(s in pname for s in skip):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


# ----------------------------------------------------------------------------- tokenizer and processors
def byte_tokenizer(tokens: dict[str, tuple[str, int]], eos: str, pad: str, named: dict[str, str],
                   chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """Byte-level BPE without merges (ids 0-255 the bytes) plus the checkpoint's special tokens at their own ids.

    tokens: key -> (text, id) of shapes.SHAPES[...]["tokens"]; eos/pad/named values are keys of it.
    Ids between 256 and the vocabulary size decode to nothing (a random model may emit them).
    """
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({text: tid for text, tid in tokens.values()})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(text, special=True, normalized=False) for text, _ in tokens.values()])
    out = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=tokens[eos][0], pad_token=tokens[pad][0],
                                  extra_special_tokens={attr: tokens[key][0] for attr, key in named.items()})
    out.chat_template = chat_template
    return out


QWEN_NAMED = {"image_token": "image", "video_token": "video", "vision_bos_token": "vision_start",
              "vision_eos_token": "vision_end"}
OMNI_NAMED = {**QWEN_NAMED, "audio_token": "audio", "audio_bos_token": "audio_start", "audio_eos_token": "audio_end"}


def qwen_image_processor(settings: dict) -> Qwen2VLImageProcessorPil:
    s = settings["image"]
    return Qwen2VLImageProcessorPil(patch_size=s["patch_size"], merge_size=s["merge_size"],
                                    temporal_patch_size=s["temporal_patch_size"], image_mean=s["image_mean"],
                                    image_std=s["image_std"],
                                    size={"shortest_edge": s["min_pixels"], "longest_edge": s["max_pixels"]})


def build_processor(name: str, family: str):
    """The family's real processor class with the checkpoint's settings and the byte tokenizer."""
    sh = shape(name)
    tokens, settings = sh["tokens"], sh["processor"]
    if family == "llava":
        tokenizer = byte_tokenizer(tokens, "eos", "pad", {"image_token": "image"})
        image_processor = LlavaNextImageProcessorPil(**settings["image"])
        return LlavaNextProcessor(image_processor, tokenizer, chat_template=LLAVA_TEMPLATE, **settings["processor"])
    if family == "qwen3_vl":
        tokenizer = byte_tokenizer(tokens, "im_end", "endoftext", QWEN_NAMED)
        return without_video(Qwen3VLProcessor)(qwen_image_processor(settings), tokenizer, video_processor=None,
                                               chat_template=QWEN_TEMPLATE)
    if family == "qwen3_omni":
        tokenizer = byte_tokenizer(tokens, "im_end", "endoftext", OMNI_NAMED)
        return without_video(Qwen3OmniMoeProcessor)(
            image_processor=qwen_image_processor(settings), video_processor=None,
            feature_extractor=WhisperFeatureExtractor(**settings["audio"]), tokenizer=tokenizer,
            chat_template=QWEN_TEMPLATE)
    if family == "text":
        if "im_end" in tokens:
            return byte_tokenizer(tokens, "im_end", "endoftext", {}, CHATML_TEMPLATE)
        return byte_tokenizer(tokens, "eot", "end_of_text", {}, LLAMA3_TEMPLATE)
    raise KeyError(f"no shape-real processor for family {family!r}")


# ----------------------------------------------------------------------------- loading through the registry
def default_device(device) -> str:
    return str(device) if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")


def load_random(adapter_cls, spec, device=None, dtype=None, device_map=None, seed: int = 0, overrides=None):
    """An adapter of `adapter_cls` around `spec`'s shape-real model with seeded random weights.

    dtype defaults to bf16 (the checkpoints' dtype). device_map is refused: the weights are made on one device.
    """
    if device_map is not None:
        raise ValueError(f"--device-map {device_map!r} with --weights random: random weights are created on one "
                         f"device; pass --device cuda:N instead (or load the real weights with the device map)")
    device = default_device(device)
    dtype = parse_dtype(dtype) if dtype not in (None, "auto") else torch.bfloat16
    model = build_model(spec.name, spec.family, device=device, dtype=dtype, seed=seed, overrides=overrides)
    processor = build_processor(spec.name, spec.family)
    if spec.family == "text":
        adapter = adapter_cls(spec, model, processor)
        from harness.models.text import fix_special_tokens

        fix_special_tokens(processor, model)
    else:
        adapter = adapter_cls(spec, model, processor, device=device)
    adapter.weights = "random"
    return adapter
