"""FakeYarn against the real skein clients: skein.Client and skein.ApplicationClient.

Container scripts are bash wherever the test does not need the skein client inside the
container (a Python process importing skein costs seconds on a loaded machine); the
one test with Python containers uses ``sys.executable``.
"""

from __future__ import annotations

import io
import os
import re
import signal
import sys
import tarfile
import time
import zipfile

import pytest
import skein
from skein import kv as skv

from fakeyarn import FakeYarn

PY = sys.executable


def wait_until(fn, timeout=20.0, interval=0.05, what="condition"):
    """Poll ``fn`` until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        out = fn()
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for %s" % what)
        time.sleep(interval)


def running(fy, app_id, cid):
    """The live container ``cid`` of the current attempt, once its process runs."""
    return wait_until(lambda: [c for c in fy.containers(app_id) if (c.id or "master") == cid],
                      what="%s running" % cid)[0]


def hdfs_stand_in(source, dest):
    """resolve_file hook: 'downloads' hdfs:// sources by writing their name."""
    with open(dest, "w") as f:
        f.write("remote content of %s\n" % source)


@pytest.fixture(scope="module")
def fy():
    with FakeYarn(resolve_file=hdfs_stand_in) as fake:
        yield fake


@pytest.fixture(scope="module")
def client(fy):
    with skein.Client(address=fy.address, security=fy.security) as c:
        yield c


def test_driver_basics(fy, client):
    assert client.address == fy.address
    with pytest.raises(ValueError, match="Unknown ApplicationId"):
        client.application_report("application_1_9999")
    with pytest.raises(skein.exceptions.DriverError, match="not implemented"):
        client.get_nodes()
    with pytest.raises(skein.exceptions.DriverError, match="does not exist"):
        client.submit(skein.ApplicationSpec(
            name="missing-file", master=skein.Master(script="true",
                                                     files={"x": "/nonexistent/file.txt"})))


MASTER_PY = f"""
{PY} - <<'EOF'
import skein
app = skein.ApplicationClient.from_current()
app.set_progress(0.5)
app.kv['x'] = b'1'
print('master saw', app.kv.wait('w/worker_0'))
app.kv.wait('finish')
print('master done')
EOF
"""

WORKER_PY = f"""
{PY} - <<'EOF'
import os, time, skein
app = skein.ApplicationClient.from_current()
print('worker x =', app.kv.wait('x'))
cid = skein.properties.container_id
app.kv.put('w/' + cid, b'up', owner=cid)
for k in ('SKEIN_CONTAINER_ID', 'CONTAINER_ID', 'SKEIN_RESOURCE_MEMORY',
          'SKEIN_RESOURCE_VCORES', 'GREETING'):
    print('env %s=%s' % (k, os.environ.get(k)))
print('container_dir is cwd:', skein.properties.container_dir == os.getcwd(), flush=True)
time.sleep(60)
EOF
"""


def test_master_and_worker_through_the_kv_store(fy, client):
    spec = skein.ApplicationSpec(
        name="kv-demo", queue="research", tags={"t1"},
        master=skein.Master(script=MASTER_PY),
        services={"worker": skein.Service(resources=skein.Resources(memory=128, vcores=2),
                                          env={"GREETING": "hi"}, script=WORKER_PY)})
    app_id = client.submit(spec)
    assert re.fullmatch(r"application_\d+_\d{4}", app_id)
    app = client.connect(app_id)  # waitForStart
    report = client.application_report(app_id)
    assert str(report.state) == "RUNNING"
    assert app.address == "%s:%d" % (report.host, report.port)
    assert (report.name, report.queue, report.user) == ("kv-demo", "research", fy.user)
    assert app_id in [r.id for r in client.get_applications(states=["RUNNING"])]

    assert app.kv.wait("w/worker_0") == b"up"
    assert app.kv.get("w/worker_0", return_owner=True).owner == "worker_0"
    assert client.application_report(app_id).progress == pytest.approx(0.5)
    (worker,) = app.get_containers()
    assert (worker.id, str(worker.state)) == ("worker_0", "RUNNING")
    assert worker.yarn_container_id.startswith("container_%s" % app_id[len("application_"):])
    assert app.get_specification().services["worker"].env == {"GREETING": "hi"}
    with pytest.raises(ValueError, match="has not completed"):
        client.application_logs(app_id)
    pid = fy.containers(app_id, "worker")[0].pid

    app.kv["finish"] = b"now"
    report = fy.wait(app_id)
    assert (str(report.state), str(report.final_status)) == ("FINISHED", "SUCCEEDED")
    assert report.diagnostics == "Application driver completed successfully."
    assert report.progress == 1.0 and report.finish_time is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the worker went with the application

    logs = client.application_logs(app_id)
    master_log = logs[fy.container(app_id, "master").yarn_id]
    assert "master saw b'up'" in master_log and "master done" in master_log
    assert "LogType:application.driver.log" in master_log
    worker_log = logs[worker.yarn_container_id]
    for line in ("worker x = b'1'", "env SKEIN_CONTAINER_ID=worker_0",
                 "env CONTAINER_ID=%s" % worker.yarn_container_id,
                 "env SKEIN_RESOURCE_MEMORY=128", "env SKEIN_RESOURCE_VCORES=2",
                 "env GREETING=hi", "container_dir is cwd: True"):
        assert line in worker_log


WORKER_SH = 'echo "id=$SKEIN_CONTAINER_ID cid=$CONTAINER_ID mark=$MARK extra=${EXTRA:-}"\nexec sleep 60\n'


def test_restarts_owned_keys_kill_and_scale(fy, client):
    spec = skein.ApplicationSpec(name="restarts", services={"worker": skein.Service(
        resources=skein.Resources(memory=64, vcores=1), max_restarts=2,
        env={"MARK": "m"}, script=WORKER_SH)})
    app_id = client.submit(spec)
    app = client.connect(app_id)
    w0 = running(fy, app_id, "worker_0")

    # keys owned by a container vanish when it dies, with a DELETE event
    app.kv.put("owned", b"v", owner="worker_0")
    app.kv["free"] = b"f"
    events = app.kv.events(key="owned", event_type="DELETE")
    fy.kill_container(app_id, "worker_0")  # SIGKILL from outside: a failure
    event = events.get(timeout=10)
    assert (event.key, str(event.event_type)) == ("owned", "DELETE")
    assert "owned" not in app.kv and app.kv["free"] == b"f"
    assert w0.returncode == 137

    # ... and the failed container is replaced by a new instance with the same env
    w1 = running(fy, app_id, "worker_1")
    assert (w1.env["MARK"], w1.env["SKEIN_CONTAINER_ID"]) == ("m", "worker_1")
    assert w1.env["CONTAINER_ID"] != w0.env["CONTAINER_ID"]
    (failed,) = app.get_containers(states=["FAILED"])
    assert failed.id == "worker_0" and "failed during execution" in failed.exit_message

    # add_container's env overrides survive a restart too
    assert app.add_container("worker", env={"EXTRA": "e"}).id == "worker_2"
    running(fy, app_id, "worker_2")
    fy.kill_container(app_id, "worker_2", sig=signal.SIGTERM)
    w3 = running(fy, app_id, "worker_3")
    assert (w3.env["EXTRA"], w3.env["MARK"]) == ("e", "m")

    # skein's kill_container is a KILL, not a failure: no restart
    app.kill_container("worker_1")
    assert [c.id for c in app.get_containers()] == ["worker_3"]
    assert [c.id for c in app.get_containers(states=["KILLED"])] == ["worker_1"]
    wait_until(lambda: not w1.alive, what="worker_1 stopped")

    # scale up then down (the oldest running container goes)
    assert [c.id for c in app.scale("worker", count=2)] == ["worker_4"]
    running(fy, app_id, "worker_4")
    assert [c.id for c in app.scale("worker", delta=-1)] == ["worker_3"]
    assert [c.id for c in app.get_containers()] == ["worker_4"]

    # transactions and owner checks
    ok = app.kv.transaction(conditions=[skv.missing("t")], on_success=[skv.put("t", b"1")])
    assert ok.succeeded
    assert not app.kv.transaction(conditions=[skv.missing("t")]).succeeded
    res = app.kv.transaction(conditions=[skv.value("t") == b"1", skv.exists("free")],
                             on_success=[skv.get("t"), skv.discard("free")])
    assert res == (True, [b"1", True]) and "free" not in app.kv
    with pytest.raises(ValueError, match="no container instance"):
        app.kv.put("t", owner="worker_9")
    with pytest.raises(ValueError, match="already completed"):
        app.kv.put("t", owner="worker_0")
    assert app.kv.setdefault("s", b"d") == b"d" and app.kv.get_range() == {"s": b"d", "t": b"1"}

    # restarts exhausted (2 used): the next failure fails the service and the application
    fy.kill_container(app_id, "worker_4")
    report = fy.wait(app_id)
    assert (str(report.state), str(report.final_status)) == ("FINISHED", "FAILED")
    assert report.diagnostics == "Failure in service worker, see logs for more information."
    logs = client.application_logs(app_id)
    assert "id=worker_3 cid=%s mark=m extra=e" % w3.yarn_id in logs[w3.yarn_id]
    assert fy.containers(app_id) == []


MASTER_ATTEMPTS_SH = """
echo "master in $CONTAINER_ID"
case "$CONTAINER_ID" in *_01_000001) F=$FLAG1;; *) F=$FLAG2;; esac
while [ ! -e "$F" ]; do sleep 0.05; done
exit 1
"""


def test_master_attempts_start_afresh(fy, client, tmp_path):
    flag1, flag2 = tmp_path / "flag1", tmp_path / "flag2"
    spec = skein.ApplicationSpec(
        name="attempts", max_attempts=2,
        master=skein.Master(script=MASTER_ATTEMPTS_SH, env={"FLAG1": str(flag1), "FLAG2": str(flag2)}),
        services={"worker": skein.Service(resources=skein.Resources(memory=64, vcores=1),
                                          script="exec sleep 60")})
    app_id = client.submit(spec)
    app1 = client.connect(app_id)
    app1.kv["state"] = b"from attempt 1"
    m1 = running(fy, app_id, "master")
    assert m1.env["CONTAINER_ID"].endswith("_01_000001") and "SKEIN_CONTAINER_ID" not in m1.env

    flag1.touch()  # attempt 1's master exits 1: a second attempt starts
    fy.wait(app_id, states=["RUNNING"], attempt=2)
    app2 = client.connect(app_id)
    assert app2.address != app1.address
    assert "state" not in app2.kv  # skein's kv store lives in the AM: gone with attempt 1
    m2 = running(fy, app_id, "master")
    assert m2.env["CONTAINER_ID"] == m1.env["CONTAINER_ID"].replace("_01_000001", "_02_000001")
    w0 = running(fy, app_id, "worker_0")  # fresh service containers, numbering restarts
    assert "_02_" in w0.yarn_id

    flag2.touch()  # last attempt's master exits 1: the application fails
    report = fy.wait(app_id)
    assert (str(report.state), str(report.final_status)) == ("FINISHED", "FAILED")
    assert "exit code 1" in report.diagnostics
    logs = client.application_logs(app_id)
    for m in (m1, m2):
        assert "master in %s" % m.yarn_id in logs[m.yarn_id]


def test_killed_master_and_crashed_am(fy, client):
    spec = skein.ApplicationSpec(name="crashes", max_attempts=2,
                                 master=skein.Master(script="exec sleep 60"))
    app_id = client.submit(spec)
    client.connect(app_id)
    fy.kill_container(app_id, "master")  # the master script is SIGKILLed: attempt 2
    report = fy.wait(app_id, states=["RUNNING"], attempt=2)
    assert "exit code 137" in report.diagnostics
    running(fy, app_id, "master")
    fy.fail_attempt(app_id)  # the AM container itself dies on the last attempt
    report = fy.wait(app_id)
    assert (str(report.state), str(report.final_status)) == ("FAILED", "FAILED")
    assert "failed 2 times" in report.diagnostics
    assert len(client.application_logs(app_id)) == 2


def test_shutdown_failed_is_retried_like_skein(fy, client):
    # skein unregisters only a SUCCEEDED attempt or the last one; 5 attempts capped at 2
    spec = skein.ApplicationSpec(name="retry", max_attempts=5,
                                 master=skein.Master(script="exec sleep 60"))
    app_id = client.submit(spec)
    client.connect(app_id).shutdown("FAILED", "job error")
    report = fy.wait(app_id, states=["RUNNING"], attempt=2)
    assert "job error" in report.diagnostics
    client.connect(app_id).shutdown("FAILED", "job error again")
    report = fy.wait(app_id)
    assert (str(report.state), str(report.final_status)) == ("FINISHED", "FAILED")
    assert report.diagnostics == "job error again" and fy.attempt(app_id) == 2


def _archive_inputs(tmp_path):
    plain = tmp_path / "data.txt"
    plain.write_text("plain file\n")
    tgz = tmp_path / "bundle.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        body = b"from the tarball\n"
        info = tarfile.TarInfo("sub/inner.txt")
        info.size = len(body)
        tf.addfile(info, io.BytesIO(body))
    zpath = tmp_path / "bundle.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.writestr("inner.txt", "from the zip\n")
    return plain, tgz, zpath


def test_files_shutdown_and_kill(fy, client, tmp_path):
    plain, tgz, zpath = _archive_inputs(tmp_path)
    script = ('cat data.txt tgz/sub/inner.txt zz/inner.txt remote.txt; '
              'echo "mem=$SKEIN_RESOURCE_MEMORY vcores=$SKEIN_RESOURCE_VCORES dir=$(pwd)"; '
              'echo ready; exec sleep 60')
    spec = skein.ApplicationSpec(name="files", master=skein.Master(
        resources=skein.Resources(memory=256, vcores=1), script=script,
        files={"data.txt": str(plain), "tgz": str(tgz), "zz": str(zpath),
               "remote.txt": "hdfs://namenode:8020/user/me/remote.txt"}))
    app_id = client.submit(spec)
    app = client.connect(app_id)
    master = running(fy, app_id, "master")
    wait_until(lambda: "ready" in master.read_log(), what="master ready")
    out = master.read_log()
    for text in ("plain file", "from the tarball", "from the zip",
                 "remote content of hdfs://namenode:8020/user/me/remote.txt",
                 "mem=256 vcores=1 dir=%s" % master.workdir):
        assert text in out
    assert master.workdir.parent == fy.app_dir(app_id)

    app.shutdown("KILLED", "stopped by the test")
    report = fy.wait(app_id)
    assert (str(report.state), str(report.final_status)) == ("FINISHED", "KILLED")
    assert report.diagnostics == "stopped by the test"
    assert not master.alive

    # kill_application on a second, service-only application
    app_id2 = client.submit(skein.ApplicationSpec(name="to-kill", services={
        "sleeper": skein.Service(resources=skein.Resources(memory=64, vcores=1),
                                 script="exec sleep 60"),
        "follower": skein.Service(resources=skein.Resources(memory=64, vcores=1),
                                  depends=["sleeper"], script="exec sleep 60")}))
    client.connect(app_id2)
    sleeper = running(fy, app_id2, "sleeper_0")
    follower = running(fy, app_id2, "follower_0")  # started once its dependency runs
    assert app_id2 in [r.id for r in client.get_applications()]
    client.kill_application(app_id2)
    report = client.application_report(app_id2)
    assert (str(report.state), str(report.final_status)) == ("KILLED", "KILLED")
    assert not sleeper.alive and not follower.alive
    assert app_id2 not in [r.id for r in client.get_applications()]
    assert app_id2 in [r.id for r in client.get_applications(states=["KILLED"])]
    assert sleeper.yarn_id in client.application_logs(app_id2)
