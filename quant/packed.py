"""Named containers for packed KV codes (never positional tuples).

Layout conventions (every tensor has batch first, then KV heads, then tokens):
- QTensor(axis=-2): groups of `group` consecutive TOKENS per channel (KIVI/OScaR keys).
  codes int32 [B, H, T / (32 // bits), D]: word w of channel d holds tokens w*16 .. w*16+15 (2 bits),
  token i of the word at bits [2i, 2i+2). scale, zero fp16 [B, H, T / group, D].
- QTensor(axis=-1): groups of `group` consecutive CHANNELS per token (values, QuaRot/RotateKV keys).
  codes int32 [B, H, T, D / (32 // bits)]: word w holds channels w*16 .. w*16+15 (2 bits).
  scale, zero fp16 [B, H, T, D / group].
Dequantization: x_hat = code * scale + zero, broadcast over the group. `zero` is the group's minimum (float zero
point) or -scale * z for an integer zero point z (quant.primitives.asym_quantize): one formula either way.
Code order (`order`, INT2 in groups of 32 only): "natural" is the layout above. "frag" (what the CUDA
decode kernel reads, written by the CUDA pack) keeps every tensor's shape and every 32-token block in
place but permutes the block's 32 x D codes (and, for values, stores the block's scales/zeros as
[D / 32][32] instead of [32][D / 32]) so that lane L of a warp reads its tensor-core fragments with
16-byte loads: see `frag_slots` and csrc/include/oscar_layout.cuh (the same map, on the device).
`unpacked()` / `dequantize()` / `natural_scales()` undo it, so QTensor semantics do not change.
"tl" (what the Triton decode reads) likewise keeps every tensor's shape and every 128-token block in place and
permutes inside each block, so that each thread of the Triton kernel's wgmma tiles finds its codes and scales
contiguous (keys token-major, values channel-major, tile rows permuted so that a warp's rows are one group): see
`tl_maps`. It needs INT2 in groups of 32 and a multiple of 128 tokens.
Variable token groups (OScaR's modality-aligned option): `starts` int64 [n_groups] holds each group's
first token; scale/zero then have n_groups rows on the token axis. Codes are laid out as above.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from quant.primitives import (
    MIN_SCALE,
    asym_dequantize,
    asym_quantize,
    integer_zero,
    pack_codes,
    tensor_cache,
    unpack_codes,
)


@dataclass
class QTensor:
    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    bits: int
    group: int
    axis: int  # -2: groups along tokens (per-channel); -1: groups along channels (per-token)
    starts: torch.Tensor | None = None  # variable token groups (axis -2 only), see module docstring
    order: str = "natural"  # "natural" | "frag" | "tl" (see module docstring)

    @property
    def num_tokens(self) -> int:
        return self.codes.shape[-2] * (32 // self.bits) if self.axis == -2 else self.codes.shape[-2]

    def nbytes(self) -> dict[str, int]:
        extra = self.starts.nbytes if self.starts is not None else 0
        return {"codes": self.codes.nbytes, "scales": self.scale.nbytes + self.zero.nbytes + extra}

    def token_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Variable groups: scale and zero repeated to one row per token, [B, H, T, D]."""
        lengths = torch.diff(self.starts, append=torch.tensor([self.num_tokens], device=self.starts.device))
        return self.scale.repeat_interleave(lengths, dim=-2), self.zero.repeat_interleave(lengths, dim=-2)

    def unpacked(self) -> torch.Tensor:
        """uint8 codes [B, H, T, D]."""
        if self.order == "frag":
            return frag_unpack(self.codes, self.axis)
        if self.order == "tl":
            return tl_unpack(self.codes, self.axis)
        return unpack_codes(self.codes, self.bits, self.axis)

    def natural_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """scale, zero in the natural layout (the frag order transposes value scales inside each block, the tl order
        permutes both kinds)."""
        if self.order == "frag" and self.axis == -1:
            return frag_scales(self.scale, inverse=True), frag_scales(self.zero, inverse=True)
        if self.order == "tl":
            return tl_scales(self.scale, self.axis, inverse=True), tl_scales(self.zero, self.axis, inverse=True)
        return self.scale, self.zero

    def to_order(self, order: str) -> "QTensor":
        """The same codes in `order` ("natural", "frag" or "tl"; "frag" and "tl" need INT2 in fixed groups of 32, "tl"
        a multiple of 128 tokens)."""
        if order == self.order:
            return self
        if order not in ("natural", "frag", "tl"):
            raise ValueError(f"order must be 'natural', 'frag' or 'tl', got {order!r}")
        if order != "natural" and (self.bits != 2 or self.group != 32 or self.starts is not None):
            raise ValueError(
                f"the {order} code order needs INT2 codes in fixed groups of 32 "
                f"(got {self.bits} bits, group {self.group}, variable groups: {self.starts is not None})"
            )
        if order == "tl" and self.num_tokens % TL_BLOCK:
            raise ValueError(
                f"the tl code order lays out whole {TL_BLOCK}-token blocks, got {self.num_tokens} tokens: "
                "pad them first (pad_tokens)"
            )
        codes = self.unpacked()
        scale, zero = self.natural_scales()
        if order == "frag":
            new = frag_pack(codes, self.axis)
            if self.axis == -1:
                scale, zero = frag_scales(scale), frag_scales(zero)
        elif order == "tl":
            new = tl_pack(codes, self.axis)
            scale, zero = tl_scales(scale, self.axis), tl_scales(zero, self.axis)
        else:
            new = pack_codes(codes, self.bits, self.axis)
        # contiguous, as a kernel reads them: converting once here keeps a transposing copy of the codes out of every
        # decode call (docs/PERFORMANCE.md, The Triton decode)
        return replace(self, codes=new.contiguous(), scale=scale.contiguous(), zero=zero.contiguous(), order=order)

    def dequantize(self) -> torch.Tensor:
        """float32 [B, H, T, D]."""
        codes = self.unpacked()
        g = self.group
        if self.starts is not None:
            scale, zero = self.token_scales()
            return asym_dequantize(codes, scale, zero)
        scale, zero = self.natural_scales()
        if self.axis == -2:
            b, h, t, d = codes.shape
            x = asym_dequantize(codes.view(b, h, t // g, g, d), scale.unsqueeze(-2), zero.unsqueeze(-2))
        else:
            b, h, t, d = codes.shape
            x = asym_dequantize(codes.view(b, h, t, d // g, g), scale.unsqueeze(-1), zero.unsqueeze(-1))
        return x.reshape(b, h, t, d)

    def cat(self, other: "QTensor | None") -> "QTensor":
        """Append `other` after self along the token axis."""
        if other is None:
            return self
        if (self.starts is None) != (other.starts is None):
            raise ValueError("cannot append fixed and variable token groups to one another")
        if self.order != other.order:
            other = other.to_order(self.order)  # blocks are self-contained: converting one side is enough
        starts = None if self.starts is None else torch.cat([self.starts, other.starts + self.num_tokens])
        return replace(
            self,
            codes=torch.cat([self.codes, other.codes], -2),
            scale=torch.cat([self.scale, other.scale], -2),
            zero=torch.cat([self.zero, other.zero], -2),
            starts=starts,
        )

    def pad_tokens(self, multiple: int) -> "QTensor":
        """The tokens padded with zero codes, scales and zeros up to a multiple of `multiple` (natural order; fixed
        groups dividing `multiple`). A kernel reads the padding as tokens of value 0, so the valid length must mask
        them."""
        t = self.num_tokens
        tp = -(-t // multiple) * multiple
        if tp == t:
            return self
        if self.starts is not None or multiple % self.group or multiple % (32 // self.bits):
            raise ValueError(f"pad_tokens({multiple}) needs fixed groups dividing it, got group {self.group}")
        q = self.to_order("natural")

        def pad(x, n):
            return torch.cat([x, x.new_zeros(*x.shape[:2], n, *x.shape[3:])], 2)

        per = 32 // self.bits if self.axis == -2 else 1
        return (
            replace(
                q,
                codes=pad(q.codes, (tp - t) // per),
                scale=pad(q.scale, (tp - t) // self.group),
                zero=pad(q.zero, (tp - t) // self.group),
            )
            if self.axis == -2
            else replace(q, codes=pad(q.codes, tp - t), scale=pad(q.scale, tp - t), zero=pad(q.zero, tp - t))
        )

    def map(self, fn) -> "QTensor":
        """Apply fn to every tensor (e.g. batch reordering)."""
        batch = ("codes", "scale", "zero")  # starts has no batch dimension
        return replace(self, **{name: fn(getattr(self, name)) for name in batch})


def quantize(
    x: torch.Tensor, bits: int, group: int, axis: int, clip: float = 1.0, zero_point: str = "float"
) -> QTensor:
    """Asymmetric group quantization of x [B, H, T, D] into a packed QTensor (see module docstring);
    zero_point "float" or "integer" as quant.primitives.asym_quantize defines them."""
    b, h, t, d = x.shape
    if axis == -2:
        if t % group:
            raise ValueError(f"token-axis groups need T ({t}) to be a multiple of the group size {group}")
        codes, scale, zero = asym_quantize(
            x.reshape(b, h, t // group, group, d), bits, dim=-2, clip=clip, zero_point=zero_point
        )
        codes, scale, zero = codes.reshape(b, h, t, d), scale.squeeze(-2), zero.squeeze(-2)
    elif axis == -1:
        if d % group:
            raise ValueError(f"channel-axis groups need head_dim ({d}) to be a multiple of the group size {group}")
        codes, scale, zero = asym_quantize(
            x.reshape(b, h, t, d // group, group), bits, dim=-1, clip=clip, zero_point=zero_point
        )
        codes, scale, zero = codes.reshape(b, h, t, d), scale.squeeze(-1), zero.squeeze(-1)
    else:
        raise ValueError(f"axis must be -2 (token groups) or -1 (channel groups), got {axis}")
    return QTensor(pack_codes(codes, bits, axis), scale, zero, bits, group, axis)


def quantize_segments(x: torch.Tensor, bits: int, starts: torch.Tensor, zero_point: str = "float") -> QTensor:
    """Per-channel asym quantization of x [B, H, T, D] over token groups [starts[i], starts[i+1]).
    Same formula as `quantize` (fp16 scale/zero rounded before the codes); T a multiple of 32 // bits."""
    b, h, t, d = x.shape
    lengths = torch.diff(starts, append=torch.tensor([t], device=starts.device))
    seg = torch.repeat_interleave(torch.arange(len(starts), device=x.device), lengths)
    idx = seg.view(1, 1, t, 1).expand(b, h, t, d)
    xf = x.float()
    init = xf.new_zeros(b, h, len(starts), d)
    hi = init.scatter_reduce(2, idx, xf, "amax", include_self=False)
    lo = init.scatter_reduce(2, idx, xf, "amin", include_self=False)
    levels = 2**bits - 1
    scale = ((hi - lo) / levels).half().clamp_min(MIN_SCALE)
    zero = lo.half() if zero_point == "float" else integer_zero(lo, scale).half()
    codes = torch.round((xf - zero.float().gather(2, idx)) / scale.float().gather(2, idx))
    codes = codes.clamp_(0, levels).to(torch.uint8)
    return QTensor(pack_codes(codes, bits, -2), scale, zero, bits, 0, -2, starts.long())


def token_norms(k_rot: torch.Tensor) -> torch.Tensor:
    """OScaR's n_t = ||K_rot[b, :, t, :]||_2 over all KV heads and channels, float32 [B, T]; n <= 0 -> 1."""
    n = k_rot.float().pow(2).sum(dim=(1, 3)).sqrt()
    return torch.where(n > 0, n, torch.ones_like(n))


def pack_reference(
    k: torch.Tensor,
    v: torch.Tensor,
    bits: int,
    group: int,
    rot: torch.Tensor | None,
    token_norm: bool = True,
    zero_point: str = "float",
    starts: torch.Tensor | None = None,
    rotate_values: bool = True,
):
    """OScaR's pack of a block of T tokens in torch (the reference the fused packs of quant.kernels are tested
    against; T a multiple of `group`). k, v: [B, H, T, D]; rot: H_d or None (no rotation).
    Returns (k_q: QTensor axis -2 of K_unit, v_q: QTensor axis -1 of V_rot, norms: float32 [B, T] or None when token
    scaling is off). `starts`: variable key groups. rotate_values=False: V is quantized as it comes."""
    k_rot = k.float() @ rot if rot is not None else k.float()
    v_rot = v.float() @ rot if rot is not None and rotate_values else v.float()
    norms = token_norms(k_rot) if token_norm else None
    k_unit = k_rot / norms[:, None, :, None] if norms is not None else k_rot
    return (
        quantize(k_unit, bits, group, axis=-2, zero_point=zero_point)
        if starts is None
        else quantize_segments(k_unit, bits, starts.to(k.device), zero_point),
        quantize(v_rot, bits, group, axis=-1, zero_point=zero_point),
        norms,
    )


def cat_optional(a: QTensor | None, b: QTensor) -> QTensor:
    return b if a is None else a.cat(b)


@dataclass
class PackedKV:
    """Everything OScaR decode attention reads for one layer (the handle a fast kernel receives).

    k: QTensor(axis=-2) of K_unit = (K @ Hd) / n_t   [B, Hkv, Tq, D], Tq a multiple of the block (128)
    v: QTensor(axis=-1) of V @ Hd                     [B, Hkv, Tq, D]; of V itself when values_rotated is False
    norms: float32 [B, Tq] token norms n_t, or None when token scaling is off (all ones)
    k_res, v_res: full-precision residual window, not rotated   [B, Hkv, Tr, D], Tr < 128 (+ new tokens)
    hadamard: the D x D rotation Hd (float32) or None when rotation is off.
    values_rotated: v holds V @ Hd, so the quantized part's output is rotated back (False: the model's v_proj and
      o_proj carry the rotation, quant/fold.py: its values arrive rotated and its o_proj expects them so).
    Attention (per query head, GQA maps it to its KV head):
      s_j = scaling * ((q @ Hd) . k_hat_j) * n_j for quantized j;  s_r = scaling * q . k_res_r
      out = softmax(s) @ [v_hat @ Hd ; v_res]    (v_hat itself when values_rotated is False)
    """

    k: QTensor | None
    v: QTensor | None
    norms: torch.Tensor | None
    k_res: torch.Tensor
    v_res: torch.Tensor
    hadamard: torch.Tensor | None
    values_rotated: bool = True

    @property
    def rotate_out(self) -> bool:
        """Whether the quantized part's attention output goes back through Hd."""
        return self.hadamard is not None and self.values_rotated

    @property
    def num_quantized(self) -> int:
        return 0 if self.k is None else self.k.num_tokens

    @property
    def seq_len(self) -> int:
        return self.num_quantized + self.k_res.shape[-2]


def write_token(q: QTensor, b: int, h: int, pos: int, x: torch.Tensor, zero_point: str = "float") -> None:
    """Quantize one token's vector x [D] into slot (b, h, pos) of q in place.

    Token-axis groups (axis -2): the token joins its group's existing scale/zero (codes clamp to the
    group's range). Channel-axis groups (axis -1): the token is its own group set, so it is requantized (with
    `zero_point`).
    """
    if q.order != "natural":
        raise ValueError("write_token needs the natural code order: convert with q.to_order('natural')")
    levels = 2**q.bits - 1
    if q.axis == -1:
        one = quantize(x.view(1, 1, 1, -1), q.bits, q.group, axis=-1, zero_point=zero_point)
        q.codes[b, h, pos] = one.codes[0, 0, 0]
        q.scale[b, h, pos], q.zero[b, h, pos] = one.scale[0, 0, 0], one.zero[0, 0, 0]
        return
    g = pos // q.group
    scale, zero = q.scale[b, h, g].float(), q.zero[b, h, g].float()
    code = torch.round((x.float() - zero) / scale).clamp_(0, levels).to(torch.int64)
    per = 32 // q.bits
    shift = (pos % per) * q.bits
    word = q.codes[b, h, pos // per].to(torch.int64) & 0xFFFFFFFF
    word = (word & ~(levels << shift)) | (code << shift)
    q.codes[b, h, pos // per] = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


# ---- the "frag" code order (see the module docstring; mirrored by csrc/include/oscar_layout.cuh) -------


def frag_token(tile: int, row: int) -> int:
    """Token (0..31) of a 32-token block held by row `row` (0..15) of 16-token tile `tile` (0, 1): chosen so
    that lane c of the value product holds tokens 8c..8c+7 and each half2 pair is two adjacent tokens."""
    return 8 * ((row & 7) >> 1) + 4 * tile + 2 * (row >> 3) + (row & 1)


def frag_channel(kstep: int, k: int) -> int:
    """Channel of k-index `k` (0..15) of key k-step `kstep`: lane c's channels are the 16-byte chunks
    4 i + c of a scale row (one conflict-free 16-byte shared load per i)."""
    c, hi, h = (k & 7) >> 1, k >> 3, k & 1
    return 8 * (4 * (kstep >> 1) + c) + 4 * (kstep & 1) + 2 * hi + h


@tensor_cache(maxsize=8)
def frag_slots(axis: int, d: int) -> torch.Tensor:
    """int64 [32 * d]: for code slot 16 W + i of one 32-token block (word W of the block's 2 d words,
    2-bit field i), the natural index token * d + channel it holds.

    Word W = 4 (32 j + L) + e belongs to lane L = 4 g + c as its word w = 4 j + e (16-byte chunk j);
    field i = 8 h + s is half h (0 low, 1 high: the two codes of one fp16 pair) of pair slot s. The lane's
    pair f = 8 w + s is, for keys, A-fragment register r of tile mt at k-step ks with f = (4 mt + r) KS + ks
    (KS = d / 16): row g + 8 (r & 1) of the tile, k = 2 c + 8 (r >> 1) + h; for values, register r of channel
    tile mv at token step kt with f = (4 kt + r) MV + mv (MV = d / 16): channel 16 mv + g + 8 (r & 1),
    token row 2 c + 8 (r >> 1) + h of tile kt. These are mma.m16n8k16 A fragments (S^T = K Q^T, O^T = V^T P^T)."""
    if d % 16:
        raise ValueError(f"the frag order needs head_dim divisible by 16, got {d}")
    per_lane = d // 16
    idx = torch.empty(32 * d, dtype=torch.int64)
    for word in range(2 * d):
        j, lane, e = word // 128, (word // 4) % 32, word % 4
        g, c, w = lane // 4, lane % 4, 4 * j + e
        for i in range(16):
            h, s = i // 8, i % 8
            f = 8 * w + s
            if axis == -2:
                ks, q = f % per_lane, f // per_lane
                r, mt = q % 4, q // 4
                t, ch = frag_token(mt, g + 8 * (r & 1)), frag_channel(ks, 2 * c + 8 * (r >> 1) + h)
            else:
                mv, q = f % per_lane, f // per_lane
                r, kt = q % 4, q // 4
                t, ch = frag_token(kt, 2 * c + 8 * (r >> 1) + h), 16 * mv + g + 8 * (r & 1)
            idx[16 * word + i] = t * d + ch
    return idx


def frag_pack(codes: torch.Tensor, axis: int) -> torch.Tensor:
    """uint8 codes [B, H, T, D] (T % 32 == 0) -> int32 words in the frag order, shaped as pack_codes'."""
    b, h, t, d = codes.shape
    if t % 32:
        raise ValueError(f"the frag order packs whole 32-token blocks, got {t} tokens")
    flat = codes.reshape(b * h, t // 32, 32 * d)[..., frag_slots(axis, d).to(codes.device)]
    words = pack_codes(flat, 2, -1)  # slot 16 W + i -> word W, bits 2 i
    return words.reshape((b, h, t // 16, d) if axis == -2 else (b, h, t, d // 16))


def frag_unpack(words: torch.Tensor, axis: int) -> torch.Tensor:
    """Inverse of frag_pack: int32 words -> uint8 codes [B, H, T, D]."""
    b, h = words.shape[:2]
    d = words.shape[-1] if axis == -2 else words.shape[-1] * 16
    blocks = words.shape[2] // 2 if axis == -2 else words.shape[2] // 32
    slots = unpack_codes(words.reshape(b * h, blocks, 2 * d), 2, -1)  # [BH, blocks, 32 d]
    flat = torch.empty_like(slots)
    flat[..., frag_slots(axis, d).to(words.device)] = slots
    return flat.reshape(b, h, blocks * 32, d)


def frag_scales(x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Value scales/zeros [B, H, T, G] <-> the frag order's per-block [G][32] (a transpose per block)."""
    b, h, t, g = x.shape
    if inverse:
        return x.reshape(b, h, t // 32, g, 32).transpose(-1, -2).reshape(b, h, t, g)
    return x.reshape(b, h, t // 32, 32, g).transpose(-1, -2).reshape(b, h, t, g)


# ---- the "tl" code order (see the module docstring; what quant/kernels/triton_decode.py reads) -----------------------

TL_BLOCK = 128


def tl_row(r: torch.Tensor, mt: int) -> torch.Tensor:
    """Position of row r of a 64 mt-row wgmma tile spread over 4 warps (warp w holds rows 16w..16w+15 of each
    64-row tile): chosen so that the rows one warp holds are consecutive positions; with mt = 2, a warp's 32 rows are
    one 32-token (or 32-channel) quantization group."""
    return 16 * mt * ((r // 16) % 4) + 16 * (r // 64) + r % 16


@tensor_cache(maxsize=8)
def tl_maps(d: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index maps of the tl order (CPU int64), per 128-token block, with tau = tl_row(., 2) (score tile row -> token):
    - key words: a token's D/16 words, word c (D/64) + h (c < 4) holding at bits 2 jj + 16 half the channel
      2c + half + 8 jj + 64 h (lane c's 16 channels of a wgmma A-fragment row, each fp16 pair two adjacent channels):
      kslot [D/16, 16], word slot 8 half + jj -> channel;
    - key scales/zeros [T/32, D]: position (D/4) c + 2 kk + half holds channel 2c + half + 8 kk: kpos [D] -> channel;
    - value words, per channel of the block: word 2c + hh holds at bits 2 jj + 16 half the token
      tau(64 hh + 8 jj + 2c + half): vslot [8, 16] -> token;
    - value scales/zeros, per block [D/32][128]: position 32 c + 2 kk + half holds token tau(2c + half + 8 kk):
      vpos [128] -> token."""
    tau = tl_row(torch.arange(TL_BLOCK), 2)
    c = torch.arange(4)[:, None, None, None]
    h = torch.arange(d // 64)[None, :, None, None]
    half = torch.arange(2)[None, None, :, None]
    jj = torch.arange(8)[None, None, None, :]
    kslot = (2 * c + half + 8 * jj + 64 * h).reshape(d // 16, 16)
    p = torch.arange(d)
    kpos = 2 * (p // (d // 4)) + p % 2 + 8 * ((p % (d // 4)) // 2)
    hh = torch.arange(2)[None, :, None, None]
    vslot = tau[(64 * hh + 8 * jj + 2 * c + half).reshape(8, 16)]
    p = torch.arange(TL_BLOCK)
    vpos = tau[2 * (p // 32) + p % 2 + 8 * ((p % 32) // 2)]
    return kslot, kpos, vslot, vpos


def tl_pack(codes: torch.Tensor, axis: int) -> torch.Tensor:
    """uint8 codes [B, H, T, D] (T % 128 == 0) -> int32 words in the tl order, shaped as pack_codes'."""
    b, h, t, d = codes.shape
    if t % TL_BLOCK or d % 64:
        raise ValueError(f"the tl order packs whole {TL_BLOCK}-token blocks of head_dim 64 or 128, got {t} x {d}")
    kslot, _, vslot, _ = (m.to(codes.device) for m in tl_maps(d))
    if axis == -2:
        words = pack_codes(codes[..., kslot.reshape(-1)].reshape(b, h, t, d // 16, 16), 2, -1)
        return words.reshape(b, h, t // 16, d)
    g = codes.reshape(b, h, t // TL_BLOCK, TL_BLOCK, d)[:, :, :, vslot.reshape(-1)]
    g = g.reshape(b, h, t // TL_BLOCK, 8, 16, d).permute(0, 1, 2, 5, 3, 4)  # [B, H, blocks, D, word, slot]
    return pack_codes(g, 2, -1).reshape(b, h, t, d // 16)


def tl_unpack(words: torch.Tensor, axis: int) -> torch.Tensor:
    """Inverse of tl_pack: int32 words -> uint8 codes [B, H, T, D]."""
    b, h = words.shape[:2]
    d = words.shape[-1] if axis == -2 else words.shape[-1] * 16
    t = words.shape[2] * 16 if axis == -2 else words.shape[2]
    kslot, _, vslot, _ = (m.to(words.device) for m in tl_maps(d))
    if axis == -2:
        slots = unpack_codes(words.reshape(b, h, t, d // 16, 1), 2, -1).reshape(b, h, t, d)
        out = torch.empty_like(slots)
        out[..., kslot.reshape(-1)] = slots
        return out
    slots = unpack_codes(words.reshape(b, h, t // TL_BLOCK, d, 8, 1), 2, -1)  # [B, H, blocks, D, word, slot]
    slots = slots.reshape(b, h, t // TL_BLOCK, d, TL_BLOCK).transpose(-1, -2)
    out = torch.empty_like(slots)
    out[:, :, :, vslot.reshape(-1)] = slots
    return out.reshape(b, h, t, d)


def tl_scales(x: torch.Tensor, axis: int, inverse: bool = False) -> torch.Tensor:
    """Scales/zeros in their natural layout (keys [B, H, T/32, D], values [B, H, T, D/32]) <-> the tl order's (same
    shapes: keys permuted along D, values per 128-token block as [D/32][128] in the vpos token order)."""
    _, kpos, _, vpos = (m.to(x.device) for m in tl_maps(x.shape[-1] if axis == -2 else x.shape[-1] * 32))
    if axis == -2:
        if not inverse:
            return x[..., kpos].contiguous()
        out = torch.empty_like(x)
        out[..., kpos] = x
        return out
    b, h, t, g = x.shape
    if not inverse:
        return x.reshape(b, h, t // TL_BLOCK, TL_BLOCK, g)[:, :, :, vpos].transpose(-1, -2).reshape(b, h, t, g)
    out = torch.empty(b, h, t // TL_BLOCK, TL_BLOCK, g, dtype=x.dtype, device=x.device)
    out[:, :, :, vpos] = x.reshape(b, h, t // TL_BLOCK, g, TL_BLOCK).transpose(-1, -2)
    return out.reshape(b, h, t, g)
