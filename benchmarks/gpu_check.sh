#!/usr/bin/env bash
# The GPU checks of a session that has the lent machine, in one call (device time is short).
# Run from the repository root there; writes OUT/*.log. Prepare here first (both ignored
# through .git/info/exclude; shared/ travels, .whl is named in the call's carry):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d .whl grpcio==<.venv's> protobuf==<.venv's> tomli-w     # what the GPU image lacks
#   mkdir -p shared/data && cp -r ../shared/data/mnist shared/data/
#   bash benchmarks/gpu_check.sh [PART...]   # parts: tests bench mnist scaling; default: tests bench mnist
#   (scaling: the local mini-cluster on 1 and 8 CPU workers, with each run's log.jsonl kept)
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

PARTS=" ${*:-tests bench mnist} "
want() { [[ $PARTS == *" $1 "* ]]; }

if want tests; then
step tests
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_graphs.py tests/test_gpu.py \
    tests/test_random_streams.py tests/test_rbm.py tests/test_network.py 2>&1 | tail -40 | tee "$OUT/tests.log"
fi

if want bench; then
step "bench rbm, batch 100"
timeout 60 dbn bench rbm --device gpu --seconds 3 2>&1 | tee "$OUT/bench100.log"
for graphs in 1 0; do
    step "bench rbm, batch 1000, DBN_CUDA_GRAPHS=$graphs"
    DBN_CUDA_GRAPHS=$graphs timeout 45 dbn bench rbm --device gpu --batch 1000 --seconds 3 --no-sklearn 2>&1 \
        | tee "$OUT/bench1000-graphs$graphs.log"
done
step "bench all"
timeout 60 dbn bench all --device gpu --mapping one-process --seconds 1.5 2>&1 | tee "$OUT/bench-all.log"
fi

if want mnist; then
step "MNIST, 1 process on the GPU, 50 RBM epochs a layer"
timeout 260 dbn mnist --local 1 --device gpu --epochs 50 --no-ui --out /tmp/mnist-gpu 2>&1 | tail -25 | tee "$OUT/mnist.log"
cp /tmp/mnist-gpu/result.json "$OUT/mnist-result.json" 2>/dev/null
fi

if want scaling; then
step "CPU scaling, ${SCALING_WORKERS:=1,8} workers"
lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA)" > "$OUT/lscpu.txt"
rm -rf /tmp/scaling
export ITERREDUCE_LOG_LEVEL=DEBUG  # the master's log gets each step's compute seconds by worker
timeout 200 python3 benchmarks/cpu_scaling.py --workers "$SCALING_WORKERS" --epochs 3 --finetune-epochs 3 \
    --out /tmp/scaling 2>&1 | tee "$OUT/scaling${SCALING_TAG:-}.log"
for run in /tmp/scaling/w*; do
    keep="$OUT/scaling${SCALING_TAG:-}/${run##*/}"
    mkdir -p "$keep" && cp "$run"/log.jsonl "$run"/result.json "$run"/logs/master.log "$keep/"
done
fi
step done
