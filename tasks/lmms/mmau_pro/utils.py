"""lmms-eval hooks for `mmau_pro`: prompt, audio and scoring from tasks.mmau_pro.

Audio comes as a list of {"array": float32 [samples], "sampling_rate": 16000} dicts, one per clip,
the form lmms-eval's audio models take. Scoring (embedder, judge, AIF rules) is the harness's own;
every row is scored as the official evaluator scores it (a missing answer as "" / "None"); closed items
with fewer than two choices are left out, as officially.
"""

import math
from functools import lru_cache

from tasks.lmms import host
from tasks.mmau_pro import MMAUProTask, data, excluded_reason, prompt_text, score


@lru_cache(maxsize=1)
def _task():
    """The task with judge / embedder from MMAU_PRO_JUDGE / MMAU_PRO_EMBEDDER. These hooks run inside lmms-eval's
    process beside the oscar-eval model plugin, which hands the harness's registry over (tasks/lmms/host.py),
    so a judge may be a registered model by name (smollm2-135m); with another model plugin, judges are named by
    folder or hub id (tasks never import the harness)."""
    return MMAUProTask(models=host.models())


@lru_cache(maxsize=1)
def _audio_root():
    """(folder, zip or None) holding the clips: MMAU_PRO_AUDIO / MMAU_PRO_PATH / the hub snapshot."""
    import os
    from pathlib import Path

    from tasks.common import hub_snapshot

    folder = os.environ.get(data.ENV_PATH) or hub_snapshot(data.HUB_ID)
    if folder is None and not os.environ.get(data.ENV_AUDIO):
        raise data.TaskDataError(f"MMAU-Pro audio not found; {data.HOW_TO}")
    return data._audio_source(Path(folder or "."))


def _item(doc):
    root, zip_path = _audio_root()
    return data._row_to_item(0, doc, root, zip_path, root)


def doc_to_audio(doc):
    return [{"array": clip, "sampling_rate": data.SAMPLE_RATE} for clip in data.load_clips(_item(doc))]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return prompt_text(_item(doc))


METRICS = ("open_ended", "good_rate", "aif", "closed", "overall", "closed_letters_mapped", "overall_letters_mapped")


def process_results(doc, results):
    item = _item(doc)
    record = {"id": item["id"], "category": item["category"], "kind": score.kind(item)}
    reason = excluded_reason(item)
    if reason:
        record["excluded"] = f"item {item['id']}: {reason}"
    else:
        prediction = results[0] if results and results[0] is not None else score.standin(record["kind"])
        record.update(prediction=prediction, **_task().score_prediction(item, prediction))
    return {name: record for name in METRICS}


def _metric(name, records):
    value = score.aggregate(records)["metrics"][name]
    return math.nan if value is None else value


def aggregate_open_ended(records):
    return _metric("open_ended", records)


def aggregate_good_rate(records):
    return _metric("good_rate", records)


def aggregate_aif(records):
    return _metric("aif", records)


def aggregate_closed(records):
    return _metric("closed", records)


def aggregate_overall(records):
    return _metric("overall", records)


def aggregate_closed_letters_mapped(records):
    return _metric("closed_letters_mapped", records)


def aggregate_overall_letters_mapped(records):
    return _metric("overall_letters_mapped", records)
