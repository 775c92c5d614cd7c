#!/usr/bin/env bash
# Run 146: is the merge's code fetched from DRAM after a read-only flush? Traces warm and after the flush; then a
# window CTA that runs the merge's code early (OSCAR_WARM_MERGE=1) against the default build, A/B/A/B; tests.
set -u
export PYTHONUNBUFFERED=1 MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
W="-DOSCAR_WARM_MERGE=1"
build() { OSCAR_KERNEL_FLAGS="$1" python3 -c "from quant.kernels import cuda; cuda.load($2, min_blocks=3)" > $OUT/build-$2-${3}.log 2>&1 || tail -20 $OUT/build-$2-$3.log; }
build "" 128 base & build "$W" 128 warm & build "$W" 64 warm &
wait
echo "builds: $(( $(date +%s) - t0 ))s"
sw() {  # flags label shape points [extra]
  OSCAR_KERNEL_FLAGS="$1" timeout 120 python3 -m quant.kernels.sweep_splits --splits= --shape $3 --points $4 ${5:-} 2>&1 | grep -v Warning | sed "s/^/$2 /" | tee -a $OUT/ab.log
}
sw "" base-warmtrace qwen3-8b 1x4096,1x131072 --trace
sw "" base-flushtrace qwen3-8b 1x4096,1x131072 "--trace --trace-flush"
sw "$W" warm-flushtrace qwen3-8b 1x4096,1x131072 "--trace --trace-flush"
sw "" base-flushtrace qwen3-omni-thinker 1x4096 "--trace --trace-flush"
sw "$W" warm-flushtrace qwen3-omni-thinker 1x4096 "--trace --trace-flush"
echo "traces: $(( $(date +%s) - t0 ))s"
Q=1x4096,1x32768,1x131072,16x32768,64x4096
for pass in 1 2; do
  sw "" base$pass qwen3-8b $Q; sw "$W" warm$pass qwen3-8b $Q
  sw "" base$pass qwen3-omni-thinker $Q; sw "$W" warm$pass qwen3-omni-thinker $Q
done
echo "sweeps: $(( $(date +%s) - t0 ))s"
OSCAR_KERNEL_FLAGS="$W" timeout 150 python3 -m pytest tests/test_csrc.py -q -x -k "decode or merge" -p no:cacheprovider 2>&1 | tail -n 6 | tee $OUT/tests.log
echo "total: $(( $(date +%s) - t0 ))s"
