"""The packed-cache attention reference against plain attention over the dequantized cache."""

import pytest
import torch

import quant
from quant.attention import packed_attention_reference
from quant.methods.base import LayerContext


def plain_attention(q, k, v, scaling, groups):
    k, v = k.repeat_interleave(groups, 1).double(), v.repeat_interleave(groups, 1).double()
    s = (q.double() @ k.transpose(-1, -2)) * scaling
    lq, t = q.shape[-2], k.shape[-2]
    causal = torch.arange(t)[None, :] <= torch.arange(t - lq, t)[:, None]
    return torch.softmax(s.masked_fill(~causal, float("-inf")), -1) @ v


@pytest.mark.parametrize("name", ["oscar", "oscar-rotation-only", "oscar-scaling-only"])
@pytest.mark.parametrize("t,lq,hq,hkv", [(300, 1, 8, 2), (257, 3, 4, 4), (129, 1, 8, 1), (64, 2, 4, 2)])
def test_reference_matches_attention_over_dequantized_cache(name, t, lq, hq, hkv):
    g = torch.Generator().manual_seed(t + lq)
    layer = quant.get_method(name).make_layer(LayerContext(0, 1, hkv, 64, {}))
    k, v = torch.randn(2, hkv, t, 64, generator=g), torch.randn(2, hkv, t, 64, generator=g)
    layer.update(k[..., : t - lq, :], v[..., : t - lq, :])
    for i in range(t - lq, t):  # the newest lq tokens arrive one at a time, as in decoding
        layer.update(k[..., i : i + 1, :], v[..., i : i + 1, :])
    q = torch.randn(2, hq, lq, 64, generator=g)
    dk, dv = layer._dense()
    ref = plain_attention(q, dk, dv, 0.125, hq // hkv)
    out = packed_attention_reference(q, layer.packed_view(), 0.125)
    assert out.shape == q.shape
    assert (out.double() - ref).abs().max() < 1e-4
