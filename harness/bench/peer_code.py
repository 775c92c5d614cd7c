"""The peers' own code as `oscar-eval bench --what peers` runs it (harness/bench/peers.py): which peers a run names
(`parse_peers`), each one's loader (the official OScaR and KIVI: their extensions built from the user's checkout,
their pack and decode step; LMDeploy and vLLM: an import probe) and the `Peer` each becomes."""

from __future__ import annotations

import hashlib
import importlib.util
import math
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

KNOWN = ("oscar", "kivi", "lmdeploy", "vllm")
NOT_AVAILABLE = "not available on this machine"
REPO = Path(__file__).resolve().parents[2]


class PeerUnavailable(RuntimeError):
    """A peer that cannot run on this machine; the message says why (shown in the table's notes)."""


@dataclass
class Step:
    """One peer's decode step over a filled cache: fn() -> output [B, Hq, 1, D]; bits per element of its packed part."""

    fn: Callable
    bits: float
    graph: bool = True  # capturable in a CUDA graph (else timed eagerly)
    note: str = ""


@dataclass
class Peer:
    name: str
    path: Path | None
    version: str = "unknown"
    impl: object = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def parse_peers(specs: list[str]) -> dict[str, Path | None]:
    """['oscar=/src/OScaR-KV-Quant', 'vllm'] -> {name: path or None (an installed package)}."""
    out = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        name = name.strip().lower()
        if name not in KNOWN:
            raise SystemExit(f"--peer {spec!r}: unknown peer {name!r}; known: {', '.join(KNOWN)} (as NAME=PATH)")
        if name in ("oscar", "kivi") and not path:
            raise SystemExit(f"--peer {name} needs the path of its checkout: --peer {name}=/path/to/checkout")
        p = Path(path).expanduser().resolve() if path else None
        if p is not None and not p.exists():
            raise SystemExit(f"--peer {spec!r}: {p} does not exist")
        out[name] = p
    return out


def git_version(path: Path) -> str | None:
    """The checkout's short commit (no network), or None where it is not a git checkout."""
    try:
        res = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short=7", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None


def load_file(module_name: str, path: Path):
    """Import a peer's Python file under a name of ours (KIVI's package is called `quant`, as this project's is)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def build_extension(
    name: str, root: Path, sources: list[str], includes: list[str], cuda_flags: list[str], cxx_flags: list[str]
):
    """Build (or reuse) a peer's torch extension named `name` (its Python code imports that name) from `root`'s
    sources, for this GPU's arch, into cache_dir()/peers/<name>-<hash>; registered in sys.modules."""
    import torch
    from torch.utils.cpp_extension import load

    from quant.kernels.cuda import cache_dir

    major, minor = torch.cuda.get_device_capability()
    arch = [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]
    h = hashlib.sha256(" ".join(cuda_flags + cxx_flags + arch).encode())
    for s in sources:
        h.update((root / s).read_bytes())
    build = cache_dir() / "peers" / f"{name}-{h.hexdigest()[:12]}"
    build.mkdir(parents=True, exist_ok=True)
    try:
        mod = load(
            name=name,
            sources=[str(root / s) for s in sources],
            extra_include_paths=[str(root / i) for i in includes],
            extra_cflags=cxx_flags,
            extra_cuda_cflags=cuda_flags + arch,
            build_directory=str(build),
        )
    except Exception as e:
        raise PeerUnavailable(f"its extension did not build here ({type(e).__name__}: {str(e)[-300:]})") from e
    sys.modules[name] = mod
    return mod


class OfficialOScaR:
    """The official OScaR's pack and decode step (see the module docstring)."""

    BITS, GROUP, RESIDUAL = 2, 32, 256  # its Qwen3 2-bit k-channel path: 256-token pack blocks and residual buffer

    def __init__(self, root: Path):
        if not (root / "csrc/oscar/decode_api.cpp").is_file():
            raise PeerUnavailable(f"{root} is not an OScaR-KV-Quant checkout (no csrc/oscar/decode_api.cpp)")
        if not (root / "libs/cutlass/include/cute").is_dir():
            raise PeerUnavailable(f"{root}/libs/cutlass/include is missing: run `git submodule update --init` there")
        src = "csrc/oscar/src/"
        sources = ["csrc/oscar/decode_api.cpp", src + "k_preprocess.cu"] + [
            src + "genfile/" + f
            for f in (
                "flash_fwd_hdim128_fp16_sm80.cu",
                "flash_qpack_hdim128_fp16_sm80_2bit.cu",
                "flash_qpack_hdim128_fp16_sm80_4bit.cu",
                "flash_fwd_split_hdim128_fp16_sm80_2bit.cu",
                "flash_fwd_split_hdim128_fp16_sm80_4bit.cu",
            )
        ]
        # the flags of its setup.py
        cuda = [
            "-O3",
            "-std=c++17",
            "-U__CUDA_NO_HALF_OPERATORS__",
            "-U__CUDA_NO_HALF_CONVERSIONS__",
            "-U__CUDA_NO_HALF2_OPERATORS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "--expt-relaxed-constexpr",
            "--expt-extended-lambda",
            "--use_fast_math",
            "--threads",
            "4",
        ]
        build_extension(
            "oscar_cuda",
            root,
            sources,
            ["csrc/oscar", "csrc/oscar/src", "libs/cutlass/include"],
            cuda,
            ["-O3", "-std=c++17"],
        )
        self.api = load_file("oscar_official_interface", root / "oscar/oscar_interface.py")

    def step(self, q, k, v) -> Step:
        import torch

        api, f16 = self.api, torch.float16
        b, hkv, t, d = k.shape
        packed = (t - 1) // self.RESIDUAL * self.RESIDUAL
        window = t - packed
        per = 16 // self.BITS
        dev = k.device
        ks, vs = (x[:, :, :packed].transpose(1, 2).to(f16).contiguous() for x in (k, v))  # [B, T, H, D]
        u16, f32 = {"dtype": torch.uint16, "device": dev}, {"dtype": torch.float32, "device": dev}
        k_pack = torch.zeros(b, packed // per, hkv, d, **u16)
        k_params = torch.zeros(b, packed // self.GROUP, hkv, d, **f32)
        v_pack = torch.zeros(b, packed, hkv, d // per, **u16)
        v_params = torch.zeros(b, d // self.GROUP, hkv, packed, **f32)
        cu = torch.arange(0, (b + 1) * packed, packed, dtype=torch.int32, device=dev)
        k_norm = api.kvcache_pack_int(
            ks,
            k_pack,
            k_params,
            vs,
            v_pack,
            v_params,
            None,
            cu,
            packed,
            "k-channel",
            self.GROUP,
            self.BITS,
            apply_k_hadamard=True,
            apply_k_norm=True,
        )
        k_res = torch.zeros(b, self.RESIDUAL, hkv, d, dtype=f16, device=dev)
        v_res = torch.zeros_like(k_res)
        kw, norm_w = api.preprocess_k_cache(k[:, :, packed:].transpose(1, 2).to(f16).contiguous(), True, True)
        k_res[:, :window] = kw
        v_res[:, :window] = v[:, :, packed:].transpose(1, 2).to(f16)
        norm_res = torch.ones(b, self.RESIDUAL, **f32)
        norm_res[:, :window] = norm_w.float()
        lens = torch.full((b,), packed, dtype=torch.int32, device=dev)
        blk = 128  # its residual_block_size: the buffers a step may pack a full window into
        new = (
            torch.empty(b, blk // per, hkv, d, **u16),
            torch.empty(b, blk // self.GROUP, hkv, d, **f32),
            torch.empty(b, blk, hkv, d // per, **u16),
            torch.empty(b, d // self.GROUP, hkv, blk, **f32),
        )
        qs = q.transpose(1, 2).to(f16).contiguous()  # [B, 1, Hq, D]

        def fn():
            qr, _ = api.preprocess_k_cache(qs, apply_hadamard=True, apply_norm=False)
            out = api.fwd_kvcache_int(
                qr.contiguous(),
                k_pack,
                k_params,
                v_pack,
                v_params,
                k_res,
                v_res,
                lens,
                *new,
                None,
                d**-0.5,
                "k-channel",
                self.GROUP,
                blk,
                window,
                self.BITS,
                k_norm,
                norm_res,
            )[0]
            return out.transpose(1, 2)

        nbytes = sum(x.nbytes for x in (k_pack, k_params, v_pack, v_params)) + (
            k_norm.nbytes if k_norm is not None else 0
        )
        return Step(fn, 8 * nbytes / (2 * b * hkv * packed * d), note=f"{window}-token fp16 window")


class Kivi:
    """KIVI's pack and decode attention (see the module docstring)."""

    BITS, GROUP, RESIDUAL = 2, 32, 128

    def __init__(self, root: Path):
        if not (root / "quant/csrc/gemv_cuda.cu").is_file():
            raise PeerUnavailable(f"{root} is not a KIVI checkout (no quant/csrc/gemv_cuda.cu)")
        cuda = [
            "-O3",
            "-std=c++17",
            "-DENABLE_BF16",
            "-U__CUDA_NO_HALF_OPERATORS__",
            "-U__CUDA_NO_HALF_CONVERSIONS__",
            "-U__CUDA_NO_BFLOAT16_OPERATORS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
            "-U__CUDA_NO_BFLOAT162_OPERATORS__",
            "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
            "--expt-relaxed-constexpr",
            "--expt-extended-lambda",
            "--use_fast_math",
        ]  # its quant/setup.py
        build_extension(
            "kivi_gemv",
            root,
            ["quant/csrc/pybind.cpp", "quant/csrc/gemv_cuda.cu"],
            [],
            cuda,
            ["-O3", "-std=c++17", "-DENABLE_BF16"],
        )
        self.pack = load_file("kivi_new_pack", root / "quant/new_pack.py").triton_quantize_and_pack_along_last_dim
        self.bmm = load_file("kivi_matmul", root / "quant/matmul.py").cuda_bmm_fA_qB_outer

    def step(self, q, k, v) -> Step:
        import torch

        f16 = torch.float16
        b, hkv, t, d = k.shape
        group = q.shape[1] // hkv
        packed = t - self.RESIDUAL
        kq, k_scale, k_mn = self.pack(k[:, :, :packed].to(f16).transpose(2, 3).contiguous(), self.GROUP, self.BITS)
        vq, v_scale, v_mn = self.pack(v[:, :, :packed].to(f16).contiguous(), self.GROUP, self.BITS)
        k_full, v_full = (x[:, :, packed:].to(f16).contiguous() for x in (k, v))
        qh = q.to(f16)

        def repeat(x):  # transformers' repeat_kv, as its model calls it
            return x[:, :, None].expand(b, hkv, group, *x.shape[2:]).reshape(b, hkv * group, *x.shape[2:])

        def fn():
            s_q = self.bmm(self.GROUP, qh, kq, k_scale, k_mn, self.BITS)
            s_f = torch.matmul(qh, repeat(k_full).transpose(2, 3))
            w = torch.cat([s_q, s_f], dim=-1) / math.sqrt(d)
            w = torch.softmax(w, dim=-1, dtype=torch.float32).to(f16)
            out = self.bmm(self.GROUP, w[:, :, :, :packed], vq, v_scale, v_mn, self.BITS)
            return out + torch.matmul(w[:, :, :, packed:], repeat(v_full))

        nbytes = sum(x.nbytes for x in (kq, k_scale, k_mn, vq, v_scale, v_mn))
        return Step(
            fn,
            8 * nbytes / (2 * b * hkv * packed * d),
            graph=False,
            note=f"{self.RESIDUAL}-token fp16 window; its GEMV launches on the legacy default stream, which a "
            "CUDA graph cannot capture unless patched to launch on the current stream",
        )


def probe_package(name: str, path: Path | None):
    """LMDeploy / vLLM: importable here? Raises PeerUnavailable with the reason either way (no adapter times them)."""
    if path is not None:
        sys.path.insert(0, str(path))
    try:
        mod = importlib.import_module(name)
    except Exception as e:
        raise PeerUnavailable(f"{NOT_AVAILABLE}: `import {name}` failed ({type(e).__name__}: {str(e)[:160]})") from e
    version = getattr(mod, "__version__", "unknown")
    raise PeerUnavailable(f"not timed: {name} {version} imports, but this bench has no adapter for its decode kernel")


def load_peers(specs: dict[str, Path | None]) -> list[Peer]:
    """Build and load each peer; one that cannot run keeps its reason in .error."""
    peers = []
    for name, path in specs.items():
        peer = Peer(name, path)
        if path is not None:
            peer.version = git_version(path) or peer.version
        try:
            if name == "oscar":
                peer.impl = OfficialOScaR(path)
            elif name == "kivi":
                peer.impl = Kivi(path)
            else:
                probe_package(name, path)
        except PeerUnavailable as e:
            peer.error = str(e)
        if name in ("lmdeploy", "vllm") and peer.version == "unknown":
            from importlib.metadata import PackageNotFoundError, version

            try:
                peer.version = version(name)
            except PackageNotFoundError:
                peer.version = "not installed"
        print(f"peer {name}: {peer.version}: {peer.error or 'ready'}", flush=True)
        peers.append(peer)
    return peers
