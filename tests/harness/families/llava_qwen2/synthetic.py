"""The family's sizes (harness/models/synthetic.py): a tiny preset only (no published checkpoint), LLaVA's tiny
preset with a Qwen2 text model and a Qwen-style tokenizer."""

from harness.models.llava import synthetic as llava


def config(values: dict):
    return llava.config(values)


def model_class(config) -> type:
    return llava.model_class(config)


def processor(tokens: dict, settings: dict):
    raise KeyError("llava_qwen2 has no published checkpoint: only its tiny preset")


def tiny():
    """(LlavaNextConfig with a 2-layer Qwen2 text model, LlavaNextProcessor)."""
    return llava.tiny("qwen2", eos="<|im_end|>", pad="<|endoftext|>", extra=("<|im_start|>",))
