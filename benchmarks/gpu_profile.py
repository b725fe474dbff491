"""Where a GPU training step's time goes (issue 42, part 1): run on the lent GPU machine.

    python benchmarks/gpu_profile.py [--batch 100]

For CD-1 784x500 and fine-tuning 784-500-500-2000-10 at one batch size it prints, per
step, in microseconds:

- ``epoch``: a whole ``train_epoch`` divided by its steps (what ``dbn bench`` measures);
- ``graph``: the captured step's graph replayed alone (device time, and the host's time
  to launch it): what is left once the minibatch copies around it are gone;
- ``graph x10``: ten steps captured into one graph (what fewer launches would give);

and the floors the chip sets at this size: one tiny elementwise kernel inside a graph, and
each product of the step alone. Figures: medians of 5 rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback

import cupy as cp
import numpy as np

from dbn.model.backend import Backend
from dbn.model.graphs import _capture
from dbn.model.network import Network
from dbn.model.rbm import RBM

SIZES = (784, 500, 500, 2000, 10)


def timed(fn, n: int) -> tuple[float, float]:
    """(device µs, host µs) per call of ``fn``, median of 5 rounds of ``n`` calls."""
    device, host = [], []
    for _ in range(5):
        cp.cuda.Device().synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        start.record()
        for _ in range(n):
            fn()
        host.append((time.perf_counter() - t0) / n * 1e6)
        end.record()
        end.synchronize()
        device.append(cp.cuda.get_elapsed_time(start, end) / n * 1e3)
    return statistics.median(device), statistics.median(host)


def graphs_in(step_graphs) -> list:
    return [g for g in step_graphs._graphs.values() if hasattr(g, "launch")]


def show(name: str, figures: tuple[float, float], batch: int) -> None:
    device, host = figures
    print(f"  {name:<34} {device:9.1f} us device {host:9.1f} us host  {batch / device * 1e6 / 1e3:9.0f}k samples/s")


def profile_rbm(batch: int) -> None:
    print(f"CD-1 784x500, batch {batch}")
    X = cp.asarray((np.random.default_rng(0).random((20000, 784)) < 0.5).astype(np.float32))
    rbm = RBM(500, device="gpu", batch_size=batch, cd_k=1, seed=0)
    rbm.initialize(X)
    n_batches = X.shape[0] // batch
    for epoch in range(2):  # eager, capture, replays
        rbm.train_epoch(X, epoch, range(n_batches), checked=True)
    t = time.perf_counter()
    for epoch in range(2, 5):
        rbm.train_epoch(X, epoch, range(n_batches), checked=True)
    cp.cuda.Device().synchronize()
    per_step = (time.perf_counter() - t) / (3 * n_batches) * 1e6
    print(f"  {'epoch (train_epoch / steps)':<34} {per_step:9.1f} us wall  {batch / per_step * 1e6 / 1e3:32.0f}k samples/s")
    graph = graphs_in(rbm._buffers[batch]["graphs"])[0]
    show("graph", timed(graph.launch, 500), batch)
    rbm.backend.graphs = False
    raw = rbm._step(batch, 0.9)
    show("eager step", timed(raw, 200), batch)
    ten = _capture(lambda: [raw() for _ in range(10)])
    d, h = timed(ten.launch, 100)
    show("graph x10 (per step)", (d / 10, h / 10), batch)
    rbm.backend.graphs = True


def profile_finetune(batch: int) -> None:
    print(f"fine-tuning {'-'.join(map(str, SIZES))}, dropout, batch {batch}")
    be = Backend("gpu", seed=0)
    rng = np.random.default_rng(0)
    weights = [0.05 * rng.standard_normal((a, b), dtype=np.float32) for a, b in zip(SIZES, SIZES[1:])]
    net = Network(weights, [np.zeros(b, np.float32) for b in SIZES[1:]], be)
    X = be.asarray((rng.random((20000, 784)) < 0.5).astype(np.float32))
    y = be.asarray(rng.integers(0, 10, 20000), dtype=np.int64)
    n_batches = X.shape[0] // batch
    kw = dict(learning_rate=0.01, momentum=0.9, weight_cost=1e-5, batch_size=batch, dropout=(0.2, 0.5, 0.5, 0.5))
    for epoch in range(2):
        net.train_epoch(X, y, epoch, **kw)
    t = time.perf_counter()
    for epoch in range(2, 4):
        net.train_epoch(X, y, epoch, **kw)
    cp.cuda.Device().synchronize()
    per_step = (time.perf_counter() - t) / (2 * n_batches) * 1e6
    print(f"  {'epoch (train_epoch / steps)':<34} {per_step:9.1f} us wall  {batch / per_step * 1e6 / 1e3:32.0f}k samples/s")
    graph = graphs_in(net._graphs)[0]
    show("graph", timed(graph.launch, 300), batch)


def floors(batch: int) -> None:
    print(f"floors at batch {batch}")
    be = Backend("gpu", seed=0)
    a = cp.ones((batch, 500), cp.float32)

    def tiny():
        for _ in range(50):
            a.__iadd__(1.0)

    g = _capture(tiny)
    d, h = timed(g.launch, 100)
    print(f"  one tiny elementwise kernel in a graph: {d / 50:.2f} us")
    for m, k, n in ((batch, 784, 500), (batch, 500, 784), (784, 2 * batch, 500), (batch, 500, 2000),
                    (batch, 2000, 500), (500, batch, 2000)):
        x, w, out = cp.ones((m, k), cp.float32), cp.ones((k, n), cp.float32), cp.empty((m, n), cp.float32)

        def products():
            for _ in range(20):
                be.matmul(x, w, out=out)

        g = _capture(products)
        d, _ = timed(g.launch, 50)
        print(f"  product {m}x{k} @ {k}x{n}: {d / 20:.2f} us ({2 * m * k * n / (d / 20) / 1e6:.1f} TFLOP/s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--floors", action="store_true", help="only the floors")
    args = ap.parse_args(argv)
    print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "cupy", cp.__version__)
    parts = (floors,) if args.floors else (profile_rbm, profile_finetune, floors)
    for part in parts:
        try:
            part(args.batch)
        except Exception:  # one part failing still leaves the others' figures
            traceback.print_exc()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
