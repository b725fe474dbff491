"""The application master keeps as many worker containers as the job wants, and counts only the job's own failures.

skein's application master counts a container that YARN preempted (or lost with its node) as
FAILED, like a crash, and fails the whole application once a service has failed more than its
``max_restarts``: in a busy queue, a healthy job would die after a few preemptions. So each worker
service asks skein for unlimited restarts (:func:`iterreduce.launch.yarn.appspec.build_spec`) and the
:class:`Keeper`, in the application master, owns the budget: every container that ends is named
by its cause (:func:`cause_of`, from the diagnostics YARN gives it), logged, and counted against the
job only when the job itself failed (a non-zero exit, memory over its limit); the job fails once a
service has failed more than ``max_restarts`` times.

skein's master also drops the other completions that reach it in the same heartbeat as a container
it killed itself: such a container stays RUNNING in skein's books, its slot held, and is never
restarted. The keeper finds it (its worker was at work, and has been gone from the master for
``grace`` seconds) and kills it through skein, which frees the slot, and asks for a new container.

The number of workers wanted may change while the job runs (``dbn scale``: the key
:data:`~iterreduce.launch.yarn.KV_WORKERS_ASKED`): the keeper tells the master (:meth:`Master.resize
<iterreduce.master.master.Master.resize>`), which retires the workers no longer wanted (their containers
end with exit 0), and keeps the containers asked for in line: spare ones (any node) while fewer than
wanted are running or pending, and no pending ones beyond. What the job wants now, and at most, is
published under :data:`~iterreduce.launch.yarn.KV_WORKERS` (``dbn scale`` and the workers read it).
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass

from ...exceptions import JobFailed
from . import KV_SLOT, KV_WORKERS, KV_WORKERS_ASKED
from .appspec import MAX_FAILURES_VAR, WORKER_SERVICE, YarnOptions
from .relax import SPARE_SERVICE
from .watcher import Watcher

log = logging.getLogger("iterreduce.yarn")

PREEMPTED, NODE_LOST, FAILED = "preempted", "node lost", "failed"
#: A container whose end skein dropped (see the module docstring), killed and replaced by the keeper.
COMPLETION_LOST = "completion lost"
#: Causes that are not the job's: YARN took the container back, or its node left the cluster.
NOT_THE_JOBS = (PREEMPTED, NODE_LOST)
#: What YARN's diagnostics say for each (Hadoop's SchedulerUtils and ContainerExitStatus).
#: skein's states of a container that counts as one of the job's (it runs, or YARN is asked for it).
ACTIVE = ("WAITING", "REQUESTED", "RUNNING")
#: Looks in a row that must find too few or too many containers before the keeper acts (another
#: thread, the locality relaxer, kills one container and asks for another in two calls).
LOOKS_TO_ACT = 2
#: Seconds worker containers may wait for YARN before the job's log says so (once each time).
PENDING_NOTE_S = 30.0
_CAUSES = ((PREEMPTED, ("preempted",)),
           (NODE_LOST, ("lost* node", "lost node", "decommission", "disks failed", "bad disk")))


def cause_of(exit_message: str) -> str:
    """Why a container that skein reports FAILED ended: :data:`PREEMPTED`, :data:`NODE_LOST`,
    or :data:`FAILED` (the job's own failure: everything else, unknown diagnostics included)."""
    text = (exit_message or "").lower()
    for cause, phrases in _CAUSES:
        if any(phrase in text for phrase in phrases):
            return cause
    return FAILED


@dataclass
class Loss:
    """A worker container that ended before the job did."""

    container: str  # skein's id, ``worker-2_3``
    service: str
    cause: str
    message: str
    counted: bool  # against the service's budget of failures


class Keeper(Watcher):
    """Watches the worker containers of ``app`` (a skein application client) every ``poll`` seconds
    (:meth:`start`) or once (:meth:`check`), for ``master`` (the job's :class:`~iterreduce.master.Master`:
    its ``live_workers()``, ``wanted_workers()``, ``resize(n)``, ``fail(error)``, ``event(...)`` and
    ``shards``).

    ``max_failures``: the failures a service may have before the job fails (it ends with that
    error, once). ``grace``: seconds a slot's worker may be gone while skein still says its
    container runs, before the keeper takes it for a lost completion.
    """

    def __init__(self, app, master, max_failures: int, grace: float = 30.0, poll: float = 1.0,
                 clock=time.monotonic, queue: str = "", label: str = ""):
        super().__init__(poll)
        self.app, self.master, self.max_failures, self.grace, self.clock = app, master, max_failures, grace, clock
        self.queue, self.label = queue, label  # where the containers are asked for: what a wait names
        self.running = self.pending = 0
        self._pending_since: float | None = None
        self._pending_told = False
        self.failures: dict[str, int] = {}
        self.losses: list[Loss] = []
        self.refilled: list[str] = []
        self.added: list[str] = []     # spare containers asked for, to have as many as wanted
        self.withdrawn: list[str] = []  # pending containers given up, to have no more than wanted
        self._ended: set[str] = set()
        self._worked: set[tuple[str, str]] = set()  # (slot name, container) pairs seen at work
        self._gone_since: dict[str, float] = {}
        self._exhausted = False
        self._asked: bytes | None = None
        self._published: bytes | None = None
        self._off_by: list[int] = []  # containers wanted minus active, at the last looks

    name, what = "keep-workers", "check the worker containers"

    @classmethod
    def from_container(cls, app, master, grace: float) -> Keeper:
        """The keeper of this application master, its budget from :data:`MAX_FAILURES_VAR`."""
        default = YarnOptions.max_restarts
        raw = os.environ.get(MAX_FAILURES_VAR, str(default))
        try:
            budget = int(raw)
        except ValueError:
            log.warning("%s=%r is not a whole number: each worker may fail %d times", MAX_FAILURES_VAR, raw, default)
            budget = default
        try:
            spec = app.get_specification()
            queue, label = spec.queue, next((s.node_label for s in spec.services.values() if s.node_label), "")
        except Exception as exc:  # noqa: BLE001 - only named in what the job waits for
            log.warning("could not read the application's queue: %s", exc)
            queue = label = ""
        return cls(app, master, budget, grace=grace, queue=queue, label=label)

    def waiting(self) -> str:
        """What the job's workers wait for, in words ("" when none is pending)."""
        if not self.pending:
            return ""
        return (f"{self.pending} worker containers pending in queue {self.queue!r}"
                + (f" (node label {self.label!r})" if self.label else "") + ": YARN has no room for them")

    # ------------------------------------------------------------------ one look

    def check(self) -> list[Loss]:
        """Follow a new ask for a number of workers, name and count the worker containers that ended
        since the last look, refill the slots whose container's end skein never heard of, and keep
        as many containers as wanted; returns the new losses."""
        self._follow_ask()
        wanted = self.master.wanted_workers()
        containers = [c for c in self.app.get_containers(states=["waiting", "requested", "running", "failed"])
                      if c.service_name.startswith(WORKER_SERVICE)]
        new = [self._ended_container(c) for c in containers if str(c.state) == "FAILED" and c.id not in self._ended]
        running = [c for c in containers if str(c.state) == "RUNNING"]
        self._refill_lost_completions(running, wanted)
        active = [c for c in containers if str(c.state) in ACTIVE]
        self._keep_count(active, wanted)
        self._note_pending(len(running), len(active) - len(running))
        self._publish(wanted)
        return new

    # ------------------------------------------------------------------ how many

    def _follow_ask(self) -> None:
        """A new value of :data:`KV_WORKERS_ASKED` (``dbn scale``) resizes the job; what it wants now
        is published under :data:`KV_WORKERS`."""
        asked = self.app.kv.get(KV_WORKERS_ASKED)
        if asked is not None and asked != self._asked:
            self._asked = asked
            try:
                self.master.resize(int(asked))
            except ValueError as exc:
                log.warning("ignored the ask for %r workers: %s", asked[:20].decode(errors="replace"), exc)
            self._publish(self.master.wanted_workers())  # at once: dbn scale waits for it

    def _publish(self, wanted: int) -> None:
        """What the job wants and has, under :data:`KV_WORKERS` (when it changed)."""
        state = json.dumps({"wanted": wanted, "most": len(self.master.shards), "running": self.running,
                            "pending": self.pending, "queue": self.queue, "label": self.label}).encode()
        if state != self._published:
            self.app.kv[KV_WORKERS] = state
            self._published = state

    def _note_pending(self, running: int, pending: int) -> None:
        """Count the containers; the job's log says so once some have waited :data:`PENDING_NOTE_S`."""
        self.running, self.pending = running, pending
        now = self.clock()
        if not pending:
            self._pending_since, self._pending_told = None, False
        elif self._pending_since is None:
            self._pending_since = now
        elif not self._pending_told and now - self._pending_since >= PENDING_NOTE_S:
            log.warning("%s, for %.0f s", self.waiting(), now - self._pending_since)
            self.master.event("containers_pending", pending=pending, running=running, queue=self.queue,
                              label=self.label, seconds=round(now - self._pending_since))
            self._pending_told = True  # once, until none is pending

    def _keep_count(self, active, wanted: int) -> None:
        """Spare containers while fewer than ``wanted`` are active; pending ones withdrawn (spare
        ones first) while more are (a running worker no longer wanted retires through the master)."""
        self._off_by = (self._off_by + [wanted - len(active)])[-LOOKS_TO_ACT:]
        same_way = all(d > 0 for d in self._off_by) or all(d < 0 for d in self._off_by)
        if len(self._off_by) < LOOKS_TO_ACT or not same_way:
            return
        change = min(self._off_by, key=abs)  # the smaller of the looks: never overshoot
        self._off_by = []
        if change > 0:
            for _ in range(change):
                self.app.add_container(SPARE_SERVICE)
                self.added.append(SPARE_SERVICE)
            log.info("%d of the %d workers wanted have a container: asked for %d more on any node",
                     len(active), wanted, change)
            return
        pending = sorted((c for c in active if str(c.state) != "RUNNING"), key=lambda c: c.service_name != SPARE_SERVICE)
        for container in pending[:-change]:
            self.app.kill_container(container.id)
            self.withdrawn.append(container.id)
            log.info("%s withdrawn: %d workers are wanted", container.id, wanted)

    # ------------------------------------------------------------------ ends

    def _ended_container(self, container) -> Loss:
        self._ended.add(container.id)
        cause = cause_of(container.exit_message)
        counted = cause == FAILED
        loss = Loss(container.id, container.service_name, cause, container.exit_message or "", counted)
        if counted:
            self.failures[loss.service] = self.failures.get(loss.service, 0) + 1
        self._report(loss)
        spent = self.failures.get(loss.service, 0)
        if counted and spent > self.max_failures and not self._exhausted:
            self._exhausted = True
            self.master.fail(JobFailed(
                f"{loss.service} failed {spent} times, more than max_restarts ({self.max_failures}); the last, "
                f"{loss.container}: {loss.message or 'no diagnostics'}"))
        return loss

    def _report(self, loss: Loss) -> None:
        """A worker container that ended, in the master's log and the job's."""
        self.losses.append(loss)
        budget = " (counted against max_restarts)" if loss.counted else ""
        log.warning("%s (%s) ended: %s%s%s", loss.container, loss.service, loss.cause,
                    f": {loss.message}" if loss.message and loss.cause != PREEMPTED else "", budget)
        self.master.event("container_lost", container=loss.container, service=loss.service, cause=loss.cause,
                          message=loss.message, counted=loss.counted)

    def _refill_lost_completions(self, running, wanted: int) -> None:
        slots = held_slots(self.app)
        live = self.master.live_workers()
        now = self.clock()
        running_ids = {c.id: c for c in running}
        for slot, (name, container) in slots.items():
            if container not in running_ids or slot >= wanted:  # a worker no longer wanted leaves by itself
                continue
            if name in live:
                self._worked.add((name, container))
                self._gone_since.pop(container, None)
            elif (name, container) in self._worked:
                since = self._gone_since.setdefault(container, now)
                if now - since >= self.grace:
                    self._refill(running_ids[container], name, now - since)

    def _refill(self, container, slot: str, gone_for: float) -> None:
        del self._gone_since[container.id]
        log.warning("%s: its worker (%s) has been gone for %.0f s, yet skein says it runs (a completion skein "
                    "dropped): killed, and a new container asked for", container.id, slot, gone_for)
        self.app.kill_container(container.id)  # skein's books: ended, and the slot's key freed
        self.app.add_container(container.service_name)
        self.refilled.append(container.id)
        self._report(Loss(container.id, container.service_name, COMPLETION_LOST, f"worker gone {gone_for:.0f} s", False))


def held_slots(app) -> dict[int, tuple[str, str]]:
    """Each held worker slot K: the worker's name (``worker-K``) and the container holding it, from
    skein's key-value store (the keys the workers claim: :func:`iterreduce.launch.yarn.container.claim_slot`)."""
    held = {}
    for key, value in app.kv.get_prefix(KV_SLOT).items():
        slot = key[len(KV_SLOT):]
        try:
            container = json.loads(value)["container"]
        except (ValueError, KeyError, TypeError):
            continue
        if slot.isdigit() and isinstance(container, str):
            held[int(slot)] = (f"{WORKER_SERVICE}{int(slot)}", container)
    return held
