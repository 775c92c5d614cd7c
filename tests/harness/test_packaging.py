"""The wheel is the product: built from the repo, installed in a clean virtualenv, it runs from another directory.

The package list in pyproject.toml is explicit (the top-level csrc/ ships as quant.csrc); a package added to the
tree without being listed would be missing from the wheel, so the list is checked against the tree too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


def tree_packages() -> set[str]:
    """Folders under harness/, quant/ and tasks/ holding Python or package data, as dotted names, plus csrc as
    quant.csrc (the developer tools live outside them, in the top-level benchmarks/)."""
    found = set()
    for top in ("harness", "quant", "tasks", "csrc"):
        for folder in [ROOT / top, *(p for p in (ROOT / top).rglob("*") if p.is_dir())]:
            rel = folder.relative_to(ROOT)
            if "__pycache__" in rel.parts:
                continue
            if any(f.suffix in (".py", ".yaml", ".json", ".cu", ".cuh", ".h") for f in folder.iterdir() if f.is_file()):
                name = ".".join(rel.parts)
                found.add("quant." + name if top == "csrc" else name)
    return found


def test_every_package_of_the_tree_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert listed == tree_packages()


def test_package_data_is_found_through_the_package():
    from harness import results
    from quant.kernels import cuda

    assert (cuda.CSRC / "oscar_bindings.cu").is_file() and (cuda.CSRC / "include" / "oscar_decode.cuh").is_file()
    assert results.SCHEMA_PATH.is_file()


def run(cmd: list[str], cwd: Path, env: dict | None = None, timeout: int = 900) -> str:
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert res.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.mark.skipif(os.environ.get("OSCAR_SKIP_WHEEL_TEST") == "1", reason="OSCAR_SKIP_WHEEL_TEST=1")
def test_wheel_installs_in_a_clean_venv_and_runs_from_another_directory(tmp_path):
    dist = tmp_path / "dist"
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(ROOT)],
        tmp_path,
    )
    wheel = next(dist.glob("oscar_eval-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # The dependencies are lent by this environment, whose `make setup` resolved and installed what the project
    # declares: what this test checks is the wheel itself (its packages, package data and CUDA sources) installed
    # and run away from the checkout. A .pth line adds a folder without running the .pth files in it, so the
    # checkout's editable install stays out of the new environment.
    site = next(env_dir.glob("lib/python*/site-packages"))
    lent = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "lent-dependencies.pth").write_text("\n".join(lent) + "\n", encoding="utf-8")
    run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OSCAR_EVAL_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1", TRITON_INTERPRET="1")
    cli = str(env_dir / "bin" / "oscar-eval")
    listing = run([cli, "list"], work, env)
    assert "oscar" in listing and "tiny-llava" in listing
    located = run(
        [
            str(py),
            "-c",
            "import quant, quant.kernels.cuda as c, harness.results as r; print(quant.__file__, c.CSRC, r.SCHEMA_PATH)",
        ],
        work,
        env,
    )
    assert str(ROOT) not in located and "site-packages" in located
    run(
        [
            cli,
            "eval",
            "--model",
            "tiny-llava",
            "--task",
            "ocrbench",
            "--data",
            "generated",
            "--quant",
            "oscar,kivi",
            "--limit",
            "2",
        ],
        work,
        env,
    )
    written = sorted(p.name for p in (work / "results" / "runs" / "ocrbench.generated" / "tiny-llava").glob("*.json"))
    assert written == ["kivi.first2.json", "oscar.first2.json"]  # the first 2 items: a partial run
