"""`oscar-eval diagnose`: where OScaR's Hadamard rotation hurts 2-bit keys, per layer and KV head, from the model's own
post-RoPE queries and keys on one prompt.

Runs the prompt once (no cache quantization) with the text backbone's attention function wrapped so that it records
each layer's queries and keys as the attention receives them (after RoPE and any q/k norm; the keys are what the
cache stores), then measures per KV head (quant.diagnose): the k_proj bias norm, the keys' channel ranges over
32-token groups, rho (the logit-error variance of per-channel 2-bit keys with the rotation over that without),
the share of query energy on the quieter half of the key channels, and each method's attention KL against exact
attention (keys quantized by the method's own cache layer; values exact). Prints one row per layer (the worst head by
rho named; `--per-head`: one row per head), and writes the table, a JSON with every number and a PNG (rho and the
attention KL per layer) into --out.

    oscar-eval diagnose --model qwen2.5-0.5b                  # the license texts the ppl task reads, 2,048 tokens
    oscar-eval diagnose --model gemma-3-270m --per-head
    oscar-eval diagnose --model smollm2-135m --input notes.txt --tokens 1024 --methods kivi,oscar,bf16
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.models import check_weights
from harness.models import load as load_adapter
from harness.tni import plain_log_ticks
from quant import diagnose as dq
from quant.cache import text_config
from quant.methods import expand_presets, get_method

DEFAULT_METHODS = "kivi,oscar,oscar-scaling-only,oscar-rotation-only"
CAPTURE = "diagnose_capture"  # the registered name of the recording attention function


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="registry name (oscar-eval list), e.g. qwen2.5-0.5b")
    p.add_argument(
        "--input",
        default=None,
        help="a text file (default: the license texts the ppl task reads, /usr/share/common-licenses)",
    )
    p.add_argument("--tokens", type=int, default=2048, help="tokens of the input read, from its start (default 2048)")
    p.add_argument(
        "--methods",
        default=DEFAULT_METHODS,
        help=f"presets whose stored keys are measured, comma-separated (default {DEFAULT_METHODS}; bf16 gives KL 0)",
    )
    p.add_argument("--per-head", action="store_true", help="print one row per KV head, not per layer")
    p.add_argument("--out", default=None, help="output folder (default results/diagnose/<model>/)")
    p.add_argument("--model-path", default=None, help="local weights directory (else MODEL_PATH or the HF cache)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: the model's)")


# ------------------------------------------------------------------------------------------------------ capture
@dataclass
class LayerCapture:
    """One attention layer's inputs on the prompt (batch row 0): queries [Hq, S, D] and keys [Hkv, S, D] after RoPE,
    in the model's dtype; the scaling, sliding window and soft cap it attends with; its k_proj bias [Hkv, D] or None.
    values / output ([Hkv, S, D], [S, Hq, D]): only when captured with keep_outputs (tests)."""

    layer: int
    query: torch.Tensor
    key: torch.Tensor
    scaling: float
    sliding_window: int | None
    softcap: float | None
    k_bias: torch.Tensor | None
    value: torch.Tensor | None = None
    output: torch.Tensor | None = None


def k_bias(module, num_kv_heads: int, head_dim: int) -> torch.Tensor | None:
    """The module's k_proj bias as [Hkv, D] (None without one)."""
    bias = getattr(getattr(module, "k_proj", None), "bias", None)
    return None if bias is None else bias.detach().float().reshape(num_kv_heads, head_dim).cpu()


@contextlib.contextmanager
def recording_attention(model, keep_outputs: bool = False):
    """Within: the text backbone attends through a wrapper of its own attention function (the same mask function)
    that records every layer's call into the yielded dict {layer_idx: LayerCapture}."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from quant.prepare import _switch_attention

    base_name = text_config(model)._attn_implementation
    base = AttentionInterface._global_mapping[base_name] if base_name != "eager" else None
    seen: dict[int, LayerCapture] = {}

    def attention(module, query, key, value, attention_mask, **kwargs):
        if base is None:  # eager: the model's own function, which transformers does not register
            fn = importlib.import_module(type(module).__module__).eager_attention_forward
        else:
            fn = base
        out = fn(module, query, key, value, attention_mask, **kwargs)
        scaling = kwargs.get("scaling")
        seen[module.layer_idx] = LayerCapture(
            layer=module.layer_idx,
            query=query[0].detach().clone(),
            key=key[0].detach().clone(),
            scaling=float(scaling if scaling is not None else getattr(module, "scaling", query.shape[-1] ** -0.5)),
            sliding_window=kwargs.get("sliding_window", getattr(module, "sliding_window", None)) or None,
            softcap=kwargs.get("softcap", getattr(module, "attn_logit_softcapping", None)) or None,
            k_bias=k_bias(module, key.shape[1], key.shape[-1]),
            value=value[0].detach().clone() if keep_outputs else None,
            output=out[0][0].detach().clone() if keep_outputs else None,
        )
        return out

    name = f"{CAPTURE}_{base_name}"
    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, AttentionMaskInterface._global_mapping[base_name])
    before = _switch_attention(model, name)
    try:
        yield seen
    finally:
        for config, implementation in reversed(before):  # as quant.prepare.PreparedModel.undo restores them
            config._attn_implementation_internal = implementation


def capture(model, input_ids: torch.Tensor, keep_outputs: bool = False) -> list[LayerCapture]:
    """One forward of input_ids [1, S] (no cache): every attention layer's LayerCapture, in layer order."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("diagnose reads a decoder-only model's prompt attention; this model is an encoder-decoder")
    device = next(model.parameters()).device
    with recording_attention(model, keep_outputs) as seen, torch.inference_mode():
        model(input_ids=input_ids.to(device), use_cache=False)
    if not seen:
        raise ValueError(
            "no attention layer was recorded: the model's attention does not go through transformers' "
            "attention functions"
        )
    return [seen[i] for i in sorted(seen)]


# ------------------------------------------------------------------------------------------------------ measure
def measure_layer(cap: LayerCapture, methods: list[str], group_size: int = dq.GROUP, num_layers: int = 1) -> dict:
    """Every number of one layer: per KV head (bias, key channel statistics, rho, quiet share, each method's KL) and
    the layer's aggregates (rho pooled over heads, the worst head, KL averaged over query heads)."""
    q, k = cap.query.float(), cap.key.float()
    hkv, rep = k.shape[0], q.shape[0] // k.shape[0]
    gq = dq.grouped_queries(q, hkv)
    rot_term, plain_term = dq.rho_terms(gq, k, group_size)
    quiet = dq.quiet_share(gq, k, group_size)
    stats = dq.key_channel_stats(k, group_size)
    k_hats = {m: dq.stored_keys(m, cap.key[None], group_size, cap.layer, num_layers)[0] for m in methods}
    kl = dq.attention_kl(q, k, k_hats, cap.scaling, cap.sliding_window, cap.softcap)
    bias = cap.k_bias.norm(dim=-1).double() if cap.k_bias is not None else torch.zeros(hkv, dtype=torch.float64)
    heads = []
    for h in range(hkv):
        own = slice(h * rep, (h + 1) * rep)
        heads.append(
            {
                "kv_head": h,
                "query_heads": list(range(h * rep, (h + 1) * rep)),
                "bias_norm": bias[h].item(),
                "key_norm_rms": stats["norm_rms"][h].item(),
                "abs_max": stats["abs_max"][h].item(),
                "abs_max_channel": int(stats["abs_max_channel"][h]),
                "pair_max": stats["pair_max"][h].item(),
                "pair_max_index": int(stats["pair_max_index"][h]),
                "range_max": stats["range_max"][h].item(),
                "range_max_channel": int(stats["range_max_channel"][h]),
                "range_median": stats["range_median"][h].item(),
                "rot_range_max": stats["rot_range_max"][h].item(),
                "rot_range_median": stats["rot_range_median"][h].item(),
                "rho": (rot_term[h] / plain_term[h]).item(),
                "rho_rotated_term": rot_term[h].item(),
                "rho_plain_term": plain_term[h].item(),
                "quiet_share": quiet[h].item(),
                "kl": {m: kl[m][own].mean().item() for m in methods},
                "kl_per_query_head": {m: kl[m][own].tolist() for m in methods},
            }
        )
    worst = max(heads, key=lambda x: x["rho"])
    return {
        "layer": cap.layer,
        "attention": f"sliding {cap.sliding_window}" if cap.sliding_window else "full",
        "scaling": cap.scaling,
        "kv_heads": hkv,
        "query_heads": q.shape[0],
        "head_dim": k.shape[-1],
        "bias_norm": bias.max().item(),
        "abs_max": max(x["abs_max"] for x in heads),
        "range_max": max(x["range_max"] for x in heads),
        "range_median": torch.tensor([x["range_median"] for x in heads]).median().item(),
        "rho": (rot_term.sum() / plain_term.sum()).item(),
        "worst_head": worst["kv_head"],
        "worst_head_rho": worst["rho"],
        "quiet_share": sum(x["quiet_share"] for x in heads) / hkv,
        "kl": {m: kl[m].mean().item() for m in methods},
        "heads": heads,
    }


def ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def spearman(a, b) -> float:
    """Spearman's rank correlation of two sequences (no ties expected: measured floats)."""
    ra = torch.tensor(a, dtype=torch.float64).argsort().argsort().double()
    rb = torch.tensor(b, dtype=torch.float64).argsort().argsort().double()
    return torch.corrcoef(torch.stack([ra, rb]))[0, 1].item()


def measure(captures: list[LayerCapture], methods: list[str], group_size: int = dq.GROUP) -> dict:
    """Every layer's numbers (measure_layer) and their summary (summarize)."""
    num_layers = max(c.layer for c in captures) + 1
    layers = [measure_layer(c, methods, group_size, num_layers) for c in captures]
    return {"group_size": group_size, "layers": layers, "summary": summarize(layers, methods)}


def summarize(layers: list[dict], methods: list[str]) -> dict:
    """rho's range and the worst layer by rho, the layers with rho > 1, the mean KL per method over layers and the
    share of each method's summed KL that the worst layer carries. With kivi and oscar-rotation-only (the same
    quantizer without and with the rotation, what rho predicts the ratio of): each layer's KL(oscar-rotation-only) /
    KL(kivi) (set on the layers as kl_rotation_over_kivi) and Spearman's correlation of rho with that ratio, over
    layers and over KV heads."""
    worst = max(layers, key=lambda x: x["rho"])
    summary = {
        "rho_min": min(x["rho"] for x in layers),
        "rho_max": worst["rho"],
        "worst_layer": worst["layer"],
        "layers_rho_above_1": [x["layer"] for x in layers if x["rho"] > 1],
        "kl_mean": {m: sum(x["kl"][m] for x in layers) / len(layers) for m in methods},
        "worst_layer_kl_share": {m: ratio(worst["kl"][m], sum(x["kl"][m] for x in layers)) for m in methods},
    }
    if {"kivi", "oscar-rotation-only"} <= set(methods):
        for x in layers:
            x["kl_rotation_over_kivi"] = ratio(x["kl"]["oscar-rotation-only"], x["kl"]["kivi"])
        for key, units in (("layers", layers), ("heads", [h for x in layers for h in x["heads"]])):
            pairs = [(u["rho"], ratio(u["kl"]["oscar-rotation-only"], u["kl"]["kivi"])) for u in units]
            pairs = [p for p in pairs if p[1] is not None]
            summary[f"spearman_rho_vs_kl_ratio_{key}"] = spearman(*zip(*pairs)) if len(pairs) > 2 else None
    return summary


# ------------------------------------------------------------------------------------------------------ report
def table(result: dict, per_head: bool = False) -> str:
    """The console table: one row per layer (heads aggregated, the worst head by rho named) or per KV head."""
    methods = list(result["methods"])
    cols = ["layer", "attn", "bias", "|k|max", "rng max", "rng med", "rho", "worst head", "quiet"]
    cols += [f"KL {m}" for m in methods]
    rot = "kl_rotation_over_kivi" in result["layers"][0]
    if rot:
        cols.append("rot/kivi")
    rows = []
    for x in result["layers"]:
        units = x["heads"] if per_head else [x]
        for u in units:
            row = [
                f"{x['layer']}.{u['kv_head']}" if per_head else str(x["layer"]),
                x["attention"].replace("sliding ", "sw"),
                f"{u['bias_norm']:.1f}",
                f"{u['abs_max']:.1f}",
                f"{u['range_max']:.2f}",
                f"{u['range_median']:.3f}",
                f"{u['rho']:.2f}",
                "-" if per_head else f"h{u['worst_head']} {u['worst_head_rho']:.2f}",
                f"{u['quiet_share']:.3f}",
            ]
            row += [f"{u['kl'][m]:.2e}" for m in methods]
            if rot:
                value = ratio(u["kl"]["oscar-rotation-only"], u["kl"]["kivi"])
                row.append("-" if value is None else f"{value:.2f}")
            rows.append(row)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    s = result["summary"]
    lines.append(
        f"rho {s['rho_min']:.2f}..{s['rho_max']:.2f} (worst layer {s['worst_layer']}; layers with rho > 1: "
        f"{', '.join(map(str, s['layers_rho_above_1'])) or 'none'}); mean KL over layers: "
        + ", ".join(f"{m} {v:.2e}" for m, v in s["kl_mean"].items())
    )
    share = s["worst_layer_kl_share"]
    tail = f"layer {s['worst_layer']} carries " + ", ".join(
        f"{100 * v:.0f}% of {m}'s" for m, v in share.items() if v is not None
    )
    tail += " KL summed over layers"
    spear = [(s.get(f"spearman_rho_vs_kl_ratio_{k}"), k) for k in ("layers", "heads")]
    if any(v is not None for v, _ in spear):
        tail += "; Spearman correlation of rho with KL(oscar-rotation-only) / KL(kivi): " + ", ".join(
            f"{v:.2f} over {k}" for v, k in spear if v is not None
        )
    lines.append(tail)
    return "\n".join(lines)


def draw(result: dict, path: Path) -> None:
    """Two panels over the layers, log scale: rho (pooled over heads; the worst head; 1 dashed), and each method's
    attention KL. Full-attention layers of a model with sliding-window layers are shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    layers = result["layers"]
    x = [entry["layer"] for entry in layers]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True)
    top.plot(x, [entry["rho"] for entry in layers], "o-", label="rho, heads pooled")
    top.plot(x, [entry["worst_head_rho"] for entry in layers], "x", color="tab:red", label="rho, worst head")
    top.axhline(1.0, color="#444", linestyle="--", linewidth=1, label="rho = 1 (rotation neutral)")
    top.set(yscale="log", ylabel="rho = logit-error variance\nrotated / plain", title="rho per layer")
    for m in result["methods"]:
        kl = [entry["kl"][m] if entry["kl"][m] > 0 else float("nan") for entry in layers]
        bottom.plot(x, kl, "o-", markersize=4, label=m)
    bottom.set(
        yscale="log",
        xlabel="layer",
        ylabel="attention KL (nats per query)",
        title="attention KL vs exact attention (keys quantized, values exact)",
    )
    if any(entry["attention"] != "full" for entry in layers):
        for entry in layers:
            if entry["attention"] == "full":
                for ax in (top, bottom):
                    ax.axvspan(entry["layer"] - 0.4, entry["layer"] + 0.4, color="#ddd", zorder=0)
        top.plot([], [], color="#ddd", linewidth=8, label="full-attention layer")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        plain_log_ticks(ax)
    fig.suptitle(f"{result['model']} on {result['input']} ({result['tokens']} tokens)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------ command
def prompt_text(path: str | None) -> tuple[str, str]:
    """(text, label): the file's text, or the ppl task's license stream (tasks.ppl)."""
    if path:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"--input {path} does not exist")
        return p.read_text(encoding="utf-8", errors="replace"), p.stem
    from tasks.ppl import TASK

    return TASK.stream(TASK.sources(None)), "licenses"


def tokenize(tokenizer, text: str, tokens: int) -> torch.Tensor:
    """The first `tokens` tokens of the text as the model's tokenizer reads it (its own leading special tokens, e.g.
    Gemma's <bos>): [1, n]."""
    ids = tokenizer(text[: tokens * 12], add_special_tokens=True)["input_ids"][:tokens]
    if len(ids) < dq.GROUP:
        raise ValueError(f"the input holds {len(ids)} tokens: diagnose needs at least {dq.GROUP} (one key group)")
    return torch.tensor([ids])


def check_methods(text: str) -> list[str]:
    """The presets of --methods, each tried on random keys before any weights load: a KeyError names the presets for
    an unknown one, a ValueError a method whose layer needs its model (RotateKV: the model's RoPE)."""
    names = expand_presets(text)
    if not names:
        raise ValueError("--methods names no preset")
    probe = torch.randn(1, 1, dq.GROUP, 64)
    for name in names:
        dq.stored_keys(name, probe)
    return names


def run(model, input_ids: torch.Tensor, methods: list[str], name: str, label: str, out: Path | None) -> dict:
    """Capture, measure, and (out given) write <out>/<label>.json, .png and .txt; returns the result."""
    result = {
        "model": name,
        "input": label,
        "tokens": int(input_ids.shape[1]),
        "methods": {m: get_method(m).to_dict() for m in methods},
        "keys_only": "each method quantizes the keys (its cache layer, window R = 32: the last S mod 32 tokens "
        "stay exact); values are exact, so the KL is the keys' alone",
    }
    result |= measure(capture(model, input_ids), methods)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{label}.json").write_text(json.dumps(result, indent=1))
        draw(result, out / f"{label}.png")
    return result


def main(args: argparse.Namespace) -> int:
    try:
        return diagnose(args)
    except (KeyError, ValueError, RuntimeError, OSError) as err:  # bad names, missing weights or input (as eval)
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"oscar-eval diagnose: error: {message}", file=sys.stderr)
        return 2


def diagnose(args: argparse.Namespace) -> int:
    methods = check_methods(args.methods)
    if args.tokens < dq.GROUP:
        raise ValueError(f"--tokens must be at least {dq.GROUP}, got {args.tokens}")
    # the cheap checks before the weights load: the model's name and weights (the harness' messages), the input
    check_weights(args.model, args.model_path, "real")
    text, label = prompt_text(args.input)
    adapter = load_adapter(args.model, model_path=args.model_path, device=args.device, dtype=args.dtype)
    tokenizer = getattr(adapter, "tokenizer", None) or adapter.processor.tokenizer
    out = Path(args.out or f"results/diagnose/{args.model}")
    result = run(adapter.model, tokenize(tokenizer, text, args.tokens), methods, args.model, label, out)
    (out / f"{label}.txt").write_text(table(result) + "\n\n" + table(result, per_head=True) + "\n")
    print(f"{args.model} on {label}: {result['tokens']} tokens; keys only (values exact), 2-bit, groups of 32")
    print(table(result, args.per_head))
    print(f"wrote {out / label}.json, .png and .txt")
    return 0
