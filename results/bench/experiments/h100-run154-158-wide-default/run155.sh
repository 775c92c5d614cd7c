#!/usr/bin/env bash
# Run 155: where the WIDE rule (cuda.wide_plan) was fit on no measurement. Both builds' planned launches at batch 2-8
# of the thinker, Qwen3 1 x 8K / 16K and batch 2 (two interleaved passes, dirty / read-only flush us); then LLaVA
# 16 x 32K, run 154's one flagged time (607 -> 680 us dirty, a batch-16 step that WIDE never takes), in two fresh
# bench processes.
#   OUT=$OUT bash results/bench/experiments/h100-run154-158-wide-default/run155.sh
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
for spec in "128, min_blocks=3" "128, min_blocks=1, warps=8"; do
  python3 -c "from quant.kernels import cuda; cuda.load($spec)" >> $OUT/build.log 2>&1 &
done
python3 -c "from quant.kernels import cuda; cuda.load_layers()" >> $OUT/build.log 2>&1 &
wait
echo "build: $(( $(date +%s) - t0 ))s" | tee -a $OUT/ab.log
sw() {  # label min_blocks warps shape points
  timeout 120 python3 -m quant.kernels.sweep_splits --splits= --min-blocks $2 --warps $3 --shape $4 --points $5 \
    --out $OUT/sweep-$1-$4.json 2>&1 | grep -v Warning | sed "s/^/$1 /" | tee -a $OUT/ab.log
}
TH=2x4096,2x16384,2x32768,2x131072,4x8192,4x32768,4x131072,8x32768
QW=1x8192,1x16384,2x16384,2x32768,2x131072
for pass in 1 2; do
  order="wide narrow"; [ $pass = 2 ] && order="narrow wide"
  for b in $order; do
    if [ $b = wide ]; then M=1; W=8; else M=3; W=4; fi
    sw $b$pass $M $W qwen3-omni-thinker $TH
    sw $b$pass $M $W qwen3-8b $QW
    echo "pass $pass $b: $(( $(date +%s) - t0 ))s" | tee -a $OUT/ab.log
  done
done
for i in 1 2; do
  timeout 150 python3 -m harness.cli bench --what kernels --shapes llava-7b --points 16x32768 \
    --out $OUT/llava16-$i.json 2>&1 | grep -E "^llava" | tee -a $OUT/ab.log
done
echo "total: $(( $(date +%s) - t0 ))s" | tee -a $OUT/ab.log
