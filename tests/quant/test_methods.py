"""Each method's stored state and reconstruction against a float64 reference of its formula, its
flush policy, and the synthetic token-norm-imbalance ordering (OScaR below KIVI and both ablations)."""

import math

import pytest
import torch

import quant
from quant.methods.base import CacheState, LayerContext
from quant.primitives import hadamard, lloyd_max_normal, random_orthogonal


def layer_for(name, heads=2, d=64, layer_idx=0, shared=None, state=None, **overrides):
    method = quant.get_method(name, **overrides)
    ctx = LayerContext(layer_idx, 4, heads, d, shared if shared is not None else {}, state or CacheState())
    return method.make_layer(ctx)


def kv(b=2, h=2, t=300, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, t, d, generator=g) * 2, torch.randn(b, h, t, d, generator=g)


def ref_group_quant(x, bits, group, axis, clip=1.0, zero_point="float"):
    """float64 reference: asym min/max per group (scale rounded to fp16), dequantized. Float zero point:
    x_hat = q * s + min; integer: z = round(-min / s), q = clamp(round(x / s) + z), x_hat = s * (q - z)."""
    x = x.double()
    b, h, t, d = x.shape
    xg = x.reshape(b, h, t // group, group, d) if axis == -2 else x.reshape(b, h, t, d // group, group)
    red = -2 if axis == -2 else -1
    hi, lo = xg.amax(red, keepdim=True) * clip, xg.amin(red, keepdim=True) * clip
    s = ((hi - lo) / (2**bits - 1)).half().clamp_min(2.0**-24).double()
    if zero_point == "integer":
        z = torch.round(-lo / s)
        q = (torch.round(xg / s) + z).clamp(0, 2**bits - 1)
        return (s * (q - z)).reshape(b, h, t, d)
    z = lo.half().double()
    q = torch.round((xg - z) / s).clamp(0, 2**bits - 1)
    return (q * s + z).reshape(b, h, t, d)


def close(a, b, tol=2e-3):
    """Equal up to float32 arithmetic; a rare code flipped by an exact .5 tie (float32 vs float64
    rounding, spread by a rotation) is allowed in at most 0.2% of elements."""
    diff = (a.double() - b.double()).abs()
    off = diff > tol * max(1.0, b.double().abs().max().item())
    return off.double().mean().item() < 2e-3


def test_kivi_prefill_and_flush_policy():
    layer = layer_for("kivi-own-paper")  # KIVI's own code: FIFO values, float zero point
    k, v = kv(t=300)
    out_k, out_v = layer.update(k, v)
    assert out_k is k and out_v is v  # the prompt attends with exact K/V
    assert layer.k_q.num_tokens == 256 and layer.k_res.shape[-2] == 44  # L - L mod R keys quantized
    assert layer.v_q.num_tokens == 172 and layer.v_res.shape[-2] == 128  # newest R values FP
    dk, dv = layer._dense()
    assert close(dk[..., :256, :], ref_group_quant(k[..., :256, :], 2, 32, -2))
    assert torch.equal(dk[..., 256:, :], k[..., 256:, :])
    assert close(dv[..., :172, :], ref_group_quant(v[..., :172, :], 2, 32, -1))
    # decode: keys flush all at once when R are pending, values pop one at a time (FIFO)
    k1, v1 = kv(t=84, seed=1)
    for i in range(83):
        layer.update(k1[..., i : i + 1, :], v1[..., i : i + 1, :])
    assert layer.k_res.shape[-2] == 127 and layer.v_q.num_tokens == 172 + 83
    layer.update(k1[..., 83:84, :], v1[..., 83:84, :])
    assert layer.k_res.shape[-2] == 0 and layer.k_q.num_tokens == 384 and layer.seen == 384


def test_kivi_paper_comparison_flushes_values_with_keys_and_rounds_the_zero_point():
    layer = layer_for("kivi")
    assert (layer.config.value_flush, layer.config.zero_point) == ("block", "integer")
    k, v = kv(t=300)
    layer.update(k, v)
    assert layer.v_q.num_tokens == 256 and layer.v_res.shape[-2] == 44
    dk, dv = layer._dense()
    assert close(dk[..., :256, :], ref_group_quant(k[..., :256, :], 2, 32, -2, zero_point="integer"))
    assert close(dv[..., :256, :], ref_group_quant(v[..., :256, :], 2, 32, -1, zero_point="integer"))
    assert not close(dk[..., :256, :], ref_group_quant(k[..., :256, :], 2, 32, -2))  # the conventions differ


@pytest.mark.parametrize("preset,zero_point", [("oscar", "integer"), ("oscar-float-zero", "float")])
def test_oscar_matches_float64_reference(preset, zero_point):
    layer = layer_for(preset)
    k, v = kv(t=300, seed=3)
    layer.update(k, v)
    assert layer.k_q.num_tokens == 256 and layer.k_res.shape[-2] == 44 and layer.norms.shape == (2, 256)
    h = hadamard(64, dtype=torch.float64)
    kr = k[..., :256, :].double() @ h
    n = kr.pow(2).sum(dim=(1, 3)).sqrt()
    assert torch.allclose(layer.norms.double(), n, rtol=1e-5)
    k_ref = (ref_group_quant(kr / n[:, None, :, None], 2, 32, -2, zero_point=zero_point) * n[:, None, :, None]) @ h
    v_ref = ref_group_quant(v[..., :256, :].double() @ h, 2, 32, -1, zero_point=zero_point) @ h
    dk, dv = layer._dense()
    assert close(dk[..., :256, :], k_ref) and close(dv[..., :256, :], v_ref)
    assert torch.equal(dk[..., 256:, :], k[..., 256:, :])


def test_oscar_flushes_128_token_blocks_during_decode():
    layer = layer_for("oscar")
    k, v = kv(t=130, seed=4)
    layer.update(k[..., :2, :], v[..., :2, :])  # a 2-token prompt: nothing to flush
    assert layer.k_q is None
    for i in range(2, 128):
        layer.update(k[..., i : i + 1, :], v[..., i : i + 1, :])
    assert layer.k_q.num_tokens == 128 and layer.k_res.shape[-2] == 0 and layer.get_seq_length() == 128
    out_k, _ = layer.update(k[..., 128:129, :], v[..., 128:129, :])
    assert out_k.shape[-2] == 129 and layer.k_res.shape[-2] == 1


def test_oscar_zero_norm_token_is_guarded():
    layer = layer_for("oscar")
    k, v = kv(b=1, t=128)
    k[..., 5, :] = 0
    layer.update(k, v)
    assert layer.norms[0, 5] == 1.0
    assert torch.isfinite(layer._dense()[0]).all()


def test_ablations_switch_exactly_one_component():
    rot_only, scale_only = quant.get_method("oscar-rotation-only"), quant.get_method("oscar-scaling-only")
    assert (rot_only.rotation, rot_only.token_norm) == ("hadamard", False)
    assert (scale_only.rotation, scale_only.token_norm) == ("none", True)
    layer = layer_for("oscar-rotation-only")
    layer.update(*kv(t=128))
    assert layer.norms is None


def test_quarot_quantizes_everything_per_token_with_clip():
    layer = layer_for("quarot-own-paper")
    k, v = kv(t=37, seed=5)
    layer.update(k, v)
    h = hadamard(64, dtype=torch.float64)
    dk, dv = layer._dense()
    assert close(dk, ref_group_quant(k.double() @ h, 2, 64, -1, clip=0.95, zero_point="integer") @ h)
    assert close(dv, ref_group_quant(v.double() @ h, 2, 64, -1, clip=0.95, zero_point="integer") @ h)
    layer.update(*kv(t=1, seed=6))  # a decode token is quantized at once: no FP window
    assert layer.k_q.num_tokens == 38
    kept = layer_for("quarot-own-paper", keep_first_tokens=4)
    kept.update(k, v)
    assert kept.k_fp.shape[-2] == 4 and torch.equal(kept._dense()[0][..., :4, :], k[..., :4, :])


@pytest.mark.parametrize("name", ["quarot", "rotatekv", "turboquant"])
def test_the_paper_comparison_gives_every_method_the_same_block_flushed_window(name):
    shared = {"rope": rope_tables(64)} if name == "rotatekv" else None
    plain = {"calibrate": False, "sink_tokens": 0} if name == "rotatekv" else {}
    layer = layer_for(name, heads=4, shared=shared, **plain)
    assert layer.config.window == 128
    k, v = kv(h=4, t=300, seed=14)
    layer.update(k, v)
    dk, dv = layer._dense()
    assert torch.equal(dk[..., 256:, :], k[..., 256:, :]) and torch.equal(dv[..., 256:, :], v[..., 256:, :])
    assert not torch.equal(dk[..., :256, :], k[..., :256, :])  # floor(L / R) * R prompt tokens quantized
    assert layer.nbytes()["residual"] == 2 * k[..., 256:, :].numel() * 4
    k1, v1 = kv(h=4, t=84, seed=15)
    for i in range(84):
        out_k, _ = layer.update(k1[..., i : i + 1, :], v1[..., i : i + 1, :])
    assert out_k.shape[-2] == 384 and layer.nbytes()["residual"] == 0  # the 84th step filled the window: flushed
    q = layer_for(name, heads=4, shared=shared, residual_length=0, **plain)
    q.update(k, v)
    assert q.nbytes()["residual"] == 0  # R = 0: everything quantized as it is stored


def test_turboquant_rotated_split_codebooks_and_reconstruction():
    layer = layer_for("turboquant-rotated-split", layer_idx=1, residual_length=0)
    k, v = kv(t=20, seed=7)
    layer.update(k, v)
    d, n_out = 64, 16
    pi = random_orthogonal(d, seed=1, dtype=torch.float64)  # seed 0 * 100003 + layer 1
    x = k.double()
    norms = x.norm(dim=-1, keepdim=True).half().double()  # stored as fp16
    y = (x / norms) @ pi.T
    cb3 = torch.tensor(lloyd_max_normal(3), dtype=torch.float64) / math.sqrt(d)
    cb2 = torch.tensor(lloyd_max_normal(2), dtype=torch.float64) / math.sqrt(d)
    yq = torch.cat(
        [cb3[(y[..., :n_out, None] - cb3).abs().argmin(-1)], cb2[(y[..., n_out:, None] - cb2).abs().argmin(-1)]], -1
    )
    yq = yq / yq.norm(dim=-1, keepdim=True)
    assert close(layer._dense()[0], (yq @ pi) * norms, tol=1e-4)
    bits = 8 * sum(layer.nbytes().values()) / (2 * k.numel())
    # d=64: 16 3-bit codes fill 2 words (48 of 64 bits), 48 2-bit codes 3 words, + one fp16 norm
    assert bits == pytest.approx((64 + 96 + 16) / 64)
    assert quant.get_method("turboquant").bits == 2.25  # code bits alone


def test_turboquant_splits_the_original_channels_by_magnitude():
    layer = layer_for("turboquant", layer_idx=2, residual_length=0)
    k, v = kv(t=24, seed=16)
    loud = [3, 9, 10, 20, 33, 40, 41, 42, 50, 51, 52, 53, 60, 61, 62, 63]
    k[..., loud] *= 8
    layer.update(k, v)
    assert layer.k_idx[0, 0].tolist() == loud and layer.k_idx.shape == (2, 2, 16)
    d, n = 64, 16
    regular = [c for c in range(d) if c not in loud]

    def set_ref(x, seed, m, bits):
        pi = random_orthogonal(m, seed=seed, dtype=torch.float64)
        norms = x.norm(dim=-1, keepdim=True).half().double()
        y = (x / norms) @ pi.T
        cb = torch.tensor(lloyd_max_normal(bits), dtype=torch.float64) / math.sqrt(m)
        yq = cb[(y[..., None] - cb).abs().argmin(-1)]
        return (yq / yq.norm(dim=-1, keepdim=True)) @ pi * norms

    ref = torch.empty_like(k, dtype=torch.float64)
    ref[..., loud] = set_ref(k.double()[..., loud], 2, n, 3)  # seed 0 * 100003 + layer 2
    ref[..., regular] = set_ref(k.double()[..., regular], 2 + 50021, d - n, 2)
    assert close(layer._dense()[0][:, :1], ref[:, :1], tol=1e-4)  # sequence 0, head 0 has exactly these outliers
    err = lambda x: ((x - k).norm(dim=-1) / k.norm(dim=-1)).mean().item()  # noqa: E731
    rotated = layer_for("turboquant-rotated-split", layer_idx=2, residual_length=0)
    rotated.update(k, v)
    assert err(layer._dense()[0]) < err(rotated._dense()[0])  # the split protects the loud channels
    wide = layer_for("turboquant", d=128, residual_length=0)
    wide.update(*kv(t=4, d=128))
    # d=128: 32 x 3 + 96 x 2 code bits (3 + 6 words) + two fp16 norms = 2.5 bits, + the 2 x 32 int16 channel indices
    idx_bits = 2 * 2 * 2 * 32 * 16
    assert (8 * sum(wide.nbytes().values()) - idx_bits) / (2 * 2 * 2 * 4 * 128) == pytest.approx(2.5)


def test_ott_pool_holds_smallest_key_magnitudes_and_block_mean():
    layer = layer_for("ott", heads=1, layer_idx=3, zero_point="float")
    k, v = kv(b=1, h=1, t=128, seed=8)
    small = [7, 50, 51, 90, 127]
    k[..., small, :] *= 0.01
    layer.update(k, v)
    assert sorted(layer.pool_pos[0, 0].tolist()) == small
    dk, dv = layer._dense()
    assert torch.equal(dk[..., small, :], k[..., small, :]) and torch.equal(dv[..., small, :], v[..., small, :])
    keep = [i for i in range(128) if i not in small]
    mean = k[..., keep, :].mean(-2, keepdim=True)
    block = k.clone()
    block[..., small, :] = mean
    assert close(dk[..., keep, :], ref_group_quant(block, 2, 32, -2)[..., keep, :])
    # a later block with smaller tokens pushes pooled ones out; those get quantized into their slots
    k2, v2 = kv(b=1, h=1, t=128, seed=9)
    k2[..., :5, :] *= 0.001
    layer.update(k2, v2)
    assert sorted(layer.pool_pos[0, 0].tolist()) == [128, 129, 130, 131, 132]
    dk = layer._dense()[0]
    for p in small:  # evicted: quantized with its group's scale/zero, so within half a step of exact
        half_step = layer.k_q.scale[0, 0, p // 32].float() / 2
        assert ((dk[0, 0, p] - k[0, 0, p]).abs() <= half_step + 1e-3).all()


def test_ott_first_layers_keep_no_pool():
    layer = layer_for("ott", layer_idx=1)
    layer.update(*kv(t=128))
    assert layer.pool_pos is None


def rope_tables(d, base=10000.0):
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float32) / d)

    def cos_sin(pos, layer=0):  # one base for every layer
        f = pos.float()[:, None] * inv[None]
        e = torch.cat([f, f], -1)
        return e.cos(), e.sin()

    return cos_sin


def test_rotatekv_round_trip_through_pre_rope_space():
    from quant.methods.rotatekv import rope, unrope

    shared = {"rope": rope_tables(64)}
    layer = layer_for("rotatekv-own-paper", heads=4, shared=shared, calibrate=False, sink_tokens=0)
    k, v = kv(b=1, h=4, t=40, seed=10)
    cos, sin = shared["rope"](torch.arange(40), 0)
    assert torch.allclose(unrope(rope(k, cos, sin), cos, sin), k, atol=1e-5)
    layer.update(k, v)
    pre = unrope(k.double(), cos.double(), sin.double())
    spanned = pre.reshape(1, 1, 4, 40, 64).permute(0, 1, 3, 2, 4).reshape(1, 1, 40, 256)
    spanned = spanned @ hadamard(256, dtype=torch.float64)
    deq = ref_group_quant(spanned, 2, 128, -1, clip=0.8, zero_point="integer") @ hadamard(256, dtype=torch.float64)
    k_ref = rope(deq.reshape(1, 1, 40, 4, 64).permute(0, 1, 3, 2, 4).reshape(1, 4, 40, 64), cos.double(), sin.double())
    assert close(layer._dense()[0], k_ref)


def test_rotatekv_keeps_sink_tokens_full_precision():
    shared = {"rope": rope_tables(64), "sinks": {0: torch.tensor([[0, 3]])}}
    layer = layer_for("rotatekv-own-paper", heads=4, shared=shared, calibrate=False)
    k, v = kv(b=1, h=4, t=10, seed=11)
    layer.update(k, v)
    dk, dv = layer._dense()
    assert torch.equal(dk[..., [0, 3], :], k[..., [0, 3], :]) and not torch.equal(dk[..., 1, :], k[..., 1, :])


def synthetic_tni(seed, b=1, h=2, t=512, d=64):
    """Keys with token-norm imbalance: log-normal token norms, low-norm sink tokens, a few
    high-norm tokens and two outlier channels; values with two outlier channels."""
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(b, h, t, d, generator=g), torch.randn(b, h, t, d, generator=g)
    scale = torch.exp(torch.randn(b, 1, t, 1, generator=g) * 0.5)
    scale[:, :, :4] = 0.05
    scale[:, :, torch.randint(0, t, (t // 32,), generator=g)] = 6.0
    k = k * scale
    k[..., [3, 17]] += 8 * torch.randn(b, h, t, 2, generator=g).abs()
    v[..., [5, 40]] *= 10
    return k, v


def per_token_error(name, k, v):
    """Mean over tokens of ||k_hat - k|| / ||k|| plus the same for values: the error TNI inflates."""
    layer = layer_for(name, heads=k.shape[1])
    layer.update(k, v)
    dk, dv = layer._dense()
    rel = lambda a, b: ((a - b).norm(dim=-1) / b.norm(dim=-1)).mean().item()  # noqa: E731
    return rel(dk, k) + rel(dv, v)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oscar_beats_kivi_and_ablations_on_token_norm_imbalance(seed):
    k, v = synthetic_tni(seed)
    err = {m: per_token_error(m, k, v) for m in ("oscar", "kivi", "oscar-rotation-only", "oscar-scaling-only")}
    assert err["oscar"] < err["kivi"], err
    assert err["oscar"] < err["oscar-rotation-only"], err
    assert err["oscar"] < err["oscar-scaling-only"], err


def test_presets_and_overrides():
    assert set(quant.list_methods()) >= {
        "bf16",
        "kivi",
        "quarot",
        "rotatekv",
        "ott",
        "turboquant",
        "oscar",
        "oscar-rotation-only",
        "oscar-scaling-only",
    }
    m = quant.get_method("oscar", group_size=64, residual_length=256)
    assert (m.group_size, m.residual_length, m.bits) == (64, 256, 2)
    assert quant.get_method("oscar").to_dict()["method"] == "oscar"
    assert quant.parse_overrides("group_size=64,token_norm=false,clip_ratio=0.9") == {
        "group_size": "64",
        "token_norm": "false",
        "clip_ratio": "0.9",
    }  # text; get_method types it


@pytest.mark.parametrize(
    "text, fields",
    [
        ("group_size=64,token_norm=off", {"group_size": 64, "token_norm": False}),
        ("token_norm=0,rotation=none", {"token_norm": False, "rotation": "none"}),
        ("token_norm=ON,residual_length=256", {"token_norm": True, "residual_length": 256}),
    ],
)
def test_command_line_overrides_are_typed_by_the_field(text, fields):
    m = quant.get_method("oscar", **quant.parse_overrides(text))
    assert {k: getattr(m, k) for k in fields} == fields
    assert all(type(getattr(m, k)) is type(v) for k, v in fields.items())


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("oscar", "token_norm=no", "oscar: token_norm='no' is not a boolean; use one of true, 1, on, false, 0, off"),
        ("oscar", "token_norm=maybe", "token_norm='maybe' is not a boolean"),
        ("oscar", "group_size=abc", "oscar: group_size='abc' is not an integer"),
        ("oscar", "group_size=64.5", "group_size='64.5' is not an integer"),
        ("quarot", "clip_ratio=high", "quarot: clip_ratio='high' is not a number"),
        ("oscar", "rotation=random", "oscar.rotation must be 'hadamard' or 'none', got 'random'"),
        ("oscar", "colour=red", "oscar: unknown option(s) ['colour']; oscar takes ["),
        ("oscar", "group_size", "--quant-opts item 'group_size' must look like field=value"),
    ],
)
def test_bad_override_values_name_the_field_the_value_and_what_is_allowed(name, text, words):
    with pytest.raises(ValueError) as err:
        quant.get_method(name, **quant.parse_overrides(text))
    assert words in str(err.value)


def test_python_api_refuses_a_value_of_the_wrong_type():
    with pytest.raises(ValueError, match="token_norm='no' is not a boolean"):
        quant.get_method("oscar", token_norm="no")
    assert quant.get_method("oscar", token_norm="off").token_norm is False


def test_label_names_what_ran():
    from quant.methods import label

    assert label(quant.get_method("oscar")) == "oscar"
    assert label(quant.get_method("oscar", group_size=32)) == "oscar"  # the preset's own value: still the preset
    assert label(quant.get_method("oscar", group_size=64, token_norm=False)) == "oscar+group_size=64+token_norm=false"
    assert label(quant.get_method("kivi-own-paper")) == "kivi-own-paper"


def test_paper_comparison_and_own_paper_presets_never_share_a_name():
    from quant.methods import GROUPS, expand_presets, setting_of

    comparison, own = quant.list_methods("all"), quant.list_methods("own-paper")
    assert comparison == GROUPS["all"] and "oscar-float-zero" not in comparison
    for name in comparison:
        m = quant.get_method(name)
        assert name == "bf16" or m.window == 128, name  # one window for every method
        assert getattr(m, "zero_point", "integer") == "integer", name  # as OScaR's framework quantizes
        assert setting_of(name) == "paper-comparison"
    assert all(n.endswith("-own-paper") for n in own if n != "bf16") and setting_of("quarot-own-paper") == "own-paper"
    no_window = ("quarot-own-paper", "rotatekv-own-paper", "turboquant-own-paper")
    assert {quant.get_method(n).window for n in no_window} == {0}
    assert expand_presets("own-paper,oscar") == own + ["oscar"] and expand_presets("kivi, kivi") == ["kivi"]
    with pytest.raises(KeyError, match="groups: all"):
        quant.list_methods("every")


def test_exact_chunks_stop_before_each_block_flush():
    oscar, kivi_fifo, quarot = (quant.get_method(n) for n in ("oscar", "kivi-own-paper", "quarot-own-paper"))
    assert [oscar.exact_chunk(p) for p in (1024, 1100, 1150, 1151, 1152)] == [127, 51, 1, 1, 127]
    assert kivi_fifo.exact_chunk(1024) == 1  # a FIFO value window moves every token
    assert quarot.exact_chunk(1024) > 1000 and quant.get_method("bf16").exact_chunk(0) > 1000


@pytest.mark.parametrize(
    "name,overrides,match",
    [
        ("oscar", {"group_size": 24}, "power of two"),
        ("oscar", {"rotation": "random"}, "hadamard"),
        ("oscar", {"residual_length": 100}, "multiple of group_size"),
        ("kivi", {"key_bits": 3}, "2 or 4"),
        ("quarot", {"clip_ratio": 1.5}, r"\[0.5, 1\]"),
        ("turboquant", {"rotation": "qr"}, "orthogonal"),
        ("turboquant", {"outlier_split": "first"}, "channels"),
        ("kivi", {"zero_point": "int"}, "integer"),
        ("kivi", {"value_flush": "lifo"}, "fifo"),
        ("quarot", {"residual_length": -1}, "no window"),
    ],
)
def test_bad_configs_raise_clear_errors(name, overrides, match):
    with pytest.raises(ValueError, match=match):
        quant.get_method(name, **overrides)


def test_unknown_method_and_option_name_the_valid_ones():
    with pytest.raises(KeyError, match="known presets: bf16"):
        quant.get_method("int2")
    with pytest.raises(ValueError, match="group_size"):
        quant.get_method("oscar", groupsize=32)


def test_modality_aligned_groups_cut_at_boundaries_and_match_reference():
    from quant.methods.oscar import aligned_starts

    tags = torch.zeros(2, 128, dtype=torch.long)
    tags[:, 40:100] = 1  # image positions 40..99 in both rows
    tags[1, 100:110] = 1  # row 1's image runs longer: the union of boundaries is used
    assert aligned_starts(tags, 0, 128, 32).tolist() == [0, 32, 40, 64, 96, 100, 110]
    assert aligned_starts(None, 0, 128, 32).tolist() == [0, 32, 64, 96]
    assert aligned_starts(tags, 128, 128, 32).tolist() == [0, 32, 64, 96]  # generated tokens are text

    layer = layer_for("oscar-float-zero", state=CacheState(modalities=tags), align_modality_groups=True)
    k, v = kv(t=130, seed=12)
    k[..., 40:110, :] *= 5  # the image span has another scale
    layer.update(k, v)
    assert layer.k_q.starts.tolist() == [0, 32, 40, 64, 96, 100, 110]
    h = hadamard(64, dtype=torch.float64)
    kr = k[..., :128, :].double() @ h
    n = kr.pow(2).sum(dim=(1, 3)).sqrt()[:, None, :, None]
    unit = kr / n
    bounds = [0, 32, 40, 64, 96, 100, 110, 128]
    parts = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        seg = unit[..., a:b, :]
        hi, lo = seg.amax(-2, keepdim=True), seg.amin(-2, keepdim=True)
        s = ((hi - lo) / 3).half().clamp_min(2.0**-24).double()
        z = lo.half().double()
        parts.append(torch.round((seg - z) / s).clamp(0, 3) * s + z)
    ref = (torch.cat(parts, -2) * n) @ h
    assert close(layer._dense()[0][..., :128, :], ref)
    # a second block appends its groups after the first block's
    layer.update(*kv(t=126, seed=13))
    assert layer.k_q.starts.tolist()[-4:] == [128, 160, 192, 224]
    assert layer.nbytes()["scales"] > layer_for("oscar").nbytes()["scales"]
