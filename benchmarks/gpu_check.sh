#!/usr/bin/env bash
# The GPU checks of a session that has the lent machine, in one call (device time is short).
# Run from the repository root there; writes OUT/*.log. Prepare here first (both ignored
# through .git/info/exclude; shared/ travels, .whl is named in the call's carry):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d .whl grpcio==<.venv's> protobuf==<.venv's> tomli-w     # what the GPU image lacks
#   mkdir -p shared/data && cp -r ../shared/data/mnist shared/data/
#   bash benchmarks/gpu_check.sh [quick]                          # quick: no MNIST run
set -u
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
[ -e ../shared ] || ln -s "$PWD/shared" ../shared  # the tests read ../shared/data/mnist
export DBN_MNIST_DIR=$PWD/shared/data/mnist
mkdir -p /tmp/bin && PATH=/tmp/bin:$PATH  # dbn without installing the project (no registry there)
printf '#!/bin/sh\nexec python3 -c "import sys; from dbn.cli import main; sys.exit(main(sys.argv[1:]))" "$@"\n' > /tmp/bin/dbn
chmod +x /tmp/bin/dbn
step() { echo "=== $* ($(date +%T))"; }

nvidia-smi -L; python3 -c 'import cupy, numpy; print("cupy", cupy.__version__, "numpy", numpy.__version__)'

step tests
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graphs.py tests/test_gpu.py \
    tests/test_random_streams.py tests/test_rbm.py tests/test_network.py 2>&1 | tail -40 | tee "$OUT/tests.log"

step "bench rbm, batch 100"
timeout 60 dbn bench rbm --device gpu --seconds 3 2>&1 | tee "$OUT/bench100.log"
for graphs in 1 0; do
    step "bench rbm, batch 1000, DBN_CUDA_GRAPHS=$graphs"
    DBN_CUDA_GRAPHS=$graphs timeout 45 dbn bench rbm --device gpu --batch 1000 --seconds 3 --no-sklearn 2>&1 \
        | tee "$OUT/bench1000-graphs$graphs.log"
done
step "bench all"
timeout 60 dbn bench all --device gpu --mapping one-process --seconds 1.5 2>&1 | tee "$OUT/bench-all.log"

[ "${1:-}" = quick ] && exit 0
step "MNIST, 1 process on the GPU, 50 RBM epochs a layer"
timeout 260 dbn mnist --local 1 --device gpu --epochs 50 --no-ui --out /tmp/mnist-gpu 2>&1 | tail -25 | tee "$OUT/mnist.log"
cp /tmp/mnist-gpu/result.json "$OUT/mnist-result.json" 2>/dev/null
step done
