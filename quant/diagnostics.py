"""Token-norm imbalance (TNI) diagnostics per modality, and OScaR's reconstruction error per modality
with contiguous or modality-aligned quantization groups.

Shapes: keys/values of one layer are [B, H, S, D] (post-RoPE, as the cache receives them); modality
tags are LongTensor [S] with the codes of harness.models.base (0 text, 1 image, 2 video, 3 audio).
Only batch row 0 is analysed: the diagnostics look at one sequence at a time.

Reconstruction follows OScaR's key path (quant.methods.oscar): K_rot = K @ H_d, n_t = ||K_rot[:, t]||
over all heads and channels, K_unit = K_rot / n_t, asymmetric B-bit quantization per channel over a
group of tokens, K_hat = (K_unit_hat * n_t) @ H_d. The group layout is the only thing that differs
between "contiguous" (G consecutive tokens, what the cache stores) and "aligned" (groups restart at
every modality boundary, so a run of one modality is cut into G-token groups and a shorter tail).
Values follow OScaR's value path (V_rot = V @ H_d, B-bit per token over groups of G channels), or KIVI's
without the rotation. Per-token views: relative errors per token, and the tokens whose norm stands far
from their modality's median (outliers such as the first token).
"""

from __future__ import annotations

import itertools
import math

import torch

from quant.packed import quantize
from quant.primitives import asym_dequantize, asym_quantize, hadamard

MODALITY_NAMES = ("text", "image", "video", "audio")


def token_norms(x: torch.Tensor) -> torch.Tensor:
    """n_t = ||x[0, :, t, :]||_2 over all heads and channels: float32 [S] from x [B, H, S, D]."""
    return x[0].float().pow(2).sum(dim=(0, 2)).sqrt()


def _summary(values: torch.Tensor) -> dict[str, float]:
    v = values.double()
    mean = v.mean().item()
    std = v.std(unbiased=False).item()
    return {
        "n": int(v.numel()),
        "mean": mean,
        "std": std,
        "cv": std / mean if mean else 0.0,
        "min": v.min().item(),
        "median": v.median().item(),
        "max": v.max().item(),
    }


def segments(tags: torch.Tensor) -> list[tuple[int, int, int]]:
    """Maximal runs of one modality: [(start, end, code)] covering 0..S (end exclusive)."""
    t = tags.tolist()
    runs, start = [], 0
    for i in range(1, len(t) + 1):
        if i == len(t) or t[i] != t[start]:
            runs.append((start, i, t[start]))
            start = i
    return runs


def norm_stats(norms: torch.Tensor, tags: torch.Tensor, group_size: int = 32) -> dict:
    """TNI statistics of one layer's token norms [S] with modality tags [S].

    per_modality: n, mean, std, cv = std/mean, min, median, max of n_t for each modality present.
    imbalance: largest / smallest per-modality mean norm (1 = balanced).
    boundary_jump / within_jump: mean |log n_t - log n_{t-1}| across modality boundaries / inside runs.
    group_ratio: mean over contiguous G-token groups of max n / min n inside the group (what a
    per-channel quantizer without token scaling has to span), split into groups that straddle a
    boundary and groups of one modality.
    """
    norms, tags = norms.float().cpu(), tags.long().cpu()
    per = {MODALITY_NAMES[c]: _summary(norms[tags == c]) for c in sorted(set(tags.tolist()))}
    means = [s["mean"] for s in per.values()]
    logs = norms.clamp_min(1e-12).log()
    jumps = (logs[1:] - logs[:-1]).abs()
    cross = tags[1:] != tags[:-1]
    out = {
        "per_modality": per,
        "imbalance": max(means) / min(means) if min(means) > 0 else math.inf,
        "boundaries": int(cross.sum()),
        "boundary_jump": jumps[cross].mean().item() if cross.any() else None,
        "within_jump": jumps[~cross].mean().item() if (~cross).any() else None,
    }
    mixed, pure = [], []
    for s in range(0, len(norms) - group_size + 1, group_size):
        g, gt = norms[s : s + group_size], tags[s : s + group_size]
        (mixed if (gt != gt[0]).any() else pure).append((g.max() / g.min().clamp_min(1e-12)).item())
    out["group_ratio"] = {
        "straddling": sum(mixed) / len(mixed) if mixed else None,
        "single_modality": sum(pure) / len(pure) if pure else None,
        "straddling_groups": len(mixed),
        "groups": len(mixed) + len(pure),
    }
    return out


def contiguous_groups(length: int, group_size: int) -> list[tuple[int, int]]:
    """[(start, end)] of consecutive G-token groups (the last one may be shorter)."""
    return [(s, min(s + group_size, length)) for s in range(0, length, group_size)]


def aligned_groups(tags: torch.Tensor, group_size: int) -> list[tuple[int, int]]:
    """G-token groups that never straddle a modality boundary: each run is cut on its own."""
    out = []
    for start, end, _ in segments(tags):
        out += [(s, min(s + group_size, end)) for s in range(start, end, group_size)]
    return out


def shifted_groups(groups: list[tuple[int, int]], length: int, shift: int) -> list[tuple[int, int]]:
    """The control layout: the cut points of `groups` moved by `shift` tokens, so the number and sizes
    of groups stay (nearly) the same but the cuts no longer sit on modality boundaries. Separates
    "aligned" from "merely more, smaller groups"."""
    cuts = sorted({(c + shift) % length for _, c in groups[:-1]} - {0})  # cyclic: no cut is lost
    edges = [0, *cuts, length]
    return list(itertools.pairwise(edges))


def quantize_token_groups(
    x: torch.Tensor, groups: list[tuple[int, int]], bits: int, zero_point: str = "float"
) -> torch.Tensor:
    """Per-channel asymmetric quantize-dequantize of x [B, H, S, D] over the given token groups,
    float32 [B, H, S, D] (the arithmetic of quant.primitives, fp16 scale and zero; `zero_point` as there)."""
    out = torch.empty_like(x, dtype=torch.float32)
    for start, end in groups:
        codes, scale, zero = asym_quantize(x[:, :, start:end], bits, dim=-2, zero_point=zero_point)
        out[:, :, start:end] = asym_dequantize(codes, scale, zero)
    return out


def reconstruct_keys(
    k: torch.Tensor, groups, bits: int = 2, rotation: bool = True, token_norm: bool = True, zero_point: str = "float"
):
    """K_hat of OScaR's key path (see the module docstring), float32 [B, H, S, D]. rotation=False and
    token_norm=False give KIVI's per-channel keys with the same groups; zero_point as the method's config."""
    k = k.float()
    rot = hadamard(k.shape[-1], device=k.device) if rotation else None
    k_rot = k @ rot if rot is not None else k
    n = k_rot.pow(2).sum(dim=(1, 3), keepdim=True).sqrt() if token_norm else torch.ones_like(k_rot[:, :1, :, :1])
    n = torch.where(n > 0, n, torch.ones_like(n))
    k_hat = quantize_token_groups(k_rot / n, groups, bits, zero_point) * n
    return k_hat @ rot if rot is not None else k_hat


def reconstruct_values(
    v: torch.Tensor, bits: int = 2, group_size: int = 32, rotation: bool = True, zero_point: str = "float"
) -> torch.Tensor:
    """V_hat of OScaR's value path, float32 [B, H, S, D]: V_rot = V @ H_d, asymmetric B-bit quantization per token in
    groups of G channels (quant.packed.quantize, axis -1), V_hat = V_rot_hat @ H_d. rotation=False gives KIVI's
    per-token values. Every token is quantized (the cache's full-precision window is left out of the picture)."""
    v = v.float()
    rot = hadamard(v.shape[-1], device=v.device) if rotation else None
    v_rot = v @ rot if rot is not None else v
    v_hat = quantize(v_rot, bits, group_size, axis=-1, zero_point=zero_point).dequantize()
    return v_hat @ rot if rot is not None else v_hat


def token_errors(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """Relative error of each token of row 0: ||x_t - x_hat_t|| / ||x_t|| over heads and channels, float32 [S]
    (0 where x_t is 0). x, x_hat: [B, H, S, D]."""
    err = (x[0].float() - x_hat[0].float()).pow(2).sum(dim=(0, 2)).sqrt()
    ref = x[0].float().pow(2).sum(dim=(0, 2)).sqrt()
    return torch.where(ref > 0, err / ref.clamp_min(1e-30), torch.zeros_like(err)).cpu()


def outlier_tokens(norms: torch.Tensor, tags: torch.Tensor, factor: float = 2.0, limit: int = 8) -> list[dict]:
    """Tokens whose norm is at least `factor` times above or below the median of their modality, farthest first, at
    most `limit`: [{"position", "modality", "norm", "ratio": norm / median}]. Per-modality means hide them (the
    first token of a text, where attention sinks form, can have a third of the others' value norm)."""
    norms, tags = norms.float().cpu(), tags.long().cpu()
    medians = {c: norms[tags == c].median().item() for c in set(tags.tolist())}
    ratio = norms / torch.tensor([medians[c] or 1.0 for c in tags.tolist()])
    far = ((ratio >= factor) | (ratio <= 1 / factor)).nonzero().flatten().tolist()
    far.sort(key=lambda t: -abs(math.log(max(ratio[t].item(), 1e-30))))
    return [
        {"position": t, "modality": MODALITY_NAMES[int(tags[t])], "norm": norms[t].item(), "ratio": ratio[t].item()}
        for t in far[:limit]
    ]


def per_modality_error(x: torch.Tensor, x_hat: torch.Tensor, tags: torch.Tensor) -> dict[str, float]:
    """Relative squared error sum ||x_t - x_hat_t||^2 / sum ||x_t||^2 over row 0, overall ("all")
    and per modality present. x, x_hat: [B, H, S, D]; tags: [S]."""
    err = (x[0].float() - x_hat[0].float()).pow(2).sum(dim=(0, 2)).cpu()
    ref = x[0].float().pow(2).sum(dim=(0, 2)).cpu()
    tags = tags.cpu()
    out = {"all": (err.sum() / ref.sum()).item()}
    for c in sorted(set(tags.tolist())):
        out[MODALITY_NAMES[c]] = (err[tags == c].sum() / ref[tags == c].sum()).item()
    return out


def scale_bits(groups: list[tuple[int, int]], length: int) -> float:
    """Storage overhead of fp16 scale + zero per channel per group, in bits per key element."""
    return 32.0 * len(groups) / length


def alignment_study(
    keys: list[torch.Tensor],
    tags: torch.Tensor,
    group_size: int = 32,
    bits: int = 2,
    methods: dict[str, dict] | None = None,
) -> dict:
    """Does cutting key groups at modality boundaries lower the reconstruction error?

    keys: one [B, H, S, D] tensor per layer; tags [S]. For each method variant (default: OScaR and
    KIVI-style keys) and each layout returns the per-modality relative error averaged over layers,
    plus the scale overhead in bits per key element of each layout. Layouts: contiguous (what the cache
    stores), aligned (cut at every modality boundary), shifted (the aligned cuts moved by G/2: as many
    groups as aligned, not on boundaries). Alignment helps only if aligned < shifted as well as < contiguous.
    """
    methods = methods or {
        "oscar": {"rotation": True, "token_norm": True},
        "kivi_keys": {"rotation": False, "token_norm": False},
    }
    length = tags.numel()
    aligned = aligned_groups(tags, group_size)
    layouts = {
        "contiguous": contiguous_groups(length, group_size),
        "aligned": aligned,
        "shifted": shifted_groups(aligned, length, group_size // 2),
    }
    result = {
        "group_size": group_size,
        "bits": bits,
        "tokens": length,
        "layers": len(keys),
        "boundaries": len(segments(tags)) - 1,
        "scale_bits": {name: scale_bits(g, length) for name, g in layouts.items()},
        "error": {},
    }
    for mname, opts in methods.items():
        result["error"][mname] = {}
        for lname, groups in layouts.items():
            per_layer = [per_modality_error(k, reconstruct_keys(k, groups, bits, **opts), tags) for k in keys]
            result["error"][mname][lname] = {m: sum(p[m] for p in per_layer) / len(per_layer) for m in per_layer[0]}
    return result
