set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
t0=$(date +%s)
python3 -c "from quant.kernels import cuda; cuda.load(128, min_blocks=3)" > /dev/null 2>&1
echo "build: $(( $(date +%s) - t0 ))s"
for m in cli nocopy emptied env cli nocopy; do timeout 150 python3 .cache/run143.py $m 2>&1 | grep "^$m eager" | tee -a $OUT/run143.log; done
echo "total: $(( $(date +%s) - t0 ))s"
