"""Perplexity windows cut in the model's own tokens (tasks/ppl, harness/scoring.request_ids): window i is tokens
[i * L, (i + 1) * L) of the whole stream, every window exactly L tokens; how many a text holds is counted at
CHARS_PER_TOKEN characters a token, which every registered tokenizer holds (SmolLM2 here; Qwen2.5 and Gemma-3,
whose tokenizers take a minute to load, with OSCAR_SLOW_TESTS=1). A text with fewer tokens than the count promises
fails its last windows with the fix named, and the run goes on."""

from __future__ import annotations

import os

import pytest
import torch

import tasks.ppl as ppl
from harness import run
from harness.runner import _leading_bos
from harness.scoring import request_ids, stream_ids
from tasks.base import TaskDataError
from tasks.ppl import TASK, TASK_LONG, PerplexityTask
from tests.harness.test_kl import tiny_adapter

SLOW = os.environ.get("OSCAR_SLOW_TESTS") == "1"


def tokenizer_of(name: str):
    """A registered text model's tokenizer from its packaged GGUF, without its weights (skipped when not installed)."""
    from transformers import AutoTokenizer

    from harness.models import get_spec
    from harness.models.text import gguf_parts
    from harness.models.text.adapter import weights_source

    if gguf_parts.missing_parts(name):
        pytest.skip(f"{name}: {gguf_parts.PACKAGED[name].install_command(gguf_parts.missing_parts(name))}")
    src, _, packaged = weights_source(get_spec(name))
    if packaged:
        gguf_parts.ensure(name)
    return AutoTokenizer.from_pretrained(**src)


def check_windows(tokenizer, task: PerplexityTask) -> None:
    items = task.load(None, None)
    text = task.stream(task.sources(None))
    stream = stream_ids(tokenizer, text)
    size = task.context + task.continuation
    assert len(items) == len(text) // task.window_chars >= 1
    assert len(items) * size <= len(stream), f"{len(stream)} tokens do not hold {len(items)} windows of {size}"
    for i, item in enumerate(items):
        ids, _ = request_ids(tokenizer, task.requests(item)[0])
        assert ids.shape == (1, size) and item["id"] == f"tokens@{i * size}"
        assert torch.equal(ids[0], stream[i * size : (i + 1) * size])


@pytest.mark.parametrize("task", [TASK, TASK_LONG], ids=["ppl", "ppl-4k"])
def test_smollm2_holds_every_window_and_each_is_exact(task):
    check_windows(tokenizer_of("smollm2-135m"), task)


@pytest.mark.skipif(not SLOW, reason="loads two GGUF tokenizers (about a minute on 2 cores): OSCAR_SLOW_TESTS=1")
@pytest.mark.parametrize("name, bos", [("qwen2.5-0.5b", None), ("gemma-3-270m", 2)])
def test_qwen_and_gemma_hold_every_window(name, bos):
    tokenizer = tokenizer_of(name)
    for task in (TASK, TASK_LONG):
        check_windows(tokenizer, task)
    assert _leading_bos(tokenizer) == bos  # Gemma's <bos> goes before each window, as context


def test_the_stream_is_tokenized_once():
    tokenizer = tiny_adapter().tokenizer
    text = "one stream of text " * 20
    assert stream_ids(tokenizer, text) is stream_ids(tokenizer, text)
    assert stream_ids(tokenizer, text + ".") is not stream_ids(tokenizer, text)


def test_items_and_fingerprint(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("word " * 400, encoding="utf-8")  # 1,999 characters once stripped
    task = PerplexityTask(context=30, continuation=10)  # 40 tokens, 200 characters a window at 5.0
    items = task.load(str(path), None)
    assert [i["id"] for i in items] == [f"tokens@{40 * i}" for i in range(9)]
    fingerprints = {task.data_fingerprint(items), task.data_fingerprint(task.load(str(path), 3))}
    path.write_text("other " * 400, encoding="utf-8")
    fingerprints.add(task.data_fingerprint(task.load(str(path), None)))
    assert len(fingerprints) == 3
    path.write_text("short", encoding="utf-8")
    with pytest.raises(TaskDataError, match="holds no window of 40 tokens"):
        task.load(str(path), None)


def test_a_text_short_of_tokens_fails_its_last_windows_with_the_fix(tmp_path, monkeypatch):
    """At 0.5 characters a token the count promises twice the windows the byte tokens hold: those past the end fail,
    each with the fix, and the others are scored."""
    path = tmp_path / "text.txt"
    path.write_text(("The quick brown fox jumps over the lazy dog. " * 14)[:600], encoding="utf-8")
    monkeypatch.setattr(ppl, "CHARS_PER_TOKEN", 0.5)
    task = PerplexityTask(context=30, continuation=10, batch=4)
    [result] = run.evaluate(
        "smollm2-135m",
        "bf16",
        task=task,
        data=str(path),
        out=str(tmp_path / "{method}.json"),
        adapter=tiny_adapter(),
    )
    failed = [s for s in result["samples"] if "error" in s]
    assert len(result["samples"]) == 30 and len(failed) == 15 and result["n_errors"] == 15
    assert failed[0]["id"] == "tokens@600" and "window 15 of a stream of 600 tokens" in failed[0]["error"]
    assert failed[0]["error"].endswith("raise tasks.ppl.CHARS_PER_TOKEN")
    assert result["metrics"]["ppl"]["value"] > 1 and result["metrics"]["top1"]["value"] == 1.0
