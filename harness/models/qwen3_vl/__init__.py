"""Qwen3-VL: the adapter, the classes quant/ may touch (the text model, dense and MoE), the synthetic sizes."""

from harness.models.family import Family
from harness.models.text import _c, _m
from quant.traits import ModelTraits

TRAITS = ModelTraits(
    attention=_c("qwen3_vl", "Qwen3VLTextAttention") + _c("qwen3_vl_moe", "Qwen3VLMoeTextAttention"),
    mlp=_c("qwen3_vl", "Qwen3VLTextMLP") + _c("qwen3_vl_moe", "Qwen3VLMoeTextMLP"),
    norm=_c("qwen3_vl", "Qwen3VLTextRMSNorm") + _c("qwen3_vl_moe", "Qwen3VLMoeTextRMSNorm"),
    rope=(_m("qwen3_vl"), _m("qwen3_vl_moe")),
)

FAMILY = Family(
    "qwen3_vl", reads=("image", "text"), traits=TRAITS, adapter="harness.models.qwen3_vl.adapter:Qwen3VLAdapter"
)
