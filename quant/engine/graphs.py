"""The decode engine's CUDA-graph replay of one-token decode steps inside transformers' `generate`.

`make eval` decodes through `generate`: one eager `forward` per token, about a thousand kernel launches from
Python on an 8B model, so the GPU waits on the host (docs/PERFORMANCE.md has the figures). `decode_graphs(model,
cache)` wraps `model.forward` while `generate` runs, over a cache whose layers all declare the fixed-step protocol
(quant.engine.protocol.FixedStepLayer):
- the prefill, calls that are not a one-token step over `cache`, the first decode step (the warm-up: it opens
  the layers' fixed windows) and every step whose token fills the 128-token window (the flush packs it and
  replaces the packed tensors) run eagerly;
- the other steps replay a graph captured at the first of them. The step's tensor inputs (token and position
  ids) are copied into the graph's own; the cache's device state advances inside the graph (OScaR's fixed
  window and its device length, quant/engine/oscar.py) and the host advances the layers' counters
  (`advance_host`). A graph lives as long as the buffers it was captured on (the layers' `graph_key`: addresses
  and shapes): a flush writes its block into the packed buffers in place, so the graph captured before it replays
  after it; a buffer that grows (every HEADROOM tokens of decoding, quant/methods/oscar.py) makes the next step
  capture a new one. A padded batch decodes as one stacked layer per layer (quant/engine/rows.py) whose rows flush
  on the device, each at its own step: after the first (stacking) step, every step replays one of two graphs (the
  layers' `graph_variant`: whether the step packs some row's full window) until a buffer grows.
A capture that fails (a host sync in some model's forward) restores the layers' host state (capturing runs
no device work), warns once and leaves the rest of the call eager. Graph steps give the eager steps' logits
bit for bit (tests/kernels/test_graph_decode.py). The cache's kernel options turn it off (cuda_graphs=False).
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch

from quant.engine.protocol import FixedStepLayer
from quant.rows import RowsLayer

TOKEN_TYPES = ("token_type_ids", "mm_token_type_ids", "moe_mm_token_type_ids")


def graphs_enabled(model, cache) -> bool:
    """Graph steps apply to a cache on the fixed-shape path (OScaR's kernels, BF16's buffers) with the model on one
    CUDA device (a graph captures one device's stream: a model spread over GPUs with device_map decodes eagerly)."""
    state = getattr(cache, "state", None)
    if state is None or not state.fast_decode or (state.kernels is not None and not state.kernels.cuda_graphs):
        return False
    devices = {p.device for p in model.parameters()}
    return len(devices) == 1 and next(iter(devices)).type == "cuda"


def decode_graphs(model, cache):
    """Context manager around `model.generate(..., past_key_values=cache)`: a GraphDecoder when graphs apply
    (`graphs_enabled`), else nothing."""
    return GraphDecoder(model, cache) if graphs_enabled(model, cache) else contextlib.nullcontext()


class GraphDecoder:
    """See the module docstring. `counts` says how many steps ran eagerly, were captured and were replayed."""

    def __init__(self, model, cache):
        self.model, self.cache = model, cache
        self.layers = list(cache.layers)
        # A padded batch's layers hand the attention per-sequence lengths (quant/engine/rows.py): its padding mask is
        # not read either (generate passes the position ids it implies).
        self.padded = any(isinstance(layer, RowsLayer) for layer in self.layers)
        if not all(isinstance(layer, FixedStepLayer) for layer in self.layers):
            raise ValueError(
                "graph decoding needs a cache whose layers all have fixed-shape decode steps "
                "(quant.engine.FixedStepLayer: OScaR on the kernel path, BF16)"
            )
        self.counts = {"eager": 0, "captured": 0, "replayed": 0}
        self.failure: str | None = None
        self._forward = None
        self._own_forward = None  # an instance forward the model had before (accelerate's hooks): put back on exit
        # The layers' graph keys, read again only after a forward that ran eagerly (only those allocate or grow
        # buffers; a replay moves nothing): not on the host's path of every replayed step.
        self._buffers: tuple | None = None
        # Graphs capture and replay on the current device's streams: make it the model's (e.g. --device cuda:1).
        device = next(model.parameters()).device
        self._on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        self._drop()

    def _drop(self):
        self.graphs: dict[tuple, tuple] = {}  # key -> (graph, its inputs, its output): one per variant of a step
        self.out = None  # the output of the graph run last (see _output)

    def __enter__(self):
        self._on_device.__enter__()
        self._own_forward = self.model.__dict__.get("forward")
        self._forward = self.model.forward  # the bound method (an instance attribute set below shadows it)

        @functools.wraps(self._forward)  # generate reads forward's signature (position_ids, logits_to_keep)
        def forward(*args, **kwargs):
            return self.step(*args, **kwargs)

        self.model.forward = forward
        return self

    def __exit__(self, *exc):
        del self.model.forward  # back to the class's forward (or the instance forward it had)
        if self._own_forward is not None:
            self.model.forward = self._own_forward
        self._drop()
        self.cache.state.graph_steps = self.counts["captured"] + self.counts["replayed"]  # for the results
        self._on_device.__exit__(*exc)
        return False

    # -- one call of forward --------------------------------------------------------------------------
    def step(self, *args, **kwargs):
        call = None if args else self._graph_kwargs(kwargs)
        if call is None:
            self._buffers = None
            return self._forward(*args, **kwargs)
        if self.failure is not None or not all(layer.graph_ready() for layer in self.layers):
            self.counts["eager"] += 1  # a flush (the graph stays: see graph_key) or a growth
            self._buffers = None
            return self._forward(**kwargs)
        if self._buffers is None:
            self._buffers = tuple(layer.graph_key() for layer in self.layers)
        key = (signature(call), self._buffers, tuple(layer.graph_variant() for layer in self.layers))
        if key not in self.graphs:
            return self._capture(call, key)
        graph, inputs, self.out = self.graphs[key]
        for name, buf in inputs.items():
            buf.copy_(call[name])
        graph.replay()
        for layer in self.layers:
            layer.advance_host()
        self.counts["replayed"] += 1
        return self._output()

    def _graph_kwargs(self, kwargs):
        """The keywords a graph of this step takes, or None when the call is not a one-token step over this cache.
        What grows by a column every step under older transformers (5.17) is cut to this step's, as 5.23 passes it:
        a 2D attention mask of ones (or any mask of a padded batch) is left out (the packed attention reads no mask;
        checking it reads it back, one sync per step, as generate's stopping check does), and token-type ids keep
        their last column (the models
        read them only to build position ids, which generate passes)."""
        ids = kwargs.get("input_ids")
        if not (
            kwargs.get("past_key_values") is self.cache
            and isinstance(ids, torch.Tensor)
            and ids.shape[-1] == 1
            and kwargs.get("inputs_embeds") is None
        ):
            return None
        call = dict(kwargs)
        mask = call.pop("attention_mask", None)
        if mask is not None and (
            not isinstance(mask, torch.Tensor) or mask.dim() != 2 or not (self.padded or bool(mask.all()))
        ):
            return None
        for name in TOKEN_TYPES:  # transformers 5.17 passes Qwen3-VL's whole mm_token_type_ids (5.23: the step's)
            t = call.get(name)
            if isinstance(t, torch.Tensor) and t.shape[-1] != 1:
                call[name] = t[..., -1:]
        return call

    def _capture(self, kwargs, key):
        if any(k[:2] != key[:2] for k in self.graphs):  # graphs of other buffers or inputs: never replayed again
            self._drop()
        saved = [layer.host_state() for layer in self.layers]
        inputs = {n: v.clone() for n, v in kwargs.items() if isinstance(v, torch.Tensor)}
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):  # its own pool: reusing a dropped graph's trips the allocator (torch 2.11)
                out = self._forward(**{**kwargs, **inputs})
        except Exception as err:  # noqa: BLE001 - whatever stops a capture, the step runs eagerly
            for layer, state in zip(self.layers, saved):
                layer.set_host_state(state)
            self.failure = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            warnings.warn(
                f"CUDA-graph capture of a decode step failed ({self.failure}); decoding eagerly", stacklevel=3
            )
            self.counts["eager"] += 1
            return self._forward(**kwargs)
        self.graphs[key] = graph, inputs, out
        self.out = out
        graph.replay()  # capturing recorded the step; this runs it
        self.counts["captured"] += 1
        return self._output()

    def _output(self):
        """The captured output with its tensors (logits; hidden states or attentions when asked for) copied out of
        the graph's memory, which the next replay rewrites."""
        out = self.out
        return type(out)(**{k: _copied(v) for k, v in out.items()})


def _copied(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(_copied(v) for v in value)
    return value  # the cache and plain values


def signature(kwargs) -> tuple:
    """What must match between a captured step and a replayed one: tensor shapes and dtypes, other values."""
    parts = []
    for name in sorted(kwargs):
        v = kwargs[name]
        if isinstance(v, torch.Tensor):
            parts.append((name, tuple(v.shape), v.dtype, v.device))
        elif v is None or isinstance(v, (bool, int, float, str)):
            parts.append((name, v))
        else:
            parts.append((name, id(v)))
    return tuple(parts)
