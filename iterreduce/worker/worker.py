"""The IterativeReduce worker: fetch a superstep, compute per shard, push the update."""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import threading
import time
from concurrent import futures

import grpc
import numpy as np

from .. import log_level
from ..exceptions import DataError
from ..process import jobfolders
from ..process.lifeline import follow_launcher
from ..process.memory import keep_freed_memory, peak_rss_bytes
from ..program import Update, WorkerProgram, load_class, master_side, shard_seed, step_from_json
from ..proto import iterreduce_pb2 as pb
from ..transport import exchange, wire
from ..transport.security import TlsCredentials, TokenError, check_token, open_channel
from ..transport.sharedmem import SharedFolder
from .collective import Collective
from .masterlink import MasterLink

log = logging.getLogger("iterreduce.worker")

#: A worker's exit status when its master cannot be reached (it ended, or is unreachable).
EXIT_MASTER_GONE = 3



class Worker:
    """One worker process's loop. ``name`` is its stable identity across restarts; with ``tls``
    it connects over mutual TLS (on YARN), without it in plaintext (the local loopback cluster).

    With ``peer_host`` it also serves the Peer service (on ``peer_bind``, default
    ``peer_host``), so the master can have it reduce its rows of each update
    (:mod:`iterreduce.transport.exchange`); without, the master reduces this worker's updates itself. After
    an exchange, where the task names the next step, it computes that step's updates while its
    push is on its way and the master ends the step (:meth:`_run_ahead`).

    Its parts: ``link`` (:class:`~iterreduce.worker.masterlink.MasterLink`: its calls to the master)
    and, once registered, ``collective`` (:class:`~iterreduce.worker.collective.Collective`: its
    sends to the other workers in an exchange)."""

    def __init__(self, address: str, token: str, name: str, device: str = "cpu", resources: dict | None = None,
                 tls: TlsCredentials | None = None, peer_host: str | None = None, peer_bind: str | None = None):
        # Mutual TLS with ``tls``: the master must present ``tls.cert``, and so does this worker.
        self.channel = open_channel(address, tls, wire.MAX_MESSAGE_BYTES)
        self.link = MasterLink(self.channel, token, SharedFolder.from_environment())
        self.name = name
        self.device = device
        self.resources = resources or {}
        self.parameters: dict[str, np.ndarray] = {}
        self.versions: dict[str, int] = {}
        self.shards: dict[int, object] = {}  # what the program's load_shard gave
        self.status: dict = {"state": "starting"}
        self.worker_id = ""  # the master's name for this incarnation, once registered
        self._beating: threading.Thread | None = None  # the heartbeats, from the first registration on
        self._stop = threading.Event()
        self.token, self.tls = token, tls
        self.peer_address = ""
        self._peer_server: grpc.Server | None = None
        self.inbox = exchange.Inbox()
        if peer_host:
            keep_freed_memory()  # parts arrive in fresh buffers every sync, as updates do at the master
            self._peer_server, self.peer_address = exchange.serve(self.inbox, token, peer_bind or peer_host,
                                                                  peer_host, tls)
        self.collective: Collective | None = None  # this worker's sends in the exchange, once registered
        self.reducer = None  # the master-side program, for the rows this worker reduces
        self._kept: dict[tuple[int, int], Update] = {}  # (step, shard) -> update, while a step may be redone
        self._results: dict[int, tuple[int, int, dict]] = {}  # round -> (parts, part, this reducer's result)
        # The push that ends an exchange, with the fetch of the next task, runs here while this worker
        # computes ahead (see _run_ahead); its updates wait in _ahead, with what they guessed.
        self._calls = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="push")
        self._ahead: tuple[tuple, list[Update], float, dict] | None = None

    def register(self) -> None:
        reply = self.link.register(pb.RegisterRequest(
            worker_name=self.name, host=self.resources.get("host") or socket.gethostname(), pid=os.getpid(),
            resources_json=json.dumps(self.resources), peer_address=self.peer_address))
        self.worker_id = reply.worker_id
        # The master may be a new one (or have dropped this worker): the versions and results it knew are not ours.
        self.parameters, self.versions, self._ahead, self._results = {}, {}, None, {}
        if self.collective is not None:
            self.collective.close()
        self.heartbeat_interval = reply.heartbeat_interval_s
        if self._beating is None:  # before the program loads: its imports may take seconds
            self._beating = threading.Thread(target=self._heartbeat, daemon=True)
            self._beating.start()
        self.float16 = reply.float16_wire
        self.collective = Collective(self.worker_id, exchange.Peers(self.worker_id, self.token, self.tls), self.inbox,
                                     self.float16)
        program_cls = load_class(reply.program)
        worker_cls = load_class(program_cls.worker_class)
        config = json.loads(reply.program_config_json)
        self.program: WorkerProgram = worker_cls(config, device=self.device)
        self.reducer = program_cls(config)
        log.info("registered as %s", self.worker_id)

    def _heartbeat(self) -> None:
        """Tell the master this worker lives, every interval it did not hear from it otherwise (a
        finished fetch or push also counts at the master: with a sync a second, heartbeats would
        double its calls)."""
        while not self._stop.wait(self.heartbeat_interval):
            if time.monotonic() - self.link.heard < self.heartbeat_interval:
                continue
            try:
                reply = self.link.heartbeat(self.worker_id, self.status)
                if not reply.known:
                    log.warning("master no longer knows %s", self.worker_id)
                # A round the master has left (its exchange failed) will not complete: stop waiting for it.
                self.inbox.abandon_before(reply.round)
            except grpc.RpcError as exc:
                log.warning("heartbeat failed: %s", exc.code())

    def run(self) -> int:
        """Work until the master says the job is done; returns the exit code."""
        self.register()
        try:
            task = None  # the next task, when the last push brought it (see _push), or its future (_exchange)
            while True:
                try:
                    if isinstance(task, futures.Future):
                        task = task.result()
                    header, arrays = task if task is not None else self._fetch()
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    # Dropped by the master (e.g. it presumed us lost): rejoin as a new incarnation.
                    log.warning("master dropped this worker; registering again")
                    task = None
                    self.register()
                    continue
                task = None
                if header.kind == pb.TaskHeader.DONE:
                    log.info("job done; peak resident memory %.0f MiB", peak_rss_bytes() / 2**20)
                    return 0
                if header.kind == pb.TaskHeader.WAIT:
                    continue
                ahead_s, joined = self._take_ahead(header)
                self._take_gathered(header, joined)
                rows = {k[len(exchange.ROWS_PREFIX):]: arrays.pop(k) for k in list(arrays)
                        if k.startswith(exchange.ROWS_PREFIX)}  # a reducer's order
                kept = self._rows_kept(header)
                rows = None if kept is None else {**rows, **kept}  # None: the exchange fails, the step runs as a star
                self.parameters.update(arrays)
                self.versions.update(header.versions)
                try:
                    updates = self._compute(header, ahead_s)
                except DataError as exc:
                    # Another process would read the same bytes: report it, and the master
                    # ends the job (the next fetch says DONE) instead of retrying it.
                    log.error("bad data: %s", exc)
                    self.link.report_data_error(pb.DataErrorReport(
                        worker_id=self.worker_id, step=header.step, shard=self.status.get("shard", -1),
                        message=str(exc)))
                    continue
                pushing = time.perf_counter()
                if header.reducers:
                    task = self._exchange(header, updates, rows)
                else:
                    task = self._push(header, updates)
                log.debug("step %d: compute %.4f s, push (and the next task with it) %.4f s", header.step,
                          self.compute_s, time.perf_counter() - pushing)
        finally:
            self._stop.set()
            self._calls.shutdown(wait=False, cancel_futures=True)
            self.link.close()
            if self.link.offered is not None:
                self.link.offered.close()
            if self.collective is not None:
                self.collective.close()
            if self._peer_server is not None:
                self._peer_server.stop(grace=1.0)

    def _fetch(self):
        """The next task's header and arrays."""
        return self.link.fetch(self.worker_id, self.versions)

    def _compute(self, header, ahead_s: float = 0.0) -> list[Update]:
        """This task's updates, one a shard (those computed already, kept or ahead, are not computed
        again), or one for all its shards where the task says to combine them (TaskHeader.combine);
        ``ahead_s``: the seconds they took ahead, counted in this step's compute time."""
        step = step_from_json(header.info_json)
        started = time.perf_counter()
        for shard in header.shards:
            if shard.index not in self.shards:
                self.status = {"state": "computing", "step": header.step, "phase": step.phase, "shard": shard.index}
                self.shards[shard.index] = self.program.load_shard(shard.uri, shard.index)
        # A step run again after a failed exchange keeps what it computed: same parameters, same update.
        todo = [shard.index for shard in header.shards if (header.step, shard.index) not in self._kept]
        if todo:
            self.status = {"state": "computing", "step": header.step, "phase": step.phase, "shard": todo[0]}
        shards, seeds = [self.shards[i] for i in todo], [shard_seed(header.seed, header.step, i) for i in todo]
        if header.combine and len(todo) > 1 and not header.reducers:  # a star round: nothing to keep
            updates, self._kept = [self.program.run_combined(step, self.parameters, shards, seeds)], {}
        else:
            computed = dict(zip(todo, self.program.run_shards(step, self.parameters, shards, seeds))) if todo else {}
            updates = [computed[s.index] if s.index in computed else self._kept[(header.step, s.index)]
                       for s in header.shards]
            # Kept until the step ends, in case it has to be run again; a star step is never run again.
            self._kept = {(header.step, u.shard): u for u in updates} if header.reducers else {}
        self.status = {"state": "pushing", "step": header.step}
        self.compute_s = time.perf_counter() - started + ahead_s
        return updates

    def _push(self, header, updates: list[Update], arrays: dict | None = None, float16: bool | None = None,
              **fields):
        """Push to the master: the updates' results, and ``arrays`` (default: the updates' tensors,
        named ``<shard>/<array>``); ``fields`` go into the :class:`UpdateHeader`. Returns the next
        task when it came with the push, else None (see :meth:`MasterLink.push`)."""
        results = [pb.ShardResult(index=u.shard, samples=u.samples, metrics_json=json.dumps(u.metrics)) for u in updates]
        # A combined update (Update.combined): the other shards it stands for report without samples.
        results += [pb.ShardResult(index=s) for u in updates for s in u.combined]
        if arrays is None:
            arrays = {f"{u.shard}/{k}": v for u in updates for k, v in u.arrays.items()}
        first = pb.UpdateHeader(worker_id=self.worker_id, step=header.step, round=header.round,
                                results=results, compute_s=self.compute_s,
                                combined=any(u.combined for u in updates), **fields)
        return self.link.push(first, arrays, self.float16 if float16 is None else float16, self.versions)

    # ------------------------------------------------------------ the reduce on the workers

    def _exchange(self, header, updates: list[Update], parameters: dict | None):
        """Send reducer j rows j of each update; a reducer (``header.part`` >= 0) then reduces its
        rows of the round's shards and shares them, straight or through the grid (``header.columns``).
        One push to the master: this worker's results (no update tensors: they went to the
        reducers), with its block of the result."""
        self.status = {"state": "scattering", "step": header.step}
        named = {f"{u.shard}/{k}": v for u in updates for k, v in u.arrays.items()}
        samples = {u.shard: u.samples for u in updates}
        if parameters is None:
            error = f"the rows of {sorted(header.rows_kept)} from round {header.rows_round} are not held"
        elif not exchange.can_cut(named):
            error = "an update holds an array without rows (0-d)"
        else:
            error = self.collective.scatter(header, named, samples)
        if error or header.part < 0:
            return self._push(header, updates, arrays={}, scattered=True, exchange_error=error)
        result, error = self._reduce(header, parameters)
        undelivered = []
        if not error:  # kept: the next task may say to read its rows from here (TaskHeader.rows_kept)
            self._results = {r: kept for r, kept in self._results.items() if r >= header.round - 3}
            self._results[header.round] = (len(header.reducers), header.part, result)
            shared = {k: v for k, v in result.items() if not master_side(k)}
            undelivered, error = self.collective.all_gather(header, shared)
        push = dict(arrays={} if error else result, float16=False, scattered=True, reduced=not error,
                    part=header.part, undelivered=undelivered, exchange_error=error)
        if error or not header.ahead_info_json:
            return self._push(header, updates, **push)
        # The push, and the fetch when the task did not come with it, go on while this worker computes
        # the next step from what the all-gather brings: the master's end of the step is off the sync.
        pending = self._calls.submit(lambda: self._push(header, updates, **push) or self._fetch())
        self._run_ahead(header, list(shared), pending)
        return pending

    def _run_ahead(self, header, names: list[str], pending: futures.Future) -> None:
        """Compute this worker's updates for the step after ``header``'s (``header.ahead_info_json``,
        see :meth:`iterreduce.program.Program.runs_ahead`) from its parameters and the arrays
        ``names`` this round's all-gather brings, unless the master's next task (``pending``) comes
        first. Kept in ``_ahead`` with what they assumed; :meth:`_take_ahead` uses them only if the
        task says the same."""
        self._ahead = None
        pieces = []
        for part in range(len(header.reducers)):
            piece = None
            # A failed round never completes (it is abandoned), and the master's answer ends the wait too.
            while piece is None and not answered(pending) and not self.inbox.abandoned(header.round):
                piece = self.inbox.wait(header.round, exchange.REDUCED, part, names, timeout=0.05)
            if piece is None:
                return
            pieces.append(piece)
        if answered(pending):  # the task is in already: computing what it says costs the same
            return
        following = step_from_json(header.ahead_info_json)
        started, updates = time.perf_counter(), []
        try:
            joined = exchange.join_rows(pieces)
            parameters = {**self.parameters, **joined}
            indices = [shard.index for shard in header.shards]
            self.status = {"state": "computing", "step": header.step + 1, "phase": following.phase,
                           "shard": indices[0], "ahead": True}
            updates = self.program.run_shards(following, parameters, [self.shards[i] for i in indices],
                                              [shard_seed(header.seed, header.step + 1, i) for i in indices])
        except Exception as exc:  # noqa: BLE001 - a guess: the task's own run raises what is real
            log.info("step %d: computing ahead gave up (%s)", header.step + 1, exc)
            return
        guess = (header.step + 1, header.ahead_info_json, header.seed, [s.index for s in header.shards],
                 header.round, len(header.reducers), sorted(names))
        self._ahead = (guess, updates, time.perf_counter() - started, joined)

    def _take_ahead(self, header) -> tuple[float, dict | None]:
        """Keep the updates computed ahead (:meth:`_run_ahead`) when ``header`` is the task they
        guessed: the same step, shards and seed, the parameters those of the all-gather they read
        (every array delivered, none sent). Returns the seconds they took and the gathered arrays
        they joined ((0, None): none kept)."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return 0.0, None
        guess, updates, seconds, joined = ahead
        task = (header.step, header.info_json, header.seed, [s.index for s in header.shards],
                header.gathered_round, header.gathered_parts, sorted(header.gathered))
        if task != guess or header.versions:
            log.info("step %d: the updates computed ahead do not match the task; computing again", header.step)
            return 0.0, None
        self._kept.update({(header.step, u.shard): u for u in updates})
        return seconds, joined

    def _reduce(self, header, parameters: dict) -> tuple[dict, str]:
        """Reduce this worker's rows (block ``header.part``) of the round's shards' updates from
        ``parameters`` (its rows of them, at full precision); returns the result and an error or ""."""
        step = step_from_json(header.info_json)
        self.status = {"state": "reducing", "step": header.step}
        started = time.perf_counter()
        shards = list(header.reduce_shards)
        names = [f"{shard}/{name}" for shard in shards for name in step.arrays]
        # Waits for the slowest sender, however long its compute; gives up when the master abandons
        # the round (its exchange failed: the next heartbeat says so).
        rows = self.inbox.wait(header.round, exchange.UPDATE, header.part, names, timeout=None)
        if rows is None:
            return {}, f"rows of shards {shards} did not all arrive"
        samples = self.inbox.samples(header.round, exchange.UPDATE, header.part)
        for name, array in rows.items():  # as the master checks whole updates in a star round
            want = parameters.get(name.split("/", 1)[1])
            if want is not None and (array.shape != want.shape or array.dtype != want.dtype):
                return {}, (f"shard {name.split('/', 1)[0]} sent rows of {name.split('/', 1)[1]} as "
                                f"{array.dtype}{list(array.shape)}, expected {want.dtype}{list(want.shape)}")
        updates = [Update(shard, samples[shard], {name: rows[f"{shard}/{name}"] for name in step.arrays})
                   for shard in shards]
        try:
            result = self.reducer.reduce(step, parameters, updates)
        except (ValueError, TypeError, KeyError) as exc:  # the master's own reduce will say it in the rerun
            return {}, f"the reduce failed on block {header.part}: {exc}"
        log.debug("round %d: block %d reduced in %.3f s", header.round, header.part, time.perf_counter() - started)
        return result, ""

    def _rows_kept(self, header) -> dict | None:
        """This reducer's rows the master did not send again (``header.rows_kept``): its own of the
        result it reduced in round ``header.rows_round``; None when it does not hold them (never
        guess: a reduce missing a master-only array would run on without it)."""
        if not header.rows_kept:
            return {}
        parts, part, result = self._results.get(header.rows_round, (0, -1, {}))
        if (parts, part) != (len(header.reducers), header.part) or any(k not in result for k in header.rows_kept):
            log.warning("round %d: the rows of %s from round %d are not held here", header.round,
                        sorted(header.rows_kept), header.rows_round)
            return None
        return {k: result[k] for k in header.rows_kept}

    def _take_gathered(self, header, joined: dict | None = None) -> None:
        """The arrays the master says the reducers delivered (``header.gathered``): join their parts,
        unless ``joined`` holds them already (joined to compute ahead, see :meth:`_take_ahead`)."""
        if header.gathered:
            if joined is None:
                pieces = []
                for j in range(header.gathered_parts):
                    part = self.inbox.wait(header.gathered_round, exchange.REDUCED, j, header.gathered, timeout=0)
                    if part is None:  # the master counted a delivery that did not happen: a bug, never guess
                        raise RuntimeError(f"round {header.gathered_round}: part {j} of {sorted(header.gathered)} "
                                           f"is not in the inbox")
                    pieces.append(part)
                joined = exchange.join_rows(pieces)
            self.parameters.update(joined)
            self.versions.update(header.gathered)
        self.inbox.drop_before(header.round)
        self._kept = {key: u for key, u in self._kept.items() if key[0] == header.step}


def answered(pending: futures.Future) -> bool:
    """Whether the master's next task is in (a WAIT is no answer: the master is still ending the step,
    e.g. scoring a validation set)."""
    if not pending.done():
        return False
    if pending.exception() is not None:
        return True
    header, _ = pending.result()
    return header.kind != pb.TaskHeader.WAIT


def main(argv=None) -> int:
    """``python -m iterreduce.worker --master HOST:PORT --name NAME`` (token in $ITERREDUCE_TOKEN)."""
    ap = argparse.ArgumentParser(prog="iterreduce.worker")
    ap.add_argument("--master", required=True, help="host:port of the master")
    ap.add_argument("--name", required=True, help="stable worker name (kept across restarts)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--peer-host", help="serve the Peer service on this host (the master may then have this "
                                        "worker reduce its rows of each update); default: serve none")
    args = ap.parse_args(argv)
    logging.basicConfig(level=log_level(), format=f"%(asctime)s {args.name} %(levelname)s %(message)s")
    follow_launcher(on_orphaned=jobfolders.remove_orphaned)  # the launcher's cleanup, where it died
    token = os.environ.get("ITERREDUCE_TOKEN", "")
    try:  # an empty token would let callers without one into the Peer service
        check_token(token, "$ITERREDUCE_TOKEN")
    except TokenError as exc:
        log.error("%s", exc)
        return 1
    try:
        return Worker(args.master, token, args.name, args.device, peer_host=args.peer_host).run()
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            log.error("master at %s is gone: %s", args.master, exc.details())
            jobfolders.remove_if_launcher_gone()  # both killed together: the workers are the job's last processes
            return EXIT_MASTER_GONE
        log.error("RPC failed: %s %s", exc.code(), exc.details())
        return 1
