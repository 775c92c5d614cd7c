"""The exact prompt prefills of Generate requests, run once and shared by the methods of a run (harness/runner.py).

A prompt attends with exact K/V whatever the method (a cache quantizes the prompt only when it stores it), so its
forward is the same for every method that leaves the model in the same state: the same weights (the values'
rotation folded in or not, quant/fold.py), attention implementation and kernel options, all in the key. The first
method runs the forward as it always does and the store records what the forward handed the cache, layer by layer
(copies of the tensors themselves, strides kept: a method's token norms sum over the layout it is handed); a later
method's fresh cache gets the very same tensors through `cache.update`, so it stores what its own prefill would
have stored, and the forward does not run again.

The runner has two prefills, and each is kept as it is:
- "batch" (the default path): generate's first forward over the left-padded batch. Kept: the K/V it handed each
  layer and the logits of its last position, keyed by the whole batch (padding and GEMM shapes enter its numbers,
  so only the same batch is the same forward; the methods of a run see the same batches). A later method runs
  generate as ever, with that first forward answered from the store (`PromptShare.first_forward`): generate picks
  the first token through its own logits processors and stopping rules, and every step after it is the method's
  own. The logits are kept rather than feeding the prompt's last token again as a decode step (as the rows path
  does) because on this path that token attends with exact K/V inside the prefill: as a decode step it would attend
  over the method's quantized cache and change the answer.
- "rows" (the batch-invariant mode, harness/models/batching.prefill_rows): each prompt but its last token alone, as
  a batch of one. Kept per prompt, whatever batch it comes in: the K/V of each layer. The last token is generate's
  first step, the method's own.

Shared (`shares`): decoder-only models whose prompt forward leaves nothing but the cache behind (text models,
LLaVA-NeXT). Not shared, the prefill runs as before: models that keep the prompt's M-RoPE offset on the model
(Qwen3-VL and the Qwen3-Omni thinker, `rope_deltas`: not shown equal yet), encoder-decoders (Whisper) and families
with caches of their own shape, methods with a `prepare` hook that watches the prompt's forward (RotateKV:
harness.scoring.Prefills.shares) and the reference (the model's own DynamicCache).

Memory: up to `max_bytes` of host memory, past that in a temporary directory on disk while the disk keeps
`min_free` bytes free, past that not kept (each method then prefills the prompt). The directory goes when the store
is closed or dropped (and at exit); another model drops what was kept.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass

import torch

from harness.scoring import PREFILL_BYTES, Prefills

PROMPT_BYTES = 4 << 30  # host memory for kept prompt K/V (a 4K-token SmolLM2-135M prompt in fp32: ~190 MB)
MIN_FREE = 8 << 30  # disk space a spill leaves free


def shares(adapter, method) -> bool:
    """Whether `method`'s prompts on `adapter`'s model may take a kept prefill (see the module docstring)."""
    from harness.models.batching import rope_holder

    model = adapter.generator
    return (
        method is not None
        and Prefills.shares(method)
        and getattr(adapter, "make_cache", None) is None
        and not getattr(model.config, "is_encoder_decoder", False)
        and rope_holder(model) is None
    )


@dataclass
class Kept:
    """One prefill: each layer's (K, V) on the host as the forward handed them, the device each came from, and for
    a batch prefill its last position's logits [B, 1, V] with the forward's output class and its cache field."""

    kv: list[tuple[torch.Tensor, torch.Tensor]] | None
    devices: list[torch.device]
    logits: torch.Tensor | None = None
    output: type | None = None
    cache_field: str | None = None
    path: str | None = None  # where kv and logits went when spilled to disk (kv is then None)

    def nbytes(self) -> int:
        size = sum(k.nbytes + v.nbytes for k, v in self.kv)
        return size + (self.logits.nbytes if self.logits is not None else 0)


class PromptPrefills:
    """The kept prompt prefills of a run (see the module docstring), for one model object at a time."""

    def __init__(self, max_bytes: int = PROMPT_BYTES, directory: str | None = None, min_free: int = MIN_FREE):
        self.max_bytes, self.min_free, self.directory = max_bytes, min_free, directory
        self.bytes = 0  # host bytes kept
        self.hits = 0
        self._kept: dict[tuple, Kept] = {}
        self._model = None  # weakref to the model the kept forwards ran on
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._files = 0  # files written to it

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def spilled(self) -> int:
        """How many prefills are kept on disk."""
        return sum(k.path is not None for k in self._kept.values())

    def key(self, model, kind: str, features: list, signature: str) -> tuple:
        """The key of a prefill of `kind` ("batch", "rows") over `features` (the processor outputs, in batch order)
        on `model` as it is now; a model other than the last one's drops everything kept."""
        from quant import fold
        from quant.cache import text_config

        if self._model is None or self._model() is not model:
            self.clear()
            self._model = weakref.ref(model)
        param = next(model.parameters())
        state = (fold.is_folded(model), str(param.device), str(param.dtype), text_config(model)._attn_implementation)
        return (kind, *state, signature, digest(features))

    def get(self, key: tuple) -> Kept | None:
        """The prefill kept under `key`, its tensors fresh copies on their devices (a cache may keep the very tensors
        it is handed; the next methods read the kept ones), or None."""
        kept = self._kept.get(key)
        if kept is None:
            return None
        data = {"kv": kept.kv, "logits": kept.logits}
        if kept.path is not None:
            data = torch.load(kept.path, map_location="cpu", weights_only=True, mmap=True)
        self.hits += 1
        kv = [(k.to(d, copy=True), v.to(d, copy=True)) for (k, v), d in zip(data["kv"], kept.devices)]
        logits = data["logits"]
        return Kept(kv, kept.devices, None if logits is None else logits.clone(), kept.output, kept.cache_field)

    def put(self, key: tuple, kept: Kept) -> str:
        """Keep `kept` under `key`: in memory within max_bytes, else on disk while it keeps min_free free, else not
        at all. Returns where: "memory", "disk" or "not kept"."""
        if key in self._kept:
            return "memory" if self._kept[key].path is None else "disk"
        size = kept.nbytes()
        if self.bytes + size <= self.max_bytes:
            self._kept[key] = kept
            self.bytes += size
            return "memory"
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="oscar-prefills-", dir=self.directory)
        if shutil.disk_usage(self._tmp.name).free - size < self.min_free:
            return "not kept"
        self._files += 1
        path = os.path.join(self._tmp.name, f"{self._files}.pt")
        torch.save({"kv": kept.kv, "logits": kept.logits}, path)
        self._kept[key] = Kept(None, kept.devices, None, kept.output, kept.cache_field, path)
        return "disk"

    def clear(self) -> None:
        """Drop everything kept (memory and disk files); the store stays usable."""
        for kept in self._kept.values():
            if kept.path is not None and os.path.exists(kept.path):
                os.remove(kept.path)
        self._kept, self.bytes, self._model = {}, 0, None

    def close(self) -> None:
        """Drop everything kept and remove the temporary directory."""
        self.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


class RunPrefills(Prefills):
    """The exact prompt forwards a run shares among its methods: Score windows (harness.scoring.Prefills, which this
    is) and Generate prompts (`prompts`, a PromptPrefills)."""

    def __init__(self, max_bytes: int = PREFILL_BYTES, prompts: PromptPrefills | None = None):
        super().__init__(max_bytes)
        self.prompts = PromptPrefills() if prompts is None else prompts


def digest(features: list) -> str:
    """SHA-1 over every tensor of `features` (names, dtypes, shapes and bytes), in order."""
    h = hashlib.sha1()
    for feature in features:
        for name in sorted(feature.keys()):
            t = feature[name]
            h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
            h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@contextlib.contextmanager
def recording(cache):
    """Within: what the model hands `cache` (its `update` calls) is copied to the host, {layer: (K, V, device)}; the
    copies keep the strides of the tensors handed."""
    kv: dict[int, tuple] = {}
    update = cache.update

    def record(key_states, value_states, layer_idx, *args, **kwargs):
        host = key_states.detach().to("cpu", copy=True), value_states.detach().to("cpu", copy=True)
        kv[layer_idx] = (*host, key_states.device)
        return update(key_states, value_states, layer_idx, *args, **kwargs)

    cache.update = record  # an instance attribute shadows the class's method while recording
    try:
        yield kv
    finally:
        del cache.update


def recorded(kv: dict, layers: int, **extra) -> Kept | None:
    """The Kept of a recording over `layers` cache layers; None when the forward did not hand every layer once."""
    if sorted(kv) != list(range(layers)):
        return None
    return Kept([kv[i][:2] for i in range(layers)], [kv[i][2] for i in range(layers)], **extra)


def replay(cache, kept: Kept) -> None:
    """Hand `cache` what the kept forward handed its cache, layer by layer, in the forward's order."""
    for i, (k, v) in enumerate(kept.kv):
        cache.update(k, v, i)


class PromptShare:
    """One generate call's use of the run's PromptPrefills on `model` (its generator): replays kept prefills, records
    the others and keeps them on `commit` (after the call's timing: a spill to disk is not the method's time).
    `reused`: per prompt of the call, whether its prefill was an earlier method's."""

    def __init__(self, store: PromptPrefills, model, kernels):
        self.store, self.model = store, model
        self.signature = repr(sorted(kernels.to_dict().items()))
        self.reused: list[bool] = []
        self._pending: list[tuple[tuple, Kept]] = []

    def row(self, feature, cache, run) -> bool:
        """The batch-invariant prefill of one prompt (`feature`, its processor output) into `cache` (its rows):
        replayed when kept, else `run()` recorded. Returns whether it was replayed."""
        key = self.store.key(self.model, "rows", [feature], self.signature)
        kept = self.store.get(key)
        if kept is not None:
            replay(cache, kept)
        else:
            with recording(cache) as kv:
                run()
            self._keep(key, recorded(kv, len(cache.layers)))
        self.reused.append(kept is not None)
        return kept is not None

    @contextlib.contextmanager
    def first_forward(self, cache, features: list):
        """Within (around generate): the model's first forward, the prefill of the left-padded batch of `features`
        into `cache`, is answered from the store when kept (K/V replayed into `cache`, the kept logits returned),
        else run and recorded. Any other call runs as it would."""
        model = self.model
        key = self.store.key(model, "batch", features, self.signature)
        shape = (len(features), max(int(f["input_ids"].shape[1]) for f in features))
        inner, own = model.forward, model.__dict__.get("forward")  # own: an instance forward (the graph decoder's)
        self.reused = [False] * len(features)
        calls = []

        @functools.wraps(inner)  # generate reads forward's signature (logits_to_keep)
        def forward(*args, **kwargs):
            calls.append(None)
            if len(calls) > 1 or not _is_prefill(args, kwargs, cache, shape):
                return inner(*args, **kwargs)
            kept = self.store.get(key)  # read here: loading it is this method's prefill time
            if kept is not None:
                replay(cache, kept)
                self.reused = [True] * len(features)
                return kept.output(logits=kept.logits.to(kwargs["input_ids"].device), **{kept.cache_field: cache})
            with recording(cache) as kv:
                out = inner(*args, **kwargs)
            field = next((name for name, value in out.items() if value is cache), None)
            if field is not None:
                logits = out.logits[:, -1:].detach().to("cpu", copy=True)
                self._keep(key, recorded(kv, len(cache.layers), logits=logits, output=type(out), cache_field=field))
            return out

        model.forward = forward
        try:
            yield self
        finally:
            del model.forward
            if own is not None:
                model.forward = own

    def _keep(self, key: tuple, kept: Kept | None) -> None:
        if kept is not None:
            self._pending.append((key, kept))

    def commit(self) -> None:
        """Keep the prefills this call recorded (call once the call's timing is taken)."""
        for key, kept in self._pending:
            self.store.put(key, kept)
        self._pending = []


def _is_prefill(args, kwargs, cache, shape: tuple[int, int]) -> bool:
    """Whether a forward call is the prompt batch's prefill into the empty `cache`."""
    ids = kwargs.get("input_ids")
    given = kwargs.get("cache", kwargs.get("past_key_values"))
    return (
        not args
        and given is cache
        and isinstance(ids, torch.Tensor)
        and tuple(ids.shape) == shape
        and kwargs.get("inputs_embeds") is None
        and cache.get_seq_length() == 0
    )
