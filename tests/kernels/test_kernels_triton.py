"""Triton OScaR kernels against the float64 oracle (decode) and the reference packer (pack).

On a machine without a GPU the kernels run under the Triton interpreter (TRITON_INTERPRET=1, set
before triton is imported), on small shapes. Rule for attention (FlashAttention's): the kernel's
error against float64 is at most 2x the error of a plain bf16 torch implementation of the same formula.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from quant.kernels import triton_decode, triton_pack  # noqa: E402
from quant.kernels.reference import attention_bf16, attention_f64, random_packed_kv, relative_error  # noqa: E402
from quant.methods.oscar import OScaRConfig, pack_block  # noqa: E402
from quant.packed import PackedKV  # noqa: E402
from quant.primitives import hadamard  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def make_cache(b, hkv, t, tr, d, seed, rotate=True, token_norm=True, rotate_values=True):
    return random_packed_kv(b, hkv, t, tr, d, seed, rotate, token_norm, device=DEV, rotate_values=rotate_values)


def check_decode(kv, group, lq, kv_lens, res_lens, seed, split_tokens=128):
    b, hkv, d = kv.k_res.shape[0], kv.k_res.shape[1], kv.k_res.shape[3]
    q = torch.randn(b, hkv * group, lq, d, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    scaling = d**-0.5
    out = triton_decode.decode_attention(
        q.to(DEV), kv, scaling, kv_lens=kv_lens, res_lens=res_lens, split_tokens=split_tokens
    )
    assert out.shape == q.shape and out.dtype == q.dtype and torch.isfinite(out).all()
    ref = attention_f64(q, kv, scaling, kv_lens, res_lens)
    err, budget = relative_error(out, ref), relative_error(attention_bf16(q, kv, scaling, kv_lens, res_lens), ref)
    assert err <= 2 * budget, f"kernel error {err:.2e} > 2 x bf16 error {budget:.2e}"


@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_gqa_mixed_lengths(group):
    # Quantized lengths not multiples of 32/128 (the stored 192 padded to 256), residual lengths 37 / 5, splits of 128.
    kv = make_cache(2, 2, 192, 37, 64, seed=group)
    check_decode(kv, group, 1, kv_lens=[192 - 19, 67], res_lens=[37, 5], seed=10 + group)


def test_decode_head_dim_128_speculative():
    # Lq = 2 new tokens (causal among themselves in the window), head_dim of the target models.
    kv = make_cache(1, 1, 64, 9, 128, seed=3)
    check_decode(kv, 4, 2, kv_lens=[45], res_lens=[9], seed=4)


def test_decode_values_as_they_come():
    # OScaR's default: V's rotation folded into the model's weights, so the quantized values are V itself and the
    # output is not rotated back; the keys (and the query) still are.
    kv = make_cache(2, 2, 160, 23, 64, seed=31, rotate_values=False)
    assert not kv.values_rotated and not kv.rotate_out
    check_decode(kv, 4, 1, kv_lens=[160 - 7, 95], res_lens=[23, 6], seed=32)


def test_decode_launch_tuning_keeps_the_result():
    # num_warps / num_stages / waves / maxnreg (the launch's tuning knobs) change the tiling and the split plan,
    # not the result: still within 2x the bf16 error.
    kv = make_cache(2, 2, 256, 11, 64, seed=41)
    q = torch.randn(2, 8, 1, 64, generator=torch.Generator().manual_seed(42)).to(torch.bfloat16)
    ref = attention_f64(q, kv, 0.125)
    budget = relative_error(attention_bf16(q, kv, 0.125), ref)
    for opts in (
        {"num_stages": 2, "waves": 1.0},
        {"num_warps": 8, "num_stages": 4},
        {"maxnreg": 128, "waves": 4.0},
        {"split_tokens": 256},
    ):
        out = triton_decode.decode_attention(q.to(DEV), kv, 0.125, **opts)
        assert relative_error(out, ref) <= 2 * budget, opts


@pytest.mark.parametrize("rotate_values", [True, False])
def test_decode_merges_more_splits_than_one_chunk(rotate_values):
    # The combine takes 64 splits' partials per round (one program per query row): 66 splits of 128 tokens need two
    # rounds, the second short; the shorter second sequence leaves its late splits empty.
    kv = make_cache(2, 1, 8448, 6, 64, seed=61, rotate_values=rotate_values)
    check_decode(kv, 4, 1, kv_lens=[8448 - 5, 900], res_lens=[6, 2], seed=62)


def test_plan_splits_one_wave_where_rows_are_few():
    # On the H100 (132 SMs, 2 programs each) Qwen3 1 x 128K, 8 rows, runs faster with 32 splits (8 x 33 programs:
    # exactly one wave with the window's) than with the 3-wave rule's 49 (168 against 220 us). Batched points keep
    # that rule.
    assert triton_decode.plan_splits(130944, 8, 128, 132, 2) == (4096, 32)
    assert triton_decode.plan_splits(3968, 8, 128, 132, 2) == (512, 8)  # splits of >= 4 blocks (8 measured best)
    assert triton_decode.plan_splits(130944, 4, 128, 132, 2) == (2048, 64)  # the omni thinker's 4 KV heads
    assert triton_decode.plan_splits(32640, 128, 128, 132, 2) == (8192, 4)  # 16 x 32K: <4 splits fit a wave
    assert triton_decode.plan_splits(130944, 8, 128, 132, 2, waves=3) == (2688, 49)  # a given waves: the old rule
    assert triton_decode.plan_splits(0, 8, 128, 132, 2) == (128, 0)
    for tokens, rows in ((130944, 8), (5000, 3), (32640, 32), (100, 1)):
        split, splits = triton_decode.plan_splits(tokens, rows, 64, 132, 3)
        assert split % 64 == 0 and (splits - 1) * split < tokens <= splits * split


def test_decode_without_rotation_or_norm_and_empty_residual():
    kv = make_cache(1, 2, 96, 0, 64, seed=5, rotate=False, token_norm=False)
    check_decode(kv, 2, 1, kv_lens=[96], res_lens=[0], seed=6, split_tokens=128)


def test_decode_residual_only():
    kv = make_cache(2, 1, 32, 20, 64, seed=7)
    kv = PackedKV(None, None, None, kv.k_res, kv.v_res, kv.hadamard)
    check_decode(kv, 4, 1, kv_lens=None, res_lens=[20, 13], seed=8)


def test_decode_matches_quant_attention_reference():
    # The package's own torch path (quant.attention), not only this file's float64 oracle.
    from quant.attention import packed_attention_reference

    kv = make_cache(2, 2, 128, 21, 64, seed=21)
    q = torch.randn(2, 8, 1, 64, generator=torch.Generator().manual_seed(22)).to(torch.bfloat16).to(DEV)
    out = triton_decode.decode_attention(q, kv, 0.125, split_tokens=128)
    ref = attention_f64(q, kv, 0.125)
    assert relative_error(packed_attention_reference(q, kv, 0.125), ref) < 1e-2
    assert relative_error(out, packed_attention_reference(q, kv, 0.125).double()) < 1e-2


def test_decode_takes_a_plan():
    # A DecodePlan (quant.kernels.common) made once for a step's shape gives what the same split_tokens gives; one made
    # for another shape is refused with both shapes named.
    from quant.kernels.common import DecodePlan

    kv = make_cache(2, 2, 256, 21, 64, seed=23)
    q = torch.randn(2, 8, 1, 64, generator=torch.Generator().manual_seed(24)).to(torch.bfloat16).to(DEV)
    plan = DecodePlan(tokens=256, rows=4, splits=2, split_tokens=128)
    assert torch.equal(
        triton_decode.decode_attention(q, kv, 0.125, plan=plan),
        triton_decode.decode_attention(q, kv, 0.125, split_tokens=128),
    )
    with pytest.raises(ValueError, match="made for 8 rows of 256 tokens, the inputs hold 4 of 256"):
        triton_decode.decode_attention(q, kv, 0.125, plan=DecodePlan(256, 8, 2, 128))


def test_decode_with_the_first_new_token_packed():
    # A flush may pack the first of Lq new tokens (res_len = Lq - 1): it sees every packed token (itself the last),
    # the others the window causally; the oracle masks packed tokens too, so this checks that nothing more is needed.
    kv = make_cache(2, 2, 128, 6, 64, seed=31)
    q = torch.randn(2, 8, 3, 64, generator=torch.Generator().manual_seed(32)).to(torch.bfloat16).to(DEV)
    ref = attention_f64(q, kv, 0.125, None, [2, 6])
    out = triton_decode.decode_attention(q, kv, 0.125, res_lens=[2, 6], split_tokens=128)
    assert relative_error(out, ref) <= 2 * relative_error(attention_bf16(q, kv, 0.125, None, [2, 6]), ref)


def test_decode_rejects_bad_lengths():
    kv = make_cache(1, 1, 32, 4, 64, seed=9)
    q = torch.randn(1, 4, 1, 64).to(torch.bfloat16).to(DEV)
    with pytest.raises(ValueError, match="kv_lens must lie in"):
        triton_decode.decode_attention(q, kv, 0.1, kv_lens=[33])
    with pytest.raises(ValueError, match="only 4 in the full-precision window"):
        triton_decode.decode_attention(torch.randn(1, 4, 6, 64).to(DEV), kv, 0.1)
    with pytest.raises(ValueError, match="only 2 in the full-precision window"):  # per-sequence lengths on the host
        triton_decode.decode_attention(torch.randn(1, 4, 4, 64).to(DEV), kv, 0.1, res_lens=[2])
    with pytest.raises(ValueError, match="must be a positive multiple of 128"):
        triton_decode.decode_attention(q, kv, 0.1, split_tokens=48)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        triton_decode.decode_attention(
            q[:, :3],
            PackedKV(kv.k, kv.v, kv.norms, kv.k_res.expand(1, 2, 4, 64), kv.v_res.expand(1, 2, 4, 64), kv.hadamard),
            0.1,
        )


def test_pack_bit_exact_without_rotation():
    g = torch.Generator().manual_seed(11)
    k, v = torch.randn(2, 2, 64, 64, generator=g) * 3, torch.randn(2, 2, 64, 64, generator=g)
    for token_norm, zero_point in ((False, "float"), (True, "float"), (True, "integer")):
        cfg = OScaRConfig(rotation="none", token_norm=token_norm, zero_point=zero_point)
        ref = pack_block(k, v, cfg, None)
        got = triton_pack.pack_kv(k.to(DEV), v.to(DEV), rotate=False, token_norm=token_norm, zero_point=zero_point)
        for r, x in zip(ref[:2], got[:2]):
            for name in ("codes", "scale", "zero"):
                assert torch.equal(getattr(r, name), getattr(x, name).cpu()), (
                    f"{name} differs (norm={token_norm}, zero point {zero_point})"
                )
        if token_norm:
            torch.testing.assert_close(got[2].cpu(), ref[2], rtol=1e-6, atol=0)


def test_pack_rotated_matches_reference():
    # With the rotation, fp32 summation order differs from the reference matmul by an ulp, which may flip
    # a code sitting exactly on a rounding boundary; anything beyond that is a bug.
    g = torch.Generator().manual_seed(12)
    k = (torch.randn(1, 3, 64, 64, generator=g) * 2).to(torch.bfloat16)
    v = torch.randn(1, 3, 64, 64, generator=g).to(torch.bfloat16)
    ref = pack_block(k, v, OScaRConfig(), hadamard(64))
    got = triton_pack.pack_kv(k.to(DEV), v.to(DEV))
    torch.testing.assert_close(got[2].cpu(), ref[2], rtol=1e-5, atol=0)
    for r, x in zip(ref[:2], got[:2]):
        assert (r.unpacked() != x.unpacked().cpu()).float().mean() <= 1e-3
        torch.testing.assert_close(x.scale.cpu().float(), r.scale.float(), rtol=2e-3, atol=1e-6)
        torch.testing.assert_close(
            x.dequantize().cpu(), r.dequantize(), rtol=0, atol=2e-2 * r.dequantize().abs().max().item()
        )


def test_pack_keys_rotated_values_as_they_come():
    # rotate_values=False: the values' codes, scales and zeros are the unrotated reference's bit for bit (no
    # butterfly on them), the keys' those of the rotated reference up to an ulp's flips.
    g = torch.Generator().manual_seed(14)
    k, v = torch.randn(1, 2, 96, 64, generator=g) * 2, torch.randn(1, 2, 96, 64, generator=g)
    ref = pack_block(k, v, OScaRConfig(), hadamard(64), rotate_values=False)
    got = triton_pack.pack_kv(k.to(DEV), v.to(DEV), rotate_values=False)
    for name in ("codes", "scale", "zero"):
        assert torch.equal(getattr(ref[1], name), getattr(got[1], name).cpu()), f"value {name} differs"
    assert (ref[0].unpacked() != got[0].unpacked().cpu()).float().mean() <= 1e-3
    torch.testing.assert_close(got[2].cpu(), ref[2], rtol=1e-5, atol=0)
    plain = pack_block(k, v, OScaRConfig(rotation="none"), None)
    assert torch.equal(plain[1].codes, ref[1].codes)  # the reference's own switch: V untouched


def test_pack_rejects_partial_group():
    k = torch.randn(1, 1, 40, 64)
    with pytest.raises(ValueError, match="multiple of 32 tokens"):
        triton_pack.pack_kv(k, k)


def test_default_lengths_are_made_once_and_full():
    # A step that passes no lengths reads one cached int32 tensor per (device, batch, value), so a captured
    # decode step is the kernel alone (no fill kernels); its values are the stored token counts.
    from quant.kernels.common import prepare_decode

    kv = make_cache(2, 1, 64, 5, 64, seed=8)
    q = torch.randn(2, 2, 1, 64).to(torch.bfloat16).to(DEV)
    a, b = prepare_decode(q, kv), prepare_decode(q, kv)
    assert a.kv_lens is b.kv_lens and a.res_lens is b.res_lens
    assert a.kv_lens.tolist() == [64, 64] and a.res_lens.tolist() == [5, 5]
    assert a.kv_lens.dtype == torch.int32
    given = prepare_decode(q, kv, kv_lens=[10, 20])
    assert given.kv_lens.tolist() == [10, 20] and given.res_lens is a.res_lens


def test_default_backend_per_device_and_the_triton_fallback_warning(monkeypatch):
    # CPU tensors: the torch reference. A CUDA device takes the CUDA kernels where nvcc can build them, else Triton,
    # with a warning (once a process) that says how to get the faster path or choose Triton quietly. The
    # environment is not read here: a run's choice is its KernelOptions.
    import warnings

    import quant.kernels.options as K

    monkeypatch.setenv("OSCAR_KERNEL_BACKEND", "torch")  # ignored by the library
    assert K.default_backend("cpu") == "torch"
    monkeypatch.setattr(K, "_has_nvcc", lambda: True)
    assert K.default_backend("cuda") == "cuda"
    assert K.KernelOptions(backend="triton").backend_for("cuda") == "triton"
    monkeypatch.setattr(K, "_has_nvcc", lambda: False)
    K._warn_triton_fallback.cache_clear()
    with pytest.warns(UserWarning, match="without nvcc.*CUDA_HOME.*backend=triton"):
        assert K.default_backend("cuda") == "triton"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert K.default_backend(torch.device("cuda", 0)) == "triton"
    with pytest.raises(ValueError, match="choose one of"):
        K.KernelOptions(backend="tensorrt")
