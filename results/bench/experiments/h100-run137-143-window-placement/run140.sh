#!/usr/bin/env bash
# Run 140: LLaVA 16 x 32K re-measured (run 139's flagged dirty time; its plan did not change), the planner A/B at plans
# run 138 did not cover, then the GPU tests of the decode and the graph-replayed generate.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
t0=$(date +%s)
for d in 128 64; do python3 -c "import sys; from quant.kernels import cuda; cuda.load(int(sys.argv[1]), min_blocks=3)" $d > /dev/null 2>&1 & done; wait
echo "build: $(( $(date +%s) - t0 ))s"
timeout 120 python3 -m harness.cli bench --what kernels --shapes llava-7b --points 16x32768 --backends cuda --out $OUT/llava16.json 2>&1 | grep -v "^target\|^decode\|^effective\|^pack\|^e2e\|met" | tail -n 4
S="python3 -m quant.kernels.sweep_splits --splits="
ab() {
  for pass in 1 2; do
    $S --shape $1 --points $2 --window cta 2>&1 | sed "s/^/old$pass /" | tee -a $OUT/ab.log
    $S --shape $1 --points $2 2>&1 | sed "s/^/new$pass /" | tee -a $OUT/ab.log
  done
}
ab qwen3-8b 3x16384,4x16384,5x16384,2x65536
ab qwen3-omni-thinker 8x16384,5x32768,4x65536
echo "sweeps: $(( $(date +%s) - t0 ))s"
timeout 200 python3 -m pytest tests/test_csrc.py tests/test_graph_decode.py -q -p no:cacheprovider 2>&1 | tail -n 6 | tee $OUT/tests.log
echo "total: $(( $(date +%s) - t0 ))s"
