"""harness.bench's per-point summary: speedups against the best BF16 and the ceiling set by the read floor."""

from __future__ import annotations

import pytest

from harness.bench.kernels import _kernel_line, summarize


def test_summary_gives_the_ceiling_the_read_floor_allows():
    row = {
        "shape": "qwen3-8b",
        "batch": 1,
        "context": 131072,
        "sdpa_flash": 230.0,
        "sdpa_cudnn": 194.0,
        "sdpa_cudnn_clean": 184.0,
        "oscar_bytes": 101.9e6,
        "oscar_cuda_us": 60.0,
        "oscar_cuda_graph_us": 58.0,
        "oscar_cuda_graph_clean_us": 48.6,
        "floor_read_us": 45.0,
        "floor_read_clean_us": 37.0,
        "pack_block128_us": 12.8,
        "pack_prefill_us": 100.0,
        "pack_prefill_bytes": 1.5e8,
    }
    s = summarize(row, 3.0e12)
    assert s["best_bf16"] == "sdpa_cudnn"
    assert s["speedup_cuda_graph"] == pytest.approx(194.0 / 58.0)
    assert s["speedup_cuda_graph_clean"] == pytest.approx(184.0 / 48.6)  # clean against clean
    assert s["ceiling_speedup"] == pytest.approx(194.0 / 45.0)
    assert s["ceiling_speedup_clean"] == pytest.approx(184.0 / 37.0)
    assert s["pack_step_frac_of_cuda_attention"] == pytest.approx(0.1 / 60.0)
    line = _kernel_line({**row, **s})
    assert "read floor 45.0 / 37.0 ceiling x4.31 / x4.97" in line


def test_summary_without_floor_has_no_ceiling():
    row = {
        "shape": "qwen3-8b",
        "batch": 1,
        "context": 4096,
        "sdpa_cudnn": 19.0,
        "oscar_bytes": 3e6,
        "oscar_triton_us": 30.0,
        "pack_block128_us": 12.8,
        "pack_prefill_us": 10.0,
        "pack_prefill_bytes": 1e7,
    }
    s = summarize(row, 3.0e12)
    assert "ceiling_speedup" not in s and s["speedup_triton"] == pytest.approx(19.0 / 30.0)
    assert "read floor" not in _kernel_line({**row, **s})


def test_summary_keeps_a_row_whose_cuda_decode_failed():
    # a failed backend leaves its error's text in the row: the row is summarized, not the bench stopped
    row = {
        "shape": "qwen3-8b",
        "batch": 1,
        "context": 32768,
        "sdpa_cudnn": 65.0,
        "oscar_bytes": 2.5e7,
        "oscar_cuda_us": "RuntimeError: oscar decode launch failed: invalid argument",
        "pack_block128_us": 12.8,
        "pack_prefill_us": 10.0,
        "pack_prefill_bytes": 1e7,
    }
    s = summarize(row, 3.0e12)
    assert "speedup_cuda" not in s and s["pack_step_frac_of_cuda_attention"] != s["pack_step_frac_of_cuda_attention"]
    _kernel_line({**row, **s})


def test_largest_batch_is_sized_from_the_real_contexts_bytes():
    from harness.bench.e2e import batch_that_fits

    gib = 2**30
    # 1 x 128K probes on an 80 GB H100 (79.65 GiB): the BF16 cache is 18.04 GiB a sequence, OScaR's 3.42
    assert batch_that_fits(int(18.04 * gib), int(15.97 * gib), int(79.65 * gib)) == 3
    assert batch_that_fits(int(3.42 * gib), int(16.01 * gib), int(79.65 * gib)) == 18
    assert batch_that_fits(int(3.42 * gib), int(16.01 * gib), int(79.65 * gib), slack=6 * gib) == 16
    assert batch_that_fits(int(90 * gib), int(16 * gib), int(79.65 * gib)) == 1  # the step-down reports the failure


def test_graph_replays_are_compared_with_graph_replays():
    """With the BF16 decodes also timed as graph replays, OScaR's graph times are divided into those (eager into
    eager): at short contexts the eager SDPA call times the host's dispatch."""
    row = {
        "shape": "qwen3-8b",
        "batch": 1,
        "context": 4096,
        "sdpa_flash": 27.0,
        "sdpa_cudnn": 19.6,
        "sdpa_cudnn_clean": 17.4,
        "sdpa_flash_graph": 16.0,
        "sdpa_flash_graph_clean": 15.5,
        "sdpa_cudnn_graph": 12.5,
        "sdpa_cudnn_graph_clean": 11.0,
        "oscar_bytes": 3.6e6,
        "oscar_cuda_us": 30.0,
        "oscar_cuda_graph_us": 14.0,
        "oscar_cuda_graph_clean_us": 14.6,
        "floor_read_us": 7.3,
        "floor_read_clean_us": 6.2,
        "pack_block128_us": 12.8,
        "pack_prefill_us": 28.0,
        "pack_prefill_bytes": 2e7,
    }
    s = summarize(row, 3.0e12)
    assert s["best_bf16"] == "sdpa_cudnn" and s["best_bf16_graph"] == "sdpa_cudnn_graph"
    assert s["speedup_cuda"] == pytest.approx(19.6 / 30.0)  # eager against eager
    assert s["speedup_cuda_graph"] == pytest.approx(12.5 / 14.0)
    assert s["speedup_cuda_graph_clean"] == pytest.approx(11.0 / 14.6)
    assert s["ceiling_speedup"] == pytest.approx(12.5 / 7.3) and s["ceiling_speedup_clean"] == pytest.approx(11.0 / 6.2)
    line = _kernel_line({**row, **s})
    assert "cudnn 19.6 g12.5" in line
