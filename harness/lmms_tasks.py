"""The shipped lmms-eval tasks (tasks/lmms) on local data: one folder lmms-eval reads with --include_path.

    python -m harness.lmms_tasks ocrbench --data generated --out lmms_local
    lmms-eval --model oscar_qwen3_vl --model_args model=tiny-qwen3-vl,quant=oscar \
        --tasks oscar_ocrbench_local --include_path lmms_local --output_path out

The shipped YAMLs name hub ids, which lmms-eval (through `datasets.load_dataset`) opens only online or
from the `datasets` cache of an earlier online load. This writes `<out>/<name>.yaml`, which
`include`s the shipped YAML (prompt, decoding, scoring unchanged) and reads a local parquet instead:

- ocrbench: whatever `oscar-eval eval --task ocrbench --data X` reads (the official OCRBench.json with
  its images, hub parquet files, a `save_to_disk` folder, "generated"; without --data: OCRBENCH_PATH,
  then the HF hub cache) is written as `<out>/<name>.parquet` in the hub schema with the images
  embedded, items in the order oscar-eval loads them, so `--limit N` picks the same items on both sides.
- mmau-pro: the YAML reads the folder's own test.parquet (official or generated); the audio stays where
  it is and the task finds it through MMAU_PRO_PATH, which the command prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

import tasks as tasks_pkg
from tasks.base import TaskDataError

SHIPPED = Path(tasks_pkg.__file__).resolve().parent / "lmms"
YAMLS = {
    "ocrbench": SHIPPED / "oscar_ocrbench" / "oscar_ocrbench.yaml",
    "mmau-pro": SHIPPED / "mmau_pro" / "mmau_pro.yaml",
}
DEFAULT_NAMES = {"ocrbench": "oscar_ocrbench_local", "mmau-pro": "mmau_pro_local"}


def write_task_yaml(task: str, name: str, parquet: Path, out: Path) -> Path:
    """<out>/<name>.yaml: the shipped task of `task` reading `parquet` as its test split."""
    shipped = YAMLS[task]
    if not shipped.exists():
        raise FileNotFoundError(
            f"{shipped} is missing: run from a checkout of oscar-eval (pip install -e .), "
            "whose tasks/lmms folder holds the shipped YAMLs"
        )
    config = {
        "include": str(shipped),
        "task": name,
        "dataset_path": "parquet",
        "dataset_kwargs": {"data_files": {"test": str(Path(parquet).resolve())}},
    }
    path = out / f"{name}.yaml"
    header = f"# {task} on local data, written by `python -m harness.lmms_tasks` (docs/LMMS_EVAL.md)\n"
    path.write_text(header + yaml.safe_dump(config, sort_keys=False))
    return path


def ocrbench_parquet(data: str | None, target: Path) -> int:
    """Write the OCRBench items oscar-eval loads from `data` as a hub-schema parquet; returns the count.

    Columns: dataset, question, question_type (str), answer (list[str]), image (datasets Image feature,
    PNG/JPEG bytes as in the source), so lmms-eval decodes the images as it does the hub files.
    """
    import datasets

    from tasks.ocrbench import data as ocr_data

    items = ocr_data.load_items(data)
    rows = {"dataset": [], "question": [], "question_type": [], "answer": [], "image": []}
    for item in items:
        source = item["image"]
        raw = source["bytes"] if "bytes" in source else _read(Path(source["path"]), item["id"])
        rows["dataset"].append(item["dataset"])
        rows["question"].append(item["question"])
        rows["question_type"].append(item["question_type"])
        rows["answer"].append(item["answers"])
        rows["image"].append({"bytes": raw, "path": None})
    features = datasets.Features(
        {
            "dataset": datasets.Value("string"),
            "question": datasets.Value("string"),
            "question_type": datasets.Value("string"),
            "answer": datasets.Sequence(datasets.Value("string")),
            "image": datasets.Image(),
        }
    )
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(target))
    return len(items)


def _read(path: Path, item_id: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TaskDataError(f"item {item_id}: image {str(path)!r} cannot be read ({exc})") from exc


def mmau_pro_folder(data: str | None) -> Path:
    """The folder holding MMAU-Pro's test.parquet (and its audio) for `data`, checked to load."""
    from tasks.common import hub_snapshot
    from tasks.mmau_pro import data as mmau_data
    from tasks.mmau_pro.generate import ensure_generated

    if data == "generated":
        folder = ensure_generated()
    elif data is not None:
        folder = Path(data).expanduser()
        folder = folder.parent if folder.suffix == ".parquet" else folder
    elif os.environ.get(mmau_data.ENV_PATH):
        folder = Path(os.environ[mmau_data.ENV_PATH]).expanduser()
    else:
        folder = hub_snapshot(mmau_data.HUB_ID)
        if folder is None:
            raise TaskDataError(
                f"MMAU-Pro data not found: {mmau_data.ENV_PATH} is unset and {mmau_data.HUB_ID} "
                f"is not in the HF cache; {mmau_data.HOW_TO}"
            )
    mmau_data.load_path(folder)  # the schema check oscar-eval makes, before lmms-eval starts
    return folder.resolve()


def write_local_task(task: str, data: str | None, out: Path, name: str | None = None) -> tuple[Path, dict[str, str]]:
    """Write the local task; returns (its YAML, environment variables the lmms-eval run needs)."""
    if task not in YAMLS:
        raise KeyError(f"unknown task {task!r}; the shipped lmms-eval tasks are {', '.join(YAMLS)}")
    name = name or DEFAULT_NAMES[task]
    out.mkdir(parents=True, exist_ok=True)
    if task == "ocrbench":
        parquet = out / f"{name}.parquet"
        ocrbench_parquet(data, parquet)
        return write_task_yaml(task, name, parquet, out), {}
    folder = mmau_pro_folder(data)
    return write_task_yaml(task, name, folder / "test.parquet", out), {"MMAU_PRO_PATH": str(folder)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.lmms_tasks", description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(YAMLS))
    parser.add_argument(
        "--data",
        default=None,
        help="a path, 'generated', or nothing for the official data "
        "(OCRBENCH_PATH / MMAU_PRO_PATH, then the HF hub cache)",
    )
    parser.add_argument("--out", default="lmms_local", help="folder for the task YAML (and OCRBench's parquet)")
    parser.add_argument(
        "--name", default=None, help="lmms-eval task name (default: oscar_ocrbench_local / mmau_pro_local)"
    )
    args = parser.parse_args(argv)
    import datasets

    datasets.disable_progress_bars()  # one parquet write: the bar is noise
    try:
        path, env = write_local_task(args.task, args.data, Path(args.out), args.name)
    except (KeyError, OSError, TaskDataError) as err:
        print(f"harness.lmms_tasks: error: {err}", file=sys.stderr)
        return 2
    exports = "".join(f"export {k}={v}\n" for k, v in env.items())
    name = args.name or DEFAULT_NAMES[args.task]
    print(
        f"wrote {path}\n{exports}lmms-eval --model <oscar model id> --model_args model=<name>,quant=<method> "
        f"--tasks {name} --include_path {path.parent.resolve()} --output_path <folder>"
        + (" --process_docs_parallel 1" if args.task == "mmau-pro" else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
