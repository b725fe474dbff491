"""Bad data in a job's Parquet shards: every class of fault stops the job at once with
``dbn: error:`` naming the shard (and row and column where known), exit status 2, no
model written and no retry, in one process and on the local mini-cluster alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbn.cli import main
from iterreduce.storage import ownership
from shardio.shards import write_shards

N_ROWS, N_FEATURES, N_SHARDS, BAD = 120, 12, 3, 1  # shard BAD holds the fault
ROW, COL = 7, 4  # where in that shard


def good_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, N_ROWS)
    X = (rng.random((N_ROWS, N_FEATURES)) < np.where(np.arange(N_FEATURES) % 3 == y[:, None], 0.8, 0.1))
    return X.astype(np.float32), y


def rewrite(uri: str, **columns) -> None:
    """Shard ``uri`` written again with some of its columns replaced."""
    table = pq.read_table(uri)
    for name, column in columns.items():
        table = table.set_column(table.column_names.index(name), name, column)
    pq.write_table(table, uri)


def set_value(uri: str, value: float) -> None:
    X = pq.read_table(uri).column("features").combine_chunks().flatten().to_numpy().reshape(-1, N_FEATURES).copy()
    X[ROW, COL] = value
    rewrite(uri, features=pa.FixedSizeListArray.from_arrays(pa.array(X.ravel()), N_FEATURES))


def int64_features(uri):
    X = pq.read_table(uri).column("features").combine_chunks().flatten().to_numpy().astype(np.int64)
    rewrite(uri, features=pa.FixedSizeListArray.from_arrays(pa.array(X), N_FEATURES))


def string_labels(uri):
    rewrite(uri, label=pa.array([str(v) for v in pq.read_table(uri).column("label").to_pylist()]))


def negative_label(uri):
    y = pq.read_table(uri).column("label").to_numpy().copy()
    y[ROW] = -1
    rewrite(uri, label=pa.array(y))


def corrupt_page(uri):
    """Flip bytes inside the features' data page: the footer still reads, the page does not."""
    column = pq.read_metadata(uri).row_group(0).column(0)
    middle = column.data_page_offset + column.total_compressed_size // 2
    data = bytearray(Path(uri).read_bytes())
    for i in range(middle, middle + 16):
        data[i] ^= 0xFF
    Path(uri).write_bytes(bytes(data))


def truncate(uri):
    data = Path(uri).read_bytes()
    Path(uri).write_bytes(data[:len(data) // 2])


def not_parquet(uri):
    Path(uri).write_text("features,label\n0.1,2\n")


#: fault -> (how to make it, what the message says besides the shard's path, found where)
FAULTS = {
    "int64 features": (int64_features, "'features' values must be float32 or uint8, got int64", "footer"),
    "string labels": (string_labels, "'label' must be an integer column, got string", "footer"),
    "NaN": (lambda uri: set_value(uri, np.nan), f"NaN or infinite values (1, nulls included), the first at "
                                                f"row {ROW}, column {COL}", "data"),
    "infinity": (lambda uri: set_value(uri, np.inf), "'features' holds infinite values", "footer"),
    "above one": (lambda uri: set_value(uri, 1.5), "features range over [0, 1.5] (the footer's statistics) but "
                                                   "Bernoulli visible units need [0, 1]", "footer"),
    "negative label": (negative_label, "'label' holds negative values", "footer"),
    "corrupt page": (corrupt_page, "not a readable Parquet file", "data"),
    "truncated file": (truncate, "not a readable Parquet file", "footer"),
    "not Parquet": (not_parquet, "not a readable Parquet file", "footer"),
}


def make_job(tmp_path: Path, fault: str | None, *, workers: int, extra: str = "") -> tuple[Path, Path, str]:
    """A job on shards, shard BAD made bad by ``fault``; an earlier run's model.npz is already in
    its output folder. Returns (job file, output folder, the bad shard's path)."""
    uris = write_shards(*good_data(), str(tmp_path / "shards"), N_SHARDS)
    if fault:
        FAULTS[fault][0](uris[BAD])
    out = tmp_path / "out"
    out.mkdir(parents=True)
    plant_earlier_model(out)
    job = tmp_path / "job.toml"
    job.write_text(
        "[data]\n"
        "[model]\nhidden_layers = [6]\npretrain_epochs = 1\nfinetune_epochs = 1\ntop_layer_epochs = 0\n"
        f"pretrain_batch_size = 10\nfinetune_batch_size = 10\n{extra}"
        f"[cluster]\nworkers = {workers}\nshards = '{tmp_path / 'shards'}'\nmax_restarts = 2\n"
        f"[output]\ndir = '{out}'\n[job]\ndevice = 'cpu'\n"
    )
    return job, out, uris[BAD]


def plant_earlier_model(out: Path) -> None:
    """An earlier run's model.npz in ``out``, recorded as a run's (a file no run wrote is refused
    untouched: tests/test_ownership.py)."""
    (out / "model.npz").write_bytes(b"an earlier run's model")
    ownership.claim(out, ("model.npz",))
    ownership.settle(out, ("model.npz",))


def events(out: Path) -> list[str]:
    log = out / "log.jsonl"
    return [json.loads(line).get("event") for line in log.read_text().splitlines()] if log.exists() else []


def assert_refused(capsys, code: int, out: Path, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert code == 2, err
    message = err.strip().splitlines()[-1]
    assert message.startswith("dbn: error: ")
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert (out / "model.npz").read_bytes() == b"an earlier run's model"  # no model written over it
    assert "Traceback" not in err
    return message


@pytest.mark.parametrize("fault", FAULTS)
def test_bad_shard_stops_a_local_cluster_job(tmp_path, capsys, fault):
    job, out, bad = make_job(tmp_path, fault, workers=N_SHARDS)
    code = main(["train", str(job), "--local", str(N_SHARDS), "--overwrite"])
    assert_refused(capsys, code, out, bad, FAULTS[fault][1])
    logged = events(out)
    assert "worker_restarted" not in logged and "worker_gave_up" not in logged  # never retried
    assert "step" not in " ".join(map(str, logged))
    if FAULTS[fault][2] == "footer":  # refused by the master before any worker started
        assert "worker_registered" not in logged
    else:  # found by the worker that read it, and reported as what it is
        assert "data_error" in logged


@pytest.mark.parametrize("fault", FAULTS)
def test_bad_shard_stops_a_job_in_one_process(tmp_path, capsys, fault):
    job, out, bad = make_job(tmp_path, fault, workers=0)
    code = main(["train", str(job), "--overwrite"])
    fragment = FAULTS[fault][1]
    if fault in ("infinity", "above one", "negative label"):  # read in full here: the values, not the footer
        fragment = {"infinity": f"row {ROW}, column {COL}", "above one": f"row {ROW}, column {COL}",
                    "negative label": f"at row {ROW} is -1"}[fault]
    assert_refused(capsys, code, out, bad, fragment)


def test_a_stray_label_is_reported_and_n_classes_makes_it_an_error(tmp_path, capsys):
    X, y = good_data()
    y[50] = 10  # one stray label among classes 0..2
    uris = write_shards(X, y, str(tmp_path / "shards"), N_SHARDS)
    job, out, _ = make_job(tmp_path / "a", None, workers=2)
    job.write_text(job.read_text().replace(str(tmp_path / "a" / "shards"), str(tmp_path / "shards")))
    assert main(["train", str(job), "--local", "2", "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert "data: 120 rows in 3 shards; 11 classes, examples of each: 0:" in err and " 10:1" in err
    assert "warning: the shards' labels: classes 3, 4, 5, 6, 7, 8, 9 have no examples (the classes run 0..10)" in err
    assert "warning: the shards' labels: class 10 has only 1 example" in err and "n_classes" in err

    job.write_text(job.read_text().replace("[model]\n", "[model]\nn_classes = 3\n"))
    plant_earlier_model(out)
    code = main(["train", str(job), "--local", "2", "--overwrite"])
    assert_refused(capsys, code, out, f"{uris[1]}: 'label' has label 10 at row 10, outside the model's classes 0..2")

    code = main(["train", str(job), "--set", "cluster.workers=0", "--overwrite"])  # one process: the same error
    assert_refused(capsys, code, out, f"{uris[1]}: 'label' has label 10 at row 10, outside the model's classes 0..2")


def test_a_bad_shard_stops_a_ten_worker_job(tmp_path, capsys):
    """The issue's case: ten workers, one shard with a NaN that only reading it shows."""
    uris = write_shards(*good_data(), str(tmp_path / "shards"), 10)
    set_value(uris[6], np.nan)
    job, out, _ = make_job(tmp_path / "a", None, workers=10)
    job.write_text(job.read_text().replace(str(tmp_path / "a" / "shards"), str(tmp_path / "shards")))
    code = main(["train", str(job), "--local", "10", "--overwrite"])
    assert_refused(capsys, code, out, uris[6], f"row {ROW}, column {COL}")
    assert "data_error" in events(out)


@pytest.mark.parametrize("fault", ["no labels", "other width", "truncated file"])
def test_a_bad_validation_shard_is_refused_before_training(tmp_path, capsys, fault):
    X, y = good_data(1)
    valid = str(tmp_path / "valid")
    if fault == "other width":
        X = X[:, :-2]
    (uri,) = write_shards(X, None if fault == "no labels" else y, valid, 1)
    if fault == "truncated file":
        truncate(uri)
    job, out, _ = make_job(tmp_path, None, workers=2, extra="")
    job.write_text(job.read_text().replace("[cluster]\n", f"[cluster]\nvalidation = '{uri}'\n"))
    code = main(["train", str(job), "--local", "2", "--overwrite"])
    fragment = "not a readable Parquet file" if fault == "truncated file" else "the validation shard needs"
    assert_refused(capsys, code, out, uri, fragment)
    assert "worker_registered" not in events(out)


def test_the_progress_reads_every_runtime_event_as_a_sentence(tmp_path, capsys):
    """The events a job logs (the master's and the launcher's, as they write them) print as
    sentences, not JSON; the data event lists the classes and its warnings."""
    from dbn.jobs.progress import EVENT_LINES, ProgressPrinter
    from dbn.jobs.spec import load_spec
    from iterreduce.storage.runlog import RunLog

    log = tmp_path / "log.jsonl"
    with RunLog(log) as run:
        run.event("data", shards=2, rows=9, classes=[4, 5], warnings=["class 1 is odd"])
        run.event("worker_registered", worker="worker-0#1", host="node1", shards=[0])
        run.event("worker_lost", worker="worker-0#1", reason="no heartbeat for 10.2 s", shards_skipped=[0])
        run.event("worker_restarted", worker="worker-0", exit=1, restart=1, error="boom")
        run.event("worker_gave_up", worker="worker-0", exit=1, restarts=3, error="boom")
        run.event("data_error", worker="worker-1#2", step=0, shard=1, message="x.parquet: NaN")
        run.event("resumed", checkpoint="ckpt-000000004.npz", step=4)
        run.event("exchange_failed", step=4, round=7, reason="worker-1 unreachable")
        run.event("exchange_off", step=4, failed=2)
        run.event("stopped", step=5, of=9)
        run.event("done", steps=5, seconds=1.25)
        run.event("ui", url="http://127.0.0.1:8000/")
        run.event("heartbeat", interval=4.0, timeout=12.0)
        run.event("container_lost", container="worker-1_2", service="worker-1", cause="preempted",
                  message="Container preempted by scheduler", counted=False)
        run.event("containers_pending", pending=2, running=1, queue="small", label="", seconds=30)
        run.event("resized", workers=1, was=3, step=6)
        run.event("worker_retired", worker="worker-2#3", wanted=1, reason="1 workers are wanted")
        run.event("worker_draining", worker="worker-1#2", reason="its node h2 is being decommissioned", step=7)
        run.event("checkpoint", step=5, path="ckpt-000000005.npz")  # silent: one a step
        run.event("failed", reason="boom")  # silent: the command prints it as its error
    printer = ProgressPrinter(load_spec(None))
    for record in (json.loads(line) for line in log.read_text().splitlines()):
        printer(record)
    err = capsys.readouterr().err
    assert "data: 9 rows in 2 shards; 2 classes, examples of each: 0:4 1:5\nwarning: class 1 is odd" in err
    assert "worker-0#1 joined from node1 with shards [0]" in err and "done: 5 steps in 1.2 s" in err
    assert "bad data reported by worker-1#2: x.parquet: NaN" in err
    assert "step 4: the workers' exchange failed (worker-1 unreachable)" in err and "stopped early after step 5 of 9" in err
    assert "heartbeats every 4.0 s for this many workers; a worker is lost after 12 s of silence" in err
    assert "YARN container worker-1_2 ended (preempted); worker-1 is asked for again" in err
    assert "2 worker containers have waited 30 s for room in queue small" in err
    assert "1 workers wanted from the next step (were 3)" in err and "worker-2#3 retired (1 workers are wanted)" in err
    assert "worker-1#2 leaves at the next step: its node h2 is being decommissioned" in err
    assert "live view: http://127.0.0.1:8000/" in err and "ckpt-000000005" not in err and "boom\n" not in err
    assert "{" not in err and len(err.splitlines()) == len(EVENT_LINES) + 2
    printer({"event": "worker_retired", "worker": "worker-2#3", "wanted": 1})  # an older log's: no reason
    assert capsys.readouterr().err == '[worker_retired] {"worker": "worker-2#3", "wanted": 1}\n'
