"""LLaVA-v1.6 (LLaVA-NeXT): the adapter, the classes quant/ may touch (its Llama / Mistral text backbone), the
synthetic sizes."""

from harness.models.family import Family
from harness.models.text import _c, _m
from quant.traits import ModelTraits

TRAITS = ModelTraits(
    attention=_c("llama", "LlamaAttention") + _c("mistral", "MistralAttention"),
    mlp=_c("llama", "LlamaMLP") + _c("mistral", "MistralMLP"),
    norm=_c("llama", "LlamaRMSNorm") + _c("mistral", "MistralRMSNorm"),
    rope=(_m("llama"), _m("mistral")),
)

FAMILY = Family("llava", reads=("image", "text"), traits=TRAITS, adapter="harness.models.llava.adapter:LlavaAdapter")
