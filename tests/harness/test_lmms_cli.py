"""The `lmms-eval` command itself (a subprocess, as a user runs it) on the shipped tasks over local
copies of the generated sets, against `oscar-eval eval` (harness.run.evaluate, in process) on the same
tiny replica, method and items: the same answers, the same per-item scores, the same totals."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lmms_eval", reason="lmms-eval is not installed (make setup installs it)")
from harness import lmms_tasks, run  # noqa: E402
from tasks.mmau_pro import MMAUProTask  # noqa: E402
from tasks.mmau_pro import generate as mmau_generate  # noqa: E402
from tasks.ocrbench import OCRBenchTask  # noqa: E402
from tasks.ocrbench import generate as ocr_generate  # noqa: E402

LMMS_EVAL = Path(sys.executable).parent / "lmms-eval"
# Answer length on both sides (the tasks' own 128 is what a real run uses): the replicas' answers are
# noise either way, and CI has two cores.
TOKENS = 24
OCR_CATEGORIES = (
    "Regular Text Recognition",
    "Handwritten Mathematical Expression Recognition",
    "Scene Text-centric VQA",
    "Key Information Extraction",
)
OFFLINE_SCORERS = {"MMAU_PRO_JUDGE": "smollm2-135m", "MMAU_PRO_EMBEDDER": "all-MiniLM-L6-v2"}


def lmms_eval(args: list[str], out: Path, env: dict[str, str]) -> tuple[dict, list[dict], str]:
    """Run `lmms-eval <args>`; return (its results JSON, its logged samples by doc id, its stdout)."""
    assert LMMS_EVAL.exists(), f"{LMMS_EVAL} missing: lmms-eval is imported but its command is not installed"
    command = [
        str(LMMS_EVAL),
        *args,
        "--output_path",
        str(out),
        "--log_samples",
        "--gen_kwargs",
        f"max_new_tokens={TOKENS}",
    ]
    proc = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert "Failed to load model entry-point" not in log, log[-4000:]
    results = list(out.rglob("*_results.json"))
    assert proc.returncode == 0 and results, f"lmms-eval failed (exit {proc.returncode}):\n{log[-4000:]}"
    samples = [json.loads(line) for path in out.rglob("*_samples_*.jsonl") for line in path.read_text().splitlines()]
    return json.loads(results[0].read_text()), sorted(samples, key=lambda s: s["doc_id"]), proc.stdout


def offline_env(tmp_path: Path) -> dict[str, str]:
    """No hub access, and the `datasets` cache of the local parquet kept inside the test's folder."""
    return {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets")}


def table_row(stdout: str, task: str, metric: str) -> str:
    """The value column of lmms-eval's printed results table for one metric (pytablewriter's markdown)."""
    row = next(line for line in stdout.splitlines() if line.startswith(f"|{task}") and f"|{metric} " in line)
    return [cell.strip() for cell in row.split("|")][6]


# ---- OCRBench on tiny-qwen3-vl ----------------------------------------------------------------------------


def write_ocr_set(source: Path, records: list[dict], target: Path) -> Path:
    """An official-layout OCRBench folder (OCRBench.json + the images of `records`)."""
    for r in records:
        (target / "OCRBench_Images" / r["image_path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / "OCRBench_Images" / r["image_path"], target / "OCRBench_Images" / r["image_path"])
    (target / "OCRBench.json").write_text(json.dumps(records))
    return target


def piece_of(text: str) -> str | None:
    """Three characters of `text` with no whitespace: a substring under either official normalization."""
    match = re.search(r"\S{3}", text)
    return match.group(0) if match else None


def evaluate_ocr(data: Path, out: Path) -> dict:
    task = OCRBenchTask(max_new_tokens=TOKENS)
    return run.evaluate("tiny-qwen3-vl", "oscar", task=task, data=str(data), out=str(out / "{method}.json"))[0]


def test_ocrbench_lmms_eval_command_matches_oscar_eval(tmp_path):
    source = ocr_generate.ensure_generated(tmp_path / "cache")
    records = json.loads((source / "OCRBench.json").read_text())
    chosen = [next(r for r in records if r["type"] == c) for c in OCR_CATEGORIES]
    # The replica's answers are noise, so every score would be 0 and agree trivially. A first run gives
    # its answers; items 0 and 2 then also accept a piece of their own answer, so the set has hits and misses.
    first = evaluate_ocr(write_ocr_set(source, chosen, tmp_path / "plain"), tmp_path / "first")
    predictions = [s["prediction"] for s in first["samples"]]
    pieces = {k: piece_of(predictions[k]) for k in (0, 2)}
    assert all(pieces.values()), f"no 3-character piece in the replica's answers {predictions}"
    listed = [r["answers"] if isinstance(r["answers"], list) else [r["answers"]] for r in chosen]  # str or list
    hits = [dict(r, answers=listed[k] + [pieces[k]]) if k in pieces else r for k, r in enumerate(chosen)]
    data = write_ocr_set(source, hits, tmp_path / "hits")

    ours = evaluate_ocr(data, tmp_path / "ours")
    assert ours["n_errors"] == 0 and [s["prediction"] for s in ours["samples"]] == predictions
    total = ours["metrics"]["total"]["value"]
    assert 1 <= total < len(hits)

    yaml_path, env = lmms_tasks.write_local_task("ocrbench", str(data), tmp_path / "tasks")
    results, samples, stdout = lmms_eval(
        [
            "--model",
            "oscar_qwen3_vl",
            "--model_args",
            "model=tiny-qwen3-vl,quant=oscar",
            "--tasks",
            "oscar_ocrbench_local",
            "--include_path",
            str(yaml_path.parent),
        ],
        tmp_path / "lmms",
        {**offline_env(tmp_path), **env},
    )
    theirs = results["results"]["oscar_ocrbench_local"]
    assert theirs["ocrbench_total,none"] == total
    assert theirs["ocrbench_accuracy,none"] == ours["metrics"]["accuracy"]["value"]
    assert [s["ocrbench_total"]["prediction"] for s in samples] == predictions
    assert [s["ocrbench_total"]["scores"] for s in samples] == [s["scores"] for s in ours["samples"]]
    assert table_row(stdout, "oscar_ocrbench_local", "ocrbench_total") == str(total)
    assert results["config"]["model_backend"] == "harness.lmms.OscarQwen3VL (simple)"


# ---- MMAU-Pro on tiny-qwen3-omni --------------------------------------------------------------------------


def test_mmau_pro_lmms_eval_command_matches_oscar_eval(tmp_path, monkeypatch):
    """The first five generated items: one per category (open-ended through the judge, AIF, three
    closed-form through the embedder), one of them with two clips."""
    folder = mmau_generate.ensure_generated(tmp_path / "cache")
    for key, value in OFFLINE_SCORERS.items():
        monkeypatch.setenv(key, value)
    task = MMAUProTask(max_new_tokens=TOKENS)  # judge and embedder from the variables above, as lmms-eval's side
    ours = run.evaluate(
        "tiny-qwen3-omni",
        "kivi",
        task=task,
        data=str(folder),
        limit=5,
        out=str(tmp_path / "ours" / "{method}.json"),
    )[0]
    assert ours["n_errors"] == 0 and len(ours["categories"]) == 5
    assert ours["metrics"]["open_ended"]["value"] > 0  # judged: every rating is 1-5

    yaml_path, env = lmms_tasks.write_local_task("mmau-pro", str(folder), tmp_path / "tasks")
    results, samples, stdout = lmms_eval(
        [
            "--model",
            "oscar_qwen3_omni",
            "--model_args",
            "model=tiny-qwen3-omni,quant=kivi",
            "--tasks",
            "mmau_pro_local",
            "--include_path",
            str(yaml_path.parent),
            "--limit",
            "5",
            "--process_docs_parallel",
            "1",
        ],
        tmp_path / "lmms",
        {**offline_env(tmp_path), **env, **OFFLINE_SCORERS},
    )
    theirs = results["results"]["mmau_pro_local"]
    metrics = [m["metric"] for m in results["configs"]["mmau_pro_local"]["metric_list"]]
    assert {"open_ended", "good_rate", "aif", "closed", "overall"} <= set(metrics)
    for metric in metrics:
        assert theirs[f"{metric},none"] == ours["metrics"][metric]["value"], metric
    records = [s["overall"] for s in samples]
    assert [r["id"] for r in records] == [s["id"] for s in ours["samples"]]
    assert [r["prediction"] for r in records] == [s["prediction"] for s in ours["samples"]]
    assert [r["scores"] for r in records] == [s["scores"] for s in ours["samples"]]
    assert {r["scorer"].get("judge") for r in records} >= {"smollm2-135m"}
    shown = float(table_row(stdout, "mmau_pro_local", "overall"))
    assert shown == pytest.approx(ours["metrics"]["overall"]["value"], abs=1e-4)
