"""Data-parallel evaluation (harness/distributed.py): shards, per-rank progress files, the merge, resume.

The end-to-end test starts this file under torchrun (2 processes, gloo, CPU) on tiny-llava and the generated
OCRBench set: a first run in which rank 1 kills itself after its first item, then a rerun that resumes; the
merged result must equal a one-process run's, item for item. Run as a script, this file is that entry point; the
kill is armed there, in the ranks this test starts (`_arm_kill`), never in the harness.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import distributed as D
from harness import progress as PF
from harness import results as R

LIMIT, NEW_TOKENS = 5, 4  # five items: shards of 3 and 2; a few tokens keep the CPU run short
TIMING = ("loop_s", "wall_s", "prefill_s", "decode_s", "ttft_s", "tpot_s")


def _evaluate(out: str):
    from harness import run
    from tasks.ocrbench import OCRBenchTask

    return run.evaluate(
        "tiny-llava",
        "oscar",
        task=OCRBenchTask(max_new_tokens=NEW_TOKENS),
        data="generated",
        limit=LIMIT,
        out=out,
        device="cpu",
    )  # the CPU on GPU machines too


def _recorded(progress_file: Path) -> list[dict]:
    """The item records of a progress file (JSON lines: a header, then {"record": ...} per item)."""
    lines = [json.loads(line) for line in progress_file.read_text().splitlines() if line.strip()]
    return [line["record"] for line in lines if "record" in line]


def _without_timing(record: dict) -> dict:
    out = {k: v for k, v in record.items() if k not in TIMING}
    if isinstance(out.get("cost"), dict):
        out["cost"] = {k: v for k, v in out["cost"].items() if k not in TIMING}
    return out


# ---------------------------------------------------------------- ranks, devices, shards


def test_ranks_come_from_torchrun_environment():
    assert D.ranks_from_env({}) == D.Ranks(0, 1, 0) and not D.Ranks().parallel
    ranks = D.ranks_from_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert ranks == D.Ranks(3, 4, 1) and ranks.parallel and not ranks.main
    for bad in ({"RANK": "2", "WORLD_SIZE": "2"}, {"WORLD_SIZE": "two"}, {"WORLD_SIZE": "0"}):
        with pytest.raises(ValueError, match="torchrun"):
            D.ranks_from_env(bad)


def test_each_rank_takes_its_own_device():
    assert D.rank_device(None, 1, cuda=True) == "cuda:1" and D.rank_device("cuda", 0, cuda=True) == "cuda:0"
    assert D.rank_device(None, 1, cuda=False) == "cpu" and D.rank_device("cpu", 1, cuda=True) == "cpu"
    with pytest.raises(ValueError, match="every rank would use it"):
        D.rank_device("cuda:0", 1, cuda=True)
    with pytest.raises(ValueError, match="device-map"):
        D.start(device_map="auto", environ={"RANK": "0", "WORLD_SIZE": "2"})


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_shards_cover_every_item_once(world):
    items = [{"id": i} for i in range(10)]
    shards = [D.shard(items, D.Ranks(r, world, r)) for r in range(world)]
    assert sorted(i["id"] for s in shards for i in s) == list(range(10))
    assert shards == [D.shard(items, D.Ranks(r, world, r)) for r in range(world)]  # the same on every run
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


# ---------------------------------------------------------------- progress files


def test_progress_files_are_named_per_rank(tmp_path):
    result = tmp_path / "oscar.json"
    assert PF.progress_path(result, 2).name == "oscar.rank2.partial.jsonl"
    for name in (
        "oscar.partial.jsonl",
        "oscar.rank10.partial.jsonl",
        "oscar.rank2.partial.jsonl",
        "oscar.rankx.partial.jsonl",
        "kivi.rank0.partial.jsonl",
    ):
        (tmp_path / name).write_text("")
    assert [p.name for p in PF.progress_paths(result)] == [
        "oscar.partial.jsonl",
        "oscar.rank2.partial.jsonl",
        "oscar.rank10.partial.jsonl",
    ]


def test_one_process_resumes_from_every_ranks_file(tmp_path):
    """A 2-rank run that died, rerun as one process: the records of both rank files count as done; new records
    go to the one-process file; a file from other settings is refused; --restart discards them all."""
    result, ident = tmp_path / "oscar.json", {"model": "m", "method": {"bits": 2}}
    for rank, ids in ((0, ["a", "c"]), (1, ["b"])):
        progress = PF.open_progress(PF.progress_path(result, rank), ident)
        for i in ids:
            progress.add({"id": i, "prediction": f"p-{i}"})
    progress = D.open_progress(result, ident, restart=False, ranks=D.Ranks())
    assert progress.done_ids == {"a", "b", "c"} and progress.path == PF.progress_path(result)
    progress.add({"id": "d", "prediction": "p-d"})
    assert PF.open_progress(PF.progress_path(result), ident).done_ids == {"d"}
    with pytest.raises(R.ResultFileError, match="--restart"):
        D.open_progress(result, {**ident, "method": {"bits": 3}}, restart=False, ranks=D.Ranks())
    fresh = D.open_progress(result, {**ident, "method": {"bits": 3}}, restart=True, ranks=D.Ranks())
    assert fresh.done_ids == set() and PF.progress_paths(result) == [PF.progress_path(result)]


def test_parallel_figures_are_recorded_and_valid():
    from tests.harness.test_results_factory import make_result

    result = make_result("oscar", [1, 0, 1, 1, 0])
    result["system"]["peak_memory"] = {"cpu_rss_bytes": 10, "cuda_bytes": None}
    figures = [
        {
            "device": "cuda:0",
            "gpu": "GPU A",
            "peak_memory": {"cpu_rss_bytes": 30, "cuda_bytes": 7},
            "items": 3,
            "loop_s": 3.0,
        },
        {
            "device": "cuda:1",
            "gpu": "GPU A",
            "peak_memory": {"cpu_rss_bytes": 20, "cuda_bytes": 9},
            "items": 2,
            "loop_s": 2.5,
        },
    ]
    D.record_parallel(result, figures)
    R.validate(result)
    system = result["system"]
    assert system["device"] == "cuda:0,cuda:1" and system["peak_memory"] == {"cpu_rss_bytes": 30, "cuda_bytes": 9}
    assert system["parallel"] == {
        "world_size": 2,
        "devices": ["cuda:0", "cuda:1"],
        "gpus": ["GPU A", "GPU A"],
        "shard_items": [3, 2],
        "wall_s": 3.0,
        "items_per_s": 5 / 3.0,
    }


# ---------------------------------------------------------------- two processes under torchrun


def _arm_kill(rank: int, after: int) -> None:
    """In a rank started by `_torchrun`: make rank `rank` kill itself (SIGKILL, as a crash or an OOM killer would)
    right after its progress file records its `after`-th item of the session."""
    if int(os.environ["RANK"]) != rank:
        return
    add, added = D.RankProgress.add, [0]

    def add_then_die(self, record):
        add(self, record)
        added[0] += 1
        if added[0] == after:
            os.kill(os.getpid(), signal.SIGKILL)

    D.RankProgress.add = add_then_die


def _torchrun(out: str, kill: tuple[int, int] | None) -> subprocess.CompletedProcess:
    """This file under torchrun, 2 ranks; `kill` = (rank, items): that rank dies after recording that many items."""
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    args = [str(n) for n in kill] if kill else []
    return subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", __file__, out, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_two_ranks_resume_a_killed_rank_and_merge_as_one_process(tmp_path):
    one = _evaluate(str(tmp_path / "one" / "{task}" / "{model}" / "{method}.json"))[0]
    out = str(tmp_path / "two" / "{task}" / "{model}" / "{method}.json")
    path = tmp_path / "two" / "ocrbench.generated" / "tiny-llava" / f"oscar.first{LIMIT}.json"  # a partial run

    killed = _torchrun(out, kill=(1, 1))  # rank 1 dies after its first item; torchrun stops rank 0
    assert killed.returncode != 0 and not path.exists(), killed.stderr[-3000:]
    files = PF.progress_paths(path)
    assert PF.progress_path(path, 1) in files and PF.progress_path(path) not in files
    assert len(_recorded(PF.progress_path(path, 1))) == 1
    before = {str(r["id"]): r for f in files for r in _recorded(f)}

    resumed = _torchrun(out, kill=None)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    two = R.read_result(path)
    assert PF.progress_paths(path) == []  # rank 0 removed every progress file
    by_id = {s["id"]: s for s in two["samples"]}
    assert all(by_id[i] == r for i, r in before.items())  # recorded before the kill, reused as they were

    assert [s["id"] for s in two["samples"]] == [s["id"] for s in one["samples"]]
    assert [s["prediction"] for s in two["samples"]] == [s["prediction"] for s in one["samples"]]
    assert [_without_timing(s) for s in two["samples"]] == [_without_timing(s) for s in one["samples"]]
    assert two["metrics"] == one["metrics"] and two["categories"] == one["categories"]
    assert two["task"] == one["task"]
    parallel = two["system"]["parallel"]
    assert parallel["world_size"] == 2 and parallel["devices"] == ["cpu", "cpu"] and parallel["shard_items"] == [3, 2]
    assert parallel["items_per_s"] > two["system"]["items_per_s"]  # two ranks side by side beat the summed clock


# ---------------------------------------------------------------- one model over two GPUs (device_map)


def _split_and_single(layers: int = 4):
    """A seeded bf16 Qwen3 text model twice: spread over cuda:0 / cuda:1 (half the layers each, as device_map does)
    and whole on cuda:0."""
    import copy

    import torch
    import transformers
    from accelerate import dispatch_model

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=2048,
    )
    model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    single = copy.deepcopy(model).to("cuda:0")
    device_map = {
        "model.embed_tokens": 0,
        "model.rotary_emb": 0,
        "model.norm": 1,
        "lm_head": 1,
        **{f"model.layers.{i}": int(i >= layers // 2) for i in range(layers)},
    }
    return dispatch_model(model, device_map=device_map), single, device_map


def _state_devices(layer) -> set:
    from quant.packed import QTensor

    found = set()
    for name in layer._state_names():
        value = getattr(layer, name)
        tensors = [value.codes, value.scale, value.zero] if isinstance(value, QTensor) else [value]
        found.update(t.device for t in tensors)
    return found


def _greedy(model, method: str, kernels, prompt, new: int):
    import torch

    import quant
    from harness.models import traits_of
    from harness.models.synthetic import byte_tokenizer
    from quant.engine import decode_graphs, graphs_enabled

    tokenizer = byte_tokenizer("<|im_end|>", "<|endoftext|>", {})  # RotateKV calibrates on text
    with quant.prepare_model(model, quant.get_method(method), kernels, traits_of("qwen3-8b")) as prepared:
        cache = prepared.make_cache(tokenizer=tokenizer)
        graphed = graphs_enabled(model, cache)
        with torch.inference_mode(), decode_graphs(model, cache):
            out = model.generate(
                prompt,
                past_key_values=cache,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
    return out.sequences[:, prompt.shape[1] :], cache, torch.stack(out.logits, 1), graphed


@pytest.mark.gpu
@pytest.mark.parametrize(
    "method,backend",
    [
        ("oscar", "triton"),
        ("rotatekv", None),
        ("kivi", None),
        pytest.param("oscar", "cuda", marks=pytest.mark.cuda_kernels),
    ],
)
def test_a_model_over_two_gpus_keeps_each_layers_cache_there_and_decodes_as_on_one(method, backend):
    """device_map over two GPUs: every cache layer stores its tensors on its layer's GPU, the kernels launch there
    (prefill packs, decode steps, a flush inside the decode), no CUDA graph spans the two devices, and the greedy
    tokens are those of the same weights on one GPU, up to a near-tie (tests/kernels/test_graph_decode.py)."""
    import torch

    from quant.kernels import KernelOptions
    from tests.kernels.test_graph_decode import assert_same_or_near_tie

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    split, single, device_map = _split_and_single()
    kernels = KernelOptions(backend=backend, layer_kernels=backend or "triton", fused_linear=backend == "cuda")
    prompt = torch.randint(0, 256, (1, 300), generator=torch.Generator().manual_seed(1)).to("cuda:0")
    new = 100  # 300 prompt tokens leave 44 in OScaR's 128-token window: the decode flushes it once
    tokens, cache, _, graphed = _greedy(split, method, kernels, prompt, new)
    assert not graphed
    for i, layer in enumerate(cache.layers):
        assert _state_devices(layer) == {torch.device(f"cuda:{device_map[f'model.layers.{i}']}")}, i
    reference, _, logits, _ = _greedy(single, method, kernels, prompt, new)
    assert_same_or_near_tie(tokens[0], reference[0], logits[0])


if __name__ == "__main__":  # one rank of the torchrun test above: <out> [<rank to kill> <after items>]
    if len(sys.argv) == 4:
        _arm_kill(int(sys.argv[2]), int(sys.argv[3]))
    try:
        _evaluate(sys.argv[1])
    finally:
        D.finish()
