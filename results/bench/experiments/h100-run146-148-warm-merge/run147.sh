#!/usr/bin/env bash
# Run 147: the early merge-code run only where a row has >= 8 query rows (the thinker), against the default build and
# against it at every row count (run 146's build), three interleaved passes; tests of the gated build.
set -u
export PYTHONUNBUFFERED=1 MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
W="-DOSCAR_WARM_MERGE=1"; A="-DOSCAR_WARM_MERGE=1 -DOSCAR_WARM_MERGE_ROWS=1"
build() { OSCAR_KERNEL_FLAGS="$1" python3 -c "from quant.kernels import cuda; cuda.load($2, min_blocks=3)" > $OUT/build-$2-${3}.log 2>&1 || tail -20 $OUT/build-$2-$3.log; }
build "" 128 base & build "$W" 128 gated & build "$A" 128 all & build "$W" 64 gated &
wait
echo "builds: $(( $(date +%s) - t0 ))s"
sw() {  # flags label shape points
  OSCAR_KERNEL_FLAGS="$1" timeout 120 python3 -m quant.kernels.sweep_splits --splits= --shape $3 --points $4 2>&1 | grep -v Warning | sed "s/^/$2 /" | tee -a $OUT/ab.log
}
Q=1x4096,1x32768,1x131072,16x32768,64x4096
for pass in 1 2 3; do
  sw "" base$pass qwen3-8b $Q; sw "$W" gated$pass qwen3-8b $Q; sw "$A" all$pass qwen3-8b $Q
  sw "" base$pass qwen3-omni-thinker $Q; sw "$W" gated$pass qwen3-omni-thinker $Q; sw "$A" all$pass qwen3-omni-thinker $Q
done
sw "" base llava-7b 1x4096,1x8192; sw "$W" gated llava-7b 1x4096,1x8192
echo "sweeps: $(( $(date +%s) - t0 ))s"
OSCAR_KERNEL_FLAGS="$W" timeout 150 python3 -m pytest tests/test_csrc.py -q -x -k "decode or merge" -p no:cacheprovider 2>&1 | tail -n 4 | tee $OUT/tests.log
echo "total: $(( $(date +%s) - t0 ))s"
