"""Runs tracked in MLflow (issue 55, parts 3 and 4), against a real tracking server (tests/mlflowserver.py):
a --local 2 run's settings, every step's figures and its model, registered and loadable by name; a
server that dies mid-run or is not there changes nothing of the training."""

from __future__ import annotations

import json
import sys
import time
import warnings

import numpy as np
import pytest

mlflow = pytest.importorskip("mlflow")
pd = pytest.importorskip("pandas")

from mlflowserver import MlflowServer  # noqa: E402

from dbn import DBN  # noqa: E402
from dbn.errors import ConfigError  # noqa: E402
from dbn.jobs.run import MiniCluster, run  # noqa: E402
from dbn.jobs.spec import load_spec  # noqa: E402
from dbn.jobs.tracking import MlflowTracker, metrics_of, params_of, tracker_for  # noqa: E402

PRETRAIN_EPOCHS, FINETUNE_EPOCHS = 3, 4
DETACHED_FINETUNE_EPOCHS = 12


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.stop()


def job(tmp_path, name: str, tracking: str = "") -> object:
    """A small --local 2 job on generated data (two layers, labels), tracked where ``tracking`` says."""
    rng = np.random.default_rng(4)
    X = rng.random((400, 12), dtype=np.float32)
    y = (X[:, :3].sum(axis=1) > 1.5).astype(np.int64) + (X[:, 3] > 0.5)
    np.savez(tmp_path / "data.npz", X=X, y=y)
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[data]\ntrain = "data.npz"\n[model]\nhidden_layers = [8, 6]\npretrain_epochs = {PRETRAIN_EPOCHS}\n'
                    f'finetune_epochs = {FINETUNE_EPOCHS}\npretrain_batch_size = 20\nfinetune_batch_size = 20\n'
                    f'[output]\ndir = "{tmp_path / name}"\n{tracking}\n[job]\nname = "{name}"\n'
                    f'[cluster]\nworkers = 2\nui = false\n')
    return load_spec(path)


def model_arrays(path) -> dict:
    with np.load(path, allow_pickle=False) as arrays:
        return {name: arrays[name] for name in arrays.files}


def test_a_local_run_is_recorded_with_every_epochs_figures_and_its_model_registered(server, tmp_path, monkeypatch):
    spec = job(tmp_path, "tracked", f'mlflow = "{server.uri}"\nmodel_name = "tracked-digits"')
    result = run(spec, MiniCluster())

    client = mlflow.tracking.MlflowClient(server.uri)
    assert result["mlflow_run"].startswith(f"{server.uri}/#/experiments/")  # dbn train's last line says it
    (found,) = client.search_runs([client.get_experiment_by_name("tracked").experiment_id])
    run_id = found.info.run_id
    assert found.info.status == "FINISHED" and result["mlflow_run"].endswith(f"/runs/{run_id}")
    assert found.data.params["model.hidden_layers"] == "[8, 6]" and found.data.params["cluster.workers"] == "2"
    for layer in (0, 1):  # every epoch of each RBM, and of fine-tuning
        history = client.get_metric_history(run_id, f"pretrain.layer{layer}.reconstruction_error")
        assert sorted(m.step for m in history) == list(range(PRETRAIN_EPOCHS)), history
    assert len(client.get_metric_history(run_id, "finetune.train_error")) == FINETUNE_EPOCHS
    assert 0 <= found.data.metrics["finetune.sync_share"] <= 1
    assert {a.path for a in client.list_artifacts(run_id)} >= {"config.json", "log.jsonl", "result.json", "model"}

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)  # not mlflow.set_tracking_uri: it sets it for good
    served = mlflow.pyfunc.load_model("models:/tracked-digits/1")
    X = np.random.default_rng(9).random((50, 12), dtype=np.float32)
    model = DBN.load(result["model"], device="cpu")
    assert list(served.predict(X)) == list(model.predict(X))


def test_a_tracking_server_killed_mid_run_leaves_the_run_and_its_model_as_without_tracking(tmp_path):
    dying = MlflowServer(tmp_path / "dying").start()
    plain = run(job(tmp_path, "plain"), MiniCluster())
    spec = job(tmp_path, "killed", f'mlflow = "{dying.uri}"')
    seen = []

    def kill_at_the_first_step(record):
        if "step" in record and not seen:
            seen.append(record)
            dying.stop()

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        tracked = run(spec, MiniCluster(), on_record=kill_at_the_first_step)
    assert seen, "no step record came"
    expected, got = model_arrays(plain["model"]), model_arrays(tracked["model"])
    assert sorted(expected) == sorted(got)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    told = [str(w.message) for w in said if "MLflow tracking" in str(w.message)]
    assert len(told) == 1 and dying.uri in told[0], told  # said once, however many calls failed


def test_no_server_at_all_is_said_once_and_the_run_ends_as_usual(tmp_path):
    from mlflowserver import free_port

    spec = job(tmp_path, "nowhere", f'mlflow = "http://127.0.0.1:{free_port()}"')
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        result = run(spec, MiniCluster())
    assert (tmp_path / "nowhere" / "model.npz").is_file() and result["n_test"] is None
    assert len([w for w in said if "MLflow tracking" in str(w.message)]) == 1


def test_a_run_made_at_submission_is_the_one_the_master_records_into_its_link_known_at_once(server, tmp_path):
    """`dbn submit` makes the run (begin_master_run), so the master's tracker knows its link before its
    own client has started; the master records into it (no second run); a job file's run id that is not
    one submit writes is refused with a warning (the master makes its own), and an unreachable server
    leaves the settings as they were, said once."""
    from mlflowserver import free_port

    from dbn.jobs.tracking import abandon_master_run, begin_master_run, master_tracker

    settings = {"uri": server.uri, "experiment": "made-at-submission", "model_name": None, "name": "early",
                "params": {"model.hidden_layers": "[4]"}}
    said = []
    made = begin_master_run(settings, log=said.append)
    client = mlflow.tracking.MlflowClient(server.uri)
    experiment = client.get_experiment_by_name("made-at-submission")
    assert made["link"] == f"{server.uri}/#/experiments/{experiment.experiment_id}/runs/{made['run_id']}"
    assert said == [f"MLflow run: {made['link']}"]
    tracker = master_tracker(made)
    assert tracker.link == made["link"]  # before its thread has sent anything
    tracker.record({"step": 0, "of": 1, "phase": "finetune", "epoch": 0, "train_error": 0.25})
    tracker.finish(None, tmp_path)
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_id == made["run_id"] and found.data.params == {"model.hidden_layers": "[4]"}
    assert found.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(made["run_id"], "finetune.train_error")] == [0.25]

    with pytest.warns(UserWarning, match="not one dbn submit writes"):
        forged = master_tracker({**made, "run_id": "../../x"})
    assert forged.link is None and forged._run_id is None
    forged._queue.put(tracking_end())

    nowhere = {**settings, "uri": f"http://127.0.0.1:{free_port()}"}
    told = []
    assert begin_master_run(nowhere, log=told.append) == nowhere and len(told) == 1 and "could not be made" in told[0]
    again = begin_master_run({**settings, "name": "never-submitted"}, log=lambda _: None)
    abandon_master_run(again)
    assert client.get_run(again["run_id"]).info.status == "FAILED"


def tracking_end():
    from dbn.jobs import tracking

    return tracking._END


def test_a_model_name_without_a_tracking_server_is_refused_before_the_run(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = job(tmp_path, "unnamed", 'model_name = "x"')
    with pytest.raises(ConfigError, match=r"\[output\] model_name = 'x' registers the model in MLflow"):
        tracker_for(spec)
    assert not (tmp_path / "unnamed").exists()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    assert isinstance(tracker_for(spec), MlflowTracker)


def test_a_step_records_figures_are_keyed_by_phase_and_layer_and_stepped_by_epoch():
    record = {"step": 7, "of": 20, "phase": "pretrain", "layer": 1, "epoch": 2, "reconstruction_error": 3.5,
              "seconds": 2.0, "sync_seconds": 0.5, "shards": 2, "time": 1.0}
    assert sorted(metrics_of(record)) == [("pretrain.layer1.reconstruction_error", 3.5, 2),
                                          ("pretrain.layer1.seconds", 2.0, 2),
                                          ("pretrain.layer1.sync_seconds", 0.5, 2),
                                          ("pretrain.layer1.sync_share", 0.25, 2)]
    assert metrics_of({"event": "checkpoint", "step": 3}) == []
    assert params_of({"model": {"hidden_layers": [8, 6], "n_classes": None}, "source": "job.toml"}) == {
        "model.hidden_layers": "[8, 6]", "source": "job.toml"}


# ------------------------------------------------------------------ on YARN: the master records


def yarn_job(tmp_path, yarn, server, name: str, folder: str, model_name: str, finetune_epochs: int = FINETUNE_EPOCHS):
    """A small job for the suite's YARN (data on this machine, output on HDFS in ``folder``), tracked on ``server``."""
    rng = np.random.default_rng(4)
    X = rng.random((400, 12), dtype=np.float32)
    np.savez(tmp_path / "data.npz", X=X, y=(X[:, :3].sum(axis=1) > 1.5).astype(np.int64) + (X[:, 3] > 0.5))
    output = yarn.hadoop.uri(f"/user/test/{folder}")
    path = tmp_path / "job.toml"
    path.write_text(f"""[data]
train = "{tmp_path / 'data.npz'}"
[model]
hidden_layers = [8, 6]
pretrain_epochs = {PRETRAIN_EPOCHS}
finetune_epochs = {finetune_epochs}
pretrain_batch_size = 20
finetune_batch_size = 20
[output]
dir = "{output}"
mlflow = "{server.uri}"
model_name = "{model_name}"
[cluster]
workers = 2
heartbeat_timeout = 6.0
[yarn]
python = "{sys.executable}"
worker_memory = "512 MiB"
worker_vcores = 1
master_memory = "1 GiB"
[job]
name = "{name}"
device = "cpu"
""")
    return path


def test_a_detached_yarn_job_is_recorded_by_its_master_and_status_shows_the_run(server, yarn, tmp_path, capsys,
                                                                              monkeypatch):
    """`dbn submit` without --wait: nobody follows the job, so its application master records the run
    (settings, every epoch's figures, the model, registered); `dbn status` shows the run's link while
    the job runs, and the job's log keeps it."""
    from dbn.cli import main
    from iterreduce.launch.yarn import client as yarn_client

    # Fine-tuned long enough that `dbn status`, one call a second or two on a busy machine, sees the job
    # run (with 4 epochs it once ended between two calls, 2026-12-07). `dbn submit` makes the run, so its
    # link is there from the master's start (the master's own client once took longer than the job).
    path = yarn_job(tmp_path, yarn, server, "yarn-tracked", "tracked-on-yarn", "yarn-digits",
                    finetune_epochs=DETACHED_FINETUNE_EPOCHS)
    assert main(["submit", str(path), "--quiet"]) == 0
    app_id = capsys.readouterr().out.strip().splitlines()[-1]
    shown, said = set(), []
    deadline = time.monotonic() + 300
    while (st := yarn_client.status(yarn.client, app_id)).state not in yarn_client.TERMINAL_STATES:
        assert time.monotonic() < deadline, st.describe()
        said.append(f"{time.monotonic():.1f}: {st.describe()}")
        shown |= {line.strip() for line in st.describe().splitlines() if line.strip().startswith("mlflow run:")}
        time.sleep(0.5)
    assert st.final_status == "SUCCEEDED", st.describe()

    client = mlflow.tracking.MlflowClient(server.uri)
    (found,) = client.search_runs([client.get_experiment_by_name("yarn-tracked").experiment_id])  # the master's alone
    run_id = found.info.run_id
    assert found.info.status == "FINISHED" and found.data.params["yarn.worker_memory"] == "512 MiB"
    for layer in (0, 1):
        history = client.get_metric_history(run_id, f"pretrain.layer{layer}.reconstruction_error")
        assert sorted(m.step for m in history) == list(range(PRETRAIN_EPOCHS)), history
    assert len(client.get_metric_history(run_id, "finetune.train_error")) == DETACHED_FINETUNE_EPOCHS
    link = f"{server.uri}/#/experiments/{found.info.experiment_id}/runs/{run_id}"
    assert shown == {f"mlflow run: {link}"}, (shown, said[-4:])  # what status said last, while it ran
    stepping = [line for line in said if "superstep" in line]
    assert stepping and all(f"mlflow run: {link}" in line for line in stepping), stepping[:2]  # from the first step
    logged = [json.loads(line) for line in yarn.hadoop.run("hdfs", "dfs", "-cat", "/user/test/tracked-on-yarn/log.jsonl")
              .stdout.splitlines()]
    assert [r["links"] for r in logged if r.get("event") == "links"] == [{"mlflow_run": link}]

    fs = yarn.hadoop.fs()
    with fs.open_input_stream("/user/test/tracked-on-yarn/model.npz") as f:
        (tmp_path / "model.npz").write_bytes(f.read())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)  # not mlflow.set_tracking_uri: it sets it for good
    served = mlflow.pyfunc.load_model("models:/yarn-digits/1")
    X_new = np.random.default_rng(9).random((50, 12), dtype=np.float32)
    assert list(served.predict(X_new)) == list(DBN.load(tmp_path / "model.npz", device="cpu").predict(X_new))


def test_dbn_train_on_yarn_returns_the_link_of_the_run_its_master_records(server, yarn, tmp_path):
    """`dbn train --yarn` follows the job: the application master records (one run, not two), and the
    result names the run, as its last line says it."""
    from dbn.jobs.run import Yarn

    spec = load_spec(yarn_job(tmp_path, yarn, server, "yarn-followed", "followed-on-yarn", "yarn-followed"))
    result = run(spec, Yarn(str(tmp_path / "report"), log=lambda msg: None, poll=0.5))
    client = mlflow.tracking.MlflowClient(server.uri)
    (found,) = client.search_runs([client.get_experiment_by_name("yarn-followed").experiment_id])
    assert result["mlflow_run"] == f"{server.uri}/#/experiments/{found.info.experiment_id}/runs/{found.info.run_id}"
    assert found.info.status == "FINISHED"
