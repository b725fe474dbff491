"""The IterativeReduce master: runs a program's schedule over gRPC workers.

Each superstep: workers fetch the step and the parameters they lack, compute one
update per shard they hold, and push it back; the master reduces the updates (in
shard order), logs a progress line and checkpoints. A worker that misses its
heartbeats is dropped: the step completes without its shards (the average is
renormalised over the shards that reported) and its shards move to live workers
until a worker of the same name registers again.

With ``reduce = "workers"`` (and a program whose reduce is elementwise) the workers
reduce the updates among themselves, each its own rows (:mod:`iterreduce.exchange`),
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

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from . import checkpoint, exchange, log_level, runlog, wire
from .lifeline import follow_launcher
from .memory import keep_freed_memory
from .program import MASTER_ONLY, MASTER_STATE, Program, Update, load_class, master_side, step_to_json
from .proto import iterreduce_pb2 as pb
from .proto import iterreduce_pb2_grpc as pb_grpc
from .security import TlsCredentials, TokenInterceptor, check_token, server_credentials
from .readers import shard_info
from .webui import ViewServer
from .exceptions import DataError, IterReduceError, JobFailed

log = logging.getLogger("iterreduce.master")

#: The master's exit status when the job stopped on unusable data (1: any other job error).
EXIT_DATA_ERROR = 2

#: Errors that fail the job with their message (bad input or a program's refusal), not as a crash.
JOB_ERRORS = (IterReduceError, ValueError, TypeError, KeyError)

#: where a step's updates are reduced: by the master, or by the workers among themselves
REDUCE_CHOICES = ("master", "workers")
#: after this many failed exchanges in a row the master reduces for the rest of the job (the
#: workers cannot reach each other, e.g. a firewall between the nodes: each try costs time)
EXCHANGE_TRIES = 2
#: the most heartbeats a second the master takes from all its workers: one costs it about 0.3 ms of
#: CPU (benchmarks/RESULTS.md), so a thousand workers beating every second would keep a third of a
#: core busy. Past this the interval grows with the workers (see :func:`heartbeat_timing`).
HEARTBEATS_PER_S = 100
#: heartbeats a worker may miss, at a stretched interval, before it is presumed lost
MISSED_HEARTBEATS = 3
#: the longest a worker's request for a task waits for work before the answer is WAIT (ask again)
LONG_POLL_S = 5.0


def new_run_id() -> str:
    """A fresh run id (see :attr:`MasterConfig.run_id`): 32 random hex digits."""
    return uuid.uuid4().hex


def heartbeat_timing(interval: float, timeout: float, workers: int) -> tuple[float, float]:
    """The heartbeat interval the master hands its workers and the silence after which it drops
    one: ``interval`` and ``timeout`` as configured, unless ``workers`` beating every ``interval``
    would send more than :data:`HEARTBEATS_PER_S`; then the interval stretches to keep that rate,
    and the timeout to at least :data:`MISSED_HEARTBEATS` intervals."""
    if workers <= interval * HEARTBEATS_PER_S:
        return interval, timeout
    stretched = workers / HEARTBEATS_PER_S
    return stretched, max(timeout, MISSED_HEARTBEATS * stretched)


@dataclass
class MasterConfig:
    """Everything the master needs; JSON-friendly (the launcher writes it to a file)."""

    program: str
    program_config: dict
    shards: list[str]
    workers: int
    token: str = field(repr=False)  # never in a log, a traceback or an error message
    output: str
    seed: int = 0
    host: str = "127.0.0.1"   # the address to bind ("0.0.0.0" in a YARN container)
    port: int = 0
    advertise_host: str | None = None  # the host workers dial, when it differs from ``host``
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    checkpoint_keep: int = 2
    resume: bool = False      # the user's: continue from the newest checkpoint of this job, whichever run wrote it
    #: This run's identity (a submission's, or a new local run's): written in every checkpoint it
    #: takes, so that a restart of the same run (``resume_own``) can tell its own from another's.
    run_id: str = ""
    #: A restart of this same run (a new attempt of its YARN application master): continue from
    #: the newest checkpoint of this job whose header carries ``run_id``; none: start at step 0.
    #: Another submission's checkpoints of the same job, in the same folder, are never resumed.
    resume_own: bool = False
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    start_timeout: float = 300.0
    float16_wire: bool = False
    reduce: str = "master"  # where the updates are reduced: "master", or "workers" (see iterreduce.exchange)
    name: str = ""          # the job's name, shown on its page
    ui: bool = True         # serve the job's live page (iterreduce.webui) while it runs
    ui_host: str = "127.0.0.1"  # the page's bind address: this machine only (on YARN too: skein's AM proxies it)
    ui_port: int = 0

    def __post_init__(self):
        if self.reduce not in REDUCE_CHOICES:
            raise ValueError(f"reduce = {self.reduce!r}: expected one of {', '.join(map(repr, REDUCE_CHOICES))}")

    def to_dict(self) -> dict:
        """The fields as a JSON-friendly dict (what :meth:`from_dict` reads back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, source: str = "job file") -> MasterConfig:
        """A config from a dict such as a JSON job file; raises ``ValueError`` naming
        ``source`` and any unknown or missing key (a typo must not be silently ignored)."""
        if not isinstance(d, dict):
            raise ValueError(f"{source}: expected a JSON object of MasterConfig fields, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{source}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}")
        required = {f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        missing = sorted(required - set(d))
        if missing:
            raise ValueError(f"{source}: missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
        return cls(**d)


@dataclass
class WorkerInfo:
    worker_id: str
    name: str
    host: str
    shards: set[int] = field(default_factory=set)
    last_seen: float = field(default_factory=time.monotonic)
    alive: bool = True
    status: dict = field(default_factory=dict)
    peer_address: str = ""  # its Peer service ("": it cannot reduce rows)
    samples_per_s: float | None = None  # its shards' samples over its compute time, in its last push


class Master(pb_grpc.MasterServicer):
    """Holds the job's state; :meth:`run` drives the schedule, the RPCs serve workers."""

    def __init__(self, config: MasterConfig):
        self.config = config
        self.out = Path(config.output)
        self.out.mkdir(parents=True, exist_ok=True)
        self.shards = shard_info(config.shards)
        program_cls = load_class(config.program)
        self.program: Program = program_cls(config.program_config)
        self.steps = list(self.program.schedule(self.shards))
        # What a checkpoint must match to be resumed: same program, config, seed, data and schedule.
        self.run_id = config.run_id  # in every checkpoint; a resume of another run's checkpoint continues that run
        self.fingerprint = hashlib.sha256(json.dumps(
            [config.program, config.program_config, config.seed, [(s["rows"], s["features"]) for s in self.shards],
             [step_to_json(st) for st in self.steps]], sort_keys=True, default=str).encode()).hexdigest()
        mutex = threading.RLock()
        # One lock, two conditions: ``lock`` wakes the step's driver (and the start, waiting for
        # workers); ``_work`` wakes the FetchTask long-polls, and only when there may be new work
        # for them (a step starts, shards move, the job ends). A push wakes the driver alone: with
        # one condition, each of N pushes woke all N waiting fetches, N^2 wake-ups a step.
        self.lock = threading.Condition(mutex)
        self._work = threading.Condition(mutex)
        self.workers: dict[str, WorkerInfo] = {}
        self.names: list[str] = []  # registration order of worker names: decides home shards
        self.owner: dict[int, str | None] = {i: None for i in range(len(self.shards))}
        self.current = -1
        self.expected: set[int] = set()
        self.in_flight: dict[int, str] = {}
        self.results: dict[int, Update] = {}
        self.compute_s: dict[str, float] = {}
        self.done = False
        self.parameters: dict[str, np.ndarray] = {}
        # Each value the master gives an array (initial, a reduce, a program's hook) gets a new version,
        # from one clock: a worker holding an older one is sent the array (see _new_version).
        self.versions: dict[str, int] = {}
        self._clock = -1  # the initial parameters are version 0
        self._incarnation = 0
        # name -> (version, array, its TaskChunk messages serialized): the broadcast is encoded once
        # per new parameter value and the same bytes are sent to every worker (see _encoded).
        self._wire_cache: dict[str, tuple[int, np.ndarray, list[bytes]]] = {}
        self._wire_lock = threading.Lock()
        self.failure: DataError | None = None  # a worker's report of unusable data: ends the job
        # The reduce on the workers (iterreduce.exchange). A round is one attempt at a step.
        self.round = 0
        self.reducers: list[str] = []            # worker ids of this round's reducers; empty: a star round
        self._reducer_index: dict[str, int] = {}  # the same, worker id -> its part
        self._reduce_shards: list[int] = []      # the shards the reducers reduce: the round's expected ones
        self._columns = 0                        # the exchange's grid (0: straight sends; see exchange.grid_columns)
        self._shard_reducer: dict[int, int] = {}  # a grid round's shards -> the reducer (index) computing each
        # The round's layout as the TaskHeader carries it (reducers, reduce_shards, columns,
        # shard_reducers), sent only to workers that do not hold its version; a new layout, a new one.
        self._layout: dict = {}
        self._layout_version = 0
        self._layout_key: tuple = ()
        self._reads: dict = {}                   # the parameters the reducers read (rows of them each)
        self._ahead = ""                         # the next step's info, when workers may run ahead to it
        self._ahead_since: float | None = None   # when the workers could start the step they ran ahead to
        self.reduced: dict[int, tuple[dict, list[str]]] = {}  # part -> (rows, reducers not delivered to)
        self.reporter: dict[int, str] = {}       # shard -> the worker whose result is in
        self.exchange_error: str | None = None   # why this round's exchange failed
        self.gathered: dict[str, dict[str, int]] = {}  # worker -> arrays its peers delivered: version
        self._gathered_round = (0, 0)            # (round, parts) of those deliveries
        # worker -> (parts, part, round, {name: version}): its rows of the result it reduced in the
        # last round that succeeded; rows of them still current are not sent again
        self._rows_held: dict[str, tuple[int, int, int, dict[str, int]]] = {}
        self._failed_exchanges = 0               # in a row; at EXCHANGE_TRIES the master reduces from then on
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
        # Called with each superstep's progress record (e.g. to report progress to YARN).
        self.listeners: list = []
        self.registrations: dict[str, int] = {}  # worker name -> processes registered under it
        self.view: ViewServer | None = None      # the live page, while serving
        # The live page's path secret (None: none); set where a proxy alone is told it (on YARN).
        self.view_secret: str | None = None

    # ------------------------------------------------------------ shards

    def _home(self, name: str) -> set[int]:
        """Shards K, K+N, ... of worker K: K from a name ``<prefix>-K`` (as launchers name
        workers, so a restart, in any order, gets the same shards), else registration order."""
        prefix, _, suffix = name.rpartition("-")
        k = int(suffix) if prefix and suffix.isdigit() else self.names.index(name)
        return {s for s in self.owner if s % self.config.workers == k} if k < self.config.workers else set()

    def _live(self) -> list[WorkerInfo]:
        return [w for w in self.workers.values() if w.alive]

    def _assign_orphans(self) -> None:
        """Give shards without a live owner to the least-loaded live workers."""
        live = self._live()
        if not live:
            return
        for shard, owner in sorted(self.owner.items()):
            if owner is None or not self.workers[owner].alive:
                target = min(live, key=lambda w: (len(w.shards), w.name))
                if owner is not None:
                    self.workers[owner].shards.discard(shard)
                target.shards.add(shard)
                self.owner[shard] = target.worker_id
                self._moved(shard)
                log.info("shard %d -> %s", shard, target.worker_id)
                self._work.notify_all()  # its new owner may have work now

    def _moved(self, shard: int) -> None:
        """``shard`` changed hands (call with the lock held). In a grid round a relay waits for its
        rows from the reducer that had it (see :mod:`iterreduce.exchange`): the exchange cannot end."""
        if self._columns and shard in self._shard_reducer and shard not in self.results:
            self._exchange_failed(f"shard {shard} changed hands during the exchange")

    # --------------------------------------------------------------- RPCs

    def Register(self, request, context):
        with self.lock:
            name = request.worker_name or f"anonymous-{len(self.names)}"
            for w in self.workers.values():
                if w.name == name and w.alive:  # a restarted process replaces its predecessor
                    self._drop(w, "replaced by a new process of the same name")
            if name not in self.names:
                self.names.append(name)
            self.registrations[name] = self.registrations.get(name, 0) + 1
            self._incarnation += 1
            worker = WorkerInfo(f"{name}#{self._incarnation}", name, request.host, peer_address=request.peer_address)
            self.workers[worker.worker_id] = worker
            # Take back this name's home shards unless another worker is computing them right now.
            for shard in self._home(name):
                owner = self.owner[shard]
                if shard in self.in_flight and owner and self.workers[owner].alive:
                    continue
                if owner:
                    self.workers[owner].shards.discard(shard)
                self._moved(shard)
                worker.shards.add(shard)
                self.owner[shard] = worker.worker_id
            self._assign_orphans()
            log.info("registered %s from %s (pid %d) with shards %s", worker.worker_id, request.host,
                     request.pid, sorted(worker.shards))
            self._event("worker_registered", worker=worker.worker_id, host=request.host, shards=sorted(worker.shards))
            self._notify_all()
        return pb.RegisterReply(
            worker_id=worker.worker_id, program=self.config.program,
            program_config_json=json.dumps(self.config.program_config),
            heartbeat_interval_s=self.heartbeat_interval, float16_wire=self.config.float16_wire,
        )

    def Heartbeat(self, request, context):
        with self.lock:
            worker = self.workers.get(request.worker_id)
            if worker is None or not worker.alive:
                return pb.HeartbeatReply(known=False)
            worker.last_seen = time.monotonic()
            if request.status_json:
                worker.status = json.loads(request.status_json)
            return pb.HeartbeatReply(known=True, round=self.round)

    def FetchTask(self, request, context):
        yield from self._task(request, context)

    def Sync(self, request, context):
        """A push and the next task in one call (see the proto): the task comes back only when it
        fits one message; else ``fetch`` says to ask FetchTask, and nothing was given out."""
        pushed = self._accept(iter([request.update]), context)
        messages = self._task(request.next, context, limit=wire.CHUNK_BYTES)
        if messages is None:
            return pb.SyncReply(pushed=pushed, fetch=True)
        (message,) = messages
        task = message if isinstance(message, pb.TaskChunk) else pb.TaskChunk.FromString(message)
        return pb.SyncReply(pushed=pushed, task=task)

    def Steps(self, request_iterator, context):
        """Sync on a worker's open stream: each request answered in turn (see the proto)."""
        for request in request_iterator:
            yield self.Sync(request, context)

    def _task(self, request, context, limit: int | None = None) -> list:
        """The task for ``request``'s worker, as the messages to send (serialized TaskChunks, or a
        DONE or WAIT one): waits up to :data:`LONG_POLL_S` for work. With ``limit``, one message, or None when the
        task's tensors would take more than ``limit`` bytes (nothing is given out then: the worker
        fetches it)."""
        deadline = time.monotonic() + LONG_POLL_S
        with self.lock:
            while True:
                worker = self.workers.get(request.worker_id)
                if worker is None or not worker.alive:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"unknown worker {request.worker_id}: register again")
                worker.last_seen = time.monotonic()
                if self.done or self.failure:
                    return [pb.TaskChunk(header=pb.TaskHeader(kind=pb.TaskHeader.DONE))]
                todo = sorted(s for s in worker.shards
                              if s in self.expected and s not in self.results and s not in self.in_flight)
                if todo:
                    break
                if time.monotonic() > deadline or not context.is_active():
                    return [pb.TaskChunk(header=pb.TaskHeader(kind=pb.TaskHeader.WAIT))]
                # Woken when there may be work (see ``_work``), else at the deadline: a thousand idle
                # workers' fetches must not wake the master thousands of times a second.
                self._work.wait(timeout=max(0.01, deadline - time.monotonic()))
            step_index, step = self.current, self.steps[self.current]
            stale = [k for k in self.parameters
                     if not master_side(k) and request.versions.get(k, -1) < self.versions[k]]
            # Arrays this worker's peers delivered in the last exchange are in its inbox: not sent again.
            held = self.gathered.get(worker.worker_id, {})
            gathered = {k: self.versions[k] for k in stale if held.get(k) == self.versions[k]}
            send = {k: self.parameters[k] for k in stale if k not in gathered}
            versions = {k: self.versions[k] for k in send}
            round_, layout_version = self.round, self._layout_version if self.reducers else 0
            ahead = self._ahead
            # The layout goes only to a worker that does not hold it (see TaskHeader.layout_version).
            layout = self._layout if layout_version and request.layout_version != layout_version else {}
            gathered_round, gathered_parts = self._gathered_round if gathered else (0, 0)
            part = self._reducer_index.get(worker.worker_id, -1) if self.reducers else -1
            if part in self.reduced:  # its block is in: a later task of the round carries no order
                part = -1
            rows, order = self._order(worker.worker_id, part) if part >= 0 else ({}, {})
            send.update(rows)
            if limit is not None and sum(array.nbytes for array in send.values()) > limit:
                return None
            for s in todo:
                self.in_flight[s] = worker.worker_id
        header = pb.TaskHeader(
            kind=pb.TaskHeader.RUN, step=step_index, phase=step.phase, info_json=step_to_json(step),
            shards=[pb.Shard(index=s, uri=self.shards[s]["uri"]) for s in todo],
            seed=self.config.seed, versions=versions, round=round_, layout_version=layout_version, **layout,
            gathered=gathered, gathered_round=gathered_round, gathered_parts=gathered_parts, part=part, **order,
            ahead_info_json=ahead,
        )

        def pieces():  # serialized TaskChunks: joined, they are one message with all their fields
            yield pb.TaskChunk(header=header).SerializeToString()
            for name, array in send.items():
                if name in versions:
                    yield from self._encoded(name, array, versions[name])
                else:  # a reducer's rows: its own, never shared
                    for chunk in wire.encode({name: array}):
                        yield pb.TaskChunk(tensors=[chunk]).SerializeToString()

        if limit is not None:  # one message (serialized TaskChunks joined are one), whatever the header adds
            return [b"".join(pieces())]
        # A group of one is sent as it is, not copied; the broadcast's pieces are shared, so the
        # list holds no copy of the parameters.
        return [b"".join(group) for group in wire.packed(pieces(), len)]

    def _order(self, worker_id: str, part: int) -> tuple[dict, dict]:
        """Reducer ``part``'s order (call with the lock held): its rows of what the reduce reads,
        at full precision, named ``rows:<name>``, less those it holds (its own block of the result
        it reduced in the last round that succeeded, unchanged since), and the TaskHeader's fields
        that say which rows it holds (the layout says which shards to reduce, and how)."""
        reads = exchange.rows_of(self._reads, len(self.reducers), part)
        parts_held, part_held, rows_round, held = self._rows_held.get(worker_id, (0, -1, 0, {}))
        kept = []
        if (parts_held, part_held) == (len(self.reducers), part):
            kept = sorted(k for k in reads if held.get(k) == self.versions[k])
        rows = {exchange.ROWS_PREFIX + k: v for k, v in reads.items() if k not in kept}
        return rows, {"rows_kept": kept, "rows_round": rows_round if kept else 0}

    def _encoded(self, name: str, array: np.ndarray, version: int) -> list[bytes]:
        """Parameter ``name`` at ``version`` as serialized :class:`TaskChunk` messages (what
        :func:`wire.encode` makes of it), encoded by the first fetch that needs it and shared by
        every other: N workers cost one encoding, not N. An entry holds for the very array
        object it was made from: a new value (a reduce, ``before_step``, a resume) is encoded
        again even at the same version. Parameters are replaced, never changed in place."""
        with self._wire_lock:
            cached = self._wire_cache.get(name)
            if cached is not None and cached[0] == version and cached[1] is array:
                return cached[2]
            chunks = [pb.TaskChunk(tensors=[c]).SerializeToString()
                      for c in wire.encode({name: array}, float16=self.config.float16_wire)]
            self._wire_cache[name] = (version, array, chunks)  # the one entry of this name: older ones go
            return chunks

    def PushUpdate(self, request_iterator, context):
        return self._accept(request_iterator, context)

    def _accept(self, request_iterator, context) -> pb.PushReply:
        """Take a push (its messages: a header, then tensor chunks), or say why not."""
        try:
            first = next(request_iterator)
        except StopIteration:
            return self._reject(context, "empty update stream")
        if not first.HasField("header"):
            return self._reject(context, "update stream must start with a header")
        header = first.header
        decoder = wire.Decoder()
        try:
            for message in itertools.chain([first], request_iterator):
                if message is not first and message.HasField("header"):
                    return self._reject(context, f"{header.worker_id}: second header in update stream")
                for chunk in message.tensors:
                    if len(chunk.data) > 2 * wire.CHUNK_BYTES:
                        return self._reject(context, f"{header.worker_id}: oversized tensor chunk ({len(chunk.data)} bytes)")
                    decoder.add(chunk)
            arrays = decoder.finish()
        except (wire.WireError, ValueError) as exc:
            return self._reject(context, f"{header.worker_id}: malformed update: {exc}")
        updates = {}
        for result in header.results:
            prefix = f"{result.index}/"
            updates[result.index] = Update(
                shard=result.index, samples=result.samples,
                arrays={k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)},
                metrics=json.loads(result.metrics_json or "{}"),
            )
        with self.lock:
            worker = self.workers.get(header.worker_id)
            if worker is None or not worker.alive:
                return self._reject(context, f"update from unknown or dropped worker {header.worker_id}", abort=False)
            if header.step != self.current:
                return self._reject(context, f"{header.worker_id}: update for step {header.step}, current is {self.current}", abort=False)
            if (header.scattered or header.reduced) and header.round != self.round:  # of an exchange that failed
                return self._reject(context, f"{header.worker_id}: rows of round {header.round}, the current round "
                                             f"is {self.round}", abort=False)
            if header.scattered != bool(self.reducers):
                return self._reject(context, f"{header.worker_id}: {'rows sent to reducers' if header.scattered else 'whole updates'}"
                                             f" in round {self.round}, which {'has' if self.reducers else 'has no'} reducers", abort=False)
            if header.reduced and (not 0 <= header.part < len(self.reducers) or header.part in self.reduced
                                   or self.reducers[header.part] != worker.worker_id):
                return self._reject(context, f"{worker.worker_id}: a reduced block {header.part}, not its own in "
                                             f"round {self.round}", abort=False)
            for shard, update in updates.items():
                if self.in_flight.get(shard) != worker.worker_id:
                    return self._reject(context, f"{header.worker_id}: shard {shard} was not given to it", abort=False)
                if header.scattered:  # its tensors are with the reducers, which check their shapes
                    continue
                missing = set(self.steps[self.current].arrays) - set(update.arrays)
                if missing:
                    return self._reject(context, f"{header.worker_id}: shard {shard} update lacks {sorted(missing)}")
                for name in self.steps[self.current].arrays:
                    got, want = update.arrays[name], self.parameters.get(name)
                    if want is not None and (got.shape != want.shape or got.dtype != want.dtype):
                        return self._reject(context, f"{header.worker_id}: shard {shard} sent {name} as "
                                                     f"{got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}")
            for shard, update in updates.items():
                del self.in_flight[shard]
                if shard in self.expected:
                    self.results[shard] = update
                    self.reporter[shard] = worker.worker_id
            self.compute_s[worker.worker_id] = self.compute_s.get(worker.worker_id, 0.0) + header.compute_s
            if header.compute_s > 0:
                worker.samples_per_s = sum(r.samples for r in header.results) / header.compute_s
            if header.exchange_error:
                self._exchange_failed(f"{header.worker_id}: {header.exchange_error}")
            elif header.reduced:  # in a round of the workers' reduce, a push's tensors are its block
                self.reduced[header.part] = (arrays, list(header.undelivered))
            worker.last_seen = time.monotonic()
            self.lock.notify_all()  # the step's driver: no fetcher has new work after a push
        return pb.PushReply(accepted=True)

    def _exchange_failed(self, why: str) -> None:
        """The round's exchange cannot finish: the step's driver runs it again as a star."""
        if self.reducers and self.exchange_error is None:
            self.exchange_error = why
            self.lock.notify_all()

    def ReportDataError(self, request, context):
        with self.lock:
            if self.failure is None:
                log.error("%s reports bad data in shard %d: %s", request.worker_id, request.shard, request.message)
                self._event("data_error", worker=request.worker_id, step=request.step, shard=request.shard,
                            message=request.message)
                self.failure = DataError(request.message)
            self._notify_all()
        return pb.DataErrorReply()

    def _notify_all(self) -> None:
        """Wake every waiter: the driver and the fetches (call with the lock held)."""
        self.lock.notify_all()
        self._work.notify_all()

    def _reject(self, context, reason: str, abort: bool = True):
        log.warning("rejected update: %s", reason)
        if abort:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        return pb.PushReply(accepted=False, reason=reason)

    # ------------------------------------------------------------ liveness

    def _drop(self, worker: WorkerInfo, why: str) -> None:
        """Mark ``worker`` lost: the current step goes on without its unfinished shards."""
        worker.alive = False
        lost = {s for s, w in self.in_flight.items() if w == worker.worker_id}
        for s in lost:
            self.in_flight.pop(s)
        exchanging = worker.worker_id in self.reducers
        if exchanging:  # its rows, and the parts sent to it, are gone: the step runs again as a star
            self._exchange_failed(f"{worker.worker_id} was lost ({why})")
            # Its reported results go too: their tensors were only in the exchange.
            lost |= {s for s, w in self.reporter.items() if w == worker.worker_id and s in self.expected}
        if self._live():  # others go on without its shards; if none is left, wait for a restart
            lost |= {s for s in worker.shards if s in self.expected and s not in self.results}
            self.expected -= lost
        else:
            lost = set()
        log.warning("lost %s (%s); step %d continues without shards %s", worker.worker_id, why, self.current, sorted(lost))
        self._event("worker_lost", worker=worker.worker_id, reason=why, shards_skipped=sorted(lost))
        self._assign_orphans()
        self._notify_all()

    def _monitor(self) -> None:
        period = self.heartbeat_interval / 2
        last = time.monotonic()
        while not self.done:
            time.sleep(period)
            with self.lock:
                self._check_heartbeats(time.monotonic() - last)
                last = time.monotonic()

    def _check_heartbeats(self, since_last_check: float) -> None:
        """Drop workers silent for longer than the timeout, unless the master itself was stalled."""
        now = time.monotonic()
        if since_last_check > self.heartbeat_timeout / 2:
            # The master did not run for a while (VM pause, swapping, SIGSTOP): the silence
            # is its own, so give every worker a fresh grace period instead of dropping them.
            log.warning("master stalled for %.1f s: extending heartbeat grace", since_last_check)
            for w in self._live():
                w.last_seen = now
            return
        for w in self._live():
            if now - w.last_seen > self.heartbeat_timeout:
                self._drop(w, f"no heartbeat for {now - w.last_seen:.1f} s")

    # ------------------------------------------------------------ schedule

    def _event(self, event: str, **fields) -> None:
        self._log.event(event, **fields)

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + self.config.start_timeout
        with self.lock:
            while len(self._live()) < self.config.workers:
                self._raise_failure()
                if time.monotonic() > deadline:
                    if self._live():
                        log.warning("starting with %d of %d workers", len(self._live()), self.config.workers)
                        break
                    raise JobFailed(f"no worker registered within {self.config.start_timeout:.0f} s")
                self.lock.wait(timeout=0.5)
            self._assign_orphans()

    def _raise_failure(self) -> None:
        """Stop the job on a worker's report of bad data (call with the lock held)."""
        if self.failure is not None:
            raise self.failure

    def _restore(self) -> int:
        """Initial parameters, or those of the newest checkpoint when resuming; returns the first step."""
        ckpt = None
        if self.config.resume and self.config.checkpoint_dir:
            # The newest of this job's checkpoints; else the newest of any, which is refused below.
            ckpt = (checkpoint.latest(self.config.checkpoint_dir, self.fingerprint)
                    or checkpoint.latest(self.config.checkpoint_dir))
        elif self.config.resume_own and self.config.checkpoint_dir:
            ckpt = self._own_checkpoint()
        if ckpt is None:
            if self.config.resume:
                log.warning("resume asked for, but no checkpoint in %s: starting afresh", self.config.checkpoint_dir)
            self.parameters = self.program.initial_parameters(self.config.seed, self.shards)
            self._new_version(self.parameters)
            return 0
        header, arrays = checkpoint.load(ckpt)
        if header.get("fingerprint") != self.fingerprint:
            raise JobFailed(f"{ckpt}: checkpoint is of another job (program, configuration, seed, shards or "
                            f"schedule differ); use a new output directory or drop --resume")
        self.parameters = arrays
        self._new_version(arrays)
        if self.config.resume and header.get("run"):  # the user's resume continues the run it names
            self.run_id = header["run"]
        log.info("resumed from %s at step %d of %d", ckpt, header["step"], len(self.steps))
        self._event("resumed", checkpoint=ckpt, step=header["step"])
        return int(header["step"])

    def _own_checkpoint(self) -> str | None:
        """The newest checkpoint this run (``run_id``) wrote, for a restart of it: never another
        submission's checkpoint of the same job (it would continue someone else's run)."""
        directory = self.config.checkpoint_dir
        if not self.config.run_id:
            log.warning("a restart without a run id cannot tell its own checkpoints in %s from another "
                        "submission's: starting at step 0", directory)
            return None
        ckpt = checkpoint.latest(directory, self.fingerprint, run=self.config.run_id)
        if ckpt is None:
            log.info("no checkpoint of this run (%s) in %s: starting at step 0", self.config.run_id, directory)
        return ckpt

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
            self._notify_all()
        self._event("done", steps=index + 1, seconds=time.perf_counter() - job_start)

    def _new_version(self, arrays) -> None:
        """Mark the values of ``arrays`` (names) as new: a version later than any given out."""
        self._clock += 1
        for name in arrays:
            self.versions[name] = self._clock

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
        with self.lock:
            self.current = index
            self._start_round(step, peers=self._peer_reduce(step))
            while True:
                self._collect_results()
                reduce_start = time.perf_counter()
                reduced = self._reduce_on_workers(step) if self.reducers else None
                if reduced is not None or not self.reducers:
                    break
                log.warning("step %d round %d: the exchange failed (%s); running the step again with the "
                            "master reducing", index, self.round, self.exchange_error)
                self._event("exchange_failed", step=index, round=self.round, reason=self.exchange_error)
                self._failed_exchanges += 1
                if self._failed_exchanges == EXCHANGE_TRIES:
                    log.warning("%d exchanges failed in a row: the master reduces for the rest of the job",
                                EXCHANGE_TRIES)
                    self._event("exchange_off", step=index, failed=EXCHANGE_TRIES)
                self._start_round(step, peers=False, same_shards=True)
            if self.reducers:
                self._failed_exchanges = 0
            reducers, self.reducers = len(self.reducers), []
            updates = sorted(self.results.values(), key=lambda u: u.shard)
            compute = max(self.compute_s.values(), default=0.0)
            fastest = min(self.compute_s.values(), default=0.0)
            if log.isEnabledFor(logging.DEBUG):  # a dict of every worker: only when it is logged
                log.debug("step %d: compute seconds by worker %s", index,
                          {w: round(s, 4) for w, s in sorted(self.compute_s.items())})
        if not updates:
            raise JobFailed(f"step {index} ({step.phase}): no shard reported")
        if step.arrays:
            if reduced is None:
                reduced = self.program.reduce(step, self.parameters, updates)
            self.parameters.update(reduced)
            self._new_version(reduced)  # on the workers: the version _reduce_on_workers counted their deliveries at
        evaluated = time.perf_counter()
        elapsed = evaluated - started
        self._ahead_since = evaluated if self._ahead else None
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
            compute_seconds_min=fastest))
        for listener in self.listeners:
            listener(record)

    def _peer_reduce(self, step) -> bool:
        """Whether the workers may reduce this step's updates (see :mod:`iterreduce.exchange`)."""
        return (self.config.reduce == "workers" and self._failed_exchanges < EXCHANGE_TRIES and bool(step.arrays)
                and self.program.reduces_elementwise()
                and exchange.can_cut({k: v for k, v in self.parameters.items() if not k.startswith(MASTER_STATE)}))

    def _start_round(self, step, peers: bool, same_shards: bool = False) -> None:
        """Start an attempt at the current step (call with the lock held). ``same_shards``: the
        shards expected stay those of the failed attempt (less the lost ones). With ``peers``
        (and more than one owner of the expected shards, each serving a Peer service) the
        owners reduce: each reducer's task tells it its rows and the shards to reduce."""
        self.round += 1
        self.results, self.in_flight, self.compute_s, self.reporter = {}, {}, {}, {}
        self.reduced, self.exchange_error = {}, None
        self._columns, self._shard_reducer = 0, {}
        self._assign_orphans()
        if not same_shards:
            self.expected = {s for s, w in self.owner.items() if w is not None and self.workers[w].alive}
        owners = sorted({self.owner[s] for s in self.expected if self.owner[s]}, key=lambda w: self.workers[w].name)
        peers = peers and len(owners) > 1 and all(self.workers[w].peer_address for w in owners)
        self.reducers = owners if peers else []
        self._reducer_index = {w: j for j, w in enumerate(self.reducers)}
        self._reduce_shards = sorted(self.expected)
        if self.reducers:
            self._columns = exchange.grid_columns(len(self.reducers), sum(
                self.parameters[k].nbytes for k in step.arrays if k in self.parameters))
        if self._columns:
            self._shard_reducer = {s: self._reducer_index[self.owner[s]] for s in self._reduce_shards}
        addresses = tuple((w, self.workers[w].peer_address) for w in self.reducers)
        key = (addresses, tuple(self._reduce_shards), self._columns, tuple(self._shard_reducer.values()))
        if self.reducers and key != self._layout_key:
            self._layout_version += 1
            self._layout_key = key
            self._layout = {"reducers": [pb.Reducer(worker_id=w, address=address) for w, address in addresses],
                            "reduce_shards": self._reduce_shards, "columns": self._columns,
                            "shard_reducers": list(self._shard_reducer.values())}
        # What an elementwise reduce reads: the step's arrays and the master-only ones.
        self._reads = {k: v for k, v in self.parameters.items() if k in step.arrays or k.startswith(MASTER_ONLY)}
        # The step a worker may compute while this one ends (Program.runs_ahead): only after an exchange
        # that gives every worker the new parameters, and only as a guess the next task confirms.
        following = self.steps[self.current + 1] if self.current + 1 < len(self.steps) else None
        self._ahead = (step_to_json(following) if self.reducers and following is not None
                       and self.program.runs_ahead(step, following) else "")
        self._notify_all()

    def _collect_results(self) -> None:
        """Wait until every expected shard has reported (call with the lock held)."""
        while not self.results or self.expected - set(self.results):
            self._raise_failure()
            if self.exchange_error:
                return
            if not self.expected - set(self.results):
                # Every shard was dropped before any reported: redo the step in full
                # with the workers that are (or come) back.
                self.expected = set(self.owner)
            self.lock.wait(timeout=0.5)
            if self._live():
                self._assign_orphans()

    def _reduce_on_workers(self, step) -> dict | None:
        """Wait for every reducer's block, and join them (call with the lock held); None when
        the exchange failed (``exchange_error`` says why)."""
        parts = len(self.reducers)
        while len(self.reduced) < parts and not self.exchange_error:
            self._raise_failure()
            self.lock.wait(timeout=0.5)
        if self.exchange_error:
            return None
        try:
            result = exchange.join_rows([self.reduced[j][0] for j in range(parts)])
            for name in {*step.arrays, *result}:
                want, got = self.parameters.get(name), result.get(name)
                if got is None or (want is not None and (got.shape != want.shape or got.dtype != want.dtype)):
                    raise ValueError(f"{name} came back as {'nothing' if got is None else f'{got.dtype}{list(got.shape)}'}")
        except ValueError as exc:
            self._exchange_failed(f"the reducers' rows do not make the parameters: {exc}")
            return None
        undelivered = {w for _, missed in self.reduced.values() for w in missed}
        version = self._clock + 1  # the one _run_step gives the result next (see _new_version)
        shared = {name: version for name in result if not master_side(name)}
        self.gathered = {w: shared for w in self.reducers if w not in undelivered}
        self._gathered_round = (self.round, parts)
        versions = {name: version for name in result}
        self._rows_held = {w: (parts, j, self.round, versions) for j, w in enumerate(self.reducers)}
        return result

    # --------------------------------------------------------------- the page

    def view_job(self) -> dict:
        """What the live page says of the job: name, workers asked for, program and its
        config, the schedule as runs of one phase (for the time left)."""
        runs: list[list] = []
        for step in self.steps:
            if runs and runs[-1][0] == step.phase:
                runs[-1][1] += 1
            else:
                runs.append([step.phase, 1])
        return {"name": self.config.name or self.out.name, "workers": self.config.workers,
                "program": self.config.program, "seed": self.config.seed, "shards": len(self.shards),
                "steps": len(self.steps), "schedule": runs, "config": self.config.program_config}

    def view_workers(self) -> list[dict]:
        """The live workers table: each worker name's newest process."""
        now = time.monotonic()
        with self.lock:
            newest = {}
            for w in self.workers.values():
                newest[w.name] = w  # registration order: the last one of a name is the newest
            rows = [{"name": w.name, "state": (w.status.get("state", "idle") if w.alive else "lost")
                     if not self.done else "finished",
                     "host": w.host, "shards": sorted(w.shards), "restarts": self.registrations.get(w.name, 1) - 1,
                     "samples_per_s": w.samples_per_s, "heartbeat_age_s": now - w.last_seen}
                    for w in newest.values()]
        return sorted(rows, key=lambda row: (len(row["name"]), row["name"]))

    def view_images(self) -> dict:
        """The program's images of the current parameters (a copy of the dict: steps replace values)."""
        return self.program.images(dict(self.parameters))

    def start_view(self) -> str:
        """Serve the live page (``config.ui_host``/``ui_port``, under ``view_secret`` when set);
        logs a ``ui`` event with its URL and returns it (without the secret: the log may be read
        by others; ``self.view.url`` has it)."""
        self.view = ViewServer(runlog.log_path(self.out), job=self.view_job(), spec=self.program.view(),
                               workers=self.view_workers, images=self.view_images, secret=self.view_secret)
        self.view.start(self.config.ui_host, self.config.ui_port, advertise_host=self.config.advertise_host)
        self._event("ui", url=self.view.origin)
        return self.view.origin

    # --------------------------------------------------------------- serve

    def serve(self, tls: TlsCredentials | None = None) -> tuple[grpc.Server, str]:
        """Start the gRPC server; returns it and its ``host:port``.

        With ``tls``, only clients presenting the same certificate can connect (mutual TLS);
        the token is still checked. The credentials are an argument, not a config field, so
        the key never reaches a job file.
        """
        options = [("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES)]
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4 * self.config.workers + 8),
                             interceptors=[TokenInterceptor(self.config.token)], options=options)
        add_servicer(self, server)
        bind = f"{self.config.host}:{self.config.port}"
        port = server.add_insecure_port(bind) if tls is None else server.add_secure_port(bind, server_credentials(tls))
        keep_freed_memory()
        server.start()
        threading.Thread(target=self._monitor, daemon=True).start()
        if self.config.ui and self.view is None:
            try:
                log.info("live view on %s", self.start_view())
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


def log_failure(output: str, exc: BaseException) -> None:
    """A ``failed`` event in the job's log (its page then says why the job stopped)."""
    try:
        with runlog.RunLog(runlog.log_path(output)) as run_log:
            run_log.event("failed", reason=str(exc))
    except OSError as err:
        log.warning("could not log the failure: %s", err)


def _task_chunk_bytes(message) -> bytes:
    """FetchTask's response serializer: a :class:`TaskChunk`, or one already serialized
    (the shared broadcast of :meth:`Master._encoded`), sent as it is."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def add_servicer(servicer: Master, server: grpc.Server) -> None:
    """``pb_grpc.add_MasterServicer_to_server``, built from the same service descriptor, except
    that FetchTask may yield serialized chunks (the same messages on the wire, for the same
    clients)."""
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    service = pb.DESCRIPTOR.services_by_name["Master"]
    handlers = {}
    for method in service.methods:
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        handlers[method.name] = kinds[method.client_streaming, method.server_streaming](
            getattr(servicer, method.name),
            request_deserializer=request.FromString,
            response_serializer=_task_chunk_bytes if method.name == "FetchTask" else response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    if hasattr(server, "add_registered_method_handlers"):  # grpcio >= 1.63, as the generated code does
        server.add_registered_method_handlers(service.full_name, handlers)


def main(argv=None) -> int:
    """``python -m iterreduce.master JOB.json``: serve one job, then exit (0 on success,
    :data:`EXIT_DATA_ERROR` when the data cannot be used, 1 on any other job error)."""
    import argparse
    import os

    ap = argparse.ArgumentParser(prog="iterreduce.master")
    ap.add_argument("job", help="JSON file with the MasterConfig fields (the token may come from $ITERREDUCE_TOKEN)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=log_level(), format="%(asctime)s master %(levelname)s %(message)s")
    follow_launcher()
    try:
        job = json.loads(Path(args.job).read_text())
        job.setdefault("token", os.environ.get("ITERREDUCE_TOKEN", ""))
        config = MasterConfig.from_dict(job, source=args.job)
        check_token(config.token, f"{args.job}: token (or $ITERREDUCE_TOKEN)")
    except (OSError, ValueError) as exc:  # no config, so no output directory for error.txt
        log.error("job failed: %s", exc)
        return 1

    def publish(address: str) -> None:
        # The launcher waits for this file to learn the address.
        tmp = Path(config.output) / ".master.json.tmp"
        tmp.write_text(json.dumps({"address": address, "pid": os.getpid()}))
        tmp.replace(Path(config.output) / "master.json")

    try:
        Master(config).serve_and_run(on_serving=publish)
        return 0
    except (*JOB_ERRORS, OSError) as exc:  # OSError: e.g. the output's disk is full
        log.error("job failed: %s", exc)
        with contextlib.suppress(OSError):  # on a full disk this may fail too: the log has it
            (Path(config.output) / "error.txt").write_text(str(exc) + "\n")
        log_failure(config.output, exc)
        return EXIT_DATA_ERROR if isinstance(exc, DataError) else 1


if __name__ == "__main__":
    raise SystemExit(main())
