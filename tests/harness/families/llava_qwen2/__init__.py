"""A family the project does not ship: LLaVA-NeXT on a Qwen2 language model (LLaVA-NeXT takes any causal LM as its
text model). The adapter is LLaVA's; what is new is the text model's classes (the traits quant/ may touch) and the
synthetic sizes (synthetic.py)."""

from harness.models.family import Family
from quant.traits import ModelTraits

QWEN2 = "transformers.models.qwen2.modeling_qwen2"
TRAITS = ModelTraits(
    attention=(f"{QWEN2}.Qwen2Attention",), mlp=(f"{QWEN2}.Qwen2MLP",), norm=(f"{QWEN2}.Qwen2RMSNorm",), rope=(QWEN2,)
)

FAMILY = Family(
    "llava_qwen2", reads=("image", "text"), traits=TRAITS, adapter="harness.models.llava.adapter:LlavaAdapter"
)
