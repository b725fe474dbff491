"""The application master's keeper of worker slots (issue 52, iterreduce.yarn.keeper), on skein's
answers as a fake application gives them: each ended container named by its cause, only the job's
own failures counted, and a slot whose container's end skein dropped filled again."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from iterreduce.exceptions import JobFailed
from iterreduce.yarn import KV_SLOT
from iterreduce.yarn.keeper import COMPLETION_LOST, FAILED, NODE_LOST, PREEMPTED, Keeper, cause_of

# Diagnostics as YARN gives them (Hadoop's SchedulerUtils) and as skein words a non-zero exit.
PREEMPTION = "Container preempted by scheduler"
LOST_NODE = "Container released on a *lost* node"
CRASH = "Container failed during execution, see logs for more information."
OVER_MEMORY = "Container [pid=1,containerID=c] is running beyond physical memory limits. Killing container."


@pytest.mark.parametrize("message, cause", [
    (PREEMPTION, PREEMPTED), (LOST_NODE, NODE_LOST), ("Node decommissioned", NODE_LOST),
    (CRASH, FAILED), (OVER_MEMORY, FAILED), ("", FAILED), (None, FAILED), ("something new", FAILED)])
def test_each_end_is_named_by_its_cause_and_only_the_jobs_own_count(message, cause):
    assert cause_of(message) == cause


class App:
    """The skein calls the keeper makes: containers, the key-value store's slot keys, kill and add."""

    def __init__(self):
        self.containers, self.slots, self.killed, self.added = {}, {}, [], []
        self.kv = SimpleNamespace(get_prefix=lambda prefix: {
            f"{prefix}{k}": json.dumps({"container": c}).encode() for k, c in self.slots.items()})

    def run(self, id, slot=None):
        self.containers[id] = SimpleNamespace(id=id, service_name=id.rsplit("_", 1)[0], state="RUNNING",
                                              exit_message="")
        if slot is not None:
            self.slots[slot] = id

    def end(self, id, message):
        self.containers[id].state, self.containers[id].exit_message = "FAILED", message
        self.slots = {k: c for k, c in self.slots.items() if c != id}

    def get_containers(self, states):
        return [c for c in self.containers.values() if c.state.lower() in states]

    def kill_container(self, id):
        self.killed.append(id)
        self.containers[id].state = "KILLED"
        self.slots = {k: c for k, c in self.slots.items() if c != id}

    def add_container(self, service):
        self.added.append(service)


def keeper(app, live, budget=2, now=None):
    losses, errors = [], []
    k = Keeper(app, budget, lambda: set(live), losses.append, errors.append, grace=20,
               clock=(lambda: now[0]) if now else time.monotonic)
    return k, losses, errors


def test_preemptions_never_count_and_the_jobs_own_failures_do_up_to_max_restarts():
    app = App()
    k, losses, errors = keeper(app, {"worker-0", "worker-1"}, budget=2)
    for n in range(6):  # worker-1 preempted six times, more than its budget
        app.run(f"worker-1_{n}", slot=1)
        app.end(f"worker-1_{n}", PREEMPTION)
        assert [loss.cause for loss in k.check()] == [PREEMPTED]
    assert not errors and k.failures == {} and [loss.counted for loss in losses] == [False] * 6
    assert k.check() == []  # each end is told once
    for n in range(2):
        app.run(f"worker-0_{n}", slot=0)
        app.end(f"worker-0_{n}", CRASH)
        k.check()
    assert not errors and k.failures == {"worker-0": 2}
    app.run("worker-0_2", slot=0)
    app.end("worker-0_2", OVER_MEMORY)
    k.check()
    assert len(errors) == 1 and isinstance(errors[0], JobFailed)
    assert "worker-0 failed 3 times, more than max_restarts (2)" in str(errors[0]) and "physical memory" in str(errors[0])
    app.run("worker-0_3", slot=0)
    app.end("worker-0_3", CRASH)
    k.check()
    assert len(errors) == 1  # the job is told once


def test_a_container_whose_end_skein_dropped_is_killed_and_its_slot_asked_for_again():
    """skein's master drops the completions that come with one of a container it killed: the
    container stays RUNNING in its books, holding its slot. The keeper waits ``grace`` seconds
    after its worker went, then kills it through skein (freeing the slot) and asks for another."""
    app, now, live = App(), [0.0], {"worker-0", "worker-1"}
    losses, errors = [], []
    k = Keeper(app, 2, lambda: set(live), losses.append, errors.append, grace=20, clock=lambda: now[0])
    app.run("worker-0_0", slot=0)
    app.run("worker-1_0", slot=1)
    app.run("worker-2_0")  # started, no slot yet, its worker not registered: never taken for lost
    k.check()
    live.discard("worker-1")  # its process died; skein never heard
    now[0] = 1.0
    k.check()  # first seen gone
    now[0] = 20.0
    k.check()
    assert app.killed == [] and app.added == []
    now[0] = 30.0
    k.check()
    assert app.killed == ["worker-1_0"] and app.added == ["worker-1"] and k.refilled == ["worker-1_0"]
    assert [(loss.container, loss.cause, loss.counted) for loss in losses] == [("worker-1_0", COMPLETION_LOST, False)]
    now[0] = 100.0
    k.check()
    assert app.added == ["worker-1"] and not errors  # once


def test_a_worker_that_comes_back_within_the_grace_is_left_alone():
    app, now, live = App(), [0.0], {"worker-0"}
    k, losses, _ = keeper(app, live, now=now)
    k.live_workers = lambda: set(live)
    app.run("worker-0_0", slot=0)
    k.check()
    live.clear()
    now[0] = 10.0
    k.check()
    live.add("worker-0")  # e.g. a pause longer than the heartbeat timeout: it registered again
    now[0] = 15.0
    k.check()
    live.clear()
    now[0] = 30.0  # gone again, for 0 s by the keeper's count
    k.check()
    assert app.killed == [] and losses == []


def test_the_budget_comes_from_the_application_masters_environment(monkeypatch):
    from iterreduce.yarn.spec import MAX_FAILURES_VAR

    for value, budget in (("5", 5), ("0", 0), ("many", 3)):
        monkeypatch.setenv(MAX_FAILURES_VAR, value)
        assert Keeper.from_container(App(), set, print, print, grace=1).max_failures == budget
