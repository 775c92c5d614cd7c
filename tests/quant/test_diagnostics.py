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
    k_q, _, norms = pack_block(k, v, quant.get_method("oscar"), hadamard(64))
    cache_k = (k_q.dequantize() * norms[:, None, :, None]) @ hadamard(64)
    ours = diag.reconstruct_keys(k, diag.contiguous_groups(192, 32))
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
