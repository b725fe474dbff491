"""``dbn bench rbm``: CD-1 training speed, next to this machine's GEMM rate and scikit-learn.

In one run it measures, in interleaved rounds (sgemm, ours, sklearn, sgemm, ours,
sklearn, ..., sgemm) so that a shared machine's load changes hit all three alike:

* ``sgemm_gflops``: a float32 ``n x n @ n x n`` product (n = 2048) with NumPy, or
  CuPy on the GPU (synchronised). Each measurement is the best of 3 timed
  products (after one untimed warm-up product); the reported figure is the
  median of the ``rounds + 1`` measurements.
* ``samples_per_s``: :class:`dbn.model.rbm.RBM` with CD-1 on random binary data
  (20,000 x n_visible, float32), running ``train_epoch`` over chunks of 20
  minibatches after a warm-up; at least ``seconds`` of timed training in all,
  split evenly over the rounds. Median of the rounds.
* ``sklearn_samples_per_s``: ``sklearn.neural_network.BernoulliRBM`` (CPU, same
  batch size, learning rate 0.1) ``fit`` with ``n_iter=1`` (one epoch) on slices of
  the same data (at least 20 minibatches each, sized to about a quarter of a
  round), repeated for the same time per round. Median of the rounds.

``gflops`` counts 10 * batch * n_visible * n_hidden floating point operations per
CD-1 minibatch (five products of that size: the data-driven hidden layer, the
reconstruction, its hidden layer, and the two halves of the gradient).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import time

import numpy as np

from ..model.backend import Backend
from ..model.rbm import RBM

CHUNK = 20  # minibatches per timed call of train_epoch


def flops_per_sample(n_visible: int, n_hidden: int) -> int:
    """Floating point operations of CD-1 per training sample (10 * n_visible * n_hidden)."""
    return 10 * n_visible * n_hidden


def sgemm_gflops(be: Backend, a, b, out, repeats: int = 3) -> float:
    """Best of ``repeats`` timed products ``a @ b`` (square float32), in GFLOP/s."""
    xp = be.xp
    n = a.shape[0]
    inner = 1 if be.device == "cpu" else 20  # a GPU product is too short to time alone
    xp.matmul(a, b, out=out)
    be.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            xp.matmul(a, b, out=out)
        be.synchronize()
        best = min(best, (time.perf_counter() - start) / inner)
    return 2 * n**3 / best / 1e9


def _time_ours(rbm: RBM, X, budget: float, state: dict) -> tuple[int, float]:
    """Train for at least ``budget`` seconds (at least one chunk); returns (samples, seconds)."""
    n_batches = X.shape[0] // rbm.batch_size
    samples, elapsed = 0, -1.0
    start = time.perf_counter()
    while elapsed < budget:
        first = state["batch"]
        chunk = range(first, min(first + CHUNK, n_batches))
        rbm.train_epoch(X, state["epoch"], chunk, checked=True)
        samples += len(chunk) * rbm.batch_size
        if chunk.stop >= n_batches:
            state["epoch"], state["batch"] = state["epoch"] + 1, 0
        else:
            state["batch"] = chunk.stop
        rbm.backend.synchronize()
        elapsed = time.perf_counter() - start
    return samples, elapsed


def _time_sklearn(model, X, budget: float, rows: int) -> tuple[int, float]:
    """``fit`` (one epoch, n_iter=1) on successive slices of ``rows`` rows for at least ``budget`` s."""
    samples, elapsed, first = 0, -1.0, 0
    start = time.perf_counter()
    while elapsed < budget:
        if first + rows > X.shape[0]:
            first = 0
        model.fit(X[first:first + rows])
        samples += rows
        first += rows
        elapsed = time.perf_counter() - start
    return samples, elapsed


def _import_sklearn_rbm():
    try:
        from sklearn.neural_network import BernoulliRBM
    except ImportError:
        return None
    return BernoulliRBM


def sklearn_available() -> bool:
    return _import_sklearn_rbm() is not None


def blas_info() -> tuple[str | None, int | None]:
    """("openblas 0.3.27 (SkylakeX, pthreads)", threads) from threadpoolctl, else numpy's build config."""
    try:
        import threadpoolctl

        for lib in threadpoolctl.threadpool_info():
            if lib.get("user_api") == "blas" and "numpy" in (lib.get("filepath") or "") + (lib.get("prefix") or ""):
                break
        else:
            lib = next((lib for lib in threadpoolctl.threadpool_info() if lib.get("user_api") == "blas"), None)
        if lib:
            extra = ", ".join(str(lib[k]) for k in ("architecture", "threading_layer") if lib.get(k))
            return f"{lib.get('internal_api')} {lib.get('version')}" + (f" ({extra})" if extra else ""), lib.get("num_threads")
    except Exception:
        pass
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}", None
    except Exception:
        return None, None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def bench_rbm(
    device: str = "cpu",
    batch: int = 100,
    n_visible: int = 784,
    n_hidden: int = 500,
    seconds: float = 10.0,
    sklearn: bool | None = None,
    rounds: int = 3,
    n_samples: int = 20000,
    sgemm_size: int = 2048,
    seed: int = 0,
) -> dict:
    """Run the benchmark and return its figures (see the module docstring).

    ``sklearn``: True to require scikit-learn, False to skip it, None to measure it
    when it is installed.
    """
    if batch < 1 or n_visible < 1 or n_hidden < 1 or rounds < 1 or seconds <= 0:
        raise ValueError("batch, visible, hidden and rounds must be >= 1 and seconds > 0")
    BernoulliRBM = _import_sklearn_rbm() if sklearn is not False else None
    if sklearn and BernoulliRBM is None:
        raise ImportError("scikit-learn is not installed: pip install 'dbn-yarn[bench]' (or --no-sklearn)")
    load_before = _load()
    n_samples = max(n_samples, batch)

    rng = np.random.default_rng(seed)
    X_host = (rng.random((n_samples, n_visible), dtype=np.float32) < 0.5).astype(np.float32)
    rbm = RBM(n_hidden, device=device, batch_size=batch, cd_k=1, seed=seed)
    be = rbm.backend
    X = be.asarray(X_host)
    rbm.initialize(X)
    a = be.normal((sgemm_size, sgemm_size))
    b = be.normal((sgemm_size, sgemm_size))
    c = be.empty((sgemm_size, sgemm_size))

    sk_model = None
    if BernoulliRBM is not None:
        sk_model = BernoulliRBM(n_components=n_hidden, batch_size=batch, n_iter=1, learning_rate=0.1, random_state=seed)
        # Warm-up, and a first rate to size the slices that each fit call trains on: about a
        # quarter of a round, at least 20 minibatches (so that fit's set-up costs stay small).
        warm = min(n_samples // batch, 20) * batch
        t = time.perf_counter()
        sk_model.fit(X_host[:warm])
        sk_rate = warm / (time.perf_counter() - t)
        sk_rows = min(max(int(sk_rate * seconds / rounds / 4) // batch, 20) * batch, n_samples // batch * batch)
    state = {"epoch": 0, "batch": 0}
    _time_ours(rbm, X, 0.0, state)  # warm-up: buffers, first products

    budget = seconds / rounds
    sgemm, ours, theirs = [], [], []
    for _ in range(rounds):
        sgemm.append(sgemm_gflops(be, a, b, c))
        samples, elapsed = _time_ours(rbm, X, budget, state)
        ours.append(samples / elapsed)
        if sk_model is not None:
            samples, elapsed = _time_sklearn(sk_model, X_host, budget, sk_rows)
            theirs.append(samples / elapsed)
    sgemm.append(sgemm_gflops(be, a, b, c))

    samples_per_s = statistics.median(ours)
    gflops = samples_per_s * flops_per_sample(n_visible, n_hidden) / 1e9
    sgemm_median = statistics.median(sgemm)
    sk_rate = statistics.median(theirs) if theirs else None
    blas, blas_threads = blas_info()
    result = {
        "samples_per_s": samples_per_s,
        "gflops": gflops,
        "sgemm_gflops": sgemm_median,
        "ratio_to_sgemm": gflops / sgemm_median,
        "sklearn_samples_per_s": sk_rate,
        "ratio_to_sklearn": samples_per_s / sk_rate if sk_rate else None,
        "device": be.device,
        "batch": batch,
        "n_visible": n_visible,
        "n_hidden": n_hidden,
        "cd_k": 1,
        "n_samples": n_samples,
        "flops_per_sample": flops_per_sample(n_visible, n_hidden),
        "seconds": seconds,
        "rounds": rounds,
        "samples_per_s_rounds": ours,
        "sgemm_gflops_rounds": sgemm,
        "sklearn_samples_per_s_rounds": theirs or None,
        "sgemm_size": sgemm_size,
        "sgemm_method": "median over rounds+1 measurements, each the best of 3 products",
        "numpy_version": np.__version__,
        "blas": blas,
        "blas_threads": blas_threads,
        "sklearn_version": _sklearn_version() if sk_model is not None else None,
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": [load_before, _load()],
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if be.device == "gpu":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        result["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        result["cupy_version"] = cupy.__version__
    return result


def _sklearn_version() -> str | None:
    try:
        import sklearn

        return sklearn.__version__
    except ImportError:
        return None


def _rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def format_table(r: dict) -> str:
    """A short human-readable report of :func:`bench_rbm`'s result."""
    device = r["device"] + (f" ({r['gpu']})" if r.get("gpu") else f" ({r['cpu']}, {r['cpu_count']} cores)")
    lines = [
        f"RBM CD-1  {r['n_visible']} x {r['n_hidden']}  batch {r['batch']}  on {device}",
        f"numpy {r['numpy_version']}  BLAS {r['blas']}  threads {r['blas_threads']}  load {r['load_average_1min']}",
        "",
        f"{'':32}{'median':>10}   rounds",
        f"{'sgemm ' + str(r['sgemm_size']) + '^3  GFLOP/s':32}{r['sgemm_gflops']:>10.1f}   "
        + " ".join(f"{x:.1f}" for x in r["sgemm_gflops_rounds"]),
        f"{'dbn RBM  samples/s':32}{_rate(r['samples_per_s']):>10}   "
        + " ".join(_rate(x) for x in r["samples_per_s_rounds"]),
        f"{'dbn RBM  GFLOP/s':32}{r['gflops']:>10.1f}   = {r['ratio_to_sgemm']:.2f} x sgemm",
    ]
    if r["sklearn_samples_per_s"] is not None:
        lines += [
            f"{'sklearn BernoulliRBM  samples/s':32}{_rate(r['sklearn_samples_per_s']):>10}   "
            + " ".join(_rate(x) for x in r["sklearn_samples_per_s_rounds"]),
            f"{'dbn / sklearn':32}{r['ratio_to_sklearn']:>9.1f}x",
        ]
    else:
        lines.append(f"{'sklearn BernoulliRBM':32}{'skipped':>10}")
    return "\n".join(lines)
