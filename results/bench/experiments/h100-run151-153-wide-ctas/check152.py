"""Run 152: the decode built with OSCAR_KERNEL_FLAGS (e.g. -DOSCAR_WARPS=8) against the float64 oracle."""
import sys
import torch
from quant.kernels import cuda as kcuda
from quant.kernels.sweep_splits import default_build
from quant.kernels.reference import attention_f64, attention_bf16, relative_error, random_packed_kv

mb = int(sys.argv[1]) if len(sys.argv) > 1 else 1
bad = 0
for group, d in [(1, 128), (4, 128), (8, 128), (4, 64), (8, 64)]:
    for window_cta in (False, True):
        for split, mg in [(128, None), (None, None), (128, 2)]:
            if mg and not window_cta:
                continue
            with default_build():
                kv = random_packed_kv(3, 2, 1280, 77, d, seed=group + d, device="cuda", rotate_values=False)
            kv_lens, res_lens = [1280, 333, 97], [77, 1, 40]
            q = torch.randn(3, 2 * group, 1, d, generator=torch.Generator().manual_seed(d)).to(torch.bfloat16)
            out = kcuda.decode_attention(q.cuda(), kv, d**-0.5, kv_lens=kv_lens, res_lens=res_lens, split_tokens=split,
                                         window_cta=window_cta, min_blocks=mb, merge_group=mg)
            ref = attention_f64(q, kv, d**-0.5, kv_lens, res_lens)
            err = relative_error(out, ref)
            budget = relative_error(attention_bf16(q, kv, d**-0.5, kv_lens, res_lens), ref)
            ok = bool(torch.isfinite(out).all()) and err <= 2 * budget
            bad += not ok
            print(f"group {group} d {d} window_cta {window_cta} split {split} merge_group {mg}: err {err:.2e} "
                  f"budget {budget:.2e} {'ok' if ok else 'FAIL'}", flush=True)
print("failures:", bad)
