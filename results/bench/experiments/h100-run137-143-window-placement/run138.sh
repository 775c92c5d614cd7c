#!/usr/bin/env bash
# Run 138: the planner's window placement (the folded plan where its slowest SM ends sooner) against the old rule
# (the window's own CTA for rows <= 44), A/B/A/B at every plan it changes that we could list, then the decode tests.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
python3 -c "from quant.kernels import cuda; cuda.load(128, min_blocks=3)" 2>&1 | tail -3
echo "build: $(( $(date +%s) - t0 ))s"
S="python3 -m quant.kernels.sweep_splits --splits="
ab() {  # shape points
  for pass in 1 2; do
    $S --shape $1 --points $2 --window cta --out $OUT/$1-old-$pass.json 2>&1 | sed "s/^/old$pass /" | tee -a $OUT/ab.log
    $S --shape $1 --points $2 --out $OUT/$1-new-$pass.json 2>&1 | sed "s/^/new$pass /" | tee -a $OUT/ab.log
  done
}
ab llava-7b 1x4096,1x8192,1x16384,1x32768,1x65536,1x131072
ab qwen3-8b 2x16384,2x131072,3x8192,3x131072,4x4096,4x32768,4x131072,5x2048,5x4096,5x32768,5x131072
ab qwen3-omni-thinker 3x32768,4x16384,5x4096,8x8192,8x131072
echo "sweeps: $(( $(date +%s) - t0 ))s"
timeout 300 python3 -m pytest tests/test_csrc.py -q -k "decode or plan or split or merge" -p no:cacheprovider 2>&1 | tail -n 15 | tee $OUT/tests.log
echo "total: $(( $(date +%s) - t0 ))s"
