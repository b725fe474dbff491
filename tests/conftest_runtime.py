"""Helpers for the IterativeReduce runtime tests (imported by test_iterreduce, test_local_cluster, ...).

Deliberately free of pytest imports: the master and worker *subprocesses* of the
local-cluster tests import this module too (for the ``Slow*`` programs below),
and should start fast. Test modules put ``tests/`` on the subprocesses' path with
:func:`subprocess_env`.

- ``SlowSoftmax`` / ``SlowDBNProgram``: the real programs, unchanged, except that
  each worker sleeps ``$ITERREDUCE_TEST_STEP_DELAY`` seconds per shard update.
  The sleep changes no number, it only makes a superstep last long enough for a
  test to kill a process in the middle of a job regardless of CPU speed.
- :func:`run_job`: ``run_local`` with a watchdog, so a hung job fails instead of
  hanging the test session.
- :func:`simulate`: the program's schedule run sequentially in this process, shard
  by shard, with the runtime's seeds and reduce: what a distributed run must equal.
- :class:`InProcessJob`: a ``Master`` served in this process, with ``Worker``
  objects in threads.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np

from softmax_program import SoftmaxRegression, SoftmaxWorker

TESTS_DIR = Path(__file__).resolve().parent
REPO = TESTS_DIR.parent
MNIST_DIR = REPO.parent / "shared" / "data" / "mnist"

SOFTMAX = "softmax_program:SoftmaxRegression"
SLOW_SOFTMAX = "conftest_runtime:SlowSoftmax"
DBN_PROGRAM = "dbn.jobs.dbn_program:DBNProgram"
SLOW_DBN = "conftest_runtime:SlowDBNProgram"
DELAY_ENV = "ITERREDUCE_TEST_STEP_DELAY"


# ------------------------------------------------------------------ slow programs


def _delay() -> None:
    delay = float(os.environ.get(DELAY_ENV, "0") or 0)
    if delay > 0:
        time.sleep(delay)


class SlowSoftmax(SoftmaxRegression):
    worker_class = "conftest_runtime:SlowSoftmaxWorker"


class SlowSoftmaxWorker(SoftmaxWorker):
    def run(self, step, parameters, shard, seed):
        _delay()
        return super().run(step, parameters, shard, seed)


class LateLinkSoftmax(SoftmaxRegression):
    """Softmax whose link (a tracking server's run, say) becomes known only once the master has
    written the last step's record: a slow tracking server's case."""

    LINK = {"run": "http://tracking.invalid/runs/1"}

    def __init__(self, config):
        super().__init__(config)
        self._last_step_seen = False

    def observe(self, record):
        if record.get("step") == record.get("of", 0) - 1:
            self._last_step_seen = True

    def links(self):
        return dict(self.LINK) if self._last_step_seen else {}


def __getattr__(name):
    """The slow DBN classes, built on first use so a softmax process never imports ``dbn``."""
    if name not in ("SlowDBNProgram", "SlowDBNWorker"):
        raise AttributeError(name)
    from dbn.jobs.dbn_program import DBNProgram, DBNWorker

    class SlowDBNProgram(DBNProgram):
        worker_class = "conftest_runtime:SlowDBNWorker"

    class SlowDBNWorker(DBNWorker):
        def run(self, step, parameters, shard, seed):
            _delay()
            return super().run(step, parameters, shard, seed)

        def run_shards(self, step, parameters, shards, seeds):  # grouped: a delay a shard, as one by one
            for _ in shards:
                _delay()
            return super().run_shards(step, parameters, shards, seeds)

    for cls in (SlowDBNProgram, SlowDBNWorker):
        cls.__module__ = __name__
        globals()[cls.__name__] = cls
    return globals()[name]


# ------------------------------------------------------------------------- data


def blobs(n: int = 600, d: int = 8, k: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of ``k`` Gaussian clusters in ``d`` dimensions, classes in equal numbers."""
    rng = np.random.default_rng(seed)
    centers = 2.0 * rng.standard_normal((k, d))
    y = np.arange(n) % k
    rng.shuffle(y)
    X = centers[y] + rng.standard_normal((n, d))
    return X.astype(np.float32), y.astype(np.int64)


# ------------------------------------------------------------ subprocess helpers


def subprocess_env(monkeypatch, delay: float = 0.0) -> None:
    """Let master/worker subprocesses import this module (and the repo), with a step delay."""
    parts = [str(TESTS_DIR), str(REPO)]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(parts))
    monkeypatch.setenv(DELAY_ENV, str(delay))


def read_log(output) -> list[dict]:
    path = Path(output) / "log.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def records(output) -> list[dict]:
    """The progress records (one per completed superstep) of ``output/log.jsonl``."""
    return [r for r in read_log(output) if "step" in r and "event" not in r]


def events(output, name: str | None = None) -> list[dict]:
    return [r for r in read_log(output) if "event" in r and (name is None or r["event"] == name)]


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _has_pair(args: list[str], flag: str, value: str) -> bool:
    return any(a == flag and b == value for a, b in zip(args, args[1:]))


def worker_pids(address: str, name: str) -> list[int]:
    """Pids of the live ``iterreduce.worker`` processes named ``name`` serving the master at ``address``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        args = cmdline(int(entry.name))
        if "iterreduce.worker" in args and _has_pair(args, "--name", name) and _has_pair(args, "--master", address):
            pids.append(int(entry.name))
    return pids


def master_info(output) -> dict:
    return json.loads((Path(output) / "master.json").read_text())


def kill_master(output) -> int | None:
    """SIGKILL the master of the job in ``output`` (checking that the pid really is it)."""
    try:
        pid = int(master_info(output)["pid"])
    except (OSError, ValueError, KeyError):
        return None
    args = cmdline(pid)
    if "iterreduce.master" not in args or not any(str(Path(output).resolve() / "job.json") in a for a in args):
        return None
    os.kill(pid, signal.SIGKILL)
    return pid


def kill_worker(output, name: str) -> int:
    """SIGKILL the worker process ``name`` of the job in ``output``; returns its pid."""
    pids = worker_pids(master_info(output)["address"], name)
    assert len(pids) == 1, f"expected one live process for {name}, found {pids}"
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


def log_tail(output, lines: int = 8) -> str:
    parts = []
    for log in sorted((Path(output) / "logs").glob("*.log")):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log.name}\n" + "\n".join(text))
    return "\n".join(parts)


def run_job(*, timeout: float = 60.0, max_restarts: int = 3, device: str = "cpu", on_record=None,
            shared_memory: bool = True, threads_per_worker: int | None = None, **fields) -> Path:
    """``iterreduce.launch.local.run_local`` of a MasterConfig with ``fields``, failing (not hanging)
    after ``timeout`` seconds. Jobs compared bit for bit across worker counts fix ``threads_per_worker``:
    OpenBLAS 0.3.31 (numpy 2.4.5+) gives other bits on 2 threads than on 1 for some shapes."""
    from iterreduce.launch.local import run_local
    from iterreduce.master import MasterConfig

    fields.setdefault("heartbeat_interval", 0.2)
    fields.setdefault("heartbeat_timeout", 2.0)
    config = MasterConfig(token="", **fields)
    kwargs = {"max_restarts": max_restarts, "device": device, "on_record": on_record, "shared_memory": shared_memory,
              "threads_per_worker": threads_per_worker}
    box: dict = {}

    def target():
        try:
            box["out"] = run_local(config, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            box["exc"] = exc

    thread = threading.Thread(target=target, name="run_local", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        out = Path(config.output)
        kill_master(out)  # the launcher then stops the workers and returns
        thread.join(20)
        raise AssertionError(f"job in {out} did not finish within {timeout:.0f} s\n{log_tail(out)}")
    if "exc" in box:
        raise box["exc"]
    return box["out"]


def load_npz(path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


# ------------------------------------------------------------ reference runs


def assert_same_bits(got: dict, expected: dict) -> None:
    """The same arrays, bit for bit: names, dtypes, shapes and bytes."""
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape, name
        assert got[name].tobytes() == expected[name].tobytes(), name


def simulate(program: str, program_config: dict, uris: list[str], seed: int = 0) -> dict[str, np.ndarray]:
    """Run ``program`` sequentially here: every shard every step, with the runtime's seeds and reduce,
    and the master's hooks (before_step, evaluate, after_step, finished)."""
    from shardio.readers import shard_info
    from iterreduce.program import load_class, shard_seed

    info = shard_info(uris)
    prog = load_class(program)(program_config)
    prog.check_shards(info)  # as the master does, before anything else
    worker = load_class(prog.worker_class)(program_config)
    data = [worker.load_shard(uri, i) for i, uri in enumerate(uris)]
    params = prog.initial_parameters(seed, info)
    for index, step in enumerate(prog.schedule(info)):
        params = prog.before_step(step, params)
        updates = [worker.run(step, params, shard, shard_seed(seed, index, shard.index)) for shard in data]
        if step.arrays:
            params = {**params, **prog.reduce(step, params, updates)}
        params = prog.after_step(step, params, prog.evaluate(step, params))  # as the master ends a step
        if prog.finished(params):
            break
    return params


class InProcessJob:
    """A Master served in this process on 127.0.0.1:0, with Worker objects in threads."""

    def __init__(self, output, uris, *, workers: int, program: str = SOFTMAX, program_config=None, **config):
        from iterreduce.master import Master, MasterConfig
        from iterreduce.transport.security import new_token

        config.setdefault("heartbeat_interval", 0.2)
        config.setdefault("heartbeat_timeout", 5.0)
        config.setdefault("start_timeout", 30.0)
        self.token = new_token()
        self.output = Path(output)
        self.config = MasterConfig(program=program, program_config=dict(program_config or {"n_classes": 3, "epochs": 3}),
                                   shards=list(uris), workers=workers, token=self.token, output=str(output),
                                   host="127.0.0.1", port=0, **config)
        self.master = Master(self.config)
        self.server, self.address = self.master.serve()
        self.threads: list[threading.Thread] = []
        self.results: dict[str, object] = {}
        self.worker_objects = []
        self._channels = []

    def _spawn(self, name: str, fn) -> threading.Thread:
        def target():
            try:
                self.results[name] = fn()
            except BaseException as exc:  # noqa: BLE001 - inspected by the test
                self.results[name] = exc

        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def start(self) -> "InProcessJob":
        self.master_thread = self._spawn("master", self.master.run)
        return self

    def add_worker(self, name: str) -> None:
        from iterreduce.worker import Worker

        peer_host = "127.0.0.1" if self.config.reduce == "workers" else None
        worker = Worker(self.address, self.token, name, peer_host=peer_host)
        self.worker_objects.append(worker)
        self._spawn(name, worker.run)

    def stub(self):
        import grpc

        from iterreduce.proto import iterreduce_pb2_grpc as pb_grpc

        channel = grpc.insecure_channel(self.address)
        self._channels.append(channel)
        return pb_grpc.MasterStub(channel)

    def wait_for(self, predicate, timeout: float = 20.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.01)

    def wait(self, timeout: float = 60.0) -> None:
        """Join the master and the workers; re-raise the master's exception; check workers exited 0."""
        self.master_thread.join(timeout)
        assert not self.master_thread.is_alive(), "master.run() did not finish"
        if isinstance(self.results.get("master"), BaseException):
            raise self.results["master"]
        for thread in self.threads:
            thread.join(15)
            assert not thread.is_alive(), f"{thread.name} did not finish"
        for worker in self.worker_objects:
            assert self.results[worker.name] == 0, f"{worker.name} ended with {self.results[worker.name]!r}"

    def run_to_end(self, *names: str, timeout: float = 60.0) -> None:
        """Add workers ``names``, run the job to its end and close it, whatever happens."""
        try:
            for name in names:
                self.add_worker(name)
            self.start().wait(timeout=timeout)
        finally:
            self.close()

    def close(self) -> None:
        with self.master.lock:
            self.master.done = True
            self.master.lock.notify_all()
        self.server.stop(0)
        if self.master.view is not None:
            self.master.view.stop()
        for thread in self.threads:
            thread.join(5)
        for worker in self.worker_objects:
            worker._stop.set()
            worker.channel.close()
        for channel in self._channels:
            channel.close()
        self.master._log.close()
