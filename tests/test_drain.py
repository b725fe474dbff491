"""Workers leave a node being decommissioned (issue 52 part 6, iterreduce.launch.yarn.drain): which nodes the
ResourceManager drains (Hadoop's ``yarn node -list`` as a fake java prints it), which workers the
application master then drains (on skein's answers as a fake application gives them), and what a
drained worker does in a running job (master and workers in this process: its shards move, it retires,
a new process of its slot takes them back, the model the same as undisturbed). On a real three-node
Hadoop: tests/test_multinode.py."""

from __future__ import annotations

import logging
import threading

import pytest

from conftest_runtime import SOFTMAX, assert_same_bits, events, load_npz, records, simulate
from iterreduce.launch.yarn import drain
from iterreduce.launch.yarn.appspec import DECOMMISSION_CHECK_VAR, YarnOptions, build_spec
from iterreduce.launch.yarn.drain import Drainer, decommissioning_hosts, parse_node_list
from iterreduce.master.membership import Membership
from test_keeper import App
from test_scale import CONFIG, changing_job, wait_for

# `yarn node -list -states DECOMMISSIONING` as Hadoop 3 prints it (tabs and padding as there).
NODE_LIST = """\
2026-11-29 04:01:02,345 INFO client.DefaultNoHARMFailoverProxyProvider: Connecting to ResourceManager
Total Nodes:2
         Node-Id\t     Node-State\tNode-Http-Address\tNumber-of-Running-Containers
 10.0.0.7:45454\tDECOMMISSIONING\t  10.0.0.7:8042\t                           1
node3.example.com:8041\tDECOMMISSIONING\tnode3.example.com:8042\t                           0
"""


def test_the_node_list_gives_the_hosts_being_decommissioned():
    assert parse_node_list(NODE_LIST) == {"10.0.0.7", "node3.example.com"}
    assert parse_node_list("Total Nodes:0\n  Node-Id\tNode-State\tNode-Http-Address\tNumber\n") == set()
    assert parse_node_list("node1:45454\tRUNNING\tnode1:8042\t3\n") == set()


@pytest.fixture
def fake_java(tmp_path, monkeypatch):
    """A java that checks it runs Hadoop's NodeCLI on the container's classpath, and prints the list
    (or fails with $FAIL); it records the token file it ran with."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    (tmp_path / "list.txt").write_text(NODE_LIST)
    java.write_text(f"""#!/bin/sh
[ "$1 $2 $3" = "{' '.join(drain.NODE_CLI_OPTIONS)}" ] || exit 10
[ "$4" = -cp ] && [ "$5" = hadoop-classpath ] && [ "$6" = {drain.NODE_CLI} ] || exit 9
[ "$7" = -list ] && [ "$8" = -states ] && [ "$9" = DECOMMISSIONING ] || exit 8
echo "$HADOOP_TOKEN_FILE_LOCATION" > {tmp_path}/tokens-used
if [ -n "$FAIL" ]; then echo "2026-11-29 04:01:02,345 INFO client.RMProxy: noise" >&2; echo "Failed to connect to the ResourceManager" >&2; exit 1; fi
cat {tmp_path}/list.txt
""")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(home))
    monkeypatch.setenv("CLASSPATH", "hadoop-classpath")
    monkeypatch.setenv("HADOOP_TOKEN_FILE_LOCATION", "/container/tokens")
    return tmp_path


def test_the_hosts_come_from_hadoops_node_tool_with_the_containers_first_credentials(fake_java, monkeypatch):
    assert decommissioning_hosts() == {"10.0.0.7", "node3.example.com"}
    assert (fake_java / "tokens-used").read_text().strip() == "/container/tokens"
    assert decommissioning_hosts("/container/first-tokens") == {"10.0.0.7", "node3.example.com"}
    assert (fake_java / "tokens-used").read_text().strip() == "/container/first-tokens"
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(RuntimeError, match=r"`yarn node -list` exit 1: Failed to connect to the ResourceManager$"):
        decommissioning_hosts()


class DrainingMaster:
    """What the drainer asks of the job's master: drain a worker by name (True when it was live)."""

    def __init__(self, live):
        self.live, self.drained = set(live), []

    def drain(self, name, why):
        if name not in self.live:
            return False
        self.live.discard(name)
        self.drained.append((name, why))
        return True


def app_on_nodes(placement: dict[str, str]) -> App:
    """A fake application whose container ``worker-K_1`` holds slot K on the host given."""
    app = App()
    for container, host in placement.items():
        app.run(container, slot=int(container.split("-")[1].split("_")[0]) if container.startswith("worker-") else None)
        app.containers[container].yarn_node_http_address = f"{host}:8042"
    return app


def test_the_workers_on_a_node_being_decommissioned_are_drained_once_each(caplog):
    app = app_on_nodes({"worker-0_1": "n1", "worker-1_1": "n2", "worker-2_1": "n2", "worker-3_1": "n3"})
    master = DrainingMaster({"worker-0", "worker-1", "worker-2", "worker-3"})
    hosts: set[str] = set()
    drainer = Drainer(app, master, interval=1.0, hosts=lambda: hosts, am_host="n3")
    assert drainer.check() == [] and master.drained == []
    hosts.add("n2")
    assert drainer.check() == ["worker-1", "worker-2"]
    assert master.drained == [("worker-1", "its node n2 is being decommissioned"),
                              ("worker-2", "its node n2 is being decommissioned")]
    assert drainer.check() == []  # once each: the containers are still there, draining
    # Their slots' new containers land elsewhere; one that lands on n2 would be drained too.
    app.run("worker-any_7", slot=1)
    app.containers["worker-any_7"].yarn_node_http_address = "n1:8042"
    master.live.add("worker-1")
    assert drainer.check() == []
    # The application master's own node cannot be left: it says so once, and drains the workers there.
    hosts.add("n3")
    with caplog.at_level(logging.WARNING, logger="iterreduce.yarn"):
        assert drainer.check() == ["worker-3"]
        drainer.check()
    assert [r.message for r in caplog.records].count(
        "the application master's node n3 is being decommissioned: the job goes on there until YARN ends it, "
        "and the next attempt resumes elsewhere") == 1


def test_a_look_that_fails_is_said_once_until_one_succeeds(caplog):
    app = app_on_nodes({"worker-0_1": "n1"})
    outcomes = [RuntimeError("no ResourceManager"), RuntimeError("no ResourceManager"), set(), RuntimeError("again")]

    def hosts():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    drainer = Drainer(app, DrainingMaster({"worker-0"}), interval=1.0, hosts=hosts)
    with caplog.at_level(logging.INFO, logger="iterreduce.yarn"):
        for _ in range(4):
            assert drainer.check() == []
    assert [r.message for r in caplog.records] == [
        "cannot tell which nodes are being decommissioned: no ResourceManager",
        "nodes being decommissioned: none (a look every 1 s)",  # it works: said once
        "cannot tell which nodes are being decommissioned: again"]


def test_the_look_is_set_per_job_and_off_at_zero(tmp_path, monkeypatch):
    def master_env(**options):
        spec = build_spec("j", str(tmp_path / "job.json"), YarnOptions(python="/usr/bin/python3", **options))
        return spec.master.env

    assert master_env()[DECOMMISSION_CHECK_VAR] == "30"
    assert master_env(decommission_check=2.5)[DECOMMISSION_CHECK_VAR] == "2.5"
    with pytest.raises(Exception, match=r"decommission_check must be >= 0 seconds, got -1"):
        master_env(decommission_check=-1)
    monkeypatch.setenv(DECOMMISSION_CHECK_VAR, "0")
    assert Drainer.from_container(App(), DrainingMaster(()), None) is None
    monkeypatch.setenv(DECOMMISSION_CHECK_VAR, "soon")
    assert Drainer.from_container(App(), DrainingMaster(()), None) is None


def test_a_draining_worker_gives_its_shards_up_at_a_rounds_start_unless_it_is_alone():
    work = threading.Condition()
    members = Membership(4, 2, work=work, on_moved=lambda shard: None)
    with work:
        alone = members.register("worker-0", "h", "", in_flight={})
        alone.draining = "its node h is being decommissioned"
        members.rebalance()
        assert sorted(alone.shards) == [0, 1, 2, 3]  # nowhere else to go: it keeps them
        other = members.register("worker-1", "h2", "", in_flight={})
        members.rebalance()
        assert (sorted(alone.shards), sorted(other.shards)) == ([], [0, 1, 2, 3])
        assert not members.wanted(alone) and members.wanted(other)
        assert [row["state"] for row in members.table(finished=False, now=0.0)] == ["draining", "idle"]


def test_a_drained_worker_leaves_and_its_slots_new_process_gives_the_undisturbed_model(tmp_path, monkeypatch):
    """What a node being decommissioned does to a running job: worker-1 is drained at step 3, retires
    (exit 0) and a new worker-1 (elsewhere, on YARN) joins; no worker is lost, no step goes without a
    shard, and the model is bit-identical to the undisturbed run's."""
    def decommission(master, start, exits):  # what the drainer and the keeper do
        wait_for(lambda: master.current >= 3, what="step 3")
        assert master.drain("worker-1", "its node h1 is being decommissioned")
        assert not master.drain("worker-1", "again")  # once
        wait_for(lambda: exits.get("worker-1") == [0], what="worker-1 to retire")
        start("worker-1")

    out, exits, uris = changing_job(tmp_path, monkeypatch, decommission, seed=5)
    assert exits == {"worker-0": [0], "worker-1": [0, 0], "worker-2": [0]}
    draining = events(out, "worker_draining")
    assert [(e["worker"].split("#")[0], e["reason"], e["step"] >= 3) for e in draining] == [
        ("worker-1", "its node h1 is being decommissioned", True)]
    retired = events(out, "worker_retired")
    assert [(e["worker"].split("#")[0], e["reason"]) for e in retired] == [
        ("worker-1", "its node h1 is being decommissioned")]
    assert len([e for e in events(out, "worker_registered") if e["worker"].startswith("worker-1#")]) == 2
    assert not events(out, "worker_lost")
    assert all(r["shards"] == 6 for r in records(out))
    assert_same_bits(load_npz(out / "parameters.npz"), simulate(SOFTMAX, CONFIG, uris))
