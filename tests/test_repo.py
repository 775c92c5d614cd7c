"""The repository's hygiene: lint clean, no provenance (a diary's run or session numbers) in code, tests or docs: the
history is git log. The import structure (layers, cycles) is tests/test_imports.py's."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_no_provenance_in_code_tests_or_docs():
    pattern = re.compile(r"session [0-9]|\brun [0-9]+|\bruns [0-9]+(-[0-9]+)?\b|NOTES\.md", re.IGNORECASE)
    paths = [
        ROOT / "README.md",
        *(
            p
            for d in ("harness", "quant", "csrc", "tasks", "tests", "docs")
            for p in (ROOT / d).rglob("*")
            if p.is_file() and p.suffix in (".py", ".cu", ".cuh", ".h", ".md", ".sh", ".yaml")
        ),
    ]
    hits = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()[:100]}"
        for p in paths
        if p != Path(__file__)
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(),
    reason="ruff is installed by the test extra (make setup)",
)
def test_ruff_is_clean():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    res = subprocess.run(
        [ruff, "check", "--output-format", "concise", str(ROOT)], capture_output=True, text=True, cwd=ROOT
    )
    assert res.returncode == 0, res.stdout[-4000:]
