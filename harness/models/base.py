"""What every model adapter gives the harness.

An adapter wraps one real transformers model and its real processor. It builds one prompt's inputs
(`build_inputs(Prompt)`, tasks/contract.py), tags each input position with its modality (`tags`), names the module
that generates (`generator`: the text backbone only) and turns new token ids into text (`decode`); the runner
(harness/runner.py) generates and scores with them through a quantized KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quant.cache import MODALITIES


def cache_argument(cache) -> dict[str, Any]:
    """The keyword `generate` takes the cache by: `cache` from transformers 5.24 on (where `past_key_values` warns on
    every call that it goes away), `past_key_values` before (5.17-5.23 take only that)."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"cache": cache} if (major, minor) >= (5, 24) else {"past_key_values": cache}


# Modality codes stored per KV position by the cache (quant.cache.QuantizedKVCache.set_modalities).
__all__ = ["MODALITIES", "ModelSpec", "ModelLoadError", "cache_argument", "graph_steps", "token_digest"]
TEXT, IMAGE, VIDEO, AUDIO = range(4)


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: its short name, hub id, family (a folder harness/models/<family>/: its adapter, what it
    reads, its traits), default task and the prompts per generate an eval uses on a GPU unless told
    (`--batch-size`; 1 elsewhere) (harness/models/__init__.py holds the registry)."""

    name: str
    hub_id: str
    family: str
    default_task: str
    gpu_batch_size: int = 1


def token_digest(ids) -> str:
    """The first 16 hex digits of the SHA-1 of the generated token ids (any int sequence or 1D tensor): two runs'
    answers are the same tokens when their digests are equal, also where the text is empty (random weights decode
    to nothing printable) or a tokenizer folds different ids into one string."""
    import hashlib

    values = ids.tolist() if hasattr(ids, "tolist") else list(ids)
    return hashlib.sha1(",".join(str(int(t)) for t in values).encode()).hexdigest()[:16]


def truncate_middle(tokenizer, text: str, max_tokens: int | None) -> str:
    """`text` cut in its middle to at most `max_tokens` tokens, LongBench's way (its pred.py): the text's tokens as the
    tokenizer gives them (its special tokens in), and if there are more than `max_tokens`, the decoded first
    int(max_tokens / 2) and last int(max_tokens / 2) joined without a separator (special tokens skipped). None: the
    text as it is."""
    if max_tokens is None:
        return text
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be at least 2 to keep both ends of a prompt, got {max_tokens}")
    ids = tokenizer(text).input_ids
    if len(ids) <= max_tokens:
        return text
    half = int(max_tokens / 2)
    return tokenizer.decode(ids[:half], skip_special_tokens=True) + tokenizer.decode(
        ids[-half:], skip_special_tokens=True
    )


def graph_steps(cache) -> int:
    """Decode steps of the last generate over `cache` that ran as CUDA graphs (captured or replayed)."""
    state = getattr(cache, "state", None)
    return int(state.graph_steps) if state is not None else 0


class ModelLoadError(RuntimeError):
    """Weights or processor files could not be found or loaded; the message says how to fix it."""
