"""Result schema: round trip, validation errors that name the field, versions, paths, progress files."""

from __future__ import annotations

import json

import pytest

from harness import progress as PF
from harness import results as R
from tests.harness.test_results_factory import make_result


def test_round_trip_is_identical(tmp_path):
    result = make_result("kivi", [1, 0, 1, 1], ["a", "a", "b", "b"])
    path = R.write_result(result, tmp_path / "r.json")
    assert R.read_result(path) == result
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write leaves no temp file


@pytest.mark.parametrize(
    "mutate, field, words",
    [
        (lambda r: r["model"].pop("hub_id"), "$.model", "'hub_id' is a required property"),
        (lambda r: r["metrics"]["accuracy"].update(value="high"), "$.metrics.accuracy.value", "is not of type"),
        (lambda r: r["task"].update(version=-1), "$.task.version", "less than the minimum"),
        (lambda r: r.update(surprise=1), "$", "Additional properties"),
        (lambda r: r["samples"][0].pop("id"), "$.samples[0]", "'id' is a required property"),
        (lambda r: r.update(date="yesterday"), "$.date", "does not match"),
    ],
)
def test_validation_names_the_field(tmp_path, mutate, field, words):
    result = make_result("kivi", [1, 0])
    mutate(result)
    with pytest.raises(R.ResultFileError) as err:
        R.write_result(result, tmp_path / "bad.json")
    assert f"{field}:" in str(err.value) and words in str(err.value)
    assert not (tmp_path / "bad.json").exists()  # nothing invalid is written


def test_read_refuses_invalid_files_with_their_path(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(R.ResultFileError, match="broken.json: not valid JSON"):
        R.read_result(tmp_path / "broken.json")
    (tmp_path / "other.json").write_text(json.dumps({"results": {}}))
    with pytest.raises(R.ResultFileError, match="not an oscar-eval result file"):
        R.read_result(tmp_path / "other.json")


def test_newer_schema_is_refused_with_upgrade_hint(tmp_path):
    result = make_result("kivi", [1, 0])
    result["schema_version"] = 2
    (tmp_path / "new.json").write_text(json.dumps(result))
    with pytest.raises(R.ResultFileError, match="schema v2, this oscar-eval reads up to v1; upgrade"):
        R.read_result(tmp_path / "new.json")


def test_older_schema_without_migration_is_refused(tmp_path):
    result = make_result("kivi", [1, 0])
    result["schema_version"] = 0
    (tmp_path / "old.json").write_text(json.dumps(result))
    with pytest.raises(R.ResultFileError, match="v0 has no migration to v1; rerun"):
        R.read_result(tmp_path / "old.json")


def test_migration_chain_runs(tmp_path, monkeypatch):
    # A v0 file that named the method config "quant" migrates to v1 when a migration is registered.
    old = make_result("kivi", [1, 0])
    old["schema_version"] = 0
    old["quant"] = old.pop("method")
    monkeypatch.setitem(
        R.MIGRATIONS, 0, lambda r: {**{k: v for k, v in r.items() if k != "quant"}, "method": r["quant"]}
    )
    (tmp_path / "v0.json").write_text(json.dumps(old))
    assert R.read_result(tmp_path / "v0.json")["method"]["name"] == "kivi"


def test_paths_are_predictable_and_checked():
    assert str(R.run_path("ocrbench", None, "qwen3-vl-8b", "oscar")) == "results/runs/ocrbench/qwen3-vl-8b/oscar.json"
    generated = R.run_path("ocrbench", "generated", "tiny-qwen3-vl", "kivi")
    assert str(generated).endswith("ocrbench.generated/tiny-qwen3-vl/kivi.json")
    assert str(R.run_path("ppl", "/data/my.txt", "m", "bf16")).endswith("ppl.custom/m/bf16.json")
    assert PF.progress_path("a/b/kivi.json").name == "kivi.partial.jsonl"
    with pytest.raises(ValueError, match="method name '../x'"):
        R.run_path("ppl", None, "m", "../x")


def test_progress_resumes_and_refuses_other_settings(tmp_path):
    path = tmp_path / "kivi.partial.jsonl"
    ident = {"model": "m", "method": {"bits": 2}, "task": "t"}
    p = PF.open_progress(path, ident)
    p.add({"id": "a", "scores": {"x": 1.0}})
    p.add({"id": "b", "scores": {"x": 0.0}})
    with open(path, "a") as f:  # the process died while writing a third record
        f.write('{"record": {"id": "c", "sco')
    resumed = PF.open_progress(path, ident)
    assert resumed.done_ids == {"a", "b"}
    with pytest.raises(R.ResultFileError, match=r"method.bits: 2 -> 3.*--restart"):
        PF.open_progress(path, {**ident, "method": {"bits": 3}})
    assert PF.open_progress(path, {**ident, "method": {"bits": 3}}, restart=True).done_ids == set()


def test_a_failed_item_is_tried_again_on_resume_and_its_last_line_counts(tmp_path):
    path = tmp_path / "m.partial.jsonl"
    ident = {"model": "m", "method": {"name": "kivi"}}
    p = PF.open_progress(path, ident)
    p.add({"id": "a", "error": "item a: image.png could not be read"})
    p.add({"id": "b", "score": 1})
    again = PF.open_progress(path, ident)
    assert again.done_ids == {"b"} and again.failed == 1  # a's cause may be fixed since: it runs again
    again.add({"id": "a", "score": 0})
    last = PF.open_progress(path, ident)
    assert last.done_ids == {"a", "b"} and last.failed == 0 and {r["id"]: r for r in last.records}["a"]["score"] == 0


def test_records_keep_task_order():
    recs = [{"id": "c"}, {"id": "a"}, {"id": "b"}]
    assert [r["id"] for r in PF.records_in_order(recs, ["a", "b", "c", "d"])] == ["a", "b", "c"]


def test_jsonable_and_metric_direction():
    import numpy as np
    import torch

    assert R.jsonable({"a": np.float32(1.5), "b": torch.tensor(3), "c": (1, float("nan")), 4: torch.float16}) == {
        "a": 1.5,
        "b": 3,
        "c": [1, None],
        "4": "torch.float16",
    }
    assert not R.higher_is_better("ppl") and R.higher_is_better("accuracy")


def test_kv_summary_means_and_max():
    recs = [
        {"kv_bytes": {"total": 100, "quantized": 80, "full_precision": 20, "per_modality": {"image": 60}}},
        {"kv_bytes": {"total": 300, "quantized": 200, "full_precision": 100, "per_modality": {"image": 100}}},
        {"error": "item x: failed"},
    ]
    s = R.kv_summary(recs)
    assert s == {"total": 200, "quantized": 140, "full_precision": 60, "max_total": 300, "per_modality": {"image": 80}}


def test_environment_records_the_kernel_options():
    from harness.options import kernel_options
    from harness.results import environment
    from quant.kernels.options import KernelOptions

    # the environment's overrides are read once, at the command line; --kernels and --backend apply over them
    options = kernel_options(
        "fused_rope=on,wide_decode=off",
        None,
        {"OSCAR_FUSED_LINEAR": "0", "OSCAR_FUSED_ROPE": "0", "OSCAR_CUDA_GRAPHS": "off"},
    )
    assert (
        environment(options)["kernels"]
        == options.to_dict()
        == {
            "backend": None,
            "cuda_graphs": False,
            "fused_norm": True,
            "fused_rope": True,
            "fused_linear": False,
            "layer_kernels": "cuda",
            "wide_decode": False,
            "batch_invariant": None,  # decided per model by the runner (quant.invariant.on_by_default)
        }
    )
    assert environment()["kernels"] == KernelOptions().to_dict()
    assert kernel_options(None, "triton", {"OSCAR_LAYER_KERNELS": "triton"}).backend == "triton"
    triton_layers = kernel_options(None, None, {"OSCAR_LAYER_KERNELS": "triton"})
    assert environment(triton_layers)["kernels"]["layer_kernels"] == "triton"


def test_backend_is_an_alias_of_the_kernels_backend_option():
    from harness.options import kernel_options

    assert kernel_options(None, "triton", {}) == kernel_options("backend=triton", None, {})
    assert kernel_options("backend=triton,cuda_graphs=off", "triton", {}).cuda_graphs is False
    with pytest.raises(ValueError, match="--backend cuda and --kernels backend=triton disagree"):
        kernel_options("backend=triton", "cuda", {})


def test_kernel_options_refuse_what_they_do_not_know():
    import pytest

    from quant.kernels import KernelOptions

    with pytest.raises(ValueError, match="unknown kernel option 'graphs'.*cuda_graphs"):
        KernelOptions.parse("graphs=off")
    with pytest.raises(ValueError, match="backend='tensorrt'.*cuda, triton, torch"):
        KernelOptions.parse("backend=tensorrt")
    with pytest.raises(ValueError, match="wide_decode='maybe'.*on/off"):
        KernelOptions.from_env({"OSCAR_WIDE_DECODE": "maybe"})
    assert KernelOptions.parse("backend=auto,layer_kernels=triton") == KernelOptions(layer_kernels="triton")


def test_system_figures_count_the_graph_decode_steps():
    class Adapter:
        device = "cuda:0"

    recs = [
        {"new_tokens": 129, "graph_steps": 126, "wall_s": 1.0, "input_tokens": 50},
        {"new_tokens": 1, "graph_steps": 0, "wall_s": 0.5, "input_tokens": 50},  # one token: no decode step
        {"error": "item x: failed"},
    ]
    assert R.system_figures(recs, Adapter())["graph_decode_share"] == 126 / 128
    assert R.system_figures([{"new_tokens": 1}], Adapter())["graph_decode_share"] is None
    result = make_result("oscar", [1.0, 0.0])
    result["system"]["graph_decode_share"] = 0.98
    result["samples"][0]["graph_steps"] = 126
    R.validate(result)  # the schema takes both
