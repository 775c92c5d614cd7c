"""The per-family quant.traits.ModelTraits the kernel and quant tests use: the classes quant/ used to list itself
(quant/fold.py FOLDABLE, quant/kernels/fused_linear.py MLP_CLASSES / ATTENTION_CLASSES, triton_norm ALLOWED,
triton_rope ALLOWED), one instance per model family as harness/models/<family>/ declares them. The tests that read
transformers' source check every class listed here."""

from __future__ import annotations

import contextlib

from quant.traits import ModelTraits


def _m(family: str) -> str:
    return f"transformers.models.{family}.modeling_{family}"


def _c(family: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{_m(family)}.{name}" for name in names)


# Text decoders (harness/models/text.py's families).
TEXT = ModelTraits(
    attention=(
        _c("llama", "LlamaAttention")
        + _c("mistral", "MistralAttention")
        + _c("qwen2", "Qwen2Attention")
        + _c("qwen3", "Qwen3Attention")
        + _c("qwen3_moe", "Qwen3MoeAttention")
        + _c("smollm3", "SmolLM3Attention")
    ),
    mlp=(
        _c("llama", "LlamaMLP")
        + _c("mistral", "MistralMLP")
        + _c("qwen2", "Qwen2MLP")
        + _c("qwen3", "Qwen3MLP")
        + _c("qwen3_moe", "Qwen3MoeMLP")
        + _c("smollm3", "SmolLM3MLP")
    ),
    norm=(
        _c("llama", "LlamaRMSNorm")
        + _c("mistral", "MistralRMSNorm")
        + _c("qwen2", "Qwen2RMSNorm")
        + _c("qwen3", "Qwen3RMSNorm")
        + _c("qwen3_moe", "Qwen3MoeRMSNorm")
    ),
    rope=tuple(_m(f) for f in ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "smollm3")),
)
# LLaVA: its language model (Llama or Mistral).
LLAVA = ModelTraits(
    attention=_c("llama", "LlamaAttention") + _c("mistral", "MistralAttention"),
    mlp=_c("llama", "LlamaMLP") + _c("mistral", "MistralMLP"),
    norm=_c("llama", "LlamaRMSNorm") + _c("mistral", "MistralRMSNorm"),
    rope=(_m("llama"), _m("mistral")),
)
QWEN3_VL = ModelTraits(
    attention=_c("qwen3_vl", "Qwen3VLTextAttention") + _c("qwen3_vl_moe", "Qwen3VLMoeTextAttention"),
    mlp=_c("qwen3_vl", "Qwen3VLTextMLP") + _c("qwen3_vl_moe", "Qwen3VLMoeTextMLP"),
    norm=_c("qwen3_vl", "Qwen3VLTextRMSNorm") + _c("qwen3_vl_moe", "Qwen3VLMoeTextRMSNorm"),
    rope=(_m("qwen3_vl"), _m("qwen3_vl_moe")),
)
# Qwen3-Omni: the thinker's text model (dense and MoE layers).
QWEN3_OMNI = ModelTraits(
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
FAMILIES = {"text": TEXT, "llava": LLAVA, "qwen3_vl": QWEN3_VL, "qwen3_omni": QWEN3_OMNI}
ALL = TEXT | LLAVA | QWEN3_VL | QWEN3_OMNI
# What quant/fold.py folded before the traits (SmolLM3Attention was fused, never folded).
FOLDABLE = tuple(name for name in ALL.attention if not name.endswith("SmolLM3Attention"))


def families(names: tuple[str, ...]) -> list[str]:
    """The transformers model families ("qwen3") of qualified names."""
    return sorted({name.split(".")[2] for name in names})


@contextlib.contextmanager
def prepared(model, method, kernels=None, traits: ModelTraits = ALL):
    """quant.prepare_model for the duration of a with-block, undone after it (the PreparedModel inside)."""
    import quant

    prep = quant.prepare_model(model, method, kernels, traits)
    try:
        yield prep
    finally:
        prep.undo()
