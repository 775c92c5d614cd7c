"""What quant/ may assume about a model's transformers classes, given by the model's family (harness/models/<family>/).

quant/ holds no class names: folding the values' rotation, fusing the q/k/v projections, the MLP, the RMSNorms and
RoPE each touch only the classes a family lists here, after someone read their forward in transformers' source (the
tests under tests/kernels/ check the listed ones against the installed source). A class left out is left alone, or,
where the method needs it (OScaR's offline value rotation), refused with the switch that avoids it.

Names are qualified: "transformers.models.qwen3.modeling_qwen3.Qwen3Attention" (RoPE: the modeling module itself,
"transformers.models.qwen3.modeling_qwen3").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelTraits:
    # attention modules whose forward is o_proj(softmax(q k^T) v) with v = v_proj(x) per head and nothing between
    # (no output gate, no norm on the values), and which call q_proj, k_proj, v_proj in that order on one input
    attention: tuple[str, ...] = ()
    # dense MLPs whose forward is exactly down_proj(act_fn(gate_proj(x)) * up_proj(x))
    mlp: tuple[str, ...] = ()
    # RMSNorms computing weight * (x * rsqrt(mean(x^2) + variance_epsilon)) in float32, rounded after (not Gemma's)
    norm: tuple[str, ...] = ()
    # modeling modules whose module-level apply_rotary_pos_emb is the rotate-half RoPE
    rope: tuple[str, ...] = ()
    # attention modules whose output projection (o_proj or out_proj) takes the value mix as it comes, v = v_proj(x) per
    # head, without the one-input q/k/v promise of `attention` (an encoder-decoder's cross-attention): the values'
    # rotation folds into them (quant/fold.py), nothing else touches them
    value_fold: tuple[str, ...] = ()

    def __or__(self, other: "ModelTraits") -> "ModelTraits":
        """Both families' classes (a model built of several families' parts)."""
        join = lambda a, b: tuple(dict.fromkeys(a + b))  # noqa: E731
        return ModelTraits(
            join(self.attention, other.attention),
            join(self.mlp, other.mlp),
            join(self.norm, other.norm),
            join(self.rope, other.rope),
            join(self.value_fold, other.value_fold),
        )

    @staticmethod
    def name(cls: type) -> str:
        """The qualified name a trait lists for class `cls`."""
        return f"{cls.__module__}.{cls.__name__}"


NONE = ModelTraits()
