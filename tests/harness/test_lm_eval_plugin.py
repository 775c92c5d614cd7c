"""lm-eval's own evaluator with the `oscar_eval` model (harness/lm_eval_plugin.py), offline, on local tasks.

- The command (`python -m harness.lm_eval_plugin`, a subprocess, as a user runs it) on LongBench-E rows of the sets
  pred.py prompts without a chat template, against `oscar-eval eval` (harness.run.evaluate) on the same rows with
  SmolLM2-135M and OScaR: the same prompts and the same predictions.
- loglikelihood (a multiple-choice task) and loglikelihood_rolling (a perplexity task) through simple_evaluate with
  the bf16 method on the tiny Qwen3-VL replica, against a float64 forward of the same weights with no cache, on
  lm-eval's rules (the continuation's tokens, the left cut to max_length + 1, the rolling windows); with OScaR, against
  the runner's per-token decode (Likelihood requests).
- generate_until's stop texts (lm-eval's cut) and the refusals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval is not installed (make setup installs it)")
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from harness import lm_eval_plugin, models, run  # noqa: E402
from tasks.contract import Likelihood, Prompt  # noqa: E402

TINY = "tiny-qwen3-vl"
MAX_LENGTH = 96  # the tiny replica's window for these tests: long texts take several rolling windows and left cuts
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def write_task(folder: Path, name: str, rows: list[dict], body: str) -> None:
    """A local lm-eval task: `rows` as a jsonl file and a YAML reading it (its datasets cache inside `folder`)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    header = (
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
        f"  cache_dir: {folder / 'hf-datasets'}\ntest_split: test\n"
    )
    (folder / f"{name}.yaml").write_text(header + body)


# ---- the command against `oscar-eval eval`, LongBench-E on SmolLM2-135M ------------------------------------------

TREC_CLASSES = ["Abbreviation", "Entity", "Description", "Human", "Location", "Number"]
LONGBENCH_ROWS = {
    "trec": [
        {
            "input": "Question: How far is the Moon from the Earth ?\nType:",
            "context": "Question: What is the capital of Peru ?\nType: Location\n"
            "Question: Who wrote Hamlet ?\nType: Human\nQuestion: How many legs does a spider have ?\nType: Number\n",
            "answers": ["Number"],
            "all_classes": TREC_CLASSES,
        },
    ],
    "triviaqa": [
        {
            "input": "Passage: The museum of Oslo was founded by Edvard Munch in 1890.\n"
            "Question: Who founded the museum of Oslo?\nAnswer:",
            "context": "Passage: The archive of Lyon was founded by Marie Curie.\n"
            "Question: Who founded the archive of Lyon?\nAnswer: Marie Curie",
            "answers": ["Edvard Munch"],
            "all_classes": None,
        }
    ],
    "lcc": [
        {
            "input": "",
            "context": "import os\n\n\ndef size(path):\n    return os.path.getsize(path)\n\n\n"
            'LIMITS = {\n    "low": 10,\n    "mid": 20,\n',
            "answers": ['    "high": 30,'],
            "all_classes": None,
        }
    ],
    "repobench-p": [
        {
            "input": "# Path: pkg/main.py\nfrom pkg.helpers import double\n\nVALUES = [double(1), double(2),",
            "context": "# Path: pkg/helpers.py\ndef double(x):\n    return 2 * x\n",
            "answers": [" double(3)]"],
            "all_classes": None,
        }
    ],
}
ANSWER_TOKENS = 8  # both sides cap the sets' budgets (64 / 32 tokens) here: CI has two cores


def write_longbench(folder: Path) -> Path:
    """LongBench-E's layout (data/<set>_e.jsonl) holding LONGBENCH_ROWS."""
    (folder / "data").mkdir(parents=True)
    for dataset, rows in LONGBENCH_ROWS.items():
        lines = []
        for k, row in enumerate(rows):
            words = len(row["input"].split()) + len(row["context"].split()) + len(row["answers"][0].split())
            full = {**row, "length": words, "dataset": f"{dataset}_e", "language": "en", "_id": f"{dataset}-{k}"}
            lines.append(json.dumps(full) + "\n")
        (folder / "data" / f"{dataset}_e.jsonl").write_text("".join(lines))
    return folder


SLOW = os.environ.get("OSCAR_SLOW_TESTS") == "1"
COMMAND_MODELS = [
    TINY,  # random weights: the answers are noise, the same noise on both sides
    pytest.param(
        "smollm2-135m",  # real weights and BPE tokenizer, the text adapter
        marks=[
            pytest.mark.slow,
            pytest.mark.skipif(
                not SLOW, reason="loads a real GGUF twice (over a minute on 2 cores): OSCAR_SLOW_TESTS=1"
            ),
        ],
    ),
]


@pytest.mark.parametrize("model", COMMAND_MODELS)
def test_command_matches_oscar_eval_on_longbench_rows(tmp_path, model):
    from tasks.longbench_e import LongBenchETask

    task = LongBenchETask(datasets=tuple(LONGBENCH_ROWS), max_new_tokens=ANSWER_TOKENS)
    data = write_longbench(tmp_path / "longbench")
    adapter = models.load(model, device="cpu")
    out = str(tmp_path / "ours" / "{method}.json")
    ours = run.evaluate(model, "oscar", task=task, data=str(data), out=out, adapter=adapter)[0]
    assert ours["n_errors"] == 0
    items = task.load(str(data))
    assert [s["id"] for s in ours["samples"]] == [item["id"] for item in items]
    # the sets pred.py prompts without the chat template: lm-eval's context is the filled template itself
    rows = [{"prompt": task.prompt_text(item), "answer": item["answers"][0]} for item in items]
    body = (
        'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
        f"generation_kwargs:\n  until: []\n  max_gen_toks: {ANSWER_TOKENS}\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1\n"
    )
    write_task(tmp_path / "tasks", "longbench_rows", rows, body)
    command = [sys.executable, "-m", "harness.lm_eval_plugin", "--model", "oscar_eval"]
    command += ["--model_args", f"model={model},quant=oscar", "--device", "cpu", "--tasks", "longbench_rows"]
    command += ["--include_path", str(tmp_path / "tasks"), "--output_path", str(tmp_path / "out"), "--log_samples"]
    env = {**os.environ, **OFFLINE, "HF_DATASETS_CACHE": str(tmp_path / "hf-datasets")}
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    results = list((tmp_path / "out").rglob("results_*.json"))
    assert proc.returncode == 0 and results, f"lm-eval failed (exit {proc.returncode}):\n{log[-4000:]}"
    assert "lm-eval tokens into" not in log, log[-4000:]  # the plugin's warning: the prompt's tokens are not lm-eval's
    samples = [json.loads(line) for p in (tmp_path / "out").rglob("samples_*.jsonl") for line in p.open()]
    samples.sort(key=lambda s: s["doc_id"])
    assert [s["arguments"]["gen_args_0"]["arg_0"] for s in samples] == [r["prompt"] for r in rows]
    theirs = [s["resps"][0][0] for s in samples]
    # lm-eval's answer is the new tokens' text (lm-eval's hf model's decode); oscar-eval's record holds the same
    # tokens, and its prediction is their text as the adapter decodes it (a multimodal adapter strips it)
    tok = adapter.tokenizer
    assert theirs == [tok.decode(s["tokens"], skip_special_tokens=True) for s in ours["samples"]]
    stripped = model == TINY  # the multimodal adapter's decode strips the text
    assert [t.strip() if stripped else t for t in theirs] == [s["prediction"] for s in ours["samples"]]
    assert any(t.strip() for t in theirs), "every answer is empty: the comparison would show nothing"
    config = json.loads(results[0].read_text())["config"]["oscar_eval"]
    assert config["model"] == model and config["method"]["method"] == "oscar"


# ---- loglikelihood and loglikelihood_rolling against float64 ------------------------------------------------------


@pytest.fixture(scope="module")
def bf16_lm():
    return lm_eval_plugin.OscarEvalLM(model=TINY, quant="bf16", device="cpu", max_length=MAX_LENGTH, batch_size=2)


@pytest.fixture(scope="module")
def reference():
    """The replica's weights in float64, run without a cache."""
    return models.load(TINY, device="cpu").model.double().eval()


def reference_score(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """(log-probability, every token the argmax) of `continuation` after `context`, lm-eval's left cut to
    MAX_LENGTH + 1 tokens applied, in one float64 forward."""
    ids = (context + continuation)[-(MAX_LENGTH + 1) :]
    start = len(ids) - len(continuation)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0, start - 1 :].double()
    logp = torch.log_softmax(logits, -1)
    target = torch.tensor(continuation)
    return float(logp.gather(-1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())


def greedy_choice(model, tokenizer, contexts: list[str]) -> tuple[str, str]:
    """(context, the replica's greedy next character after it): the first context whose argmax is a printable ASCII
    byte, so the choice's text is that one token."""
    for context in contexts:
        ids = tokenizer.encode(context)
        with torch.no_grad():
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        text = tokenizer.decode([token])
        if tokenizer.encode(context + text)[len(ids) :] == [token] and text.isprintable() and text.isascii():
            return context, text
    raise AssertionError("no context among the candidates has a printable greedy next character")


def test_loglikelihood_and_rolling_match_float64(tmp_path, bf16_lm, reference):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tok = bf16_lm.tokenizer
    prose = "The quick brown fox jumps over the lazy dog near the river bank."
    greedy_context, greedy_text = greedy_choice(reference, tok, [prose[:n] for n in range(20, 60)])
    mc_rows = [
        {"context": "Water boils at", "choices": ["100", "900", "abc"], "gold": 0},  # one length: batched together
        {"context": prose * 4, "choices": ["yes", "no, never"], "gold": 1},  # longer than max_length: cut on the left
        {"context": greedy_context, "choices": [greedy_text, "#"], "gold": 0},  # is_greedy true and false
    ]
    mc = (
        'output_type: multiple_choice\ndoc_to_text: "{{context}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{gold}}"\ntarget_delimiter: ""\nmetric_list:\n  - metric: acc\nmetadata:\n  version: 1\n'
    )
    texts = [{"text": prose * 6}, {"text": "Short one."}]  # several windows of MAX_LENGTH; one window
    rolling = (
        'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\nmetadata:\n  version: 1\n"
    )
    write_task(tmp_path, "oscar_mc", mc_rows, mc)
    write_task(tmp_path, "oscar_rolling", texts, rolling)
    out = simple_evaluate(
        model=bf16_lm,
        tasks=["oscar_mc", "oscar_rolling"],
        task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True,
    )
    greedy_seen = set()
    for sample in out["samples"]["oscar_mc"]:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            ctx = tok.encode(context)  # lm-eval's pair: the continuation is the tail of the whole text's tokens
            expected = reference_score(reference, ctx, tok.encode(context + continuation)[len(ctx) :])
            assert resp[0][0] == pytest.approx(expected[0], rel=1e-6, abs=1e-4), (context[:30], continuation)
            assert resp[0][1] == expected[1]
            greedy_seen.add(resp[0][1])
    assert greedy_seen == {True, False}
    for sample in out["samples"]["oscar_rolling"]:
        tokens = tok.encode(sample["doc"]["text"])
        windows = list(
            map(make_disjoint_window, get_rolling_token_windows(tokens, bf16_lm.prefix_token_id, MAX_LENGTH, 1))
        )
        assert sum(len(c) for _, c in windows) == len(tokens)  # every token scored once
        expected = sum(reference_score(reference, c, x)[0] for c, x in windows)
        assert sample["resps"][0][0] == pytest.approx(expected, rel=1e-6, abs=1e-4)
    assert len(list(get_rolling_token_windows(tok.encode(texts[0]["text"]), 0, MAX_LENGTH, 1))) > 2


def test_oscar_loglikelihood_is_the_runners_per_token_decode(bf16_lm):
    """Scored tokens share forwards only where OScaR declares that exact: the sum equals the runner's Likelihood, fed
    one decode step at a time, over a context past OScaR's full-precision window (the replica's tokens are bytes, so
    the target alone tokenizes as it does after the context)."""
    lm = lm_eval_plugin.OscarEvalLM(model=TINY, quant="oscar", device="cpu")
    context = "Packed two-bit keys hold the long context of this sentence. " * 4 + "Then"  # no trailing space:
    # lm-eval would move it into the continuation
    continuations = [" and the window keeps the recent tokens in full precision" * 3, " end."]
    requests = [Instance("loglikelihood", {}, (context, c), i) for i, c in enumerate(continuations)]
    got = lm.loglikelihood(requests, disable_tqdm=True)
    stepped = lm.runner.run([Likelihood(Prompt(context, chat=False), c) for c in continuations])
    assert len(bf16_lm.tok_encode(context)) > lm.method.residual_length
    for (logprob, _), response in zip(got, stepped):
        assert response.error is None
        assert logprob == pytest.approx(-response.nll_sum, rel=1e-6)
    plain = lm_eval_plugin.OscarEvalLM(model=TINY, quant="bf16", device="cpu").loglikelihood(requests, True)
    assert abs(got[0][0] - plain[0][0]) > 1e-3  # the 2-bit cache is what answered


# ---- generate_until ------------------------------------------------------------------------------------------------


def ask(lm, context: str, until: list[str], tokens: int = 24) -> str:
    args = {"until": until, "max_gen_toks": tokens, "do_sample": False}
    return lm.generate_until([Instance("generate_until", {}, (context, args), 0, task_name="t")], True)[0]


def test_generate_until_cuts_at_the_first_stop_text(bf16_lm):
    context = "Once upon a time"
    whole = ask(bf16_lm, context, [])
    assert len(whole) > 8, whole
    one, many = whole[len(whole) // 2], whole[3:6]  # a one-token stop (generation ends there) and a longer one
    assert lm_eval_plugin.single_token_stops(bf16_lm.tokenizer, [one, many]) == (one,)
    assert ask(bf16_lm, context, [one]) == whole.split(one)[0]
    assert ask(bf16_lm, context, [many]) == whole.split(many)[0]
    assert ask(bf16_lm, context, [many, one]) == whole.split(many)[0].split(one)[0]


def test_refusals(bf16_lm):
    with pytest.raises(ValueError, match="do_sample"):
        bf16_lm.generate_until([Instance("generate_until", {}, ("Hi", {"do_sample": True, "temperature": 1.0}), 0)])
    with pytest.raises(TypeError, match="unknown model_args qaunt"):
        lm_eval_plugin.OscarEvalLM(model=TINY, qaunt="oscar")
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        lm_eval_plugin.OscarEvalLM(model=TINY, batch_size="auto")
    with pytest.raises(ValueError, match="longer than max_length"):
        lm_eval_plugin.fit_window([1, 2], [3] * (MAX_LENGTH + 1), MAX_LENGTH)
