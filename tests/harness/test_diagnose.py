"""`oscar-eval diagnose` (harness/diagnose.py, quant/diagnose.py) on small random models: a Qwen2 with a large k_proj
bias and GQA, a Gemma-3 with sliding-window layers, and the tiny-llava preset through the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from harness import cli
from harness import diagnose as hd
from quant import diagnose as dq
from quant.packed import quantize
from quant.primitives import hadamard

TOKENS = 100  # three whole 32-token groups and a 4-token tail


def qwen2(seed: int = 0):
    """A 2-layer Qwen2 (4 query heads over 2 KV heads of dim 32) whose layer-0 k_proj bias is large on one RoPE pair
    of KV head 1, as Qwen2.5's are."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=300,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        bias = model.model.layers[0].self_attn.k_proj.bias
        bias.normal_(0, 0.5)
        bias[32 + 15] = bias[32 + 31] = 40.0  # KV head 1, its slowest RoPE pair (channels 15 and 31)
    return model


def gemma3(seed: int = 0):
    """A 3-layer Gemma-3: sliding window of 16 tokens in layers 0 and 2, a query scalar that is not head_dim."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=300,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=20,
        max_position_embeddings=256,
        attn_implementation="sdpa",
    )
    return Gemma3ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def qwen_run():
    model = qwen2()
    ids = torch.randint(0, 300, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    captures = hd.capture(model, ids, keep_outputs=True)
    return model, ids, captures, hd.measure(captures, ["bf16", "kivi", "oscar", "oscar-rotation-only"])


def plain_hadamard(d: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(d)


def test_rho_equals_a_direct_float64_computation(qwen_run):
    """rho = sum over real queries and whole 32-token key groups of sum_j (qH)_j^2 range(KH)_j^2, over the same without
    H, computed here query by query and group by group."""
    _, _, captures, result = qwen_run
    for cap, layer in zip(captures, result["layers"]):
        q, k = cap.query.double().numpy(), cap.key.double().numpy()
        hq, s, d = q.shape
        hkv = k.shape[0]
        rot = plain_hadamard(d)
        assert np.allclose(rot, hadamard(d, dtype=torch.float64).numpy())  # the rotation OScaR uses
        rotated_total = plain_total = 0.0
        for g in range(hkv):
            rotated = plain = 0.0
            queries = [q[h, t] for h in range(g * hq // hkv, (g + 1) * hq // hkv) for t in range(s)]
            for start in range(0, s - s % 32, 32):
                block = k[g, start : start + 32]
                r = block.max(0) - block.min(0)
                r_rot = (block @ rot).max(0) - (block @ rot).min(0)
                for x in queries:
                    rotated += np.sum((x @ rot) ** 2 * r_rot**2)
                    plain += np.sum(x**2 * r**2)
            assert layer["heads"][g]["rho"] == pytest.approx(rotated / plain, rel=1e-9)
            rotated_total, plain_total = rotated_total + rotated, plain_total + plain
        assert layer["rho"] == pytest.approx(rotated_total / plain_total, rel=1e-9)
    # the bias on one slow RoPE pair makes those channels loud and the rotation spreads them: rho > 1 on that head
    assert result["layers"][0]["worst_head"] == 1 and result["layers"][0]["worst_head_rho"] > 1


def test_attention_kl_zero_for_exact_keys_positive_for_2_bit(qwen_run):
    _, _, _, result = qwen_run
    for layer in result["layers"]:
        assert layer["kl"]["bf16"] == 0.0
        for method in ("kivi", "oscar", "oscar-rotation-only"):
            assert 0 < layer["kl"][method] < 1
            assert all(0 < h["kl"][method] for h in layer["heads"])
        assert layer["kl_rotation_over_kivi"] == pytest.approx(layer["kl"]["oscar-rotation-only"] / layer["kl"]["kivi"])


def test_bias_norm_is_the_modules_k_proj_bias(qwen_run):
    model, _, captures, result = qwen_run
    for cap, layer in zip(captures, result["layers"]):
        bias = model.model.layers[cap.layer].self_attn.k_proj.bias.detach().reshape(2, 32)
        for h in range(2):
            assert layer["heads"][h]["bias_norm"] == pytest.approx(bias[h].norm().item(), rel=1e-6)
    head = result["layers"][0]["heads"][1]
    assert result["layers"][0]["bias_norm"] == head["bias_norm"] > 56  # sqrt(2) * 40 on head 1
    assert head["pair_max_index"] == 15 and head["pair_max"] > 40  # the RoPE pair (15, 31) carries the bias


@pytest.mark.parametrize("build", [qwen2, gemma3], ids=["qwen2-gqa-bias", "gemma3-sliding"])
def test_exact_attention_is_the_models(build, qwen_run):
    """The attention the KL is taken against (scaling, causal and sliding-window mask, GQA map) reproduces each layer's
    own attention output; the capture leaves the model as it was."""
    model = qwen_run[0] if build is qwen2 else build()
    ids = torch.randint(0, 300, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(ids).logits
    implementation = model.config._attn_implementation
    captures = hd.capture(model, ids, keep_outputs=True)
    assert [c.layer for c in captures] == list(range(model.config.num_hidden_layers))
    for cap in captures:
        mask = dq.attention_mask(64, cap.sliding_window)
        rep = cap.query.shape[0] // cap.key.shape[0]
        out = [
            dq.log_probs(cap.query[h], cap.key[h // rep], cap.scaling, mask, cap.softcap).exp()
            @ cap.value[h // rep].double()
            for h in range(cap.query.shape[0])
        ]
        torch.testing.assert_close(torch.stack(out, 1).float(), cap.output.float(), atol=1e-5, rtol=1e-4)
    if build is gemma3:
        assert [c.sliding_window for c in captures] == [16, None, 16] and captures[0].scaling == 20**-0.5
    assert model.config._attn_implementation == implementation
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, atol=0, rtol=0)


def test_stored_keys_come_from_the_methods_layer():
    """KIVI's stored keys are quant.packed.quantize's per-channel groups of 32 with the tail exact; BF16's are the
    keys; a method whose layer needs its model is refused by name."""
    k = torch.randn(1, 2, TOKENS, 32, generator=torch.Generator().manual_seed(3))
    kivi = dq.stored_keys("kivi", k)
    whole = quantize(k[..., :96, :], 2, 32, axis=-2, zero_point="integer").dequantize()
    torch.testing.assert_close(kivi[..., :96, :], whole, atol=0, rtol=0)
    assert torch.equal(kivi[..., 96:, :], k[..., 96:, :])
    assert torch.equal(dq.stored_keys("bf16", k), k)
    with pytest.raises(ValueError, match="rotatekv: its cache layer cannot store keys without its model"):
        dq.stored_keys("rotatekv", k)


def test_command_writes_table_json_and_png(tmp_path, capsys):
    text = tmp_path / "prose.txt"
    text.write_text("The licenses for most software are designed to take away your freedom to share it. " * 8)
    out = tmp_path / "diag"
    argv = ["diagnose", "--model", "tiny-llava", "--input", str(text), "--tokens", "200", "--out", str(out)]
    assert cli.main([*argv, "--methods", "kivi,oscar,oscar-scaling-only,oscar-rotation-only,bf16"]) == 0
    printed = capsys.readouterr().out
    assert "rho" in printed and "KL oscar-scaling-only" in printed and "worst head" in printed
    saved = json.loads((out / "prose.json").read_text())
    assert saved["model"] == "tiny-llava" and saved["tokens"] == 200 and saved["input"] == "prose"
    assert len(saved["layers"]) == 2 and len(saved["layers"][0]["heads"]) == 2
    assert saved["layers"][0]["kl"]["bf16"] == 0 and saved["layers"][0]["kl"]["oscar"] > 0
    assert set(saved["summary"]["kl_mean"]) == set(saved["methods"])
    assert (out / "prose.png").read_bytes()[:4] == b"\x89PNG"
    table = (out / "prose.txt").read_text()
    assert "0.1" in table and "1.1" in table  # the per-layer rows, then the per-head rows

    assert cli.main([*argv, "--per-head", "--methods", "kivi"]) == 0
    assert "0.1" in capsys.readouterr().out


def test_command_errors(capsys, tmp_path):
    assert cli.main(["diagnose", "--model", "no-such-model"]) == 2
    assert "unknown model 'no-such-model'; known models:" in capsys.readouterr().err
    assert cli.main(["diagnose", "--model", "smollm2-135m", "--model-path", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err  # a path that is not there is named as such, with the hub id
    assert f"--model-path={tmp_path / 'none'} does not exist" in err and "HuggingFaceTB/SmolLM2-135M-Instruct" in err
    assert cli.main(["diagnose", "--model", "tiny-llava", "--methods", "rotatekv"]) == 2
    assert "rotatekv: its cache layer cannot store keys without its model" in capsys.readouterr().err
    assert cli.main(["diagnose", "--model", "tiny-llava", "--methods", "nope"]) == 2
    assert "unknown quantization method 'nope'" in capsys.readouterr().err
