"""A whole YARN job, honestly stood in for: the real skein clients against skein's
services played by :mod:`fakeyarn`, the containers as real processes, and a real HDFS
(:mod:`minihdfs`) holding the shards, the checkpoints and the final model.

`dbn submit` shards the data onto HDFS, ships the job and starts the application;
one worker container is SIGKILLed mid-run and YARN (the stand-in) restarts it
with a new instance index; it claims its old slot, gets its shards back and the
job completes.
"""

import json
import os
import sys
import time

import numpy as np
import pytest

from dbn import DBN
from dbn.cli import main

pytestmark = [pytest.mark.hdfs, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

N_FEATURES = 16


@pytest.fixture
def yarn(tmp_path, monkeypatch):
    from fakeyarn import FakeYarn

    with FakeYarn(tmp_path / "yarn", logs_while_running=True) as fy:
        security_dir = tmp_path / "skein"
        fy.security.to_directory(str(security_dir))
        monkeypatch.setenv("ITERREDUCE_SKEIN_DRIVER", fy.address)
        monkeypatch.setenv("SKEIN_CONFIG", str(security_dir))
        yield fy


def job_file(tmp_path, output: str, *, workers=2, epochs=6, finetune=4) -> str:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 600)
    X = (rng.random((600, N_FEATURES)) < 0.2 + 0.2 * y[:, None] * (np.arange(N_FEATURES) % 3 == y[:, None])).astype(np.float32)
    np.savez(tmp_path / "train.npz", X=X, y=y)
    path = tmp_path / "job.toml"
    path.write_text(f"""
[data]
train = "train.npz"
[model]
hidden_layers = [12, 8]
pretrain_epochs = {epochs}
finetune_epochs = {finetune}
pretrain_batch_size = 10
finetune_batch_size = 10
[output]
dir = "{output}"
[cluster]
workers = {workers}
heartbeat_timeout = 4.0
max_restarts = 2
[yarn]
python = "{sys.executable}"
worker_memory = "512 MiB"
worker_vcores = 1
[job]
name = "e2e"
device = "cpu"
""")
    return str(path)


def submit(capsys, *args) -> str:
    assert main(["submit", *args, "--quiet"]) == 0
    return capsys.readouterr().out.strip()


def progress_step(yarn, app_id) -> int:
    from iterreduce.yarn import KV_PROGRESS

    try:
        value = yarn.kv(app_id).get(KV_PROGRESS)
    except Exception:  # noqa: BLE001 - not running yet
        return -1
    return json.loads(value)["step"] if value else -1


def test_submitted_job_survives_a_killed_worker_with_data_and_model_on_hdfs(yarn, hdfs, tmp_path, capsys):
    output = hdfs.uri("/user/test/e2e")
    app_id = submit(capsys, job_file(tmp_path, output))
    assert app_id.startswith("application_")

    deadline = time.monotonic() + 120
    while progress_step(yarn, app_id) < 3:  # pre-training of layer 1 is under way
        assert time.monotonic() < deadline and str(yarn.report(app_id).state) in ("ACCEPTED", "RUNNING", "SUBMITTED"), \
            yarn.logs(app_id)
        time.sleep(0.2)
    assert main(["status", app_id]) == 0
    status = capsys.readouterr().out
    assert f"{app_id}: RUNNING" in status and "pretrain layer" in status

    killed = yarn.kill_container(app_id, "worker_0")
    report = yarn.wait(app_id, timeout=240)
    logs = yarn.logs(app_id)
    assert str(report.final_status) == "SUCCEEDED", (report.diagnostics, logs)
    assert killed.returncode == 137

    # YARN restarted the worker with a new instance index; it took back slot (and name) of the dead one.
    names = {c.id for c in yarn.containers(app_id, "worker", all=True)}
    assert {"worker_0", "worker_1", "worker_2"} <= names
    fs = hdfs.fs()
    with fs.open_input_stream("/user/test/e2e/log.jsonl") as f:
        records = [json.loads(line) for line in f.read().decode().splitlines()]
    registered = [r["worker"] for r in records if r.get("event") == "worker_registered"]
    assert len(registered) == 3 and len({w.split("#")[0] for w in registered}) == 2, registered
    assert records[-1]["event"] == "done"

    # Shards, checkpoints and the model are on the real HDFS; the model loads and classifies.
    shards = [i.path for i in fs.get_file_info(__import__("pyarrow.fs").fs.FileSelector("/user/test/e2e/shards"))]
    assert sorted(p.rsplit("/", 1)[1] for p in shards if p.endswith(".parquet")) == ["part-00000.parquet",
                                                                                  "part-00001.parquet"]
    checkpoints = fs.get_file_info(__import__("pyarrow.fs").fs.FileSelector("/user/test/e2e/checkpoints"))
    assert any(c.base_name.startswith("ckpt-") for c in checkpoints)
    local = tmp_path / "model.npz"
    with fs.open_input_stream("/user/test/e2e/model.npz") as f:
        local.write_bytes(f.read())
    model = DBN.load(local)
    data = np.load(tmp_path / "train.npz")
    assert list(model.hidden_layers) == [12, 8] and model.score(data["X"], data["y"]) > 0.5

    assert main(["status", app_id]) == 0
    assert "FINISHED (SUCCEEDED), progress 100 %" in capsys.readouterr().out
    assert main(["logs", app_id]) == 0
    assert "working as worker-0" in capsys.readouterr().out


def test_a_job_error_ends_the_application_failed_saying_why(yarn, hdfs, tmp_path, capsys):
    from iterreduce.shards import write_shards

    X = np.random.default_rng(0).random((40, N_FEATURES), dtype=np.float32)
    write_shards(X, None, hdfs.uri("/user/test/unlabelled"), 2)  # no labels, but fine-tuning asked for
    app_id = submit(capsys, job_file(tmp_path, hdfs.uri("/user/test/bad")),
                    "--set", f"cluster.shards={hdfs.uri('/user/test/unlabelled')}", "--max-attempts", "1")
    report = yarn.wait(app_id, timeout=120)
    assert str(report.final_status) == "FAILED"
    assert "job failed" in report.diagnostics and "no 'label' column" in report.diagnostics
    assert main(["status", app_id]) == 0
    assert "no 'label' column" in capsys.readouterr().out


def test_kill_and_unknown_applications(yarn, hdfs, tmp_path, capsys):
    app_id = submit(capsys, job_file(tmp_path, hdfs.uri("/user/test/killed"), epochs=200))
    yarn.wait(app_id, states=("RUNNING",), timeout=60)
    assert main(["kill", app_id]) == 0
    assert str(yarn.wait(app_id, timeout=60).state) == "KILLED"
    assert main(["status", "application_0_9999"]) == 2
    assert "application_0_9999: no such application" in capsys.readouterr().err


def test_a_new_master_attempt_resumes_from_the_newest_checkpoint_on_hdfs(yarn, hdfs, tmp_path, capsys):
    output = hdfs.uri("/user/test/attempts")
    app_id = submit(capsys, job_file(tmp_path, output, epochs=8))
    deadline = time.monotonic() + 120
    while progress_step(yarn, app_id) < 4:
        assert time.monotonic() < deadline and str(yarn.report(app_id).state) in ("ACCEPTED", "RUNNING", "SUBMITTED"), \
            yarn.logs(app_id)
        time.sleep(0.2)
    yarn.kill_container(app_id, "master")  # the application master's container dies: YARN starts attempt 2
    report = yarn.wait(app_id, timeout=240)
    assert str(report.final_status) == "SUCCEEDED", (report.diagnostics, yarn.logs(app_id))
    assert yarn.attempt(app_id) == 2
    with hdfs.fs().open_input_stream("/user/test/attempts/log.jsonl") as f:
        records = [json.loads(line) for line in f.read().decode().splitlines()]
    resumed = [r for r in records if r.get("event") == "resumed"]
    assert len(resumed) == 1 and resumed[0]["step"] >= 4, resumed
    steps = [r["step"] for r in records if "step" in r and "phase" in r]
    assert steps[0] == resumed[0]["step"] and steps[-1] == records[-2]["of"] - 1  # only what was left


def test_submit_wait_follows_the_job_to_its_end(yarn, hdfs, tmp_path, capsys):
    assert main(["submit", job_file(tmp_path, hdfs.uri("/user/test/wait"), epochs=2, finetune=1), "--wait"]) == 0
    out, err = capsys.readouterr()
    app_id = out.strip()
    assert f"{app_id}: FINISHED (SUCCEEDED), progress 100 %" in err
    assert "superstep" in err  # progress lines while it ran
