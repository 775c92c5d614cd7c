"""What every model adapter gives the harness.

An adapter wraps one real transformers model and its real processor. It builds inputs, tags each
input position with its modality, runs `generate` with a quantized KV cache on the text backbone
only, and returns text plus the figures the results need.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from quant.cache import MODALITIES


def cache_argument(cache) -> dict[str, Any]:
    """The keyword `generate` takes the cache by: `cache` from transformers 5.24 on (where `past_key_values` warns on
    every call that it goes away), `past_key_values` before (5.17-5.23 take only that)."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"cache": cache} if (major, minor) >= (5, 24) else {"past_key_values": cache}

# Modality codes stored per KV position by the cache (quant.cache.QuantizedKVCache.set_modalities).
__all__ = ["MODALITIES", "Prompt", "Generation", "ModelLoadError", "graph_steps", "token_digest"]
TEXT, IMAGE, VIDEO, AUDIO = range(4)


@dataclass
class Prompt:
    """One request. Images are PIL images; audios are mono float32 arrays at 16 kHz."""

    text: str
    images: Sequence[Any] = ()
    audios: Sequence[np.ndarray] = ()
    system: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: its short name, hub id, family (text | llava | qwen3_vl | qwen3_omni), adapter
    ("module:Class"), default task and the prompts per generate an eval uses on a GPU unless told (`--batch-size`;
    1 elsewhere) (harness/models/__init__.py holds the registry)."""

    name: str
    hub_id: str
    family: str
    adapter: str
    default_task: str
    gpu_batch_size: int = 1


@dataclass
class Generation:
    """What one `generate` call produced and cost."""

    text: str
    input_tokens: int
    new_tokens: int
    modality_tokens: dict[str, int] = field(default_factory=dict)  # input positions per modality
    kv_bytes: dict[str, Any] = field(default_factory=dict)  # cache.nbytes() after generation
    wall_s: float = 0.0
    graph_steps: int = 0  # decode steps run as CUDA graphs (quant.kernels.graph_decode; 0: all eager)
    cost: dict[str, Any] = field(default_factory=dict)  # harness.models.cost.generation_cost of this call
    tokens_sha1: str = ""  # token_digest of the generated ids: equal answers compare equal even where text cannot


def token_digest(ids) -> str:
    """The first 16 hex digits of the SHA-1 of the generated token ids (any int sequence or 1D tensor): two runs'
    answers are the same tokens when their digests are equal, also where the text is empty (random weights decode
    to nothing printable) or a tokenizer folds different ids into one string."""
    import hashlib

    values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    return hashlib.sha1(",".join(str(int(t)) for t in values).encode()).hexdigest()[:16]


def graph_steps(cache) -> int:
    """Decode steps of the last generate over `cache` that ran as CUDA graphs (captured or replayed)."""
    state = getattr(cache, "state", None)
    return int(state.graph_steps) if state is not None else 0


class ModelLoadError(RuntimeError):
    """Weights or processor files could not be found or loaded; the message says how to fix it."""
