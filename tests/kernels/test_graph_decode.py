"""OScaR's kernel-path decode step with a fixed window (quant.engine.oscar.OScaRStepLayer._fast_step) and its replay
as CUDA graphs inside `generate` (quant.engine.graphs).

On the CPU: the fixed window stores what the reference path stores, step by step and across flushes, and says
when a step may be replayed; the reference attention honours the device lengths. On a GPU: generate with graph
steps gives the eager steps' tokens and logits bit for bit (tiny Qwen3, and the three multimodal replicas
through their adapters), and a capture that cannot work falls back to eager steps without losing a token.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from quant.cache import make_cache
from quant.engine import GraphDecoder, decode_graphs, graphs_enabled
from quant.engine.graphs import signature
from quant.kernels import KernelOptions, decode_attention, valid_part
from quant.kernels.reference import random_packed_kv
from tests.kernels.traits_for_tests import prepared

transformers = pytest.importorskip("transformers")


def qwen3_config(layers=2):
    return transformers.Qwen3Config(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
    )


def test_fixed_window_stores_what_the_reference_stores_and_says_when_to_replay():
    cfg = qwen3_config()
    g = torch.Generator().manual_seed(0)
    fast, ref = make_cache("oscar", config=cfg), make_cache("oscar", config=cfg)
    fast.state.fast_decode = True  # the kernel path's cache update, driven by hand on the CPU
    prompt = torch.randn(1, 2, 200, 64, generator=g), torch.randn(1, 2, 200, 64, generator=g)
    for cache in (fast, ref):
        cache.layers[0].update(*prompt)
    layer, other = fast.layers[0], ref.layers[0]
    assert not layer.graph_ready()  # the first step opens the window: eager
    ready, keys = [], {}
    for step in range(330):  # 200 + 330: flushes at 256, 384 and 512
        k, v = torch.randn(1, 2, 1, 64, generator=g), torch.randn(1, 2, 1, 64, generator=g)
        ready.append(layer.graph_ready() if step else None)
        if ready[-1]:
            keys[step] = layer.graph_key()
        packed = layer.update(k, v)[0]
        other.update(k, v)
        assert layer.seen == other.seen == 201 + step
        assert torch.equal(layer.k_res, other.k_res) and torch.equal(layer.v_res, other.v_res)
        assert torch.equal(layer.k_q.codes, other.k_q.codes) and torch.equal(layer.norms, other.norms)
        assert int(packed.res_lens) == layer.k_res.shape[-2]
        assert packed.kv.k_res.shape[-2] == 128  # the whole buffer; the length is on the device
        # The reference attention over the step's buffers equals the one over the reference cache's state.
        q = torch.randn(1, 4, 1, 64, generator=g)
        got = decode_attention(q, packed.kv, 0.125, backend="torch", kv_lens=packed.kv_lens, res_lens=packed.res_lens)
        torch.testing.assert_close(got, decode_attention(q, other.packed_view(), 0.125, backend="torch"))
    # Not replayable: the step whose token fills the window (it flushes), 55, 183 and 311 steps in.
    assert [i for i, r in enumerate(ready) if r is False] == [55, 183, 311]
    assert layer.k_q.num_tokens == 512 and fast.nbytes() == ref.nbytes()
    # One graph serves the steps around the first two flushes: the prompt's block left room for two more
    # (HEADROOM), written in place; the third grows the buffers and the steps after it need a new capture.
    assert keys[1] == keys[310] != keys[312] == keys[329] and len(set(keys.values())) == 2


def test_host_state_restores_after_a_failed_capture():
    cfg = qwen3_config()
    cache = make_cache("oscar", config=cfg)
    cache.state.fast_decode = True
    layer = cache.layers[0]
    x = torch.randn(1, 2, 130, 64)
    layer.update(x, x)
    layer.update(x[:, :, :1], x[:, :, :1])
    saved = layer.host_state()
    layer.update(x[:, :, :1], x[:, :, :1])
    assert layer.seen == 132 and layer.k_res.shape[-2] == 4
    layer.set_host_state(saved)
    assert layer.seen == 131 and layer.k_res.shape[-2] == 3


def test_reference_attention_reads_only_the_valid_part():
    kv = random_packed_kv(2, 2, 256, 100, 64, seed=3)
    q = torch.randn(2, 4, 1, 64, generator=torch.Generator().manual_seed(4))
    cut = valid_part(kv, torch.tensor([128, 128]), torch.tensor([37, 37]))
    assert cut.num_quantized == 128 and cut.k_res.shape[-2] == 37 and cut.norms.shape[-1] == 128
    torch.testing.assert_close(cut.k.dequantize(), kv.k.dequantize()[:, :, :128])
    got = decode_attention(q, kv, 0.125, backend="torch", kv_lens=[128, 128], res_lens=[37, 37])
    torch.testing.assert_close(got, decode_attention(q, cut, 0.125, backend="torch"))
    with pytest.raises(ValueError, match="one kv_lens for the whole batch"):
        valid_part(kv, torch.tensor([128, 256]))


def test_graphs_only_on_the_kernel_path_on_a_gpu(monkeypatch):
    model = transformers.Qwen3ForCausalLM(qwen3_config())
    assert not graphs_enabled(model, None)
    cache = make_cache("oscar", config=model.config)
    cache.state.fast_decode = True
    assert not graphs_enabled(model, cache)  # the model is on the CPU
    with decode_graphs(model, cache) as g:
        assert g is None
    with pytest.raises(ValueError, match="fixed-shape decode steps"):
        GraphDecoder(model, make_cache("kivi", config=model.config))


def test_which_calls_a_graph_takes():
    model = transformers.Qwen3ForCausalLM(qwen3_config())
    cache = make_cache("oscar", config=model.config)
    dec = GraphDecoder(model, cache)
    one, pos = torch.tensor([[5]]), torch.tensor([[40]])
    step = dict(input_ids=one, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1)
    assert dec._graph_kwargs(step) == step
    # transformers 5.17 passes the growing 2D mask of ones: left out; a mask with padding: not a graph step
    assert dec._graph_kwargs({**step, "attention_mask": torch.ones(1, 41)}) == step
    pad = torch.ones(1, 41)
    pad[0, 0] = 0
    assert dec._graph_kwargs({**step, "attention_mask": pad}) is None
    types = torch.tensor([[0, 1, 1, 0, 0]])  # 5.17 passes Qwen3-VL's whole mm_token_type_ids: the step's column
    got = dec._graph_kwargs({**step, "mm_token_type_ids": types})
    assert torch.equal(got.pop("mm_token_type_ids"), types[:, -1:]) and got == step
    assert dec._graph_kwargs({**step, "input_ids": torch.ones(1, 7, dtype=torch.long)}) is None  # a prefill
    assert dec._graph_kwargs({**step, "past_key_values": make_cache("oscar", config=model.config)}) is None
    assert signature(step) == signature({**step, "input_ids": torch.tensor([[9]])})
    assert signature(step) != signature({**step, "logits_to_keep": 2})


# ----------------------------------------------------------------------------- on a GPU
def assert_same_or_near_tie(
    got: torch.Tensor, reference: torch.Tensor, reference_logits: torch.Tensor, tolerance: float = 0.05
) -> None:
    """Greedy tokens [T] equal to the reference's, or parting where the reference's two best logits (its logits
    [T, V] at that step) lie within `tolerance`: bf16 GEMMs of another shape or device may round such a tie the
    other way, after which the sequences rightly differ."""
    parted = (got.cpu() != reference.cpu()).nonzero().flatten()
    if len(parted):
        best = reference_logits[int(parted[0])].float().topk(2).values
        assert float(best[0] - best[1]) < tolerance, (int(parted[0]), best.tolist())


def tiny_qwen3():
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(qwen3_config(layers=3)).to("cuda", torch.bfloat16).eval()


def generate(model, prompt, new, graphs: bool):
    """(sequences, stacked logits, the decoder's counts or None, the cache) of a greedy `new`-token generation."""
    with prepared(model, "oscar") as prep:
        cache = prep.make_cache()
        assert cache.state.fast_decode
        dec = GraphDecoder(model, cache) if graphs else contextlib.nullcontext()
        with torch.inference_mode(), dec:
            out = model.generate(
                prompt,
                past_key_values=cache,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
    return out.sequences, torch.stack(out.logits, 1), dec.counts if graphs else None, cache


@pytest.mark.gpu
def test_graph_steps_give_the_eager_tokens_and_logits_bit_for_bit():
    model = tiny_qwen3()
    prompt = torch.randint(0, 128, (1, 200), generator=torch.Generator().manual_seed(1)).to("cuda")
    eager_ids, eager_logits, _, eager_cache = generate(model, prompt, 300, graphs=False)
    ids, logits, counts, cache = generate(model, prompt, 300, graphs=True)
    assert torch.equal(ids, eager_ids)
    assert torch.equal(logits, eager_logits)
    # 299 decode steps store tokens 201-499: the first (warm-up) and the two that fill a window (flushes at 256 and
    # 384) run eagerly; the flushes write into the packed buffers in place, so one capture serves every other step.
    assert counts == {"eager": 3, "captured": 1, "replayed": 295}
    assert cache.layers[0].seen == eager_cache.layers[0].seen == 499
    assert cache.nbytes() == eager_cache.nbytes()
    assert "forward" not in model.__dict__  # unwrapped after the call


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["oscar", "bf16"])
def test_padded_batch_replays_graphs_and_gives_each_prompt_its_batch1_tokens(method):
    """A left-padded batch on the kernels: rows stacked into one layer (quant/rows.py), each flushing at its own
    step on the device (the steps that flush some row replay a graph of their own). Graphs give the eager batch's
    tokens (on the kernels its logits too, bit for bit), every step after the stacking one replays, and each row's
    tokens are its batch-1 tokens up to a near-tie (bf16 GEMMs of another batch size round differently): where
    they part, the batch-1 run's two best logits lie within 0.05."""
    model = tiny_qwen3()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 128, (n,), generator=g) for n in (253, 124, 189, 40, 700)]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :], mask[b, width - len(p) :] = p, 1
    ids, mask = ids.cuda(), mask.cuda()

    def run(ids, mask, graphs):
        with prepared(model, method) as prep:
            cache = prep.make_cache()
            cache.set_padding(mask)
            dec = GraphDecoder(model, cache) if graphs else contextlib.nullcontext()
            with torch.inference_mode(), dec:
                out = model.generate(
                    ids,
                    attention_mask=mask,
                    past_key_values=cache,
                    max_new_tokens=150,
                    min_new_tokens=150,
                    do_sample=False,
                    output_logits=True,
                    return_dict_in_generate=True,
                    pad_token_id=0,
                )
        return out.sequences[:, ids.shape[1] :], torch.stack(out.logits, 1), dec.counts if graphs else None

    eager_ids, eager_logits, _ = run(ids, mask, graphs=False)
    got, logits, counts = run(ids, mask, graphs=True)
    if method == "oscar":  # the kernels: tokens and logits bit for bit
        assert torch.equal(got, eager_ids) and torch.equal(logits, eager_logits)
    else:  # torch's masked SDPA can round some logits otherwise once captured: a near-tie can then pick the other
        for b in range(len(prompts)):  # token, in some runs and not others
            assert_same_or_near_tie(got[b], eager_ids[b], eager_logits[b])
    # 149 steps after the prefill: the stacking one eager, then one graph without a flush and (OScaR) one with
    graphs = 2 if method == "oscar" else 1
    assert counts == {"eager": 1, "captured": graphs, "replayed": 148 - graphs}, counts
    for b, p in enumerate(prompts):
        alone, alone_logits, _ = run(p[None].cuda(), torch.ones(1, len(p), dtype=torch.long, device="cuda"), True)
        assert_same_or_near_tie(got[b], alone[0], alone_logits[0])


@pytest.mark.gpu
def test_a_capture_that_fails_falls_back_to_eager_steps_without_losing_tokens():
    model = tiny_qwen3()
    prompt = torch.randint(0, 128, (1, 140), generator=torch.Generator().manual_seed(2)).to("cuda")
    eager_ids, eager_logits, _, _ = generate(model, prompt, 20, graphs=False)
    norm = model.model.norm
    plain = norm.forward

    def syncing(x):  # a host read of a device value: not allowed while a graph is captured
        if float(x.float().abs().sum()) < 0:
            raise AssertionError
        return plain(x)

    norm.forward = syncing
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ids, logits, counts, _ = generate(model, prompt, 20, graphs=True)
    finally:
        del norm.forward
    assert any("capture of a decode step failed" in str(w.message) for w in caught)
    assert counts["replayed"] == 0 and counts["eager"] == 19
    assert torch.equal(ids, eager_ids) and torch.equal(logits, eager_logits)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["llava", "qwen3_vl", "qwen3_omni"])
def test_multimodal_adapters_decode_the_same_with_graphs(family, monkeypatch):
    import quant
    from harness.models import tiny, traits_of
    from harness.models.base import cache_argument
    from harness.runner import Runner
    from tests.harness.test_adapters import prompt_for

    adapter = tiny(family, device="cuda", dtype="bfloat16")
    inputs = adapter.build_inputs(prompt_for(adapter)).to(device=adapter.device, dtype=adapter.model.dtype)
    seen = []
    exit_ = GraphDecoder.__exit__

    def record(self, *exc):
        seen.append(dict(self.counts))
        return exit_(self, *exc)

    monkeypatch.setattr(GraphDecoder, "__exit__", record)
    outs = {}
    for graphs in ("0", "1"):
        kernels = KernelOptions(cuda_graphs=graphs == "1")
        with Runner(adapter, quant.get_method("oscar"), kernels, traits_of(adapter.spec.name)) as runner:
            cache = runner.make_cache(inputs)
            with torch.inference_mode(), decode_graphs(adapter.generator, cache):
                out = adapter.generator.generate(
                    **inputs, **cache_argument(cache), max_new_tokens=150, min_new_tokens=150, do_sample=False
                )
        outs[graphs] = out[:, inputs["input_ids"].shape[1] :]
    assert torch.equal(outs["0"], outs["1"])
    assert len(seen) == 1 and seen[0]["replayed"] > 100, seen
    assert cache.state.graph_steps == seen[0]["captured"] + seen[0]["replayed"]  # what the results record
