"""The test cluster itself (tests/minihadoop.py): what its scripts answer, and that stopping it
leaves nothing running."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from iterreduce.launch.yarn.skein_import import skein

pytestmark = [pytest.mark.yarn, pytest.mark.hdfs]


def test_the_scripts_answer_what_skein_and_a_person_ask(hadoop):
    classpath = hadoop.run("yarn", "classpath", "--glob")  # what skein's driver runs
    assert classpath.returncode == 0 and str(hadoop.conf_dir) in classpath.stdout
    nodes = hadoop.run("yarn", "node", "-list", "-showDetails")
    assert nodes.returncode == 0 and "RUNNING" in nodes.stdout
    assert "yarn.io/gpu: 2" in nodes.stdout  # the declared GPUs, as the ResourceManager counts them
    listing = hadoop.run("hdfs", "dfs", "-ls", "/")
    assert listing.returncode == 0 and "/user" in listing.stdout and "/tmp" in listing.stdout
    refreshed = hadoop.run("yarn", "rmadmin", "-refreshNodes")  # an administrator's (decommission)
    assert refreshed.returncode == 0, refreshed.stderr[-2000:]
    unknown = hadoop.run("yarn", "top")
    assert unknown.returncode == 1 and "yarn top: not available in this MiniHadoop" in unknown.stderr


@pytest.fixture(scope="module")
def echo_app(hadoop, tmp_path_factory):
    """A finished application of the session's cluster whose one container echoed a marker, once
    YARN has aggregated its logs to HDFS: (its id, the marker, the aggregated files)."""
    from pyarrow import fs as pafs

    from yarnjobs import shared_driver

    folder = tmp_path_factory.mktemp("echo")
    marker = f"logged-by-{folder.name}"
    with shared_driver(hadoop, folder / "skein") as yarn:
        spec = skein.ApplicationSpec(name="echo", master=skein.Master(
            resources=skein.Resources(memory="256 MiB", vcores=1), script=f"echo {marker}"))
        app_id = yarn.client.submit(spec)
        assert str(yarn.wait(app_id, timeout=120).final_status) == "SUCCEEDED"
    deadline = time.monotonic() + 60
    while not (aggregated := [info.path for info in hadoop.fs().get_file_info(
            pafs.FileSelector("/tmp/logs", recursive=True)) if f"/{app_id}/" in info.path
            and info.type == pafs.FileType.File and not info.path.endswith(".tmp")]):
        assert time.monotonic() < deadline, f"{app_id}'s logs not aggregated to /tmp/logs after 60 s"
        time.sleep(0.5)
    return app_id, marker, aggregated


def test_a_finished_applications_container_logs_stay_readable_on_its_node_after_aggregation(hadoop, echo_app):
    """YARN aggregates a finished application's container logs to HDFS and then deletes them from
    the node; the tests read them from the node (Yarn.node_logs) after the end: the cluster keeps
    them (CI once saw "(no container logs)" where a drill asserted its master's message)."""
    from yarnjobs import Yarn

    app_id, marker, aggregated = echo_app
    # The node schedules the deletion before it renames the upload into place (seen by echo_app):
    # without the cluster's keeping, the logs are gone within milliseconds of it.
    time.sleep(0.5)
    logs = Yarn(hadoop, None).node_logs(app_id)
    assert marker in logs, (aggregated, logs)


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_dbn_status_with_a_driver_of_its_own_shows_the_projects_words_only_and_the_drivers_with_debug(
        hadoop, echo_app, tmp_path, debug):
    """`dbn status APP` where no skein driver runs starts one: its Java log (INFO and WARN lines of
    Hadoop's client) stays off the terminal; --debug shows it, each line marked as the driver's."""
    import subprocess
    import sys

    app_id = echo_app[0]
    env = {k: v for k, v in os.environ.items() if k not in ("ITERREDUCE_SKEIN_DRIVER", "SKEIN_CONFIG")}
    env.update(hadoop.env(), HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "dbn.cli", "status", app_id, *(["--debug"] * debug)],
                          env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert app_id in proc.stdout and "FINISHED" in proc.stdout, proc.stdout
    if debug:
        shown = proc.stderr.splitlines()
        assert shown and all(line.startswith("skein driver: ") for line in shown), proc.stderr
        assert any(" INFO " in line for line in shown), proc.stderr
    else:
        assert proc.stderr == ""


def cmdline(pid: int) -> bytes:
    """A process's command line, or b"" once it has ended (containers' launch scripts come and go)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize("jvm_killed_first", [False, True], ids=["stop", "jvm-sigkilled-then-stop"])
def test_stop_ends_the_jvm_and_every_container_it_started(tmp_path, jvm_killed_first):
    """A clean stop (the JVM stops YARN, which stops its containers), and a JVM that died by SIGKILL
    first (its containers live on, orphaned, until stop() finds and kills them)."""
    from minihadoop import MiniHadoop, processes_of

    cluster = MiniHadoop(base_dir=tmp_path, memory_mb=2048).start()
    directory = cluster.dir
    saved = dict(os.environ)
    os.environ.update(cluster.env())
    try:
        client = skein.Client(security=skein.Security.new_credentials())
        spec = skein.ApplicationSpec(name="sleeper", master=skein.Master(
            resources=skein.Resources(memory="256 MiB", vcores=1), script="sleep 600"))
        app_id = client.submit(spec)
        deadline = time.monotonic() + 120
        while str(client.application_report(app_id).state) != "RUNNING":
            assert time.monotonic() < deadline, client.application_report(app_id).diagnostics
            time.sleep(0.5)
        client.close()
        # RUNNING means skein's application master has registered; it starts the script just after
        # (on a busy machine, seconds after): wait for the sleeper to appear.
        while not (sleepers := [pid for pid in processes_of(directory) if cmdline(pid) == b"sleep\x00600\x00"]):
            assert time.monotonic() < deadline, processes_of(directory)
            time.sleep(0.2)
        assert len(sleepers) == 1, processes_of(directory)
        if jvm_killed_first:
            cluster._proc.kill()
            cluster._proc.wait()
            assert Path(f"/proc/{sleepers[0]}").exists()  # orphaned, still running
    finally:
        os.environ.clear()
        os.environ.update(saved)
        cluster.stop()
    assert not cluster.running
    assert processes_of(directory) == []
    assert not Path(f"/proc/{sleepers[0]}").exists() or "Z" in Path(f"/proc/{sleepers[0]}/stat").read_text().split()[2]
    assert not directory.exists()


def test_the_cluster_stops_itself_when_the_process_that_started_it_dies(tmp_path):
    """`python tests/minihadoop.py` killed with SIGKILL (no clean-up runs in it): the JVM sees its
    stdin end, stops YARN and HDFS, and exits."""
    import shutil
    import signal
    import subprocess
    import sys

    from minihadoop import processes_of

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    starter = subprocess.Popen([sys.executable, str(Path(__file__).with_name("minihadoop.py"))], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    banner = [starter.stdout.readline() for _ in range(5)]
    logs = [line for line in banner if line.startswith("Logs: ")]
    assert logs, banner
    directory = Path(logs[0].split()[1]).parent
    assert processes_of(directory)  # the JVM runs
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    deadline = time.monotonic() + 60
    while processes_of(directory):
        assert time.monotonic() < deadline, f"still running after the starter died: {processes_of(directory)}"
        time.sleep(0.5)
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("order", ["old-first", "new-first"])
def test_a_hosts_state_is_its_newest_nodemanagers_whatever_order_yarn_lists_them_in(monkeypatch, order):
    """A NodeManager started again on a host is a new node at the ResourceManager: the old one stays
    listed beside it, SHUTDOWN or LOST. The host's state is the live one's."""
    import io
    import json
    import urllib.request

    from minihadoop import MiniHadoop

    nodes = [{"nodeHostName": "127.0.0.2", "state": "SHUTDOWN"}, {"nodeHostName": "127.0.0.2", "state": "DECOMMISSIONING"},
             {"nodeHostName": "127.0.0.3", "state": "LOST"}, {"nodeHostName": "127.0.0.4", "state": "RUNNING"}]
    if order == "new-first":
        nodes = [nodes[1], nodes[0], *nodes[2:]]
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda url, timeout: io.BytesIO(json.dumps({"nodes": {"node": nodes}}).encode()))
    cluster = MiniHadoop(nodes=3)
    cluster.rm_web = "rm:8088"
    assert cluster.node_states() == {"127.0.0.2": "DECOMMISSIONING", "127.0.0.3": "LOST", "127.0.0.4": "RUNNING"}
