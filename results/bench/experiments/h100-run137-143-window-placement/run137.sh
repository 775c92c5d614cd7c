#!/usr/bin/env bash
# Run 137: LLaVA 1x128K window placement and split counts; thinker 1x4K split counts; Qwen3 1x128K folded.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
python3 -c "from quant.kernels import cuda; cuda.load(128, min_blocks=3)" 2>&1 | tail -3
echo "build: $(( $(date +%s) - t0 ))s"
S="python3 -m quant.kernels.sweep_splits"
$S --shape llava-7b --points 1x131072 --window cta --splits 9,10,11,12 --trace --out $OUT/llava-cta.json 2>&1 | tee $OUT/sweep.log
$S --shape llava-7b --points 1x131072 --window folded --splits 10,11,12,13,16 --balance --out $OUT/llava-folded.json 2>&1 | tee -a $OUT/sweep.log
$S --shape llava-7b --points 1x131072 --window folded --splits 12 --balance --orders 0,1,2 --out $OUT/llava-folded-orders.json 2>&1 | tee -a $OUT/sweep.log
$S --shape qwen3-omni-thinker --points 1x4096 --window cta --splits 4,8,12,16,24,32 --out $OUT/thinker-4k-cta.json 2>&1 | tee -a $OUT/sweep.log
$S --shape qwen3-omni-thinker --points 1x4096 --window folded --splits 2,4,8,12,16,24,32 --balance --out $OUT/thinker-4k-folded.json 2>&1 | tee -a $OUT/sweep.log
$S --shape qwen3-8b --points 1x131072 --window folded --splits 32,33 --balance --out $OUT/qwen3-folded.json 2>&1 | tee -a $OUT/sweep.log
echo "total: $(( $(date +%s) - t0 ))s"
