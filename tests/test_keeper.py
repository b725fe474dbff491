"""The application master's keeper of worker containers (issue 52, iterreduce.launch.yarn.keeper), on
skein's answers as a fake application gives them: each ended container named by its cause, only the
job's own failures counted, a slot whose container's end skein dropped filled again, and as many
containers kept as the job wants (dbn scale)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from iterreduce.exceptions import JobFailed
from iterreduce.launch.yarn import KV_WORKERS, KV_WORKERS_ASKED
from iterreduce.launch.yarn.keeper import COMPLETION_LOST, FAILED, NODE_LOST, PREEMPTED, Keeper, cause_of
from iterreduce.launch.yarn.relax import SPARE_SERVICE

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


class KV(dict):
    """skein's key-value store: the slot keys the workers hold, and the keys of dbn scale."""

    def __init__(self, app):
        super().__init__()
        self.app = app

    def get_prefix(self, prefix):
        return {f"{prefix}{k}": json.dumps({"container": c}).encode() for k, c in self.app.slots.items()}


class App:
    """The skein calls the keeper makes: containers, the key-value store, kill and add."""

    def __init__(self):
        self.containers, self.slots, self.killed, self.added = {}, {}, [], []
        self.kv = KV(self)

    def run(self, id, slot=None, state="RUNNING"):
        self.containers[id] = SimpleNamespace(id=id, service_name=id.rsplit("_", 1)[0], state=state,
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


class FakeMaster:
    """What the keeper asks of the job's master: its live workers and the number wanted; what it
    tells it: events, a failure, a new number."""

    def __init__(self, live, wanted=2, shards=6):
        self.live, self.wanted, self.shards = live, wanted, list(range(shards))
        self.events, self.errors = [], []

    def live_workers(self):
        return set(self.live)

    def wanted_workers(self):
        return self.wanted

    def resize(self, workers):
        if not 1 <= workers <= len(self.shards):
            raise ValueError(f"workers = {workers}: expected 1 to {len(self.shards)}")
        self.wanted = workers

    def fail(self, error):
        self.errors.append(error)

    def event(self, event, **fields):
        self.events.append((event, fields))


def keeper(app, live, budget=2, now=None, wanted=2):
    master = FakeMaster(live, wanted)
    k = Keeper(app, master, budget, grace=20, clock=(lambda: now[0]) if now else time.monotonic)
    return k, k.losses, master.errors


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
    k, losses, errors = keeper(app, live, now=now, wanted=3)
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
    app.run("worker-1_1")  # what skein starts for the add
    now[0] = 100.0
    k.check()
    assert app.added == ["worker-1"] and not errors  # once


def test_a_worker_that_comes_back_within_the_grace_is_left_alone():
    app, now, live = App(), [0.0], {"worker-0"}
    k, losses, _ = keeper(app, live, now=now, wanted=1)
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
    from iterreduce.launch.yarn.appspec import MAX_FAILURES_VAR

    for value, budget in (("5", 5), ("0", 0), ("many", 3)):
        monkeypatch.setenv(MAX_FAILURES_VAR, value)
        assert Keeper.from_container(App(), FakeMaster(set()), grace=1).max_failures == budget


def test_a_new_number_of_workers_resizes_the_master_and_the_containers_follow_it():
    """``dbn scale`` writes the number asked for; the keeper has the master take it, publishes what
    the job wants, asks for spare containers while fewer are active, and withdraws pending ones
    while more are (running ones retire through the master), each after two looks that agree."""
    app, live = App(), {"worker-0", "worker-1", "worker-2"}
    k, _, errors = keeper(app, live, wanted=3)
    for n in range(3):
        app.run(f"worker-{n}_0", slot=n)
    k.check()
    assert json.loads(app.kv[KV_WORKERS]) == {"wanted": 3, "most": 6, "running": 3, "pending": 0, "queue": "",
                                              "label": ""} and app.added == []
    app.kv[KV_WORKERS_ASKED] = b"1"
    k.check()
    assert k.master.wanted == 1 and json.loads(app.kv[KV_WORKERS])["wanted"] == 1
    for n in (1, 2):  # their workers retire: the containers end with exit 0
        live.discard(f"worker-{n}")
        app.containers[f"worker-{n}_0"].state = "SUCCEEDED"
        app.slots.pop(n)
    k.check()
    k.check()
    assert app.added == [] and app.killed == []  # one active, one wanted
    app.kv[KV_WORKERS_ASKED] = b"3"
    k.check()  # the first look that finds too few: nothing yet
    assert app.added == []
    k.check()
    assert app.added == [SPARE_SERVICE, SPARE_SERVICE]
    app.run(f"{SPARE_SERVICE}_0", state="REQUESTED")
    app.run(f"{SPARE_SERVICE}_1", state="REQUESTED")
    app.kv[KV_WORKERS_ASKED] = b"2"  # before they started: one of them is withdrawn
    k.check()
    k.check()
    assert app.killed == [f"{SPARE_SERVICE}_1"] or app.killed == [f"{SPARE_SERVICE}_0"]
    assert len(app.added) == 2 and not errors


def test_an_ask_the_master_refuses_is_logged_and_changes_nothing(caplog):
    app = App()
    k, _, _ = keeper(app, {"worker-0"}, wanted=1)
    app.kv[KV_WORKERS_ASKED] = b"7"  # six shards: at most six workers
    app.run("worker-0_0", slot=0)
    k.check()
    assert k.master.wanted == 1 and "ignored the ask for '7' workers: workers = 7: expected 1 to 6" in caplog.text
    app.kv[KV_WORKERS_ASKED] = b"many"
    k.check()
    assert k.master.wanted == 1 and "ignored the ask for 'many'" in caplog.text


def test_a_slot_no_longer_wanted_is_never_refilled():
    app, now, live = App(), [0.0], {"worker-0", "worker-1"}
    k, _, _ = keeper(app, live, now=now, wanted=2)
    app.run("worker-0_0", slot=0)
    app.run("worker-1_0", slot=1)
    k.check()
    k.master.wanted = 1
    live.discard("worker-1")  # retired; its container takes its time to end
    for t in (1.0, 30.0, 60.0):
        now[0] = t
        k.check()
    assert app.killed == [] and app.added == [] and k.refilled == []


def test_containers_yarn_has_no_room_for_are_counted_published_and_told_once_after_a_while():
    from iterreduce.launch.yarn.keeper import PENDING_NOTE_S

    app, now = App(), [0.0]
    master = FakeMaster({"worker-0"}, wanted=3)
    k = Keeper(app, master, 2, grace=20, clock=lambda: now[0], queue="small")
    app.run("worker-0_0", slot=0)
    app.run("worker-1_0", state="REQUESTED")
    app.run("worker-2_0", state="WAITING")
    k.check()
    assert json.loads(app.kv[KV_WORKERS]) == {"wanted": 3, "most": 6, "running": 1, "pending": 2, "queue": "small",
                                              "label": ""}
    assert k.waiting() == "2 worker containers pending in queue 'small': YARN has no room for them"
    for t in (PENDING_NOTE_S - 1, PENDING_NOTE_S, PENDING_NOTE_S + 5):
        now[0] = t
        k.check()
    told = [fields for event, fields in master.events if event == "containers_pending"]
    assert told == [{"pending": 2, "running": 1, "queue": "small", "label": "", "seconds": 30}]  # once
    for n in (1, 2):
        app.containers[f"worker-{n}_0"].state = "RUNNING"
    k.check()
    assert k.waiting() == "" and json.loads(app.kv[KV_WORKERS])["pending"] == 0
