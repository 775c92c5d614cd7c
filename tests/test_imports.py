"""The project's layering, read from the source: which package may import which, and no import cycles.

Every .py under harness/, quant/ and tasks/ is parsed with ast (nothing is imported). All import statements count:
module-level ones and those inside functions (lazy imports), `import a.b`, `from a import b` (a.b when that is a
module, else a) and relative imports (`from . import x`, `from ..a import y`, resolved against the importing file's
package). A call of `importlib.import_module("a.b")` (or `import_module`) with a literal name counts as a lazy import
of a.b; the registries in tasks/__init__.py and harness/models/__init__.py, which name modules in tables, are not
seen.

The rules:
- FORBIDDEN: a module under SOURCE never imports TARGET or anything under it (all imports, lazy ones included:
  a lazy import is still a dependency).
- Package cycles (lazy imports count): first the top-level packages (harness, quant, tasks), every module counted in
  its top-level package; then PACKAGE_NODES, each module in the deepest node holding it ("tasks.*" stands for every
  subpackage of tasks/). In the second graph an import between a package's own modules and one of its subpackages
  (quant/cache.py -> quant.kernels, quant/kernels/common.py -> quant.packed) is no edge: a package's own modules
  hold layers both below its subpackages and above them, and FORBIDDEN says which way each may go. Imports between
  sibling subpackages (quant.kernels <-> quant.methods) and across top-level packages (tasks.mmau_pro -> harness)
  are edges.
- Module cycles: the graph of modules has no cycle, counting only the imports that run when the module is imported:
  module-level ones (inside `if`/`try`/class bodies too). Function-level (lazy) imports and those under
  `if TYPE_CHECKING:` are left out of this rule: they run after every module involved is fully initialised, so they
  cannot fail as a circular import does. Importing a.b.c also runs a/__init__.py and a/b/__init__.py: those
  packages count as imported too, unless the importing module sits inside them already.

A failure names each offending import as file:line with its source text.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "quant", "tasks")

# (importer, forbidden, why): no module at or under `importer` imports a module at or under any of `forbidden`.
FORBIDDEN = (
    ("tasks", ("harness",), "tasks are below the harness: the harness runs them, they never import it"),
    (
        "quant.kernels",
        ("quant.methods", "quant.engine", "quant.rows", "quant.cache"),
        "the kernels are below the methods, the engine, the row bookkeeping and the cache that call them",
    ),
    (
        "quant",
        ("harness", "tasks"),
        "the quantization library stands alone: it imports neither the harness nor the tasks",
    ),
    (
        "harness.report",
        ("harness.bench.check", "harness.run", "harness.loop", "harness.runner", "harness.scoring", "harness.models"),
        "the report wing reads result files and bench JSONs (harness.bench.reference), never the bench gate; it "
        "never runs a model or the eval loop",
    ),
)

# The nodes of the package graph, which must stay acyclic; a module belongs to the deepest node holding it.
# "tasks.*" expands to each subpackage of tasks/ (one node per benchmark).
PACKAGE_NODES = (
    "harness",
    "harness.models",
    "harness.bench",
    "harness.report",
    "quant",
    "quant.kernels",
    "quant.methods",
    "quant.engine",
    "tasks",
    "tasks.*",
)


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name of the importing file
    target: str  # dotted name imported (a project module, or a name under one that may not exist yet)
    path: Path
    line: int
    lazy: bool  # inside a function, or under `if TYPE_CHECKING:`
    text: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.text}"


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the packages (a package is its __init__.py)."""
    found = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            found[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, known: set[str]) -> list[str]:
    """The dotted names one import statement imports, relative ones resolved against the importer's package."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = importer if is_package else importer.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    names = [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
    subs = [n for n in names if n in known]
    return subs + ([base] if len(subs) < len(node.names) else [])


def imports_of(name: str, path: Path, known: set[str], packages: tuple[str, ...] = PACKAGES) -> list[Import]:
    source = path.read_text()
    lines = source.splitlines()
    found = []

    def visit(node: ast.AST, lazy: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                text = " ".join(ln.strip() for ln in lines[child.lineno - 1 : child.end_lineno])
                for target in _targets(child, name, path.name == "__init__.py", known):
                    if target.split(".")[0] in packages:
                        found.append(Import(name, target, path, child.lineno, lazy, text))
            elif (
                isinstance(child, ast.Call)
                and (getattr(child.func, "attr", None) or getattr(child.func, "id", None)) == "import_module"
                and child.args
                and isinstance(child.args[0], ast.Constant)
                and isinstance(child.args[0].value, str)
            ):
                target = child.args[0].value
                if target.split(".")[0] in packages:
                    text = lines[child.lineno - 1].strip()
                    found.append(Import(name, target, path, child.lineno, True, text))
                visit(child, lazy)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), True)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), lazy)
            else:
                visit(child, lazy)

    visit(ast.parse(source, filename=str(path)), False)
    return found


def all_imports() -> list[Import]:
    mods = modules()
    return [imp for name, path in mods.items() for imp in imports_of(name, path, set(mods))]


def under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def package_nodes() -> list[str]:
    nodes = [n for n in PACKAGE_NODES if not n.endswith(".*")]
    for pattern in (n for n in PACKAGE_NODES if n.endswith(".*")):
        parent = pattern[:-2]
        folder = ROOT.joinpath(*parent.split("."))
        nodes += [
            f"{parent}.{d.name}"
            for d in sorted(folder.iterdir())
            if d.is_dir() and d.name != "__pycache__" and any(d.rglob("*.py"))
        ]
    return nodes


def node_of(module: str, nodes: list[str]) -> str | None:
    holding = [n for n in nodes if under(module, n)]
    return max(holding, key=len) if holding else None


def owning_module(name: str, known: set[str]) -> str | None:
    """The deepest project module a dotted name falls in (a.b.Class -> a.b)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Components of more than one vertex (Tarjan), each sorted, in a stable order."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe_cycles(edges: dict[tuple[str, str], list[Import]], what: str) -> list[str]:
    """One block per cycle: its members, then every edge inside it with the imports making it (file:line)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    report = []
    for comp in strongly_connected(graph):
        members = set(comp)
        block = [f"{what} cycle among {', '.join(comp)}:"]
        for (a, b), imps in sorted(edges.items()):
            if a in members and b in members:
                block.append(f"  {a} -> {b}")
                block += [f"      {imp.where()}" for imp in imps]
        report.append("\n".join(block))
    return report


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return all_imports()


@pytest.mark.parametrize("importer,forbidden,why", FORBIDDEN, ids=[rule[0] for rule in FORBIDDEN])
def test_forbidden_imports(imports, importer, forbidden, why):
    bad = [
        f"{imp.where()}\n      {imp.importer} imports {imp.target}"
        for imp in imports
        if under(imp.importer, importer) and any(under(imp.target, f) for f in forbidden)
    ]
    assert not bad, f"{importer} must not import {', '.join(forbidden)} ({why}):\n  " + "\n  ".join(bad)


def test_no_cycles_between_top_level_packages(imports):
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in imports:
        a, b = imp.importer.split(".")[0], imp.target.split(".")[0]
        if a != b:
            edges.setdefault((a, b), []).append(imp)
    found = describe_cycles(edges, "package")
    assert not found, "import cycles between top-level packages (lazy imports count):\n" + "\n".join(found)


def test_no_package_cycles(imports):
    nodes, known = package_nodes(), set(modules())
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in imports:
        target = owning_module(imp.target, known) or imp.target
        a, b = node_of(imp.importer, nodes), node_of(target, nodes)
        if a and b and a != b and not under(a, b) and not under(b, a):
            edges.setdefault((a, b), []).append(imp)
    found = describe_cycles(edges, "package")
    assert not found, "import cycles between packages (lazy imports count):\n" + "\n".join(found)


def test_no_module_cycles(imports):
    known = set(modules())
    edges: dict[tuple[str, str], list[Import]] = {}
    for imp in imports:
        if imp.lazy:
            continue
        target = owning_module(imp.target, known)
        if target is None:
            continue
        # importing a.b.c runs a and a.b first: those count, unless the importer lives inside them already
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            step = ".".join(parts[:i])
            if step in known and step != imp.importer and (step == target or not under(imp.importer, step)):
                edges.setdefault((imp.importer, step), []).append(imp)
    found = describe_cycles(edges, "module")
    assert not found, "import cycles between modules (module-level imports only):\n" + "\n".join(found)


def test_the_parser_sees_every_kind_of_import(tmp_path):
    """The rules above rest on the parser: check it on a made-up package."""
    known = {"pkg", "pkg.sub", "pkg.sub.mod", "pkg.sub.other", "pkg.top", "harness", "harness.run"}
    src = tmp_path / "mod.py"
    src.write_text(
        "import harness.run\n"
        "from pkg import top, Name\n"
        "from . import other\n"
        "from ..top import thing\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.sub import other as typed\n"
        "def f():\n"
        "    from harness import run\n"
        "class C:\n"
        "    import pkg.sub\n"
    )
    found = [(i.target, i.line, i.lazy) for i in imports_of("pkg.sub.mod", src, known, ("harness", "pkg"))]
    assert found == [
        ("harness.run", 1, False),
        ("pkg.top", 2, False),
        ("pkg", 2, False),
        ("pkg.sub.other", 3, False),
        ("pkg.top", 4, False),
        ("pkg.sub.other", 7, True),
        ("harness.run", 9, True),
        ("pkg.sub", 11, False),
    ]
