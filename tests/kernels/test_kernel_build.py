"""quant.kernels.build: the ahead-of-time build of the CUDA extensions (the builds themselves run on a GPU; here the
spec parsing and the report of a build that fails, which on a machine without a GPU is every build)."""
import pytest
import torch

from quant.kernels import build, cuda


def test_specs_parse_and_default_to_both_builds():
    assert build.parse_spec("128:3") == (128, 3, 4) and build.parse_spec("64:1:8") == (64, 1, 8)
    assert build.default_specs() == ["128:3:4", "64:3:4", "128:1:8", "64:1:8"]
    assert [build.parse_spec(s)[1:] for s in build.default_specs()] == [cuda.NARROW, cuda.NARROW, cuda.WIDE, cuda.WIDE]
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
