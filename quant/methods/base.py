"""The shared shape of every method: a frozen config and a transformers cache layer.

A layer stores what its method stores (packed codes, scales, full-precision windows) in named
attributes and implements three things: `_append(k, v)` (store new tokens, flushing by its policy),
`_dense()` (dequantize everything stored into [B, H, T, D] tensors: the torch reference path) and
`_stored()` (the stored tensors by byte category, for memory accounting and batch reordering).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch
from transformers.cache_utils import CacheLayerMixin

from quant.packed import QTensor

# Byte categories of `nbytes()`; "quantized" = codes + scales + norms, "full_precision" = the rest.
QUANTIZED_PARTS = ("codes", "scales", "norms")
FP_PARTS = ("residual", "outliers", "fp")


@dataclass(eq=False)
class CacheState:
    """Cache-wide facts every layer of one cache reads (quant.cache.QuantizedKVCache.state).

    modalities: LongTensor [B, S] of the prompt's modality codes, or None; values_folded: the model's weights carry
    the values' rotation (quant/fold.py); kernels: the run's quant.kernels.KernelOptions; fast_decode: decode steps
    hand the attention function the packed state (the kernel path); graph_steps: decode steps replayed as CUDA
    graphs so far (quant.kernels.graph_decode)."""

    kernels: Any = None
    modalities: torch.Tensor | None = None
    values_folded: bool = False
    fast_decode: bool = False
    graph_steps: int = 0
    window_lengths: torch.Tensor | None = None  # int32 [layers, B]: each layer's valid window tokens on the device
    # The batch's sequences all hold the same number of tokens (no padding): batch 1, or a batch filled directly
    # (benchmarks). Only then may decode steps of several sequences take the fixed-shape path, which writes every
    # sequence's token at one position.
    uniform_rows: bool = False

    def fixed_step(self, batch: int) -> bool:
        """Whether a one-token decode step of `batch` sequences takes the fixed-shape (kernel) path."""
        return self.fast_decode and (batch == 1 or self.uniform_rows)

    # Teacher-forced scoring (tasks/ppl): a chunk of S > 1 tokens then attends over everything as stored after it,
    # as S decode steps would, rather than as a prompt (exact new K/V); see MethodConfig.exact_chunk.
    decode_chunks: bool = False

    def window_length(self, layer_idx: int, num_layers: int, batch: int, device) -> torch.Tensor:
        """Layer `layer_idx`'s row of `window_lengths` (allocated on first use): every layer's window length lives
        in one tensor, so one launch sets them all (a benchmark replaying one decode step resets them per replay)."""
        w = self.window_lengths
        if w is None or w.shape != (num_layers, batch) or w.device != torch.device(device):
            w = self.window_lengths = torch.zeros(num_layers, batch, dtype=torch.int32, device=device)
        return w[layer_idx]


@dataclass
class LayerContext:
    """Facts about the model a layer may need, shared by all layers of one cache."""

    layer_idx: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    shared: dict[str, Any] = dataclasses.field(default_factory=dict)  # the method's own cache-wide data
    state: CacheState = dataclasses.field(default_factory=CacheState)  # cache-wide facts (see CacheState)
    row: int | None = None  # the sequence of a padded batch this layer stores alone (quant/rows.py); None: all


@dataclass(frozen=True)
class MethodConfig:
    """Base of every method config. Subclasses add fields with the paper defaults and validate them."""

    name: str = ""
    method: ClassVar[str] = ""

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        pass

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, **dataclasses.asdict(self)}

    def cannot_run(self, model) -> str | None:
        """Why this method cannot run on `model` (a transformers model), in one line, or None. The eval loop asks
        before any item, so `--quant all` skips such a method instead of failing every item."""
        return None

    @property
    def bits(self) -> float:
        """Nominal bits per code (the method's headline bit width)."""
        return 16.0

    @property
    def folds_values(self) -> bool:
        """Whether the values' rotation lives in the model's weights (quant/fold.py folds it into v_proj / o_proj
        when a cache is made with the model) rather than in the cache."""
        return False

    @property
    def kernel_decode(self) -> bool:
        """Whether this config stores the packed format the fast decode kernels read (quant.kernels): its caches
        then decode on them on a GPU (quant.cache.use_fast_decode)."""
        return False

    @property
    def fixed_shape_decode(self) -> bool:
        """Whether its layers have fixed-shape decode steps on a GPU (the same shapes and addresses every step, so
        quant.kernels.graph_decode replays them as CUDA graphs): the kernel path, or BF16's preallocated buffers."""
        return self.kernel_decode

    @property
    def window(self) -> int:
        """R, the newest tokens kept in full precision (block flush); 0 = none (every token quantized when stored)."""
        return int(getattr(self, "residual_length", 0))

    def exact_chunk(self, position: int) -> int:
        """How many tokens from cache position `position` on one forward may feed with CacheState.decode_chunks
        and have each token see exactly what its own decode step would see. 1 (step by step) unless the method
        knows better: its stored state of the tokens before any token t must not depend on tokens after t."""
        return 1

    def make_layer(self, ctx: LayerContext) -> "QuantLayer":
        raise NotImplementedError


def block_flush_chunk(position: int, r: int) -> int:
    """exact_chunk of a block-flushed window of r tokens (r = 0: tokens quantized one by one, independently).

    The window flushes when the cache holds a multiple of r tokens, so the token at position q flushes it when
    (q + 1) % r == 0: that token goes alone (its step sees its whole block quantized); the tokens before it
    change nothing already stored."""
    if r == 0:
        return 1 << 30
    return 1 if (position + 1) % r == 0 else r - 1 - position % r


def check(condition: bool, message: str) -> None:
    """Raise a ValueError with a message that says what is wrong and what is allowed."""
    if not condition:
        raise ValueError(message)


def check_pow2_group(name: str, value: int) -> None:
    check(value > 0 and value & (value - 1) == 0 and value >= 16, f"{name} must be a power of two >= 16, got {value}")


def check_zero_point(method: str, value: str) -> None:
    check(
        value in ("float", "integer"),
        f"{method}.zero_point must be 'float' (x_hat = q * s + min) or 'integer' "
        f"(x_hat = s * (q - round(-min / s))), got {value!r}",
    )


def addresses(*tensors: torch.Tensor | None) -> tuple:
    """(data_ptr, shape) of each tensor (None stays None): what a CUDA graph captured over them is bound to (a layer's
    graph_key, quant/kernels/graph_decode.py)."""
    return tuple(None if t is None else (t.data_ptr(), tuple(t.shape)) for t in tensors)


def own(x: torch.Tensor) -> torch.Tensor:
    """`x`, copied when it is a small view of a larger tensor (a window's remainder after a flush of the prompt):
    a view keeps its whole base alive, here the prompt's exact K/V of every layer until the cache is dropped."""
    return x.clone() if x.untyped_storage().nbytes() > 2 * x.nbytes + 4096 else x


def cat_tokens(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None or a.shape[-2] == 0 else torch.cat([a, b], dim=-2)


class QuantLayer(CacheLayerMixin):
    """A cache layer holding one method's stored state.

    update(k, v) with k, v [B, H_kv, S, D] (post-RoPE, as transformers passes them):
    - S > 1 (prefill or a chunk): stores them, returns [dequantized past ; exact new] -- the prompt
      attends with exact K/V, it is quantized only when stored;
    - S == 1 (decode): stores it, returns everything as stored (dequantized), so decoding attends over
      the quantized cache.
    """

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, config: MethodConfig, ctx: LayerContext):
        super().__init__()
        self.config = config
        self.ctx = ctx
        self.seen = 0

    # -- transformers' layer API -------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.batch = key_states.shape[0]
        if key_states.shape[-1] != self.ctx.head_dim or key_states.shape[1] != self.ctx.num_kv_heads:
            raise ValueError(
                f"layer {self.ctx.layer_idx}: keys have shape {tuple(key_states.shape)} but the cache was built for "
                f"{self.ctx.num_kv_heads} KV heads of dim {self.ctx.head_dim}; pass the text config to make_cache"
            )
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if new > 1 and not self.ctx.state.decode_chunks:
            past = self._dense() if self.seen else None
            self._append(key_states, value_states)
            self.seen += new
            if past is None:
                return key_states, value_states
            return torch.cat([past[0], key_states], -2), torch.cat([past[1], value_states], -2)
        self._append(key_states, value_states)
        self.seen += new
        return self._dense()

    def get_seq_length(self) -> int:
        return self.seen

    def _window_blocks(self, k: torch.Tensor, v: torch.Tensor, r: int):
        """Append k, v [B, H, S, D] to the full-precision window (k_res, v_res) and take out its first
        floor(len / r) * r tokens, returned as (k, v) to quantize, or None. r = 0: every token, at once."""
        self.k_res, self.v_res = cat_tokens(self.k_res, k), cat_tokens(self.v_res, v)
        n = self.k_res.shape[-2]
        full = n if r == 0 else n // r * r
        if not full:
            return None
        block = self.k_res[..., :full, :], self.v_res[..., :full, :]
        self.k_res, self.v_res = own(self.k_res[..., full:, :]), own(self.v_res[..., full:, :])
        return block

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.seen + query_length, 0

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        for name in self._state_names():
            setattr(self, name, None)
        self._dense_memo = {}
        self.seen = 0
        self.is_initialized = False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._map_state(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map_state(lambda t: t[indices])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map_state(lambda t: t.repeat_interleave(repeats, dim=0))

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} cannot crop: quantized blocks cannot be un-flushed; assisted decoding "
            "is not supported with a quantized KV cache"
        )

    # -- what each method implements ---------------------------------------------------------
    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        raise NotImplementedError

    def _dense(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _stored(self) -> dict[str, list[torch.Tensor | QTensor | None]]:
        """Stored tensors by byte category: codes/scales come from QTensors, others are named here."""
        raise NotImplementedError

    # -- shared helpers ----------------------------------------------------------------------
    memo_dense = True  # off: every decode step dequantizes everything stored again (the tests compare both)

    def _memo(self, name: str, stored: tuple, compute: Callable[[], Any]) -> Any:
        """compute(), the dequantized form of the `stored` objects, kept under `name` until one of them is replaced. A
        flush stores new objects (codes are concatenated or re-viewed, never written into a stored block in place), so
        between two flushes every decode step would dequantize the same codes again: on the CPU that is most of a
        step's time at a few thousand tokens. Kept on the CPU only: on a GPU the copy would double the cache's memory
        and the kernels never take this path. The objects are held with the value, so their ids cannot be reused."""
        if not self.memo_dense or self.device.type != "cpu":
            return compute()
        key = tuple(id(x) for x in stored)
        memos = self.__dict__.setdefault("_dense_memo", {})
        memo = memos.get(name)
        if memo is not None and memo[0] == key:
            return memo[2]
        value = compute()
        memos[name] = (key, stored, value)
        return value

    def _state_names(self) -> list[str]:
        # Private tensors (leading underscore: rotations, permutations) are per-layer constants, not state.
        return [n for n, v in vars(self).items() if not n.startswith("_") and isinstance(v, (torch.Tensor, QTensor))]

    def _map_state(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        for name in self._state_names():
            value = getattr(self, name)
            setattr(self, name, value.map(fn) if isinstance(value, QTensor) else fn(value))

    def nbytes(self) -> dict[str, int]:
        """Bytes actually held, by category (codes, scales, norms, residual, outliers, fp)."""
        out = dict.fromkeys(QUANTIZED_PARTS + FP_PARTS, 0)
        for category, items in self._stored().items():
            for item in items:
                if isinstance(item, QTensor):
                    for part, n in item.nbytes().items():
                        out[part] += n
                elif item is not None:
                    out[category] += item.nbytes
        return out

    def out_dtype(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)
