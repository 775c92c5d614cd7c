"""`oscar-eval tni`: token-norm imbalance of a model's KV cache on one input, per modality.

Runs the prompt once through the model (default cache, no quantization), takes every layer's keys and
values as the cache receives them (post-RoPE), and
- prints per-modality norm statistics (quant.diagnostics.norm_stats) for one layer and the imbalance
  of every layer, and the modality-aligned-groups study (quant.diagnostics.alignment_study);
- draws a PNG: per-token key/value norms coloured by modality; per-token key range before and after
  OScaR's rotation + token scaling; per-token key reconstruction error without (KIVI keys) and with
  OScaR.

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

from harness.models.base import MODALITIES, Prompt
from harness.models import load as load_adapter
from quant import diagnostics as diag
from quant.primitives import hadamard

AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".m4a"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
COLOURS = {"text": "tab:blue", "image": "tab:orange", "video": "tab:green", "audio": "tab:red"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="registry name (oscar-eval list), e.g. qwen3-vl-8b or tiny-qwen3-vl")
    p.add_argument("--input", required=True, help="an image, an audio file (16 kHz after resampling) or a text file")
    p.add_argument("--text", default="Describe this in detail.", help="the question put after an image/audio input")
    p.add_argument("--layer", type=int, default=None, help="layer drawn and detailed (default: the middle one)")
    p.add_argument("--group-size", type=int, default=32, help="key quantization group (tokens) for the error panels")
    p.add_argument("--out", default=None, help="PNG path (default results/tni/<model>-<input>.png); JSON goes beside it")
    p.add_argument("--model-path", default=None, help="local weights directory (else MODEL_PATH or the HF cache)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="bfloat16 | float16 | float32 (default: the model's)")


def make_prompt(path: Path, question: str) -> Prompt:
    """Image/audio file -> that medium plus `question`; anything else is read as the text prompt."""
    if not path.is_file():
        raise FileNotFoundError(f"--input {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        from PIL import Image

        return Prompt(question, images=[Image.open(path).convert("RGB")])
    if suffix in AUDIO_SUFFIXES:
        from harness.models.common import load_audio

        return Prompt(question, audios=[load_audio(path)])
    return Prompt(path.read_text(encoding="utf-8", errors="replace"))


def encode_marked(tokenizer, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw text (no chat template) with <image>..</image>-style spans -> (input_ids [1, S], tags [S])."""
    names = "|".join(MODALITIES[1:])
    ids, tags = [], []
    for part in re.split(rf"(<(?:{names})>.*?</(?:{names})>)", text, flags=re.S):
        match = re.fullmatch(rf"<({names})>(.*)</\1>", part, flags=re.S)
        code, body = (MODALITIES.index(match.group(1)), match.group(2)) if match else (0, part)
        piece = tokenizer(body, add_special_tokens=False)["input_ids"] if body else []
        ids += piece
        tags += [code] * len(piece)
    if not ids:
        raise ValueError("the text input is empty")
    return torch.tensor([ids]), torch.tensor(tags)


def capture(adapter, prompt: Prompt):
    """One prefill with the default cache: (keys, values: per layer [1, H, S, D], tags [S], input_ids [S])."""
    if hasattr(adapter, "build_inputs"):  # multimodal adapters (harness.models.common)
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


def per_token_views(k: torch.Tensor, v: torch.Tensor, group_size: int) -> dict[str, torch.Tensor]:
    """Per-token curves [S] of one layer: norms, key range before/after OScaR's scaling, key errors.
    Errors cover the full groups only; a shorter tail (the cache keeps it in full precision) is NaN."""
    rot = hadamard(k.shape[-1])
    k_unit = (k @ rot) / diag.token_norms(k)[None, None, :, None]
    full = k.shape[-2] - k.shape[-2] % group_size
    groups = diag.contiguous_groups(full, group_size)
    err = {}
    for name, (rotation, token_norm) in {"KIVI keys": (False, False), "OScaR keys": (True, True)}.items():
        k_hat = diag.reconstruct_keys(k[:, :, :full], groups, rotation=rotation, token_norm=token_norm)
        e = ((k[:, :, :full] - k_hat).pow(2).sum(dim=(0, 1, 3)) / k[:, :, :full].pow(2).sum(dim=(0, 1, 3))).sqrt()
        err[name] = torch.cat([e, torch.full((k.shape[-2] - full,), float("nan"))])
    return {"key_norm": diag.token_norms(k), "value_norm": diag.token_norms(v),
            "range_before": k[0].abs().amax(dim=(0, 2)), "range_after": k_unit[0].abs().amax(dim=(0, 2)), **err}


def draw(views: dict[str, torch.Tensor], tags: torch.Tensor, title: str, path: Path) -> None:
    """Three panels along the sequence, points coloured by modality (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = torch.arange(tags.numel())
    fig, axes = plt.subplots(3, 1, figsize=(14, 9), sharex=True)
    panels = [("key_norm", "value_norm", "L2 norm over heads x channels", "key ||k_t||", "value ||v_t||"),
              ("range_before", "range_after", "max |entry| per token", "key before", "key after rotation + token scaling"),
              ("KIVI keys", "OScaR keys", "relative key error (2-bit)", "KIVI keys", "OScaR keys")]
    for ax, (a, b, ylabel, la, lb) in zip(axes, panels):
        for code in sorted(set(tags.tolist())):
            m = tags == code
            name = MODALITIES[code]
            ax.scatter(pos[m], views[a][m], s=6, c=COLOURS[name], marker="o", label=f"{la} ({name})")
            ax.scatter(pos[m], views[b][m], s=10, c=COLOURS[name], marker="x", linewidths=0.6, label=f"{lb} ({name})")
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7, markerscale=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[-1].set_xlabel("token position")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(keys, values, tags, layer: int, group_size: int) -> dict:
    """Statistics for the JSON file and the console."""
    per_layer = [diag.norm_stats(diag.token_norms(k), tags, group_size)["imbalance"] for k in keys]
    return {"layer": layer, "tokens": int(tags.numel()),
            "keys": diag.norm_stats(diag.token_norms(keys[layer]), tags, group_size),
            "values": diag.norm_stats(diag.token_norms(values[layer]), tags, group_size),
            "key_imbalance_per_layer": per_layer,
            "alignment": diag.alignment_study(keys, tags, group_size) if tags.unique().numel() > 1 else None}


def print_report(stats: dict) -> None:
    print(f"tokens {stats['tokens']}, layer {stats['layer']}")
    for kind in ("keys", "values"):
        s = stats[kind]
        print(f"  {kind}: imbalance (max/min modality mean) {s['imbalance']:.3f}, boundary jump "
              f"{s['boundary_jump']}, within jump {s['within_jump']:.3f}")
        for name, m in s["per_modality"].items():
            print(f"    {name:6s} n={m['n']:5d} mean={m['mean']:.3f} cv={m['cv']:.3f} min={m['min']:.3f} max={m['max']:.3f}")
    print("  key imbalance per layer:", " ".join(f"{x:.2f}" for x in stats["key_imbalance_per_layer"]))
    if stats["alignment"]:
        a = stats["alignment"]
        print(f"  aligned groups (G={a['group_size']}, scale bits/elt {a['scale_bits']}):")
        for method, layouts in a["error"].items():
            for layout, err in layouts.items():
                print(f"    {method:9s} {layout:10s} " + " ".join(f"{m}={e:.4f}" for m, e in err.items()))


def main(args: argparse.Namespace) -> int:
    adapter = load_adapter(args.model, model_path=args.model_path, device=args.device, dtype=args.dtype)
    path = Path(args.input)
    keys, values, tags, _ = capture(adapter, make_prompt(path, args.text))
    layer = len(keys) // 2 if args.layer is None else args.layer
    if not 0 <= layer < len(keys):
        raise ValueError(f"--layer {layer} out of range: the model has {len(keys)} layers")
    stats = report(keys, values, tags, layer, args.group_size)
    out = Path(args.out or f"results/tni/{args.model}-{path.stem}.png")
    draw(per_token_views(keys[layer], values[layer], args.group_size), tags,
         f"{args.model} on {path.name}: layer {layer}, {tags.numel()} tokens", out)
    out.with_suffix(".json").write_text(json.dumps(stats, indent=1))
    print_report(stats)
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0
