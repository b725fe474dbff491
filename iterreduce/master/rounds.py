"""The master's rounds: its attempts at a step, and the workers' reduce within one.

A round gives the step's expected shards to their owners and takes their results back.
Where the workers reduce (:mod:`iterreduce.transport.exchange`), it also holds the exchange's layout
(the reducers, the shards they reduce, the grid), the blocks they push, and, once an
exchange succeeded, what each worker holds of its result: the master does not send that
again. An exchange that fails ends its round; the master runs the step again as a star.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..program import MASTER_ONLY, Update, master_side
from ..proto import iterreduce_pb2 as pb
from ..transport import exchange
from .membership import Membership, WorkerInfo
from .pushes import Refused

log = logging.getLogger("iterreduce.master")  # a part of the master: its records are the master's

#: after this many failed exchanges in a row the master reduces for the rest of the job (the
#: workers cannot reach each other, e.g. a firewall between the nodes: each try costs time)
EXCHANGE_TRIES = 2


class Rounds:
    """The round under way and what the workers' reduce left of the last one. Call its methods
    with the master's lock held. ``wake``: the master's condition of the step's driver (it
    waits on it here, and is woken when an exchange fails); ``event``: logs an event of the
    job (:meth:`iterreduce.storage.runlog.RunLog.event`)."""

    def __init__(self, wake: threading.Condition, event: Callable[..., None], skip_lost: bool = True):
        self._wake = wake
        self._event = event
        self.skip_lost = skip_lost  # a lost worker's unfinished shards sit the round out (else others do them)
        self.round = 0                           # the rounds started, all steps together
        self.expected: set[int] = set()          # the shards the round waits for
        self.in_flight: dict[int, str] = {}      # shard -> the worker it was given to
        self.results: dict[int, Update] = {}     # shard -> its update, once in
        self.compute_s: dict[str, float] = {}    # worker -> the compute seconds its pushes reported
        self.reporter: dict[int, str] = {}       # shard -> the worker whose result is in
        self.reducers: list[str] = []            # worker ids of this round's reducers; empty: a star round
        self.reducer_index: dict[str, int] = {}  # the same, worker id -> its part
        self.reduce_shards: list[int] = []       # the shards the reducers reduce: the round's expected ones
        self.columns = 0                         # the exchange's grid (0: straight sends; see exchange.grid_columns)
        self.shard_reducer: dict[int, int] = {}  # a grid round's shards -> the reducer (index) computing each
        # The round's layout as the TaskHeader carries it (reducers, reduce_shards, columns,
        # shard_reducers), sent only to workers that do not hold its version; a new layout, a new one.
        self.layout: dict = {}
        self.layout_version = 0
        self._layout_key: tuple = ()
        self.reads: dict = {}                    # the parameters the reducers read (rows of them each)
        self.ahead = ""                          # the next step's info, when workers may run ahead to it
        self.combine = False                     # a worker pushes one update for its shards (TaskHeader.combine)
        self.reduced: dict[int, tuple[dict, list[str]]] = {}  # part -> (rows, reducers not delivered to)
        self.exchange_error: str | None = None   # why this round's exchange failed
        self.gathered: dict[str, dict[str, int]] = {}  # worker -> arrays its peers delivered: version
        self.gathered_round = (0, 0)             # (round, parts) of those deliveries
        # worker -> (parts, part, round, {name: version}): its rows of the result it reduced in the
        # last round that succeeded; rows of them still current are not sent again
        self.rows_held: dict[str, tuple[int, int, int, dict[str, int]]] = {}
        self.failed_exchanges = 0                # in a row; at EXCHANGE_TRIES the master reduces from then on

    def start(self, step, parameters: dict, members: Membership, peers: bool, same_shards: bool = False,
              combine: bool = False) -> None:
        """Start an attempt at ``step``. ``same_shards``: the shards expected stay those of the
        failed attempt (less the lost ones). With ``peers`` (and more than one owner of the
        expected shards, each serving a Peer service) the owners reduce: each reducer's task
        tells it its rows and the shards to reduce. With ``combine``, in a round without reducers,
        a worker pushes one update for its shards (see :class:`~iterreduce.master.config.MasterConfig`).
        :attr:`ahead` starts empty: the master names the step the workers may run ahead to."""
        self.round += 1
        self.results, self.in_flight, self.compute_s, self.reporter = {}, {}, {}, {}
        self.reduced, self.exchange_error = {}, None
        self.columns, self.shard_reducer = 0, {}
        members.rebalance()  # nothing is in flight: each shard to its home worker, none to an unwanted one
        owner, workers = members.owner, members.workers
        if not same_shards:
            self.expected = {s for s, w in owner.items() if w is not None and workers[w].alive}
        owners = sorted({owner[s] for s in self.expected if owner[s]}, key=lambda w: workers[w].name)
        peers = peers and len(owners) > 1 and all(workers[w].peer_address for w in owners)
        self.reducers = owners if peers else []
        self.reducer_index = {w: j for j, w in enumerate(self.reducers)}
        self.reduce_shards = sorted(self.expected)
        if self.reducers:
            self.columns = exchange.grid_columns(len(self.reducers), sum(
                parameters[k].nbytes for k in step.arrays if k in parameters))
        if self.columns:
            self.shard_reducer = {s: self.reducer_index[owner[s]] for s in self.reduce_shards}
        addresses = tuple((w, workers[w].peer_address) for w in self.reducers)
        key = (addresses, tuple(self.reduce_shards), self.columns, tuple(self.shard_reducer.values()))
        if self.reducers and key != self._layout_key:
            self.layout_version += 1
            self._layout_key = key
            self.layout = {"reducers": [pb.Reducer(worker_id=w, address=address) for w, address in addresses],
                           "reduce_shards": self.reduce_shards, "columns": self.columns,
                           "shard_reducers": list(self.shard_reducer.values())}
        # What an elementwise reduce reads: the step's arrays and the master-only ones.
        self.reads = {k: v for k, v in parameters.items() if k in step.arrays or k.startswith(MASTER_ONLY)}
        self.ahead = ""
        self.combine = combine and not self.reducers

    def collect(self, members: Membership, check: Callable[[], None]) -> None:
        """Wait until every expected shard has reported, or the exchange failed; ``check``
        raises what stops the job."""
        while not self.results or self.expected - set(self.results):
            check()
            if self.exchange_error:
                return
            if not self.expected - set(self.results):
                # Every shard was dropped before any reported: redo the step in full
                # with the workers that are (or come) back.
                self.expected = set(members.owner)
            self._wake.wait(timeout=0.5)
            if members.live():
                members.assign_orphans()

    def failed(self, step_index: int) -> None:
        """The round's exchange failed: the step runs again as a star. At :data:`EXCHANGE_TRIES`
        failures in a row the workers reduce no more (see :attr:`exchanges_on`)."""
        log.warning("step %d round %d: the exchange failed (%s); running the step again with the "
                    "master reducing", step_index, self.round, self.exchange_error)
        self._event("exchange_failed", step=step_index, round=self.round, reason=self.exchange_error)
        self.failed_exchanges += 1
        if self.failed_exchanges == EXCHANGE_TRIES:
            log.warning("%d exchanges failed in a row: the master reduces for the rest of the job",
                        EXCHANGE_TRIES)
            self._event("exchange_off", step=step_index, failed=EXCHANGE_TRIES)

    @property
    def exchanges_on(self) -> bool:
        """Whether the workers may still reduce (fewer than :data:`EXCHANGE_TRIES` failed in a row)."""
        return self.failed_exchanges < EXCHANGE_TRIES

    def end(self) -> int:
        """End the step: its last round's results are in. Returns how many reducers that round had."""
        if self.reducers:
            self.failed_exchanges = 0
        reducers, self.reducers = len(self.reducers), []
        return reducers

    def exchange_failed(self, why: str) -> None:
        """The round's exchange cannot finish: the step's driver runs it again as a star."""
        if self.reducers and self.exchange_error is None:
            self.exchange_error = why
            self._wake.notify_all()

    def moved(self, shard: int) -> None:
        """``shard`` changed hands. In a grid round a relay waits for its rows from the reducer
        that had it (see :mod:`iterreduce.transport.exchange`): the exchange cannot end."""
        if self.columns and shard in self.shard_reducer and shard not in self.results:
            self.exchange_failed(f"shard {shard} changed hands during the exchange")

    def lose(self, worker: WorkerInfo, why: str, others_live: bool) -> set[int]:
        """``worker`` was lost: the round goes on without its unfinished shards, if ``others_live``
        and :attr:`skip_lost` (else they stay expected, for the workers they move to or a restart).
        Returns the shards it goes on without."""
        lost = {s for s, w in self.in_flight.items() if w == worker.worker_id}
        for s in lost:
            self.in_flight.pop(s)
        if worker.worker_id in self.reducers:
            # Its rows, and the parts sent to it, are gone: the step runs again as a star.
            self.exchange_failed(f"{worker.worker_id} was lost ({why})")
            # Its reported results go too: their tensors were only in the exchange.
            lost |= {s for s, w in self.reporter.items() if w == worker.worker_id and s in self.expected}
        if not others_live or not self.skip_lost:
            return set()
        lost |= {s for s in worker.shards if s in self.expected and s not in self.results}
        self.expected -= lost
        return lost

    # ------------------------------------------------------------ tasks

    def todo(self, worker: WorkerInfo) -> list[int]:
        """``worker``'s shards this round has still to give out (in shard order)."""
        return sorted(s for s in worker.shards
                      if s in self.expected and s not in self.results and s not in self.in_flight)

    def give(self, shards: list[int], worker_id: str) -> None:
        """``shards`` are given out to ``worker_id``."""
        for s in shards:
            self.in_flight[s] = worker_id

    def task_fields(self, worker_id: str, stale: dict[str, int], versions: dict[str, int],
                    layout_held: int) -> tuple[dict, dict]:
        """The round's :class:`TaskHeader` fields for ``worker_id`` which lacks ``stale`` (name:
        version), holds layout ``layout_held``, and the rows it is to reduce, as ``(fields, rows)``.
        ``fields["gathered"]``: the arrays of ``stale`` its peers delivered in the last exchange:
        they are in its inbox, not sent again. ``versions``: the parameters' versions."""
        held = self.gathered.get(worker_id, {})
        gathered = {k: version for k, version in stale.items() if held.get(k) == version}
        layout_version = self.layout_version if self.reducers else 0
        # The layout goes only to a worker that does not hold it (see TaskHeader.layout_version).
        layout = self.layout if layout_version and layout_held != layout_version else {}
        gathered_round, gathered_parts = self.gathered_round if gathered else (0, 0)
        part = self.reducer_index.get(worker_id, -1) if self.reducers else -1
        if part in self.reduced:  # its block is in: a later task of the round carries no order
            part = -1
        rows, order = self._order(worker_id, part, versions) if part >= 0 else ({}, {})
        fields = dict(round=self.round, combine=self.combine, layout_version=layout_version, **layout, gathered=gathered,
                      gathered_round=gathered_round, gathered_parts=gathered_parts, part=part, **order,
                      ahead_info_json=self.ahead)
        return fields, rows

    def _order(self, worker_id: str, part: int, versions: dict[str, int]) -> tuple[dict, dict]:
        """Reducer ``part``'s order: its rows of what the reduce reads, at full precision, named
        ``rows:<name>``, less those it holds (its own block of the result it reduced in the last
        round that succeeded, unchanged since), and the TaskHeader's fields that say which rows it
        holds (the layout says which shards to reduce, and how)."""
        reads = exchange.rows_of(self.reads, len(self.reducers), part)
        parts_held, part_held, rows_round, held = self.rows_held.get(worker_id, (0, -1, 0, {}))
        kept = []
        if (parts_held, part_held) == (len(self.reducers), part):
            kept = sorted(k for k in reads if held.get(k) == versions[k])
        rows = {exchange.ROWS_PREFIX + k: v for k, v in reads.items() if k not in kept}
        return rows, {"rows_kept": kept, "rows_round": rows_round if kept else 0}

    # ------------------------------------------------------------ pushes

    def check_push(self, header: pb.UpdateHeader, worker_id: str, updates: dict[int, Update],
                   arrays: tuple[str, ...], parameters: dict) -> None:
        """Raise :class:`Refused` unless this round takes the push of ``header`` and ``updates``
        from live worker ``worker_id``, for the current step (of ``arrays``, shaped as in ``parameters``)."""
        if (header.scattered or header.reduced) and header.round != self.round:  # of an exchange that failed
            raise Refused(f"{header.worker_id}: rows of round {header.round}, the current round "
                          f"is {self.round}", abort=False)
        if header.scattered != bool(self.reducers):
            raise Refused(f"{header.worker_id}: {'rows sent to reducers' if header.scattered else 'whole updates'}"
                          f" in round {self.round}, which {'has' if self.reducers else 'has no'} reducers", abort=False)
        if header.reduced and (not 0 <= header.part < len(self.reducers) or header.part in self.reduced
                               or self.reducers[header.part] != worker_id):
            raise Refused(f"{worker_id}: a reduced block {header.part}, not its own in "
                          f"round {self.round}", abort=False)
        if header.combined:
            self._check_combined(header, updates)
        for shard, update in updates.items():
            if self.in_flight.get(shard) != worker_id:
                raise Refused(f"{header.worker_id}: shard {shard} was not given to it", abort=False)
            if header.scattered or (header.combined and shard != header.results[0].index):
                continue  # tensors with the reducers, which check their shapes; or in the combined update
            missing = set(arrays) - set(update.arrays)
            if missing:
                raise Refused(f"{header.worker_id}: shard {shard} update lacks {sorted(missing)}")
            for name in arrays:
                got, want = update.arrays[name], parameters.get(name)
                if want is not None and (got.shape != want.shape or got.dtype != want.dtype):
                    raise Refused(f"{header.worker_id}: shard {shard} sent {name} as "
                                  f"{got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}")

    def _check_combined(self, header: pb.UpdateHeader, updates: dict[int, Update]) -> None:
        """A combined push (UpdateHeader.combined) only where asked, its arrays the first result's alone."""
        if not self.combine or header.scattered:
            raise Refused(f"{header.worker_id}: one update for several shards in round {self.round}, which "
                          f"did not ask for it", abort=False)
        first = header.results[0].index if header.results else None
        stray = [s for s, u in updates.items() if s != first and (u.samples or u.arrays or u.metrics)]
        if stray:
            raise Refused(f"{header.worker_id}: a combined push with samples, arrays or metrics beside its "
                          f"first shard's (shards {stray})")

    def take_push(self, header: pb.UpdateHeader, worker_id: str, updates: dict[int, Update], arrays: dict) -> None:
        """Take a push :meth:`check_push` passed: its results, its compute time, and, from a
        reducer, its block (``arrays``) or why its exchange failed."""
        for shard, update in updates.items():
            del self.in_flight[shard]
            if shard in self.expected:
                self.results[shard] = update
                self.reporter[shard] = worker_id
        self.compute_s[worker_id] = self.compute_s.get(worker_id, 0.0) + header.compute_s
        if header.exchange_error:
            self.exchange_failed(f"{header.worker_id}: {header.exchange_error}")
        elif header.reduced:  # in a round of the workers' reduce, a push's tensors are its block
            self.reduced[header.part] = (arrays, list(header.undelivered))

    # ------------------------------------------------------------ the reduce on the workers

    def gather(self, step, parameters: dict, version: int, check: Callable[[], None]) -> dict | None:
        """Wait for every reducer's block, and join them: the step's result, which the master
        gives ``version``; None when the exchange failed (``exchange_error`` says why). Notes
        what each worker then holds of it. ``check`` raises what stops the job."""
        parts = len(self.reducers)
        while len(self.reduced) < parts and not self.exchange_error:
            check()
            self._wake.wait(timeout=0.5)
        if self.exchange_error:
            return None
        try:
            result = exchange.join_rows([self.reduced[j][0] for j in range(parts)])
            for name in {*step.arrays, *result}:
                want, got = parameters.get(name), result.get(name)
                if got is None or (want is not None and (got.shape != want.shape or got.dtype != want.dtype)):
                    raise ValueError(f"{name} came back as {'nothing' if got is None else f'{got.dtype}{list(got.shape)}'}")
        except ValueError as exc:
            self.exchange_failed(f"the reducers' rows do not make the parameters: {exc}")
            return None
        undelivered = {w for _, missed in self.reduced.values() for w in missed}
        shared = {name: version for name in result if not master_side(name)}
        self.gathered = {w: shared for w in self.reducers if w not in undelivered}
        self.gathered_round = (self.round, parts)
        versions = {name: version for name in result}
        self.rows_held = {w: (parts, j, self.round, versions) for j, w in enumerate(self.reducers)}
        return result
