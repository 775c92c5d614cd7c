"""Whisper (speech recognition, an encoder–decoder): the adapter, the classes quant/ may touch, the synthetic sizes.

Its decoder's self- and cross-attention (WhisperAttention) take o = out_proj(softmax(q k^T) v) with v = v_proj(x) per
head and nothing between, so OScaR's value rotation folds into v_proj / out_proj (`value_fold`; quant/fold.py folds the
decoder's attentions only). WhisperAttention is not in `attention`: its cross-attention projects q from the decoder's
states and k, v from the encoder's, where that list promises q, k, v from one input (the fused q/k/v kernel). Its
LayerNorms and GELU MLPs are none of the forms the layer kernels fuse, and it has no RoPE.
"""

from harness.models.family import Family
from harness.models.text import _c
from quant.traits import ModelTraits

TRAITS = ModelTraits(value_fold=_c("whisper", "WhisperAttention"))

FAMILY = Family("whisper", reads=("audio",), traits=TRAITS, adapter="harness.models.whisper.adapter:WhisperAdapter")
