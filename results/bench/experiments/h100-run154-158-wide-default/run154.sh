#!/usr/bin/env bash
# Run 154 (for the next session with device time): validate the WIDE decode build and gate it.
#   call 1: OUT=$OUT bash results/bench/experiments/h100-run154-158-wide-default/run154.sh tests   (~5 min)
#   call 2: OUT=$OUT bash results/bench/experiments/h100-run154-158-wide-default/run154.sh bench   (~9 min)
# If both pass (no test fails, the gate reports no slowdown beyond 5%), make WIDE the default (cuda.wide_enabled).
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
if [ "${1:-tests}" = tests ]; then
  timeout 200 python3 -m pytest -q tests/test_csrc.py tests/test_graph_decode.py -p no:cacheprovider 2>&1 \
    | tail -n 12 | tee -a $OUT/log.txt
  OSCAR_WIDE_DECODE=1 timeout 200 python3 -m pytest -q tests/test_csrc.py tests/test_graph_decode.py \
    -p no:cacheprovider -k "decode or wide or merge or graph" 2>&1 | tail -n 12 | tee -a $OUT/log.txt
else
  OSCAR_WIDE_DECODE=1 timeout 470 python3 -m harness.cli bench --out $OUT/bench-all.json \
    --against results/bench/h100-run149/bench-all.json 2>&1 | tee $OUT/bench.log | tail -n 60
fi
echo "total: $(( $(date +%s) - t0 ))s" | tee -a $OUT/log.txt
