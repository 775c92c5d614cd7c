set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
t0=$(date +%s)
python3 -c "from quant.kernels import cuda; cuda.load(128, min_blocks=3)" > $OUT/build.log 2>&1 || tail -30 $OUT/build.log
echo "build: $(( $(date +%s) - t0 ))s"
python3 -c "from quant.kernels import cuda; cuda.load(64, min_blocks=3)" >> $OUT/build.log 2>&1 &
timeout 300 python3 .cache/run144.py $OUT/run144.json 2>&1 | tee $OUT/run144.log
echo "sweep: $(( $(date +%s) - t0 ))s"
wait
timeout 200 python3 -m pytest -q -x tests/test_csrc.py -k "cluster or oracle or one_cta or orders" 2>&1 | tail -25 | tee $OUT/tests.log
echo "total: $(( $(date +%s) - t0 ))s"
