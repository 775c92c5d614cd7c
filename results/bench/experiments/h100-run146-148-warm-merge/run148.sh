#!/usr/bin/env bash
# Run 148: the committed default (OSCAR_WARM_MERGE=1, rows >= 8) against HEAD's tree where run 147 did not look: LLaVA's
# points (the same kernel instantiation as Qwen3's, new code), the thinker's other batch-1 and batched points.
set -u
export PYTHONUNBUFFERED=1 MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
NEW=$PWD; HEAD=$PWD/.cache/abhead
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
build() { (cd $1 && PYTHONPATH=$1 python3 -c "from quant.kernels import cuda; cuda.load(128, min_blocks=3)" > $OUT/build-$2.log 2>&1 || tail -20 $OUT/build-$2.log); }
build $HEAD head & build $NEW new &
wait
echo "builds: $(( $(date +%s) - t0 ))s"
sw() {  # tree label shape points
  (cd $1 && PYTHONPATH=$1 timeout 150 python3 -m quant.kernels.sweep_splits --splits= --shape $3 --points $4 2>&1 | grep -v Warning | sed "s/^/$2 /" | tee -a $OUT/ab.log)
}
L=1x4096,1x32768,1x131072,16x32768,64x4096
T=1x1024,1x8192,2x32768,4x131072,8x4096
for pass in 1 2; do
  sw $HEAD head$pass llava-7b $L; sw $NEW new$pass llava-7b $L
  sw $HEAD head$pass qwen3-omni-thinker $T; sw $NEW new$pass qwen3-omni-thinker $T
done
echo "total: $(( $(date +%s) - t0 ))s"
