"""The master's workers: who they are, which shards each holds, and when one is presumed lost.

A worker's *home* shards are K, K+N, ... for worker K of the N wanted; a restarted process of the
same name takes them back. Shards whose owner is lost go to the least-loaded live workers. The
number wanted may change while the job runs (:meth:`Membership.resize`): a worker K >= N is
*unwanted*, gives its shards up at the next round and retires; so does a *draining* worker (its
node is leaving the cluster), whose slot stays wanted for a new process elsewhere. Each round
starts with every shard at its home where that worker is live and not draining
(:meth:`Membership.rebalance`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("iterreduce.master")  # a part of the master: its records are the master's

#: the most heartbeats a second the master takes from all its workers: one costs it about 0.3 ms of
#: CPU (benchmarks/RESULTS.md), so a thousand workers beating every second would keep a third of a
#: core busy. Past this the interval grows with the workers (see :func:`heartbeat_timing`).
HEARTBEATS_PER_S = 100
#: heartbeats a worker may miss, at a stretched interval, before it is presumed lost
MISSED_HEARTBEATS = 3


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
class WorkerInfo:
    """A worker process as the master knows it (``worker_id``: ``<name>#<incarnation>``)."""

    worker_id: str
    name: str
    host: str
    shards: set[int] = field(default_factory=set)
    last_seen: float = field(default_factory=time.monotonic)
    alive: bool = True
    status: dict = field(default_factory=dict)
    peer_address: str = ""  # its Peer service ("": it cannot reduce rows)
    samples_per_s: float | None = None  # its shards' samples over its compute time, in its last push
    local: float | None = None  # the share of its data's bytes stored on its host, where its launcher knows
    shared: bool = False  # it shares the master's shared-memory folder (iterreduce.transport.sharedmem)
    retired: bool = False  # it left because fewer workers were wanted, or it drained (not alive, not lost)
    draining: str = ""  # why it is to leave (its node is being decommissioned); "": it stays


class Membership:
    """The workers that registered and the owner of each shard. Call its methods with the
    master's lock held; ``on_moved(shard)`` hears of every shard that changes hands, and
    ``work`` (the master's condition of the fetches waiting for work) is notified when a
    shard finds a new owner."""

    def __init__(self, shards: int, workers: int, work: threading.Condition, on_moved: Callable[[int], None]):
        self.size = workers  # the workers wanted: the job's, until resize
        self.workers: dict[str, WorkerInfo] = {}
        self.names: list[str] = []  # registration order of worker names: decides home shards
        self.owner: dict[int, str | None] = {i: None for i in range(shards)}
        self.registrations: dict[str, int] = {}  # worker name -> processes registered under it
        self._incarnation = 0
        self._work = work
        self._on_moved = on_moved

    def slot(self, name: str) -> int:
        """Worker ``name``'s number K: from a name ``<prefix>-K`` (as launchers name workers, so a
        restart, in any order, gets the same shards), else its registration order."""
        prefix, _, suffix = name.rpartition("-")
        return int(suffix) if prefix and suffix.isdigit() else self.names.index(name)

    def home(self, name: str) -> set[int]:
        """Shards K, K+N, ... of worker K of the N wanted (none for an unwanted worker)."""
        k = self.slot(name)
        return {s for s in self.owner if s % self.size == k} if k < self.size else set()

    def wanted(self, worker: WorkerInfo) -> bool:
        """Whether ``worker`` is among the workers wanted now (see :meth:`resize`) and not draining."""
        return self.slot(worker.name) < self.size and not worker.draining

    def resize(self, workers: int) -> None:
        """Want ``workers`` workers from now on: 0..workers-1 by number. The shards move at the next
        round's start (:meth:`rebalance`); an unwanted worker left without shards retires."""
        if not 1 <= workers <= len(self.owner):
            raise ValueError(f"workers = {workers}: expected 1 to {len(self.owner)} (one shard a worker at most)")
        self.size = workers

    def rebalance(self) -> None:
        """At a round's start (nothing in flight): each shard to its home worker where that worker
        is live and not draining, the others of unwanted, draining or lost workers to the
        least-loaded wanted live workers (a draining worker alone keeps its shards)."""
        homes = {self.slot(w.name): w for w in self.live() if not w.draining}  # worker K's newest process
        for shard, owner in self.owner.items():
            home = homes.get(shard % self.size)
            if home is not None and owner != home.worker_id:
                self._give(shard, owner, home)
            elif home is None and owner is not None and not self.wanted(self.workers[owner]):
                self.workers[owner].shards.discard(shard)
                self.owner[shard] = None
                self._on_moved(shard)
        self.assign_orphans()

    def _give(self, shard: int, owner: str | None, worker: WorkerInfo) -> None:
        if owner:
            self.workers[owner].shards.discard(shard)
        worker.shards.add(shard)
        self.owner[shard] = worker.worker_id
        self._on_moved(shard)

    def live(self) -> list[WorkerInfo]:
        """The workers not presumed lost."""
        return [w for w in self.workers.values() if w.alive]

    def live_worker(self, worker_id: str) -> WorkerInfo | None:
        """Worker ``worker_id``, unless it is unknown or lost."""
        worker = self.workers.get(worker_id)
        return worker if worker is not None and worker.alive else None

    def register(self, name: str, host: str, peer_address: str, in_flight: dict[int, str],
                 local: float | None = None) -> WorkerInfo:
        """A new process of worker ``name`` (its predecessors must be dropped first): it takes back
        its home shards, except those another live worker is computing right now (``in_flight``:
        shard -> worker id), and any shard without a live owner may go to it."""
        if name not in self.names:
            self.names.append(name)
        self.registrations[name] = self.registrations.get(name, 0) + 1
        self._incarnation += 1
        worker = WorkerInfo(f"{name}#{self._incarnation}", name, host, peer_address=peer_address, local=local)
        self.workers[worker.worker_id] = worker
        for shard in self.home(name):
            owner = self.owner[shard]
            if shard in in_flight and owner and self.workers[owner].alive:
                continue
            self._give(shard, owner, worker)
        self.assign_orphans()
        return worker

    def heard(self, worker_id: str, status_json: str) -> WorkerInfo | None:
        """A heartbeat of ``worker_id``, with its status (JSON; "": unchanged); None: it is unknown or lost."""
        worker = self.live_worker(worker_id)
        if worker is not None:
            worker.last_seen = time.monotonic()
            if status_json:
                worker.status = json.loads(status_json)
        return worker

    def assign_orphans(self) -> None:
        """Give shards without a live owner to the least-loaded wanted live workers (any live
        worker while no wanted one is)."""
        live = [w for w in self.live() if self.wanted(w)] or self.live()
        if not live:
            return
        for shard, owner in sorted(self.owner.items()):
            if owner is None or not self.workers[owner].alive:
                target = min(live, key=lambda w: (len(w.shards), w.name))
                if owner is not None:
                    self.workers[owner].shards.discard(shard)
                target.shards.add(shard)
                self.owner[shard] = target.worker_id
                self._on_moved(shard)
                log.info("shard %d -> %s", shard, target.worker_id)
                self._work.notify_all()  # its new owner may have work now

    def silent(self, since_last_check: float, timeout: float) -> list[tuple[WorkerInfo, float]]:
        """The live workers silent for longer than ``timeout``, each with its silence, unless the
        master itself was stalled (``since_last_check`` over half the timeout): then none, and
        every worker gets a fresh grace period."""
        now = time.monotonic()
        if since_last_check > timeout / 2:
            # The master did not run for a while (VM pause, swapping, SIGSTOP): the silence
            # is its own, so give every worker a fresh grace period instead of dropping them.
            log.warning("master stalled for %.1f s: extending heartbeat grace", since_last_check)
            for w in self.live():
                w.last_seen = now
            return []
        return [(w, now - w.last_seen) for w in self.live() if now - w.last_seen > timeout]

    def table(self, finished: bool, now: float) -> list[dict]:
        """The live page's workers table: each worker name's newest process."""
        newest = {}
        for w in self.workers.values():
            newest[w.name] = w  # registration order: the last one of a name is the newest
        def state(w: WorkerInfo) -> str:
            if finished:
                return "finished"
            if w.alive:
                return "draining" if w.draining else w.status.get("state", "idle")
            return "retired" if w.retired else "lost"

        rows = [{"name": w.name, "state": state(w), "host": w.host, "local": w.local, "shards": sorted(w.shards),
                 "restarts": self.registrations.get(w.name, 1) - 1,
                 "samples_per_s": w.samples_per_s, "heartbeat_age_s": now - w.last_seen}
                for w in newest.values()]
        return sorted(rows, key=lambda row: (len(row["name"]), row["name"]))
