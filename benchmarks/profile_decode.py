"""Run one OScaR decode (CUDA backend) on random data, for a profiler such as Nsight Compute:

    ncu --clock-control none --kernel-name regex:decode_split --launch-skip 2 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python3 -m benchmarks.profile_decode --batch 16 --context 32768
"""

from __future__ import annotations

import argparse

import torch

from quant.kernels import decode_attention, pack_kv
from quant.packed import PackedKV
from quant.primitives import hadamard


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--backend", default="cuda")
    p.add_argument("--repeats", type=int, default=4)
    a = p.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (a.batch, a.kv_heads, a.context, a.head_dim)
    k = torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(shape, device="cuda", generator=g).to(torch.bfloat16)
    kq, vq, norms = pack_kv(k, v, backend="cuda")
    res = torch.randn(a.batch, a.kv_heads, 64, a.head_dim, device="cuda", generator=g).to(torch.bfloat16)
    kv = PackedKV(kq, vq, norms, res, res.clone(), hadamard(a.head_dim, device="cuda"))
    q = torch.randn(a.batch, a.q_heads, 1, a.head_dim, device="cuda", generator=g).to(torch.bfloat16)
    for _ in range(a.repeats):
        out = decode_attention(q, kv, a.head_dim**-0.5, backend=a.backend)
    torch.cuda.synchronize()
    print(f"ok: out {tuple(out.shape)} finite={bool(torch.isfinite(out).all())}")


if __name__ == "__main__":
    main()
