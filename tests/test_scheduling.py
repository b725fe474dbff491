"""The suite's schedule (tests/scheduling.py): which tests share a worker, in what order, which are quick."""

from __future__ import annotations

import pytest

import scheduling


class Definition:
    def __init__(self, scope, module):
        self.scope = scope
        self.func = type("F", (), {"__module__": module})()


class Item:
    """What the schedule reads of a pytest item: its fixtures with their definitions, module, markers."""

    def __init__(self, fixtures, module="test_x", marks=()):
        self.fixturenames = list(fixtures)
        self._fixtureinfo = type("I", (), {"name2fixturedefs": {n: [d] for n, d in fixtures.items()}})()
        self.module = type("M", (), {"__name__": module})()
        self.nodeid = f"tests/{module}.py::test_one"
        self.marks = set(marks)

    def get_closest_marker(self, name):
        return name if name in self.marks else None


def test_a_test_on_a_cluster_joins_the_clusters_group_whatever_its_module():
    for name in ("hadoop", "hdfs"):
        assert scheduling.group_of(Item({name: Definition("session", "conftest")}, module="test_a")) == "hadoop"
    both = {"hadoop": Definition("session", "conftest"), "secure_hadoop": Definition("session", "conftest")}
    assert scheduling.group_of(Item(both)) == "secure-hadoop"  # the later, shorter chain


def test_a_modules_own_wide_fixture_keeps_its_users_in_the_modules_group_and_others_go_free():
    assert scheduling.group_of(Item({"model": Definition("module", "test_x")})) == "tests/test_x.py"
    assert scheduling.group_of(Item({"model": Definition("module", "conftest_runtime")})) is None
    assert scheduling.group_of(Item({"tmp_path": Definition("function", "test_x")})) is None


def test_the_clusters_start_first_then_the_drills_longest_first_then_modules_then_the_rest():
    groups = [None, "tests/test_rbm.py", "tests/test_multinode.py", "secure-hadoop", "tests/test_shared.py", "hadoop"]
    assert sorted(groups, key=scheduling.rank) == ["hadoop", "secure-hadoop", "tests/test_shared.py",
                                                   "tests/test_multinode.py", "tests/test_rbm.py", None]


def test_the_quick_tier_has_no_heavy_marker_and_no_cluster():
    assert scheduling.is_quick(Item({}), None)
    assert scheduling.is_quick(Item({}), "tests/test_x.py")
    assert not scheduling.is_quick(Item({}), "hadoop")
    for mark in scheduling.HEAVY_MARKS:
        assert not scheduling.is_quick(Item({}, marks=[mark]), None), mark


def test_the_worker_count_is_twice_the_cores_or_the_environments(monkeypatch):
    monkeypatch.delenv(scheduling.WORKERS_ENV, raising=False)
    assert scheduling.workers() >= 2 and scheduling.workers() % 2 == 0
    monkeypatch.setenv(scheduling.WORKERS_ENV, "3")
    assert scheduling.workers() == 3
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(scheduling.WORKERS_ENV, bad)
        with pytest.raises(ValueError, match=f"DBN_TEST_WORKERS={bad!r}"):
            scheduling.workers()


def test_a_test_measured_slow_leaves_the_quick_tier(monkeypatch):
    item = Item({})
    slow = frozenset({item.nodeid})
    monkeypatch.setattr(scheduling, "_slow", lambda: slow)
    assert not scheduling.is_quick(item, None)
    item.nodeid += "@tests/test_x.py"  # as xdist renames a grouped test
    assert not scheduling.is_quick(item, None)
    monkeypatch.setattr(scheduling, "_slow", frozenset)
    assert scheduling.is_quick(item, None)


def test_the_slow_list_is_made_from_a_junit_report_and_read_back(tmp_path):
    report = tmp_path / "report.xml"
    report.write_text('<testsuites><testsuite name="pytest">'
                      '<testcase classname="tests.test_a" name="test_job[2]" time="7.25"/>'
                      '<testcase classname="tests.test_a.TestThings" name="test_one" time="1.5"/>'
                      '<testcase classname="tests.test_b" name="test_unit" time="0.02"/>'
                      '</testsuite></testsuites>')
    lines = scheduling.slow_lines(report, limit=1.0)
    assert lines == ["7.2 tests/test_a.py::test_job[2]", "1.5 tests/test_a.py::TestThings::test_one"]
    listed = tmp_path / "slow.txt"
    listed.write_text("# a comment\n" + "\n".join(lines) + "\n")
    assert scheduling.read_slow(listed) == {"tests/test_a.py::test_job[2]", "tests/test_a.py::TestThings::test_one"}
    assert scheduling.read_slow(tmp_path / "none.txt") == frozenset()
    listed.write_text("fast tests/test_a.py::test_job\n")
    with pytest.raises(ValueError, match=r"slow.txt:1: 'fast tests/test_a.py::test_job'"):
        scheduling.read_slow(listed)


def test_every_test_the_slow_list_names_exists():
    """A renamed or removed test leaves a stale line: the list is remade (tests/scheduling.py slow).
    Checked where this run collected every test module (the whole suite, whatever -m or -k chose)."""
    modules = {f"tests/{p.name}" for p in scheduling.SLOW_LIST.parent.glob("test_*.py")}
    if not modules <= {node.split("::")[0] for node in scheduling.COLLECTED}:
        pytest.skip("this run did not collect the whole suite")
    listed = scheduling.read_slow()
    assert listed and listed <= scheduling.COLLECTED, sorted(listed - scheduling.COLLECTED)[:5]
