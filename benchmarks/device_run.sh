#!/usr/bin/env bash
# A fresh GPU machine: build the CUDA specializations, run the kernel tests on the GPU, then benchmark.
# Usage (repo root, on the GPU machine): OUT=<dir> bash benchmarks/device_run.sh [bench args...]
# Everything lands under $OUT (logs, JSON); the last lines printed are the tables.
set -u
OUT=${OUT:-results/bench}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=${MAX_JOBS:-16}
export OSCAR_KERNEL_CACHE=${OSCAR_KERNEL_CACHE:-/tmp/oscar-kernel-cache}
PY=${PY:-python3}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
$PY -c "import torch, triton, transformers; print(torch.__version__, torch.version.cuda, triton.__version__, transformers.__version__)" | tee -a "$OUT/gpu.txt"
t0=$(date +%s)
# Build the CUDA specializations in parallel (one nvcc each): "HEAD_DIM:MIN_BLOCKS[:WARPS] ..." (cuda.NARROW is 3:4,
# cuda.WIDE 1:8, cuda.WIDE_LONG 1:12; quant/kernels/build.py), and the layer kernels.
timeout 330 $PY -m quant.kernels.build ${BUILD_VARIANTS:-128:3 64:3 128:1:8 64:1:8 128:1:12 64:1:12} --timeout 300 2>&1 | tee "$OUT/build.log"
echo "build stage: $(( $(date +%s) - t0 ))s"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 240 $PY -m pytest tests/kernels/test_csrc.py tests/kernels/test_kernels_triton.py tests/kernels/test_kernels_hf.py -q --tb=short \
    -p no:cacheprovider 2>&1 | tail -n 40 | tee "$OUT/tests.log"
  echo "tests stage: $(( $(date +%s) - t0 ))s"
fi
if [ -n "${PROFILE:-}" ]; then  # Nsight Compute on one decode launch: PROFILE="--batch 1 --context 32768"
  timeout 240 ncu --clock-control none --kernel-name regex:"decode_split" --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section SchedulerStats $PY -m benchmarks.profile_decode $PROFILE >"$OUT/ncu.txt" 2>&1
  grep -E "Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Registers|Stall|Issued Warp|No Eligible|Active Warps|Block Limit" "$OUT/ncu.txt" | head -n 40
  echo "profile stage: $(( $(date +%s) - t0 ))s"
fi
timeout ${BENCH_TIMEOUT:-420} $PY -m harness.cli bench --out "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.log" | tail -n 60
echo "total: $(( $(date +%s) - t0 ))s"
