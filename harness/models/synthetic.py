"""Models with seeded random weights, in two sizes: a family's tiny preset and a registered checkpoint's published
architecture (shape-real). One builder makes both; each family's folder gives its sizes (harness/models/<family>/
synthetic.py: its config class and model class, the tiny config and processor, the processor of a checkpoint's
settings).

- tiny (`load_tiny`; registry names tiny-<family>): the real model and processor classes with shrunken configs (text
  hidden 64, 2 layers, 4 query / 2 KV heads, head_dim 64 so value groups of 32 channels fit; 2-layer vision and audio
  encoders), a byte-level tokenizer (256 byte tokens, the family's special tokens right after them) and chat
  templates in each family's format. Every code path of the real models runs (anyres tiling, M-RoPE, deepstack, the
  MoE thinker, the audio encoder); the answers mean nothing. The tests and the pipeline demos run on them.
- shape-real (`load_random`, `--weights random`): the published architecture of a registered checkpoint
  (harness/models/shapes.py), the real processor classes with the checkpoint's settings, its special tokens at their
  own ids. Speed, memory and the code path do not depend on the weights' values, so a run measures what an eval of
  the real checkpoint costs without the checkpoint. What differs from the real model: the tokenizer is byte-level (a
  question takes more text tokens than the real BPE gives it; image and audio placeholders are exact, because the
  real image processor / feature extractor with the real settings expands them); the chat templates are short ones
  in each family's format; random weights rarely emit an end token, so answers run to max_new_tokens.

Weights come from transformers' own initialisation, drawn from the global generator seeded with `seed`. A shape-real
model is constructed under `torch.device(device)` in its dtype, so no CPU copy is ever made. A tiny preset is drawn on
the CPU in float32 with seed 0 and then moved, so it is the same on every device; its normalization gains are drawn
from U(0.5, 1.5) instead of their init value 1 (with all-ones gains Qwen3's k_norm makes every key norm exactly
sqrt(H * D), which would hide any token-norm structure from the diagnostics). Results carry model.weights = "random"
(harness/results.py).
"""

from __future__ import annotations

import copy

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from harness.models.common import parse_dtype
from harness.models.family import sizes
from harness.models.shapes import shape

TINY_VOCAB = 320  # 256 byte tokens + specials, rounded up

# ChatML with Qwen's media markers; the real checkpoints ship longer templates with the same output.
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Vicuna format of llava-hf/llava-v1.6-vicuna-7b-hf: images first, then the question.
LLAVA_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'][0]['text'] }} "
    "{% elif m['role'] == 'user' %}USER: {% for c in m['content'] %}{% if c['type'] == 'image' %}<image>\n"
    "{% endif %}{% endfor %}{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %} {% else %}ASSISTANT: {{ m['content'][0]['text'] }}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)
LLAMA3_TEMPLATE = (
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant"
    "<|end_header_id|>\n\n{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# ----------------------------------------------------------------------------- tokenizers
def byte_tokenizer(eos: str, pad: str, named: dict[str, str], others: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """A tiny preset's tokenizer: byte-level BPE without merges, ids 0-255 the bytes, specials after them in the order
    given. named: attribute -> token string (e.g. image_token), exposed as tokenizer.image_token(_id)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = list(dict.fromkeys([eos, pad, *others, *named.values()]))
    tok.add_special_tokens(specials)
    if len(alphabet) + len(specials) > TINY_VOCAB:
        raise ValueError(f"{len(alphabet) + len(specials)} tokens do not fit the tiny vocabulary of {TINY_VOCAB}")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad, extra_special_tokens=named)


def checkpoint_tokenizer(
    tokens: dict[str, tuple[str, int]], eos: str, pad: str, named: dict[str, str], chat_template: str | None = None
) -> PreTrainedTokenizerFast:
    """A shape-real model's tokenizer: byte-level BPE without merges (ids 0-255 the bytes) plus the checkpoint's
    special tokens at their own ids. tokens: key -> (text, id) of shapes.SHAPES[...]["tokens"]; eos/pad/named values
    are keys of it. Ids between 256 and the vocabulary size decode to nothing (a random model may emit them)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({text: tid for text, tid in tokens.values()})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(text, special=True, normalized=False) for text, _ in tokens.values()])
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=tokens[eos][0],
        pad_token=tokens[pad][0],
        extra_special_tokens={attr: tokens[key][0] for attr, key in named.items()},
    )
    out.chat_template = chat_template
    return out


# ----------------------------------------------------------------------------- models
def seeded_model(model_cls, config, device="cpu", dtype=torch.float32, seed: int = 0, spread_norms: bool = False):
    """`model_cls` built from `config` with weights created on `device` in `dtype` ("meta" allocates nothing), drawn
    with `seed` by transformers' initialisation. spread_norms: normalization gains from U(0.5, 1.5) (tiny presets)."""
    torch.manual_seed(seed)  # seeds the CPU and every CUDA generator: the same weights on every run of a device kind
    with torch.device(device):
        if dtype is None:  # the default dtype, left unrecorded in the config
            model = model_cls._from_config(config).eval()
        else:
            model = model_cls._from_config(config, dtype=parse_dtype(dtype)).eval()
    if spread_norms:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name and name.endswith("weight") and param.dim() == 1:
                    param.uniform_(0.5, 1.5)
    return model


def merged(base: dict, overrides: dict | None) -> dict:
    """A deep copy of `base` with `overrides` applied: nested dicts merge key by key, other values replace."""
    out = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def build_config(name: str, family: str, overrides: dict | None = None):
    """The transformers config of `name`'s published architecture (`overrides`: tests shrink widths/depths)."""
    return sizes(family).config(merged(shape(name)["config"], overrides))


def build_model(
    name: str, family: str, device="meta", dtype=torch.bfloat16, seed: int = 0, overrides: dict | None = None
):
    """`name`'s published architecture with weights created on `device` in `dtype`, drawn with `seed`. device "meta"
    allocates nothing (parameter counts, shapes); any other device gets every tensor allocated there directly: 8B
    parameters in bf16 take 16 GB of that device and none of the host's."""
    config = build_config(name, family, overrides)
    return seeded_model(sizes(family).model_class(config), config, device, dtype, seed)


def build_processor(name: str, family: str):
    """The family's real processor class with the checkpoint's settings and its special tokens."""
    sh = shape(name)
    return sizes(family).processor(sh["tokens"], sh["processor"])


def count_parameters(model, skip: tuple[str, ...] = ()) -> int:
    """Parameters of `model` (tied tensors once), leaving out names containing any string of `skip`."""
    seen, total = set(), 0
    for pname, p in model.named_parameters(remove_duplicate=True):
        if id(p) in seen or any(s in pname for s in skip):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


# ----------------------------------------------------------------------------- loading through the registry
def default_device(device) -> str:
    return str(device) if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")


def _adapter(adapter_cls, spec, model, processor, device):
    if spec.family == "text":
        from harness.models.text.adapter import fix_special_tokens

        fix_special_tokens(processor, model)
        adapter = adapter_cls(spec, model, processor)
    else:
        adapter = adapter_cls(spec, model, processor, device=device)
    adapter.weights = "random"
    return adapter


def load_random(adapter_cls, spec, device=None, dtype=None, device_map=None, seed: int = 0, overrides=None):
    """An adapter of `adapter_cls` around `spec`'s shape-real model with seeded random weights.

    dtype defaults to bf16 (the checkpoints' dtype). device_map is refused: the weights are made on one device.
    """
    if device_map is not None:
        raise ValueError(
            f"--device-map {device_map!r} with --weights random: random weights are created on one "
            f"device; pass --device cuda:N instead (or load the real weights with the device map)"
        )
    device = default_device(device)
    dtype = parse_dtype(dtype) if dtype not in (None, "auto") else torch.bfloat16
    model = build_model(spec.name, spec.family, device=device, dtype=dtype, seed=seed, overrides=overrides)
    return _adapter(adapter_cls, spec, model, build_processor(spec.name, spec.family), device)


def load_tiny(adapter_cls, spec, device=None, dtype=None):
    """An adapter of `adapter_cls` around the family's tiny preset (float32 on the CPU unless told)."""
    preset = sizes(spec.family)
    config, processor = preset.tiny()
    device = device or "cpu"
    model = seeded_model(preset.model_class(config), config, "cpu", None, 0, spread_norms=True)
    if dtype is not None:
        model = model.to(parse_dtype(dtype))
    adapter = _adapter(adapter_cls, spec, model.to(device), processor, device)
    for key, value in getattr(preset, "TINY_ADAPTER", {}).items():  # e.g. a small image-token budget
        setattr(adapter, key, value)
    return adapter
