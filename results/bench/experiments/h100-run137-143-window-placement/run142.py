"""Run 142: which step of harness.bench.kernel_point leaves LLaVA 16 x 32K's graph replay after the dirty flush at
~683 us (606 in a fresh process, run 141)? argv[1]: full | nofloor | nobf16 | nopack."""
import sys, torch
import harness.bench as hb
import quant.kernels.floor as fl

mode = sys.argv[1]
if mode == "nofloor":
    fl.floor_point = lambda *a, **k: {}
if mode == "nobf16":
    hb.bf16_baselines = lambda *a, **k: {}
if mode == "nopack":
    orig = hb._median_us
    def med(fn, warmup=25, rep=100):
        return float("nan") if rep == 20 or warmup == 5 else orig(fn, warmup, rep)
    hb._median_us = med
row = hb.kernel_point("llava-7b", 16, 32768, ["cuda"], False)
print(mode, "bench row: eager", round(row["oscar_cuda_us"], 1), "graph", round(row["oscar_cuda_graph_us"], 1),
      "clean", round(row["oscar_cuda_graph_clean_us"], 1), flush=True)
