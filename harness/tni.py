"""`oscar-eval tni`: token-norm imbalance of a model's KV cache on one input, per modality, and what it costs 2-bit
KIVI and 2-bit OScaR.

Runs the prompt once through the model (default cache, no quantization), takes every layer's keys and values as the
cache receives them (post-RoPE), and
- prints per-modality norm statistics (quant.diagnostics.norm_stats) of one layer, the outlier tokens (a norm at
  least 2x from its modality's median, such as the first token, where attention sinks form) with their text and each
  method's error on them, the mean relative error per modality of KIVI and OScaR on keys and on values, the key
  imbalance of every layer, and the modality-aligned-groups study (quant.diagnostics.alignment_study);
- draws a PNG, keys left and values right: per-token norms with the outliers named; the relative error of each token
  after KIVI; the same after OScaR, on the same axis. Points are coloured by modality.

    oscar-eval tni --model smollm2-135m                      # a paragraph of English
    oscar-eval tni --model tiny-qwen3-vl --input photo.jpg
    oscar-eval tni --model smollm2-135m --input mixed.txt

A text file given to a text model may wrap spans in <image>...</image>, <video>...</video> or
<audio>...</audio>: the model reads the text inside and its positions are tagged with that modality
(a mixed sequence with real boundaries for models that have no encoders, e.g. SmolLM2).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

import quant
from harness.models import family_of
from harness.models import load as load_adapter
from harness.models.base import MODALITIES
from quant import diagnostics as diag
from tasks.contract import Prompt

AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".m4a"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
COLOURS = {"text": "tab:blue", "image": "tab:orange", "video": "tab:green", "audio": "tab:purple"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="registry name (oscar-eval list), e.g. qwen3-vl-8b or tiny-qwen3-vl")
    p.add_argument(
        "--input",
        default=None,
        help="an image, an audio file (16 kHz after resampling) or a text file "
        "(default: a sample photograph for a multimodal model, a paragraph of English for a text model)",
    )
    p.add_argument("--text", default="Describe this in detail.", help="the question put after an image/audio input")
    p.add_argument("--layer", type=int, default=None, help="layer drawn and detailed (default: the middle one)")
    p.add_argument("--group-size", type=int, default=32, help="key quantization group (tokens) for the error panels")
    p.add_argument(
        "--out", default=None, help="PNG path (default results/tni/<model>-<input>.png); JSON goes beside it"
    )
    p.add_argument("--model-path", default=None, help="local weights directory (else MODEL_PATH or the HF cache)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: the model's)")


def make_prompt(path: Path, question: str) -> tuple[Prompt, str]:
    """Image/audio file -> that medium plus `question`; anything else is read as the text prompt. Also the label."""
    if not path.is_file():
        raise FileNotFoundError(f"--input {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        from PIL import Image

        return Prompt(question, images=[Image.open(path).convert("RGB")]), path.name
    if suffix in AUDIO_SUFFIXES:
        from harness.models.common import load_audio

        return Prompt(question, audios=[load_audio(path)]), path.name
    return Prompt(path.read_text(encoding="utf-8", errors="replace")), path.name


DEFAULT_TEXT = (
    "A language model keeps the keys and values of every token it has read, so that each new token can attend to "
    "all of them. At long contexts this cache, not the weights, fills the memory of the accelerator. Quantizing it to "
    "two bits per number divides its size by about eight, at a cost: tokens whose keys or values are much larger or "
    "much smaller than their neighbours share a scale with them and lose precision. The first token of a text often "
    "behaves this way, because the model learns to park attention there when nothing else is relevant. Images and "
    "audio bring runs of tokens with norms of their own, and a group of tokens that straddles a boundary between two "
    "modalities has to span both ranges at once. Rotating each head and dividing every token by its norm before "
    "quantization evens out such differences."
)


def default_prompt(adapter, question: str) -> tuple[Prompt, str]:
    """Without --input: a photograph (matplotlib's sample of Grace Hopper) for a multimodal model, else DEFAULT_TEXT."""
    if "image" in family_of(adapter.spec.name).reads:
        import matplotlib.cbook

        return make_prompt(Path(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)), question)
    return Prompt(DEFAULT_TEXT), "default-text"


def encode_marked(tokenizer, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw text (no chat template) with <image>..</image>-style spans -> (input_ids [1, S], tags [S])."""
    names = "|".join(MODALITIES[1:])
    ids, tags = [], []
    for part in re.split(rf"(<(?:{names})>.*?</(?:{names})>)", text, flags=re.DOTALL):
        match = re.fullmatch(rf"<({names})>(.*)</\1>", part, flags=re.DOTALL)
        code, body = (MODALITIES.index(match.group(1)), match.group(2)) if match else (0, part)
        piece = tokenizer(body, add_special_tokens=False)["input_ids"] if body else []
        ids += piece
        tags += [code] * len(piece)
    if not ids:
        raise ValueError("the text input is empty")
    return torch.tensor([ids]), torch.tensor(tags)


def capture(adapter, prompt: Prompt):
    """One prefill with the default cache: (keys, values: per layer [1, H, S, D], tags [S], input_ids [S])."""
    if family_of(adapter.spec.name).reads != ("text",):  # the processor's inputs, media included
        inputs = adapter.build_inputs(prompt).to(device=adapter.device, dtype=adapter.model.dtype)
        tags, model = adapter.tags(inputs)[0], adapter.generator
    else:  # text adapters: the raw text with its marked spans
        ids, tags = encode_marked(adapter.tokenizer, prompt.text)
        inputs, model = {"input_ids": ids.to(adapter.device)}, adapter.model
    with torch.inference_mode():
        out = model(**inputs, use_cache=True)
    layers = out.past_key_values.layers
    keys = [layer.keys[:1].float().cpu() for layer in layers]
    values = [layer.values[:1].float().cpu() for layer in layers]
    return keys, values, tags.cpu().clone(), inputs["input_ids"][0].cpu()


def quantizers() -> dict[str, dict]:
    """KIVI's and OScaR's quantizers as their presets set them (quant.get_method): bits of keys and values, zero point;
    KIVI without rotation or token scaling."""
    kivi, oscar = quant.get_method("kivi"), quant.get_method("oscar")
    return {
        "KIVI": {
            "key_bits": kivi.key_bits,
            "value_bits": kivi.value_bits,
            "zero_point": kivi.zero_point,
            "rotation": False,
            "token_norm": False,
        },
        "OScaR": {
            "key_bits": oscar.bits,
            "value_bits": oscar.bits,
            "zero_point": oscar.zero_point,
            "rotation": True,
            "token_norm": True,
        },
    }


def per_token_views(k: torch.Tensor, v: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """Per-token curves [S] of one layer (k, v: [1, H, S, D]): key and value norms, and the relative error of each
    token's keys and values after KIVI and OScaR (quantizers(), quant.diagnostics). Key errors cover the full G-token
    groups only; a shorter tail (the cache keeps it in full precision) is NaN."""
    full = k.shape[-2] - k.shape[-2] % group_size
    groups = diag.contiguous_groups(full, group_size)
    tail = torch.full((k.shape[-2] - full,), float("nan"))
    out = {"key_norm": diag.token_norms(k), "value_norm": diag.token_norms(v)}
    for method, q in quantizers().items():
        k_hat = diag.reconstruct_keys(
            k[:, :, :full], groups, q["key_bits"], q["rotation"], q["token_norm"], q["zero_point"]
        )
        v_hat = diag.reconstruct_values(v, q["value_bits"], group_size, q["rotation"], q["zero_point"])
        out[f"{method} keys"] = torch.cat([diag.token_errors(k[:, :, :full], k_hat), tail])
        out[f"{method} values"] = diag.token_errors(v, v_hat)
    return out


ERRORS = [(f"{m} {kind}", m, kind) for kind in ("keys", "values") for m in ("KIVI", "OScaR")]


def draw(views: dict[str, torch.Tensor], tags: torch.Tensor, stats: dict, title: str, path: Path) -> None:
    """Keys in the left column, values in the right; rows: token norms (outliers ringed and named), KIVI's error per
    token, OScaR's error per token (the two error rows share their y axis). Every point is coloured by its modality;
    each error panel draws the modality means as dashed lines and names them in its title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    pos = torch.arange(tags.numel())
    present = [MODALITIES[c] for c in sorted(set(tags.tolist()))]
    fig, axes = plt.subplots(3, 2, figsize=(15, 9.5), sharex=True)
    for col, kind in enumerate(("keys", "values")):
        norm_ax = axes[0][col]
        norms = views["key_norm" if kind == "keys" else "value_norm"]
        scatter_by_modality(norm_ax, pos, norms, tags)
        for i, o in enumerate(stats[kind]["outliers"][:3]):  # labels stacked away from the median, never on the axis
            t, up = o["position"], 1 if o["ratio"] < 1 else -1
            norm_ax.scatter([t], [norms[t]], s=90, facecolors="none", edgecolors="black", linewidths=1.2, zorder=4)
            norm_ax.annotate(
                f"token {t} {o['text']!r}: {o['ratio']:.2f}x its {o['modality']} median",
                (t, norms[t].item()),
                textcoords="offset points",
                xytext=(14, up * (12 + 13 * i)),
                fontsize=8,
                va="center",
                bbox={"boxstyle": "round", "fc": "white", "ec": "#999"},
                arrowprops={"arrowstyle": "-", "color": "#444", "linewidth": 0.6},
            )
        norm_ax.set(yscale="log", ylabel=f"||{kind[0]}_t|| over heads x channels", title=f"{kind}: token norms")
        axes[2][col].sharey(axes[1][col])  # before drawing, so the shared limits cover both methods' points
        for row, method in ((1, "KIVI"), (2, "OScaR")):
            ax = axes[row][col]
            err = views[f"{method} {kind}"]
            scatter_by_modality(ax, pos, err, tags)
            means = stats["errors"][kind][method]
            for name in present:
                ax.axhline(means[name], color=COLOURS[name], linestyle="--", linewidth=1)
            ax.set(
                yscale="log",
                ylabel="relative error (2-bit)",
                title=f"{method} {kind}: mean error " + ", ".join(f"{n} {means[n]:.3f}" for n in present),
            )
        axes[2][col].set_xlabel("token position")
    for ax in axes.flat:
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
        plain_log_ticks(ax)
    handles = [Line2D([], [], marker="o", linestyle="", color=COLOURS[n], label=n) for n in present]
    handles += [
        Line2D([], [], linestyle="--", color="#444", label="modality mean"),
        Line2D(
            [],
            [],
            marker="o",
            linestyle="",
            markerfacecolor="none",
            markeredgecolor="black",
            label="outlier: >= 2x from its modality's median",
        ),
    ]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=9, bbox_to_anchor=(0.5, 0.955))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plain_log_ticks(ax) -> None:
    """Log-scale y ticks written as plain numbers (0.3, not 3 x 10^-1); the minor ones too within one decade, where a
    log axis has few or no major ticks."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda y, _: f"{y:.3g}")
    low, high = ax.get_ylim()
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain if 0 < low and high / low < 10 else NullFormatter())


def scatter_by_modality(ax, pos: torch.Tensor, values: torch.Tensor, tags: torch.Tensor) -> None:
    for code in sorted(set(tags.tolist())):
        m = tags == code
        ax.scatter(pos[m], values[m], s=9, color=COLOURS[MODALITIES[code]])


def report(keys, values, tags, layer: int, group_size: int, views: dict[str, torch.Tensor], texts: list[str]) -> dict:
    """Statistics for the JSON file and the console: per-modality norm statistics, the outlier tokens with their text
    and both methods' errors there, the per-modality mean errors, the key imbalance of every layer, and the
    modality-aligned-groups study."""
    per_layer = [diag.norm_stats(diag.token_norms(k), tags, group_size)["imbalance"] for k in keys]
    farthest = {
        kind: [diag.outlier_tokens(diag.token_norms(x), tags, factor=1.0, limit=1)[0] for x in xs]
        for kind, xs in (("keys", keys), ("values", values))
    }
    stats = {
        "layer": layer,
        "tokens": int(tags.numel()),
        "key_imbalance_per_layer": per_layer,
        "farthest_token_per_layer": farthest,
        "errors": {"keys": {}, "values": {}},
    }
    for kind, norm in (("keys", "key_norm"), ("values", "value_norm")):
        stats[kind] = diag.norm_stats(views[norm], tags, group_size)
        stats[kind]["outliers"] = [
            {
                **o,
                "text": texts[o["position"]] if o["position"] < len(texts) else "",
                "error": {m: views[f"{m} {kind}"][o["position"]].item() for m in ("KIVI", "OScaR")},
            }
            for o in diag.outlier_tokens(views[norm], tags)
        ]
    codes = sorted(set(tags.tolist()))
    for name, method, kind in ERRORS:
        err = views[name]
        stats["errors"][kind][method] = {MODALITIES[c]: err[tags == c].nanmean().item() for c in codes}
        stats["errors"][kind][method]["all"] = err.nanmean().item()
    methods = {
        m.lower(): {"rotation": q["rotation"], "token_norm": q["token_norm"], "zero_point": q["zero_point"]}
        for m, q in quantizers().items()
    }
    multi = tags.unique().numel() > 1
    stats["alignment"] = diag.alignment_study(keys, tags, group_size, methods=methods) if multi else None
    return stats


def print_report(stats: dict) -> None:
    print(
        f"tokens {stats['tokens']}, layer {stats['layer']}; 2-bit quantizers as the presets set them: "
        + ", ".join(f"{m} zero point {q['zero_point']}" for m, q in quantizers().items())
    )
    for kind in ("keys", "values"):
        s = stats[kind]
        jump = "" if s["boundary_jump"] is None else f", boundary jump {s['boundary_jump']:.3f}"
        print(
            f"  {kind}: imbalance (max/min modality mean) {s['imbalance']:.3f}{jump}, "
            f"within jump {s['within_jump']:.3f}"
        )
        for name, m in s["per_modality"].items():
            print(
                f"    {name:6s} n={m['n']:5d} mean={m['mean']:.3f} cv={m['cv']:.3f} min={m['min']:.3f} "
                f"max={m['max']:.3f}"
            )
        for o in s["outliers"]:
            sink = " (the first token, where attention sinks form)" if o["position"] == 0 else ""
            print(
                f"    outlier: token {o['position']} {o['text']!r} ({o['modality']}){sink}: norm {o['norm']:.3f} = "
                f"{o['ratio']:.2f}x the {o['modality']} median; error KIVI {o['error']['KIVI']:.3f}, "
                f"OScaR {o['error']['OScaR']:.3f}"
            )
        print(
            "    mean relative error (2-bit): "
            + "; ".join(
                f"{m} " + ", ".join(f"{n} {e:.4f}" for n, e in errs.items())
                for m, errs in stats["errors"][kind].items()
            )
        )
    if len(stats["keys"]["per_modality"]) > 1:
        print("  key imbalance per layer:", " ".join(f"{x:.2f}" for x in stats["key_imbalance_per_layer"]))
    for kind, tokens in stats["farthest_token_per_layer"].items():
        print(
            f"  {kind}, the token farthest from its modality's median per layer (norm ratio @ position): "
            + " ".join(f"{o['ratio']:.2f}@{o['position']}" for o in tokens)
        )
    if stats["alignment"]:
        a = stats["alignment"]
        print(
            f"  key groups cut at modality boundaries (G={a['group_size']}; relative squared error, mean over "
            f"layers; scale bits/elt {a['scale_bits']}):"
        )
        for method, layouts in a["error"].items():
            for layout, err in layouts.items():
                print(f"    {method:9s} {layout:10s} " + " ".join(f"{m}={e:.4f}" for m, e in err.items()))


def token_texts(adapter, input_ids: torch.Tensor) -> list[str]:
    """Each position's token as text (a placeholder token for image/audio positions)."""
    tok = getattr(adapter, "tokenizer", None)
    return [tok.decode([int(t)]) for t in input_ids] if tok is not None else [""] * len(input_ids)


def main(args: argparse.Namespace) -> int:
    adapter = load_adapter(args.model, model_path=args.model_path, device=args.device, dtype=args.dtype)
    prompt, label = make_prompt(Path(args.input), args.text) if args.input else default_prompt(adapter, args.text)
    out = Path(args.out or f"results/tni/{args.model}-{Path(label).stem}.png")
    run(adapter, prompt, f"{args.model} on {label}", out, args.layer, args.group_size)
    return 0


def run(adapter, prompt: Prompt, title: str, out: Path, layer: int | None = None, group_size: int = 32) -> dict:
    """Capture, measure, draw `out` (PNG) and write its statistics beside it (JSON); print and return them."""
    keys, values, tags, input_ids = capture(adapter, prompt)
    layer = len(keys) // 2 if layer is None else layer
    if not 0 <= layer < len(keys):
        raise ValueError(f"--layer {layer} out of range: the model has {len(keys)} layers")
    views = per_token_views(keys[layer], values[layer], group_size)
    stats = report(keys, values, tags, layer, group_size, views, token_texts(adapter, input_ids))
    draw(views, tags, stats, f"{title}: layer {layer}, {tags.numel()} tokens", out)
    out.with_suffix(".json").write_text(json.dumps(stats, indent=1))
    print_report(stats)
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return stats
