"""Qwen3-Omni: the adapter (generating with the thinker), the classes quant/ may touch (the thinker's text model),
the synthetic sizes."""

from harness.models.family import Family
from harness.models.text import _c, _m
from quant.traits import ModelTraits

TRAITS = ModelTraits(
    attention=_c("qwen3_omni_moe", "Qwen3OmniMoeThinkerTextAttention"),
    mlp=_c("qwen3_omni_moe", "Qwen3OmniMoeThinkerTextMLP"),
    norm=_c(
        "qwen3_omni_moe",
        "Qwen3OmniMoeThinkerTextRMSNorm",
        "Qwen3OmniMoeTextRMSNorm",
        "Qwen3OmniMoeRMSNorm",
        "Qwen3OmniMoeCode2WavRMSNorm",
    ),
    rope=(_m("qwen3_omni_moe"),),
)

FAMILY = Family(
    "qwen3_omni",
    reads=("audio", "image", "text"),
    traits=TRAITS,
    adapter="harness.models.qwen3_omni.adapter:Qwen3OmniAdapter",
)
