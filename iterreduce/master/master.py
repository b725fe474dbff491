"""The IterativeReduce master: runs a program's schedule over gRPC workers.

Each superstep: workers fetch the step and the parameters they lack, compute one
update per shard they hold, and push it back; the master reduces the updates (in
shard order), logs a progress line and checkpoints. A worker that misses its
heartbeats is dropped: the step completes without its shards (the average is
renormalised over the shards that reported) and its shards move to live workers
until a worker of the same name registers again.

With ``reduce = "workers"`` (and a program whose reduce is elementwise) the workers
reduce the updates among themselves, each its own rows (:mod:`iterreduce.transport.exchange`),
and the master receives the result once instead of every update. A lost worker or a
failed delivery in that exchange makes the master run the step again as a star: every
worker pushes its update (kept, not computed again) to the master, which reduces it
itself; the lost worker's shards sit that step out, as they do in a star step. Where the
program allows (:meth:`~iterreduce.program.Program.runs_ahead`), each task names the step
after it, and a worker computes its update for that step as soon as the exchange gives it
the new parameters, while the master ends the step: its share of the sync then overlaps the
compute. The worker keeps that update only if the task that comes is the one it guessed,
with every array it read unchanged (each value the master gives an array has a new version).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np

from .. import log_level
from ..exceptions import DataError, IterReduceError, JobFailed
from ..process import jobfolders
from ..process.lifeline import follow_launcher
from ..process.memory import keep_freed_memory
from ..program import MASTER_STATE, Program, load_class, master_side, reader_of, step_to_json
from ..storage import durable, runlog
from ..transport import exchange
from ..transport.security import TlsCredentials, check_token, server_credentials
from ..transport.sharedmem import SharedFolder
from ..webui import ViewServer
from . import checkpoint
from .broadcast import Broadcast
from .config import MasterConfig
from .membership import HEARTBEATS_PER_S, Membership, WorkerInfo, heartbeat_timing
from .resume import checkpoint_to_resume, job_fingerprint, load_checkpoint
from .rounds import Rounds
from .service import MasterService, master_server
from .livepage import start_view

log = logging.getLogger("iterreduce.master")

#: The master's exit status when the job stopped on unusable data (1: any other job error).
EXIT_DATA_ERROR = 2

#: Errors that fail the job with their message (bad input or a program's refusal), not as a crash.
JOB_ERRORS = (IterReduceError, ValueError, TypeError, KeyError)
#: The most steps a job's schedule may have: the master holds them all (some 300 MB at this bound).
MAX_STEPS = 1_000_000

class Master:
    """Holds the job's state; :meth:`run` drives the schedule, ``service``
    (:class:`~iterreduce.master.service.MasterService`) answers the workers' RPCs.

    Its parts: ``members`` (:class:`~iterreduce.master.membership.Membership`: the workers and the
    shards each holds), ``rounds`` (:class:`~iterreduce.master.rounds.Rounds`: the attempt at the
    current step, and the workers' reduce in it), ``broadcast``
    (:class:`~iterreduce.master.broadcast.Broadcast`: the tasks' messages). All their state is
    guarded by the master's lock."""

    def __init__(self, config: MasterConfig):
        self.config = config
        self.out = Path(config.output)
        self.out.mkdir(parents=True, exist_ok=True)
        self.shards = reader_of(config.program).describe(config.shards)
        self.program: Program = load_class(config.program)(config.program_config)
        self.steps = list(itertools.islice(self.program.schedule(self.shards), MAX_STEPS + 1))
        if len(self.steps) > MAX_STEPS:  # held in memory (and fingerprinted): a bounded schedule
            raise JobFailed(f"the job's schedule has more than {MAX_STEPS:,} steps: fewer epochs, or more "
                            f"work a step")
        # What a checkpoint must match to be resumed: same program, config, seed, data and schedule.
        self.run_id = config.run_id  # in every checkpoint; a resume of another run's checkpoint continues that run
        self.fingerprint = job_fingerprint(config.program, config.program_config, config.seed, self.shards, self.steps)
        mutex = threading.RLock()
        # One lock, two conditions: ``lock`` wakes the step's driver (and the start, waiting for
        # workers); ``work`` wakes the FetchTask long-polls, and only when there may be new work
        # for them (a step starts, shards move, the job ends). A push wakes the driver alone: with
        # one condition, each of N pushes woke all N waiting fetches, N^2 wake-ups a step.
        self.lock = threading.Condition(mutex)
        self.work = threading.Condition(mutex)
        redo = config.lost_shards == "redo" or self.program.every_shard_every_step
        self.rounds = Rounds(wake=self.lock, event=self._event, skip_lost=not redo)
        self.members = Membership(len(self.shards), config.workers, work=self.work, on_moved=self.rounds.moved)
        self.current = -1
        self.done = False
        self.parameters: dict[str, np.ndarray] = {}
        # Each value the master gives an array (initial, a reduce, a program's hook) gets a new version,
        # from one clock: a worker holding an older one is sent the array (see _new_version).
        self.versions: dict[str, int] = {}
        self._clock = -1  # the initial parameters are version 0
        # The run's shared-memory folder, where the launcher made one: its workers on this host
        # read parameters from, and push updates through, its files instead of gRPC's bytes.
        self.shared = SharedFolder.from_environment()
        self.broadcast = Broadcast(float16=config.float16_wire, shared=self.shared)
        self.failure: Exception | None = None  # bad data a worker reports, or a launcher's error: ends the job
        self._ahead_since: float | None = None   # when the workers could start the step they ran ahead to
        self.links: dict[str, str] = {}  # where the job is shown beyond its page (Program.links), as logged
        # Called with each record the master writes, a step's progress or an event (e.g. to report
        # progress and links to YARN); added before the job starts.
        self.listeners: list = []
        self._log = runlog.RunLog(runlog.log_path(self.out))
        # Before any worker starts: refuse data the program cannot use, and log what it found.
        facts = self.program.check_shards(self.shards)  # its "rows" win: a program may read them (a filter)
        self._event("data", **{"shards": len(self.shards), "rows": sum(s["rows"] for s in self.shards), **facts})
        self.heartbeat_interval, self.heartbeat_timeout = heartbeat_timing(
            config.heartbeat_interval, config.heartbeat_timeout, config.workers)
        if self.heartbeat_interval > config.heartbeat_interval:
            log.info("%d workers: heartbeats every %.1f s, a worker lost after %.0f s of silence (at most %d "
                     "heartbeats a second)", config.workers, self.heartbeat_interval, self.heartbeat_timeout,
                     HEARTBEATS_PER_S)
            self._event("heartbeat", interval=self.heartbeat_interval, timeout=self.heartbeat_timeout)
        self.view: ViewServer | None = None      # the live page, while serving
        # The live page's path secret (None: none); set where a proxy alone is told it (on YARN).
        self.view_secret: str | None = None
        self.service = MasterService(self)  # the RPCs workers call, served by :meth:`serve`

    # ------------------------------------------------------------ liveness

    def wake_all(self) -> None:
        """Wake every waiter: the driver and the fetches (call with the lock held)."""
        self.lock.notify_all()
        self.work.notify_all()

    def drop(self, worker: WorkerInfo, why: str) -> None:
        """Mark ``worker`` lost: the current step goes on without its unfinished shards (or, for a
        program that needs every shard every step, has other workers do them)."""
        worker.alive = False
        lost = self.rounds.lose(worker, why, others_live=bool(self.members.live()))
        log.warning("lost %s (%s); shards step %d goes on without: %s (the others are redone)", worker.worker_id, why,
                    self.current, sorted(lost))
        self._event("worker_lost", worker=worker.worker_id, reason=why, shards_skipped=sorted(lost))
        self.members.assign_orphans()
        self.wake_all()

    def _monitor(self) -> None:
        period = self.heartbeat_interval / 2
        last = time.monotonic()
        while not self.done:
            time.sleep(period)
            with self.lock:
                self._check_heartbeats(time.monotonic() - last)
                last = time.monotonic()

    def retire(self, worker: WorkerInfo) -> None:
        """``worker`` is no longer wanted (or drains) and holds no shard: it is told the job is done, and leaves."""
        worker.alive, worker.retired = False, True
        reason = worker.draining or f"{self.members.size} workers are wanted"
        log.info("%s retires: %s", worker.worker_id, reason)
        self._event("worker_retired", worker=worker.worker_id, wanted=self.members.size, reason=reason)
        self.wake_all()

    def _check_heartbeats(self, since_last_check: float) -> None:
        """Drop workers silent for longer than the timeout, unless the master itself was stalled."""
        for worker, silence in self.members.silent(since_last_check, self.heartbeat_timeout):
            self.drop(worker, f"no heartbeat for {silence:.1f} s")

    # ------------------------------------------------------------ schedule

    def _event(self, event: str, **fields) -> None:
        self._observe(self._log.event(event, **fields))

    def _observe(self, record: dict) -> None:
        """The program and the listeners see each record written, in the log's order; links the
        program has come to know are logged once each, as an event of their own."""
        self.program.observe(record)
        for listener in self.listeners:
            listener(record)
        links = self.program.links()
        if links and links != self.links:
            self.links = dict(links)
            self._event("links", links=self.links)

    def event(self, event: str, **fields) -> None:
        """Add an event of the launcher's (e.g. a container YARN took back) to the job's log."""
        with self.lock:
            self._event(event, **fields)

    def live_workers(self) -> set[str]:
        """The names of the workers the master hears from now."""
        with self.lock:
            return {worker.name for worker in self.members.live()}

    def wanted_workers(self) -> int:
        """How many workers the job wants now: its ``workers``, until :meth:`resize`; none once it ended."""
        with self.lock:
            return 0 if self.done or self.failure else self.members.size

    def resize(self, workers: int) -> None:
        """Want ``workers`` workers from now on (1 to the number of shards; ValueError else): workers
        K >= ``workers`` give their shards up at the next step's start and retire; new ones (the
        launcher's to start) take theirs at the next step's start. The model is the same either way."""
        with self.lock:
            was = self.members.size
            self.members.resize(workers)
            if workers != was:
                log.info("%d workers wanted (were %d)", workers, was)
                self._event("resized", workers=workers, was=was, step=self.current)
            self.wake_all()

    def drain(self, name: str, why: str) -> bool:
        """Have worker ``name``'s live process leave, for ``why`` (its node is being decommissioned):
        its shards go to the other workers at the next step's start, then it retires (exit 0,
        nothing lost), and its slot stays wanted: a new process of ``name`` (the launcher's to
        start, elsewhere) takes the shards back at the step after it registers. A worker alone
        keeps its shards until another joins. False when no live process has that name."""
        with self.lock:
            worker = next((w for w in self.members.live() if w.name == name), None)
            if worker is None or worker.draining:
                return False
            worker.draining = why
            log.info("%s drains: %s", worker.worker_id, why)
            self._event("worker_draining", worker=worker.worker_id, reason=why, step=self.current)
            self.wake_all()
            return True

    def fail(self, error: Exception) -> None:
        """End the job with ``error``, from another thread (a launcher's watcher): :meth:`run` raises
        it at its next look, as it does a worker's report of bad data."""
        with self.lock:
            if self.failure is None:
                log.error("%s", error)
                self.failure = error
            self.wake_all()

    def _wait_for_workers(self) -> None:
        """Until every worker registered, or ``min_workers`` did; by ``start_timeout``, at least
        ``min_workers`` (or one) must have, or the job fails."""
        config = self.config
        enough = config.min_workers or config.workers
        deadline = time.monotonic() + config.start_timeout
        with self.lock:
            while len(self.members.live()) < enough:
                self._raise_failure()
                live = len(self.members.live())
                if time.monotonic() > deadline:
                    if live and not config.min_workers:  # no minimum set: any will do by then
                        break
                    raise JobFailed(f"{live} of the {max(1, config.min_workers)} workers needed (of {config.workers}) "
                                    f"registered within {config.start_timeout:g} s")
                self.lock.wait(timeout=0.5)
            if len(self.members.live()) < config.workers:
                log.info("starting with %d of %d workers: the others join as they come",
                         len(self.members.live()), config.workers)
            self.members.assign_orphans()

    def _raise_failure(self) -> None:
        """Stop the job on a worker's report of bad data (call with the lock held)."""
        if self.failure is not None:
            raise self.failure

    def _restore(self) -> int:
        """Initial parameters, or those of the newest checkpoint when resuming; returns the first step."""
        config = self.config
        ckpt = checkpoint_to_resume(config.checkpoint_dir, self.fingerprint, resume=config.resume,
                                    resume_own=config.resume_own, run_id=config.run_id)
        if ckpt is None:
            self.parameters = self.program.initial_parameters(config.seed, self.shards)
            self._new_version(self.parameters)
            return 0
        header, self.parameters = load_checkpoint(ckpt, self.fingerprint)
        self._new_version(self.parameters)
        if config.resume and header.get("run"):  # the user's resume continues the run it names
            self.run_id = header["run"]
        log.info("resumed from %s at step %d of %d", ckpt, header["step"], len(self.steps))
        self._event("resumed", checkpoint=ckpt, step=header["step"])
        return int(header["step"])

    def run(self) -> None:
        """Drive every superstep; returns when the program is finished."""
        start = self._restore()
        self._wait_for_workers()
        job_start = time.perf_counter()
        index = start - 1
        writer = checkpoint.Writer(on_saved=lambda step, path: self._event("checkpoint", step=step, path=path))
        try:
            while index + 1 < len(self.steps) and not self.program.finished(self.parameters):
                index += 1
                self._run_step(index)
                stopping = self.program.finished(self.parameters)
                if stopping:
                    self._event("stopped", step=index + 1, of=len(self.steps))
                if self.config.checkpoint_dir and ((index + 1) % self.config.checkpoint_every == 0
                                                   or index + 1 == len(self.steps) or stopping):
                    writer.save(self.config.checkpoint_dir, index + 1,
                                {"n_steps": len(self.steps), "seed": self.config.seed,
                                 "program": self.config.program, "fingerprint": self.fingerprint,
                                 "run": self.run_id},
                                self.parameters, keep=self.config.checkpoint_keep)
            writer.flush()
        finally:
            writer.close()
        self.program.finalize(self.parameters, str(self.out))
        with self.lock:
            self.done = True
            self.wake_all()
        self._event("done", steps=index + 1, seconds=time.perf_counter() - job_start)

    def _new_version(self, arrays) -> None:
        """Mark the values of ``arrays`` (names) as new: a version later than any given out."""
        self._clock += 1
        for name in arrays:
            self.versions[name] = self._clock

    def _publish(self, names) -> None:
        """Have the new values of ``names`` written into the shared folder now, beside what the master
        does before the next step, rather than at the first fetch that asks: by then the worker that
        got its task first computes beside the writes for the others (on two cores, the writes took
        ten times as long)."""
        with self.lock:
            if self.shared is None or not any(w.shared and w.alive for w in self.members.workers.values()):
                return
        self.broadcast.publish([(name, self.parameters[name], self.versions[name])
                                for name in names if not master_side(name)])

    def _changed(self, before: dict, after: dict) -> list[str]:
        """The arrays a program's hook added or replaced (parameters are replaced, never changed in place)."""
        return [name for name, value in after.items() if value is not before.get(name)]

    def _run_step(self, index: int) -> None:
        step = self.steps[index]
        # A step the workers ran ahead to began for them when the step before was reduced: its time
        # counts from then (its compute did, and the master's end of that step overlapped it).
        started = self._ahead_since if self._ahead_since is not None else time.perf_counter()
        before, self.parameters = self.parameters, self.program.before_step(step, self.parameters)
        changed = self._changed(before, self.parameters)
        if changed:  # the workers must not compute with what they held
            self._new_version(changed)
        rounds = self.rounds
        with self.lock:
            self.current = index
            self._start_round(step, peers=self._peer_reduce(step))
            while True:
                rounds.collect(self.members, check=self._raise_failure)
                reduce_start = time.perf_counter()
                # The version _run_step gives the result next (see _new_version): the one of the workers' copies.
                reduced = (rounds.gather(step, self.parameters, self._clock + 1, check=self._raise_failure)
                           if rounds.reducers else None)
                if reduced is not None or not rounds.reducers:
                    break
                rounds.failed(index)
                self._start_round(step, peers=False, same_shards=True)
            reducers = rounds.end()
            updates = sorted(rounds.results.values(), key=lambda u: u.shard)
            compute = max(rounds.compute_s.values(), default=0.0)
            fastest = min(rounds.compute_s.values(), default=0.0)
            if log.isEnabledFor(logging.DEBUG):  # a dict of every worker: only when it is logged
                log.debug("step %d: compute seconds by worker %s", index,
                          {w: round(s, 4) for w, s in sorted(rounds.compute_s.items())})
        if not updates:
            raise JobFailed(f"step {index} ({step.phase}): no shard reported")
        if step.arrays:
            if reduced is None:
                reduced = self.program.reduce(step, self.parameters, updates)
            self.parameters.update(reduced)
            self._new_version(reduced)  # on the workers: the version Rounds.gather counted their deliveries at
            self._publish(reduced)
        evaluated = time.perf_counter()
        elapsed = evaluated - started
        self._ahead_since = evaluated if rounds.ahead else None
        metrics = self.program.evaluate(step, self.parameters)  # not this step's time (overlapped by a run ahead)
        kept = self.program.after_step(step, self.parameters, metrics)
        changed = self._changed(self.parameters, kept)
        if changed:
            self._new_version(changed)
        self.parameters = kept
        log.debug("step %d: %.4f s to reduced, %.4f s of it reducing; %.4f s evaluating and bookkeeping after",
                  index, elapsed, evaluated - reduce_start, time.perf_counter() - evaluated)
        record = self._log.write(runlog.step_record(
            index, len(self.steps), step.phase, {**dict(step.info), **self.program.summarize(step, updates), **metrics},
            shards=len(updates), shards_total=len(self.shards),
            seconds=elapsed, compute_seconds=compute, reduce_seconds=evaluated - reduce_start, reducers=reducers,
            compute_seconds_min=fastest, updates=len(updates) - sum(len(u.combined) for u in updates)))
        self._observe(record)

    def _peer_reduce(self, step) -> bool:
        """Whether the workers may reduce this step's updates (see :mod:`iterreduce.transport.exchange`)."""
        return (self.config.reduce == "workers" and self.rounds.exchanges_on
                and bool(step.arrays) and self.program.reduces_elementwise()
                and exchange.can_cut({k: v for k, v in self.parameters.items() if not k.startswith(MASTER_STATE)}))

    def _start_round(self, step, peers: bool, same_shards: bool = False) -> None:
        """Start an attempt at the current step (call with the lock held; see :meth:`Rounds.start`)."""
        self.rounds.start(step, self.parameters, self.members, peers, same_shards,
                          combine=self.config.combine and bool(step.arrays) and self.program.averages(step))
        # The step a worker may compute while this one ends (Program.runs_ahead): only after an exchange
        # that gives every worker the new parameters, and only as a guess the next task confirms.
        following = self.steps[self.current + 1] if self.current + 1 < len(self.steps) else None
        if self.rounds.reducers and following is not None and self.program.runs_ahead(step, following):
            self.rounds.ahead = step_to_json(following)
        self.wake_all()

    # --------------------------------------------------------------- the page

    # --------------------------------------------------------------- serve

    def serve(self, tls: TlsCredentials | None = None) -> tuple[grpc.Server, str]:
        """Start the gRPC server; returns it and its ``host:port``.

        With ``tls``, only clients presenting the same certificate can connect (mutual TLS);
        the token is still checked. The credentials are an argument, not a config field, so
        the key never reaches a job file.
        """
        server = master_server(self.service, self.config.workers, self.config.token)
        bind = f"{self.config.host}:{self.config.port}"
        port = server.add_insecure_port(bind) if tls is None else server.add_secure_port(bind, server_credentials(tls))
        keep_freed_memory()
        server.start()
        threading.Thread(target=self._monitor, daemon=True).start()
        if self.config.ui and self.view is None:
            try:
                self.view = start_view(self)
                log.info("live view on %s", self.view.origin)
            except OSError as exc:  # e.g. the port is taken: the job runs on without its page
                log.warning("no live view: %s", exc)
        return server, f"{self.config.advertise_host or self.config.host}:{port}"

    def serve_and_run(self, tls: TlsCredentials | None = None,
                      on_serving: Callable[[str], None] | None = None) -> None:
        """Run the whole job: serve, tell ``on_serving`` the address workers dial, run
        the schedule, give the workers time to fetch DONE, stop the server.

        Raises what :meth:`run` raises (a job error); the server is stopped either way.
        """
        server, address = self.serve(tls=tls)
        try:
            log.info("serving %d shards on %s%s", len(self.shards), address, " with mutual TLS" if tls else "")
            if on_serving is not None:
                on_serving(address)
            self.run()
        finally:
            if self.done or self.failure:  # the job ended: let workers fetch DONE and exit 0
                time.sleep(2 * self.heartbeat_interval)
            server.stop(grace=1.0)
            if self.view is not None:
                self.view.stop()
            self.broadcast.close()
            try:
                self.program.close(self.done, str(self.out))
            except Exception:  # noqa: BLE001 - the job's outcome is decided; a program's goodbye cannot change it
                log.exception("the program's close failed")



def log_failure(output: str, exc: BaseException) -> None:
    """A ``failed`` event in the job's log (its page then says why the job stopped)."""
    try:
        with runlog.RunLog(runlog.log_path(output)) as run_log:
            run_log.event("failed", reason=str(exc))
    except OSError as err:
        log.warning("could not log the failure: %s", err)


def publish_address(output: str, address: str) -> None:
    """Write ``master.json`` (the address the launcher waits for) in the output folder ``output``:
    a new file renamed in, never written through a link or into a file another name shares."""
    text = json.dumps({"address": address, "pid": os.getpid()}).encode()
    durable.write_local(Path(output) / "master.json", lambda f: f.write(text))


def write_error(output: str, exc: BaseException) -> None:
    """Write why the job failed to ``error.txt`` in the output folder ``output`` (as :func:`publish_address`)."""
    text = (str(exc) + "\n").encode()
    durable.write_local(Path(output) / "error.txt", lambda f: f.write(text))


def main(argv=None) -> int:
    """``python -m iterreduce.master JOB.json``: serve one job, then exit (0 on success,
    :data:`EXIT_DATA_ERROR` when the data cannot be used, 1 on any other job error)."""
    ap = argparse.ArgumentParser(prog="iterreduce.master")
    ap.add_argument("job", help="JSON file with the MasterConfig fields (the token may come from $ITERREDUCE_TOKEN)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=log_level(), format="%(asctime)s master %(levelname)s %(message)s")
    follow_launcher(on_orphaned=jobfolders.remove_orphaned)
    try:
        job = json.loads(Path(args.job).read_text())
        job.setdefault("token", os.environ.get("ITERREDUCE_TOKEN", ""))
        config = MasterConfig.from_dict(job, source=args.job)
        check_token(config.token, f"{args.job}: token (or $ITERREDUCE_TOKEN)")
    except (OSError, ValueError) as exc:  # no config, so no output directory for error.txt
        log.error("job failed: %s", exc)
        return 1

    try:
        Master(config).serve_and_run(on_serving=lambda address: publish_address(config.output, address))
        return 0
    except (*JOB_ERRORS, OSError) as exc:  # OSError: e.g. the output's disk is full
        log.error("job failed: %s", exc)
        with contextlib.suppress(OSError):  # on a full disk this may fail too: the log has it
            write_error(config.output, exc)
        log_failure(config.output, exc)
        return EXIT_DATA_ERROR if isinstance(exc, DataError) else 1
