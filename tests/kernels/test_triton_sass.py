"""The Triton decode compiled for sm_90 on this machine (no GPU needed): its main loop has no int -> float conversion
instructions (the codes become fp16 pairs in inline PTX, quant/kernels/triton_decode.py), stages its loads with
cp.async, and builds its tiles in registers (the tl code order): few shared-memory stores and instructions.

Runs benchmarks.triton_sass in a subprocess: the other Triton tests import the kernels under TRITON_INTERPRET=1,
which does not compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    not (Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump").exists(),
    reason="this Triton wheel has no NVIDIA backend tools",
)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_decode_loop_has_no_int_to_float_conversions(tmp_path, head_dim):
    out = tmp_path / "sass.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.triton_sass", "--head-dim", str(head_dim), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert rep["resources"]["registers"] and rep["resources"]["dynamic_shared_bytes"] > 0
    main = max(rep["loops"], key=lambda lp: lp["opcodes"].get("LDGSTS", 0))  # the quantized loop streams with cp.async
    ops = main["opcodes"]
    assert ops.get("LDGSTS", 0) > 0 and (ops.get("HMMA", 0) + ops.get("HGMMA", 0)) > 0, ops
    assert not [op for op in ops if op.startswith("I2F")], ops  # codes never pass through an int -> float conversion
    assert ops.get("HADD2", 0) > 0 and ops.get("HFMA2", 0) > 0, ops  # two codes per fp16x2 instruction
    # the tl order: the dequantized tiles are the wgmma operands in registers, not a shared-memory round trip (the
    # natural order's loop took 1605-1827 instructions per 128 tokens at D = 128, 150-166 of them STS; the tl
    # order 737-771)
    assert ops.get("STS", 0) <= 16 and main["instructions"] <= 1000 * head_dim // 128, (main["instructions"], ops)
