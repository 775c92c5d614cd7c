"""Plain causal language models (SmolLM2, Qwen2.5, Gemma-3, Llama-3.1, Qwen3): the adapter, the classes quant/ may
touch, the synthetic sizes."""

from harness.models.family import Family
from quant.traits import ModelTraits


def _m(family: str) -> str:
    return f"transformers.models.{family}.modeling_{family}"


def _c(family: str, *names: str) -> tuple[str, ...]:
    return tuple(f"{_m(family)}.{name}" for name in names)


# Read in transformers 5.x (the tests under tests/kernels/ check them against the installed source;
# tests/harness/test_offline_models.py checks the Gemma-3 ones).
# Gemma-3 (Gemma3ForCausalLM, the text model): its attention projects q, k, v from one input in that order, normalizes
# q and k per head (q_norm, k_norm) but not v, and o_proj takes the value mix as it comes, so the values' rotation
# folds (its sliding-window layers run the same forward: the window is in the mask transformers builds). Its MLP is
# the gated form with a GELU (the fused MLP kernel takes SiLU MLPs only and leaves it on torch). Its RMSNorm is left
# out of `norm`: it scales by (1 + weight) and rounds after the product, where the fused norm kernel computes
# weight * x rounded before it.
TRAITS = ModelTraits(
    attention=_c("llama", "LlamaAttention")
    + _c("mistral", "MistralAttention")
    + _c("qwen2", "Qwen2Attention")
    + _c("qwen3", "Qwen3Attention")
    + _c("qwen3_moe", "Qwen3MoeAttention")
    + _c("smollm3", "SmolLM3Attention")
    + _c("gemma3", "Gemma3Attention"),
    mlp=_c("llama", "LlamaMLP")
    + _c("mistral", "MistralMLP")
    + _c("qwen2", "Qwen2MLP")
    + _c("qwen3", "Qwen3MLP")
    + _c("qwen3_moe", "Qwen3MoeMLP")
    + _c("smollm3", "SmolLM3MLP")
    + _c("gemma3", "Gemma3MLP"),
    norm=_c("llama", "LlamaRMSNorm")
    + _c("mistral", "MistralRMSNorm")
    + _c("qwen2", "Qwen2RMSNorm")
    + _c("qwen3", "Qwen3RMSNorm")
    + _c("qwen3_moe", "Qwen3MoeRMSNorm"),
    rope=tuple(_m(f) for f in ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "smollm3", "gemma3")),
)

FAMILY = Family("text", reads=("text",), traits=TRAITS, adapter="harness.models.text.adapter:TextAdapter")
