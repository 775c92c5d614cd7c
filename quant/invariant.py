"""Batch-invariant decode steps: a sequence's numbers do not depend on the other sequences of its batch.

A decode step of B sequences runs each layer once for all B rows, and two parts of it choose their arithmetic by B:
- a linear layer's GEMM: the kernel, its tile and its split of the reduction are picked by the number of rows M, so
  one row's dot products are summed in another order at batch 4 than at batch 1;
- attention over a padded batch: every row attends over the batch's longest key span, its pads masked, so its
  softmax and value sums run over another length (and blocking) than alone.

`BatchInvariant` is a torch function mode, active over the decode steps of one generate (harness/runner.py), in
which every `linear` (the projections, the MLPs, the MoE router, the LM head) multiplies in blocks of BLOCK rows,
the last block padded with zeros, so each row goes through the same kernel at the same M whatever the batch (a
GEMM's row depends only on its own input row and the weights). MoE experts (quant.prepare): on the kernel path the
project's Triton experts (quant.kernels.triton_moe: fixed row blocks per expert, no host sync), on the torch path
transformers' eager loop, whose `linear` calls the mode blocks. `rowwise` wraps the text attention
(quant.prepare_model switches to it in this mode): a one-query step runs row by row over the span of keys each row's
mask lets it see, without a mask, which is the call a batch of one makes. Everything else a decode step does is per
row already: norms and softmaxes reduce within a row, RoPE and activations are elementwise, and the greedy choice is
an argmax (ties: the first index). On a GPU the kernel path keeps its own decode attention with a plan per row:
OScaR's CUDA decode with fixed splits (quant.kernels.cuda), BF16's buffers through a Triton kernel that sums each
sequence in splits of its own (quant.kernels.triton_dense); the RMSNorms run on the project's kernel (a CTA per row:
torch's reduction splits a row over more threads when there are fewer rows).

The prompt's forward is the other place where the batch enters (padding, masks, GEMM shapes): the runner prefills
each prompt alone instead (harness/runner.py), so only decode-shaped work runs under the mode.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# Rows of every decode-step GEMM: a batch of up to BLOCK sequences costs one GEMM per layer as before (a decode
# step's GEMM streams the weights once whatever its rows), a larger one ceil(B / BLOCK).
BLOCK = 16


def blocked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) computed in blocks of BLOCK rows of x (the last padded with zeros): each output row
    is the same GEMM's whatever the number of rows of x."""
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    padded = -(-n // BLOCK) * BLOCK
    if padded != n:
        rows = torch.cat([rows, rows.new_zeros(padded - n, rows.shape[1])])
    out = torch.cat([F.linear(rows[i : i + BLOCK], weight, bias) for i in range(0, padded, BLOCK)])
    return out[:n].reshape(*x.shape[:-1], weight.shape[0])


def key_span(mask: torch.Tensor, row: int, keys: int) -> tuple[int, int]:
    """[start, end) of the keys that the last query of batch row `row` may see under an attention mask (bool: True
    attends; float: 0 attends, -inf not) of [B or 1, 1 or H, Lq, keys]. The keys seen must be one contiguous run (left
    padding, causal, a sliding window); anything else is refused."""
    m = mask[row if mask.shape[0] > 1 else 0]
    m = m.reshape(-1, m.shape[-1])[-1, -keys:]  # heads broadcast (1), the last query's row
    seen = m if m.dtype == torch.bool else m == 0
    idx = seen.nonzero().flatten()
    if idx.numel() == 0:
        return keys, keys
    start, end = int(idx[0]), int(idx[-1]) + 1
    if end - start != idx.numel():
        raise ValueError("batch-invariant attention needs each row's visible keys to be one contiguous span")
    return start, end


def rowwise(base):
    """An attention function (transformers' AttentionInterface) that answers every one-query step row by row: each
    row's query over the span of keys its mask lets it see (all without a mask), through `base` without a mask, the
    call `base` gets for that sequence alone. On a GPU these calls take the flash kernel (or the math one where flash
    does not apply): the cuDNN kernel SDPA may pick otherwise does not repeat its sums from run to run. Prompts and
    the kernel path's packed steps go to `base` as they are."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        if query.shape[2] != 1 or not isinstance(key, torch.Tensor):
            return base(module, query, key, value, attention_mask, **kwargs)
        outs = []
        with _decode_backends(query.device):
            for b in range(query.shape[0]):
                start, end = (
                    (0, key.shape[-2]) if attention_mask is None else key_span(attention_mask, b, key.shape[-2])
                )
                k, v = key[b : b + 1, :, start:end], value[b : b + 1, :, start:end]
                outs.append(base(module, query[b : b + 1], k, v, None, **kwargs)[0])
        return torch.cat(outs), None

    return attention


def _decode_backends(device: torch.device):
    from contextlib import nullcontext

    if device.type != "cuda":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.MATH])


@contextlib.contextmanager
def without_cudnn_attention(device: torch.device):
    """SDPA without its cuDNN kernel while the mode runs on a GPU (quant.prepare holds it from prepare to undo).

    cuDNN builds an execution plan at each new shape on its first call, and every prompt length and image size of a
    run is a new shape: the run's first method built them and the methods after it found them built, so its items/s
    depended on its place in the run (docs/PERFORMANCE.md, A method's place in the run). The mode's prompts run one
    at a time without a mask, where flash (which needs no plan) applies; its one-query steps already take flash or
    math (`rowwise`)."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def invariant_name(base: str) -> str:
    """The registered name of `rowwise(base)`."""
    return f"{base}_invariant"


def register(base: str) -> str:
    """Register `rowwise` over the attention function registered as `base` ("sdpa", quant's "oscar_packed"), with
    the kernel path's mask function (no mask for an unpadded one-query step); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from quant.kernels.hf_decode import decode_mask

    name = invariant_name(base)
    AttentionInterface.register(name, rowwise(AttentionInterface._global_mapping[base]))
    AttentionMaskInterface.register(name, decode_mask)
    return name


class BatchInvariant(TorchFunctionMode):
    """Decode steps whose linear layers multiply in blocks of BLOCK rows (see the module docstring); `calls` counts
    them."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            self.calls += 1
            return blocked_linear(*args, **kwargs)
        return func(*args, **kwargs)


def on_by_default(model) -> bool:
    """Whether the mode is on when the run does not say (KernelOptions.batch_invariant None): for a dense model on a
    GPU, where it costs a few percent of batch-16 items/s or gains some (docs/PERFORMANCE.md, Batch-invariant
    decoding). Not for MoE models, which take it when asked (on a GPU their experts then run the Triton experts,
    quant.kernels.triton_moe), nor on CPUs, where runs are batch 1 unless told and the mode's GEMMs of 16 rows
    cost most against a one-row product. Nor for encoder-decoders (Whisper), whose prompts the runner does not prefill
    row by row."""
    from quant.cache import text_config

    device = next(model.parameters()).device
    if getattr(model.config, "is_encoder_decoder", False):
        return False
    return device.type == "cuda" and not getattr(text_config(model), "num_experts", 0)


def resolve(kernels, model):
    """`kernels` (quant.kernels.KernelOptions) with batch_invariant decided for `model` where it was left to the
    default."""
    if kernels.batch_invariant is None:
        return kernels.replace(batch_invariant=on_by_default(model))
    return kernels
