"""Building and loading the CUDA extensions of csrc/ (built on demand, cached): the decode and pack kernels per head
dim and register budget (`load`), the decode-time layer kernels once (`load_layers`: GEMV, RMSNorm, RoPE).

`load(head_dim)` compiles csrc/oscar_bindings.cu through torch.utils.cpp_extension.load for one
specialization (head dim, target arch, register budget) under a deterministic name that includes a
hash of the sources and flags, in a cache directory (OSCAR_KERNEL_CACHE, else
$XDG_CACHE_HOME/oscar-eval/kernels, else ~/.cache/oscar-eval/kernels): the first call builds (about a
minute, said on stderr first), later calls and later processes reuse the build.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import os
import sys
import warnings
from pathlib import Path

import torch


def _csrc() -> Path:
    """The CUDA sources: the package's quant.csrc (the top-level csrc/ mapped into it by pyproject.toml, in a wheel
    and in an editable install); for a checkout used without installing (PYTHONPATH=.), csrc/ beside quant/."""
    try:
        return Path(str(importlib.resources.files("quant.csrc")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[3] / "csrc"


CSRC = _csrc()


SOURCES = (
    "oscar_bindings.cu",
    "include/oscar_common.cuh",
    "include/oscar_layout.cuh",
    "include/oscar_decode.cuh",
    "include/oscar_decode_impl.cuh",
    "include/oscar_combine.cuh",
    "include/oscar_pack.cuh",
    "include/oscar_floor.cuh",
    "include/oscar_msg.h",
)


def cache_dir() -> Path:
    if os.environ.get("OSCAR_KERNEL_CACHE"):
        return Path(os.environ["OSCAR_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "oscar-eval" / "kernels"


def is_built(name: str) -> bool:
    """Whether the build `name` is in the cache (torch's loader then imports it without running nvcc)."""
    from torch.utils.cpp_extension import LIB_EXT

    return (cache_dir() / name / f"{name}{LIB_EXT}").is_file()


def build_notice(what: str, name: str) -> str:
    return (
        f"quant.kernels: building {what} ({name}) with nvcc: about a minute, once; later runs reuse it from "
        f"{cache_dir()}"
    )


def announce_build(what: str, name: str) -> None:
    """Say on stderr (above a tqdm bar, where one is drawn) that `name` builds now, unless it is cached: a first run
    on a fresh machine otherwise sits on its first item's progress line, without a word, for the minute nvcc takes."""
    from tqdm import tqdm

    if not is_built(name):
        tqdm.write(build_notice(what, name), file=sys.stderr)


def target_arch(device: torch.device | None = None) -> str:
    """'90a' on Hopper (sm_90a), else the device's 'XY'. The kernels need mma.sync: sm_80 or newer."""
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        raise RuntimeError(f"the OScaR CUDA kernels need compute capability >= 8.0, this GPU has {major}.{minor}")
    return "90a" if (major, minor) == (9, 0) else f"{major}{minor}"


# Rows of one CTA (one split, the window folded, V's rotation in the weights) of at most this many packed tokens run
# csrc's decode_row_kernel: the window after the groups in the same state, the output written without a merge
# (oscar_combine.cuh); longer rows lose more in its group loop than they save (docs/PERFORMANCE.md, The split plan).
ROW_KERNEL_TOKENS = 24576


def build_flags(head_dim: int, arch: str, min_blocks: int, warps: int = 4) -> list[str]:
    """nvcc flags of one specialization; OSCAR_KERNEL_FLAGS (e.g. "-DOSCAR_STAGES=5") adds flags for experiments
    (they enter the build's name, so each experiment gets its own build)."""
    extra = os.environ.get("OSCAR_KERNEL_FLAGS", "").split()
    return [
        "-O3",
        "-std=c++17",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        f"-DOSCAR_HEAD_DIM={head_dim}",
        f"-DOSCAR_MIN_BLOCKS={min_blocks}",
        f"-DOSCAR_ROW_KERNEL_TOKENS={ROW_KERNEL_TOKENS}",
        "-lineinfo",
        *([f"-DOSCAR_WARPS={warps}"] if warps != 4 else []),
        *extra,
    ]


def specialization_name(head_dim: int, arch: str, min_blocks: int, warps: int = 4) -> str:
    """oscar_d{D}_sm{arch}_b{min_blocks}[_w{warps}]_{hash of sources and flags}: one build per specialization."""
    h = hashlib.sha256()
    for rel in SOURCES:
        h.update((CSRC / rel).read_bytes())
    h.update(" ".join(build_flags(head_dim, arch, min_blocks, warps)).encode())
    return f"oscar_d{head_dim}_sm{arch}_b{min_blocks}{f'_w{warps}' if warps != 4 else ''}_{h.hexdigest()[:12]}"


def load(head_dim: int, arch: str | None = None, min_blocks: int = 3, verbose: bool = False, warps: int = 4):
    """The extension for one head dim (`build`), imported once per process for these arguments and the experiment
    flags (OSCAR_KERNEL_FLAGS): a benchmark that changes the flags between calls gets each one's build."""
    return _loaded(head_dim, arch, min_blocks, verbose, warps, os.environ.get("OSCAR_KERNEL_FLAGS", ""))


@functools.lru_cache(maxsize=None)
def _loaded(head_dim: int, arch: str | None, min_blocks: int, verbose: bool, warps: int, flags: str):
    return build(head_dim, arch, min_blocks, verbose, warps)


def build(head_dim: int, arch: str | None = None, min_blocks: int = 3, verbose: bool = False, warps: int = 4):
    """Build (or reuse) and import the extension for one head dim; returns the module (decode, pack). warps: of a
    decode CTA (4; `WIDE` builds 8 and `WIDE_LONG` 12 with min_blocks 1)."""
    if head_dim not in (64, 128):
        raise ValueError(f"head_dim {head_dim} is not supported by the CUDA kernels (64 or 128)")
    arch = arch or target_arch()
    name = specialization_name(head_dim, arch, min_blocks, warps)
    announce_build(f"the CUDA decode and pack kernels for head dim {head_dim}", name)
    return load_extension(
        name, CSRC / "oscar_bindings.cu", build_flags(head_dim, arch, min_blocks, warps), cache_dir() / name, verbose
    )


def load_extension(name: str, source: Path, cuda_flags: list[str], build: Path, verbose: bool = False):
    """torch's extension loader for one source, under a lock the OS drops when its holder dies.

    torch's own lock is a `lock` file in the build folder that only a build which returns removes: after one that was
    killed (a timeout, a second Ctrl-C) every later load of that build would wait on it forever, without a word. Every
    build here holds the kernel lock first, so a `lock` file found while holding it was left by such a build: it is
    removed, said on stderr, and the build starts again. Two processes building the same thing wait for each other
    and the second imports the first one's build."""
    import fcntl

    from torch.utils.cpp_extension import load as cpp_load
    from tqdm import tqdm

    build.mkdir(parents=True, exist_ok=True)
    with open(build / "oscar-build.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        stale = build / "lock"
        if stale.exists():
            tqdm.write(
                f"quant.kernels: {stale} was left by a build of {name} that was stopped before it ended; removed, "
                "building again",
                file=sys.stderr,
            )
            stale.unlink(missing_ok=True)
        return cpp_load(
            name=name,
            sources=[str(source)],
            extra_cuda_cflags=cuda_flags,
            extra_include_paths=[str(CSRC)],
            build_directory=str(build),
            verbose=verbose,
        )


LAYER_SOURCES = (
    "layer_bindings.cu",
    "include/oscar_type16.cuh",
    "include/oscar_gemv.cuh",
    "include/oscar_rmsnorm.cuh",
    "include/oscar_rope.cuh",
    "include/oscar_msg.h",
)


def layer_flags(arch: str) -> list[str]:
    return ["-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-lineinfo"]


def layers_name(arch: str) -> str:
    """oscar_layers_sm{arch}_{hash of sources and flags}: the layer kernels' build for one target arch."""
    h = hashlib.sha256()
    for rel in LAYER_SOURCES:
        h.update((CSRC / rel).read_bytes())
    h.update(" ".join(layer_flags(arch)).encode())
    return f"oscar_layers_sm{arch}_{h.hexdigest()[:12]}"


@functools.lru_cache(maxsize=None)
def load_layers(arch: str | None = None, verbose: bool = False):
    """Build (or reuse) and import the decode-time layer kernels (csrc/layer_bindings.cu: GEMV, RMSNorm, RoPE): one
    build per target arch, named oscar_layers_sm{arch}_{hash of sources and flags}, in `cache_dir()`."""
    arch = arch or target_arch()
    name = layers_name(arch)
    announce_build("the CUDA layer kernels (GEMV, RMSNorm, RoPE)", name)
    return load_extension(name, CSRC / "layer_bindings.cu", layer_flags(arch), cache_dir() / name, verbose)


_LAYERS_FAILED: list[str] = []


def layers_ready() -> bool:
    """Whether the layer extension is built (or builds now). Where it cannot build (no nvcc, an old GPU), a patched
    model warns once and keeps torch's linear layers and the Triton norms and RoPE instead of failing the run."""
    if _LAYERS_FAILED:
        return False
    try:
        load_layers()
        return True
    except Exception as e:  # noqa: BLE001 - any build or import error means: use the fallbacks
        _LAYERS_FAILED.append(f"{type(e).__name__}: {e}")
        warnings.warn(
            f"quant.kernels.cuda: the decode-time layer extension did not build ({_LAYERS_FAILED[0][:300]}); "
            "linear layers stay on torch, RMSNorm and RoPE on Triton (kernel options fused_linear=off and "
            "layer_kernels=triton silence this)",
            stacklevel=3,
        )
        return False


def layer_kernels_on(device: torch.device) -> bool:
    """Whether patched RMSNorms and RoPE asked for CUDA launches (KernelOptions.layer_kernels="cuda") can have them
    on `device`: a CUDA device where nvcc is (quant.kernels.default_backend) and the extension built; else they take
    the Triton kernels. The kernels are the same formula; the C++ launch costs a few microseconds where Triton's
    Python launcher costs tens, which bounds eager decoding."""
    on = _LAYER_KERNELS_ON.get(device)
    if on is None:  # decided once per device: this runs before each of a decode step's 181 launches
        from quant.kernels.options import default_backend

        on = _LAYER_KERNELS_ON[device] = default_backend(device) == "cuda" and layers_ready()
    return on


_LAYER_KERNELS_ON: dict[torch.device, bool] = {}
