"""The fast path through transformers: a tiny random Qwen3 decoding over quant.kernels.hf_decode's packed
cache (Triton kernels; interpreter on the CPU) gives the logits of the reference OScaR cache."""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")
transformers = pytest.importorskip("transformers")

from quant.cache import make_cache  # noqa: E402
from quant.kernels import hf_decode  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def tiny_qwen3():
    cfg = transformers.Qwen3Config(vocab_size=128, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                   max_position_embeddings=512)
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).to(DEV).eval()


def decode_logits(model, cache, prompt, steps):
    out = model(prompt, past_key_values=cache, use_cache=True)
    logits = [out.logits[:, -1]]
    tok = out.logits[:, -1:].argmax(-1)
    for _ in range(steps):
        out = model(tok, past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1])
        tok = out.logits[:, -1:].argmax(-1)
    return torch.stack(logits, 1)


def test_packed_decode_matches_reference_cache():
    model = tiny_qwen3()
    prompt = torch.randint(0, 128, (1, 127), generator=torch.Generator().manual_seed(1)).to(DEV)
    hf_decode.register()
    ref = decode_logits(model, make_cache("oscar", model), prompt, 3)  # folds V's rotation into the weights
    model.config._attn_implementation = "oscar_packed"
    fast = decode_logits(model, hf_decode.make_packed_cache(2, 256, backend="triton"), prompt, 3)  # takes V rotated
    model.config._attn_implementation = "sdpa"
    # Steps 1-3 cross the 128-token flush: the window packs and the packed part is read by the kernel.
    # Measured: |fast - ref| ~1e-4 of max|logit|, while an unquantized cache differs from ref by ~0.2.
    torch.testing.assert_close(fast.float(), ref.float(), rtol=0, atol=2e-3 * ref.abs().max().item())


def test_quantized_cache_switches_to_the_kernels_and_matches_the_reference(monkeypatch):
    """make_cache('oscar', model) on a kernel backend: decode steps hand PackedKV to the kernels (Triton
    here), and the logits follow the torch reference path of the same cache across a 128-token flush."""
    model = tiny_qwen3()
    prompt = torch.randint(0, 128, (1, 250), generator=torch.Generator().manual_seed(1)).to(DEV)
    monkeypatch.setenv("OSCAR_KERNEL_BACKEND", "torch")
    ref_cache = make_cache("oscar", model)
    assert "fast_decode" not in ref_cache.shared
    ref = decode_logits(model, ref_cache, prompt, 8)
    monkeypatch.setenv("OSCAR_KERNEL_BACKEND", "triton")
    fast_cache = make_cache("oscar", model)
    assert fast_cache.shared.get("fast_decode") is True
    fast = decode_logits(model, fast_cache, prompt, 8)
    assert fast_cache.layers[0].k_q.num_tokens == 256  # 250 + 8 tokens: the second block flushed mid-decode
    assert torch.allclose(fast.float(), ref.float(), atol=2e-3, rtol=2e-3)
    model.set_attn_implementation("sdpa")


def test_left_padded_batches_stay_on_the_masked_reference_path(monkeypatch):
    """The kernels take no attention mask: a batch of several sequences keeps the dense path (with the
    registered mask), so left padding gives the same tokens as the torch backend."""
    model = tiny_qwen3()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 128, (2, 140), generator=g).to(DEV)
    mask = torch.ones_like(ids)
    mask[1, :12] = 0  # row 1 is left-padded
    outs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("OSCAR_KERNEL_BACKEND", backend)
        cache = make_cache("oscar", model)
        outs[backend] = model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=4,
                                       do_sample=False, pad_token_id=0)
    assert torch.equal(outs["torch"], outs["triton"])
    model.set_attn_implementation("sdpa")


def test_decode_mask_is_none_only_for_unpadded_single_token_steps():
    # One new token per sequence and no padding: no mask (also while a CUDA graph is captured, where
    # sdpa_mask cannot inspect its inputs and would materialize one); anything else: sdpa_mask's answer.
    from transformers.masking_utils import sdpa_mask

    assert hf_decode.decode_mask(2, 1, 40) is None
    pad = torch.ones(2, 40, dtype=torch.bool)
    pad[0, :3] = False
    got, want = hf_decode.decode_mask(2, 1, 40, attention_mask=pad), sdpa_mask(2, 1, 40, attention_mask=pad)
    assert got is not None and torch.equal(got, want)
    got, want = hf_decode.decode_mask(1, 5, 40, q_offset=35), sdpa_mask(1, 5, 40, q_offset=35)
    assert (got is None and want is None) or torch.equal(got, want)
