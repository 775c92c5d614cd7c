"""MMAU-Pro (gamma-lab-umd/MMAU-Pro): 5,305 audio questions, closed form, open ended and
instruction following, scored as the official evaluator does (tasks.mmau_pro.score).

Prompt: the question; for closed-form items (more than one choice) followed by a blank line and the
choices as "A. ...", one per line (the layout NeMo-Skills' MMAU-Pro preparation uses; the official
repo ships no inference prompt). Every clip goes with it as 16 kHz mono float32. Greedy decoding,
at most 128 new tokens. The embedder and the judge are chosen with MMAU_PRO_EMBEDDER /
MMAU_PRO_JUDGE (or `MMAUProTask(judge=..., embedder=...)`), checked before the first item
(check_ready), loaded on first use, and named in every scored record; with a judge other than the
official one the result's notes call the open-ended numbers a pipeline check. An item whose audio or
generation fails keeps its error and is scored as the official script scores a missing answer; closed
items with fewer than two choices are left out, as officially.
VERSION is bumped whenever the prompt or the metric changes.
"""

from __future__ import annotations

import os
from typing import Any

from tasks.base import TaskNotReady
from tasks.contract import Generate, Prompt, Response
from tasks.mmau_pro import aif, embed, judge, score
from tasks.mmau_pro import data as mmau_data
from tasks.ocrbench import generation_fields

VERSION = 2  # 2: every row scored as officially, raw closed answers, English punkt_tab
MAX_NEW_TOKENS = 128


def prompt_text(item: dict[str, Any]) -> str:
    """The text part of the prompt for one item."""
    choices = item.get("choices") or []
    if item["category"] != score.OPEN and len(choices) > 1:
        options = "\n".join(f"{chr(65 + i)}. {c}" for i, c in enumerate(choices))
        return f"{item['question']}\n\n{options}"
    return item["question"]


def excluded_reason(item: dict[str, Any]) -> str | None:
    """Why the official evaluator leaves an item out of every number, or None."""
    if score.kind(item) == "excluded":
        return (
            f"closed-form item with {len(item.get('choices') or [])} choice(s): the official evaluator "
            f"leaves out closed items with fewer than two"
        )
    return None


UNSCORED = "not scored: a model with random weights (no embedder or judge run)"


class MMAUProTask:
    name = "mmau-pro"
    version = VERSION
    modalities = ("audio", "text")
    primary_metric = "overall"  # the official weighted score; open_ended / good_rate / aif beside it

    def __init__(
        self,
        judge: str | None = None,
        embedder: str | None = None,
        judge_max_new_tokens: int = judge.MAX_NEW_TOKENS,
        judge_seed: int = judge.SEED,
        device: str | None = None,
        max_new_tokens: int = MAX_NEW_TOKENS,
        model_scoring: bool = True,
        models=None,
    ):
        """judge / embedder: specs for judge.load_judge / embed.load_embedder (None: env var, then the
        default); max_new_tokens and judge_max_new_tokens: official 128 / 512, smaller only for smoke runs.
        model_scoring=False: closed and open items are not scored (no embedder, no judge: a record says
        "unscored"); the harness sets it for a shape-real model with random weights, whose answers mean nothing
        (its run measures speed, memory and the code path). Instruction-following items are still scored (rules).
        models: the registered models a judge may name (tasks.contract.ModelSource; the eval loop hands in the
        harness's registry)."""
        self.max_new_tokens, self.model_scoring = max_new_tokens, model_scoring
        self.judge_spec, self.embedder_spec = judge, embedder
        self.judge_max_new_tokens, self.judge_seed, self.device = judge_max_new_tokens, judge_seed, device
        self.models = models
        self._judge: judge.Judge | None = None
        self._embedder: embed.Embedder | None = None

    def load(self, data: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Items; aif.PunktMissingError first when AIF items are there and the English punkt_tab is not."""
        items = mmau_data.load_items(data, limit)
        if any(score.kind(item) == "aif" for item in items):
            aif.require_sentence_splitter()
        return items

    def requests(self, item: dict[str, Any]) -> list[Generate]:
        """The question (and choices) with every clip; none for an item the official evaluator leaves out;
        TaskDataError for a missing or bad clip."""
        if excluded_reason(item):
            return []
        return [Generate(Prompt(text=prompt_text(item), audios=mmau_data.load_clips(item)), self.max_new_tokens)]

    def judge_name(self) -> str:
        """The judge this task runs: the constructor's, else $MMAU_PRO_JUDGE, else the official one."""
        return self.judge_spec or os.environ.get(judge.ENV) or judge.OFFICIAL

    def check_ready(self) -> None:
        """TaskNotReady naming $MMAU_PRO_JUDGE / $MMAU_PRO_EMBEDDER and the fix when a scorer this run needs cannot
        load, before any item runs (loaded on first use, a missing judge only showed at the first open-ended item).
        Checks files and configs, loads no weights; nothing when model_scoring is off (no judge or embedder runs)."""
        if not self.model_scoring:
            return
        problems = []
        for loaded, check in (
            (self._judge, lambda: judge.check_judge(self.judge_spec, self.models)),
            (self._embedder, lambda: embed.check_embedder(self.embedder_spec)),
        ):
            if loaded is None:
                try:
                    check()
                except RuntimeError as exc:
                    problems.append(str(exc))
        if problems:
            raise TaskNotReady(
                f"{self.name} scores open-ended items with a judge and closed ones with an embedder, "
                f"and cannot load them:\n" + "\n".join(f"- {p}" for p in problems)
            )

    def notes(self) -> list[str]:
        """A stand-in judge (SmolLM2 on the generated set, any non-official LM) rates open-ended answers in ways no
        official number compares with (SmolLM2-135M gives byte-garbage answers open-ended 60): say so."""
        name = self.judge_name()
        if not self.model_scoring or judge.is_official(name):
            return []
        return [f"open-ended items judged by {name}, not the official {judge.OFFICIAL}: a pipeline check, not a score"]

    def get_embedder(self) -> embed.Embedder:
        if self._embedder is None:
            self._embedder = embed.load_embedder(self.embedder_spec, device=self.device)
        return self._embedder

    def get_judge(self) -> judge.Judge:
        if self._judge is None:
            self._judge = judge.load_judge(
                self.judge_spec,
                device=self.device,
                seed=self.judge_seed,
                max_new_tokens=self.judge_max_new_tokens,
                models=self.models,
            )
        return self._judge

    def score_prediction(self, item: dict[str, Any], prediction: str) -> dict[str, Any]:
        """{"scores": {...}, "scorer": {...}, and kind-specific details} for one prediction."""
        kind = score.kind(item)
        if not self.model_scoring and kind in ("closed", "open"):
            return {"unscored": UNSCORED}
        if kind == "closed":
            return self.score_closed(item, prediction)
        if kind == "open":
            rater = self.get_judge()
            text, ratings = rater.rate(item["question"], item["answer"], prediction, item["id"])
            return {"scores": ratings, "scorer": rater.describe(), "judge_output": text}
        outcome = aif.check(item.get("task_identifier"), prediction, item.get("kwargs"), item["question"])
        out = {"scores": {"passed": int(outcome.passed)}, "scorer": {"aif_sentence_splitter": aif.sentence_splitter()}}
        return {**out, "note": outcome.note} if outcome.note else out

    def score_closed(self, item: dict[str, Any], prediction: str) -> dict[str, Any]:
        """The official pick (raw answer embedded) and ours with option letters mapped
        (score.map_letter), each against the reference; EmbeddingError on NaN/inf embeddings."""
        model = self.get_embedder()
        choices = list(item["choices"])
        choice_vectors = model.encode(choices)
        embed.require_finite(choice_vectors, choices, item["id"], model.name)

        def similarities(text: str) -> list[float]:
            vector = model.encode([text])
            embed.require_finite(vector, [text], item["id"], model.name)
            return (vector @ choice_vectors.T * 100).squeeze(0).tolist()

        raw = similarities(prediction)
        mapped_text, letter = score.map_letter(prediction, choices)
        mapped = raw if letter is None else similarities(mapped_text)
        pick, mapped_pick = score.pick_choice(raw), score.pick_choice(mapped)
        return {
            "scores": {
                "correct": int(choices[pick] == item["answer"]),
                "correct_letters_mapped": int(choices[mapped_pick] == item["answer"]),
            },
            "scorer": model.describe(),
            "matched_choice": choices[pick],
            "similarities": raw,
            "letter_index": letter,
            "matched_choice_letters_mapped": choices[mapped_pick],
        }

    def record(self, item: dict[str, Any], responses: list[Response], error: str | None = None) -> dict[str, Any]:
        """{"id", "prediction", "scores", "category", "kind", "scorer", cost figures, ...};
        a failed item adds "error" and "failure" (audio: `error`, the clips could not be read | generation) and is
        scored on the official stand-in answer ("scored_as"); an officially excluded item is {"id", "category",
        "kind", "excluded"}."""
        base = {"id": item["id"], "category": item["category"], "kind": score.kind(item)}
        base["cluster"] = "|".join(item["audio_path"]) or None  # the clips: questions on one recording are alike
        reason = excluded_reason(item)
        if reason:
            return {**base, "excluded": f"item {item['id']}: {reason}"}
        if error:
            return self.failed_record(item, base, error, "audio")
        response = responses[0]
        if response.error:
            return self.failed_record(item, base, f"item {item['id']}: {response.error}", "generation")
        return {
            **base,
            "prediction": response.text,
            "answer": item["answer"],
            "empty_prediction": not response.text.strip(),
            "n_clips": len(item["audio_path"]),
            **self.score_prediction(item, response.text),
            **generation_fields(response),
        }

    def failed_record(self, item: dict[str, Any], base: dict[str, Any], error: str, failure: str) -> dict[str, Any]:
        """A failed item scored as the official script scores a missing answer (score.standin)."""
        text = score.standin(base["kind"])
        return {
            **base,
            "error": error,
            "failure": failure,
            "prediction": None,
            "scored_as": text,
            "answer": item["answer"],
            **self.score_prediction(item, text),
        }

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return score.aggregate(records)

    def data_fingerprint(self, items: list[dict[str, Any]]) -> str:
        return mmau_data.fingerprint(items)

    def describe(self) -> dict[str, Any]:
        """Settings a result should record: prompt, decoding, and the scorers asked for (the ones
        actually used are in each record's "scorer" and in aggregate()["scorers"])."""
        settings = {
            "prompt": "question + lettered choices",
            "decoding": "greedy",
            "model_scoring": self.model_scoring,
            "max_new_tokens": self.max_new_tokens,
            "judge": self.judge_name(),
            "judge_official": judge.is_official(self.judge_name()),
            "judge_max_new_tokens": self.judge_max_new_tokens,
            "judge_seed": self.judge_seed,
            "judge_temperature": judge.TEMPERATURE,
            "embedder": self.embedder_spec or os.environ.get(embed.ENV) or embed.MINILM,
            "judge_dtype": judge.DTYPE,
            "official_judge": judge.OFFICIAL,
            "official_embedder": embed.OFFICIAL,
            "aif_sentence_splitter": aif.sentence_splitter(),
            "rules": dict(score.RULES),
            "failed_items": "kept and scored as the official scores a missing answer: '' (open, closed), "
            "'None' (AIF); counted per category in n_failed / n_failed_<why>",
            "excluded_items": "closed items with fewer than two choices, left out as officially (n_excluded)",
        }
        for loaded in (self._judge, self._embedder):  # what actually ran, once loaded
            if loaded is not None:
                settings.update(loaded.describe())
        return settings


TASK = MMAUProTask()
