#!/usr/bin/env bash
# Run 156: the GPU tests of the committed default (WIDE on, the rule with 8 query rows a KV head), no switch set:
# both head dims of both builds, tests/test_csrc.py and tests/test_graph_decode.py; then the thinker's 2 x 4K / 8K
# default launch (now WIDE) against the narrow build, two passes.
#   OUT=$OUT bash results/bench/experiments/h100-run154-158-wide-default/run156.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
unset OSCAR_WIDE_DECODE
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
for spec in "128, min_blocks=3" "64, min_blocks=3" "128, min_blocks=1, warps=8" "64, min_blocks=1, warps=8"; do
  python3 -c "from quant.kernels import cuda; cuda.load($spec)" >> $OUT/build.log 2>&1 &
done
python3 -c "from quant.kernels import cuda; cuda.load_layers()" >> $OUT/build.log 2>&1 &
wait
echo "build: $(( $(date +%s) - t0 ))s" | tee -a $OUT/log.txt
timeout 240 python3 -m pytest -q tests/test_csrc.py tests/test_graph_decode.py -p no:cacheprovider 2>&1 \
  | tail -n 15 | tee -a $OUT/log.txt
echo "tests: $(( $(date +%s) - t0 ))s" | tee -a $OUT/log.txt
python3 -c "
import torch
from quant.kernels import cuda
from quant.kernels.sweep_splits import inputs
for b, t in ((2, 4096), (2, 8192), (1, 8192)):
    q, kv = inputs('qwen3-omni-thinker', b, t)
    print('thinker', b, t, cuda.launch_plan(q, kv))
" 2>&1 | grep -v Warning | tee -a $OUT/log.txt
for pass in 1 2; do
  for mw in "1 8" "3 4"; do
    set -- $mw
    timeout 60 python3 -m quant.kernels.sweep_splits --splits= --min-blocks $1 --warps $2 --shape qwen3-omni-thinker \
      --points 2x4096,2x8192 2>&1 | grep -v Warning | sed "s/^/w$2-$pass /" | tee -a $OUT/log.txt
  done
done
echo "total: $(( $(date +%s) - t0 ))s" | tee -a $OUT/log.txt
