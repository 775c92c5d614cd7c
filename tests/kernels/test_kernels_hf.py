"""The fast path through transformers: a tiny random Qwen3 decoding over an OScaR cache on the kernel path (Triton
kernels; interpreter on the CPU) gives the logits of the same cache on the torch reference path."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")
transformers = pytest.importorskip("transformers")

import quant  # noqa: E402
from quant.cache import make_cache  # noqa: E402
from quant.kernels import KernelOptions, hf_decode  # noqa: E402
from tests.kernels.traits_for_tests import ALL, prepared  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def tiny_qwen3():
    cfg = transformers.Qwen3Config(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
    )
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


def filled_cache(model, backend: str, length: int, batch: int = 1):
    """An OScaR cache filled directly (OScaRLayer.fill_random in layer 0, copy_from into the others), as the e2e
    benchmark fills it, on `backend`'s path."""
    cache = make_cache("oscar", config=model.config, kernels=KernelOptions(backend=backend))
    cache.state.values_folded = True  # random weights: V counts as rotated (the benchmark's setting)
    cache.state.fast_decode = backend != "torch"
    cache.state.uniform_rows = True
    cache.layers[0].fill_random(batch, length, DEV, dtype=torch.float32, seed=3)
    for layer in cache.layers[1:]:
        layer.copy_from(cache.layers[0])
    return cache


def test_filled_cache_decodes_as_the_reference_and_replays_a_step():
    """A directly filled cache on the kernel path (Triton) gives the torch reference path's logits across a flush,
    and `repeat_step` makes a repeated step write the same window slot (what a replayed CUDA graph relies on)."""
    from harness.bench.caches import repeat_step

    model = tiny_qwen3()
    hf_decode.register()
    model.config._attn_implementation = "oscar_packed"
    tok = torch.tensor([[5]], device=DEV)
    ref_cache, fast_cache = filled_cache(model, "torch", 250), filled_cache(model, "triton", 250)
    assert fast_cache.get_seq_length() == 250 and fast_cache.layers[1].k_q.num_tokens == 128
    ref, fast = decode_logits(model, ref_cache, tok, 8), decode_logits(model, fast_cache, tok, 8)
    assert fast_cache.layers[0].k_q.num_tokens == 256  # the window filled and flushed mid-decode
    torch.testing.assert_close(fast.float(), ref.float(), rtol=0, atol=2e-3 * ref.abs().max().item())
    reset = repeat_step(fast_cache)
    lengths = fast_cache.state.window_lengths.clone()
    for _ in range(3):
        reset()
        model(tok, past_key_values=fast_cache, use_cache=True)
        assert torch.equal(fast_cache.state.window_lengths, lengths + 1)
    model.config._attn_implementation = "sdpa"


def test_filled_batch_of_equal_lengths_takes_the_kernels():
    """Sequences of one length (a benchmark's filled batch) decode together on the kernel path, each row as the
    reference path decodes it."""
    model = tiny_qwen3()
    hf_decode.register()
    model.config._attn_implementation = "oscar_packed"
    tok = torch.tensor([[5], [9], [11]], device=DEV)
    ref_cache, fast_cache = filled_cache(model, "torch", 200, batch=3), filled_cache(model, "triton", 200, batch=3)
    ref, fast = decode_logits(model, ref_cache, tok, 3), decode_logits(model, fast_cache, tok, 3)
    assert fast_cache.state.window_lengths is not None  # the steps took the fixed-shape path
    torch.testing.assert_close(fast.float(), ref.float(), rtol=0, atol=2e-3 * ref.abs().max().item())
    model.config._attn_implementation = "sdpa"


def test_quantized_cache_switches_to_the_kernels_and_matches_the_reference():
    """A model prepared for OScaR on a kernel backend: decode steps hand PackedKV to the kernels (Triton
    here), and the logits follow the torch reference path of the same cache across a 128-token flush."""
    model = tiny_qwen3()
    prompt = torch.randint(0, 128, (1, 250), generator=torch.Generator().manual_seed(1)).to(DEV)
    with prepared(model, "oscar", KernelOptions(backend="torch")) as prep:
        ref_cache = prep.make_cache()
        assert not ref_cache.state.fast_decode
        ref = decode_logits(model, ref_cache, prompt, 8)
    with prepared(model, "oscar", KernelOptions(backend="triton")) as prep:
        fast_cache = prep.make_cache()
        assert fast_cache.state.fast_decode
        fast = decode_logits(model, fast_cache, prompt, 8)
    assert fast_cache.layers[0].k_q.num_tokens == 256  # 250 + 8 tokens: the second block flushed mid-decode
    assert torch.allclose(fast.float(), ref.float(), atol=2e-3, rtol=2e-3)


def test_a_short_prompt_flushes_its_first_block_during_decoding():
    """Nothing packed at the prefill (100 tokens), the first block packed by a decode step: the kernel path reads
    the packed buffers only up to their valid length, as the reference path does."""
    model = tiny_qwen3()
    prompt = torch.randint(0, 128, (1, 100), generator=torch.Generator().manual_seed(5)).to(DEV)
    with prepared(model, "oscar", KernelOptions(backend="torch")) as prep:
        ref = decode_logits(model, prep.make_cache(), prompt, 40)
    with prepared(model, "oscar", KernelOptions(backend="triton")) as prep:
        fast_cache = prep.make_cache()
        fast = decode_logits(model, fast_cache, prompt, 40)
    layer = fast_cache.layers[0]
    assert layer.k_q.num_tokens == 128 and layer._kbuf.num_tokens > 128 and int(layer._kv_lens[0]) == 128
    assert torch.allclose(fast.float(), ref.float(), atol=2e-3, rtol=2e-3)


def test_left_padded_batches_stay_on_the_masked_reference_path():
    """The kernels take no attention mask: a batch of several sequences keeps the dense path (with the
    registered mask), so left padding gives the same tokens as the torch backend."""
    model = tiny_qwen3()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 128, (2, 140), generator=g).to(DEV)
    mask = torch.ones_like(ids)
    mask[1, :12] = 0  # row 1 is left-padded
    outs = {}
    for backend in ("torch", "triton"):
        with prepared(model, "oscar", KernelOptions(backend=backend)) as prep:
            outs[backend] = model.generate(
                ids,
                attention_mask=mask,
                past_key_values=prep.make_cache(),
                max_new_tokens=4,
                do_sample=False,
                pad_token_id=0,
            )
    assert torch.equal(outs["torch"], outs["triton"])


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


def test_bf16_fixed_buffers_decode_as_the_plain_cache():
    """BF16 on the fast path (fixed buffers, a DenseStep per step, SDPA with a length mask) gives the plain cache's
    logits, across a buffer growth at 256 tokens, and says which steps a CUDA graph may replay."""
    model = tiny_qwen3()
    prompt = torch.randint(0, 128, (1, 250), generator=torch.Generator().manual_seed(4)).to(DEV)
    plain = make_cache("bf16", model, kernels=KernelOptions(backend="torch"))
    assert not plain.state.fast_decode
    ref = decode_logits(model, plain, prompt, 10)
    prep = quant.prepare_model(model, "bf16", KernelOptions(backend="triton"), ALL)
    fixed = prep.make_cache()
    assert fixed.state.fast_decode
    ready = []
    out = model(prompt, past_key_values=fixed, use_cache=True)
    logits, tok = [out.logits[:, -1]], out.logits[:, -1:].argmax(-1)
    for _ in range(10):
        ready.append(fixed.layers[0].graph_ready())
        out = model(tok, past_key_values=fixed, use_cache=True)
        logits.append(out.logits[:, -1])
        tok = out.logits[:, -1:].argmax(-1)
    torch.testing.assert_close(torch.stack(logits, 1).float(), ref.float(), rtol=1e-4, atol=1e-4)
    # the first step opens the buffers (room for 256), the step of token 257 grows them: both eager
    assert ready == [False, True, True, True, True, True, False, True, True, True]
    layer = fixed.layers[0]
    assert layer._buf[0].shape[-2] == 512 and layer.keys.shape[-2] == 260 == int(layer._len[0])
    assert fixed.nbytes()["total"] == plain.nbytes()["total"]
    prep.undo()
