#!/usr/bin/env bash
# Run 157: the session's last device call. `python3 -m quant.kernels.build` (new: every default build in parallel),
# then every GPU test file with the committed default (WIDE on, no switch set).
#   OUT=$OUT bash results/bench/experiments/h100-run154-158-wide-default/run157.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
unset OSCAR_WIDE_DECODE
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
timeout 300 python3 -m quant.kernels.build --timeout 280 2>&1 | tee $OUT/log.txt
echo "build: $(( $(date +%s) - t0 ))s; again (all cached):" | tee -a $OUT/log.txt
timeout 60 python3 -m quant.kernels.build 2>&1 | tail -n 1 | tee -a $OUT/log.txt
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_csrc.py tests/test_graph_decode.py \
  tests/test_kernels_hf.py tests/test_kernels_layers.py tests/test_kernels_linear.py tests/test_kernels_norm.py \
  tests/test_kernels_rope.py tests/test_kernels_triton.py tests/test_kernel_build.py 2>&1 | tee $OUT/tests.log | tail -n 15
echo "total: $(( $(date +%s) - t0 ))s" | tee -a $OUT/log.txt
