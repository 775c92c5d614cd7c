"""The peers bench's parts that need no GPU: its --peer parsing, the section it writes into docs/PERFORMANCE.md (and
only that section), and a peer that cannot run being reported as such rather than timed."""

from __future__ import annotations

import pytest

from harness.bench import peer_code, peers


def result(oscar_error=None):
    point = {
        "shape": "qwen3-8b",
        "batch": 1,
        "context": 32768,
        "sdpa_cudnn": {"us": 63.9, "clean_us": 55.0, "mode": "graph"},
        "sdpa_flash": {"us": 72.0, "clean_us": 60.0, "mode": "graph"},
        "project": {"us": 22.6, "clean_us": 21.0, "mode": "graph", "bits": 3.016, "rel_err_vs_exact": 0.31},
        "kivi": {
            "us": 349.8,
            "clean_us": 340.0,
            "mode": "eager",
            "bits": 3.0,
            "rel_err_vs_exact": 0.33,
            "note": "128-token fp16 window; eager",
        },
    }
    if oscar_error is None:
        point["oscar"] = {
            "us": 154.8,
            "clean_us": 150.0,
            "mode": "graph",
            "bits": 3.02,
            "rel_err_vs_exact": 0.3,
            "note": "256-token fp16 window",
        }
    return {
        "date": "20261126T060000Z",
        "project_version": "abc1234",
        "environment": {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "cuda": "13.0"},
        "peers": [
            {"name": "oscar", "version": "d2109f5", "error": oscar_error},
            {"name": "kivi", "version": "876b4d2", "error": None},
            {
                "name": "vllm",
                "version": "not installed",
                "error": f"{peer_code.NOT_AVAILABLE}: `import vllm` failed (ModuleNotFoundError)",
            },
        ],
        "points": [point, {"shape": "qwen3-8b", "batch": 16, "context": 32768, "error": "OOM: ..."}],
    }


def test_parse_peers(tmp_path):
    assert peer_code.parse_peers([f"oscar={tmp_path}", "vllm"]) == {"oscar": tmp_path.resolve(), "vllm": None}
    with pytest.raises(SystemExit, match="unknown peer 'flashinfer'"):
        peer_code.parse_peers(["flashinfer=/x"])
    with pytest.raises(SystemExit, match="needs the path of its checkout"):
        peer_code.parse_peers(["kivi"])
    with pytest.raises(SystemExit, match="does not exist"):
        peer_code.parse_peers([f"kivi={tmp_path / 'missing'}"])


def test_section_rows_and_unavailable_peers():
    text = peers.format_section(result())
    assert text.startswith("## Peers\n")
    row = next(line for line in text.splitlines() if line.startswith("| 1 x 32K |"))
    # best BF16 (cuDNN), this project, the official OScaR, KIVI (eager, marked), vLLM not available
    assert row == "| 1 x 32K | 63.9 | 22.6 | 154.8 | 349.8 (eager) | not available on this machine |"
    assert "| 16 x 32K |" not in text  # a point that failed for every variant stays in the JSON only
    assert "| OScaR official | d2109f5 | 3.020 | 0.300 | 256-token fp16 window |" in text
    assert "| vLLM | not installed | - | - | not available on this machine: `import vllm` failed" in text
    broken = peers.format_section(result(oscar_error="its extension did not build here (RuntimeError: nvcc)"))
    assert "| 1 x 32K | 63.9 | 22.6 | did not build | 349.8 (eager) |" in broken


def test_write_section_replaces_only_the_peers_section(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text("# Performance\n\n## Decode\n\nnumbers\n\n## Peers\n\nold table\n\n## Targets\n\nkept\n")
    peers.write_section(doc, "## Peers\n\nnew table\n")
    assert doc.read_text() == "# Performance\n\n## Decode\n\nnumbers\n\n## Peers\n\nnew table\n\n## Targets\n\nkept\n"
    last = tmp_path / "last.md"
    last.write_text("# P\n\n## Peers\n\nThis section is filled by the peers bench.\n")
    peers.write_section(last, "## Peers\n\nnew\n")
    assert last.read_text() == "# P\n\n## Peers\n\nnew\n"
    none = tmp_path / "none.md"
    none.write_text("# P\n\ntext\n")
    peers.write_section(none, "## Peers\n\nnew\n")
    assert none.read_text() == "# P\n\ntext\n\n## Peers\n\nnew\n"


def test_missing_package_is_not_available():
    with pytest.raises(peer_code.PeerUnavailable, match=peer_code.NOT_AVAILABLE):
        peer_code.probe_package("a_package_that_is_not_installed", None)


def test_checkout_without_cutlass_is_reported(tmp_path):
    (tmp_path / "csrc/oscar").mkdir(parents=True)
    (tmp_path / "csrc/oscar/decode_api.cpp").write_text("")
    with pytest.raises(peer_code.PeerUnavailable, match="git submodule update --init"):
        peer_code.OfficialOScaR(tmp_path)
    with pytest.raises(peer_code.PeerUnavailable, match="not a KIVI checkout"):
        peer_code.Kivi(tmp_path)


def test_an_eager_peer_is_marked_not_like_for_like():
    text = peers.format_section(result())
    assert peers.EAGER_NOTE in text  # below the times: what (eager) means and why it does not compare
    kivi = next(line for line in text.splitlines() if line.startswith("| KIVI |"))
    assert kivi.startswith(f"| KIVI | 876b4d2 | 3.000 | 0.330 | **{peers.EAGER_MARK}**; 128-token fp16 window")
    assert peers.EAGER_MARK not in next(line for line in text.splitlines() if line.startswith("| OScaR official |"))
    graphed = result()
    graphed["points"][0]["kivi"]["mode"] = "graph"
    assert peers.EAGER_NOTE not in peers.format_section(graphed)
    assert peers.EAGER_MARK not in peers.format_section(graphed)
