"""RULER's needle-in-a-haystack tasks (NVIDIA/RULER: niah_single_1/2/3, niah_multikey_1/2/3, niah_multivalue,
niah_multiquery), one registry task per context length (niah-4k ... niah-128k), generated offline.

Inputs: tasks/niah/haystack.py (RULER's needles, template and depth placement; offline haystacks). Items per length:
ROUNDS rounds of the eight variants (80 items), each variant once in each of the ten depth rows of the heat map
(RULER's 40 depths in groups of four), each depth used twice; the first N items (--limit) stay balanced, a round
holding every variant once at spread depths. An item's keys, values and haystack come from its own seed (variant
and round), the same at every length, so lengths differ in their haystack only.
Sizing: the context length counts the model's tokens of the whole input (chat template and answer prefix in), as
RULER counts its input: each item's haystack is the largest whose input plus the 128 tokens to generate fits the
length (RULER's binary search over the haystack size, done per item). The task needs the model's tokenizer for
this, so it is bound to the model before it loads items (`bind`; harness/run.py does it after loading the model);
a length above the model's maximum context is refused there, before any item runs.
Prompt: RULER's template (singular when one value is asked) in the model's chat template, RULER's answer prefix
after the assistant turn, greedy, at most 128 new tokens (RULER's tokens_to_generate for niah).
Scoring: tasks/niah/score.py (RULER's string_match_all). Records carry the length, depth, variant, haystack and
`cluster`, the haystack an item was cut from (items of one cluster share their text).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from typing import Any, Callable

from tasks.base import TaskDataError
from tasks.contract import Generate, Prompt, Response
from tasks.niah import haystack as H
from tasks.niah import score
from tasks.ocrbench import generation_fields
from tasks.ppl import LICENSE_FILES

VERSION = 1
MAX_NEW_TOKENS = 128  # RULER's tokens_to_generate for niah (scripts/data/synthetic/constants.py)
ROUNDS = 10  # rounds of the eight variants per length: 80 items, each (variant, depth row) once
SEED = 42  # RULER's default random_seed
LENGTHS = {
    "niah-4k": 4096,
    "niah-8k": 8192,
    "niah-16k": 16384,
    "niah-32k": 32768,
    "niah-64k": 65536,
    "niah-128k": 131072,
}
TokenCounter = Callable[[Prompt], int]


def largest_fitting(tokens: Callable[[int], int], budget: int, guess: int) -> tuple[int, int]:
    """(n, tokens(n)) for the largest n >= 0 with tokens(n) <= budget, tokens nondecreasing in n; (-1, tokens(0))
    when even n = 0 is over. RULER bisects; the text grows almost linearly with n, so here a probe is placed by the
    slope between the bracket's ends (the first bracket from `guess` and the slope from n = 0), which lands next to
    the answer in a few probes; a probe that does not halve the bracket makes the next one a bisection."""
    t0 = tokens(0)
    if t0 > budget:
        return -1, t0
    lo, t_lo, hi, t_hi = 0, t0, None, None
    n, bisect = max(1, guess), False
    while True:
        width = None if hi is None else hi - lo
        t = tokens(n)
        if t <= budget:
            lo, t_lo = n, t
        else:
            hi, t_hi = n, t
        if hi is not None and hi - lo <= 1:
            return lo, t_lo
        if hi is None:  # still under: step past the estimate to get a bracket
            slope = max((t_lo - t0) / lo, 1e-3)
            n = lo + max(1, int((budget - t_lo) / slope * 1.02) + 1)
            continue
        n = (lo + hi) // 2 if bisect else lo + int((budget - t_lo) * (hi - lo) / max(t_hi - t_lo, 1))
        n = min(max(n, lo + 1), hi - 1)
        bisect = width is not None and 2 * (hi - lo) > width


def schedule(variants: tuple[str, ...], rounds: int) -> list[tuple[int, str, int]]:
    """(round, variant, depth) of each item, in order: in round j variant v sits in depth row (j + 3v) % 10, at the
    row's depth (v + row) % 4, so over ten rounds each variant visits every row once and each depth is used twice."""
    rows = len(score.DEPTH_BINS)
    out = []
    for j in range(rounds):
        for v, name in enumerate(variants):
            row = (j + 3 * v) % rows
            depths = score.DEPTH_BINS[row]
            out.append((j, name, depths[(v + row) % len(depths)]))
    return out


def cluster(variant: H.Variant, item: dict[str, Any]) -> str:
    """The haystack an item is cut from: one noise text, one essay per first license text, and every needle haystack
    its own (its distractors are drawn per item)."""
    if variant.haystack == "essay":
        return f"essay:{LICENSE_FILES[item['start']]}"
    return f"needle:{item['id']}" if variant.haystack == "needle" else variant.haystack


class NiahTask:
    modalities = ("text",)
    version = VERSION
    primary_metric = score.METRIC
    default_batch_size = None

    def __init__(
        self,
        length: int,
        name: str | None = None,
        rounds: int = ROUNDS,
        max_new_tokens: int = MAX_NEW_TOKENS,
        variants: tuple[str, ...] = tuple(H.VARIANTS),
        seed: int = SEED,
    ):
        """length: the context length in the model's tokens (input + max_new_tokens). rounds, max_new_tokens and
        variants other than the defaults are for tests and quick runs (recorded in describe())."""
        unknown = [v for v in variants if v not in H.VARIANTS]
        if unknown or not variants:
            raise ValueError(f"niah: unknown variants {unknown or '(none given)'}; choose from {list(H.VARIANTS)}")
        if length <= max_new_tokens or rounds < 1:
            raise ValueError(f"niah: the length ({length}) must exceed max_new_tokens ({max_new_tokens}), rounds >= 1")
        self.length, self.rounds, self.max_new_tokens = length, rounds, max_new_tokens
        self.variants, self.seed = tuple(variants), seed
        self.name = name or f"niah-{score.length_label(length).lower()}"
        self.count: TokenCounter | None = None  # set by bind
        self.max_context: int | None = None
        self._items: list[dict[str, Any]] | None = None

    # ------------------------------------------------------------------------------------------ binding
    def bind(self, count: TokenCounter, max_context: int | None) -> "NiahTask":
        """A copy sized for one model: `count(prompt)` is the number of tokens the model is given for `prompt`
        (chat template and answer prefix in), `max_context` its maximum context (None: unknown). ValueError when the
        length is above that maximum."""
        if max_context is not None and self.length > max_context:
            raise ValueError(
                f"{self.name} needs a context of {self.length} tokens, above the model's maximum of {max_context} "
                "(its config's max_position_embeddings); run a shorter niah task"
            )
        bound = copy.copy(self)
        bound.count, bound.max_context, bound._items = count, max_context, None
        return bound

    # ------------------------------------------------------------------------------------------ items
    def load(self, data: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """The items, sized in the bound model's tokens (built once per binding: a run that counts the whole set
        before taking its first `limit` items sizes them once)."""
        if data not in (None, "generated"):
            raise TaskDataError(
                f"{self.name}: --data {data!r}: the niah items are generated here (RULER's procedure with offline "
                "haystacks); run without --data"
            )
        if self.count is None:
            raise TaskDataError(
                f"{self.name} sizes its haystacks in the model's tokens: bind it to a model first "
                "(task.bind(count, max_context); harness.run.evaluate does)"
            )
        if self._items is None:
            self._items = self.build_items()
        return self._items[:limit] if limit else list(self._items)

    def build_items(self) -> list[dict[str, Any]]:
        """The schedule's items, each with the largest haystack that fits (a variant's last size is the next guess)."""
        guesses: dict[str, int] = {}
        items = []
        for position, (j, name, depth) in enumerate(schedule(self.variants, self.rounds)):
            item = {
                "id": f"{name}-{j:02d}",
                "variant": name,
                "length": self.length,
                "depth": depth,
                "seed": f"{self.seed}:{name}:{j}",
                "start": position % len(LICENSE_FILES),  # the license text an essay haystack starts with
            }
            items.append(self.sized(item, guesses.get(name, H.VARIANTS[name].step)))
            guesses[name] = items[-1]["n_haystack"]
        return items

    def sized(self, item: dict[str, Any], guess: int) -> dict[str, Any]:
        """`item` with its haystack size n_haystack (the largest whose input plus max_new_tokens fits the length),
        the input's tokens, its answers and its needles' depths; TaskDataError when not even one unit fits."""
        variant, needles = H.VARIANTS[item["variant"]], self.needles(item)
        budget = self.length - self.max_new_tokens
        n, tokens = largest_fitting(lambda n: self.count(self.prompt(item, n, needles)), budget, guess)
        if n < 1:
            what = "already takes" if n < 0 else "leaves no room for any haystack beside its"
            raise TaskDataError(
                f"{self.name} item {item['id']}: the prompt without haystack {what} {tokens} tokens of {budget} "
                f"({self.length} minus {self.max_new_tokens} to generate); choose a longer length"
            )
        return {
            **item,
            "haystack": variant.haystack,
            "cluster": cluster(variant, item),
            "n_haystack": n,
            "sized_tokens": tokens,
            "answers": list(needles.answers),
            "needle_depths": [d for d, _ in needles.placed],
        }

    def needles(self, item: dict[str, Any]) -> H.Needles:
        return H.make_needles(H.VARIANTS[item["variant"]], item["depth"], random.Random(item["seed"]))

    def prompt(self, item: dict[str, Any], n: int, needles: H.Needles | None = None) -> Prompt:
        """The item's prompt with a haystack of n units: RULER's question in the chat template, its answer prefix."""
        variant = H.VARIANTS[item["variant"]]
        needles = needles or self.needles(item)
        text = H.context(variant, needles, n, item["start"], item["seed"] + ":haystack")
        body, prefix = H.question(variant, needles, text)
        return Prompt(text=body, answer_prefix=prefix)

    def data_fingerprint(self, items: list[dict[str, Any]]) -> str:
        keys = ("id", "depth", "seed", "start", "n_haystack", "sized_tokens", "answers")
        blob = json.dumps([{k: i[k] for k in keys} for i in items], sort_keys=True)
        return hashlib.sha1(f"{self.length}:{self.max_new_tokens}:{blob}".encode()).hexdigest()[:16]

    # ------------------------------------------------------------------------------------------ run and score
    def requests(self, item: dict[str, Any]) -> list[Generate]:
        return [Generate(self.prompt(item, item["n_haystack"]), self.max_new_tokens)]

    def record(self, item: dict[str, Any], responses: list[Response], error: str | None = None) -> dict[str, Any]:
        """{"id", "category" (the length x depth cell), "variant", "length", "depth", "haystack", "cluster",
        "answers", "prediction", "scores": {"string_match_all": 0-100}, generation figures}; a failed item keeps its
        error and scores as an empty prediction."""
        base = {
            "id": item["id"],
            "category": score.cell_label(item["length"], item["depth"]),
            **{k: item[k] for k in ("variant", "length", "depth", "haystack", "cluster", "answers", "needle_depths")},
        }
        error = error or (responses[0].error if responses else "no response")
        if error:
            return {
                **base,
                "error": f"{self.name} item {item['id']}: {error}",
                "prediction": "",
                "scores": {score.METRIC: 0.0},
            }
        prediction = responses[0].text or ""
        return {
            **base,
            "prediction": prediction,
            "scores": {score.METRIC: score.item_score(prediction, item["answers"])},
            **generation_fields(responses[0]),
        }

    def aggregate(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        return score.aggregate(records)

    def describe(self) -> dict[str, Any]:
        return {
            "length": self.length,
            "length_counts": "the model's tokens of the whole input (chat template, answer prefix) + max_new_tokens",
            "max_new_tokens": self.max_new_tokens,
            "variants": list(self.variants),
            "rounds": self.rounds,
            "seed": self.seed,
            "depths": "RULER's grid round(linspace(0, 100, 40)); heat-map rows of 4 depths",
            "haystacks": {
                "noise": "RULER's repeated noise line",
                "essay": "license texts of /usr/share/common-licenses (RULER: Paul Graham essays), Punkt sentences",
                "needle": "distractor needles",
            },
            "prompt": "RULER niah template and answer prefix in the model's chat template",
            "scorer": "RULER string_match_all (scripts/eval/evaluate.py postprocess_pred)",
        }


TASKS = {name: NiahTask(length, name=name) for name, length in LENGTHS.items()}
TASK_4K, TASK_8K, TASK_16K = TASKS["niah-4k"], TASKS["niah-8k"], TASKS["niah-16k"]
TASK_32K, TASK_64K, TASK_128K = TASKS["niah-32k"], TASKS["niah-64k"], TASKS["niah-128k"]
