"""The application master keeps every worker slot filled, and counts only the job's own failures.

skein's application master counts a container that YARN preempted (or lost with its node) as
FAILED, like a crash, and fails the whole application once a service has failed more than its
``max_restarts``: in a busy queue, a healthy job would die after a few preemptions. So each worker
service asks skein for unlimited restarts (:func:`iterreduce.yarn.spec.build_spec`) and the
:class:`Keeper`, in the application master, owns the budget: every container that ends is named
by its cause (:func:`cause_of`, from the diagnostics YARN gives it), logged, and counted against the
job only when the job itself failed (a non-zero exit, memory over its limit); the job fails once a
service has failed more than ``max_restarts`` times.

skein's master also drops the other completions that reach it in the same heartbeat as a container
it killed itself: such a container stays RUNNING in skein's books, its slot held, and is never
restarted. The keeper finds it (its worker was at work, and has been gone from the master for
``grace`` seconds) and kills it through skein, which frees the slot, and asks for a new container.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..exceptions import JobFailed
from . import KV_SLOT
from .spec import MAX_FAILURES_VAR, WORKER_SERVICE
from .watcher import Watcher

log = logging.getLogger("iterreduce.yarn")

PREEMPTED, NODE_LOST, FAILED = "preempted", "node lost", "failed"
#: A container whose end skein dropped (see the module docstring), killed and replaced by the keeper.
COMPLETION_LOST = "completion lost"
#: Causes that are not the job's: YARN took the container back, or its node left the cluster.
NOT_THE_JOBS = (PREEMPTED, NODE_LOST)
#: What YARN's diagnostics say for each (Hadoop's SchedulerUtils and ContainerExitStatus).
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
    (:meth:`start`) or once (:meth:`check`).

    ``max_failures``: the failures a service may have before the job fails; ``live_workers()``: the
    names (``worker-K``) of the workers the master now hears from; ``on_loss(loss)``: told of each
    container that ended; ``on_exhausted(error)``: told once a service's budget is spent (the job
    should end with that error). ``grace``: seconds a slot's worker may be gone while skein still
    says its container runs, before the keeper takes it for a lost completion.
    """

    def __init__(self, app, max_failures: int, live_workers: Callable[[], set[str]],
                 on_loss: Callable[[Loss], None], on_exhausted: Callable[[JobFailed], None],
                 grace: float = 30.0, poll: float = 1.0, clock=time.monotonic):
        super().__init__(poll)
        self.app, self.max_failures, self.live_workers = app, max_failures, live_workers
        self.on_loss, self.on_exhausted, self.grace, self.clock = on_loss, on_exhausted, grace, clock
        self.failures: dict[str, int] = {}
        self.losses: list[Loss] = []
        self.refilled: list[str] = []
        self._ended: set[str] = set()
        self._worked: set[tuple[str, str]] = set()  # (slot name, container) pairs seen at work
        self._gone_since: dict[str, float] = {}
        self._exhausted = False

    name, what = "keep-workers", "check the worker containers"

    @classmethod
    def from_container(cls, app, live_workers, on_loss, on_exhausted, grace: float) -> Keeper:
        """The keeper of this application master, its budget from :data:`MAX_FAILURES_VAR`."""
        raw = os.environ.get(MAX_FAILURES_VAR, "3")
        try:
            budget = int(raw)
        except ValueError:
            log.warning("%s=%r is not a whole number: each worker may fail 3 times", MAX_FAILURES_VAR, raw)
            budget = 3
        return cls(app, budget, live_workers, on_loss, on_exhausted, grace=grace)

    # ------------------------------------------------------------------ one look

    def check(self) -> list[Loss]:
        """Name and count the worker containers that ended since the last look, and refill the slots
        whose container's end skein never heard of; returns the new losses."""
        containers = [c for c in self.app.get_containers(states=["running", "failed"])
                      if c.service_name.startswith(WORKER_SERVICE)]
        new = [self._ended_container(c) for c in containers if str(c.state) == "FAILED" and c.id not in self._ended]
        self._refill_lost_completions([c for c in containers if str(c.state) == "RUNNING"])
        return new

    def _ended_container(self, container) -> Loss:
        self._ended.add(container.id)
        cause = cause_of(container.exit_message)
        counted = cause == FAILED
        loss = Loss(container.id, container.service_name, cause, container.exit_message or "", counted)
        self.losses.append(loss)
        if counted:
            self.failures[loss.service] = self.failures.get(loss.service, 0) + 1
        self.on_loss(loss)
        spent = self.failures.get(loss.service, 0)
        if counted and spent > self.max_failures and not self._exhausted:
            self._exhausted = True
            self.on_exhausted(JobFailed(
                f"{loss.service} failed {spent} times, more than max_restarts ({self.max_failures}); the last, "
                f"{loss.container}: {loss.message or 'no diagnostics'}"))
        return loss

    def _refill_lost_completions(self, running) -> None:
        slots = self._slots()
        live = self.live_workers()
        now = self.clock()
        running_ids = {c.id: c for c in running}
        for name, container in slots.items():
            if container not in running_ids:
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
        self.on_loss(Loss(container.id, container.service_name, COMPLETION_LOST, f"worker gone {gone_for:.0f} s", False))

    def _slots(self) -> dict[str, str]:
        """Each held worker slot's name (``worker-K``) and the container holding it, from skein's
        key-value store (the keys the workers claim: :func:`iterreduce.yarn.container.claim_slot`)."""
        held = {}
        for key, value in self.app.kv.get_prefix(KV_SLOT).items():
            slot = key[len(KV_SLOT):]
            try:
                container = json.loads(value)["container"]
            except (ValueError, KeyError, TypeError):
                continue
            if slot.isdigit() and isinstance(container, str):
                held[f"{WORKER_SERVICE}{int(slot)}"] = container
        return held
