"""The CPU reference path keeps each layer's dequantized blocks between flushes (QuantLayer._memo): every decode step
must see exactly what dequantizing everything stored again gives, across prompt, block flushes and sliding value
flushes, for every method that keeps it."""

import pytest
import torch

from tests.quant.test_methods import kv, layer_for, rope_tables

MEMO_METHODS = ["kivi", "quarot", "rotatekv", "turboquant", "oscar", "oscar-rotation-only", "oscar-scaling-only"]


def shared_for(name):
    return {"rope": rope_tables(64)} if name.startswith("rotatekv") else {}


@pytest.mark.parametrize("name", MEMO_METHODS + ["kivi-own-paper", "rotatekv-own-paper"])
def test_each_decode_step_sees_what_a_fresh_dequantization_gives(name):
    extra = {"calibrate": False} if name.startswith("rotatekv") else {}
    kept = layer_for(name, heads=2, shared=shared_for(name), **extra)
    fresh = layer_for(name, heads=2, shared=shared_for(name), **extra)
    fresh.memo_dense = False
    k, v = kv(b=2, h=2, t=131 + 270, d=64, seed=3)
    prompt = 131  # not a multiple of the window: the first decode steps flush mid-way
    for layer in (kept, fresh):
        layer.update(k[..., :prompt, :], v[..., :prompt, :])
    hits = 0
    for t in range(prompt, k.shape[-2]):
        before = dict(getattr(kept, "_dense_memo", {}))
        a = kept.update(k[..., t : t + 1, :], v[..., t : t + 1, :])
        b = fresh.update(k[..., t : t + 1, :], v[..., t : t + 1, :])
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), f"{name}: step {t} differs"
        hits += sum(1 for key, memo in kept._dense_memo.items() if key in before and before[key] is memo)
    if not name.endswith("own-paper"):  # RotateKV's own setting stores every token as it comes: nothing to reuse
        assert hits > 0, f"{name}: the dequantized blocks were never reused"


def test_a_reset_layer_forgets_what_it_kept():
    layer = layer_for("kivi")
    k, v = kv(b=1, h=2, t=300, d=64, seed=4)
    layer.update(k, v)
    layer.update(k[..., :1, :], v[..., :1, :])
    layer.reset()
    assert layer._dense_memo == {}
    k2, v2 = kv(b=1, h=2, t=300, d=64, seed=5)
    layer.update(k2, v2)
    out = layer.update(k2[..., :1, :], v2[..., :1, :])
    fresh = layer_for("kivi")
    fresh.memo_dense = False
    fresh.update(k2, v2)
    ref = fresh.update(k2[..., :1, :], v2[..., :1, :])
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
