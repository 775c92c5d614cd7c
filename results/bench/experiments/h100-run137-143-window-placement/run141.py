"""Run 141: is LLaVA 16 x 32K's graph replay after the dirty flush (607 or 683 us) bimodal per capture?"""
import sys, torch
from harness.bench import _median_us, _graph_us, clean_l2_us, SHAPES
from quant.kernels import pack_kv, decode_attention
from quant.packed import PackedKV
from quant.primitives import hadamard

for shape, batch, ctx in [("llava-7b", 16, 32768), ("qwen3-8b", 16, 32768)]:
    hq, hkv, d = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(batch * 7 + ctx)
    bf = torch.bfloat16
    q = torch.randn(batch, hq, 1, d, device="cuda", generator=g).to(bf)
    k = torch.randn(batch, hkv, ctx, d, device="cuda", generator=g).to(bf)
    v = torch.randn(batch, hkv, ctx, d, device="cuda", generator=g).to(bf)
    tq = ctx - 64; tq -= tq % 128
    kq, vq, norms = pack_kv(k[:, :, :tq], v[:, :, :tq], backend="cuda", rotate_values=False)
    kv = PackedKV(kq, vq, norms, k[:, :, tq:].contiguous(), v[:, :, tq:].contiguous(), hadamard(d, device="cuda"),
                  values_rotated=False)
    fn = lambda: decode_attention(q, kv, d ** -0.5, backend="cuda")
    fn()
    print(shape, batch, ctx, "eager dirty", [round(_median_us(fn), 1) for _ in range(2)], flush=True)
    graphs = []
    for i in range(4):
        s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            out = fn()
        graphs.append((gr, out))
        print(f"  capture {i}: out at {out.data_ptr() % (1 << 30):#x}, dirty {[round(_median_us(gr.replay), 1) for _ in range(3)]}"
              f" clean {round(clean_l2_us(gr.replay), 1)}", flush=True)
    print("  _graph_us x3 (the bench's own):", [round(_graph_us(fn), 1) for _ in range(3)], flush=True)
    del q, k, v, kv, graphs
    torch.cuda.empty_cache()
