#!/usr/bin/env bash
# Run 158: the one step the WIDE rule takes unmeasured: Qwen3's 8 KV heads with 2 query tokens (speculative decoding:
# 4 x 2 = 8 query rows a KV head) below 16K, which `wide_plan` now gives WIDE by its query rows. Both builds' planned
# launches, Lq 2 at 1 x 4K / 8K (and Lq 1 at 1 x 4K as run 152's reference), two interleaved passes.
#   OUT=$OUT bash results/bench/experiments/h100-run154-158-wide-default/run158.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
timeout 200 python3 -m quant.kernels.build 128:3 128:1:8 --no-layers 2>&1 | tee $OUT/log.txt
for pass in 1 2; do
  order="1:8 3:4"; [ $pass = 2 ] && order="3:4 1:8"
  for mw in $order; do
    M=${mw%:*}; W=${mw#*:}
    for lq in 2 1; do
      pts=1x4096,1x8192; [ $lq = 1 ] && pts=1x4096
      timeout 60 python3 -m quant.kernels.sweep_splits --splits= --min-blocks $M --warps $W --shape qwen3-8b \
        --points $pts --lq $lq 2>&1 | grep -v Warning | sed "s/^/w$W-$pass /" | tee -a $OUT/log.txt
    done
  done
done
echo "total: $(( $(date +%s) - t0 ))s" | tee -a $OUT/log.txt
