"""lmms-eval hooks for `oscar_ocrbench`: the prompt and the official scorer of tasks.ocrbench."""

from tasks.ocrbench import data, prompt_text, score


def doc_to_visual(doc):
    """The image as RGB: a PIL image (hub parquet with its features) or a {"bytes", "path"} dict
    (plain parquet), decoded with the harness's loader so a bad image names itself."""
    image = doc["image"]
    if isinstance(image, dict):
        source = {"bytes": image["bytes"]} if image.get("bytes") else {"path": image.get("path") or ""}
        return [data.open_image({"id": doc.get("question", "?")[:40], "image": source})]
    return [image.convert("RGB")]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return prompt_text(doc)


def process_results(doc, results):
    """One record per metric key (lmms-eval hands each metric its own list)."""
    record = {
        "id": doc.get("question_id", ""),
        "category": doc["question_type"],
        "prediction": results[0],
        "scores": {"score": score.score_sample(results[0], doc["answer"], doc["dataset"])},
    }
    return {"ocrbench_total": record, "ocrbench_accuracy": record}


def aggregate_total(records):
    """Points won (out of 1000 on the full set)."""
    return score.aggregate(records)["metrics"]["total"]


def aggregate_accuracy(records):
    return score.aggregate(records)["metrics"]["accuracy"]
