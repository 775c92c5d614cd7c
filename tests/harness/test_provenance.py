"""harness/provenance.py: a code digest ignores comments, docstrings and formatting, and moves with any change to the
code or to a module it imports; the closure follows module-level imports inside the project; stale_reasons names
what changed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from harness import provenance as P

ROOT = Path(__file__).resolve().parents[2]


def digest_of(tmp_path: Path, file: str, source: str) -> str:
    """The digest of `source` as module "m" (the name is part of the digest; the file's name is not)."""
    path = tmp_path / f"{file}.py"
    path.write_text(source, encoding="utf-8")
    return P.digest({"m": path})


def test_comments_docstrings_and_formatting_do_not_count(tmp_path):
    base = digest_of(tmp_path, "a", "def f(x):\n    return x + 1\n")
    same = digest_of(
        tmp_path,
        "b",
        '"""A module."""\n\n\ndef f(x):  # why\n    """Adds one."""\n    return (\n        x + 1\n    )\n',
    )
    assert same == base
    assert digest_of(tmp_path, "c", "def f(x):\n    return x + 2\n") != base
    assert digest_of(tmp_path, "d", "def f(x):\n    return 'x' + 1\n") != base


def test_the_closure_follows_module_level_imports_only():
    files = P.closure(["tasks.ppl"])
    assert {"tasks.ppl", "tasks.contract", "tasks.base"} <= set(files)
    assert all(path.is_file() for path in files.values())
    # quant.methods.oscar imports its primitives at module level; the harness is imported lazily, never at import
    method = P.closure(["quant.methods.oscar"])
    assert {"quant.methods.oscar", "quant.methods.base", "quant.primitives"} <= set(method)
    assert not any(name.startswith("harness") for name in method)


def test_a_method_part_holds_its_own_files_and_no_other_methods():
    # a change to one method's file stales that method's results only: the cache reaches the engine and the registry,
    # which import every method, but a part follows only its own method's files (and shared ones: base, protocol)
    kivi = set(P.closure(["quant.methods.kivi", *P.CACHE], method="kivi"))
    oscar = set(P.closure(["quant.methods.oscar", *P.CACHE], method="oscar"))
    assert {"quant.methods.kivi", "quant.methods.base", "quant.engine.protocol"} <= kivi
    assert not kivi & {"quant.methods.oscar", "quant.engine.oscar", "quant.engine.bf16", "quant.methods.bf16"}
    assert {"quant.methods.oscar", "quant.engine.oscar"} <= oscar and "quant.methods.kivi" not in oscar
    assert P.REGISTRY not in kivi | oscar  # the presets: a result's config is compared with its preset directly
    loop = set(P.closure([*P.LOOP, "harness.models.text.adapter"]))
    assert not loop & P.method_files() and P.REGISTRY not in loop
    kivi_parts = P.code_parts("quant.methods.kivi", "tasks.ppl", "harness.models.text.adapter")
    oscar_parts = P.code_parts("quant.methods.oscar", "tasks.ppl", "harness.models.text.adapter")
    assert kivi_parts["method"] != oscar_parts["method"]
    assert {k: v for k, v in kivi_parts.items() if k != "method"} == {
        k: v for k, v in oscar_parts.items() if k != "method"
    }


def test_parts_name_the_code_of_a_run_and_the_kernels_only_on_a_kernel_backend():
    cpu = P.code_parts("quant.methods.oscar", "tasks.ppl", "harness.models.text.adapter")
    gpu = P.code_parts("quant.methods.oscar", "tasks.ppl", "harness.models.text.adapter", backend="cuda")
    assert set(cpu) == {"method", "task", "model", "prepare"} and set(gpu) == {*cpu, "kernels"}
    assert {k: gpu[k] for k in cpu} == cpu
    assert any(name.startswith("csrc/") for name in P.kernel_files())
    # a random-weight model path goes through the builder of its weights too
    assert (
        P.code_parts(
            "quant.methods.oscar", "tasks.ppl", "harness.models.text.adapter", synthetic="harness.models.text.synthetic"
        )["model"]
        != cpu["model"]
    )


def test_stale_reasons_name_the_config_the_code_and_the_commit():
    committed = json.loads((ROOT / "results/runs/ppl/smollm2-135m/oscar.json").read_text())
    assert P.stale_reasons(committed) == []  # the committed result is what this checkout computes
    changed = copy.deepcopy(committed)
    changed["code"]["task"] = "sha256:0000000000000000"
    commit = committed["environment"]["git_commit"][:8]
    assert P.stale_reasons(changed) == [f"task code changed since {commit}"]
    old = copy.deepcopy(committed)
    del old["code"], old["method"]["config"]["zero_point"]
    reasons = P.stale_reasons(old)
    assert reasons[0].startswith("config differs from oscar now (zero_point 'absent' -> 'integer')")
    assert reasons[1] == f"records no code fingerprint (ran at {commit})"
    tweaked = copy.deepcopy(committed)
    tweaked["method"]["name"], tweaked["method"]["config"]["group_size"] = "oscar+group_size=64", 64
    assert P.preset_drift(tweaked) is None  # what its name says
    tweaked["method"]["config"]["group_size"] = 128
    assert "group_size 128 -> 64" in P.preset_drift(tweaked)


def test_the_preparation_is_a_part_that_older_results_lack():
    # quant.prepare (folding, the attention hook, the layer kernels) is imported when a run starts, so no other
    # part's closure reaches it: its own part. A result recorded before the part existed is compared on the parts it
    # records; one that records it goes stale when it changes.
    files = P.closure(list(P.PREPARE))
    assert {"quant.prepare", "quant.invariant", "quant.fold"} <= set(files)
    assert "quant.prepare" not in P.closure(["harness.run", "harness.runner", "harness.scoring"])
    committed = json.loads((ROOT / "results/runs/ppl/smollm2-135m/oscar.json").read_text())
    now = P.current_parts(committed)
    older = {part: digest for part, digest in now.items() if part != "prepare"}
    assert P.code_changes({**committed, "code": older}, now) == []
    changed = {**now, "prepare": "sha256:0000000000000000"}
    commit = committed["environment"]["git_commit"][:8]
    assert P.code_changes({**committed, "code": changed}, now) == [f"prepare code changed since {commit}"]


def write_package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    """{module name: path} of `files` ({'pkg/mod.py': source}) written under root."""
    out = {}
    for rel, source in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
        out[rel.removesuffix(".py").replace("/", ".")] = path
    return out


LOOP_BEFORE = {
    "harness/run.py": (
        "from harness import results as R\n"
        "from harness.stats import mean as average\n\n"
        "LIMIT = 3\n\n"
        "def step(x):\n    return R.clip(average(x), LIMIT)\n\n"
        "def loop(xs):\n    return [step(x) for x in xs]\n"
    ),
    "harness/results.py": "def clip(x, n):\n    return min(x, n)\n",
    "harness/stats.py": "def mean(x):\n    return sum(x) / len(x)\n",
}


def test_a_definitions_digest_keeps_a_move_and_sees_a_change(tmp_path):
    # harness.run split in two, as a refactor does: step moves to harness/eval/loop.py, its callers import it from
    # there, the module aliases differ; no behaviour changes
    before = P.definitions_digest(write_package(tmp_path / "a", LOOP_BEFORE))
    moved = {
        "harness/run.py": (
            "from harness.eval.loop import step\n\nLIMIT = 3\n\ndef loop(xs):\n    return [step(x) for x in xs]\n"
        ),
        "harness/eval/loop.py": (
            "import harness.results as res\nfrom harness.stats import mean\n\n"
            "def step(x):\n    from harness.run import LIMIT\n    return res.clip(mean(x), LIMIT)\n"
        ),
        "harness/results.py": LOOP_BEFORE["harness/results.py"],
        "harness/stats.py": LOOP_BEFORE["harness/stats.py"],
    }
    assert before.startswith(P.DEFS)
    assert P.definitions_digest(write_package(tmp_path / "b", moved)) == before
    changed = {**moved, "harness/stats.py": "def mean(x):\n    return sum(x) / max(len(x), 1)\n"}
    assert P.definitions_digest(write_package(tmp_path / "c", changed)) != before
    renamed_call = {**LOOP_BEFORE, "harness/run.py": LOOP_BEFORE["harness/run.py"].replace("R.clip", "R.floor")}
    assert P.definitions_digest(write_package(tmp_path / "d", renamed_call)) != before
    # the first scheme sees the same move as a change
    assert P.digest(write_package(tmp_path / "e", LOOP_BEFORE)) != P.digest(write_package(tmp_path / "f", moved))


def test_results_of_the_first_scheme_are_compared_in_it_and_new_ones_in_definitions():
    committed = json.loads((ROOT / "results/runs/ppl/smollm2-135m/oscar.json").read_text())
    now = P.code_parts("quant.methods.oscar", "tasks.ppl", "harness.models.text.adapter")
    assert all(v.startswith(P.DEFS) for v in now.values())  # what a run records now
    first = P.current_parts(committed, scheme="sha256:")
    assert all(v.startswith("sha256:") for v in first.values())
    assert P.current_parts(committed, scheme=P.DEFS) == now
    # a result recorded in either scheme is up to date against a run that records the other
    assert P.code_changes({**committed, "code": first}, now) == []
    assert P.code_changes({**committed, "code": now}, first) == []
    commit = committed["environment"]["git_commit"][:8]
    assert P.code_changes({**committed, "code": {**now, "task": P.DEFS + "0" * 16}}, now) == [
        f"task code changed since {commit}"
    ]
