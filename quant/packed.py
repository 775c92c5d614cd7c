"""Named containers for packed KV codes (never positional tuples).

Layout conventions (every tensor has batch first, then KV heads, then tokens):
- QTensor(axis=-2): groups of `group` consecutive TOKENS per channel (KIVI/OScaR keys).
  codes int32 [B, H, T / (32 // bits), D]: word w of channel d holds tokens w*16 .. w*16+15 (2 bits),
  token i of the word at bits [2i, 2i+2). scale, zero fp16 [B, H, T / group, D].
- QTensor(axis=-1): groups of `group` consecutive CHANNELS per token (values, QuaRot/RotateKV keys).
  codes int32 [B, H, T, D / (32 // bits)]: word w holds channels w*16 .. w*16+15 (2 bits).
  scale, zero fp16 [B, H, T, D / group].
Dequantization: x_hat = code * scale + zero, broadcast over the group.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from quant.primitives import asym_dequantize, asym_quantize, pack_codes, unpack_codes


@dataclass
class QTensor:
    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    bits: int
    group: int
    axis: int  # -2: groups along tokens (per-channel); -1: groups along channels (per-token)

    @property
    def num_tokens(self) -> int:
        return self.scale.shape[-2] * (self.group if self.axis == -2 else 1)

    def nbytes(self) -> dict[str, int]:
        return {"codes": self.codes.nbytes, "scales": self.scale.nbytes + self.zero.nbytes}

    def unpacked(self) -> torch.Tensor:
        """uint8 codes [B, H, T, D]."""
        return unpack_codes(self.codes, self.bits, self.axis)

    def dequantize(self) -> torch.Tensor:
        """float32 [B, H, T, D]."""
        codes = self.unpacked()
        g = self.group
        if self.axis == -2:
            b, h, t, d = codes.shape
            x = asym_dequantize(codes.view(b, h, t // g, g, d), self.scale.unsqueeze(-2), self.zero.unsqueeze(-2))
        else:
            b, h, t, d = codes.shape
            x = asym_dequantize(codes.view(b, h, t, d // g, g), self.scale.unsqueeze(-1), self.zero.unsqueeze(-1))
        return x.reshape(b, h, t, d)

    def cat(self, other: "QTensor | None") -> "QTensor":
        """Append `other` after self along the token axis."""
        if other is None:
            return self
        return replace(
            self,
            codes=torch.cat([self.codes, other.codes], -2),
            scale=torch.cat([self.scale, other.scale], -2),
            zero=torch.cat([self.zero, other.zero], -2),
        )

    def map(self, fn) -> "QTensor":
        """Apply fn to every tensor (e.g. batch reordering)."""
        return replace(self, **{f.name: fn(getattr(self, f.name)) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)})


def quantize(x: torch.Tensor, bits: int, group: int, axis: int, clip: float = 1.0) -> QTensor:
    """Asymmetric group quantization of x [B, H, T, D] into a packed QTensor (see module docstring)."""
    b, h, t, d = x.shape
    if axis == -2:
        if t % group:
            raise ValueError(f"token-axis groups need T ({t}) to be a multiple of the group size {group}")
        codes, scale, zero = asym_quantize(x.reshape(b, h, t // group, group, d), bits, dim=-2, clip=clip)
        codes, scale, zero = codes.reshape(b, h, t, d), scale.squeeze(-2), zero.squeeze(-2)
    elif axis == -1:
        if d % group:
            raise ValueError(f"channel-axis groups need head_dim ({d}) to be a multiple of the group size {group}")
        codes, scale, zero = asym_quantize(x.reshape(b, h, t, d // group, group), bits, dim=-1, clip=clip)
        codes, scale, zero = codes.reshape(b, h, t, d), scale.squeeze(-1), zero.squeeze(-1)
    else:
        raise ValueError(f"axis must be -2 (token groups) or -1 (channel groups), got {axis}")
    return QTensor(pack_codes(codes, bits, axis), scale, zero, bits, group, axis)


def cat_optional(a: QTensor | None, b: QTensor) -> QTensor:
    return b if a is None else a.cat(b)


@dataclass
class PackedKV:
    """Everything OScaR decode attention reads for one layer (the handle a fast kernel receives).

    k: QTensor(axis=-2) of K_unit = (K @ Hd) / n_t   [B, Hkv, Tq, D], Tq a multiple of the block (128)
    v: QTensor(axis=-1) of V @ Hd                     [B, Hkv, Tq, D]
    norms: float32 [B, Tq] token norms n_t, or None when token scaling is off (all ones)
    k_res, v_res: full-precision residual window, not rotated   [B, Hkv, Tr, D], Tr < 128 (+ new tokens)
    hadamard: the D x D rotation Hd (float32) or None when rotation is off.
    Attention (per query head, GQA maps it to its KV head):
      s_j = scaling * ((q @ Hd) . k_hat_j) * n_j for quantized j;  s_r = scaling * q . k_res_r
      out = softmax(s) @ [v_hat @ Hd ; v_res]
    """

    k: QTensor | None
    v: QTensor | None
    norms: torch.Tensor | None
    k_res: torch.Tensor
    v_res: torch.Tensor
    hadamard: torch.Tensor | None

    @property
    def num_quantized(self) -> int:
        return 0 if self.k is None else self.k.num_tokens

    @property
    def seq_len(self) -> int:
        return self.num_quantized + self.k_res.shape[-2]


def write_token(q: QTensor, b: int, h: int, pos: int, x: torch.Tensor) -> None:
    """Quantize one token's vector x [D] into slot (b, h, pos) of q in place.

    Token-axis groups (axis -2): the token joins its group's existing scale/zero (codes clamp to the
    group's range). Channel-axis groups (axis -1): the token is its own group set, so it is requantized.
    """
    levels = 2**q.bits - 1
    if q.axis == -1:
        one = quantize(x.view(1, 1, 1, -1), q.bits, q.group, axis=-1)
        q.codes[b, h, pos], q.scale[b, h, pos], q.zero[b, h, pos] = one.codes[0, 0, 0], one.scale[0, 0, 0], one.zero[0, 0, 0]
        return
    g = pos // q.group
    scale, zero = q.scale[b, h, g].float(), q.zero[b, h, g].float()
    code = torch.round((x.float() - zero) / scale).clamp_(0, levels).to(torch.int64)
    per = 32 // q.bits
    shift = (pos % per) * q.bits
    word = q.codes[b, h, pos // per].to(torch.int64) & 0xFFFFFFFF
    word = (word & ~(levels << shift)) | (code << shift)
    q.codes[b, h, pos // per] = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)
