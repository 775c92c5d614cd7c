#!/usr/bin/env bash
# Run 149: the whole make bench of this session's code (the merge's code warmed, OSCAR_WARM_MERGE), gated against run 139.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/gpu.txt
t0=$(date +%s)
for d in 128 64; do python3 -c "import sys; from quant.kernels import cuda; cuda.load(int(sys.argv[1]), min_blocks=3)" $d > $OUT/build-$d.log 2>&1 & done; wait
echo "build: $(( $(date +%s) - t0 ))s"
timeout 470 python3 -m harness.cli bench --out $OUT/bench-all.json --against results/bench/h100-run139/bench-all.json 2>&1 | tee $OUT/bench.log | tail -n 60
echo "total: $(( $(date +%s) - t0 ))s"
