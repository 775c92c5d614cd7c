"""Together AI's OSCAR (arXiv 2605.17757; FutureMLS-Lab/OSCAR), a baseline. Not OScaR (arXiv 2605.19660,
quant/methods/oscar.py): a calibrated rotation and per-token INT2 rows, no token scaling, no per-channel key groups.

Rotation R = U H P per layer, shared by its KV heads (`granularity="kv_head"`: one per KV head, their open PR #20),
applied after RoPE to rows: k_rot = k R_K, v_rot = v R_V. U: the eigenvectors (float64 eigh) of
- keys: C_h = Q_h^T Q_h / (T g), the uncentered second moment of the post-RoPE queries of KV head h's GQA group
  (g query heads, T tokens), averaged over the KV heads;
- values: S_h = sum_t w_t v_t v_t^T / sum_t w_t with w_t = k_t^T C_h k_t, averaged over the KV heads.
H: the normalized Sylvester Hadamard (natural order, no signs); P = I[:, perm] with perm[bitrev(i)] =
argsort(eigenvalues, descending)[i]. [ours] Each eigenvector's sign is fixed (its largest entry positive), so the
rotation does not depend on the LAPACK build. `rotation="hadamard"`: R = H, their calibration-free fallback.

Calibration text [ours]: theirs were evaluated items (GPQA prompts; OCRBench and LongBench-E test items). Here it is
the project's own passages (quant/calibration.py, `calibration`), none of them any task's item, each a forward of
its own; the config carries their digest (`calibration_sha256`), so the text is part of a result's identity. The
post-RoPE Q, K and V reach the fit through a registered attention function during those forwards (queries never
reach a cache). The fit is made once per model and text (kept on the model object, as RotateKV keeps its own).

Quantizer, per token and KV head on the rotated row x of d channels, in float32 (their Triton kernels' math):
- clip: tau = sort(|x|)[min(int(r d), d - 1)], x <- clamp(x, -tau, tau); r = `clip_k` (0.96) for keys, `clip_v`
  (0.92) for values, set by hand in every model wrapper of theirs; 0 = off;
- uniform, groups of `group_size` channels (0 = d, their default): s = max(max - min, 1e-8) / 3, z = -min / s, not
  rounded (`zero_point="integer"` rounds it), q = floor(x / s + z + 0.5), x_hat = (q - z) s;
- `codebook="lloyd_max"` (their VL branch): on prompt writes with one group per row, as theirs (decode flushes and
  narrower groups stay uniform): u = (x - mean) / sqrt(var + 1e-8), q = [u >= -t] + [u >= 0] + [u >= t] with
  t = 0.98107, s = 1.16 * (2 * 1.50956 / 3) * std, x_hat = mean + (q - 1.5) s.
Each group's scale and offset -z s are stored in `scale_dtype` (float32, as every script of theirs sets it), the 2-bit
codes 16 to an int32.

Full-precision tokens: the first `sink_tokens` of the prompt (a shorter prompt keeps all of its own; decoded tokens
never become sinks, as theirs) and the newest `residual_length` R. `flush="ring8"`
(theirs): a prompt keeps its last R tokens exact and quantizes the rest; decoding adds tokens to the window and,
when it holds R + 8, quantizes the 8 oldest. `flush="block"`: the window of the paper comparison (quant/methods/
base.py: R tokens quantized at once when R are pending). Decoding attends over k_hat = k_rot_hat R_K^T and
v_hat = v_rot_hat R_V^T: R is orthogonal, so the scores and outputs are theirs (queries rotated by R_K; R_V folded
into v_proj and undone after attention), with R kept in float32 (theirs: bf16 at run time) and in the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.calibration import SOURCES, digest, passages
from quant.methods.base import MethodConfig, QuantLayer, block_flush_chunk, cat_tokens, check, check_zero_point, own
from quant.packed import QTensor, cat_optional
from quant.primitives import hadamard, pack_codes

RING = 8  # tokens a decode flush quantizes at once (theirs: every 8 steps)
# Their Lloyd-Max constants: thresholds +-LM_T and 0 on the standardized row, outer levels +-LM_C widened by LM_RATIO.
LM_T, LM_C, LM_RATIO = 0.9810652732849121, 1.5095585584640503, 1.16
SCALE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CAPTURE = "together_oscar_capture"  # the attention function that records Q, K, V during calibration


@dataclass(frozen=True)
class TogetherOSCARConfig(MethodConfig):
    method = "together-oscar"
    group_size: int = 0  # channels per scale and offset; 0 = head_dim
    scale_dtype: str = "float32"
    clip_k: float = 0.96
    clip_v: float = 0.92
    zero_point: str = "float"
    codebook: str = "uniform"  # "lloyd_max": the prompt's writes when a group is the whole row (theirs)
    sink_tokens: int = 64
    residual_length: int = 256
    flush: str = "ring8"
    rotation: str = "calibrated"  # "hadamard": R = H, no calibration
    granularity: str = "layer"  # one rotation per layer, or per KV head ("kv_head")
    # The calibration text (quant.calibration.SOURCES) and its digest: recorded, so a change of text changes the config
    calibration: str = "project-prose-v1"
    calibration_sha256: str = digest("project-prose-v1")

    def validate(self):
        check(
            self.group_size == 0 or (self.group_size >= 16 and self.group_size & (self.group_size - 1) == 0),
            f"together-oscar.group_size must be 0 (head_dim) or a power of two >= 16, got {self.group_size}",
        )
        check(
            self.scale_dtype in SCALE_DTYPES,
            f"together-oscar.scale_dtype must be one of {', '.join(SCALE_DTYPES)}, got {self.scale_dtype!r}",
        )
        for name in ("clip_k", "clip_v"):
            check(0.0 <= getattr(self, name) < 1.0, f"together-oscar.{name} must be in [0, 1) (0 = no clip)")
        check_zero_point("together-oscar", self.zero_point)
        check(
            self.codebook in ("uniform", "lloyd_max"),
            f"together-oscar.codebook must be 'uniform' or 'lloyd_max', got {self.codebook!r}",
        )
        check(self.sink_tokens >= 0, "together-oscar.sink_tokens must be >= 0")
        check(self.residual_length >= 0, "together-oscar.residual_length must be >= 0 (0 = no window)")
        check(self.flush in ("ring8", "block"), f"together-oscar.flush must be 'ring8' or 'block', got {self.flush!r}")
        check(
            self.rotation in ("calibrated", "hadamard"),
            f"together-oscar.rotation must be 'calibrated' or 'hadamard', got {self.rotation!r}",
        )
        check(
            self.granularity in ("layer", "kv_head"),
            f"together-oscar.granularity must be 'layer' or 'kv_head', got {self.granularity!r}",
        )
        check(
            self.calibration in SOURCES,
            f"together-oscar.calibration must be one of {', '.join(SOURCES)}, got {self.calibration!r}",
        )
        check(
            self.calibration_sha256 == digest(self.calibration),
            f"together-oscar.calibration_sha256 {self.calibration_sha256!r} is not the digest of "
            f"{self.calibration!r} ({digest(self.calibration)}): the text changed",
        )

    @property
    def bits(self) -> float:
        return 2.0

    def exact_chunk(self, position):
        # Tokens quantize one by one (per-token rows), so only flushes matter. With sinks the window's start depends on
        # the prompt's length, and a ring flushes 8 steps after the previous one: a step at a time sees it as decoding.
        if self.flush == "block" and self.sink_tokens == 0:
            return block_flush_chunk(position, self.residual_length)
        return 1

    def make_layer(self, ctx):
        return TogetherOSCARLayer(self, ctx)

    def cannot_run(self, model) -> str | None:
        if self.rotation == "calibrated" and getattr(model.config, "is_encoder_decoder", False):
            return "together-oscar calibrates through a decoder-only forward of text; this model is an encoder-decoder"
        return None

    def prepare(self, model, tokenizer, shared: dict) -> None:
        """The calibrated rotations of every layer (shared["rotations"]); nothing to do for rotation="hadamard"."""
        if self.rotation != "calibrated":
            return
        if tokenizer is None:
            raise ValueError(
                "together-oscar calibrates its rotation on text: pass tokenizer= to make_cache "
                "(or use rotation=hadamard)"
            )
        shared["rotations"] = calibrated_rotations(model, tokenizer, self)


# -- the quantizer ------------------------------------------------------------------------------------------------
def clip_rows(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """x [..., d] clamped to +-tau per row, tau = sort(|x|)[min(int(ratio d), d - 1)]; ratio 0: x unchanged."""
    if ratio <= 0:
        return x
    d = x.shape[-1]
    tau = x.abs().kthvalue(min(int(ratio * d), d - 1) + 1, dim=-1, keepdim=True).values
    return torch.minimum(torch.maximum(x, -tau), tau)


def quantize_rows(
    x: torch.Tensor,
    clip: float,
    group: int,
    zero_point: str = "float",
    lloyd_max: bool = False,
    scale_dtype: torch.dtype = torch.float32,
) -> QTensor:
    """Rotated rows x [B, H, T, d] -> a QTensor (axis -1: groups of `group` channels per token) of 2-bit codes,
    clipped and quantized as the module docstring says (`lloyd_max`: one group per row)."""
    x = clip_rows(x.float(), clip)
    b, h, t, d = x.shape
    if lloyd_max:
        group = d
        mean = x.mean(-1, keepdim=True)
        std = torch.sqrt((x - mean).pow(2).mean(-1, keepdim=True) + 1e-8)
        u = (x - mean) / std
        codes = (u >= -LM_T).to(torch.uint8) + (u >= 0) + (u >= LM_T)
        scale = (2 * LM_C / 3) * LM_RATIO * std
        zero = mean - 1.5 * scale
    else:
        xg = x.view(b, h, t, d // group, group)
        lo, hi = xg.amin(-1, keepdim=True), xg.amax(-1, keepdim=True)
        scale = (hi - lo).clamp_min(1e-8) / 3
        z = -lo / scale
        if zero_point == "integer":
            z = torch.round(z)
        codes = torch.floor(xg / scale + z + 0.5).clamp_(0, 3).to(torch.uint8).view(b, h, t, d)
        scale, zero = scale.squeeze(-1), (-z * scale).squeeze(-1)
    return QTensor(pack_codes(codes, 2, -1), scale.to(scale_dtype), zero.to(scale_dtype), 2, group, -1)


class TogetherOSCARLayer(QuantLayer):
    """State: k_sink/v_sink (the prompt's first tokens, exact), k_q/v_q (rotated rows, packed), k_res/v_res (the
    window, exact). Stored in that order, so the dense path is their concatenation."""

    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        self.k_sink: torch.Tensor | None = None
        self.v_sink: torch.Tensor | None = None
        self.k_q: QTensor | None = None
        self.v_q: QTensor | None = None
        self.k_res: torch.Tensor | None = None
        self.v_res: torch.Tensor | None = None
        self._rk: torch.Tensor | None = None  # [1 or H, d, d] float32
        self._rv: torch.Tensor | None = None

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        d = self.ctx.head_dim
        self._group = self.config.group_size or d
        if d % self._group:
            raise ValueError(f"together-oscar.group_size {self._group} does not divide head_dim {d}")
        if self.config.rotation == "hadamard":
            self._rk = self._rv = hadamard(d, device=self.device)[None]
            return
        rotations = self.ctx.shared.get("rotations")
        if rotations is None:
            raise ValueError(
                "together-oscar: its calibrated rotation comes with the model: make_cache(method, model, tokenizer=...)"
            )
        self._rk = rotations["k"][self.ctx.layer_idx].to(self.device)
        self._rv = rotations["v"][self.ctx.layer_idx].to(self.device)

    def _sinks(self) -> int:
        return 0 if self.k_sink is None else self.k_sink.shape[-2]

    def _append(self, k, v):
        c = self.config
        prompt = k.shape[-2] > 1 and not self.ctx.state.decode_chunks
        if prompt and self.seen == self._sinks():  # only sinks stored so far: the prompt's first tokens become sinks
            n = max(0, min(c.sink_tokens - self._sinks(), k.shape[-2]))
            if n:
                self.k_sink, self.v_sink = (
                    cat_tokens(self.k_sink, k[..., :n, :]),
                    cat_tokens(self.v_sink, v[..., :n, :]),
                )
                k, v = k[..., n:, :], v[..., n:, :]
        if not k.shape[-2]:
            return
        block = self._window_blocks(k, v, c.residual_length) if c.flush == "block" else self._ring(k, v, prompt)
        if block is not None:
            self._store(*block, prompt)

    def _ring(self, k, v, prompt: bool):
        """Append to the window and take out, oldest first, what leaves it: on a prompt all but the newest R tokens,
        when decoding whole runs of RING once it holds R + RING or more. Returns (k, v) to quantize, or None."""
        self.k_res, self.v_res = cat_tokens(self.k_res, k), cat_tokens(self.v_res, v)
        over = max(0, self.k_res.shape[-2] - self.config.residual_length)
        full = over if prompt else over // RING * RING
        if not full:
            return None
        block = self.k_res[..., :full, :], self.v_res[..., :full, :]
        self.k_res, self.v_res = own(self.k_res[..., full:, :]), own(self.v_res[..., full:, :])
        return block

    def _store(self, k, v, prompt: bool) -> None:
        c = self.config
        lloyd_max = c.codebook == "lloyd_max" and prompt and self._group == self.ctx.head_dim
        dtype = SCALE_DTYPES[c.scale_dtype]
        kq = quantize_rows(k.float() @ self._rk, c.clip_k, self._group, c.zero_point, lloyd_max, dtype)
        vq = quantize_rows(v.float() @ self._rv, c.clip_v, self._group, c.zero_point, lloyd_max, dtype)
        self.k_q, self.v_q = cat_optional(self.k_q, kq), cat_optional(self.v_q, vq)

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The quantized tokens back in the model's basis, float32 [B, H, Tq, D]: rows_hat R^T."""
        return self.k_q.dequantize() @ self._rk.mT, self.v_q.dequantize() @ self._rv.mT

    def _dense(self):
        parts_k, parts_v = [], []
        if self.k_sink is not None:
            parts_k.append(self.k_sink)
            parts_v.append(self.v_sink)
        if self.k_q is not None:
            k, v = self._memo("kv", (self.k_q, self.v_q), self.dequantized)
            parts_k.append(self.out_dtype(k))
            parts_v.append(self.out_dtype(v))
        if self.k_res is not None:
            parts_k.append(self.k_res)
            parts_v.append(self.v_res)
        return torch.cat(parts_k, -2), torch.cat(parts_v, -2)

    def _stored(self):
        return {
            "codes": [self.k_q, self.v_q],
            "outliers": [self.k_sink, self.v_sink],
            "residual": [self.k_res, self.v_res],
        }


# -- the calibration ------------------------------------------------------------------------------------------------
_RECORDING: list["Moments"] = []  # the calibration in progress (the capture attention function feeds it)


class Moments:
    """What the fit needs of each layer's post-RoPE Q, K, V over the calibration tokens: per KV head the sum of
    Q_h^T Q_h (float64, its GQA group's query heads stacked), the number of query rows per head, and K and V."""

    def __init__(self):
        self.qq: dict[int, torch.Tensor] = {}
        self.rows: dict[int, int] = {}
        self.keys: dict[int, list[torch.Tensor]] = {}
        self.values: dict[int, list[torch.Tensor]] = {}

    def add(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """query [1, Hq, T, d], key and value [1, H, T, d], as transformers hands them to attention (one sequence)."""
        h, t, d = key.shape[1:]
        q = query[0].double().reshape(h, -1, d)  # query head i reads KV head i // g: head h's group, its rows stacked
        qq = (q.mT @ q).cpu()
        self.qq[layer] = self.qq[layer] + qq if layer in self.qq else qq
        self.rows[layer] = self.rows.get(layer, 0) + q.shape[1]
        self.keys.setdefault(layer, []).append(key[0].float().cpu())
        self.values.setdefault(layer, []).append(value[0].float().cpu())

    def targets(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(C [H, d, d], S [H, d, d]) float64: the key and value targets of each KV head (module docstring)."""
        c = self.qq[layer] / self.rows[layer]
        k = torch.cat(self.keys[layer], 1).double()
        v = torch.cat(self.values[layer], 1).double()
        w = torch.einsum("htd,hde,hte->ht", k, c, k)
        s = torch.einsum("ht,htd,hte->hde", w, v, v) / w.sum(-1).clamp_min(1e-12)[:, None, None]
        return c, s


def bit_reversal(d: int) -> torch.Tensor:
    """[d] long: i with its log2(d) bits reversed."""
    bits = d.bit_length() - 1
    return torch.tensor([int(format(i, f"0{bits}b")[::-1], 2) if bits else 0 for i in range(d)])


def rotation_of(target: torch.Tensor) -> torch.Tensor:
    """R = U H P of a target [d, d] (module docstring), float64: U its eigenvectors (symmetrized, float64 eigh, each
    eigenvector's largest entry made positive), P the eigenvalue-ordered bit-reversal permutation."""
    d = target.shape[-1]
    evals, u = torch.linalg.eigh((target + target.mT).double().cpu() / 2)
    u = u * torch.sign(u.gather(0, u.abs().argmax(0, keepdim=True)))
    perm = torch.empty(d, dtype=torch.long)
    perm[bit_reversal(d)] = torch.argsort(evals, descending=True)
    return (u @ hadamard(d, dtype=torch.float64))[:, perm]


def _capture_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA that first hands the post-RoPE Q, K, V to the calibration in progress."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if _RECORDING:
        _RECORDING[-1].add(module.layer_idx, query, key, value)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def capture(model, tokenizer, texts: tuple[str, ...]) -> Moments:
    """Moments of every text layer over `texts`, one forward each (no cache), the text backbone's attention switched
    to the capture function for the duration."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CAPTURE, _capture_attention)
    AttentionMaskInterface.register(CAPTURE, sdpa_mask)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    before = config._attn_implementation_internal
    lm = model.get_decoder() if hasattr(model, "get_decoder") else model
    device = next(model.parameters()).device
    moments = Moments()
    _RECORDING.append(moments)
    config._attn_implementation_internal = CAPTURE
    try:
        with torch.inference_mode(False), torch.no_grad():
            for text in texts:
                lm(input_ids=tokenizer(text, return_tensors="pt").input_ids.to(device), use_cache=False)
    finally:
        config._attn_implementation_internal = before
        _RECORDING.remove(moments)
    return moments


def calibrated_rotations(model, tokenizer, config: TogetherOSCARConfig) -> dict[str, dict[int, torch.Tensor]]:
    """{"k": {layer index: R_K}, "v": {layer index: R_V}}, each float32 [1 or H, d, d] on the CPU, fitted once per
    model, text and granularity (kept in the model's `_oscar_calibration`)."""
    key = ("together-oscar", config.calibration_sha256, config.granularity)
    stash = model.__dict__.setdefault("_oscar_calibration", {})
    if key not in stash:
        moments = capture(model, tokenizer, passages(config.calibration))
        out: dict[str, dict[int, torch.Tensor]] = {"k": {}, "v": {}}
        for layer in sorted(moments.qq):
            for name, target in zip(("k", "v"), moments.targets(layer)):
                if config.granularity == "layer":
                    target = target.mean(0, keepdim=True)
                out[name][layer] = torch.stack([rotation_of(t) for t in target]).float()
        stash[key] = out
    return stash[key]
