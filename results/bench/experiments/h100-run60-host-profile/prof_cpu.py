"""Where the host time of an eager decode step goes (cProfile), Qwen3-8B shape, OScaR cache, 1 x 4K."""
import cProfile
import pstats
import sys
import time

import torch

from harness.bench import build_model, make_cache, qwen3_8b_config

cfg = qwen3_8b_config()
model = build_model(cfg)
kind = sys.argv[1] if len(sys.argv) > 1 else "oscar"
cache = make_cache(kind, cfg, 1, 4096, 64, "cuda")
tok = torch.randint(0, cfg.vocab_size, (1, 1), device="cuda")
with torch.inference_mode():
    for _ in range(5):
        model(tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        model(tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    print(f"{kind}: eager step {(time.perf_counter() - t) / 10 * 1e3:.2f} ms (no profiler)")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(10):
        model(tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    pr.disable()
st = pstats.Stats(pr)
st.sort_stats("tottime").print_stats(22)
st.sort_stats("cumtime").print_stats(35)
