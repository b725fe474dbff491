"""Paired A/B of a fine-tuning epoch (or, with ``--rbm 784x500``, a CD-1 epoch of that RBM)
between two source trees (e.g. a commit before a change and this one), one BLAS thread, alternating fresh processes: prints each side's samples per CPU
second and the median of the pairs' ratios (new / old). CPU time, not wall time, so that a
busy machine disturbs it less (its caches are still shared).

    git archive HEAD~1 dbn iterreduce | (mkdir -p /tmp/old && tar -x -C /tmp/old)
    python benchmarks/ab_finetune.py --old /tmp/old --new . --pairs 6
    python benchmarks/ab_finetune.py --old /tmp/old --new . --pairs 6 --rbm 500x2000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r'''
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from dbn.model.backend import get_backend
from dbn.model import kernels
from dbn.model.network import Network
kernels.load()  # the fused passes from the start (a process loads them after enough work otherwise)
rng = np.random.default_rng(0)
sizes = [784, 500, 500, 2000, 10]
weights = [(0.1 * rng.standard_normal((a, b))).astype(np.float32) for a, b in zip(sizes, sizes[1:])]
biases = [np.zeros(b, np.float32) for b in sizes[1:]]
rows = int(sys.argv[2])
X = rng.random((rows, 784), dtype=np.float32)
y = rng.integers(0, 10, rows)
net = Network(weights, biases, get_backend("cpu", seed=1))
kw = dict(learning_rate=0.1, momentum=0.9, dropout=(0.2, 0.5, 0.5, 0.5), seed=3)
net.train_epoch(X[:1000], y[:1000], 0, **kw)  # warm-up: numba kernels, allocations
start = time.process_time()
net.train_epoch(X, y, 1, **kw)
print(rows / (time.process_time() - start))
'''

CHILD_RBM = r'''
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from dbn.model import kernels
from dbn.model.rbm import RBM
kernels.load()  # the fused passes from the start (a process loads them after enough work otherwise)
n_visible, n_hidden = map(int, sys.argv[3].split("x"))
rows = int(sys.argv[2])
X = (np.random.default_rng(0).random((rows, n_visible)) < 0.3).astype(np.float32)
rbm = RBM(n_hidden=n_hidden, batch_size=100, seed=0, device="cpu").initialize(X)
rbm.train_epoch(X[:1000], 0)  # warm-up: numba kernels, allocations
start = time.process_time()
rbm.train_epoch(X, 1)
print(rows / (time.process_time() - start))
'''


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="source tree with dbn/ and iterreduce/ of the baseline")
    ap.add_argument("--new", default=".", help="source tree of the change (default: here)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--rows", type=int, default=5000)
    ap.add_argument("--rbm", metavar="NVxNH", help="time CD-1 of an RBM of this shape instead of fine-tuning")
    args = ap.parse_args(argv)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    rates: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(args.pairs):
        for side in ("old", "new"):
            child = [CHILD_RBM, os.path.abspath(getattr(args, side)), str(args.rows), args.rbm] if args.rbm \
                else [CHILD, os.path.abspath(getattr(args, side)), str(args.rows)]
            out = subprocess.run([sys.executable, "-c", *child],
                                 capture_output=True, text=True, env=env, check=True)
            rates[side].append(float(out.stdout.split()[-1]))
    ratios = [n / o for n, o in zip(rates["new"], rates["old"])]
    print(json.dumps({"old": [round(r) for r in rates["old"]], "new": [round(r) for r in rates["new"]],
                      "median_old": round(statistics.median(rates["old"])),
                      "median_new": round(statistics.median(rates["new"])),
                      "median_ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
