"""OScaR's packed store: a long prompt packed in chunks stores the codes of one pass, and the buffers that grow by
flushes hold what one concatenation of the blocks holds."""

from __future__ import annotations

import torch

import quant
from quant.methods import oscar


def cache_after(k, v, steps=0):
    cfg = type(
        "Cfg",
        (),
        {
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "hidden_size": 256,
            "num_hidden_layers": 1,
        },
    )()
    cache = quant.make_cache("oscar", config=cfg)
    layer = cache.layers[0]
    layer.update(k, v)
    for t in range(steps):
        layer.update(k[..., t : t + 1, :], v[..., t : t + 1, :])
    return layer


def test_chunked_pack_equals_one_pass(monkeypatch):
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 2, 700, 64, generator=g), torch.randn(1, 2, 700, 64, generator=g)
    whole = cache_after(k, v)
    monkeypatch.setattr(oscar, "PACK_CHUNK", 128)
    chunked = cache_after(k, v)
    for a, b in ((whole.k_q, chunked.k_q), (whole.v_q, chunked.v_q)):
        assert a.num_tokens == b.num_tokens == 640
        assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale) and torch.equal(a.zero, b.zero)
    assert torch.equal(whole.norms, chunked.norms) and torch.equal(whole.k_res, chunked.k_res)


def test_flushes_grow_the_buffers_and_keep_every_block():
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(1, 2, 1000, 64, generator=g), torch.randn(1, 2, 1000, 64, generator=g)
    layer = cache_after(k[..., :200, :], v[..., :200, :])
    assert layer._kbuf.num_tokens == 128 + oscar.HEADROOM  # room for two more flushes
    for t in range(200, 1000):
        layer.update(k[..., t : t + 1, :], v[..., t : t + 1, :])
    once = cache_after(k, v)  # the same tokens stored in one prefill
    assert layer.k_q.num_tokens == once.k_q.num_tokens == 896 and layer._kbuf.num_tokens >= 896
    assert torch.equal(layer.k_q.codes, once.k_q.codes) and torch.equal(layer.v_q.zero, once.v_q.zero)
    assert torch.equal(layer.norms, once.norms)
    assert layer.nbytes() == once.nbytes()  # views of the stored tokens: the headroom is not counted


def test_the_window_does_not_keep_the_prompt_alive():
    """After the prefill's flush the window holds its remainder in tensors of its own: a view would keep the whole
    prompt's exact K/V of every layer alive (more memory than BF16's cache)."""
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(1, 2, 700, 64, generator=g), torch.randn(1, 2, 700, 64, generator=g)
    cfg = type(
        "Cfg",
        (),
        {
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "hidden_size": 256,
            "num_hidden_layers": 1,
        },
    )()
    for method in ("oscar", "kivi", "ott", "quarot", "turboquant"):
        layer = quant.make_cache(method, config=cfg).layers[0]
        layer.update(k, v)
        for window in (layer.k_res, layer.v_res):
            assert window.shape[-2] == 700 - 640 or method == "kivi", method
            assert window.untyped_storage().nbytes() <= 2 * window.nbytes + 4096, method
