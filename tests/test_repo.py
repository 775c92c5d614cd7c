"""The repository's hygiene: lint clean, no import circles, the library never imports the harness, no provenance
(a diary's run or session numbers) in code, tests or docs: the history is git log."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "quant", "tasks")


def modules() -> dict[str, Path]:
    found = {}
    for top in PACKAGES:
        for path in (ROOT / top).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            found[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> project modules it imports anywhere (function bodies too). `from pkg import name` counts as
    importing pkg.name when that is a module, else pkg itself."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in mods.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets.update(t for t in subs if t in mods)
                if any(t not in mods for t in subs):
                    targets.add(node.module)
        graph[name] = {r for r in map(resolve, targets) if r and r != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_the_library_never_imports_the_harness():
    graph = import_graph()
    assert sorted((m, t) for m in graph for t in graph[m] if m.startswith("quant") and t.startswith("harness")) == []


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
