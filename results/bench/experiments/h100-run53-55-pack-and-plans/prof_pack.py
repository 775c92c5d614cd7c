"""Pack kernel diagnostics: time variants (rotate / token_norm off, dirty vs clean L2) at qwen3 1x128K; ncu target."""
import sys
import torch
from harness.bench import _median_us, clean_l2_us, copy_bandwidth
from quant.kernels import cuda as kcuda

torch.manual_seed(0)
b, h, t, d = 1, 8, 131008, 128
if len(sys.argv) > 1 and sys.argv[1] == "llava":
    h = 32
k = torch.randn(b, h, t, d, device="cuda").to(torch.bfloat16)
v = torch.randn(b, h, t, d, device="cuda").to(torch.bfloat16)
mod = kcuda.load(128)
kq, vq, n = kcuda.pack_kv(k, v)
out_bytes = sum(x.nbytes for x in (kq.codes, kq.scale, kq.zero, vq.codes, vq.scale, vq.zero, n))
total = 2 * k.nbytes + out_bytes
if len(sys.argv) > 2 and sys.argv[2] == "ncu":
    for _ in range(3):
        mod.pack(k, v, True, True)
    torch.cuda.synchronize()
    sys.exit(0)
cbw = copy_bandwidth()
print(f"bytes {total/1e6:.1f} MB (in {2*k.nbytes/1e6:.1f}, out {out_bytes/1e6:.1f}); copy {cbw/1e12:.2f} TB/s")
for rot, tn in ((True, True), (True, False), (False, True), (False, False)):
    fn = lambda: mod.pack(k, v, rot, tn)
    dirty = _median_us(fn, 5, 50)
    clean = clean_l2_us(fn, 30)
    print(f"rotate {rot!s:5} token_norm {tn!s:5}: dirty {dirty:7.1f} us ({total/dirty/1e-6/cbw:.3f} of copy)  clean {clean:7.1f} us ({total/clean/1e-6/cbw:.3f})")
fn = lambda: kcuda.pack_kv(k, v)
print(f"pack_kv wrapper dirty {_median_us(fn, 5, 50):.1f} us")
