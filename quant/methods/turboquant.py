"""TurboQuant+ (arXiv 2504.19874 without the QJL stage), 2.5 bits, for K and V alike.

Per vector x (one token of one head): store n = ||x|| (fp32), rotate u = x / n with a fixed random
orthogonal matrix (y = u @ Pi^T), quantize each rotated coordinate to the nearest Lloyd-Max centroid
of N(0, 1/d). The first d/4 rotated coordinates ("outliers") get 3 bits, the rest 2 bits: 2.25 code
bits, 2.5 bits per element at d=128 with the fp32 norm.
Norm correction: the reconstructed rotated vector is re-normalized to unit norm before scaling.
No full-precision window: the prompt and every generated token are quantized when stored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from quant.methods.base import MethodConfig, QuantLayer, check
from quant.primitives import (
    hadamard,
    lloyd_max_normal,
    nearest_centroid,
    pack_bitstream,
    random_orthogonal,
    unpack_bitstream,
)


@dataclass(frozen=True)
class TurboQuantConfig(MethodConfig):
    method = "turboquant"
    main_bits: int = 2
    outlier_bits: int = 3
    outlier_fraction: float = 0.25  # 32 of 128 coordinates
    rotation: str = "orthogonal"  # "orthogonal" (QR of a seeded Gaussian) | "randomized_hadamard"
    seed: int = 0
    norm_correction: bool = True

    def validate(self):
        check(self.main_bits in (1, 2, 3, 4) and self.outlier_bits in (1, 2, 3, 4), "turboquant bits must be 1..4")
        check(0.0 <= self.outlier_fraction < 1.0, f"turboquant.outlier_fraction must be in [0, 1), got {self.outlier_fraction}")
        check(self.rotation in ("orthogonal", "randomized_hadamard"), f"turboquant.rotation must be orthogonal|randomized_hadamard, got {self.rotation!r}")

    @property
    def bits(self):
        """Code bits per element (the fp32 norm adds 32 / head_dim)."""
        return self.outlier_fraction * self.outlier_bits + (1 - self.outlier_fraction) * self.main_bits

    def make_layer(self, ctx):
        return TurboQuantLayer(self, ctx)


def rotation_matrix(config: TurboQuantConfig, d: int, layer_idx: int, device) -> torch.Tensor:
    """The fixed rotation Pi (d x d, orthogonal), seeded per layer."""
    seed = config.seed * 100003 + layer_idx
    if config.rotation == "orthogonal":
        return random_orthogonal(d, seed, device=device)
    signs = torch.randint(0, 2, (d,), generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return (hadamard(d) * signs.float().unsqueeze(0)).to(device)  # H @ diag(signs)


class TurboQuantLayer(QuantLayer):
    def __init__(self, config, ctx):
        super().__init__(config, ctx)
        d = ctx.head_dim
        self.n_out = int(round(config.outlier_fraction * d))
        self._cb_out = torch.tensor(lloyd_max_normal(config.outlier_bits)) / math.sqrt(d)
        self._cb_main = torch.tensor(lloyd_max_normal(config.main_bits)) / math.sqrt(d)
        for name in ("k_out", "k_main", "k_norm", "v_out", "v_main", "v_norm"):
            setattr(self, name, None)

    def lazy_initialization(self, key_states, value_states):
        super().lazy_initialization(key_states, value_states)
        self._pi = rotation_matrix(self.config, self.ctx.head_dim, self.ctx.layer_idx, self.device)
        self._cb_out, self._cb_main = self._cb_out.to(self.device), self._cb_main.to(self.device)

    def encode(self, x: torch.Tensor):
        """x [B, H, T, D] -> (outlier words, main words, norms)."""
        xf = x.float()
        norms = xf.norm(dim=-1)
        u = xf / torch.where(norms > 0, norms, torch.ones_like(norms)).unsqueeze(-1)
        y = u @ self._pi.T
        c = self.config
        out = pack_bitstream(nearest_centroid(y[..., : self.n_out], self._cb_out), c.outlier_bits)
        main = pack_bitstream(nearest_centroid(y[..., self.n_out :], self._cb_main), c.main_bits)
        return out, main, norms

    def decode(self, out: torch.Tensor, main: torch.Tensor, norms: torch.Tensor) -> torch.Tensor:
        c, d = self.config, self.ctx.head_dim
        y = torch.cat(
            [
                self._cb_out[unpack_bitstream(out, c.outlier_bits, self.n_out).long()],
                self._cb_main[unpack_bitstream(main, c.main_bits, d - self.n_out).long()],
            ],
            -1,
        )
        if c.norm_correction:
            y = y / y.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return (y @ self._pi) * norms.unsqueeze(-1)

    def _append(self, k, v):
        for prefix, x in (("k", k), ("v", v)):
            parts = self.encode(x)
            for name, new in zip(("_out", "_main", "_norm"), parts):
                old = getattr(self, prefix + name)
                setattr(self, prefix + name, new if old is None else torch.cat([old, new], 2))

    def _dense(self):
        k = self.decode(self.k_out, self.k_main, self.k_norm)
        v = self.decode(self.v_out, self.v_main, self.v_norm)
        return self.out_dtype(k), self.out_dtype(v)

    def _stored(self):
        return {"codes": [self.k_out, self.k_main, self.v_out, self.v_main], "norms": [self.k_norm, self.v_norm]}
