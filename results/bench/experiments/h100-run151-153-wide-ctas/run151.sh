#!/usr/bin/env bash
# Run 151: plans of one CTA per SM with deeper cp.async pipelines (OSCAR_STAGES 6, 8 against the default 4) at the
# batch-1 points whose tail dominates (the thinker's 1 x 128K: 64 splits, two merge levels; Qwen3 and LLaVA 1 x 128K),
# two interleaved passes; a trace of the thinker's 1 x 128K after the read-only flush.
set -u
export PYTHONUNBUFFERED=1 MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
t0=$(date +%s)
S6="-DOSCAR_STAGES=6"; S8="-DOSCAR_STAGES=8"
build() { OSCAR_KERNEL_FLAGS="$1" python3 -c "from quant.kernels import cuda; cuda.load(128, min_blocks=3)" > $OUT/build-$2.log 2>&1 || tail -20 $OUT/build-$2.log; }
build "" base & build "$S6" s6 & build "$S8" s8 &
wait
echo "builds: $(( $(date +%s) - t0 ))s" | tee -a $OUT/ab.log
sw() {  # flags label shape points [extra...]
  local f="$1" l="$2" s="$3" pts="$4"; shift 4
  OSCAR_KERNEL_FLAGS="$f" timeout 100 python3 -m quant.kernels.sweep_splits --shape $s --points $pts "$@" 2>&1 | grep -v Warning | sed "s/^/$l /" | tee -a $OUT/ab.log
}
sw "" base-flushtrace qwen3-omni-thinker 1x131072 --splits= --trace --trace-flush
for pass in 1 2; do
  fl="base s6 s8"; [ $pass = 2 ] && fl="s8 base"
  for f in $fl; do
    case $f in base) F="";; s6) F="$S6";; s8) F="$S8";; esac
    sw "$F" $f$pass qwen3-omni-thinker 1x131072 --splits 32 --merge-groups plan,8
    sw "$F" $f$pass qwen3-omni-thinker 1x131072 --splits 33 --window folded
    sw "$F" $f$pass qwen3-omni-thinker 1x32768 --splits=
    sw "$F" $f$pass qwen3-8b 1x131072 --splits 15
    sw "$F" $f$pass qwen3-8b 1x131072 --splits 16 --window folded
    sw "$F" $f$pass llava-7b 1x131072 --splits 4 --window folded
    echo "pass $pass $f: $(( $(date +%s) - t0 ))s" | tee -a $OUT/ab.log
  done
done
echo "total: $(( $(date +%s) - t0 ))s" | tee -a $OUT/ab.log
