"""The local mini-cluster: the master and N workers as real processes on one machine.

The same master and worker code that runs in YARN containers; only the start-up
differs. The launcher supervises: it restarts a worker that exits with an error
(up to ``max_restarts`` times each, under the same name so it gets its shards
back), forwards the master's progress lines, and stops everything on Ctrl-C.

A new run (not a resume) into a folder that holds an earlier run never deletes that
run's files: its log, checkpoints and process logs move to ``OUTPUT/previous/N/``
(:func:`iterreduce.storage.ownership.set_aside`), so its checkpoints can never be mistaken for the new
run's. Only what a run of the runtime wrote, and its run record proves (:mod:`iterreduce.storage.ownership`), is ever
moved or deleted; a run holds its output folder's lock from start to end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from .. import PACKAGES_ROOT, THREAD_VARS
from ..exceptions import STOPPED_ON_BAD_DATA, LocalJobError, MasterKilled
from ..master import checkpoint
from ..master.config import MasterConfig, new_run_id
from ..master.master import EXIT_DATA_ERROR
from ..process import jobfolders
from ..process.lifeline import LAUNCHER_PID
from ..program import reader_of
from ..storage import durable, ownership, runlog
from ..storage.rowfile import LOCAL_DIR_VAR
from ..transport import sharedmem
from ..transport.security import new_token
from ..worker.worker import EXIT_MASTER_GONE


#: One run's files in its output directory, besides the program's own output (e.g. model.npz).


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def gpu_count() -> int:
    """CUDA devices CuPy sees on this machine (0 without CuPy, a driver or a device)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no CuPy, no driver or no device all mean "no GPU"
        return 0


def local_processes(shards: int, cores: int | None = None) -> int:
    """How many worker processes to run ``shards`` shards in on this machine (``cores``: its CPUs).

    A process computes its shards one after another, and every superstep waits for the
    slowest. With at most one process a core, a step takes ``ceil(shards / p)`` shard-times;
    with more, the cores time-slice them at about 10 % extra (cache refills, switches:
    measured on 2 cores). The cheapest ``p`` wins, the fewest processes on a tie: 10 shards
    run in 2 processes on 2 cores, in 10 on 8 cores; 3 shards run in 3 on 2 cores.
    """
    cores = max(1, cores or os.cpu_count() or 1)

    def step_time(p: int) -> float:
        rounds = -(-shards // p)
        return rounds if p <= cores else rounds * p / cores * 1.1

    return min(range(1, max(1, shards) + 1), key=lambda p: (step_time(p), p))


class LocalCluster:
    """Starts and supervises one job's processes. Use :func:`run_local`."""

    def __init__(self, config: MasterConfig, *, max_restarts: int = 3, device: str = "cpu",
                 threads_per_worker: int | None = None, on_record: Callable[[dict], None] | None = None,
                 shared_memory: bool = True):
        self.config = config
        self.out = Path(config.output)
        self.logs = self.out / "logs"
        self.max_restarts = max_restarts
        self.device = device
        self.threads = threads_per_worker or max(1, (os.cpu_count() or 1) // config.workers)
        self.on_record = on_record
        self.gpus = gpu_count() if device in ("gpu", "auto") else 0
        self.restarts: dict[str, int] = {}
        self.workers: dict[str, subprocess.Popen] = {}
        self.master: subprocess.Popen | None = None
        self._log = runlog.log_path(self.out)
        self._follower = runlog.Follower(self._log)
        self.last_worker_error = ""
        # The workers' local files (streamed row files) go in a folder this launcher makes and
        # removes at the end: a worker killed with SIGKILL cannot remove its own. The master and
        # the workers pass tensors through files of a shared-memory folder, likewise made and
        # removed here (iterreduce.process.jobfolders), where asked and this host has one.
        self.shared_memory = shared_memory
        self.scratch: str | None = None
        self.shared_dir: str | None = None

    def _env(self, index: int | None) -> dict:
        env = dict(os.environ, ITERREDUCE_TOKEN=self.config.token, PYTHONUNBUFFERED="1")
        env[LAUNCHER_PID] = str(os.getpid())  # children exit when this process is gone (lifeline.py)
        # Children import the runtime (and the program) from where this process does.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGES_ROOT, os.environ.get("PYTHONPATH")) if p)
        # The job's folders: the master's too, which removes them if this process dies first.
        env.pop(sharedmem.SHARED_DIR_VAR, None)  # never a folder of another run's
        if self.shared_dir:
            env[sharedmem.SHARED_DIR_VAR] = self.shared_dir
        if self.scratch:
            env[LOCAL_DIR_VAR] = self.scratch
        if index is not None:
            for var in THREAD_VARS:
                env[var] = str(self.threads)
            if self.gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(index % self.gpus)
        return env

    def _spawn(self, args: list[str], name: str, index: int | None) -> subprocess.Popen:
        # Never through a link in logs/, nor into a log shared with a copy of the folder (durable.open_append).
        with durable.open_append(self.logs / f"{name}.log", root=self.out) as log:
            return subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                                    env=self._env(index), start_new_session=True)

    def _write_job_file(self) -> Path:
        """Write the job's settings for the master (less the token, which travels in the
        environment) to ``job.json``: a new file renamed in, never written through a link or
        into a file another name shares."""
        job = self.config.to_dict()
        job.pop("token")
        job_file = self.out / "job.json"
        text = json.dumps(job, indent=2).encode()
        durable.write_local(job_file, lambda f: f.write(text))
        return job_file

    def start(self) -> str:
        """Start the master and the workers; returns the master's address."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.scratch, self.shared_dir = jobfolders.make(self.shared_memory)
        (self.out / "master.json").unlink(missing_ok=True)
        (self.out / "error.txt").unlink(missing_ok=True)
        job_file = self._write_job_file()
        self._follower = runlog.Follower.at_end(self._log)  # forward this run's records only
        self.master = self._spawn(["iterreduce.master", str(job_file)], "master", None)
        deadline = time.monotonic() + 60
        while not (self.out / "master.json").exists():
            if self.master.poll() is not None:
                raise self._master_failed(self.master.returncode, "before serving")
            if time.monotonic() > deadline:
                raise LocalJobError(f"the master did not start within 60 s (log: {self.logs / 'master.log'})")
            time.sleep(0.05)
        self.address = json.loads((self.out / "master.json").read_text())["address"]
        for i in range(self.config.workers):
            self._start_worker(i)
        return self.address

    def _start_worker(self, index: int) -> None:
        name = f"worker-{index}"
        device = "gpu" if self.gpus else ("cpu" if self.device == "auto" else self.device)
        peer = ["--peer-host", "127.0.0.1"] if self.config.reduce == "workers" else []
        self.workers[name] = self._spawn(
            ["iterreduce.worker", "--master", self.address, "--name", name, "--device", device, *peer], name, index)

    def _master_failed(self, code: int, when: str = "") -> LocalJobError:
        """The error for a master that ended with exit status ``code`` (negative: a signal)."""
        when = f" {when}" if when else ""
        if code == EXIT_DATA_ERROR:  # the data's fault, named in error.txt; not the master's
            return LocalJobError(self._failure(STOPPED_ON_BAD_DATA))
        if code >= 0 and (self.out / "error.txt").exists():  # a job failure the master explained
            return LocalJobError(self._failure("the job failed"))
        if code >= 0:  # a crash: its log's last line is the best reason there is
            return LocalJobError(self._failure(f"the master failed{when} (exit {code})"))
        # Killed from outside: its log's last line says nothing about why, and a resume can go on.
        directory = self.config.checkpoint_dir
        newest = checkpoint.latest(directory) if directory else None
        kept = f"checkpoints in {directory}, the newest {newest.rsplit('/', 1)[-1]}" if newest else "no checkpoint"
        return MasterKilled(f"the master was killed by {_signal_name(-code)}{when} (logs in {self.logs}); {kept}",
                            newest)

    def _failure(self, what: str) -> str:
        error = self.out / "error.txt"
        reason = error.read_text().strip() if error.exists() else self._last_error("master") or "no reason given"
        return f"{what}: {reason} (logs in {self.logs})"

    def _last_error(self, name: str) -> str:
        """The last line a process wrote (for a crash: the exception), to explain a failure."""
        try:
            with open(self.logs / f"{name}.log", "rb") as f:
                f.seek(max(0, f.seek(0, 2) - 4096))
                lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1].strip() if lines else ""

    def _forward_records(self) -> None:
        for record in self._follower.poll():
            if self.on_record:
                self.on_record(record)

    def supervise(self) -> None:
        """Wait for the job to end, restarting failed workers; raises on failure."""
        while True:
            self._forward_records()
            code = self.master.poll()
            if code is not None:
                self._forward_records()
                if code != 0:
                    raise self._master_failed(code)
                self._wait_workers()
                return
            for name, proc in list(self.workers.items()):
                rc = proc.poll()
                if rc is None or rc == 0:
                    continue
                if rc == EXIT_MASTER_GONE and self._master_ends(within=5.0):
                    break  # the master ended the job (e.g. on bad data): nothing to restart
                used = self.restarts.get(name, 0)
                error = f"killed by {_signal_name(-rc)}" if rc < 0 else self._last_error(name)
                if used >= self.max_restarts:
                    self._record_event("worker_gave_up", worker=name, exit=rc, restarts=used, error=error)
                    self.last_worker_error = error
                    del self.workers[name]
                    continue
                self.restarts[name] = used + 1
                self._record_event("worker_restarted", worker=name, exit=rc, restart=used + 1, error=error)
                self._start_worker(int(name.rsplit("-", 1)[1]))
            if not self.workers:
                self._forward_records()
                self.stop()
                raise LocalJobError(f"every worker failed and used up its {self.max_restarts} restarts; "
                                    f"last error: {self.last_worker_error} (logs in {self.logs})")
            time.sleep(0.2)

    def _master_ends(self, within: float) -> bool:
        """Whether the master process exits within ``within`` seconds."""
        try:
            self.master.wait(timeout=within)
            return True
        except subprocess.TimeoutExpired:
            return False

    def _record_event(self, event: str, **fields) -> None:
        """Append a launcher event to the job's log; the tail reader forwards it like the rest."""
        with runlog.RunLog(self._log) as log:
            log.event(event, **fields)

    def _wait_workers(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.workers.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()

    def stop(self) -> None:
        """Kill every process of the job (and remove the workers' local files)."""
        for proc in [*self.workers.values(), self.master]:
            if proc is not None and proc.poll() is None:
                proc.kill()
        for proc in [*self.workers.values(), self.master]:
            if proc is not None:
                proc.wait()
        self.remove_scratch()

    def remove_scratch(self) -> None:
        """Remove the folder of the workers' local files and the shared-memory folder, which
        :meth:`start` made (call once the processes are gone)."""
        jobfolders.remove(self.scratch, self.shared_dir)
        self.scratch = self.shared_dir = None


def run_local(config: MasterConfig, *, max_restarts: int = 3, device: str = "cpu",
              threads_per_worker: int | None = None, on_record: Callable[[dict], None] | None = None,
              earlier_runs: bool = True, shared_memory: bool = True) -> Path:
    """:func:`_run_local` holding the output folder's lock (:func:`iterreduce.storage.ownership.hold`)
    from start to end: a second run into the same folder is refused at once
    (:class:`~iterreduce.exceptions.OutputBusy`), naming the folder and the holder."""
    with ownership.hold(Path(config.output).resolve()):
        return _run_local(config, max_restarts=max_restarts, device=device, threads_per_worker=threads_per_worker,
                          on_record=on_record, earlier_runs=earlier_runs, shared_memory=shared_memory)


def _run_local(config: MasterConfig, *, max_restarts: int = 3, device: str = "cpu",
               threads_per_worker: int | None = None, on_record: Callable[[dict], None] | None = None,
               earlier_runs: bool = True, shared_memory: bool = True) -> Path:
    """Run the job ``config`` describes on a local mini-cluster of ``config.workers`` worker
    processes; returns the output dir.

    The launcher completes the config: ``shards`` may be a directory URI of Parquet
    shards, an empty ``token`` gets a fresh one, and checkpoints go to OUTPUT/checkpoints
    unless ``checkpoint_dir`` says otherwise; ``resume=True`` continues from the newest.
    A run without a ``run_id`` gets a fresh one (:func:`~iterreduce.master.new_run_id`), written
    in each of its checkpoints.
    A new run keeps an earlier run's log and checkpoints in OUTPUT/previous/N
    (:func:`~iterreduce.storage.ownership.set_aside`); once it has succeeded, the newest
    :data:`~iterreduce.storage.ownership.KEEP_PREVIOUS` stay. ``earlier_runs=False``: the caller
    keeps the folder's earlier runs itself (a job's run, whose own files go there too).
    ``shared_memory``: tensors between the master and the workers go through a shared-memory
    folder (:mod:`iterreduce.transport.sharedmem`, the same bits); False: through gRPC's bytes.
    """
    out = Path(config.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ownership.check_owned(out, ownership.RUN_FILES)  # a resume too: it writes on under these names
    if earlier_runs and not config.resume:  # a new run's log and checkpoints start afresh; a resumed one continues them
        ownership.set_aside(out)
    ownership.claim(out, ownership.RUN_FILES)
    shards = config.shards
    shards = reader_of(config.program).list_shards(shards) if isinstance(shards, str) else list(shards)
    config = dataclasses.replace(config, shards=shards, output=str(out), token=config.token or new_token(),
                                 run_id=config.run_id or new_run_id(),
                                 checkpoint_dir=config.checkpoint_dir or str(out / "checkpoints"))
    cluster = LocalCluster(config, max_restarts=max_restarts, device=device,
                           threads_per_worker=threads_per_worker, on_record=on_record, shared_memory=shared_memory)
    with _sigterm_as_exit():
        try:
            cluster.start()
            cluster.supervise()
        except BaseException:
            cluster.stop()  # never leave a master or workers behind
            raise
        finally:
            cluster.remove_scratch()
            ownership.settle(out, ownership.RUN_FILES)
    if earlier_runs:
        ownership.prune_previous(out)
    return out


#: Signals that end the launcher like Ctrl-C, so that it stops its children: a scheduler's or
#: `kill`'s SIGTERM, and the SIGHUP of a closed terminal or a dropped ssh session.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class StopSignal(SystemExit):
    """One of the :data:`STOP_SIGNALS` reached the launcher: it unwinds (stopping the children)
    and exits with 128 + the signal's number, as a shell reports a process a signal ended."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum


@contextlib.contextmanager
def _sigterm_as_exit():
    """Let the :data:`STOP_SIGNALS` unwind like Ctrl-C, so children are stopped."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_signal(signum, frame):
        raise StopSignal(signum)

    previous = {signum: signal.signal(signum, exit_on_signal) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
