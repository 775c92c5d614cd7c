set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD MAX_JOBS=16 OSCAR_KERNEL_CACHE=/tmp/oscar-kernel-cache
t0=$(date +%s)
python3 -c "from quant.kernels import cuda; cuda.load(128, min_blocks=3)" > /dev/null 2>&1
echo "build: $(( $(date +%s) - t0 ))s"
python3 .cache/run141.py 2>&1 | tee $OUT/run141.log
echo "total: $(( $(date +%s) - t0 ))s"
