"""Where a Hadamard rotation of the keys helps or hurts 2-bit per-channel key quantization, from a model's own queries
and keys (harness/diagnose.py captures them; `oscar-eval diagnose`).

Shapes, per layer: queries q [Hq, S, D] and keys k [Hkv, S, D] after RoPE (batch row 0), query head h reading KV head
h // (Hq / Hkv) as transformers' repeat_kv maps them. "Grouped" queries of KV head g: all its query heads' rows
stacked, [Hq / Hkv * S, D]. Key groups: the floor(S / G) whole G-token groups (G = 32, the presets' key group); a
shorter tail is left out of the statistics (the cache keeps it exact).

Why rho. Per-channel B-bit keys have, in channel i of group g, a step s_gi = range_g(K)_i / (2^B - 1) and a rounding
error of variance about s_gi^2 / 12, independent across channels. The logit q . k_hat then errs by sum_i q_i e_i, of
variance proportional to sum_i q_i^2 range_g(K)_i^2. With the rotation (OScaR: K H and q H, scores unchanged) the
same holds in the rotated basis. So

    rho = sum_{q, g} sum_j (q H)_j^2 range_g(K H)_j^2 / sum_{q, g} sum_i q_i^2 range_g(K)_i^2

summed over every real query of the head's group and every key group, is the ratio of the logit-error variance with
the rotation to that without (the sums factorize over queries and groups: causality is not weighed in). rho > 1: the
rotation hurts. It does when the queries' energy sits in channels whose keys barely move within a group (quiet
channels, stored almost exactly per channel) while a few loud channels carry the keys' range: the Hadamard spreads
the loud channels' range over every channel, the quiet ones the queries read included. `quiet_share` measures that
side: the share of the query energy in the half of the channels with the smallest key range.

Attention KL: per query head, KL(softmax(s) || softmax(s_hat)) with s = scaling * q K^T and s_hat from the method's
dequantized keys (`stored_keys`: through the method's own cache layer), under the layer's causal (and sliding-window)
mask, in nats, the mean over queries. Keys only: the values are not quantized here.
"""

from __future__ import annotations

import dataclasses

import torch

from quant.methods import get_method
from quant.methods.base import LayerContext, MethodConfig
from quant.primitives import hadamard

GROUP = 32  # tokens per key group: the presets' (kivi, oscar and its ablations)


def whole_groups(k: torch.Tensor, group_size: int = GROUP) -> torch.Tensor:
    """k [H, S, D] -> its floor(S / G) whole groups [H, n, G, D] (float64). ValueError when S < G."""
    h, s, d = k.shape
    n = s // group_size
    if n == 0:
        raise ValueError(f"{s} tokens hold no key group of {group_size}: give at least {group_size} tokens")
    return k[:, : n * group_size].double().reshape(h, n, group_size, d)


def group_ranges(k: torch.Tensor, group_size: int = GROUP) -> torch.Tensor:
    """max - min of each channel over each whole G-token group: float64 [H, n_groups, D] from k [H, S, D]."""
    g = whole_groups(k, group_size)
    return g.amax(dim=2) - g.amin(dim=2)


def grouped_queries(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """q [Hq, S, D] -> [Hkv, Hq / Hkv * S, D]: each KV head's query heads stacked (repeat_kv's map)."""
    hq, s, d = q.shape
    if hq % num_kv_heads:
        raise ValueError(f"{hq} query heads cannot share {num_kv_heads} KV heads evenly")
    return q.reshape(num_kv_heads, hq // num_kv_heads * s, d)


def rho_terms(q: torch.Tensor, k: torch.Tensor, group_size: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """(with rotation, without) = (sum_j [sum_q (q H)_j^2] [sum_g range_g(K H)_j^2],
    sum_i [sum_q q_i^2] [sum_g range_g(K)_i^2]) per KV head, float64 [Hkv] each, from grouped queries q [Hkv, N, D]
    and keys k [Hkv, S, D]: the double sums over queries and whole key groups, factorized. H is OScaR's head_dim
    Hadamard (quant.primitives.hadamard). rho = first / second."""
    rot = hadamard(k.shape[-1], device=k.device, dtype=torch.float64)
    q, k = q.double(), k.double()
    q_energy, q_energy_rot = q.pow(2).sum(1), (q @ rot).pow(2).sum(1)  # [Hkv, D]
    r2, r2_rot = group_ranges(k, group_size).pow(2).sum(1), group_ranges(k @ rot, group_size).pow(2).sum(1)
    return (q_energy_rot * r2_rot).sum(-1), (q_energy * r2).sum(-1)


def quiet_share(q: torch.Tensor, k: torch.Tensor, group_size: int = GROUP) -> torch.Tensor:
    """Share of the grouped queries' energy (q [Hkv, N, D]) on the half of the channels whose keys (k [Hkv, S, D])
    move least: channels sorted by the RMS over groups of their group range. float64 [Hkv]."""
    loudness = group_ranges(k, group_size).pow(2).mean(1)  # [Hkv, D]
    quiet = loudness.argsort(dim=-1)[:, : k.shape[-1] // 2]
    energy = q.double().pow(2).sum(1)
    return energy.gather(1, quiet).sum(-1) / energy.sum(-1)


def key_channel_stats(k: torch.Tensor, group_size: int = GROUP) -> dict[str, torch.Tensor]:
    """Per KV head (k [Hkv, S, D]), float64 [Hkv] each (indices as long [Hkv]):
    range_max (and range_max_channel, the channel where it lies) / range_median: the largest and the median group
    range over channels x groups, before the rotation and after it (rot_range_max, rot_range_median); abs_max: the
    largest |k| and abs_max_channel where it lies; pair_max: the largest magnitude sqrt(k_i^2 + k_{i+D/2}^2) of a RoPE
    pair (transformers' rotate_half pairs channel i with i + D/2) and pair_max_index its i; norm_rms: the RMS over
    tokens of ||k_t||."""
    rot = hadamard(k.shape[-1], device=k.device, dtype=torch.float64)
    kd = k.double()
    ranges = group_ranges(k, group_size)  # [Hkv, n, D]
    r, r_rot = ranges.flatten(1), group_ranges(kd @ rot, group_size).flatten(1)
    per_channel = kd.abs().amax(dim=1)  # [Hkv, D]
    half = k.shape[-1] // 2
    pairs = (kd[..., :half].pow(2) + kd[..., half:].pow(2)).sqrt().amax(dim=1)  # [Hkv, D/2]
    return {
        "range_max": r.amax(-1),
        "range_max_channel": ranges.amax(1).argmax(-1),
        "range_median": r.median(-1).values,
        "rot_range_max": r_rot.amax(-1),
        "rot_range_median": r_rot.median(-1).values,
        "abs_max": per_channel.amax(-1),
        "abs_max_channel": per_channel.argmax(-1),
        "pair_max": pairs.amax(-1),
        "pair_max_index": pairs.argmax(-1),
        "norm_rms": kd.pow(2).sum(-1).mean(-1).sqrt(),
    }


def stored_keys(
    method: str | MethodConfig,
    keys: torch.Tensor,
    group_size: int = GROUP,
    layer_idx: int = 0,
    num_layers: int = 1,
) -> torch.Tensor:
    """keys [B, Hkv, S, D] as `method`'s cache layer stores them (its `make_layer`, the reference path), dequantized,
    float32 [B, Hkv, S, D]. The method's window R is set to G so that every whole group is quantized and only the
    last S mod G tokens stay exact (a method with no window field quantizes as it does). Values: zeros (keys only).
    layer_idx / num_layers: where the layer sits (OTT keeps no outlier tokens in the first two layers)."""
    method = get_method(method)
    if "residual_length" in {f.name for f in dataclasses.fields(method)}:
        method = get_method(method, residual_length=group_size)
    layer = method.make_layer(LayerContext(layer_idx, num_layers, keys.shape[1], keys.shape[-1]))
    try:
        layer.update(keys, torch.zeros_like(keys))
        out = layer._dense()[0]
    except Exception as exc:  # a method that needs its model (hooks, calibration) cannot run on keys alone
        raise ValueError(
            f"{method.name or method.method}: its cache layer cannot store keys without its model "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    return out.float()


def attention_mask(length: int, sliding_window: int | None = None, device=None) -> torch.Tensor:
    """bool [S, S], True where query i sees key j: j <= i, and i - j < sliding_window when the layer has one
    (transformers' sliding-window mask)."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    seen = j <= i
    return seen & (i - j < sliding_window) if sliding_window else seen


def log_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    scaling: float,
    mask: torch.Tensor,
    softcap: float | None = None,
) -> torch.Tensor:
    """log softmax(scaling * q k^T) over the keys each query sees (mask [S, S]), float64; -inf where masked.
    q [..., S, D], k [..., S, D] (one head or matching heads). softcap: Gemma-2's tanh cap on the scores."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scaling
    if softcap:
        s = torch.tanh(s / softcap) * softcap
    return torch.log_softmax(s.masked_fill(~mask, float("-inf")), dim=-1)


def attention_kl(
    q: torch.Tensor,
    k: torch.Tensor,
    k_hats: dict[str, torch.Tensor],
    scaling: float,
    sliding_window: int | None = None,
    softcap: float | None = None,
    block: int = 256,
) -> dict[str, torch.Tensor]:
    """Per query head, the mean over queries of KL(softmax(s) || softmax(s_hat)) in nats: s from the exact keys,
    s_hat from each method's keys. q [Hq, S, D]; k and every k_hat [Hkv, S, D]. Returns {method: float64 [Hq]}.
    Computed in blocks of `block` queries over the keys they can see (the same numbers, in less memory and time)."""
    hq, length = q.shape[0], q.shape[1]
    rep = hq // k.shape[0]
    qd, kd = q.double(), k.double()
    hats = {name: x.double() for name, x in k_hats.items()}
    sums = {name: torch.zeros(hq, dtype=torch.float64, device=q.device) for name in k_hats}
    for a in range(0, length, block):
        b = min(a + block, length)
        lo = max(0, a - sliding_window + 1) if sliding_window else 0  # keys before lo are hidden from every query
        mask = attention_mask(length, sliding_window, q.device)[a:b, lo:b]
        for h in range(hq):
            exact = log_probs(qd[h, a:b], kd[h // rep, lo:b], scaling, mask, softcap)
            p = exact.exp()
            for name, k_hat in hats.items():
                approx = log_probs(qd[h, a:b], k_hat[h // rep, lo:b], scaling, mask, softcap)
                sums[name][h] += (p * (exact - approx)).masked_fill(~mask, 0.0).sum()
    return {name: (x / length).cpu() for name, x in sums.items()}
