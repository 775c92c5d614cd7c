"""The floors beside the CUDA decode at chosen points, as a table and JSON (harness.bench.floor's measurements):

python3 -m benchmarks.floors --points 1x131072,16x32768,64x4096 --out floor.json
"""

from __future__ import annotations

import argparse
import json

import torch

from harness.bench.floor import floor_point, planned_launch


def main() -> None:
    from benchmarks.sweep_splits import SHAPES, inputs, time_plan
    from harness.bench.timing import copy_bandwidth
    from quant.kernels.common import bytes_read

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-8b", choices=list(SHAPES))
    p.add_argument("--points", default="1x4096,1x32768,1x131072,16x32768,64x4096")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s (read + written)")
    rows = []
    for point in a.points.split(","):
        b, ctx = (int(v) for v in point.lower().split("x"))
        q, kv = inputs(a.shape, b, ctx)
        nbytes = bytes_read(kv)
        ctas, build = planned_launch(q, kv)
        r = {"shape": a.shape, "batch": b, "context": ctx, "bytes": nbytes, **floor_point(nbytes, ctas, build=build)}
        dec = time_plan(q, kv, None, build[0], warps=build[1])
        r.update(decode_us=dec["flushed_us"], decode_clean_us=dec["clean_us"])
        r["floor_read_bw_Bps"] = nbytes / (r["floor_read_clean_us"] * 1e-6)
        rows.append(r)
        print(
            f"{a.shape} {b:>3}x{ctx:<6} {nbytes / 1e6:8.1f} MB  read floor {r['floor_read_us']:7.1f} / "
            f"{r['floor_read_clean_us']:7.1f} us ({r['floor_read_bw_Bps'] / 1e12:.2f} TB/s clean, "
            f"{r['floor_read_config']})  launch {r['floor_launch_us']:5.1f} / {r['floor_launch_clean_us']:5.1f} us "
            f"({r['floor_launch_ctas']} CTAs)  decode {r['decode_us']:7.1f} / {r['decode_clean_us']:7.1f} us",
            flush=True,
        )
        del q, kv
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "copy_bandwidth_Bps": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
