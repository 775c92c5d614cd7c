"""Which code computed a result, and whether a result still matches the code and presets of this checkout.

A result records a digest of each part of the code it ran (`code_parts`): the method (its module, the cache it runs
in and what they import; another method's files never count, METHOD_PACKAGES), the task, the model path (the adapter
and the eval loop), the model's preparation for the method (`PREPARE`), plus the kernels where a kernel backend ran.
A digest covers the module's syntax tree without docstrings, so comments, docstrings and formatting do not count, and
every module it imports at module level inside this project, transitively. `stale_reasons` compares a result with
the checkout: its config against its preset, its task version, each code part; `oscar-eval eval` reruns a stale
result, `oscar-eval list` and the leaderboard mark it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import Any

PACKAGES = ("harness", "quant", "tasks")
# The eval loop every model path goes through (batching, seeding, what a record holds) and the runner that answers
# its requests (generate, teacher-forced scoring).
LOOP = ("harness.run", "harness.runner", "harness.scoring")
# The machinery every method runs inside: the cache that holds its layers, the weight folding, the attention
# function transformers calls (quant.kernels.hf_decode: the torch reference on the CPU, a kernel on a GPU).
CACHE = ("quant.cache", "quant.fold", "quant.attention", "quant.kernels.hf_decode")
# Kernel backends: their Python side and the CUDA sources they build.
KERNELS = "quant.kernels"
# What the runner imports when a run starts rather than at module level, so no other part's closure reaches it: the
# model prepared for the method (quant.prepare: folding, the attention hook, the layer kernels, the batch-invariant
# mode) with what it imports.
PREPARE = ("quant.prepare",)
# Packages that hold one file per method (quant/methods/<name>.py, quant/engine/<name>.py): a method's part covers its
# own files there and the shared ones (base, protocol, ...), never another method's, so a change to one method stales
# that method's results only. The method registry (quant.methods: the presets) counts in no part: a result's config is
# compared with its preset itself (preset_drift).
METHOD_PACKAGES = ("quant.methods", "quant.engine")
REGISTRY = "quant.methods"
# Parts that results recorded before the part existed lack: such a result is compared on the parts it records (a
# new part would otherwise stale every committed result at once); runs from then on record it and are compared on it.
LATER_PARTS = ("prepare",)


@lru_cache(maxsize=None)
def _package_root(package: str) -> Path | None:
    """The folder of a top-level package of the project, found without importing it."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def module_file(name: str) -> Path | None:
    """The source file of a project module (a package's __init__.py), or None for anything else."""
    parts = name.split(".")
    root = _package_root(parts[0]) if parts[0] in PACKAGES else None
    if root is None:
        return None
    base = root.joinpath(*parts[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _module_level(body: list[ast.stmt]):
    """The statements that run at import time: the body, with `if` / `try` blocks opened, functions and classes
    not (their imports run when called, mostly optional or heavy parts)."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try)):
            for block in (
                node.body,
                node.orelse,
                getattr(node, "finalbody", []),
                *(h.body for h in getattr(node, "handlers", [])),
            ):
                yield from _module_level(block)


def _from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` in `package` names (relative levels resolved)."""
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return base


def imports_of(name: str, path: Path) -> set[str]:
    """The project modules `name` (at `path`) imports at module level: `from a import b` counts as a.b when that
    is a module, else as a."""
    return set(_imports_of(name, path, path.stat().st_mtime_ns))


@lru_cache(maxsize=None)
def _imports_of(name: str, path: Path, mtime_ns: int) -> frozenset[str]:
    """imports_of for one version of the file (a leaderboard asks it for every result, thousands of times)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _module_level(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_module(node, package)
            subs = [f"{base}.{a.name}" for a in node.names if module_file(f"{base}.{a.name}")]
            out.update(subs or [base])
            if len(subs) < len(node.names):
                out.add(base)
    return frozenset(m for m in out if m.split(".")[0] in PACKAGES and module_file(m))


@lru_cache(maxsize=None)
def method_files() -> frozenset[str]:
    """The per-method modules: quant.methods.<m> and quant.engine.<m> for every method file <m> (not base)."""
    root = module_file(REGISTRY)
    stems = {p.stem for p in root.parent.glob("*.py")} - {"__init__", "base"} if root else set()
    return frozenset(f"{package}.{stem}" for package in METHOD_PACKAGES for stem in stems)


def closure(roots: list[str], method: str | None = None) -> dict[str, Path]:
    """{module: file} of `roots` and every project module they import at module level, transitively, leaving out
    the method registry and the per-method modules that only the packages' registries import (every method's
    file, engine layer), but `method`'s (e.g. "oscar"; None: none). A module that a followed module imports directly
    is followed (a variant's file that builds on another method's); a root is always in."""
    own = {f"{package}.{method}" for package in METHOD_PACKAGES} if method else set()
    registries = set(METHOD_PACKAGES)
    others = method_files() - own
    seen: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        path = module_file(name)
        if path is None or name in seen or (name == REGISTRY and name not in roots):
            continue
        seen[name] = path
        imported = imports_of(name, path)
        todo.extend(m for m in imported if not (name in registries and m in others))
    return dict(sorted(seen.items()))


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            node.body = body[1:] or [ast.Pass()]
    return tree


def _canonical(node: Any) -> str:
    """The tree as text: node types and non-empty fields only, so the same code reads the same under Python versions
    that add fields (type parameters) or print defaults differently; positions and comments are not in the tree."""
    if isinstance(node, ast.AST):
        fields = [(k, v) for k, v in ast.iter_fields(node) if v not in (None, []) and k != "ctx"]
        return type(node).__name__ + "(" + ",".join(f"{k}={_canonical(v)}" for k, v in fields) + ")"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(v) for v in node) + "]"
    return repr(node)


@lru_cache(maxsize=None)
def _file_digest(path: Path, mtime_ns: int) -> str:
    if path.suffix == ".py":
        text = _canonical(_strip_docstrings(ast.parse(path.read_text(encoding="utf-8"))))
        return hashlib.sha256(text.encode()).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digest(files: dict[str, Path]) -> str:
    """One digest over the named files (name and content digest of each, in name order): the first scheme, which
    results written before `definitions_digest` record ("sha256:..."); kept to compare them with this checkout."""
    h = hashlib.sha256()
    for name, path in sorted(files.items()):
        h.update(f"{name}\0{_file_digest(path, path.stat().st_mtime_ns)}\n".encode())
    return "sha256:" + h.hexdigest()[:16]


# The scheme of new results: a digest of the definitions, wherever they live ("defs:..."). Moving a function or a
# class to another module of the same closure, and updating the imports that reach it, leaves it unchanged; any
# change of what the code does changes it.
DEFS = "defs:"


def _import_aliases(tree: ast.Module, package: str) -> tuple[set[str], dict[str, str]]:
    """Names the file binds by importing: (aliases of project modules, whose attribute reads `alias.x` are read as
    `x`; {local name: imported name} for names imported from a module under another name)."""
    modules, renamed = set(), {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name.split(".")[0] in PACKAGES:
                    modules.add(a.asname)
        elif isinstance(node, ast.ImportFrom):
            base = _from_module(node, package)
            for a in node.names:
                local = a.asname or a.name
                if base.split(".")[0] in PACKAGES and module_file(f"{base}.{a.name}"):
                    modules.add(local)
                elif a.asname:
                    renamed[a.asname] = a.name
    return modules, renamed


class _Unplace(ast.NodeTransformer):
    """Takes out where a definition lives: imports go, `alias.x` of a project module reads `x`, a name imported
    under another name reads as the original."""

    def __init__(self, modules: set[str], renamed: dict[str, str]):
        self.modules, self.renamed = modules, renamed

    def visit_Import(self, node):
        return None  # a statement list drops it

    visit_ImportFrom = visit_Import

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id in self.modules:
            return ast.copy_location(ast.Name(id=node.attr, ctx=node.ctx), node)
        return self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in self.renamed:
            return ast.copy_location(ast.Name(id=self.renamed[node.id], ctx=node.ctx), node)
        return node


@lru_cache(maxsize=None)
def _definitions(name: str, path: Path, mtime_ns: int) -> tuple[str, ...]:
    """The canonical text of each module-level statement of a file, placed nowhere (_Unplace); a non-Python file
    (CUDA sources) is one entry: its bytes' digest."""
    if path.suffix != ".py":
        return (hashlib.sha256(path.read_bytes()).hexdigest(),)
    tree = _strip_docstrings(ast.parse(path.read_text(encoding="utf-8")))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = _Unplace(*_import_aliases(tree, package)).visit(tree)
    return tuple(_canonical(node) for node in tree.body)


def definitions_digest(files: dict[str, Path]) -> str:
    """One digest over every module-level definition of the named files, in sorted order, whichever file holds it:
    a move between these files (the imports updated) keeps it; a change of code changes it."""
    h = hashlib.sha256()
    texts = sorted(t for name, path in files.items() for t in _definitions(name, path, path.stat().st_mtime_ns))
    for text in texts:
        h.update(hashlib.sha256(text.encode()).digest())
    return DEFS + h.hexdigest()[:16]


def scheme_of(parts: dict[str, str] | None) -> str:
    """The digest scheme a result's code parts were written in: DEFS, or the first one ("sha256:")."""
    return DEFS if any(str(v).startswith(DEFS) for v in (parts or {}).values()) else "sha256:"


def kernel_files() -> dict[str, Path]:
    """The kernel backends' Python modules and the CUDA sources they compile."""
    root = module_file(KERNELS)
    files = closure([f"{KERNELS}.{p.stem}" for p in sorted(root.parent.glob("*.py"))]) if root else {}
    csrc = _package_root("quant")
    for folder in ([csrc / "csrc"] if csrc and (csrc / "csrc").is_dir() else []) + [Path(__file__).parents[1] / "csrc"]:
        if folder.is_dir():
            files.update(
                {
                    f"csrc/{p.relative_to(folder)}": p
                    for p in sorted(folder.rglob("*"))
                    if p.suffix in (".cu", ".cuh", ".h", ".cpp")
                }
            )
            break
    return files


def code_parts(
    method_module: str,
    task_module: str,
    model_module: str,
    backend: str = "torch",
    synthetic: str | None = None,
    scheme: str = DEFS,
) -> dict[str, str]:
    """{part: digest} of the code a run goes through: the method, the task, the model path (the adapter, the builder
    of its random weights where used: `synthetic`, the family's synthetic module; the eval loop) and, on a kernel
    backend, the kernels. `scheme`: DEFS (new results) or "sha256:" (the first scheme, to compare older results)."""
    model_roots = [model_module, *LOOP] + ([synthetic] if synthetic else [])
    own = method_module.rpartition(".")[2] if method_module.rpartition(".")[0] == REGISTRY else None
    of = definitions_digest if scheme == DEFS else digest
    parts = {
        "method": of(closure([method_module, *CACHE], method=own)),
        "task": of(closure([task_module])),
        "model": of(closure(model_roots)),
        "prepare": of(closure(list(PREPARE))),
    }
    if backend != "torch":
        parts["kernels"] = of(kernel_files())
    return parts


def parts_for(method: Any, task: Any, adapter: Any, backend: str, weights: str = "real") -> dict[str, str]:
    """code_parts of a run from its objects."""
    return code_parts(
        type(method).__module__,
        type(task).__module__,
        type(adapter).__module__,
        backend,
        synthetic_module(adapter.spec.family) if weights == "random" else None,
    )


def synthetic_module(family: str) -> str:
    """The module that builds a family's models with random weights (it imports the shared builder)."""
    from harness.models import FAMILIES

    return f"{FAMILIES.get(family, f'harness.models.{family}')}.synthetic"


def current_parts(result: dict[str, Any], scheme: str | None = None) -> dict[str, str] | None:
    """code_parts as this checkout would record them for `result`'s run, in the scheme the result recorded (default);
    None when its method, task or model is not registered here."""
    import tasks as T
    from harness import models as M
    from quant.methods import METHODS

    config, model = result["method"]["config"], result["model"]
    cls = METHODS.get(config.get("method"))
    task = T.TASKS.get(result["task"]["name"])
    spec = M.MODELS.get(model["name"])
    if cls is None or task is None or spec is None:
        return None
    synthetic = synthetic_module(spec.family) if model.get("weights") == "random" else None
    return code_parts(
        cls.__module__,
        task.split(":")[0],
        M.family_of(spec.name).adapter.split(":")[0],
        result["backend"],
        synthetic,
        scheme or scheme_of(result.get("code")),
    )


def preset_drift(result: dict[str, Any]) -> str | None:
    """How a result named after a preset differs from what its name means now: the preset as defined now, plus the
    fields its name says were changed (quant.methods.label, e.g. oscar+group_size=64). A field the config lacks (a
    setting added since it ran) differs too. None when they are the same."""
    from harness import results as R
    from quant.methods import PRESETS, get_method

    method = result["method"]
    preset, config = method.get("preset", method["name"]), method["config"]
    if preset not in PRESETS:
        return None
    config_part = method["name"].split("@")[0]  # after an "@": run settings (harness.run.run_tags), not the config
    changes = dict(part.split("=", 1) for part in config_part.split("+")[1:] if "=" in part)
    try:
        now = R.jsonable(get_method(preset, **changes).to_dict())
    except (ValueError, TypeError) as err:
        return f"its name {method['name']!r} no longer makes a {preset} config ({err})"
    diff = [
        f"{k} {config.get(k, 'absent')!r} -> {now.get(k, 'absent')!r}"
        for k in sorted(set(config) | set(now))
        if config.get(k, "absent") != now.get(k, "absent")
    ]
    return f"config differs from {method['name']} now ({', '.join(diff)})" if diff else None


def stale_reasons(result: dict[str, Any]) -> list[str]:
    """Why `result` is not what this checkout computes for its run: its config differs from the preset it is named
    after, its task version or a code part changed, or it records no code. Empty when up to date."""
    reasons = [drift] if (drift := preset_drift(result)) else []
    try:
        import tasks as T

        version = int(T.get_task(result["task"]["name"]).version)
        if version != result["task"]["version"]:
            reasons.append(f"task version {result['task']['version']} -> {version}")
    except (KeyError, ImportError):
        pass
    now = current_parts(result)
    return reasons + (code_changes(result, now) if now is not None or result.get("code") is None else [])


def code_changes(result: dict[str, Any], now: dict[str, str]) -> list[str]:
    """How the code parts `result` recorded differ from `now` (code_parts): one line naming the parts that changed
    and the commit the result ran at, or that it records none; empty when they are the same."""
    recorded, commit = result.get("code"), (result["environment"].get("git_commit") or "?")[:8]
    if recorded is None:
        return [f"records no code fingerprint (ran at {commit})"]
    if scheme_of(recorded) != scheme_of(now):  # a result of the first scheme: compare it in that scheme
        now = current_parts(result) or now
    parts = set(recorded) | {part for part in now if part not in LATER_PARTS}
    changed = [part for part in sorted(parts) if recorded.get(part) != now.get(part)]
    return [f"{', '.join(changed)} code changed since {commit}"] if changed else []
