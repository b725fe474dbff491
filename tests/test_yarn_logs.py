"""`dbn logs` right after an application ends: YARN aggregates the logs a little later.

On the real Hadoop of tests/test_yarn.py, `dbn logs` called the moment `dbn submit --wait`
returned found no logs yet (2026-11-25, a fresh-clone CI run): the NodeManagers upload
them once the containers are gone. These cases use a stand-in client and clock, so they
pin the waiting rules exactly; the real cluster exercises the race itself.
"""

from __future__ import annotations

from datetime import datetime
from types import SimpleNamespace

import pytest

from iterreduce.launch.yarn import YarnError
from iterreduce.launch.yarn import client as yarn_client

APP = "application_1764000000000_0007"


class Clock:
    """time.time / time.sleep that advance only when slept."""

    def __init__(self):
        self.now, self.slept = 1_800_000_000.0, []

    def time(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


class StandIn:
    """skein.Client's two calls that `logs` makes: the report and the aggregated logs."""

    def __init__(self, clock, state="FINISHED", ended_ago=2.0, ready_after=None):
        self.clock, self.state, self.ready_after = clock, state, ready_after
        self.finish = clock.now - ended_ago
        self.asked = 0

    def application_report(self, app_id):
        if app_id != APP:
            raise ValueError(f"unknown application {app_id}")
        return SimpleNamespace(state=self.state, finish_time=datetime.fromtimestamp(self.finish))

    def application_logs(self, app_id):
        self.asked += 1
        if self.ready_after is None or self.clock.now - self.finish < self.ready_after:
            raise ValueError("Log aggregation has not completed or is not enabled")
        return {"container_1_01": "working as worker-0"}


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(yarn_client, "time", clock)
    monkeypatch.setattr(yarn_client, "_yarn_logs", lambda app_id: (None, "no `yarn` command on PATH"))
    return clock


def test_logs_of_an_application_that_just_ended_are_waited_for(clock):
    said = []
    text = yarn_client.logs(StandIn(clock, ended_ago=1.0, ready_after=10.0), APP, show=said.append)
    assert "===== container_1_01 =====" in text and "working as worker-0" in text
    assert 0 < sum(clock.slept) <= 12 and len(said) == 1 and "aggregate" in said[0] and APP in said[0]


@pytest.mark.parametrize("case", ["ended long ago", "still running", "unknown application"])
def test_no_logs_is_an_error_at_once_where_waiting_cannot_help(clock, case):
    stand_in = StandIn(clock, state="RUNNING" if case == "still running" else "FINISHED",
                       ended_ago=yarn_client.AGGREGATION_WAIT + 60 if case == "ended long ago" else 1.0)
    app = "application_1764000000000_0099" if case == "unknown application" else APP
    with pytest.raises(YarnError, match="no logs.*skein: .*yarn logs: no `yarn` command") as error:
        yarn_client.logs(stand_in, app)
    assert app in str(error.value) and clock.slept == []


def test_logs_that_never_come_end_in_an_error_after_the_wait(clock):
    stand_in = StandIn(clock, ended_ago=0.0, ready_after=None)
    with pytest.raises(YarnError, match="try again in a minute"):
        yarn_client.logs(stand_in, APP)
    assert yarn_client.AGGREGATION_WAIT <= sum(clock.slept) <= yarn_client.AGGREGATION_WAIT + 5
    assert stand_in.asked > 10  # asked again each time
