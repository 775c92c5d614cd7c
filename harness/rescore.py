"""Re-score MMAU-Pro result files with the task's current rules, from their recorded predictions.

    python -m harness.rescore [--data PATH] [--judge SPEC] [--embedder SPEC] RESULT.json ...

Every sample is scored again by MMAUProTask.score_prediction from its recorded prediction (a failed
item from the official stand-in answer), metrics and intervals are rebuilt as the eval loop builds
them (harness.record.aggregate_with_ci, same seed and resamples), and the task version, settings and
notes are updated. Generation figures (system, per-sample cost fields, environment) stay the original
run's; the model is not needed. The items come from the result's data ("generated", or --data for a
path), matched by id and checked against the recorded data fingerprint. The judge and the embedder
default to the ones the result names.

An open item whose judged text is unchanged keeps its recorded judge output, parsed again by the
official rules (score.parse_judge_scores): the judge prompt and parsing did not change, and a sampled
judge would only draw again. --rejudge runs the judge anew (in bfloat16) on every open item; the
result's settings say which was done.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from tasks.mmau_pro import VERSION, MMAUProTask, data, score

# Fields score_prediction writes; an old record's are dropped before the new ones go in.
SCORING_FIELDS = (
    "scores",
    "scorer",
    "matched_choice",
    "matched_choice_letters_mapped",
    "letter_index",
    "similarities",
    "judge_output",
    "note",
    "scored_as",
)


def _failure(error: str) -> str:
    """The failure kind of an error text written before records carried one."""
    return "generation" if "generation failed" in error else "audio" if "audio" in error else "other"


def rescore_record(
    task: MMAUProTask, record: dict[str, Any], item: dict[str, Any], rejudge: bool = False
) -> dict[str, Any]:
    """`record` scored again under the current rules (a new dict); a recorded judge output of the
    same text is re-parsed rather than judged again unless `rejudge`."""
    out = {k: v for k, v in record.items() if k not in SCORING_FIELDS}
    out["kind"] = score.kind(item)
    if out["kind"] == "excluded":
        return {k: out[k] for k in ("id", "category", "kind", "loop_s", "wall_s") if k in out} | {
            "excluded": f"item {item['id']}: closed-form item with fewer than two choices, left out as officially"
        }
    if "error" in out:
        out.setdefault("failure", _failure(out["error"]))
        if out["failure"] == "other":  # refused by an older rule before generation: no answer to score
            raise ValueError(
                f"item {item['id']}: {out['error']!r} was never generated; rerun the model "
                "(make eval ... OPTS=--force) to score it"
            )
        text = score.standin(out["kind"])
        out.update(prediction=None, scored_as=text)
    else:
        text = record["prediction"]
    out["answer"] = item["answer"]
    judged_before = record.get("prediction", record.get("scored_as")) == text and "judge_output" in record
    if out["kind"] == "open" and judged_before and not rejudge:
        out.update(
            scores=score.parse_judge_scores(record["judge_output"]),
            scorer=record["scorer"],
            judge_output=record["judge_output"],
        )
    else:
        out.update(task.score_prediction(item, text))
    return out


def rescore_result(
    result: dict[str, Any], items: list[dict[str, Any]], task: MMAUProTask, rejudge: bool = False
) -> dict[str, Any]:
    """A new result dict: samples, metrics, categories, task and notes under the current rules."""
    from harness import results as R
    from harness.record import aggregate_with_ci

    if data.fingerprint(items) != result["task"]["data_fingerprint"]:
        raise ValueError(
            "the items loaded are not the ones this result was run on (data fingerprint differs); pass the right --data"
        )
    by_id = {item["id"]: item for item in items}
    missing = [s["id"] for s in result["samples"] if s["id"] not in by_id]
    if missing:
        raise ValueError(f"samples {missing[:5]} are not among the items loaded")
    records = [rescore_record(task, s, by_id[s["id"]], rejudge) for s in result["samples"]]
    method = next(iter(result["metrics"].values()))["ci_method"]
    resamples = int(re.search(r"(\d+) resamples", method).group(1)) if "resamples" in method else 1000
    metrics, categories = aggregate_with_ci(task, records, resamples, result["seed"])
    old_version, old_date = result["task"]["version"], result["date"]
    new = dict(
        result,
        date=R.utc_now(),
        samples=records,
        metrics=metrics,
        categories=categories,
        n_errors=sum(1 for r in records if "error" in r),
    )
    settings = R.jsonable(task.describe())
    if not rejudge and any(r["kind"] == "open" for r in records):
        old_judge = {k: v for k, v in result["task"]["settings"].items() if k.startswith("judge")}
        device = result["system"]["device"]
        # task version 1 loaded judges in float32 on the CPU (bfloat16 / float16 on a GPU)
        old_judge.setdefault(
            "judge_dtype", "float32" if device == "cpu" else f"version {old_version} default on {device}"
        )
        settings.update(
            old_judge,
            open_items_judged=(
                f"judge outputs of the original run (task version {old_version}, {old_date}) "
                "re-parsed by the official rules"
            ),
        )
    new["task"] = dict(result["task"], version=VERSION, settings=settings)
    new["notes"] = list(result.get("notes", [])) + [
        f"re-scored from the recorded predictions under task version {VERSION} (was {old_version}); generation, "
        f"system figures and environment are the original run's ({old_date})"
    ]
    R.validate(new)
    return new


def main(argv: list[str] | None = None) -> int:
    from harness import results as R
    from harness.models.source import RegistrySource

    p = argparse.ArgumentParser(prog="python -m harness.rescore", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", type=Path)
    p.add_argument("--data", default=None, help="the items' path when the result's data is not 'generated'")
    p.add_argument("--judge", default=None, help="judge spec (default: the one the result names)")
    p.add_argument("--embedder", default=None, help="embedder spec (default: the one the result names)")
    p.add_argument("--rejudge", action="store_true", help="judge every open item again instead of re-parsing")
    args = p.parse_args(argv)
    tasks: dict[tuple, MMAUProTask] = {}  # one loaded judge / embedder per setting
    for path in args.results:
        result = R.read_result(path)
        settings = result["task"]["settings"]
        key = (
            args.judge or settings["judge"],
            args.embedder or settings["embedder"],
            settings["max_new_tokens"],
            settings["judge_max_new_tokens"],
            settings["judge_seed"],
        )
        if key not in tasks:
            tasks[key] = MMAUProTask(
                judge=key[0],
                embedder=key[1],
                max_new_tokens=key[2],
                judge_max_new_tokens=key[3],
                judge_seed=key[4],
                models=RegistrySource(),
            )
        kind = result["task"]["data"]
        if args.data is None and kind not in ("generated", "official"):
            raise SystemExit(f"{path}: data {kind!r}: pass --data with the items' path")
        source = args.data or (None if kind == "official" else kind)
        items = tasks[key].load(source, result["task"]["limit"])
        new = rescore_result(result, items, tasks[key], args.rejudge)
        R.write_result(new, path)
        m = new["metrics"]
        print(
            f"{path}: overall {m['overall']['value']:.2f} (was {result['metrics']['overall']['value']:.2f}), "
            f"failed {new['n_errors']}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
