"""A FLOP limit's two halves: the arithmetic of training, and this machine's GEMM rate.

A job's FLOP limit is the time its floating point operations take at the machine's
large-matrix sgemm rate; ``dbn bench`` and every run's ``result.json`` report how
close training comes to it. Counts are of the products only (elementwise work is
small beside them): a product of an (m x k) and a (k x n) matrix is 2mkn flops.
"""

from __future__ import annotations

import time

from .backend import Backend


def cd_per_sample(n_visible: int, n_hidden: int, cd_k: int = 1, persistent: bool = False) -> int:
    """CD-k per training sample: the hidden layer, k (visible, hidden) Gibbs steps and the
    gradient of both phases, each ``2 * n_visible * n_hidden``; 10 of them for CD-1. Persistent
    CD adds the reconstruction of the data."""
    return 2 * n_visible * n_hidden * (1 + 2 * cd_k + 2 + (1 if persistent else 0))


def backprop_per_sample(sizes, lowest: int = 0) -> int:
    """One backprop step of the network with layer sizes ``sizes``, training layers ``lowest``
    and up: 2 flops a weight forward, 2 for each trained layer's weight gradients and 2 for
    the deltas sent below each trained layer but the lowest."""
    weights = [a * b for a, b in zip(sizes, sizes[1:])]
    trained = weights[lowest:]
    return 2 * sum(weights) + 2 * sum(trained) + 2 * sum(trained[1:])


def job_flops(records, sizes, *, cd_k: int = 1, persistent: bool = False, top_layer_epochs: int = 0) -> float:
    """The flops of the training a run log's progress records describe: its pre-training and
    fine-tuning steps (or epochs) by their sample counts, and the cluster's transform steps
    (each layer's input computed from the layer below). ``sizes``: input, hidden and output widths."""
    total = 0.0
    for r in records:
        samples, phase = r.get("samples") or 0, r.get("phase")
        if phase == "pretrain":
            total += samples * cd_per_sample(sizes[r["layer"]], sizes[r["layer"] + 1], cd_k, persistent)
        elif phase == "transform" and r.get("layer", 0) > 0:
            total += samples * 2 * sizes[r["layer"] - 1] * sizes[r["layer"]]
        elif phase == "finetune":
            top_only = r.get("top_only", r.get("epoch", 0) < top_layer_epochs)
            total += samples * backprop_per_sample(sizes, len(sizes) - 2 if top_only else 0)
    return total


def sgemm_gflops(backend=None, size: int = 2048, repeats: int = 3, arrays=None) -> float:
    """This machine's sgemm rate: the best of ``repeats`` float32 ``size``-cubed products
    (after one untimed), with all BLAS threads, on ``backend``'s device (NumPy by default)."""
    if backend is None:
        backend = Backend("cpu", seed=0)
    xp = backend.xp
    a, b, out = arrays or (backend.normal((size, size)) for _ in range(3))
    n = a.shape[0]
    inner = 1 if backend.device == "cpu" else 20  # a GPU product is too short to time alone
    xp.matmul(a, b, out=out)
    backend.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            xp.matmul(a, b, out=out)
        backend.synchronize()
        best = min(best, (time.perf_counter() - start) / inner)
    return 2 * n**3 / best / 1e9

