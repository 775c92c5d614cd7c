"""Speech recognition: greedy transcripts scored by word error rate, and the teacher-forced likelihood of the reference.

Per item two requests on the same 16 kHz clip (the prompt's text is empty: a speech model's own decoder prompt says
"transcribe"):
- `Generate`: the greedy transcript, at most `max_new_tokens` new tokens (224: Whisper's own decoding default, half
  its 448-token decoder context).
- `Likelihood`: the reference as the model's answer, " " + the reference as given (Whisper's text tokens after its
  decoder prompt start with a space), each token a decode step over the quantized cache. Its NLL per token moves with
  every change of the cache, also where the greedy transcript does not change: the more sensitive of the two numbers.

Metrics (tasks/asr/score.py): `wer`, the corpus word error rate in percent after Whisper's English normaliser (the
Open ASR Leaderboard's rule), and `nll`, the mean NLL per reference token. Per item the record keeps the prediction,
the reference, both normalised, and scores {wer, errors, words, nll_sum, n_tokens, nll}: the harness' bootstrap
intervals and paired comparisons resample items through `aggregate`. An item whose clip cannot be read, or whose
reference is empty, fails alone (TaskDataError from `requests`); failed items are counted and left out of the metrics.
Data: tasks/asr/data.py (a folder, a saved dataset, $ASR_PATH, pocketsphinx-testdata) and tasks/asr/generate.py
(the synthesised set). VERSION is bumped whenever the requests or the metric change.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tasks.asr import data as asr_data
from tasks.asr import generate, score
from tasks.base import TaskDataError
from tasks.common import cache_root
from tasks.contract import Generate, Likelihood, Prompt, Response

VERSION = 2  # 2: a reference that normalises to no words is left out (the Open ASR Leaderboard)
MAX_NEW_TOKENS = 224


class ASRTask:
    name = "asr"
    version = VERSION
    modalities = ("audio",)
    primary_metric = "wer"

    def __init__(self, max_new_tokens: int = MAX_NEW_TOKENS, generated_size: int = generate.DEFAULT_SIZE):
        """max_new_tokens: the transcript's budget; generated_size: utterances of the generated set (tests build a
        few)."""
        self.max_new_tokens, self.generated_size = max_new_tokens, generated_size
        self.data_source: dict[str, Any] = {}  # what the last `load` read, for describe()

    def load(self, data: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        items = asr_data.load_items(data, limit, self.generated_size)
        self.data_source = self.source_of(data)
        return items

    def source_of(self, data: str | None) -> dict[str, Any]:
        """Where `data` reads from: the synthesis settings of the generated set, else the folder or dataset."""
        if data == "generated":
            return {"kind": "generated", **generate.describe(cache_root() / generate.folder_name(self.generated_size))}
        if data is None:
            path = os.environ.get(asr_data.ENV_PATH)
            return (
                {"kind": asr_data.ENV_PATH, "path": path}
                if path
                else {"kind": "pocketsphinx-testdata", "path": str(asr_data.POCKETSPHINX_DIR)}
            )
        return {"kind": "path", "path": str(Path(data).expanduser())}

    def requests(self, item: dict[str, Any]) -> list[Generate | Likelihood]:
        """The transcript and the reference's likelihood on the item's clip; TaskDataError naming the item for an
        empty reference or a missing, unreadable or empty clip."""
        if not item["reference"].strip():
            raise TaskDataError(
                f"item {item['id']}: the reference transcript is empty (WER over no words is undefined)"
            )
        prompt = Prompt(text="", audios=[asr_data.load_clip(item)])
        return [Generate(prompt, self.max_new_tokens), Likelihood(prompt, target=" " + item["reference"])]

    def check_ready(self) -> None:
        """TaskNotReady with the install command when Whisper's spelling map (the normaliser's) is missing."""
        score.check_normalizer()

    def record(self, item: dict[str, Any], responses: list[Response], error: str | None = None) -> dict[str, Any]:
        """{"id", "category", "reference", "prediction", both normalised, "scores", cost figures}; a failed item
        {"id", "category", "reference", "error", "failure": audio | generation | likelihood}."""
        base = {"id": item["id"], "reference": item["reference"]}
        if item.get("category"):
            base["category"] = item["category"]
        if error:
            return {**base, "error": error, "failure": "audio"}
        generated, likelihood = responses
        for failure, response in (("generation", generated), ("likelihood", likelihood)):
            if response.error:
                return {**base, "error": f"item {item['id']}: {response.error}", "failure": failure}
        scored = score.score_transcript(item["reference"], generated.text)
        n_tokens = likelihood.scored
        return {
            **base,
            "prediction": generated.text,
            "reference_normalized": scored["reference_normalized"],
            "prediction_normalized": scored["prediction_normalized"],
            "scores": {
                "wer": scored["wer"],
                "errors": scored["errors"],
                "words": scored["words"],
                "nll_sum": likelihood.nll_sum,
                "n_tokens": n_tokens,
                "nll": likelihood.nll_sum / n_tokens,
            },
            "modality_tokens": dict(generated.modality_tokens),
            "kv_bytes": dict(generated.kv_bytes),
            "input_tokens": generated.input_tokens,
            "new_tokens": generated.new_tokens,
            "tokens_sha1": generated.tokens_sha1,
            "graph_steps": generated.graph_steps,
            "wall_s": generated.wall_s + likelihood.wall_s,
        }

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return score.aggregate(records)

    def data_fingerprint(self, items: list[dict[str, Any]]) -> str:
        return asr_data.fingerprint(items)

    def notes(self) -> list[str]:
        """Synthetic speech is named: its numbers compare methods, not models with published WERs."""
        if self.data_source.get("kind") != "generated":
            return []
        s = self.data_source
        return [
            f"synthetic speech: {s['utterances']} sentences read by {s['synthesiser']} {s['synthesiser_version']} "
            f"with the voice {s['voice']}; WER here compares methods, not a benchmark's published numbers"
        ]

    def describe(self) -> dict[str, Any]:
        """Settings a result records: requests, decoding, the normaliser and its spelling map, the data's source."""
        return {
            "prompt": "the clip alone (empty text)",
            "decoding": "greedy",
            "max_new_tokens": self.max_new_tokens,
            "likelihood_target": "' ' + the reference as given, no special tokens",
            "wer": "corpus: summed word edits / summed reference words after normalisation, percent",
            "normalizer": score.normalizer_info(),
            "data_source": self.data_source,
        }


TASK = ASRTask()
