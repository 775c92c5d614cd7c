"""Finding and reading OCRBench offline.

Accepted sources, tried in this order for `data=None` (the official data):
1. the path in the OCRBENCH_PATH environment variable;
2. the warm Hugging Face cache of the hub dataset `echo840/OCRBench` (read with local files only).

A path may be: a parquet file or a folder of them (the hub layout, columns `dataset, question,
question_type, answer, image`); a folder written by `datasets.save_to_disk`; or the official repo's
`OCRBench.json` (keys `dataset_name, id, image_path, question, answers, type`) with its images
(folder beside it, or OCRBENCH_IMAGES).

Every loader returns items in file order, each a dict:
  {"id": "ocrbench-0000", "dataset": str, "question": str, "question_type": str,
   "answers": list[str], "image": {"bytes": bytes} | {"path": str}}
Images are decoded only when an item runs, so one unreadable image fails that item, not the load.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

from tasks import common
from tasks.base import TaskDataError

HUB_ID = "echo840/OCRBench"
ENV_PATH = "OCRBENCH_PATH"
ENV_IMAGES = "OCRBENCH_IMAGES"
JSON_NAME = "OCRBench.json"
HOW_TO = (
    f"point {ENV_PATH} (or --data) at a local copy: the hub dataset {HUB_ID} (parquet files or a "
    f"datasets.save_to_disk folder), or the official repo's {JSON_NAME} with its images "
    f"(OCRBench_Images beside it, or {ENV_IMAGES}); or use data='generated' for the project's small set"
)


def load_items(data: str | None, limit: int | None = None) -> list[dict[str, Any]]:
    """Items from `data` (None = official data, "generated" = the generated set, "generated-large" = with items at
    the real image sizes, else a path)."""
    from tasks.ocrbench.generate import ensure_generated, ensure_generated_large

    return common.load_items(
        data,
        limit,
        load_path=load_path,
        load_official=load_official,
        generated=ensure_generated,
        generated_large=ensure_generated_large,
    )


def load_official() -> list[dict[str, Any]]:
    """The real 1000 items from OCRBENCH_PATH or the warm HF cache; a clear error otherwise."""
    return common.load_official("OCRBench", ENV_PATH, HUB_ID, HOW_TO, load_path)


def load_path(path: Path) -> list[dict[str, Any]]:
    """Dispatch on what `path` holds (see the module docstring)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise TaskDataError(f"OCRBench path {str(path)!r} does not exist; {HOW_TO}")
    if path.is_file() and path.suffix == ".json":
        return load_official_json(path)
    if path.is_file() and path.suffix == ".parquet":
        return load_parquet([path])
    if (path / "state.json").exists() or (path / "dataset_dict.json").exists():
        return load_saved_dataset(path)
    json_files = sorted(glob.glob(str(path / "**" / JSON_NAME), recursive=True))
    if json_files:
        return load_official_json(Path(json_files[0]))
    parquets = sorted(Path(p) for p in glob.glob(str(path / "**" / "*.parquet"), recursive=True))
    if parquets:
        return load_parquet(parquets)
    raise TaskDataError(f"no OCRBench data (parquet, saved dataset or {JSON_NAME}) under {str(path)!r}; {HOW_TO}")


def _hub_row_to_item(index: int, row: dict[str, Any], where: str) -> dict[str, Any]:
    """One hub-schema row -> item; a missing column is a clear error naming the row."""
    missing = [k for k in ("dataset", "question", "question_type", "answer", "image") if k not in row]
    if missing:
        raise TaskDataError(f"{where}: row {index} lacks columns {missing}; expected the {HUB_ID} schema")
    image = row["image"]
    if isinstance(image, dict) and image.get("bytes") is not None:
        image = {"bytes": image["bytes"]}
    elif isinstance(image, dict) and image.get("path"):
        image = {"path": image["path"]}
    else:
        image = {"bytes": b""}  # requests() reports it as unreadable
    answers = row["answer"]
    return {
        "id": f"ocrbench-{index:04d}",
        "dataset": str(row["dataset"]),
        "question": str(row["question"]),
        "question_type": str(row["question_type"]),
        "answers": [answers] if isinstance(answers, str) else [str(a) for a in (answers or [])],
        "image": image,
    }


def load_parquet(files: list[Path]) -> list[dict[str, Any]]:
    """Hub parquet files (read in name order, rows in file order)."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for f in files:
        rows.extend(pq.read_table(f).to_pylist())
    return [_hub_row_to_item(i, row, str(files[0].parent)) for i, row in enumerate(rows)]


def load_saved_dataset(path: Path) -> list[dict[str, Any]]:
    """A `datasets.save_to_disk` folder (a Dataset, or a DatasetDict with a "test" split)."""
    import datasets

    ds = datasets.load_from_disk(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if "test" not in ds:
            raise TaskDataError(f"saved dataset {str(path)!r} has splits {list(ds)}, not 'test'; {HOW_TO}")
        ds = ds["test"]
    if "image" in ds.column_names:
        ds = ds.cast_column("image", datasets.Image(decode=False))  # decode per item, in requests()
    return [_hub_row_to_item(i, row, str(path)) for i, row in enumerate(ds)]


def _image_root(json_path: Path, records: list[dict[str, Any]]) -> Path:
    """The folder the json's `image_path`s are relative to: OCRBENCH_IMAGES, or the one beside it
    where most of the first images exist."""
    if os.environ.get(ENV_IMAGES):
        return Path(os.environ[ENV_IMAGES]).expanduser()
    here = json_path.parent
    candidates = [
        here,
        here / "OCRBench_Images",
        here.parent / "OCRBench_Images",
        here.parent,
        here.parent.parent / "OCRBench_Images",
    ]
    probe = [r["image_path"] for r in records[:10] if "image_path" in r]
    best = max(candidates, key=lambda c: sum((c / p).exists() for p in probe))
    if probe and not any((best / p).exists() for p in probe):
        raise TaskDataError(
            f"images of {str(json_path)!r} not found in any of {[str(c) for c in candidates]}; set {ENV_IMAGES} "
            "to the OCRBench_Images folder"
        )
    return best


def load_official_json(json_path: Path) -> list[dict[str, Any]]:
    """The official repo's OCRBench.json; `id` there is not unique across sources, so items are
    numbered in file order and the original id is kept as `source_id`."""
    try:
        records = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TaskDataError(f"cannot read {str(json_path)!r} as JSON ({exc}); {HOW_TO}") from exc
    root = _image_root(json_path, records)
    items = []
    for i, r in enumerate(records):
        missing = [k for k in ("dataset_name", "image_path", "question", "answers", "type") if k not in r]
        if missing:
            raise TaskDataError(f"{str(json_path)!r}: entry {i} lacks keys {missing}; expected the official schema")
        answers = r["answers"]
        items.append(
            {
                "id": f"ocrbench-{i:04d}",
                "source_id": r.get("id"),
                "dataset": str(r["dataset_name"]),
                "question": str(r["question"]),
                "question_type": str(r["type"]),
                "answers": [answers] if isinstance(answers, str) else [str(a) for a in answers],
                "image": {"path": str(root / r["image_path"])},
            }
        )
    return items


def open_image(item: dict[str, Any]):
    """Decode an item's image as an RGB PIL image; raises TaskDataError naming the item and file."""
    from PIL import Image, UnidentifiedImageError

    source = item["image"]
    where = source.get("path") or "embedded bytes"
    try:
        raw = source["bytes"] if "bytes" in source else Path(source["path"]).read_bytes()
        if not raw:
            raise ValueError("empty image data")
        with Image.open(io.BytesIO(raw)) as im:
            return im.convert("RGB")
    except (OSError, ValueError, UnidentifiedImageError) as exc:
        raise TaskDataError(f"item {item['id']}: unreadable image ({where}): {exc}") from exc


def fingerprint(items: list[dict[str, Any]]) -> str:
    """sha256 over every item's text fields and image content (bytes, or path + file size)."""
    h = hashlib.sha256()
    for item in items:
        fields = [item["id"], item["dataset"], item["question"], item["question_type"], *item["answers"]]
        h.update(json.dumps(fields, ensure_ascii=False).encode())
        source = item["image"]
        if "bytes" in source:
            h.update(hashlib.sha256(source["bytes"]).digest())
        else:
            p = Path(source["path"])
            h.update(f"{p.name}:{p.stat().st_size if p.exists() else -1}".encode())
    return h.hexdigest()
