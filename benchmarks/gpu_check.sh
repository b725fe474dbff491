#!/usr/bin/env bash
# The GPU checks of a session that has the lent machine, in one call (device time is short).
# Run from the repository root there; writes OUT/*.log. Prepare here first (both ignored
# through .git/info/exclude; shared/ travels, .whl is named in the call's carry):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d .whl grpcio==<.venv's> protobuf==<.venv's> tomli-w     # what the GPU image lacks
#   mkdir -p shared/data && cp -r ../shared/data/mnist shared/data/
#   bash benchmarks/gpu_check.sh [PART...]   # parts: tests bench profile mnist combine accuracy transfers scaling;
#                                            # default: tests bench mnist
#   (scaling: the local mini-cluster on $SCALING_WORKERS CPU workers (1,8), $SCALING_EPOCHS epochs (3) a
#   phase, $SCALING_ARGS added to cpu_scaling.py's; each run's logs kept in OUT/scaling$SCALING_TAG.tgz)
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
    tests/test_random_streams.py tests/test_rbm.py tests/test_network.py tests/test_rbm_group.py tests/test_combine.py 2>&1 | tail -40 | tee "$OUT/tests.log"
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

if want profile; then
step "where a step's time goes (benchmarks/gpu_profile.py), and TF32 products"
timeout 120 python3 benchmarks/gpu_profile.py --batch 100 2>&1 | tee "$OUT/profile.log"
CUPY_TF32=1 timeout 60 dbn bench all --device gpu --mapping one-process --seconds 1.5 2>&1 | tee "$OUT/bench-all-tf32.log"
fi

if want mnist; then
step "MNIST, 1 process on the GPU, 50 RBM epochs a layer"
# At debug level the logs say each step's reduce, checkpoint and push seconds (kept in one tar).
ITERREDUCE_LOG_LEVEL=DEBUG timeout 260 dbn mnist --local 1 --device gpu --epochs 50 --no-ui --out /tmp/mnist-gpu 2>&1 \
    | tail -25 | tee "$OUT/mnist.log"
cp /tmp/mnist-gpu/result.json "$OUT/mnist-result.json" 2>/dev/null
tar -czf "$OUT/mnist-logs.tgz" -C /tmp/mnist-gpu log.jsonl logs 2>/dev/null
fi

if want combine; then
# The main job (10 workers, one process on the one GPU) with one update a process (the default on a
# GPU) and with one a shard: the training seconds, the sync share and the updates a step.
for combine in true false; do
    step "MNIST, 10 workers on the GPU, cluster.combine=$combine"
    timeout 280 dbn mnist --device gpu --no-ui --out "/tmp/mnist-gpu10-$combine" --set "cluster.combine=$combine" 2>&1 \
        | tail -12 | tee "$OUT/mnist10-combine-$combine.log"
    cp "/tmp/mnist-gpu10-$combine/result.json" "$OUT/mnist10-combine-$combine.json" 2>/dev/null
done
fi

if want accuracy; then
# Seeds $ACCURACY_SEEDS (0 1 2) of one recipe at once (the GPU waits on launches: runs overlap),
# 5,000 validation images held out; $ACCURACY_ARGS are dbn mnist's flags for the recipe (they
# win: "--validation 0" trains on all 60,000, "--local 10" on ten workers).
step "accuracy: seeds ${ACCURACY_SEEDS:=0 1 2}, ${ACCURACY_ARGS:=}"
ACC=/tmp/accuracy${ACCURACY_TAG:-}  # one folder a tag: two recipes may run at once
rm -rf "$ACC"  # runs of this call only (a folder of an earlier recipe's run is refused)
for seed in $ACCURACY_SEEDS; do
    timeout "${ACCURACY_TIMEOUT:-400}" dbn mnist --local 1 --device "${ACCURACY_DEVICE:-gpu}" --validation 5000 --no-ui --quiet --json \
        --seed "$seed" $ACCURACY_ARGS --out "$ACC/s$seed" > "$ACC-s$seed.json" 2>&1 &
done
wait
for seed in $ACCURACY_SEEDS; do
    python3 - "$ACC/s$seed" "$seed" <<'PY' 2>&1 | tee -a "$OUT/accuracy${ACCURACY_TAG:-}.log"
import json, sys
out, seed = sys.argv[1:]
valid = [r["valid_error"] for r in map(json.loads, open(out + "/log.jsonl")) if "valid_error" in r]
r = json.load(open(out + "/result.json"))
held_out = (f", last validation {100 * valid[-1]:.2f} %, best validation {100 * min(valid):.2f} %"
            if valid else ", no validation split")  # --validation 0: trained on all 60,000
print(f"seed {seed}: test {100 * r['test_error']:.2f} %{held_out}, training {r['train_wall_seconds']:.1f} s, "
      f"sync {r['sync_fraction']}, workers {r['workers']}")
PY
    tail -3 "$ACC-s$seed.json" >> "$OUT/accuracy${ACCURACY_TAG:-}.log"
done
tar -czf "$OUT/accuracy${ACCURACY_TAG:-}.tgz" -C "$ACC" . 2>/dev/null
fi

if want transfers; then
step "host <-> GPU copies of the main job's parameters"
timeout 60 python3 benchmarks/gpu_transfers.py 2>&1 | tee "$OUT/transfers.log"
fi

if want scaling; then
step "CPU scaling, ${SCALING_WORKERS:=1,8} workers"
lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA)" > "$OUT/lscpu.txt"
rm -rf /tmp/scaling /tmp/scaling-kept
export ITERREDUCE_LOG_LEVEL=DEBUG  # the master's log gets each step's compute seconds by worker
timeout 300 python3 benchmarks/cpu_scaling.py --workers "$SCALING_WORKERS" --epochs "${SCALING_EPOCHS:=3}" \
    --finetune-epochs "$SCALING_EPOCHS" ${SCALING_ARGS:-} \
    --out /tmp/scaling 2>&1 | tee "$OUT/scaling${SCALING_TAG:-}.log"
for run in /tmp/scaling/w*; do  # each run's logs, in one tar (the device returns few files)
    mkdir -p "/tmp/scaling-kept/${run##*/}" && cp "$run"/log.jsonl "$run"/result.json "$run"/logs/master.log "/tmp/scaling-kept/${run##*/}/"
done
tar -czf "$OUT/scaling${SCALING_TAG:-}.tgz" -C /tmp/scaling-kept .
fi
step done
