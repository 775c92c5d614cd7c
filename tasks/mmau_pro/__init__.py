"""MMAU-Pro (gamma-lab-umd/MMAU-Pro): 5,305 audio questions, closed form, open ended and
instruction following, scored as the official evaluator does (tasks.mmau_pro.score).

Prompt: the question; for closed-form items (more than one choice) followed by a blank line and the
choices as "A. ...", one per line (the layout NeMo-Skills' MMAU-Pro preparation uses; the official
repo ships no inference prompt). Every clip goes with it as 16 kHz mono float32. Greedy decoding,
at most 128 new tokens. The embedder and the judge are chosen with MMAU_PRO_EMBEDDER /
MMAU_PRO_JUDGE (or `MMAUProTask(judge=..., embedder=...)`), loaded on first use, and named in every
scored record. VERSION is bumped whenever the prompt or the metric changes.
"""
from __future__ import annotations

import os
from typing import Any

from tasks.base import TaskDataError
from tasks.mmau_pro import aif, score
from tasks.mmau_pro import data as mmau_data
from tasks.mmau_pro import embed, judge
from tasks.ocrbench import generate_or_error

VERSION = 1
MAX_NEW_TOKENS = 128


def prompt_text(item: dict[str, Any]) -> str:
    """The text part of the prompt for one item."""
    choices = item.get("choices") or []
    if item["category"] != score.OPEN and len(choices) > 1:
        options = "\n".join(f"{chr(65 + i)}. {c}" for i, c in enumerate(choices))
        return f"{item['question']}\n\n{options}"
    return item["question"]


def item_problem(item: dict[str, Any]) -> str | None:
    """Why an item cannot be scored, or None."""
    kind = score.kind(item)
    if kind == "unscorable":
        return f"closed-form item with {len(item.get('choices') or [])} choice(s); the official evaluator needs two or more"
    if kind in ("closed", "open") and not item["answer"].strip():
        return "empty reference answer; the item cannot be scored (fix the data)"
    if kind == "aif" and item.get("task_identifier") not in aif.CHECKERS:
        return f"unknown AIF task_identifier {item.get('task_identifier')!r}; known: {sorted(aif.CHECKERS)}"
    return None


class MMAUProTask:
    name = "mmau-pro"
    version = VERSION
    modalities = ("audio", "text")
    primary_metric = "overall"  # the official weighted score; open_ended / good_rate / aif beside it

    def __init__(self, judge: str | None = None, embedder: str | None = None, judge_max_new_tokens: int = judge.MAX_NEW_TOKENS,
                 judge_seed: int = judge.SEED, device: str | None = None, max_new_tokens: int = MAX_NEW_TOKENS):
        """judge / embedder: specs for judge.load_judge / embed.load_embedder (None: env var, then the
        default); max_new_tokens and judge_max_new_tokens: official 128 / 512, smaller only for smoke runs."""
        self.max_new_tokens = max_new_tokens
        self.judge_spec, self.embedder_spec = judge, embedder
        self.judge_max_new_tokens, self.judge_seed, self.device = judge_max_new_tokens, judge_seed, device
        self._judge: judge.Judge | None = None
        self._embedder: embed.Embedder | None = None

    def load(self, data: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        return mmau_data.load_items(data, limit)

    def build_prompt(self, item: dict[str, Any]):
        """harness.models.base.Prompt with every clip; raises TaskDataError for a missing/bad clip."""
        from harness.models.base import Prompt

        return Prompt(text=prompt_text(item), audios=mmau_data.load_clips(item))

    def get_embedder(self) -> embed.Embedder:
        if self._embedder is None:
            self._embedder = embed.load_embedder(self.embedder_spec, device=self.device)
        return self._embedder

    def get_judge(self) -> judge.Judge:
        if self._judge is None:
            self._judge = judge.load_judge(self.judge_spec, device=self.device, seed=self.judge_seed,
                                           max_new_tokens=self.judge_max_new_tokens)
        return self._judge

    def score_prediction(self, item: dict[str, Any], prediction: str) -> dict[str, Any]:
        """{"scores": {...}, "scorer": {...}, and kind-specific details} for one prediction."""
        kind = score.kind(item)
        if kind == "closed":
            text, letter = score.map_letter(prediction, item["choices"])
            model = self.get_embedder()
            similarities = (model.encode([text]) @ model.encode(item["choices"]).T * 100).squeeze(0).tolist()
            pick = score.pick_choice(similarities)
            return {"scores": {"correct": int(item["choices"][pick] == item["answer"])}, "scorer": model.describe(),
                    "matched_choice": item["choices"][pick], "letter_index": letter, "similarities": similarities}
        if kind == "open":
            rater = self.get_judge()
            text, ratings = rater.rate(item["question"], item["answer"], prediction, item["id"])
            return {"scores": ratings, "scorer": rater.describe(), "judge_output": text}
        passed = aif.check(item["task_identifier"], prediction, item["kwargs"], item["question"])
        return {"scores": {"passed": int(passed)}, "scorer": {"aif_sentence_splitter": aif.sentence_splitter()}}

    def run_item(self, adapter, method, item: dict[str, Any]) -> dict[str, Any]:
        """{"id", "prediction", "scores", "category", "kind", "scorer", cost figures, ...} or
        {"id", "category", "kind", "error"} for an item that cannot run."""
        base = {"id": item["id"], "category": item["category"], "kind": score.kind(item)}
        problem = item_problem(item)
        if problem:
            return {**base, "error": f"item {item['id']}: {problem}"}
        try:
            prompt = self.build_prompt(item)
        except TaskDataError as exc:
            return {**base, "error": str(exc)}
        generation, error = generate_or_error(adapter, prompt, method, item["id"], self.max_new_tokens)
        if error:
            return {**base, "error": error}
        return {
            **base,
            "prediction": generation.text,
            "answer": item["answer"],
            "empty_prediction": not generation.text.strip(),
            "n_clips": len(prompt.audios),
            **self.score_prediction(item, generation.text),
            "modality_tokens": dict(generation.modality_tokens),
            "kv_bytes": dict(generation.kv_bytes),
            "input_tokens": generation.input_tokens,
            "new_tokens": generation.new_tokens,
            "wall_s": generation.wall_s,
            "graph_steps": generation.graph_steps,
        }

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return score.aggregate(records)

    def data_fingerprint(self, items: list[dict[str, Any]]) -> str:
        return mmau_data.fingerprint(items)

    def describe(self) -> dict[str, Any]:
        """Settings a result should record: prompt, decoding, and the scorers asked for (the ones
        actually used are in each record's "scorer" and in aggregate()["scorers"])."""
        settings = {"prompt": "question + lettered choices", "decoding": "greedy", "max_new_tokens": self.max_new_tokens,
                    "judge": self.judge_spec or os.environ.get(judge.ENV) or judge.OFFICIAL,
                    "judge_max_new_tokens": self.judge_max_new_tokens, "judge_seed": self.judge_seed,
                    "judge_temperature": judge.TEMPERATURE,
                    "embedder": self.embedder_spec or os.environ.get(embed.ENV) or embed.MINILM,
                    "official_judge": judge.OFFICIAL, "official_embedder": embed.OFFICIAL,
                    "aif_sentence_splitter": aif.sentence_splitter()}
        for loaded in (self._judge, self._embedder):  # what actually ran, once loaded
            if loaded is not None:
                settings.update(loaded.describe())
        return settings


TASK = MMAUProTask()
