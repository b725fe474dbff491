"""``dbn bench``: training speed beside this machine's GEMM rate, its FLOP limit.

Every figure comes from one run, in interleaved rounds (sgemm, each contender, sgemm,
each contender, ..., sgemm), so that a shared machine's load changes hit all alike.
Each figure is the median over the rounds.

* ``sgemm_gflops``: a float32 ``n x n @ n x n`` product (n = 2048) with all BLAS threads,
  with NumPy (or CuPy on the GPU, synchronised); each measurement is the best of 3
  products after a warm-up product.
* Contenders, on random data, at one batch size (100 by default):

  - ``rbm VxH``: :class:`dbn.model.rbm.RBM` with CD-1; 10 * V * H flops a sample (five
    products of that size: the hidden layer, the reconstruction, its hidden layer and
    the two halves of the gradient).
  - ``finetune``: :class:`dbn.model.network.Network` trained with dropout (0.2 on the
    input, 0.5 on hidden units) and momentum on the whole 784-500-500-2000-10 stack;
    per sample 2 flops a weight forward, 2 for the weight gradients and 2 for the
    deltas of every layer but the first.
  - ``sklearn VxH``: scikit-learn's ``BernoulliRBM.fit`` (one epoch per call, learning
    rate 0.1), when scikit-learn is installed.

* Mappings: ``per-core`` runs one single-threaded model per core, each in its own
  process, all at once, and adds their samples: how the local mini-cluster runs its
  workers. ``one-process`` trains one model with all BLAS threads: ``dbn train``
  without ``--local``. On the GPU only ``one-process`` applies.
"""

from __future__ import annotations

import datetime as _dt
import multiprocessing
import os
import platform
import statistics
import time

import numpy as np

from iterreduce import THREAD_VARS
from iterreduce.process import stopping

from ..errors import BackendError
from ..model import flops, kernels
from ..model.backend import Backend
from ..model.network import Network
from ..model.rbm import RBM

SHAPES = ((784, 500), (500, 500), (500, 2000))  # the main job's three RBMs
STACK = (784, 500, 500, 2000, 10)  # the main job's network
FINETUNE_DROPOUT = (0.2, 0.5, 0.5, 0.5)
MAPPINGS = ("per-core", "one-process")
CHUNK = 20  # minibatches per timed call of train_epoch


def contender(kind: str, **spec) -> dict:
    """A contender's description (what :class:`_Trainer` builds), with its name and flops."""
    spec = {"kind": kind, "batch": 100, "seed": 0, **spec}
    if kind == "finetune":
        spec.setdefault("sizes", STACK)
        spec["flops_per_sample"] = flops.backprop_per_sample(spec["sizes"])
        spec["name"] = "finetune " + "-".join(map(str, spec["sizes"]))
    else:
        spec["flops_per_sample"] = flops.cd_per_sample(spec["n_visible"], spec["n_hidden"])
        spec["name"] = f"{'sklearn' if kind == 'sklearn' else 'rbm'} {spec['n_visible']}x{spec['n_hidden']}"
    return spec


def _random_data(spec, n_samples: int = 20000):
    rng = np.random.default_rng(spec["seed"])
    n = max(n_samples, spec["batch"])
    width = spec["sizes"][0] if spec["kind"] == "finetune" else spec["n_visible"]
    return (rng.random((n, width), dtype=np.float32) < 0.5).astype(np.float32), rng.integers(0, 10, n)


class _Trainer:
    """Trains one contender on the device for a time budget: ``run(seconds)`` returns (samples, seconds)."""

    def __init__(self, spec: dict, device: str = "cpu"):
        self.spec, self.batch = spec, spec["batch"]
        X, y = _random_data(spec)
        self.n_batches = X.shape[0] // self.batch
        self.epoch, self.next = 0, 0
        if spec["kind"] == "sklearn":
            from sklearn.neural_network import BernoulliRBM

            self.model = BernoulliRBM(n_components=spec["n_hidden"], batch_size=self.batch, n_iter=1,
                                      learning_rate=0.1, random_state=spec["seed"])
            self.X = X
            self.rows = 20 * self.batch  # one fit call: 20 minibatches, so that its set-up costs stay small
        elif spec["kind"] == "rbm":
            self.model = RBM(spec["n_hidden"], device=device, batch_size=self.batch, cd_k=1, seed=spec["seed"])
            self.X = self.model.backend.asarray(X)
            self.model.initialize(self.X)
        else:
            be = Backend(device, seed=spec["seed"])
            rng = np.random.default_rng(spec["seed"])
            sizes = spec["sizes"]
            weights = [0.05 * rng.standard_normal((a, b), dtype=np.float32) for a, b in zip(sizes, sizes[1:])]
            self.model = Network(weights, [np.zeros(b, np.float32) for b in sizes[1:]], be)
            self.X, self.y = be.asarray(X), be.asarray(y, dtype=np.int64)
        self.backend = getattr(self.model, "backend", None)
        kernels.load()  # a training job's speed: the fused passes a long job loads within its first epoch
        self.run(0.0)  # warm-up: buffers, compiled kernels, first products

    def _chunk(self) -> int:
        if self.spec["kind"] == "sklearn":
            first = self.next * self.batch
            if first + self.rows > self.X.shape[0]:
                first, self.next = 0, 0
            self.model.fit(self.X[first:first + self.rows])
            self.next += self.rows // self.batch
            return self.rows
        chunk = range(self.next, min(self.next + CHUNK, self.n_batches))
        if self.spec["kind"] == "rbm":
            self.model.train_epoch(self.X, self.epoch, chunk, checked=True)
        else:
            self.model.train_epoch(self.X, self.y, self.epoch, learning_rate=0.01, momentum=0.9, weight_cost=1e-5,
                                   batch_size=self.batch, dropout=FINETUNE_DROPOUT, batches=chunk)
        self.epoch, self.next = (self.epoch + 1, 0) if chunk.stop >= self.n_batches else (self.epoch, chunk.stop)
        return len(chunk) * self.batch

    def run(self, budget: float) -> tuple[int, float]:
        """Train for at least ``budget`` seconds (at least one chunk of minibatches)."""
        samples, elapsed = 0, -1.0
        start = time.perf_counter()
        while elapsed < budget:
            samples += self._chunk()
            if self.backend is not None:
                self.backend.synchronize()
            elapsed = time.perf_counter() - start
        return samples, elapsed


def _child(conn, spec):
    """A per-core process: build the trainer (warmed up), then run the budgets it is sent, until
    its parent says stop or is gone. A terminal's Ctrl-C reaches it with its parent: it ends
    quietly on SIGINT and SIGTERM (:mod:`iterreduce.process.stopping`)."""
    stopping.run(lambda: _serve(conn, spec))


def _serve(conn, spec) -> int:
    trainer = _Trainer(spec)
    conn.send("ready")
    try:
        while (budget := conn.recv()) is not None:
            conn.send(trainer.run(budget))
    except (EOFError, BrokenPipeError):  # the parent is gone: nobody waits for the figures
        pass
    return 0


class _PerCore:
    """One single-threaded trainer per core, each in its own process, run at the same time."""

    def __init__(self, spec: dict, processes: int):
        self.name = spec["name"]
        ctx = multiprocessing.get_context("spawn")
        saved = {var: os.environ.get(var) for var in THREAD_VARS}
        os.environ.update({var: "1" for var in THREAD_VARS})  # read by the children's BLAS at start-up
        try:
            self.conns, self.procs = [], []
            for _ in range(processes):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_child, args=(theirs, spec), daemon=True)
                proc.start()
                theirs.close()  # the child's end is the child's: its end (EOF) then reaches _receive
                self.conns.append(ours)
                self.procs.append(proc)
        finally:
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
        try:
            for conn in self.conns:
                self._receive(conn)
        except BaseException:
            self.close()
            raise

    def _receive(self, conn):
        try:
            return conn.recv()
        except EOFError:  # the child died; its traceback went to stderr
            raise BackendError(f"a per-core benchmark process of {self.name} ended early (its error is above)") from None

    def run(self, budget: float) -> tuple[int, float]:
        for conn in self.conns:
            conn.send(budget)
        results = [self._receive(conn) for conn in self.conns]
        return sum(s for s, _ in results), max(t for _, t in results)

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            try:
                conn.send(None)
            except OSError:
                pass
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()


def measure(contenders: list[dict], *, mappings=("per-core",), device: str = "cpu", seconds: float = 10.0,
            rounds: int = 3, sgemm_size: int = 2048, processes: int | None = None) -> dict:
    """Measure each contender in each mapping, interleaved with sgemm; returns the figures.

    ``seconds``: timed training per contender and mapping, split evenly over the rounds.
    """
    if rounds < 1 or seconds <= 0 or sgemm_size < 1:
        raise ValueError("rounds and the sgemm size must be >= 1 and seconds > 0")
    be = Backend(device, seed=0)
    if be.device == "gpu":
        mappings = ("one-process",)
    bad = set(mappings) - set(MAPPINGS)
    if bad:
        raise ValueError(f"unknown mapping {sorted(bad)[0]!r}: one of {', '.join(MAPPINGS)}")
    processes = processes or os.cpu_count() or 1
    load_before = _load()
    a, b, c = (be.normal((sgemm_size, sgemm_size)) for _ in range(3))
    runners = []  # (contender, mapping, runner)
    try:
        for spec in contenders:
            for mapping in mappings:
                runner = _PerCore(spec, processes) if mapping == "per-core" else _Trainer(spec, be.device)
                runners.append((spec, mapping, runner))
        sgemm, rates = [], {id(r): [] for *_, r in runners}
        for _ in range(rounds):
            sgemm.append(flops.sgemm_gflops(be, arrays=(a, b, c)))
            for _, _, runner in runners:
                samples, elapsed = runner.run(seconds / rounds)
                rates[id(runner)].append(samples / elapsed)
        sgemm.append(flops.sgemm_gflops(be, arrays=(a, b, c)))
    finally:
        for *_, runner in runners:
            if isinstance(runner, _PerCore):
                runner.close()
    limit = statistics.median(sgemm)
    results = []
    for spec, mapping, runner in runners:
        rate = statistics.median(rates[id(runner)])
        gflops = rate * spec["flops_per_sample"] / 1e9
        results.append({
            "name": spec["name"], "mapping": mapping, "samples_per_s": rate, "gflops": gflops,
            "ratio_to_sgemm": gflops / limit, "flops_per_sample": spec["flops_per_sample"], "batch": spec["batch"],
            "processes": processes if mapping == "per-core" else 1, "samples_per_s_rounds": rates[id(runner)],
        })
    for r in results:  # scikit-learn's rate beside ours, in the same mapping
        if r["name"].startswith("rbm "):
            theirs = next((s for s in results if s["name"] == "sklearn" + r["name"][3:] and s["mapping"] == r["mapping"]), None)
            r["ratio_to_sklearn"] = r["samples_per_s"] / theirs["samples_per_s"] if theirs else None
    blas, blas_threads = blas_info()
    environment = {
        "sgemm_gflops": limit, "sgemm_gflops_rounds": sgemm, "sgemm_size": sgemm_size,
        "sgemm_method": "median over rounds+1 measurements, each the best of 3 products, all BLAS threads",
        "device": be.device, "seconds": seconds, "rounds": rounds, "numpy_version": np.__version__,
        "blas": blas, "blas_threads": blas_threads, "cpu": _cpu_name(), "cpu_count": os.cpu_count(),
        "load_average_1min": [load_before, _load()],
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if be.device == "gpu":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        environment["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        environment["cupy_version"] = cupy.__version__
    return {**environment, "results": results}


def bench_all(device: str = "cpu", batch: int = 100, seconds: float = 10.0, rounds: int = 3,
              mappings=MAPPINGS, sgemm_size: int = 2048) -> dict:
    """The main job's work: CD-1 on its three RBM shapes and fine-tuning of its stack."""
    if batch < 1:
        raise ValueError("batch must be >= 1")
    specs = [contender("rbm", n_visible=v, n_hidden=h, batch=batch) for v, h in SHAPES]
    specs.append(contender("finetune", batch=batch))
    return measure(specs, mappings=mappings, device=device, seconds=seconds, rounds=rounds, sgemm_size=sgemm_size)


def bench_rbm(device: str = "cpu", batch: int = 100, n_visible: int = 784, n_hidden: int = 500,
              seconds: float = 10.0, sklearn: bool | None = None, rounds: int = 3,
              sgemm_size: int = 2048, mapping: str = "per-core") -> dict:
    """CD-1 on one layer shape, beside sgemm and (``sklearn``: True to require it, False to skip
    it, None when installed) scikit-learn's BernoulliRBM, in one mapping. Returns the figures,
    ours at the top level."""
    if batch < 1 or n_visible < 1 or n_hidden < 1:
        raise ValueError("batch, visible and hidden must be >= 1")
    if sklearn and not sklearn_available():
        raise ImportError("scikit-learn is not installed: pip install 'dbn-yarn[bench]' (or --no-sklearn)")
    ours = contender("rbm", n_visible=n_visible, n_hidden=n_hidden, batch=batch)
    specs = [ours]
    if sklearn is not False and sklearn_available() and device != "gpu":
        specs.append(contender("sklearn", n_visible=n_visible, n_hidden=n_hidden, batch=batch))
    result = measure(specs, mappings=(mapping,), device=device, seconds=seconds, rounds=rounds, sgemm_size=sgemm_size)
    mine = result["results"][0]
    theirs = result["results"][1] if len(result["results"]) > 1 else None
    return {**result, "samples_per_s": mine["samples_per_s"], "gflops": mine["gflops"],
            "ratio_to_sgemm": mine["ratio_to_sgemm"], "mapping": mapping, "processes": mine["processes"],
            "samples_per_s_rounds": mine["samples_per_s_rounds"], "ratio_to_sklearn": mine.get("ratio_to_sklearn"),
            "sklearn_samples_per_s": theirs["samples_per_s"] if theirs else None,
            "sklearn_samples_per_s_rounds": theirs["samples_per_s_rounds"] if theirs else None,
            "sklearn_version": _sklearn_version() if theirs else None,
            "batch": batch, "n_visible": n_visible, "n_hidden": n_hidden, "cd_k": 1,
            "flops_per_sample": ours["flops_per_sample"]}


def sklearn_available() -> bool:
    try:
        from sklearn.neural_network import BernoulliRBM  # noqa: F401
    except ImportError:
        return False
    return True


def _sklearn_version() -> str | None:
    try:
        import sklearn

        return sklearn.__version__
    except ImportError:
        return None


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


def _rate(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def format_table(r: dict) -> str:
    """A short human-readable report of :func:`measure`'s (or :func:`bench_rbm`'s) result."""
    device = r["device"] + (f" ({r['gpu']})" if r.get("gpu") else f" ({r['cpu']}, {r['cpu_count']} cores)")
    lines = [
        f"on {device}, batch {r['results'][0]['batch']}",
        f"numpy {r['numpy_version']}  BLAS {r['blas']}  threads {r['blas_threads']}  load {r['load_average_1min']}",
        "",
        f"{'':34}{'samples/s':>10}{'GFLOP/s':>9}{'x sgemm':>9}   samples/s by round",
        f"{'sgemm ' + str(r['sgemm_size']) + '^3':34}{'':>10}{r['sgemm_gflops']:>9.1f}{1:>9.2f}   "
        + " ".join(f"{x:.1f}" for x in r["sgemm_gflops_rounds"]) + " GFLOP/s",
    ]
    for x in r["results"]:
        label = f"{x['name']}  {x['mapping']}" + (f" x{x['processes']}" if x["mapping"] == "per-core" else "")
        lines.append(f"{label:34}{_rate(x['samples_per_s']):>10}{x['gflops']:>9.1f}{x['ratio_to_sgemm']:>9.2f}   "
                     + " ".join(_rate(v) for v in x["samples_per_s_rounds"]))
    for x in r["results"]:
        if x.get("ratio_to_sklearn"):
            lines.append(f"{x['name']} / scikit-learn ({x['mapping']}): {x['ratio_to_sklearn']:.2f}x")
    return "\n".join(lines)
