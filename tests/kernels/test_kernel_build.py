"""quant.kernels.build: the ahead-of-time build of the CUDA extensions (the builds themselves run on a GPU; here the
spec parsing and the report of a build that fails, which on a machine without a GPU is every build)."""

import shutil
import subprocess
import sys

import pytest
import torch

from quant.kernels import build, cuda


def test_specs_parse_and_default_to_both_builds():
    assert build.parse_spec("128:3") == (128, 3, 4) and build.parse_spec("64:1:8") == (64, 1, 8)
    assert build.default_specs() == ["128:3:4", "64:3:4", "128:1:8", "64:1:8", "128:1:12", "64:1:12"]
    assert [build.parse_spec(s)[1:] for s in build.default_specs()] == [
        cuda.NARROW,
        cuda.NARROW,
        cuda.WIDE,
        cuda.WIDE,
        cuda.WIDE_LONG,
        cuda.WIDE_LONG,
    ]
    for bad in ("96:3", "128", "128:0", "128:3:6", "x:3", "128:3:8:1"):
        with pytest.raises(ValueError, match="HEAD_DIM:MIN_BLOCKS"):
            build.parse_spec(bad)


def test_bad_spec_is_refused_before_any_build(capsys):
    assert build.main(["128:3", "256:3"]) == 2
    assert "bad build spec '256:3'" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the build would succeed (and take minutes)")
def test_no_gpu_is_said_and_a_failed_build_is_reported_with_its_log(capsys):
    assert build.main(["64:3"]) == 1
    assert "no CUDA GPU here" in capsys.readouterr().err
    # The worker's cuda.load fails on the device query: the parent names the spec, shows the end of its log and
    # counts it.
    assert build.build_all(["64:3"], layers=False, timeout=120) == 1
    out = capsys.readouterr().out
    assert "64:3  FAILED (exit 1)" in out and "Torch not compiled with CUDA" in out and "0 of 1 builds ready" in out


def test_a_build_not_in_the_cache_is_announced_once_built_it_is_not(tmp_path, monkeypatch, capsys):
    # No nvcc here: torch's loader is replaced by one that writes the library where it would, as a build does.
    monkeypatch.setenv("OSCAR_KERNEL_CACHE", str(tmp_path))
    loads = []

    def fake_load(name, build_directory, **kwargs):
        loads.append(name)
        (tmp_path / name / f"{name}.so").write_bytes(b"")
        return name

    monkeypatch.setattr("torch.utils.cpp_extension.load", fake_load)
    name = cuda.build(128, arch="90a")  # past load's cache: each call is a process's first
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"building the CUDA decode and pack kernels for head dim 128 ({name})" in err
    assert "about a minute, once" in err and str(tmp_path) in err
    assert cuda.build(128, arch="90a") == name and capsys.readouterr().err == ""
    layers = cuda.load_layers.__wrapped__(arch="90a")
    assert "building the CUDA layer kernels" in capsys.readouterr().err and cuda.is_built(layers)
    assert loads == [name, name, layers]  # torch's loader still runs: it reuses the build, with no nvcc


def test_the_parallel_build_names_only_what_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_KERNEL_CACHE", str(tmp_path))
    specs = ["128:3:4", "64:1:8", "layers"]
    assert build.build_name("layers", "90a") == cuda.layers_name("90a")
    assert build.build_name("64:1:8", "90a") == cuda.specialization_name(64, "90a", 1, 8)
    notice = build.build_notice(specs, "90a")
    assert notice.startswith("building 128:3:4, 64:1:8, layers for sm_90a with nvcc") and str(tmp_path) in notice
    for spec in specs[:2]:
        name = build.build_name(spec, "90a")
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.so").write_bytes(b"")
    assert build.build_notice(specs, "90a").startswith("building layers for sm_90a")
    assert build.build_notice(specs[:2], "90a") is None


def test_load_takes_the_build_of_the_flags_in_force(tmp_path, monkeypatch):
    # A benchmark that sets OSCAR_KERNEL_FLAGS between calls in one process times each experiment's build, not the
    # first one it imported.
    monkeypatch.setenv("OSCAR_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda name, **kwargs: name)
    monkeypatch.delenv("OSCAR_KERNEL_FLAGS", raising=False)
    cuda._loaded.cache_clear()
    try:
        base = cuda.load(128, arch="90a", min_blocks=2)
        monkeypatch.setenv("OSCAR_KERNEL_FLAGS", "-DOSCAR_STAGES=5")
        stages5 = cuda.load(128, arch="90a", min_blocks=2)
        assert stages5 == cuda.specialization_name(128, "90a", 2) != base
        monkeypatch.delenv("OSCAR_KERNEL_FLAGS")
        assert cuda.load(128, arch="90a", min_blocks=2) == base
    finally:
        cuda._loaded.cache_clear()  # no fake module stays cached for later tests


TINY_MODULE = """
#include <Python.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "%(name)s", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit_%(name)s(void) { return PyModule_Create(&def); }
"""


@pytest.mark.skipif(not (shutil.which("c++") and shutil.which("ninja")), reason="needs a C++ compiler and ninja")
def test_a_build_killed_mid_way_does_not_hang_every_later_load(tmp_path):
    # A build stopped by a timeout leaves torch's `lock` file behind; torch's loader alone would wait on it forever.
    # The real loader builds a tiny C++ module (no nvcc needed) in a child process that must finish.
    name = "oscar_stale_lock_probe"
    source = tmp_path / f"{name}.cpp"
    source.write_text(TINY_MODULE % {"name": name})
    build_dir = tmp_path / name
    build_dir.mkdir()
    (build_dir / "lock").write_text("")
    script = (
        "from pathlib import Path; from quant.kernels.cuda import load_extension; "
        f"m = load_extension({name!r}, Path({str(source)!r}), [], Path({str(build_dir)!r})); "
        "print('loaded', m.__name__)"
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"loaded {name}" in res.stdout
    assert "was left by a build of oscar_stale_lock_probe that was stopped before it ended" in res.stderr
    assert not (build_dir / "lock").exists()
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "stopped before it ended" not in res.stderr  # a clean second load says nothing
