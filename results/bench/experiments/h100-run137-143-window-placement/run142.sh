set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
t0=$(date +%s)
python3 -c "from quant.kernels import cuda; cuda.load(128, min_blocks=3)" > /dev/null 2>&1
echo "build: $(( $(date +%s) - t0 ))s"
for m in full nofloor nobf16 nopack full; do timeout 120 python3 .cache/run142.py $m 2>&1 | grep -v Warning | tail -2 | tee -a $OUT/run142.log; done
echo "total: $(( $(date +%s) - t0 ))s"
