"""One worker's shards trained one by one against the same shards as one computation (issue 54).

A worker holding ``G`` shards of MNIST-sized rows runs an epoch of each phase both ways, on this
machine's device, rounds interleaved so that both see the same machine: CD-1 on a 784x500 RBM
(batch 100), and fine-tuning a 784-500-500-2000-10 network with dropout (batch 100). Prints the
seconds of each way (median of the rounds) and their ratio, and checks that both ended with the
same bits (on NumPy; within float32 tolerance on a GPU).

    .venv/bin/python benchmarks/grouped_shards.py [--shards 4] [--rows 1000] [--rounds 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from dbn.model import kernels
from dbn.model.backend import get_backend
from dbn.model.network import Network
from dbn.model.network_group import NetworkGroup
from dbn.model.rbm import RBM
from dbn.model.rbm_group import RBMGroup


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def same(a: np.ndarray, b: np.ndarray, device: str) -> bool:
    return bool(np.array_equal(a, b)) if device == "cpu" else bool(np.allclose(a, b, rtol=1e-3, atol=1e-4))


def pretraining(Xs, device: str, rounds: int) -> tuple[list, list, bool]:
    alone = [RBM(500, device=device, seed=g).initialize(X) for g, X in enumerate(Xs)]
    group = RBMGroup([RBM(500, device=device, seed=g).initialize(X) for g, X in enumerate(Xs)])
    data = [alone[0].backend.asarray(X) for X in Xs]
    one_by_one, together = [], []
    for epoch in range(rounds):
        def each():
            for rbm, X in zip(alone, data):
                rbm.train_epoch(X, epoch, checked=True)
            alone[0].backend.synchronize()

        def grouped():
            group.train_epoch(data, epoch)
            group.backend.synchronize()

        one_by_one.append(timed(each))
        together.append(timed(grouped))
    ok = all(same(a.get_state()["weights"], b.get_state()["weights"], device) for a, b in zip(group.members, alone))
    return one_by_one, together, ok


def finetuning(Xs, ys, device: str, rounds: int) -> tuple[list, list, bool]:
    rng = np.random.default_rng(1)
    sizes = (784, 500, 500, 2000, 10)
    weights = [rng.normal(0, 0.05, (a, b)).astype(np.float32) for a, b in zip(sizes, sizes[1:])]
    biases = [np.zeros(b, np.float32) for b in sizes[1:]]
    alone = [Network(weights, biases, get_backend(device)) for _ in Xs]
    shared = get_backend(device)
    group = NetworkGroup([Network(weights, biases, shared) for _ in Xs])
    data = [shared.asarray(X) for X in Xs]
    labels = [shared.asarray(y, dtype=np.int64) for y in ys]
    settings = dict(learning_rate=0.1, momentum=0.5, batch_size=100, dropout=[0.2, 0.5, 0.5, 0.5])
    one_by_one, together = [], []
    for epoch in range(rounds):
        def each():
            for g, (net, X, y) in enumerate(zip(alone, data, labels)):
                net.backend.reseed(100 + g)
                net.train_epoch(X, y, epoch, seed=g, **settings)
            shared.synchronize()

        def grouped():
            group.train_epoch(data, labels, epoch, seeds=list(range(len(Xs))),
                              streams=[get_backend(device, seed=100 + g) for g in range(len(Xs))], **settings)
            shared.synchronize()

        one_by_one.append(timed(each))
        together.append(timed(grouped))
    ok = all(same(a.get_state()["net.0.weights"], b.get_state()["net.0.weights"], device)
             for a, b in zip(group.members, alone))
    return one_by_one, together, ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rows", type=int, default=1000, help="rows a shard")
    ap.add_argument("--rounds", type=int, default=3, help="epochs timed each way (the first includes warm-up)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    kernels.load()  # the fused passes from the start (a process loads them after enough work otherwise)
    rng = np.random.default_rng(0)
    Xs = [(rng.random((args.rows, 784)) < 0.2).astype(np.float32) for _ in range(args.shards)]
    ys = [rng.integers(0, 10, args.rows) for _ in range(args.shards)]
    for name, (each, together, ok) in (("pre-training 784x500", pretraining(Xs, args.device, args.rounds)),
                                       ("fine-tuning 784-500-500-2000-10", finetuning(Xs, ys, args.device, args.rounds))):
        a, b = statistics.median(each[1:] or each), statistics.median(together[1:] or together)
        print(f"{name}, {args.shards} shards of {args.rows} rows, {args.device}: one by one {a:.3f} s, "
              f"as one computation {b:.3f} s, ratio {a / b:.2f}; same result: {ok}")


if __name__ == "__main__":
    main()
