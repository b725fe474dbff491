"""`dbn submit` end to end on the Kerberos-secured Hadoop (tests/securehadoop.py), through skein's own
driver and application master: the containers hold delegation tokens only, never a ticket or, but for
the application master of a job submitted with a keytab, a keytab.

The containers run this checkout's Python (``[yarn] python``: a Python installed on every node, here
the one node); tests/test_yarn.py covers the packed environment on the unsecured cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from iterreduce.launch.yarn.skein_import import skein

from dbn.cli import main
from iterreduce.storage.filesystems import KEYTAB_LOGIN_VARS
from yarnjobs import Yarn, job_file, shared_driver, shipped_job, upload

pytestmark = [pytest.mark.kerberos, pytest.mark.yarn, pytest.mark.hdfs,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def user_uri(cluster, path: str) -> str:
    """A URI in the user's HDFS home (the secured NameNode lets the user write nowhere else)."""
    return cluster.uri(f"/user/{cluster.principal.split('@')[0]}/{path.lstrip('/')}")


def python_job(tmp_path, output: str, **kwargs) -> str:
    """:func:`yarnjobs.job_file` run by this checkout's Python on the node."""
    return job_file(tmp_path, output, extra=f'python = "{sys.executable}"\n' + kwargs.pop("extra", ""), **kwargs)


def submit(capsys, *args) -> str:
    assert main(["submit", *args, "--quiet"]) == 0, capsys.readouterr().err[-3000:]
    return capsys.readouterr().out.strip()


def dbn(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def audit(cluster, needle: str) -> list[str]:
    """The NameNode's audit lines that contain ``needle``."""
    return [line for line in cluster.log_file.read_text(errors="replace").splitlines()
            if "FSNamesystem.audit" in line and needle in line]


def written_by(cluster, folder: str) -> dict[str, set[str]]:
    """``{file: {how its writers authenticated}}`` for the files created under ``folder`` (HDFS path)."""
    found: dict[str, set[str]] = {}
    for line in audit(cluster, "\tcmd=create\t"):
        fields = dict(part.split("=", 1) for part in line.split("\t") if "=" in part)
        if fields.get("src", "").startswith(folder + "/"):
            found.setdefault(fields["src"], set()).add(fields["ugi"].split("(auth:")[1].rstrip(")"))
    return found


@pytest.fixture(scope="module")
def secure_yarn(secure_hadoop, tmp_path_factory):
    """The client's environment after ``kinit`` (ticket cache, KRB5_CONFIG, HADOOP_CONF_DIR), skein's
    credentials of its own, and one skein driver (logged in from the ticket cache) that the in-process
    CLI calls share."""
    with shared_driver(secure_hadoop, tmp_path_factory.mktemp("skein")) as yarn:
        yield yarn


def test_a_job_submitted_with_a_ticket_runs_on_delegation_tokens_alone(secure_yarn, tmp_path, capsys):
    """From the ticket cache: `dbn shard` writes the shards onto the secured HDFS from this machine,
    the containers read them and write the checkpoints, the log and the model with the submission's
    delegation tokens (the NameNode's audit says TOKEN for every one of their files), the application
    master asks the ResourceManager for nodes being decommissioned with them, and `dbn status`
    and `dbn logs` read the application's state and its aggregated logs with the ticket."""
    cluster = secure_yarn.hadoop
    shards, output = user_uri(cluster, "ticket/shards"), user_uri(cluster, "ticket/out")
    path = python_job(tmp_path, output, epochs=4, finetune=2, extra="decommission_check = 1",
                      cluster_extra=f'shards = "{shards}"')
    assert main(["shard", str(tmp_path / "train.npz"), shards, "--shards", "2"]) == 0
    capsys.readouterr()
    app_id = submit(capsys, path)

    report = secure_yarn.wait(app_id)
    secure_yarn.assert_succeeded(report, app_id)
    home = f"/user/{cluster.principal.split('@')[0]}/ticket"
    assert written_by(cluster, f"{home}/shards") and all(
        how == {"KERBEROS"} for how in written_by(cluster, f"{home}/shards").values())  # this machine, its ticket
    by_containers = {name: how for name, how in written_by(cluster, f"{home}/out").items()
                     if "/checkpoints/" in name or name.rsplit("/", 1)[1].startswith((".model.npz", ".log.jsonl"))}
    assert any("/checkpoints/" in name for name in by_containers) and any(".model.npz" in n for n in by_containers)
    assert all(how == {"TOKEN"} for how in by_containers.values()), by_containers
    records = secure_yarn.hdfs_json_lines(f"{home}/out/log.jsonl")
    assert records[-1]["event"] == "done"

    code, out, _ = dbn(capsys, "status", app_id)
    assert code == 0 and f"{app_id}: FINISHED (SUCCEEDED)" in out
    deadline = time.monotonic() + 60
    while True:  # aggregation to HDFS follows the application's end
        code, logs, err = dbn(capsys, "logs", app_id)
        if code == 0 and "working as worker-1" in logs or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert code == 0, err
    for text in ("attempt 1 serving 2 shards", "working as worker-0", "working as worker-1", "outputs written",
                 # The application master asked the secured ResourceManager for its nodes being
                 # decommissioned with the token skein gave it (iterreduce.launch.yarn.drain).
                 "nodes being decommissioned: none (a look every 1 s)"):
        assert text in logs, text
    assert app_id in cluster.run("hdfs", "dfs", "-ls", "-R", "/tmp/logs").stdout  # aggregated on the secured HDFS
    assert "using the master's HDFS delegation tokens" not in logs  # a ticket-cache job keeps its submission's


def test_a_killed_application_master_resumes_on_the_secured_cluster(secure_yarn, tmp_path, capsys):
    """The application master's container killed: YARN's second attempt (localized with the tokens the
    ResourceManager keeps renewing) resumes from the newest checkpoint on the secured HDFS. (A killed
    worker's new container, which rejoins with the master's tokens, is the keytab test's.)"""
    cluster = secure_yarn.hadoop
    output = user_uri(cluster, "faults")
    app_id = submit(capsys, python_job(tmp_path, output, epochs=10))
    secure_yarn.wait_step(app_id, 7)
    am_container = f"container_{app_id.removeprefix('application_')}_01_000001"
    (group,) = {os.getpgid(p) for p in secure_yarn.pids(am_container, "com.anaconda.skein.ApplicationMaster")}
    os.killpg(group, signal.SIGKILL)  # the whole container: skein's AM and our master

    report = secure_yarn.wait(app_id, timeout=300)
    secure_yarn.assert_succeeded(report, app_id)
    records = secure_yarn.hdfs_json_lines(f"/user/{cluster.principal.split('@')[0]}/faults/log.jsonl")
    events = [r.get("event") for r in records]  # the second attempt's log: it starts where the first stopped
    assert events.count("resumed") == 1 and records[-1]["event"] == "done", events
    # Checkpoints are written while the next step computes: after step 7 the one after step 5 is complete.
    resumed = next(r for r in records if r.get("event") == "resumed")
    assert resumed["step"] >= 6, resumed
    step_records = [r for r in records if "step" in r and "phase" in r]
    steps = [r["step"] for r in step_records]
    assert steps[0] == resumed["step"] and steps[-1] == step_records[-1]["of"] - 1  # only what was left
    assert records[-2]["event"] == "checkpoint"
    assert any(p.name.endswith("_02_000001") for p in cluster.dir.glob(f"cluster/**/{app_id}/container_*"))
    registered = [r["worker"] for r in records if r.get("event") == "worker_registered"]
    assert {w.split("#")[0] for w in registered} == {"worker-0", "worker-1"}, registered


def test_status_the_live_page_through_the_secured_proxy_and_kill(secure_yarn, tmp_path, capsys):
    """While the job runs: `dbn status` shows its superstep and live page; YARN's proxy asks a browser
    without a ticket for SPNEGO and serves the page to one with a ticket (curl --negotiate, as a
    browser set up for Kerberos does); `dbn kill` ends the job KILLED."""
    curl = shutil.which("curl")
    output = user_uri(secure_yarn.hadoop, "live")
    app_id = submit(capsys, python_job(tmp_path, output, epochs=200))
    secure_yarn.wait_step(app_id, 2)
    code, out, _ = dbn(capsys, "status", app_id, "--json")
    status = json.loads(out)
    assert code == 0 and status["state"] == "RUNNING" == str(secure_yarn.report(app_id).state)
    assert 0 < status["progress"] <= 1 and status["record"]["phase"] == "pretrain"
    code, out, _ = dbn(capsys, "status", app_id)
    assert code == 0 and f"{app_id}: RUNNING" in out and "superstep" in out and "pretrain layer 0" in out, out
    page = next(line.split()[-1] for line in out.splitlines() if "live view:" in line)
    assert page == status["live_view"] and page.endswith("/training/")
    assert page.startswith(f"http://{secure_yarn.hadoop.rm_web}/proxy/{app_id}/")
    code, out, _ = dbn(capsys, "logs", app_id)  # a running application: the NodeManager serves its logs
    assert code == 0 and "serving 2 shards" in out, out[-2000:]

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(page, timeout=60)
    assert refused.value.code == 401 and refused.value.headers.get("WWW-Authenticate") == "Negotiate"
    assert curl, "curl (with SPNEGO: Debian's) is needed to read a Kerberos-protected page"
    fetched = subprocess.run([curl, "--silent", "--show-error", "--negotiate", "--user", ":", "--location",
                              "--write-out", "\n%{http_code}", page], capture_output=True, text=True, timeout=60,
                             env=os.environ.copy())
    body, status = fetched.stdout.rsplit("\n", 1)
    assert status == "200", (status, fetched.stderr, body[:500])
    assert "<title>Training job</title>" in body

    code, out, err = dbn(capsys, "kill", app_id)
    assert code == 0, err
    report = secure_yarn.wait(app_id)
    assert str(report.state) == "KILLED"
    code, out, _ = dbn(capsys, "status", app_id)
    assert code == 0 and f"{app_id}: KILLED" in out
    code, _, err = dbn(capsys, "status", "application_1_9999")
    assert code == 2 and "application_1_9999: no such application" in err


def test_shard_and_predict_read_and_write_the_secured_hdfs_from_the_submitting_machine(secure_yarn, tmp_path, capsys):
    """`dbn shard` onto the secured HDFS, and `dbn predict` of a table there into a file there, with the
    user's ticket; without one each stops with a one-line error that says to run kinit, having
    written nothing."""
    from test_table_jobs import write_animals

    cluster = secure_yarn.hadoop
    rows = write_animals(tmp_path / "animals")
    table = user_uri(cluster, "kt-predict/animals")
    fs = cluster.fs()
    upload(fs, tmp_path / "animals", f"/user/{cluster.principal.split('@')[0]}/kt-predict/animals")
    job = tmp_path / "animals.toml"
    job.write_text(f'[data]\ntrain = "{table}"\nfilter = "split == \'train\'"\nfeatures = ["vec", "x0", "x1", "x2", '
                   f'"x3"]\nlabel = "animal"\n[model]\nhidden_layers = [8]\npretrain_epochs = 2\nfinetune_epochs = 3\n'
                   f'[job]\nname = "animals"\ndevice = "cpu"\n')
    assert main(["train", str(job), "--out", str(tmp_path / "run"), "--quiet", "--no-ui"]) == 0  # the table, in place
    out = user_uri(cluster, "kt-predict/predicted.parquet")
    assert main(["predict", str(tmp_path / "run" / "model.npz"), str(job), "--out", out,
                 "--filter", "split == 'test'"]) == 0
    with fs.open_input_file(out.split(cluster.url, 1)[1]) as f:
        predicted = pq.read_table(f)
    assert predicted.num_rows == len(rows["test"][1])

    shards = user_uri(cluster, "kt-predict/shards")
    X, y = rows["train"]
    np.savez(tmp_path / "data.npz", X=X.astype(np.float32), y=np.unique(y, return_inverse=True)[1])
    capsys.readouterr()
    os.environ["KRB5CCNAME"] = f"FILE:{tmp_path / 'no-ticket'}"
    try:
        code, _, err = dbn(capsys, "shard", str(tmp_path / "data.npz"), shards, "--shards", "2")
        assert code == 2 and err.count("\n") == 1 and "no Kerberos ticket" in err and "run `kinit`" in err, err
        code, _, err = dbn(capsys, "predict", str(tmp_path / "run" / "model.npz"), str(job), "--out",
                           user_uri(cluster, "kt-predict/again.parquet"))
        assert code == 2 and err.count("\n") == 1 and "no Kerberos ticket" in err and "run `kinit`" in err, err
    finally:
        os.environ["KRB5CCNAME"] = cluster.env()["KRB5CCNAME"]
    assert fs.get_file_info(shards.split(cluster.url, 1)[1]).type == pafs.FileType.NotFound
    assert main(["shard", str(tmp_path / "data.npz"), shards, "--shards", "2"]) == 0
    assert len(fs.get_file_info(pafs.FileSelector(shards.split(cluster.url, 1)[1]))) == 3  # 2 shards, manifest


# ------------------------------------------------------------------ a keytab job outlives its tokens

#: The short-lived cluster's delegation tokens: renewed within 20 s, dead 90 s after they were issued.
# A token no one renews dies after SHORT_RENEW_S: the master's new ones come every 10 s, but one fetch
# (a Java start and a Kerberos login) took 20 s beside a running job, and with 20 s its tokens died.
SHORT_RENEW_S, SHORT_LIFETIME_S = 40, 90


@pytest.fixture(scope="module")
def short_lived(tmp_path_factory):
    """A second secured cluster whose delegation tokens die after SHORT_LIFETIME_S (the session's live
    five minutes, too long to outlive in a test), with its own KDC and realm."""
    from securehadoop import SecureHadoop

    cluster = SecureHadoop(base_dir=tmp_path_factory.mktemp("short-lived"), token_renew_interval_s=SHORT_RENEW_S,
                           token_max_lifetime_s=SHORT_LIFETIME_S, realm_name="SHORTLIVED").start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_job_submitted_with_a_keytab_outlives_its_delegation_tokens(short_lived, tmp_path, capsys, monkeypatch):
    """`dbn submit --principal --keytab` with no ticket at all: the keytab goes to the application
    master alone, whose master gets new tokens every few seconds and hands them to the workers. A
    worker killed after the submission's tokens died comes back, reads its share of a table read in
    place with the master's tokens, and the job completes; a job from the ticket cache cannot (its
    restarted worker finds no usable token). The staged copy of the keytab is deleted at the end."""
    from test_table_jobs import write_animals

    cluster = short_lived
    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KRB5CCNAME", f"FILE:{tmp_path / 'no-ticket'}")  # the keytab alone
    monkeypatch.delenv("ITERREDUCE_SKEIN_DRIVER", raising=False)  # a driver logged in from the keytab
    security_dir = tmp_path / "skein"
    skein.Security.new_credentials().to_directory(str(security_dir))
    monkeypatch.setenv("SKEIN_CONFIG", str(security_dir))
    keytab = ["--principal", cluster.principal, "--keytab", str(cluster.user_keytab)]
    for var in KEYTAB_LOGIN_VARS:  # `dbn submit --keytab` logs this process's HDFS access in: undone afterwards
        monkeypatch.setenv(var, "")

    write_animals(tmp_path / "animals")
    user = cluster.principal.split("@")[0]
    fs = cluster.fs()  # the harness's own client (the cluster's keytab)
    upload(fs, tmp_path / "animals", f"/user/{user}/animals")
    output = user_uri(cluster, "outlives")
    path = Path(python_job(tmp_path, output, epochs=240, finetune=2))
    text = path.read_text().replace(f'train = "{tmp_path / "train.npz"}"', f'train = "{user_uri(cluster, "animals")}"\n'
                                    'features = ["vec", "x0", "x1", "x2", "x3"]\nlabel = "animal"')
    path.write_text(text.replace("hidden_layers = [12, 8]", "hidden_layers = [6]"))

    started = time.monotonic()
    app_id = submit(capsys, str(path), *keytab)
    shipped = shipped_job(output)
    assert shipped["slots"] and all(s["host"] for s in shipped["slots"]), shipped["slots"]  # fsck, with the keytab's ticket
    # The test's own credentials, named: skein's default is ~/.skein, made there when missing.
    with skein.Client(principal=cluster.principal, keytab=str(cluster.user_keytab),
                      security=skein.Security.from_directory(str(security_dir))) as client:
        yarn = Yarn(cluster, client)
        yarn.wait_step(app_id, 2)
        # The keytab is in the application master's container alone.
        local = list(cluster.dir.glob(f"cluster/**/usercache/*/appcache/{app_id}/container_*/principal.keytab"))
        assert [p.parent.name.endswith("_01_000001") for p in local] == [True], local
        while time.monotonic() - started < SHORT_LIFETIME_S + 5:  # the submission's tokens are dead
            assert str(yarn.report(app_id).state) == "RUNNING", yarn.report(app_id).diagnostics
            time.sleep(1)
        victim = next(c for c in yarn.containers(app_id) if c.id == "worker-0_0")
        (pid,) = yarn.pids(victim.yarn_container_id, "iterreduce.launch.yarn.container worker")
        os.kill(pid, signal.SIGKILL)
        report = yarn.wait(app_id, timeout=400)
        yarn.assert_succeeded(report, app_id)
        assert time.monotonic() - started > SHORT_LIFETIME_S + 10
    # Aggregated after the submission's tokens died (the ResourceManager got the NodeManager new ones).
    code, logs, err = dbn(capsys, "logs", app_id, *keytab)
    assert code == 0, err

    records = yarn.hdfs_json_lines(f"/user/{user}/outlives/log.jsonl")
    registered = [r["worker"] for r in records if r.get("event") == "worker_registered"]
    assert len(registered) == 3 and "worker_lost" in [r.get("event") for r in records], registered
    assert records[-1]["event"] == "done"
    assert logs.count("new HDFS delegation tokens (set") >= 3, logs[-3000:]
    assert "using the master's new HDFS delegation tokens" in logs  # a running worker took a later set
    restarted = [line for line in logs.splitlines() if "using the master's HDFS delegation tokens" in line]
    assert len(restarted) == 3, restarted  # every worker container, the restarted one too
    # The model and the log went up after the submission's tokens died, with the master's.
    late = written_by(cluster, f"/user/{user}/outlives")
    assert any(".model.npz" in name for name in late) and all(how == {"TOKEN"} for name, how in late.items()
                                                             if ".model.npz" in name)
    assert "deleted the keytab's staged copy" in logs
    staged = [p for p in fs.get_file_info(pafs.FileSelector(f"/user/{user}/.skein", recursive=True))
              if p.base_name == cluster.user_keytab.name]
    assert not staged, staged
    beside = [p.base_name for p in fs.get_file_info(pafs.FileSelector(f"/user/{user}/.skein", recursive=True))]
    assert "job.json" in beside and "skein.jar" in beside, beside  # skein's own staged files: not ours to delete
