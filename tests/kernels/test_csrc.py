"""CUDA sources: they compile for sm_90a with the machine's nvcc (CI), and on a GPU the kernels match the
float64 oracle (decode: within 2x the error of a bf16 torch implementation) and the reference packer."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import types
from pathlib import Path

import pytest
import torch

from quant.kernels import cuda as kcuda
from quant.kernels.reference import attention_bf16, attention_f64, random_packed_kv, relative_error
from quant.methods.oscar import OScaRConfig, pack_block
from quant.primitives import hadamard

NVCC = shutil.which("nvcc")
# A cold sm_90a compile of csrc/compile_check.cu is slow, and slower still on loaded cores (make test): the limit is
# generous, and each compile is kept (nvcc_compile) so that it runs once per change of the sources, flags or nvcc.
NVCC_TIMEOUT_S = 900
SM90A = ["-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v"]  # -v: ptxas reports each kernel


def nvcc_compile(tag: str, source: str, flags: list[str], tmp_path: Path) -> tuple[Path, str]:
    """Compile `source` (a .cu file's text, its #includes relative to csrc/) with nvcc and `flags` -> (the object,
    nvcc's stderr: ptxas -v's report). A compile that succeeded is kept in `kcuda.cache_dir()`/nvcc-checks under a
    hash of the source, every csrc/include file, the flags and nvcc's version, and reused from there: a second run
    costs nothing. Says (print: pytest -s or -rP) how long the compile took or that it was reused."""
    version = subprocess.run([NVCC, "--version"], capture_output=True, text=True, timeout=60).stdout
    h = hashlib.sha256("\0".join([NVCC, version, *flags, source]).encode())
    for header in sorted((kcuda.CSRC / "include").rglob("*")):
        if header.is_file():
            h.update(str(header.relative_to(kcuda.CSRC)).encode() + b"\0" + header.read_bytes())
    root = kcuda.cache_dir() / "nvcc-checks"
    entry = root / f"{tag}_{h.hexdigest()[:16]}"
    obj, log, meta = entry / f"{tag}.o", entry / "nvcc.stderr", entry / "meta.json"
    if obj.is_file() and log.is_file() and meta.is_file():
        seconds = json.loads(meta.read_text())["seconds"]
        print(f"nvcc {tag}: reused from {entry} (compiled in {seconds:.1f} s)")
        return obj, log.read_text()
    try:  # compile into a folder of the cache, renamed into place once complete (another run may race this one)
        root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{tag}_", dir=root))
        work.chmod(0o755)
    except OSError:  # a read-only cache: compile where the test writes, keep nothing
        work, entry = tmp_path / "nvcc", None
        work.mkdir()
    (work / f"{tag}.cu").write_text(source)
    cmd = [NVCC, *flags, "-I", str(kcuda.CSRC), "-c", str(work / f"{tag}.cu"), "-o", str(work / f"{tag}.o")]
    t0 = time.monotonic()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        shutil.rmtree(work, ignore_errors=True)
        pytest.fail(
            f"nvcc {tag} ran past {NVCC_TIMEOUT_S} s (load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores): {' '.join(cmd)}"
        )
    seconds = time.monotonic() - t0
    print(
        f"nvcc {tag}: compiled in {seconds:.1f} s (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
        f"cores){f', kept in {entry}' if entry and res.returncode == 0 else ''}"
    )
    if res.returncode != 0 and entry is not None:
        shutil.rmtree(work, ignore_errors=True)  # a failure is not kept: the next run compiles again
    assert res.returncode == 0, f"nvcc {tag} failed:\n{res.stderr[-4000:]}"
    if entry is None:
        return work / f"{tag}.o", res.stderr
    (work / "nvcc.stderr").write_text(res.stderr)
    (work / "meta.json").write_text(json.dumps({"seconds": round(seconds, 1), "cmd": cmd}))
    try:
        os.rename(work, entry)
    except OSError:  # another run kept the same compile first
        shutil.rmtree(work, ignore_errors=True)
    return obj, res.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: install the CUDA toolkit to compile csrc/")
def test_sources_compile_for_sm90a(tmp_path):
    # Every kernel specialization, torch-free, for Hopper's arch-specific target; no local-memory spills
    # beyond the decode kernel's small stack (reported by ptxas) would be a regression to look at.
    obj, stderr = nvcc_compile("compile_check", (kcuda.CSRC / "compile_check.cu").read_text(), SM90A, tmp_path)
    assert obj.is_file() and obj.stat().st_size > 0, stderr[-4000:]
    for kernel in ("decode_split_kernel", "pack_kernel", "gemv_kernel"):
        assert kernel in stderr, f"{kernel} was not compiled"
    # No STB_GNU_UNIQUE symbols: one would be shared by every build loaded in a process (narrow and WIDE decode), so a
    # launch's one-time setup done by one build would be skipped by the other (seen on an H100)
    if shutil.which("nm"):
        syms = subprocess.run(["nm", "-C", str(obj)], capture_output=True, text=True).stdout
        unique = [line for line in syms.splitlines() if line.split()[-2:-1] == ["u"] or " u " in line]
        assert not unique, "\n".join(unique[:5])


@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: install the CUDA toolkit to compile csrc/")
@pytest.mark.parametrize("build", ["WIDE", "WIDE_LONG"])
def test_wide_decode_compiles_without_spills(tmp_path, build):
    # The wide builds (one CTA an SM: quant/kernels/cuda/plan.py) of the decode kernels, both head dims and both window
    # dtypes, hold them without local memory: WIDE's 8 warps (255 registers a thread) the two-tile kernels too,
    # WIDE_LONG's 12 (168) the one-tile kernels, its only ones.
    min_blocks, warps = getattr(kcuda, build)
    src = '#include "include/oscar_decode.cuh"\n' + "".join(
        f"template cudaError_t oscar::launch_decode<{d}, {t}>(const oscar::DecodeParams&, int, cudaStream_t);\n"
        for d in (64, 128)
        for t in ("__half", "__nv_bfloat16")
    )
    flags = kcuda.build_flags(128, "90a", min_blocks, warps)
    assert f"-DOSCAR_WARPS={warps}" in flags and "-DOSCAR_MIN_BLOCKS=1" in flags
    obj, stderr = nvcc_compile(
        f"wide_decode_w{warps}", src, [*SM90A, f"-DOSCAR_WARPS={warps}", "-DOSCAR_MIN_BLOCKS=1"], tmp_path
    )
    assert obj.is_file() and obj.stat().st_size > 0, stderr[-4000:]
    spills = [line for line in stderr.splitlines() if "spill stores" in line]
    assert spills and all(line.strip().split()[4] == "0" for line in spills), "\n".join(spills)


# The extensions' loaders in quant.kernels.cuda and the csrc file whose PYBIND11_MODULE each one builds.
BINDING_SOURCES = {"load": "oscar_bindings.cu", "load_layers": "layer_bindings.cu"}


def binding_arities(source: str) -> dict[str, int]:
    """{binding: its C++ function's parameter count} of one csrc bindings file (m.def("name", &function, ...))."""
    text = (kcuda.CSRC / source).read_text()
    arities = {}
    for name, fn in re.findall(r'm\.def\("(\w+)",\s*&(\w+)', text):
        params = re.search(rf"\b{fn}\(([^()]*)\)\s*\{{", text).group(1)  # the definition: no parentheses inside
        depth, count = 0, int(bool(params.strip()))
        for ch in params:  # commas outside template brackets
            depth += (ch == "<") - (ch == ">")
            count += ch == "," and depth == 0
        arities[name] = count
    return arities


def binding_calls(path: Path) -> list[tuple[int, str, str, int]]:
    """(line, loader, binding, number of arguments) of each call of an extension's function in one Python file:
    `load(...).pack(...)`, `cuda.load_layers().gemv(...)`, or `mod.read_floor(...)` after `mod = cuda.load(...)`."""
    tree = ast.parse(path.read_text())
    modules, loaders = set(), {}  # names of quant.kernels.cuda, and of its loaders, in this file
    if path.resolve() == Path(kcuda.loader.__file__).resolve():
        loaders = {name: name for name in BINDING_SOURCES}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "quant.kernels":
            modules |= {a.asname or a.name for a in node.names if a.name == "cuda"}
        elif isinstance(node, ast.ImportFrom) and node.module in ("quant.kernels.cuda", "quant.kernels.cuda.loader"):
            loaders |= {a.asname or a.name: a.name for a in node.names if a.name in BINDING_SOURCES}
            modules |= {a.asname or a.name for a in node.names if a.name == "loader"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name == "quant.kernels.cuda" and a.asname}

    def loader(node):  # 'load' / 'load_layers' for a call of one, else None
        if not isinstance(node, ast.Call):
            return None
        f = node.func
        if isinstance(f, ast.Name):
            return loaders.get(f.id)
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules:
            return f.attr if f.attr in BINDING_SOURCES else None
        return None

    calls = []

    def visit(node, bound):  # bound: names holding an extension in this scope (and the scopes around it)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bound = {
                **bound,
                **{
                    a.targets[0].id: loader(a.value)
                    for a in ast.walk(node)
                    if isinstance(a, ast.Assign)
                    and len(a.targets) == 1
                    and isinstance(a.targets[0], ast.Name)
                    and loader(a.value)
                },
            }
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            recv = node.func.value
            kind = loader(recv) or (bound.get(recv.id) if isinstance(recv, ast.Name) else None)
            if kind and not any(isinstance(a, ast.Starred) for a in node.args):
                calls.append((node.lineno, kind, node.func.attr, len(node.args) + len(node.keywords)))
        for child in ast.iter_child_nodes(node):
            visit(child, bound)

    visit(tree, {})
    return calls


def test_binding_calls_match_their_signatures():
    # The CUDA bindings run only on a GPU, and so do most tests that call them: a call left with the arguments of an
    # older signature (test_binding_checks_raise_with_their_numbers' pack, after pack took integer_zero) would wait for
    # a GPU to fail. Every call in quant/kernels, harness/bench and tests/kernels is held here to csrc's signatures
    # (pybind11 takes these positionally, and all of them).
    arities = {kind: binding_arities(source) for kind, source in BINDING_SOURCES.items()}
    assert arities["load"]["pack"] == 6 and arities["load"]["decode"] == 7 and arities["load_layers"]["gemv"] == 5
    repo = Path(__file__).resolve().parents[2]
    files = [
        *(repo / "quant" / "kernels").rglob("*.py"),
        *(repo / "harness" / "bench").rglob("*.py"),
        *(repo / "tests" / "kernels").glob("*.py"),
    ]
    found, wrong = set(), []
    for path in sorted(files):
        for line, kind, name, nargs in binding_calls(path):
            if name in arities[kind]:
                found.add((path.relative_to(repo).as_posix(), name))
                if nargs != arities[kind][name]:
                    wrong.append(
                        f"{path.relative_to(repo)}:{line}: {name} with {nargs} arguments, "
                        f"csrc/{BINDING_SOURCES[kind]} takes {arities[kind][name]}"
                    )
    assert not wrong, "\n".join(wrong)
    # the scan sees the calls it is meant to (a scan that finds none would pass anything)
    assert {
        ("quant/kernels/cuda/decode.py", "decode"),
        ("quant/kernels/cuda/pack.py", "pack"),
        ("quant/kernels/cuda/layers.py", "rms_norm"),
        ("quant/kernels/fused_linear.py", "gemv"),
        ("harness/bench/floor.py", "read_floor"),
        ("tests/kernels/test_csrc.py", "pack"),
        ("tests/kernels/test_csrc.py", "decode"),
        ("tests/kernels/test_csrc.py", "rms_norm"),
    } <= found, found


def test_make_plan_is_the_planners_launch_with_overrides():
    # One DecodePlan per step shape: plan_launch's build and splits, cta_order's order, merge_plan's merge; the
    # batch-invariant plan depends on no other row; a bad order or merge group is refused by name.
    plan = kcuda.make_plan(130944, 32, 132, 4, 64, 128)  # LLaVA 1 x 128K
    assert (plan.min_blocks, plan.warps, plan.split_tokens, plan.splits, plan.window_cta) == kcuda.plan_launch(
        130944, 32, 132, 4, 64
    )
    assert plan.order == kcuda.cta_order(32, plan.splits, plan.window_cta, 132 * plan.min_blocks, 132)
    assert plan.ctas == 32 * plan.splits and plan.merge_groups == 0
    thinker = kcuda.make_plan(130944, 4, 132, 8, 64, 128, wide=False)  # NARROW: 64 splits, two merge levels
    assert (thinker.splits, thinker.window_cta, thinker.merge_group, thinker.merge_groups) == (64, True, 8, 8)
    assert thinker.launch_record() == {  # what a bench row records of it
        "splits": 64, "split_tokens": 2048, "window_cta": True, "order": 0, "merge_group": 8, "min_blocks": 3,
        "warps": 4, "ctas": 4 * 65,
    }  # fmt: skip
    for rows in (8, 64):  # batch 1 and 8 of 8 KV heads: the same split size, the window's own CTA, one merge level
        inv = kcuda.make_plan(4096, rows, 132, 4, 64, 128, invariant=True)
        assert (inv.min_blocks, inv.warps) == kcuda.NARROW and inv.split_tokens == 1024 and inv.splits == 4
        assert inv.window_cta and inv.order == kcuda.ORDER_ROWS and inv.merge_group == 0
    with pytest.raises(ValueError, match="order must be 0"):
        kcuda.make_plan(4096, 8, 132, 4, 64, 128, order=7)
    with pytest.raises(ValueError, match="merge_group must be >= 0"):
        kcuda.make_plan(4096, 8, 132, 4, 64, 128, merge_group=-1)
    with pytest.raises(ValueError, match="12-warp decode build holds up to 8 query rows"):
        kcuda.make_plan(4096, 8, 132, 16, 64, 128, min_blocks=1, warps=12)


def test_row_kernel_rule():
    # One rule on both sides: Python's (recorded in launch_plan) and the header's default, which the build overrides
    # with Python's value. The thinker's 64 x 4K plan (256 rows of one split, window folded) takes the row kernel.
    text = (kcuda.CSRC / "include" / "oscar_combine.cuh").read_text()
    assert f"#define OSCAR_ROW_KERNEL_TOKENS {kcuda.ROW_KERNEL_TOKENS} " in text
    assert f"-DOSCAR_ROW_KERNEL_TOKENS={kcuda.ROW_KERNEL_TOKENS}" in kcuda.build_flags(128, "90a", 3)
    split_tokens, splits, window_cta = kcuda.decode_plan(3968, 64 * 4, 132, 3, 128)
    assert (splits, window_cta) == (1, False) and kcuda.row_kernel(3968, splits, window_cta, rotate_out=False)
    assert not kcuda.row_kernel(3968, 1, False, rotate_out=True)  # V rotated in the cache: the merge rotates back
    assert not kcuda.row_kernel(3968, 2, False, False) and not kcuda.row_kernel(3968, 1, True, False)
    assert kcuda.row_kernel(kcuda.ROW_KERNEL_TOKENS, 1, False, False)
    assert not kcuda.row_kernel(kcuda.ROW_KERNEL_TOKENS + 128, 1, False, False)  # long rows: the split kernel


def test_specialization_names_are_deterministic():
    a = kcuda.specialization_name(128, "90a", 2)
    assert a == kcuda.specialization_name(128, "90a", 2)
    assert a.startswith("oscar_d128_sm90a_b2_")
    assert len({a, kcuda.specialization_name(64, "90a", 2), kcuda.specialization_name(128, "90a", 3)}) == 3


def test_wide_build_is_its_own_specialization():
    narrow, wide = kcuda.specialization_name(128, "90a", 3), kcuda.specialization_name(128, "90a", 1, 8)
    assert "_w" not in narrow and wide.startswith("oscar_d128_sm90a_b1_w8_") and narrow != wide
    assert "-DOSCAR_WARPS=8" in kcuda.build_flags(128, "90a", 1, 8)
    assert not any("OSCAR_WARPS" in f for f in kcuda.build_flags(128, "90a", 3))


def test_wide_build_takes_the_batch_one_steps(monkeypatch):
    # On by default; wide=False (KernelOptions.wide_decode) keeps every launch narrow. With 132 SMs: the thinker's 4 KV
    # heads at batch 1 (>= 32 SMs a row) at every length, and at batch 2 (16.5 SMs a row, 8 query rows a KV head) too;
    # Qwen3's 8 (4 query rows) from 16K packed tokens (at 4K the narrow build measured faster); steps of 16 or more rows
    # stay narrow (as measured on an H100) unless their rows are long: up to 33 rows of one head tile whose one-wave
    # splits hold 16K+ tokens (LLaVA's 32 KV heads at 1 x 128K, measured on an H200).
    spec = kcuda.specialization
    assert spec(130944, 4, 132, query_rows=8, wide=False) == kcuda.NARROW
    assert spec(3968, 4, 132, query_rows=8) == kcuda.WIDE == (1, 8) and spec(130944, 4, 132) == kcuda.WIDE
    assert spec(3968, 8, 132, query_rows=4) == kcuda.NARROW == (3, 4) and spec(32640, 8, 132) == kcuda.WIDE
    assert spec(3968, 8, 132, query_rows=8) == kcuda.WIDE  # the thinker's 2 x 4K
    assert spec(32640, 32, 132) == kcuda.NARROW and spec(130944, 64, 132) == kcuda.NARROW
    assert spec(130944, 32, 132) == kcuda.WIDE and spec(130944, 32, 132, query_rows=16) == kcuda.NARROW
    assert spec(130944, 16, 132, query_rows=4) == kcuda.NARROW  # Qwen3 2 x 128K: splits of 16,368 tokens
    assert spec(32640, 16, 132, query_rows=4) == kcuda.NARROW  # two sequences of Qwen3: 8 SMs a row
    assert spec(7936, 16, 132, query_rows=8) == kcuda.NARROW  # the thinker's 4 x 8K
    # a caller's choice stands; the other half of the pair comes from NARROW
    assert spec(130944, 4, 132, min_blocks=3) == (3, 4) and spec(130944, 4, 132, min_blocks=1) == (1, 4)
    assert spec(3968, 32, 132, warps=8) == (3, 8)
    # the wide plans measured on an H100: one CTA an SM; a folded plan competes with the window CTAs there
    assert kcuda.decode_plan(130944, 4, 132, 1, 64) == (4096, 32, True)  # thinker 1 x 128K: 132 CTAs
    assert kcuda.decode_plan(32640, 4, 132, 1, 64) == (1024, 32, True)  # thinker 1 x 32K
    assert kcuda.decode_plan(130944, 8, 132, 1, 64) == (8320, 16, False)  # Qwen3 1 x 128K: 128 CTAs
    assert kcuda.decode_plan(32640, 8, 132, 1, 64) == (2176, 15, True)  # Qwen3 1 x 32K: 128 CTAs
    assert kcuda.decode_plan(130944, 32, 132, 1, 64) == (32768, 4, False)  # LLaVA 1 x 128K: one wave, 128 CTAs
    assert kcuda.plan_launch(130944, 32, 132, 1, 64) == (*kcuda.WIDE_LONG, 32768, 4, False)
    assert kcuda.plan_launch(130944, 32, 132, 1, 64, wide=False)[:2] == kcuda.NARROW
    # WIDE's plans of splits of 4096+ tokens run on WIDE_LONG's 12 warps (Qwen3 and the thinker at 1 x 128K), shorter
    # ones and two head tiles stay on 8
    assert kcuda.wide_long(8320, 4) and kcuda.wide_long(4096, 8)
    assert not kcuda.wide_long(2176, 4) and not kcuda.wide_long(1024, 8) and not kcuda.wide_long(8320, 16)
    # 256 threads merge twice the partials a round: the thinker's 32 splits in one level (narrow: 64 splits, two)
    assert kcuda.merge_plan(32, 8, 128, True, 256) == 0 and kcuda.merge_plan(64, 8, 128, True) == 8


def test_experiment_flags_get_their_own_build(monkeypatch):
    base = kcuda.specialization_name(128, "90a", 3)
    monkeypatch.setenv("OSCAR_KERNEL_FLAGS", "-DOSCAR_STAGES=5")
    assert "-DOSCAR_STAGES=5" in kcuda.build_flags(128, "90a", 3)
    assert kcuda.specialization_name(128, "90a", 3) != base


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("window_cta", [False, True])  # window folded into the last split's CTA, or its own
@pytest.mark.parametrize(
    "group,d,rotate_values",
    [(1, 128, True), (4, 128, True), (8, 128, True), (4, 64, True), (4, 128, False), (8, 64, False)],
)
def test_cuda_decode_matches_oracle(group, d, rotate_values, window_cta):
    # rotate_values=False: V's rotation lives in the model's weights (OScaR's default), the output is not rotated back
    kv = random_packed_kv(3, 2, 640, 77, d, seed=group + d, device="cuda", rotate_values=rotate_values)
    kv_lens, res_lens = [640, 333, 97], [77, 1, 40]
    q = torch.randn(3, 2 * group, 1, d, generator=torch.Generator().manual_seed(d)).to(torch.bfloat16)
    out = kcuda.decode_attention(
        q.cuda(), kv, d**-0.5, kv_lens=kv_lens, res_lens=res_lens, split_tokens=128, window_cta=window_cta
    )
    assert torch.isfinite(out).all()
    ref = attention_f64(q, kv, d**-0.5, kv_lens, res_lens)
    err, budget = relative_error(out, ref), relative_error(attention_bf16(q, kv, d**-0.5, kv_lens, res_lens), ref)
    assert err <= 2 * budget, f"kernel error {err:.2e} > 2 x bf16 error {budget:.2e}"


@pytest.mark.cuda_kernels
@pytest.mark.parametrize(
    "group,d,rotate_values,lq,dtype",
    [
        (4, 128, False, 1, torch.bfloat16),
        (8, 128, False, 1, torch.bfloat16),
        (1, 64, False, 1, torch.bfloat16),
        (8, 128, True, 1, torch.bfloat16),
        (8, 128, False, 2, torch.bfloat16),
        (4, 64, False, 3, torch.bfloat16),
        (4, 128, False, 1, torch.float16),
    ],
)
def test_cuda_decode_one_cta_per_row(group, d, rotate_values, lq, dtype):
    # Rows of one split with the window folded into its CTA (the thinker's 64 x 4K plan), V's rotation in the weights
    # (decode_row_kernel: the window after the groups in one state, no merge) or in the cache (decode_split_kernel and
    # its merge, which rotates back); a row with no quantized tokens and one with no window are in the batch. The merge
    # leaves its counters at zero, so a second call gives the same bits; 5 splits (decode_split_kernel) agree. Lq > 1
    # (speculative tokens, causal inside the window; 16 and 12 query rows: the two-tile kernels) and an fp16 model too.
    # (A row whose window holds fewer than Lq - 1 of its new tokens is refused: the kernels do not mask packed tokens.)
    kv = random_packed_kv(
        4, 2, 640, 77, d, seed=3 * group + d + lq, device="cuda", rotate_values=rotate_values, res_dtype=dtype
    )
    kv_lens, res_lens = [640, 333, 0, 97], [77, 3, 40, lq - 1]  # the last: the first new token packed (Lq > 1)
    q = torch.randn(4, 2 * group, lq, d, generator=torch.Generator().manual_seed(group)).to(dtype).cuda()
    ref = attention_f64(q.cpu(), kv, d**-0.5, kv_lens, res_lens)
    budget = relative_error(attention_bf16(q.cpu(), kv, d**-0.5, kv_lens, res_lens), ref)
    outs = []
    for _ in range(2):  # a second call: the same bits (the merge's counters were left as they were)
        outs.append(
            kcuda.decode_attention(
                q, kv, d**-0.5, kv_lens=kv_lens, res_lens=res_lens, split_tokens=640, window_cta=False
            )
        )
        assert relative_error(outs[-1], ref) <= 2 * budget
    assert torch.equal(outs[0], outs[1])
    assert int(kcuda._counters(q.device, 8).count_nonzero()) == 0
    several = kcuda.decode_attention(
        q, kv, d**-0.5, kv_lens=kv_lens, res_lens=res_lens, split_tokens=128, window_cta=False
    )  # 5 splits, the window in the last one's CTA
    assert relative_error(several, ref) <= 2 * budget
    assert (several.float() - outs[0].float()).abs().max() <= 2e-2 * outs[0].float().abs().max()


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("window_cta", [False, True])
def test_cuda_decode_launch_orders_agree_bit_for_bit(window_cta):
    # The CTA order (DecodeParams::order) changes only which (split, row) a block index works on: every order covers
    # each (split, row) once, and the merge reads the partials by split index, so the outputs are the same bits.
    kv = random_packed_kv(5, 2, 704, 90, 128, seed=11, device="cuda", rotate_values=False)
    kv_lens, res_lens = [700, 333, 97, 0, 650], [90, 1, 40, 5, 0]
    q = torch.randn(5, 8, 1, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16).cuda()
    outs = [
        kcuda.decode_attention(
            q, kv, 0.088, kv_lens=kv_lens, res_lens=res_lens, split_tokens=96, window_cta=window_cta, order=o
        )
        for o in (0, 1, 2)
    ]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    ref = attention_f64(q.cpu(), kv, 0.088, kv_lens, res_lens)
    bf16_err = relative_error(attention_bf16(q.cpu(), kv, 0.088, kv_lens, res_lens), ref)
    assert relative_error(outs[1], ref) <= 2 * bf16_err
    with pytest.raises(ValueError, match="order must be"):
        kcuda.decode_attention(q, kv, 0.088, order=3)


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("group,d,lq", [(1, 128, 1), (4, 128, 1), (8, 128, 1), (4, 64, 1), (8, 64, 1), (8, 128, 2)])
def test_wide_decode_matches_oracle(group, d, lq):
    # The wide builds (one CTA an SM; WIDE_LONG's 12 warps where the rows fit one head tile, else WIDE's 8): many splits
    # with the window folded or in its own CTA, the planner's split, a two-level merge, and rows of one CTA
    # (decode_row_kernel); mixed lengths, an empty window, Lq 2.
    kv = random_packed_kv(3, 2, 1280, 77, d, seed=group + d + lq, device="cuda", rotate_values=False)
    kv_lens, res_lens = [1280, 333, 97], [77, lq - 1, 40]
    q = torch.randn(3, 2 * group, lq, d, generator=torch.Generator().manual_seed(d)).to(torch.bfloat16).cuda()
    ref = attention_f64(q.cpu(), kv, d**-0.5, kv_lens, res_lens)
    budget = relative_error(attention_bf16(q.cpu(), kv, d**-0.5, kv_lens, res_lens), ref)
    warps = kcuda.WIDE_LONG[1] if group * lq <= kcuda.WIDE_LONG_MAX_QUERY_ROWS else kcuda.WIDE[1]
    for opts in [
        dict(split_tokens=128, window_cta=False),
        dict(split_tokens=128, window_cta=True),
        {},
        dict(split_tokens=128, window_cta=True, merge_group=3),
        dict(split_tokens=1280, window_cta=False),
    ]:
        lens = dict(kv_lens=kv_lens, res_lens=res_lens)
        out = kcuda.decode_attention(q, kv, d**-0.5, **lens, min_blocks=1, warps=warps, **opts)
        assert torch.isfinite(out).all() and relative_error(out, ref) <= 2 * budget, opts
    assert int(kcuda._counters(q.device, 64).count_nonzero()) == 0  # every merge left its counters at zero


@pytest.mark.cuda_kernels
def test_batch_one_decode_takes_the_wide_build(monkeypatch):
    # The thinker's shape at batch 1 (4 KV heads of 8 query rows): the default launch is the WIDE build's, and it
    # agrees with the narrow build's within the oracle's budget (both builds loaded in one process).
    kv = random_packed_kv(1, 4, 4096, 64, 128, seed=5, device="cuda", rotate_values=False)
    q = torch.randn(1, 32, 1, 128, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).cuda()
    assert kcuda.launch_plan(q, kv).warps == 8 and kcuda.launch_plan(q, kv, min_blocks=3).warps == 4
    ref = attention_f64(q.cpu(), kv, 128**-0.5)
    budget = relative_error(attention_bf16(q.cpu(), kv, 128**-0.5), ref)
    wide, narrow = kcuda.decode_attention(q, kv, 128**-0.5), kcuda.decode_attention(q, kv, 128**-0.5, min_blocks=3)
    assert relative_error(wide, ref) <= 2 * budget and relative_error(narrow, ref) <= 2 * budget


@pytest.mark.cuda_kernels
def test_binding_checks_raise_with_their_numbers():
    # A failing check whose message streamed an integer segfaulted in these extensions on the device image;
    # numbers and shapes now enter messages through std::to_string (csrc/include/oscar_msg.h). Each binding takes
    # every argument of its signature, positionally, as quant/kernels/cuda passes them
    # (test_binding_calls_match_their_signatures holds these calls to csrc's signatures, on any machine); the decode
    # reads its inputs and plan by field name and names a missing one.
    mod = kcuda.load(128)
    k = torch.randn(1, 2, 48, 128, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="multiple of 32 tokens, got 48"):
        mod.pack(k, k, True, True, False, False)  # k, v, rotate, token_norm, rotate_values, integer_zero
    q, none = torch.randn(1, 8, 1, 64, device="cuda", dtype=torch.bfloat16), torch.empty(0, device="cuda")
    names = ("kc", "ks", "kz", "vc", "vs", "vz", "norms", "k_res", "v_res", "kv_lens", "res_lens")
    x = types.SimpleNamespace(q=q, tokens=0, **dict.fromkeys(names, none))
    plan = kcuda.DecodePlan(tokens=0, rows=2, splits=0, split_tokens=32)
    with pytest.raises(RuntimeError, match=r"q must be \[B, Hq, Lq, 128\]"):  # its first check, on q's head dim
        mod.decode(x, plan, none, none, 0.125, True, False)  # x, plan, counters, trace, scaling, rotate, rotate_out
    with pytest.raises(RuntimeError, match="the decode plan \\(DecodePlan\\) has no field 'splits'"):
        mod.decode(x, types.SimpleNamespace(tokens=0), none, none, 0.125, True, False)
    layers = kcuda.load_layers()
    x = torch.randn(2, 12, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="got n 12"):
        layers.rms_norm(x, torch.ones(12, device="cuda", dtype=torch.bfloat16), 1e-6)
    x = torch.randn(3, 24, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8, 16, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"\[n, 24\] CUDA tensor .* got \[8, 16\]"):  # shapes in the message
        layers.gemv(x, [w], [torch.empty(0)], torch.empty(0), 1)


@pytest.mark.cuda_kernels
def test_several_wave_plan_with_window_ctas_last_matches_oracle():
    # 512 rows (64 x 8 KV heads) whose 90-token windows weigh more than a quarter of a split: the planner gives the
    # windows their own CTAs, started last (several waves on any GPU of <= 170 SMs); as exact as row order.
    kv = random_packed_kv(64, 8, 320, 90, 64, seed=4, device="cuda", rotate_values=False)
    q = torch.randn(64, 32, 1, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).cuda()
    plan = kcuda.launch_plan(q, kv)
    assert plan.window_cta and plan.order == kcuda.ORDER_SPECIAL_LAST
    assert plan.ctas == 512 * (plan.splits + 1)
    out = kcuda.decode_attention(q, kv, 0.125)
    assert torch.equal(
        out,
        kcuda.decode_attention(q, kv, 0.125, window_cta=True, order=kcuda.ORDER_ROWS, split_tokens=plan.split_tokens),
    )
    ref = attention_f64(q.cpu(), kv, 0.125)
    assert relative_error(out, ref) <= 2 * relative_error(attention_bf16(q.cpu(), kv, 0.125), ref)


@pytest.mark.cuda_kernels
def test_paired_split_plan_matches_oracle():
    # Rows between the SMs and twice as many, two splits each (16 x 8 KV heads on a GPU of 65-128 SMs): the first split
    # longer than the second and started first (cuda.paired_splits); as exact as equal splits in row order.
    kv = random_packed_kv(16, 8, 2048, 70, 64, seed=9, device="cuda", rotate_values=False)
    q = torch.randn(16, 32, 1, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16).cuda()
    sms = kcuda.num_sms(q.device)
    plan = kcuda.launch_plan(q, kv)
    if not 128 <= sms < 256:
        pytest.skip(f"128 rows pair up on 128-255 SMs; this GPU has {sms}")
    assert plan.splits == 2 and plan.order == kcuda.ORDER_SPECIAL_LAST and plan.split_tokens > 1024
    out = kcuda.decode_attention(q, kv, 0.125)
    ref = attention_f64(q.cpu(), kv, 0.125)
    equal = kcuda.decode_attention(q, kv, 0.125, split_tokens=1024, window_cta=False, order=kcuda.ORDER_ROWS)
    assert relative_error(out, ref) <= 2 * relative_error(attention_bf16(q.cpu(), kv, 0.125), ref)
    assert (out.float() - equal.float()).abs().max() <= 2e-2 * equal.float().abs().max()


def test_cta_order_starts_window_ctas_last_over_several_waves():
    # One wave keeps rows in order (the planner's slowest-SM model assumes it); several waves with the windows in their
    # own CTAs start those last (H100: qwen3 64 x 4K 2 splits + window CTAs 100.5 us vs 109.3 in row order).
    assert kcuda.cta_order(8, 32, True, 396) == kcuda.ORDER_ROWS  # 1 x 128K, one wave
    assert kcuda.cta_order(96, 3, False, 396) == kcuda.ORDER_ROWS  # one wave, three splits
    # 16 x 32K: two splits per row and an SM's two CTAs from two rows; the rows' first splits start first
    assert kcuda.cta_order(128, 2, False, 396) == kcuda.ORDER_SPECIAL_LAST
    assert kcuda.cta_order(128, 2, False, 768, sms=256) == kcuda.ORDER_ROWS  # 256 SMs: one CTA each
    assert kcuda.cta_order(512, 2, True, 396) == kcuda.ORDER_SPECIAL_LAST  # 64 x 4K: 1536 CTAs
    assert kcuda.cta_order(512, 3, False, 396) == kcuda.ORDER_ROWS  # window folded: row by row


@pytest.mark.cuda_kernels
def test_cuda_decode_speculative_and_fp16_residual():
    kv = random_packed_kv(1, 2, 256, 9, 128, seed=5, device="cuda", res_dtype=torch.float16)
    q = torch.randn(1, 8, 3, 128).to(torch.float16)
    out = kcuda.decode_attention(q.cuda(), kv, 0.088)
    ref = attention_f64(q, kv, 0.088)
    assert relative_error(out, ref) <= 2 * relative_error(attention_bf16(q, kv, 0.088), ref)


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("d,group,lq", [(128, 4, 3), (64, 8, 2)])
def test_cuda_decode_merges_many_splits_of_many_rows(d, group, lq):
    # 32 splits of 12 or 16 query rows (two head tiles), one 32-token group each, and a short second sequence:
    # the merge's online max over several rounds of loads, and the rows a thread holds in turn.
    kv = random_packed_kv(2, 2, 1024, 50, d, seed=d + lq, device="cuda")
    kv_lens, res_lens = [1024, 700], [50, 3]
    q = torch.randn(2, 2 * group, lq, d, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    out = kcuda.decode_attention(q.cuda(), kv, d**-0.5, kv_lens=kv_lens, res_lens=res_lens, split_tokens=32)
    ref = attention_f64(q, kv, d**-0.5, kv_lens, res_lens)
    err, budget = relative_error(out, ref), relative_error(attention_bf16(q, kv, d**-0.5, kv_lens, res_lens), ref)
    assert err <= 2 * budget, f"kernel error {err:.2e} > 2 x bf16 error {budget:.2e}"


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("d,group,merge_group", [(128, 8, 8), (64, 4, 5), (128, 1, 3)])
def test_cuda_decode_two_level_merge(d, group, merge_group):
    # 21 splits in groups of merge_group (the last group shorter): each group's last CTA merges the group into its first
    # slot, then the row's last CTA merges the groups and the window. The second sequence's late splits are empty.
    kv = random_packed_kv(2, 2, 1344, 50, d, seed=d + group, device="cuda", rotate_values=group != 4)
    kv_lens, res_lens = [1344, 700], [50, 3]
    q = torch.randn(2, 2 * group, 1, d, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).cuda()
    run = functools.partial(
        kcuda.decode_attention, q, kv, d**-0.5, kv_lens=kv_lens, res_lens=res_lens, split_tokens=64, window_cta=True
    )
    two, one = run(merge_group=merge_group), run(merge_group=0)
    assert torch.equal(two, run(merge_group=merge_group))  # the group counters were reset for the next call
    ref = attention_f64(q.cpu(), kv, d**-0.5, kv_lens, res_lens)
    budget = relative_error(attention_bf16(q.cpu(), kv, d**-0.5, kv_lens, res_lens), ref)
    assert relative_error(two, ref) <= 2 * budget
    # the same sums in another order: within a bf16 rounding of the one-level merge
    assert (two.float() - one.float()).abs().max() <= 2**-7 * one.float().abs().max()


def test_merge_plan_uses_two_levels_past_four_rounds():
    # One merging CTA takes 8 partials per round per row-sharing part (128 threads, 8 channels each): Qwen3 1 x 128K
    # (32 splits, 4 rows, 2 parts) stays one level; the Omni thinker's 64 splits of 8 rows (8 rounds) go two,
    # its 32 splits at 1 x 32K-64K (4 rounds) stay one
    assert kcuda.merge_plan(32, 4, 128, True) == 0
    assert kcuda.merge_plan(64, 8, 128, True) == 8
    assert kcuda.merge_plan(32, 8, 128, True) == 0
    assert kcuda.merge_plan(64, 8, 128, False) == 0  # needs the window's own CTA
    assert kcuda.merge_plan(11, 1, 128, True) == 0  # llava: 64 partials a round
    assert kcuda.merge_plan(40, 16, 64, True) == 8 and kcuda.merge_plan(16, 16, 64, True) == 0


@pytest.mark.cuda_kernels
def test_read_floor_reads_every_byte():
    # Both floor kernels (harness/bench/floor.py: loads into registers, cp.async) must stream the whole buffer: a magic
    # word anywhere, including the last word of a ragged CTA range, reaches the sink; an all-zero buffer and the
    # empty launch leave it alone.
    mod = kcuda.load(128)
    magic = 0x9E3779B9 - 2**32  # as int32
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    words = 100_003  # 16-byte words, not a multiple of the CTA count
    buf = torch.zeros(4 * words, dtype=torch.int32, device="cuda")
    for pos in (0, 4_321, words - 1):
        for async_ in (False, True):
            buf.zero_(), sink.zero_()
            buf[4 * pos + 2] = magic
            mod.read_floor(buf, sink, 264, 128, async_)
            assert sink.item() == magic, (pos, async_)
    buf.zero_(), sink.zero_()
    mod.read_floor(buf, sink, 132, 256, True)
    mod.empty_launch(sink, 264, 128, mod.decode_smem_bytes)
    assert sink.item() == 0
    with pytest.raises(RuntimeError, match="16-byte"):
        mod.read_floor(buf[:5], sink, 8, 128, False)
    with pytest.raises(RuntimeError, match="read_floor launch"):  # the cp.async ring holds 256 threads at most
        mod.read_floor(buf, sink, 8, 512, True)


@pytest.mark.cuda_kernels
@pytest.mark.parametrize(
    "rotate,token_norm,rotate_values,zero_point",
    [
        (False, False, False, "float"),
        (False, True, False, "float"),
        (True, True, True, "float"),
        (True, True, False, "float"),
        (False, False, False, "integer"),
        (True, True, False, "integer"),
    ],
)
def test_cuda_pack_matches_reference(rotate, token_norm, rotate_values, zero_point):
    g = torch.Generator().manual_seed(13)
    k = (torch.randn(2, 8, 256, 128, generator=g) * 3).to(torch.bfloat16).cuda()
    v = torch.randn(2, 8, 256, 128, generator=g).to(torch.bfloat16).cuda()
    cfg = OScaRConfig(rotation="hadamard" if rotate else "none", token_norm=token_norm, zero_point=zero_point)
    ref = pack_block(
        k, v, cfg, hadamard(128, device="cuda") if rotate else None, rotate_values=rotate_values, backend="torch"
    )
    got = kcuda.pack_kv(k, v, rotate, token_norm, rotate_values=rotate_values, zero_point=zero_point)
    if rotate and not rotate_values:  # values as they come: the frag words of the reference's, bit for bit
        f = ref[1].to_order("frag")
        assert torch.equal(f.codes, got[1].codes) and torch.equal(f.scale, got[1].scale)
        assert torch.equal(f.zero, got[1].zero)
    for r, x in zip(ref[:2], got[:2]):
        assert x.order == "frag"
        mismatch = (r.unpacked() != x.unpacked()).float().mean().item()
        if rotate or token_norm:  # butterfly vs matmul, norm summation order: an ulp apart, which flips
            assert mismatch <= 1e-4  # only codes sitting on a rounding boundary
        else:  # the frag words themselves, bit for bit, against the Python permutation of the reference
            f = r.to_order("frag")
            assert mismatch == 0 and torch.equal(f.codes, x.codes)
            assert torch.equal(f.scale, x.scale) and torch.equal(f.zero, x.zero)
    if token_norm:
        torch.testing.assert_close(got[2], ref[2], rtol=1e-5, atol=0)


@pytest.mark.cuda_kernels
@pytest.mark.parametrize(
    "d,heads,dtype",
    [(128, 8, torch.bfloat16), (128, 8, torch.float16), (128, 8, torch.float32), (64, 16, torch.bfloat16)],
)
def test_cuda_pack_resident_schedule_gives_the_streamed_bits(d, heads, dtype):
    # A long prefill whose heads fill the CTA's stages once (2 per slot) takes the K-resident schedule when its rows
    # are 16-byte aligned; the same values one element off that alignment take the streamed schedule with plain loads.
    # Same arithmetic in the same order: the same codes, scales, zeros and norms, bit for bit.
    g = torch.Generator().manual_seed(d + heads)
    t = 32 * 300  # 300 blocks: one CTA per block holds every head
    k = (torch.randn(1, heads, t, d, generator=g) * 3).to(dtype).cuda()
    v = torch.randn(1, heads, t, d, generator=g).to(dtype).cuda()

    def misaligned(x):
        return torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:].view(x.shape).copy_(x)

    for rv in (True, False):  # V rotated in the pack, or as it comes (the default config: rotation in the weights)
        resident = kcuda.pack_kv(k, v, rotate_values=rv)
        streamed = kcuda.pack_kv(misaligned(k), misaligned(v), rotate_values=rv)
        for a, b in zip(resident[:2], streamed[:2]):
            assert torch.equal(a.codes, b.codes) and torch.equal(a.scale, b.scale) and torch.equal(a.zero, b.zero)
        assert torch.equal(resident[2], streamed[2])
    resident = kcuda.pack_kv(k, v)
    ref = pack_block(k, v, OScaRConfig(), hadamard(d, device="cuda"))
    assert (ref[0].unpacked() != resident[0].unpacked()).float().mean().item() <= 1e-4


@pytest.mark.cuda_kernels
@pytest.mark.parametrize("d,heads,group,rv", [(128, 8, 4, False), (128, 4, 8, True), (64, 3, 1, True)])
def test_cuda_pack_then_decode_long_and_repeated(d, heads, group, rv):
    # The cache path: the CUDA pack (frag order) feeds the decode with the default split plan (many splits,
    # merged by the last CTA); a second call must give the same result (the merge counters reset themselves).
    g = torch.Generator().manual_seed(d + heads)
    t, tr = 4096 + 128 * 3, 77
    k = (torch.randn(2, heads, t + tr, d, generator=g) * 2).to(torch.bfloat16).cuda()
    v = torch.randn(2, heads, t + tr, d, generator=g).to(torch.bfloat16).cuda()
    kq, vq, norms = kcuda.pack_kv(k[:, :, :t], v[:, :, :t], rotate_values=rv)
    from quant.packed import PackedKV

    kv = PackedKV(kq, vq, norms, k[:, :, t:].contiguous(), v[:, :, t:].contiguous(), hadamard(d, device="cuda"), rv)
    q = torch.randn(2, heads * group, 1, d, generator=g).to(torch.bfloat16)
    lens = [t, t - 999]
    out = kcuda.decode_attention(q.cuda(), kv, d**-0.5, kv_lens=lens)
    again = kcuda.decode_attention(q.cuda(), kv, d**-0.5, kv_lens=lens)
    assert torch.equal(out, again)
    ref = attention_f64(q, kv, d**-0.5, lens)
    budget = relative_error(attention_bf16(q, kv, d**-0.5, lens), ref)
    err = relative_error(out, ref)
    assert err <= 2 * budget, f"kernel error {err:.2e} > 2 x bf16 error {budget:.2e}"


def test_split_plan_fills_the_resident_ctas():
    # One CTA per (split, b x kv head), the window folded into one: a plan never spills one CTA into a wave.
    from quant.kernels.cuda import plan_splits

    assert plan_splits(131072, 8, 396) == (2688, 49)  # 392 CTAs on 396 slots
    assert plan_splits(32768, 128, 396) == (11008, 3)  # 384 CTAs
    assert plan_splits(4096, 512, 396) == (1408, 3)  # 1536 CTAs = 3.9 of 4 waves
    assert plan_splits(0, 8, 396) == (128, 0)
    # a folded window (128 bf16 tokens ~ 683 packed ones) shortens the last split of a single wave: 11136 + 11136
    # + 10368; over several waves the splits stay equal
    assert plan_splits(32640, 128, 396, window=128) == (11136, 3)
    assert plan_splits(3968, 512, 396, window=128) == plan_splits(3968, 512, 396) == (1408, 3)
    assert plan_splits(32640, 128, 396) == (10880, 3)
    assert plan_splits(32640, 128, 396, want=2) == (16384, 2)
    # The window gets its own CTA when a wave holds it beside >= 8 splits per row: batch-1 steps, not batches.
    assert kcuda.separate_window(8, 396) and kcuda.separate_window(32, 396) and kcuda.separate_window(44, 396)
    assert not kcuda.separate_window(45, 396) and not kcuda.separate_window(128, 396)
    for tokens, rows in [(4096, 8), (300, 3), (131072, 1), (65536, 40)]:
        split, n = plan_splits(tokens, rows, 396)
        assert split % 128 == 0 and n * split >= tokens and (n - 1) * split < tokens and rows * n <= max(396, rows)


def test_decode_plan_picks_the_single_wave_whose_slowest_sm_ends_first():
    # 132 SMs with room for 3 CTAs each; CTA i runs beside CTA i + 132. The plans measured fastest on the H100:
    # qwen3 1x128K 32 splits (two long CTAs on every SM; 33 would put three on 6 SMs), llava 1x128K 11,
    # 16x32K 2 (the window folded, weighed into the last split), 1x32K 32; several waves keep the wave rule.
    assert kcuda.decode_plan(130944, 8, 132, 3, 64) == (4096, 32, True)
    assert kcuda.slowest_sm(130944, 8, 3968, 33, 132, True, 64) > 1.4 * kcuda.slowest_sm(
        130944, 8, 4096, 32, 132, True, 64
    )
    # 32 rows (LLaVA 1 x 128K): 8 splits with the window folded, two long CTAs on 124 SMs, beat 11 splits and the window
    # CTAs, three long CTAs on 110 SMs (H100: 171.7 / 158.6 -> 161.2 / 150.6 us); the model says so too
    assert kcuda.decode_plan(130944, 32, 132, 3, 64) == (16512, 8, False)
    assert kcuda.decode_plan(130944, 32, 132, 3, 64, window_cta=True) == (11904, 11, True)
    assert kcuda.slowest_sm(130944, 32, 16512, 8, 132, False, 64) < kcuda.slowest_sm(
        130944, 32, 11904, 11, 132, True, 64
    )
    assert kcuda.decode_plan(32640, 32, 132, 3, 128) == (4224, 8, False)  # LLaVA 1 x 32K (was 7 and window CTAs)
    # a folded plan of one CTA an SM lost where the model preferred it (LLaVA 1 x 8K: 4 folded splits, 128 CTAs, +12%
    # after the read-only flush): the window CTAs stay
    assert kcuda.decode_plan(8064, 32, 132, 3, 128, window_cta=False) == (2304, 4, False)
    assert kcuda.decode_plan(8064, 32, 132, 3, 128) == (1152, 7, True)
    # 16 x 32K: the first split (each SM's first CTA) 8% longer than the second with the window
    assert kcuda.decode_plan(32640, 128, 132, 3, 128) == (17280, 2, False)
    assert 17280 / (32640 - 17280 + 128 * kcuda.WINDOW_TOKEN_WEIGHT) == pytest.approx(kcuda.FIRST_CTA_SHARE, abs=0.01)
    assert kcuda.paired_split_tokens(300, 0) == 256 and kcuda.paired_split_tokens(1000, 128) == 896  # two splits
    assert kcuda.decode_plan(32640, 8, 132, 3, 128) == (1024, 32, True)
    # several waves: where a folded window would weigh >= 1/4 of a split, the windows get their own CTAs, started
    # last (H100: 64 x 4K 99.6-100.5 us against 105.8 for 3 splits, window folded); light windows stay folded
    assert kcuda.decode_plan(3968, 512, 132, 3, 128) == (2048, 2, True)  # 1024 split + 512 window CTAs, 3.9 waves
    assert kcuda.decode_plan(3968, 512, 132, 3, 128, window_cta=False) == (1408, 3, False)  # 1536 CTAs, 3.9 waves
    assert kcuda.decode_plan(3968, 2048, 132, 3, 128) == (896, 5, False)  # llava 64 x 4K: 26 waves, folded
    assert kcuda.decode_plan(32640, 512, 132, 3, 128) == (10880, 3, False)  # llava 16 x 32K: a light window
    assert kcuda.decode_plan(4096, 300, 132, 3, 0) == (4096, 1, False)  # one wave of one split per row
    # rows just above the SMs: several nearly full waves beat one uneven wave, but not at 80 rows
    assert kcuda.decode_plan(130944, 112, 132, 3, 64) == (18816, 7, False)  # 14 x 128K: 784 CTAs in 1.98 waves
    assert kcuda.decode_plan(130944, 136, 132, 3, 64) == (16384, 8, False)  # 17 x 128K: 1088 CTAs in 2.75 waves
    assert kcuda.decode_plan(130944, 80, 132, 3, 64) == (43776, 3, False)
    # short steps, where the window CTA's weight ties every count: the most splits up to 16
    assert kcuda.decode_plan(3968, 8, 132, 3, 128) == (384, 11, True)  # qwen3 1 x 4K (was 7 splits)
    assert kcuda.decode_plan(1920, 8, 132, 3, 128) == (128, 15, True)  # qwen3 1 x 2K (was 3)
    assert kcuda.decode_plan(3968, 4, 132, 3, 128) == (256, 16, True)  # the thinker's 1 x 4K (was 7)
    assert kcuda.decode_plan(896, 4, 132, 3, 128) == (128, 7, True)  # the thinker's 1 x 1K (was 2)
    for tokens, rows in [(4096, 8), (300, 3), (131072, 1), (65536, 40), (130944, 44)]:
        split, n, window_cta = kcuda.decode_plan(tokens, rows, 132, 3, 100)
        assert split % 128 == 0 and (n - 1) * split < tokens <= n * split
        assert rows * (n + window_cta) <= 396  # one wave


def test_trace_summary_phases():
    # benchmarks/sweep_splits.py reads the kernel's per-CTA %globaltimer stamps (ns) into phases: three
    # quantized CTAs and a separate window CTA (no quantized stamps) that arrives last and merges, as traced on an H100.
    from benchmarks.sweep_splits import summarize_trace

    base = 1_000_000
    rows = [  # start, query ready, loop done, partial counted, merge done, merge's loads summed, -, SM
        [base, base + 770, base + 2820, base + 4870, 0, 0, 0, 5],
        [base + 260, base + 1020, base + 3070, base + 5120, 0, 0, 0, 6],
        [base, base + 770, base + 2560, base + 4860, 0, 0, 0, 7],
        [base, 0, 0, base + 15_870, base + 21_870, base + 18_870, 0, 8],
    ]
    s = summarize_trace(torch.tensor(rows, dtype=torch.int64))
    assert s["sms_used"] == 4
    assert s["start_us"] == [0.0, 0.0, 0.0, 0.26]
    assert s["query_us"] == [0.76, 0.77, 0.77, 0.77]
    assert s["loop_us"][0] == 1.79 and s["loop_us"][-1] == 2.05
    assert s["window_us"] == [15.87] * 4  # the window CTA alone
    assert s["merge_us"] == [6.0] * 4 and s["end_us"] == 21.87
    assert s["merge_loads_us"] == [3.0] * 4  # of the merge's 6 us, 3 to load and sum the splits' partials
    assert s["tail_us"] == 16.75  # the last split's partial at 5.12 us, the merge done at 21.87
    assert s["cta_end_us"][-1] == 15.87
    assert s["group_merge_us"] == []


def test_trace_summary_two_level_merge():
    # A group's last CTA stamps 6 when its group is merged and counted; the row's merge is timed from there.
    from benchmarks.sweep_splits import summarize_trace

    base = 1_000_000
    rows = [  # start, query ready, loop done, partial counted, merge done, merge's loads summed, group merged, SM
        [base, base + 500, base + 2500, base + 3000, 0, 0, 0, 1],
        [base, base + 500, base + 2600, base + 3100, 0, 0, base + 4100, 2],  # merges its group
        [base, base + 500, base + 2700, base + 3200, base + 6200, base + 5200, base + 4200, 3],  # and the row
        [base, 0, 0, base + 2000, 0, 0, 0, 4],  # the window's CTA
    ]
    s = summarize_trace(torch.tensor(rows, dtype=torch.int64))
    assert s["group_merge_us"] == [1.0, 1.0, 1.0, 1.0]
    assert s["merge_us"] == [2.0] * 4 and s["merge_loads_us"] == [1.0] * 4
    assert s["end_us"] == 6.2 and s["tail_us"] == 3.0


def test_trace_summary_ignores_the_early_merge_run():
    # OSCAR_WARM_MERGE: row 0's window CTA runs the merge's code without storing anything. It stamps 5 (the merge's
    # loads summed) but never 4 (merge done), so it counts as neither a merge nor the step's end.
    from benchmarks.sweep_splits import summarize_trace

    base = 1_000_000
    rows = [  # start, query ready, loop done, partial counted, merge done, merge's loads summed, -, SM
        [base, 0, 0, base + 4000, 0, base + 6000, 0, 0],  # the window's CTA: arrived, then the early merge run
        [base, base + 500, base + 9000, base + 10_000, 0, 0, 0, 1],
        [base, base + 500, base + 9500, base + 10_500, base + 12_500, base + 11_500, 0, 2],  # the real merge
    ]
    s = summarize_trace(torch.tensor(rows, dtype=torch.int64))
    assert s["merge_us"] == [2.0] * 4 and s["merge_loads_us"] == [1.0] * 4
    assert s["end_us"] == 12.5 and s["window_us"] == [4.0] * 4


def test_e2e_profile_groups_kernels_by_kind():
    # benchmarks/profile_e2e.py: CUPTI kernel records of a decode step, grouped per step by kind.
    from benchmarks.profile_e2e import kind_of, summarize_kernels

    assert kind_of("void oscar::decode_split_kernel<128, 1, __nv_bfloat16>(oscar::DecodeParams)") == "attention"
    assert kind_of("cudnn_generated_fort_native_sdpa_sm90_flash_fprop") == "attention"
    assert kind_of("nvjet_hsh_128x64_64x4_1x2_h_bz_NNT") == "gemm"
    assert kind_of("void oscar::pack_kernel<128, __nv_bfloat16>(oscar::PackParams)") == "pack"
    assert kind_of("rms_norm_kernel") == "norm"  # the fused RMSNorm (Triton), not the pack
    assert kind_of("rope_kernel") == "rope"  # the fused RoPE (Triton)
    assert kind_of("void at::native::vectorized_elementwise_kernel<4, ...>") == "other"
    events = [
        ("nvjet_a", 30.0),
        ("nvjet_a", 30.0),
        ("elementwise_x", 2.0),
        ("elementwise_x", 2.0),
        ("oscar::decode_split_kernel", 10.0),
        ("nvjet_a", 30.0),
        ("elementwise_x", 2.0),
    ]
    s = summarize_kernels(events, steps=1)
    assert s["kernels"] == 7 and s["kernel_us"] == 106.0
    assert list(s["by_kind"]) == ["gemm", "attention", "other"]
    assert s["by_kind"]["gemm"] == {"us": 90.0, "kernels": 3} and s["by_kind"]["other"]["kernels"] == 3
    assert s["top"][0] == {"name": "nvjet_a", "us": 90.0, "count": 3, "kind": "gemm"}
    half = summarize_kernels(events, steps=2)
    assert half["kernel_us"] == 53.0 and half["by_kind"]["attention"]["kernels"] == 0.5
