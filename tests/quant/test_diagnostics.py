"""Token-norm statistics, group layouts and OScaR key reconstruction of quant.diagnostics."""

from __future__ import annotations

import pytest
import torch

import quant
from quant import diagnostics as diag
from quant.methods.oscar import pack_block
from quant.primitives import hadamard


def keys(seed=0, s=192, h=2, d=64):
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand(1, 1, s, 1, generator=g) * 4 + 0.1
    return torch.randn(1, h, s, d, generator=g) * scale


def test_contiguous_reconstruction_is_the_caches_oscar_arithmetic():
    k = keys()
    v = torch.randn_like(k)
    method = quant.get_method("oscar")
    k_q, _, norms = pack_block(k, v, method, hadamard(64))
    cache_k = (k_q.dequantize() * norms[:, None, :, None]) @ hadamard(64)
    ours = diag.reconstruct_keys(k, diag.contiguous_groups(192, 32), zero_point=method.zero_point)
    torch.testing.assert_close(ours, cache_k, rtol=0, atol=1e-6)


def test_layouts():
    tags = torch.tensor([0] * 20 + [1] * 70 + [0] * 38)
    assert diag.segments(tags) == [(0, 20, 0), (20, 90, 1), (90, 128, 0)]
    aligned = diag.aligned_groups(tags, 32)
    assert aligned == [(0, 20), (20, 52), (52, 84), (84, 90), (90, 122), (122, 128)]
    assert all(len(set(tags[a:b].tolist())) == 1 for a, b in aligned)
    shifted = diag.shifted_groups(aligned, 128, 16)
    assert len(shifted) == len(aligned) and shifted[0][0] == 0 and shifted[-1][1] == 128
    assert diag.contiguous_groups(70, 32) == [(0, 32), (32, 64), (64, 70)]


def test_norm_stats_see_an_imbalance():
    norms = torch.cat([torch.full((64,), 2.0), torch.full((64,), 8.0)])
    tags = torch.tensor([0] * 64 + [1] * 64)
    stats = diag.norm_stats(norms, tags)
    assert stats["imbalance"] == pytest.approx(4.0)
    assert stats["per_modality"]["image"]["mean"] == pytest.approx(8.0)
    assert stats["boundaries"] == 1 and stats["within_jump"] == pytest.approx(0.0)
    assert stats["boundary_jump"] == pytest.approx(torch.log(torch.tensor(4.0)).item())
    tags_off = torch.tensor([0] * 48 + [1] * 80)  # the boundary inside group 1 of 4
    assert diag.norm_stats(norms, tags_off)["group_ratio"]["straddling_groups"] == 1


def test_alignment_helps_when_a_boundary_splits_very_different_tokens():
    """Keys of two modalities with 100x different channel offsets: without token scaling a straddling
    group spans both ranges, so aligned groups must beat both contiguous and the shifted control."""
    g = torch.Generator().manual_seed(1)
    k = torch.randn(1, 2, 128, 64, generator=g)
    k[:, :, 48:] += 30 * torch.randn(1, 2, 1, 64, generator=g)
    tags = torch.tensor([0] * 48 + [1] * 80)
    study = diag.alignment_study([k], tags, methods={"kivi_keys": {"rotation": False, "token_norm": False}})
    err = study["error"]["kivi_keys"]
    assert err["aligned"]["text"] < 0.5 * err["contiguous"]["text"]
    assert err["aligned"]["all"] < err["shifted"]["all"]
    assert study["scale_bits"]["aligned"] > study["scale_bits"]["contiguous"]


def test_per_modality_error():
    x = torch.ones(1, 1, 4, 2)
    x_hat = x.clone()
    x_hat[0, 0, 3] = 0
    err = diag.per_modality_error(x, x_hat, torch.tensor([0, 0, 1, 1]))
    assert err == {"all": 0.25, "text": 0.0, "image": 0.5}


def test_value_reconstruction_is_the_caches_arithmetic():
    """OScaR's values: rotated, 2-bit per token over 32-channel groups, rotated back (pack_block, rotated online);
    without the rotation, KIVI's per-token values."""
    k = keys(seed=2)
    v = keys(seed=3)
    method = quant.get_method("oscar")
    _, v_q, _ = pack_block(k, v, method, hadamard(64))
    ours = diag.reconstruct_values(v, zero_point=method.zero_point)
    torch.testing.assert_close(ours, v_q.dequantize() @ hadamard(64), rtol=0, atol=1e-6)
    from quant.packed import quantize

    kivi = quantize(v, 2, 32, axis=-1).dequantize()  # KIVI's own float zero point
    torch.testing.assert_close(diag.reconstruct_values(v, rotation=False), kivi, rtol=0, atol=0)


def test_token_errors():
    x = torch.ones(1, 2, 3, 2)
    x_hat = x.clone()
    x_hat[0, :, 1] = 0.5  # half of every entry of token 1
    x_hat[0, 0, 2] = 0.0  # all of one head of token 2
    assert diag.token_errors(x, x_hat).tolist() == pytest.approx([0.0, 0.5, 0.5**0.5])
    assert diag.token_errors(torch.zeros(1, 1, 2, 2), torch.ones(1, 1, 2, 2)).tolist() == [0.0, 0.0]


def test_outlier_tokens_are_named_against_their_modalitys_median():
    """A first token with 2/9 of the others' norm, and an image token at 3x the image median: both named, the
    farthest first; a 1.5x token is not an outlier."""
    norms = torch.tensor([2.0, 9.0, 9.0, 9.0, 13.5, 20.0, 20.0, 60.0, 20.0])
    tags = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1])
    out = diag.outlier_tokens(norms, tags)
    assert [(o["position"], o["modality"]) for o in out] == [(0, "text"), (7, "image")]
    assert out[0]["ratio"] == pytest.approx(2 / 9) and out[1]["ratio"] == pytest.approx(3.0)
    assert diag.outlier_tokens(norms, tags, factor=1.0, limit=1)[0]["position"] == 0  # the farthest of all
