"""Text models with seeded random weights (harness/models/synthetic.py): a checkpoint's config and tokenizer. The
tiny text backbone every multimodal family's tiny preset shares is here too."""

from __future__ import annotations

from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen3Config

from harness.models.synthetic import CHATML_TEMPLATE, LLAMA3_TEMPLATE, TINY_VOCAB, checkpoint_tokenizer

CONFIGS = {"qwen3": Qwen3Config, "llama": LlamaConfig, "mistral": MistralConfig}
# The tiny presets' text backbone: hidden 64, 2 layers, 4 query / 2 KV heads, head_dim 64 (value groups of 32 fit).
TINY_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=TINY_VOCAB,
    max_position_embeddings=4096,
)


def config(values: dict):
    values = dict(values)
    return CONFIGS[values.pop("model_type")](**values)


def model_class(config) -> type:
    """The causal LM class of the config's type (what from_pretrained builds)."""
    return AutoModelForCausalLM._model_mapping[type(config)]


def processor(tokens: dict, settings: dict):
    """The tokenizer of a checkpoint's special tokens, with a chat template of its format (ChatML or Llama 3)."""
    if "im_end" in tokens:
        return checkpoint_tokenizer(tokens, "im_end", "endoftext", {}, CHATML_TEMPLATE)
    return checkpoint_tokenizer(tokens, "eot", "end_of_text", {}, LLAMA3_TEMPLATE)
