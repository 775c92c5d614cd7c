#!/usr/bin/env bash
# Run 145: fp16 normalized partials and 16 partials in flight per merging thread (the merge in one round of loads at
# Qwen3 1 x 128K and the thinker's 1 x 4K) against HEAD, A/B/A/B, then the decode tests.
set -u
export PYTHONUNBUFFERED=1 MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
NEW=$PWD; HEAD=$PWD/.cache/abhead
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
build() { (cd $1 && PYTHONPATH=$1 OSCAR_KERNEL_FLAGS="$2" python3 -c "from quant.kernels import cuda; cuda.load($4, min_blocks=3)" > $OUT/build-$3.log 2>&1 || tail -20 $OUT/build-$3.log); }
build $HEAD "" head 128 & build $NEW "" new 128 & build $NEW "-DOSCAR_MERGE_CHUNK=8" c8 128 & build $NEW "" new64 64 &
wait
echo "builds: $(( $(date +%s) - t0 ))s"
sw() {  # tree flags label shape points [extra]
  (cd $1 && PYTHONPATH=$1 OSCAR_KERNEL_FLAGS="$2" timeout 120 python3 -m quant.kernels.sweep_splits --splits= --shape $4 --points $5 ${6:-} 2>&1 | grep -v Warning | sed "s/^/$3 /" | tee -a $OUT/ab.log)
}
Q=1x4096,1x32768,1x131072,16x32768,64x4096
for pass in 1 2; do
  sw $HEAD "" head$pass qwen3-8b $Q; sw $NEW "" new$pass qwen3-8b $Q
  sw $HEAD "" head$pass qwen3-omni-thinker $Q; sw $NEW "" new$pass qwen3-omni-thinker $Q
  sw $HEAD "" head$pass llava-7b 1x4096,1x131072,64x4096; sw $NEW "" new$pass llava-7b 1x4096,1x131072,64x4096
done
sw $NEW "-DOSCAR_MERGE_CHUNK=8" c8 qwen3-8b $Q; sw $NEW "-DOSCAR_MERGE_CHUNK=8" c8 qwen3-omni-thinker $Q
echo "sweeps: $(( $(date +%s) - t0 ))s"
sw $NEW "" newtrace qwen3-8b 1x131072 --trace; sw $NEW "" newtrace qwen3-omni-thinker 1x4096,1x131072 --trace
sw $HEAD "" headtrace qwen3-omni-thinker 1x4096 --trace
echo "traces: $(( $(date +%s) - t0 ))s"
PYTHONPATH=$NEW timeout 150 python3 -m pytest tests/test_csrc.py -q -x -k "decode or merge or graph" -p no:cacheprovider 2>&1 | tail -n 8 | tee $OUT/tests.log
echo "total: $(( $(date +%s) - t0 ))s"
