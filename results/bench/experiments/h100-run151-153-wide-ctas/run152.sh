#!/usr/bin/env bash
# Run 152: decode CTAs of 8 warps, one per SM (OSCAR_WARPS=8, min_blocks 1), against the default 4 warps and up to 3
# CTAs per SM: correctness against the oracle, then the batch-1 points, two interleaved passes; a trace of the
# thinker's 1 x 128K; then the graph-decode GPU tests of the default build (not run since the warmed merge).
set -u
export PYTHONUNBUFFERED=1 MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
W8="-DOSCAR_WARPS=8"
build() { OSCAR_KERNEL_FLAGS="$1" python3 -c "from quant.kernels import cuda; cuda.load($2, min_blocks=$3)" > $OUT/build.log 2>&1 || tail -20 $OUT/build.log; }
build "" 128 3 base & build "" 64 3 base64 & build "$W8" 128 1 w8 & build "$W8" 64 1 w8-64 &
python3 -c "from quant.kernels import cuda; cuda.load_layers()" > /dev/null 2>&1 &
wait
echo "builds: $(( $(date +%s) - t0 ))s" | tee -a $OUT/ab.log
OSCAR_KERNEL_FLAGS="$W8" timeout 150 python3 .cache/check152.py 1 2>&1 | grep -v Warning | tee -a $OUT/ab.log
sw() {  # flags label shape points [extra...]
  local f="$1" l="$2" s="$3" pts="$4"; shift 4
  OSCAR_KERNEL_FLAGS="$f" timeout 100 python3 -m quant.kernels.sweep_splits --shape $s --points $pts "$@" 2>&1 | grep -v Warning | sed "s/^/$l /" | tee -a $OUT/ab.log
}
sw "$W8" w8-flushtrace qwen3-omni-thinker 1x131072 --min-blocks 1 --splits= --trace --trace-flush
for pass in 1 2; do
  fl="w8 base"; [ $pass = 2 ] && fl="base w8"
  for f in $fl; do
    if [ $f = base ]; then F=""; M=3; else F="$W8"; M=1; fi
    sw "$F" $f$pass qwen3-omni-thinker 1x4096,1x32768,1x131072,16x32768 --min-blocks $M --splits=
    sw "$F" $f$pass qwen3-8b 1x4096,1x32768,1x131072 --min-blocks $M --splits=
    sw "$F" $f$pass llava-7b 1x131072 --min-blocks $M --splits=
    [ $f = w8 ] && sw "$F" $f$pass qwen3-8b 1x131072 --min-blocks $M --splits 16 --window folded
    [ $f = w8 ] && sw "$F" $f$pass llava-7b 1x131072 --min-blocks $M --splits 4 --window folded
    echo "pass $pass $f: $(( $(date +%s) - t0 ))s" | tee -a $OUT/ab.log
  done
done
timeout $(( 560 - $(date +%s) + t0 )) python3 -m pytest -q tests/test_graph_decode.py -p no:cacheprovider 2>&1 | tail -n 6 | tee $OUT/tests.log
echo "total: $(( $(date +%s) - t0 ))s" | tee -a $OUT/ab.log
