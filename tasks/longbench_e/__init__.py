"""LongBench-E (THUDM/LongBench, `--e`): the 13 English and code sets with their length buckets, as pred.py and
eval.py run and score them; the average is the OScaR paper's (tasks/longbench_e/score.py).

Prompt: the set's template from dataset2prompt.json filled with the row, cut in its middle to `max_length` tokens of
the model's tokenizer (pred.py's truncation, done by the adapter: Prompt.max_tokens), then in the model's chat template
except for trec, triviaqa, samsum, lcc and repobench-p (pred.py skips its chat wrapping there). Greedy, at most the
set's dataset2maxlen.json tokens; samsum also stops at a newline token and gives at least one token (pred.py's
`eos_token_id=[eos, "\\n"]`, `min_length=context+1`).

`max_length`: the prompt budget in tokens. pred.py takes it from model2maxlen.json (3500 / 7500 / 15500 / 31500 for
4k / 8k / 16k / 32k models), which has no entry for Llama-3.1 or Qwen3. Left unset, it is the budget of the largest of
those classes the model holds once the run binds the task to the model (`bind`: 31500 for Llama-3.1-8B and Qwen3-8B,
7500 for SmolLM2's 8k), and 31500 for an unbound task; a set value that leaves no room for the chat template and the
longest answer in the model's context is refused.

`longbench-e-oscar`: the OScaR repository's own script (eval_longbench.py): no chat template for any set, a 32768-token
budget, no samsum special case, and fuzzywuzzy with python-Levenshtein (its pyproject's `fuzzywuzzy[speedup]`).
VERSION is bumped whenever a prompt or the metric changes.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable

from tasks.base import TaskDataError, TaskNotReady
from tasks.contract import Generate, Prompt, Response
from tasks.longbench_e import data as lb_data
from tasks.longbench_e import fuzzy, score
from tasks.longbench_e.prompts import DATASETS, MAX_NEW_TOKENS, MODEL_MAX_LENGTHS, NO_CHAT, PROMPTS

VERSION = 1
DEFAULT_MAX_LENGTH = 31500
ROUGE_VERSION = "1.0.1"


def max_length_for(model_context: int) -> int:
    """model2maxlen's budget for a model holding `model_context` tokens: the largest class it holds."""
    fitting = [budget for context, budget in MODEL_MAX_LENGTHS.items() if context <= model_context]
    if not fitting:
        raise ValueError(
            f"a model of {model_context} tokens holds none of LongBench's classes {list(MODEL_MAX_LENGTHS)}"
        )
    return max(fitting)


def generation_fields(response: Response) -> dict[str, Any]:
    """A generate response's figures as a record keeps them (tasks/contract.py: Response)."""
    return {
        "kv_bytes": dict(response.kv_bytes),
        "modality_tokens": dict(response.modality_tokens),
        "input_tokens": response.input_tokens,
        "new_tokens": response.new_tokens,
        "tokens_sha1": response.tokens_sha1,
        "wall_s": response.wall_s,
        "graph_steps": response.graph_steps,
    }


class LongBenchETask:
    version = VERSION
    modalities = ("text",)
    primary_metric = "average"

    def __init__(
        self,
        name: str = "longbench-e",
        max_length: int | None = None,
        chat: bool = True,
        samsum_stop: bool = True,
        fuzzy_backend: str = fuzzy.DEFAULT_BACKEND,
        max_new_tokens: int | None = None,
        datasets: Iterable[str] = DATASETS,
    ):
        """chat: the official rule (template except on the five sets above); False: never (OScaR's script).
        samsum_stop: pred.py's samsum stop at a newline and least length. max_new_tokens: None = each set's official
        budget; a number caps them (smoke runs only; recorded). datasets: a subset, kept in the official order."""
        unknown = sorted(set(datasets) - set(DATASETS))
        if unknown:
            raise ValueError(f"unknown LongBench-E sets {unknown}; choose among {', '.join(DATASETS)}")
        if fuzzy_backend not in fuzzy.BACKENDS:
            raise ValueError(f"fuzzy_backend {fuzzy_backend!r}: choose one of {', '.join(fuzzy.BACKENDS)}")
        if (max_length is not None and max_length < 2) or (max_new_tokens is not None and max_new_tokens < 1):
            raise ValueError(f"max_length must be >= 2 and max_new_tokens >= 1, got {max_length}, {max_new_tokens}")
        self.name, self.chat, self.samsum_stop = name, chat, samsum_stop
        self.requested_max_length = max_length  # None: from the model (bind), else DEFAULT_MAX_LENGTH
        self.max_length = DEFAULT_MAX_LENGTH if max_length is None else max_length
        self.model_context: int | None = None
        self.fuzzy_backend, self.max_new_tokens = fuzzy_backend, max_new_tokens
        self.datasets = tuple(d for d in DATASETS if d in set(datasets))

    def bind(self, count: Any, max_context: int | None) -> "LongBenchETask":
        """The run's hook (harness/run.py: bind_to_model), before items load: a copy for a model holding `max_context`
        tokens (None: unknown, kept as is). An unset max_length becomes the model2maxlen budget of the model's class; a
        set one must leave room for the chat template's own tokens (`count`: the model's input tokens of a prompt, here
        of an empty one) and the longest answer."""
        bound = copy.copy(self)
        if max_context is None:
            return bound
        bound.model_context = int(max_context)
        if self.requested_max_length is None:
            bound.max_length = max_length_for(max_context)
        room = (
            max_context
            - max(self.budget(d) for d in self.datasets)
            - (count(Prompt("", chat=self.chat)) if count else 0)
        )
        if bound.max_length > room:
            raise ValueError(
                f"{self.name}: a prompt of max_length {bound.max_length} tokens, the chat template and the longest "
                f"answer exceed the model's context of {max_context} tokens; use a max_length of at most {room}"
            )
        return bound

    def load(self, data: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        return lb_data.load_items(data, limit, self.datasets)

    def budget(self, dataset: str) -> int:
        official = MAX_NEW_TOKENS[dataset]
        return official if self.max_new_tokens is None else min(official, self.max_new_tokens)

    def prompt_text(self, item: dict[str, Any]) -> str:
        """dataset2prompt's template filled with the row (pred.py: `format(**row)`), before any truncation."""
        return PROMPTS[item["dataset"]].format(input=item["input"], context=item["context"])

    def requests(self, item: dict[str, Any]) -> list[Generate]:
        """The item's one generate; TaskDataError for a line that could not be read or an answer that cannot be
        scored (a passage_retrieval answer without 'Paragraph N')."""
        if "load_error" in item:
            raise TaskDataError(f"item {item['id']} ({item['source']}): {item['load_error']}; fix or remove the line")
        dataset = item["dataset"]
        if dataset == "passage_retrieval_en":
            try:
                [score.retrieval_id(a) for a in item["answers"]]
            except ValueError as exc:
                raise TaskDataError(f"item {item['id']} ({item['source']}): {exc}; fix the answer") from exc
        if dataset == "trec" and not isinstance(item.get("all_classes"), list):
            raise TaskDataError(f"item {item['id']} ({item['source']}): the file's last row has no all_classes list")
        prompt = Prompt(
            text=self.prompt_text(item),
            chat=self.chat and dataset not in NO_CHAT,
            max_tokens=self.max_length,
        )
        if dataset == "samsum" and self.samsum_stop:
            return [Generate(prompt, self.budget(dataset), stop=("\n",), min_new_tokens=1)]
        return [Generate(prompt, self.budget(dataset))]

    def record(self, item: dict[str, Any], responses: list[Response], error: str | None = None) -> dict[str, Any]:
        """{"id", "dataset", "category", "length", "prediction", "answers", "scores": {"score": 0..1}, cost figures}, or
        the same without a prediction and with "error" (a failed item: 0 in its bucket, tasks/longbench_e/score.py)."""
        base = {
            "id": item["id"],
            "dataset": item["dataset"],
            "category": item["dataset"],
            "length": item.get("length"),
            "source": item.get("source"),
        }
        error = error or (responses[0].error and f"item {item['id']}: {responses[0].error}")
        if error:
            return {**base, "error": error}
        prediction = responses[0].text or ""
        try:
            value = score.score_item(
                item["dataset"], prediction, item["answers"], item.get("all_classes"), self.fuzzy_backend
            )
        except (ValueError, TypeError, KeyError) as exc:
            return {**base, "prediction": prediction, "error": f"item {item['id']}: scoring failed: {exc}"}
        return {
            **base,
            "prediction": prediction,
            "answers": list(item["answers"]),
            "scores": {"score": value},
            **generation_fields(responses[0]),
        }

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return score.aggregate(records)

    def data_fingerprint(self, items: list[dict[str, Any]]) -> str:
        return lb_data.fingerprint(items)

    def check_ready(self) -> None:
        """TaskNotReady with the pip command when rouge 1.0.1 (the ROUGE-L of gov_report, multi_news, samsum) is
        missing or another version (their scores differ)."""
        from importlib import metadata

        try:
            import rouge  # noqa: F401

            found = metadata.version("rouge")
        except (ImportError, metadata.PackageNotFoundError):
            found = None
        if found != ROUGE_VERSION:
            what = "is not installed" if found is None else f"is {found}"
            raise TaskNotReady(
                f"{self.name}: scoring needs the PyPI package rouge=={ROUGE_VERSION}, which {what}; "
                f"run `pip install rouge=={ROUGE_VERSION}` (or `make setup`)"
            )

    def max_length_source(self) -> str:
        """Where max_length came from: "set" by the caller, "model" (bind), else "default" (31500)."""
        if self.requested_max_length is not None:
            return "set"
        return "model" if self.model_context is not None else "default"

    def describe(self) -> dict[str, Any]:
        """Settings a result should record besides the version."""
        return {
            "source": "THUDM/LongBench 2e00731: LongBench/config/dataset2prompt.json, dataset2maxlen.json, pred.py, "
            "eval.py --e, metrics.py; average: OScaR eval_long_bench.py (4f76613)",
            "datasets": list(self.datasets),
            "max_length": self.max_length,
            "max_length_from": self.max_length_source(),
            "model_context": self.model_context,
            "truncation": "middle, to max_length tokens of the prompt before the chat template",
            "chat_template": "all sets but trec, triviaqa, samsum, lcc, repobench-p" if self.chat else "none",
            "samsum_stop_newline": self.samsum_stop,
            "decoding": "greedy",
            "max_new_tokens": {d: self.budget(d) for d in self.datasets},
            "max_new_tokens_capped": self.max_new_tokens is not None,
            "rouge": f"rouge=={ROUGE_VERSION}",
            "code_sim_matcher": self.fuzzy_backend,
            "average": "mean over sets of the mean of the set's three rounded buckets (empty buckets left out)",
        }

    def notes(self) -> list[str]:
        matcher = {
            "difflib": "difflib (fuzzywuzzy without python-Levenshtein, as LongBench's requirements.txt)",
            "levenshtein": "python-Levenshtein's ratio (fuzzywuzzy[speedup], as the OScaR repository's pyproject)",
        }[self.fuzzy_backend]
        out = [f"lcc / repobench-p code similarity: fuzz.ratio with {matcher}; the other matcher differs on some items"]
        if self.max_new_tokens is not None:
            out.append(f"answers capped at {self.max_new_tokens} new tokens: a smoke run, not LongBench-E's budgets")
        return out


TASK = LongBenchETask()
TASK_OSCAR = LongBenchETask(
    name="longbench-e-oscar", max_length=32768, chat=False, samsum_stop=False, fuzzy_backend="levenshtein"
)
