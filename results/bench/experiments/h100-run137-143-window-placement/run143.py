"""Run 143: LLaVA 16 x 32K's graph replay after the dirty flush, 682 us inside `harness.cli bench` and 607 in a fresh
process running kernel_point (runs 139-142). argv[1]: cli (as is) | nocopy (copy_bandwidth skipped) | emptied
(copy_bandwidth, then torch.cuda.empty_cache()) | env (environment() then kernel_point)."""
import sys
import torch
import harness.bench as hb

mode = sys.argv[1]
if mode in ("cli", "nocopy", "emptied"):
    if mode == "nocopy":
        hb.copy_bandwidth = lambda: 3.0e12
    if mode == "emptied":
        orig = hb.copy_bandwidth
        def cb():
            bw = orig()
            torch.cuda.empty_cache()
            return bw
        hb.copy_bandwidth = cb
    from harness.cli import main as cli_main
    sys.argv = ["oscar-eval", "bench", "--what", "kernels", "--shapes", "llava-7b", "--points", "16x32768", "--backends",
                "cuda", "--out", f"/tmp/run143-{mode}.json"]
    try:
        cli_main()
    except SystemExit:
        pass
    import json
    r = json.load(open(f"/tmp/run143-{mode}.json"))["kernels"][0]
else:
    hb.environment()
    r = hb.kernel_point("llava-7b", 16, 32768, ["cuda"], False)
print(mode, "eager", round(r["oscar_cuda_us"], 1), "graph", round(r["oscar_cuda_graph_us"], 1), "clean",
      round(r["oscar_cuda_graph_clean_us"], 1), "cudnn graph", round(r["sdpa_cudnn_graph"], 1), flush=True)
