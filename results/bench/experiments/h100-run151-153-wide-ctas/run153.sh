#!/usr/bin/env bash
# Run 153: the committed WIDE build (8-warp CTAs, one an SM, for batch-1 steps): the decode GPU tests of
# tests/test_csrc.py, then the kernel bench of every shape (CUDA backend) gated against run 149, then the e2e bench.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
for spec in "128, min_blocks=3" "64, min_blocks=3" "128, min_blocks=1, warps=8" "64, min_blocks=1, warps=8"; do
  python3 -c "from quant.kernels import cuda; cuda.load($spec)" >> $OUT/build.log 2>&1 &
done
python3 -c "from quant.kernels import cuda; cuda.load_layers()" >> $OUT/build.log 2>&1 &
wait
echo "build: $(( $(date +%s) - t0 ))s" | tee -a $OUT/log.txt
timeout 110 python3 -m pytest -q tests/test_csrc.py -p no:cacheprovider -k "decode or wide or merge or plan" 2>&1 | tail -n 8 | tee -a $OUT/log.txt
echo "tests: $(( $(date +%s) - t0 ))s" | tee -a $OUT/log.txt
timeout $(( 450 - $(date +%s) + t0 )) python3 -m harness.cli bench --what kernels --backends cuda --out $OUT/bench-kernels.json --against results/bench/h100-run149/bench-all.json 2>&1 | tee $OUT/bench-kernels.log | tail -n 45
echo "kernels: $(( $(date +%s) - t0 ))s" | tee -a $OUT/log.txt
timeout $(( 560 - $(date +%s) + t0 )) python3 -m harness.cli bench --what e2e --out $OUT/bench-e2e.json 2>&1 | tee $OUT/bench-e2e.log | tail -n 12
echo "total: $(( $(date +%s) - t0 ))s" | tee -a $OUT/log.txt
