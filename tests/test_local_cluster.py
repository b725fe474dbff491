"""The local mini-cluster with real processes: a master and N workers over gRPC.

Kills are real SIGKILLs of the processes (found in /proc by their command lines).
``SlowSoftmax`` / ``SlowDBNProgram`` are the real programs with a per-update sleep in
the workers (see conftest_runtime.py): it changes no number, it only lets a test kill
a process in the middle of a job on a machine of any speed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from conftest_runtime import (DELAY_ENV, SLOW_DBN, SLOW_SOFTMAX, SOFTMAX, blobs, events, kill_master, kill_worker,
                              cmdline, load_npz, master_info, records, run_job, simulate, subprocess_env,
                              worker_pids)
from iterreduce.exceptions import LocalJobError, MasterKilled
from iterreduce.master import checkpoint
from iterreduce.transport import sharedmem
from shardio.shards import write_shards


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    subprocess_env(monkeypatch)


# ------------------------------------------------- completion and exactness


@pytest.fixture(scope="module")
def full_batch_runs(tmp_path_factory):
    """Full-batch softmax (batch_size 0, local_steps 1) on the same 600 rows: 3 equal shards on 3
    workers, and 1 shard on 1 worker. Returns (out3, out1, shards3, seen records of out3)."""
    tmp = tmp_path_factory.mktemp("full_batch")
    X, y = blobs(600, d=8, k=3, seed=1)
    shards3 = write_shards(X, y, str(tmp / "s3"), 3)
    write_shards(X, y, str(tmp / "s1"), 1)
    config = {"n_classes": 3, "epochs": 6, "batch_size": 0, "local_steps": 1, "learning_rate": 0.5}
    seen = []
    with pytest.MonkeyPatch.context() as mp:
        subprocess_env(mp)
        out3 = run_job(program=SOFTMAX, program_config=config, shards=str(tmp / "s3"), workers=3,
                       output=str(tmp / "out3"), on_record=seen.append)
        out1 = run_job(program=SOFTMAX, program_config=config, shards=str(tmp / "s1"), workers=1,
                       output=str(tmp / "out1"))
    return out3, out1, shards3, seen, config


def test_softmax_job_on_three_workers_completes(full_batch_runs):
    out, _, shards, seen, config = full_batch_runs
    assert (out / "parameters.npz").is_file()
    params = load_npz(out / "parameters.npz")
    assert params["weights"].shape == (8, 3) and params["bias"].shape == (3,)
    recs = records(out)
    assert [r["step"] for r in recs] == list(range(6))  # one record per step
    assert all(r["of"] == 6 and r["phase"] == "train" and r["epoch"] == r["step"] for r in recs)
    assert all(r["samples"] == 600 and r["shards"] == 3 == r["shards_total"] for r in recs)
    assert recs[-1]["loss"] < recs[0]["loss"]
    assert recs[-1]["train_error"] < 0.1
    assert sorted(e["worker"].split("#")[0] for e in events(out, "worker_registered")) == \
        ["worker-0", "worker-1", "worker-2"]
    assert len(events(out, "done")) == 1 and not events(out, "worker_lost")
    # on_record got the same records and events as the log
    assert [r for r in seen if "event" not in r] == recs
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["ckpt-000000005.npz", "ckpt-000000006.npz"]
    assert sorted(p.name for p in (out / "logs").iterdir()) == \
        ["master.log", "worker-0.log", "worker-1.log", "worker-2.log"]
    info = master_info(out)
    assert info["address"].startswith("127.0.0.1:") and info["pid"] > 0
    # ... and it is what running the shards one after the other gives.
    expected = simulate(SOFTMAX, config, shards)
    for k in expected:
        np.testing.assert_allclose(params[k], expected[k], rtol=1e-6, atol=1e-7)


def test_full_batch_three_workers_equal_one_worker(full_batch_runs):
    """With one full-batch step per superstep and equal shards, averaging the shards' steps is
    exactly one gradient step on the union: N workers give what 1 worker gives."""
    out3, out1, *_ = full_batch_runs
    p3, p1 = load_npz(out3 / "parameters.npz"), load_npz(out1 / "parameters.npz")
    assert sorted(p3) == sorted(p1) == ["bias", "weights"]
    for k in p1:
        np.testing.assert_allclose(p3[k], p1[k], rtol=1e-5, atol=1e-6)
    r3, r1 = records(out3), records(out1)
    assert [r["samples"] for r in r1] == [600] * 6 and all(r["shards"] == 1 for r in r1)
    assert [r["samples"] for r in r3] == [600] * 6 and all(r["shards"] == 3 for r in r3)
    # (The logged losses differ: each shard reports its loss after its *own* local step.)


# --------------------------------------------------------------- fault tolerance


def test_sigkill_of_a_worker_mid_run_completes_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv(DELAY_ENV, "0.08")
    X, y = blobs(900, d=8, k=3, seed=2)
    shards = write_shards(X, y, str(tmp_path / "shards"), 3)
    config = {"n_classes": 3, "epochs": 30, "batch_size": 0, "local_steps": 1, "learning_rate": 0.5}
    out = tmp_path / "out"
    seen, killed = [], []

    def on_record(rec):
        seen.append(rec)
        if rec.get("step") == 5 and "event" not in rec and not killed:
            killed.append(kill_worker(out, "worker-1"))

    run_job(program=SLOW_SOFTMAX, program_config=config, shards=str(tmp_path / "shards"), workers=3,
            output=str(out), on_record=on_record, timeout=90)
    assert killed, "the job ended before step 5 was reported"
    restarted = [r for r in seen if r.get("event") == "worker_restarted"]
    assert len(restarted) == 1 and restarted[0]["worker"] == "worker-1"
    assert restarted[0]["exit"] == -signal.SIGKILL and restarted[0]["restart"] == 1
    assert restarted[0]["error"] == "killed by SIGKILL"
    registered = [e["worker"].split("#")[0] for e in events(out, "worker_registered")]
    assert registered.count("worker-1") == 2
    lost = events(out, "worker_lost")
    assert len(lost) == 1 and lost[0]["worker"].startswith("worker-1#")
    assert (out / "parameters.npz").is_file()
    recs = records(out)
    assert [r["step"] for r in recs] == list(range(30))  # every step once, none lost or repeated
    assert all(r["shards"] == 3 for r in recs[:5]) and all(r["shards"] == 3 for r in recs[-5:])
    assert sum(r["shards"] < 3 for r in recs) <= 2  # at most the step(s) during the outage
    # The result is close to the undisturbed one (a step or two averaged over 2 of 3 shards).
    result, expected = load_npz(out / "parameters.npz"), simulate(SOFTMAX, config, shards)
    for k in expected:
        np.testing.assert_allclose(result[k], expected[k], rtol=0.05, atol=0.02 * np.abs(expected[k]).max())
    assert training_error(X, y, result) == pytest.approx(training_error(X, y, expected), abs=0.01)
    assert training_error(X, y, result) < 0.15


def training_error(X, y, params) -> float:
    return float(np.mean((X @ params["weights"] + params["bias"]).argmax(axis=1) != y))


def kill_master_then_resume(tmp_path, monkeypatch, *, program, config, shards, workers, kill_at, n_steps,
                            result_file, delay: float = 0.1):
    """Run A to completion; run B, SIGKILL its master when step ``kill_at`` is reported, resume B.
    ``n_steps``: the steps the job runs (None: as many as A ran, e.g. when it stops early).
    Returns (A's arrays, B's arrays, B's output dir)."""
    monkeypatch.setenv(DELAY_ENV, "0")
    out_a = run_job(program=program, program_config=config, shards=shards, workers=workers, output=str(tmp_path / "a"))
    n_steps = n_steps or len(records(out_a))

    out_b = tmp_path / "b"
    killed = []

    def on_record(rec):
        if rec.get("step") == kill_at and "event" not in rec and not killed:
            killed.append(kill_master(out_b))

    monkeypatch.setenv(DELAY_ENV, str(delay))  # long enough steps for the kill to land mid-run
    with pytest.raises(MasterKilled, match=r"^the master was killed by SIGKILL \(logs in .*\); checkpoints in "
                       r".*/checkpoints, the newest ckpt-\d{9}\.npz$") as info:
        run_job(program=program, program_config=config, shards=shards, workers=workers, output=str(out_b),
                on_record=on_record)
    assert killed and killed[0] is not None
    assert info.value.checkpoint == checkpoint.latest(str(out_b / "checkpoints"))
    assert not (out_b / result_file).exists()
    done_before = {r["step"] for r in records(out_b)}
    assert kill_at in done_before and len(done_before) < n_steps

    monkeypatch.setenv(DELAY_ENV, "0")
    run_job(program=program, program_config=config, shards=shards, workers=workers, output=str(out_b), resume=True)
    (resumed,) = events(out_b, "resumed")
    assert kill_at <= resumed["step"] < n_steps  # it really resumed mid-job, from a checkpoint
    assert resumed["step"] <= max(done_before) + 1
    after = [r["step"] for r in records(out_b)][len(done_before):]
    assert after == list(range(resumed["step"], n_steps))
    return load_npz(out_a / result_file), load_npz(out_b / result_file), out_b


def test_master_sigkill_then_resume_is_bit_identical_softmax(tmp_path, monkeypatch):
    X, y = blobs(600, d=8, k=3, seed=3)
    shards = str(tmp_path / "shards")
    write_shards(X, y, shards, 3)
    # Minibatches (batch_size > 0): every shuffle depends on the (job seed, step, shard) seeds.
    config = {"n_classes": 3, "epochs": 12, "batch_size": 50, "local_steps": 1, "learning_rate": 0.3}
    a, b, _ = kill_master_then_resume(tmp_path, monkeypatch, program=SLOW_SOFTMAX, config=config, shards=shards,
                                      workers=3, kill_at=3, n_steps=12, result_file="parameters.npz")
    assert sorted(a) == sorted(b) == ["bias", "weights"]
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


@pytest.mark.parametrize("stream", [False, True], ids=["in-memory", "streamed"])
def test_master_sigkill_then_resume_is_bit_identical_dbn(tmp_path, monkeypatch, mnist_small, stream):
    x_train, y_train, _, _ = mnist_small
    shards = str(tmp_path / "shards")
    write_shards(x_train[:600], y_train[:600], shards, 3)
    config = dict(hidden_layers=[32, 16], pretrain_epochs=2, finetune_epochs=2, top_layer_epochs=1,
                  n_classes=10, seed=0, stream=stream)
    # Steps: transform, 2 pretrain (layer 0); transform, 2 pretrain (layer 1); 2 finetune. Killed
    # after step 3, it resumes inside layer 1, whose inputs the new workers must rebuild.
    a, b, out_b = kill_master_then_resume(tmp_path, monkeypatch, program=SLOW_DBN, config=config, shards=shards,
                                          workers=2, kill_at=3, n_steps=8, result_file="model.npz")
    assert sorted(a) == sorted(b)
    assert {"rbm.0.weights", "rbm.1.weights", "net.2.weights"} <= set(a)  # model file format 2 (dbn.model.state)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
    from dbn import DBN

    model = DBN.load(out_b / "model.npz", device="cpu")
    assert model.hidden_layers == [32, 16] and model.n_classes_ == 10


def test_master_sigkill_then_resume_keeps_early_stopping_state(tmp_path, monkeypatch, mnist_small):
    """The best network and the epochs since it are master state in the checkpoints: a job killed
    while fine-tuning stops at the same epoch and keeps the same network as one never killed."""
    x_train, y_train, x_valid, y_valid = mnist_small
    shards = str(tmp_path / "shards")
    write_shards(x_train, y_train, shards, 2)
    (valid,) = write_shards(x_valid[:300], y_valid[:300], str(tmp_path / "valid"), 1)
    # The rate doubles every epoch: the validation error falls, soon rises, and the job stops early.
    config = dict(hidden_layers=[32], pretrain_epochs=2, finetune_epochs=14, top_layer_epochs=1, n_classes=10,
                  seed=0, finetune_learning_rate=0.1, finetune_lr_decay=2.0, early_stopping_patience=3,
                  validation=valid)
    # Steps: transform, 2 pre-training epochs, then fine-tuning, whose best epoch is the sixth (step 8) and
    # which stops after step 11: killed after step 9, it must resume knowing the best and the epochs since.
    # (Slow steps: the launcher reads the log a little late, and two steps must still be to run.)
    a, b, out_b = kill_master_then_resume(tmp_path, monkeypatch, program=SLOW_DBN, config=config, shards=shards,
                                          workers=2, kill_at=9, n_steps=None, result_file="model.npz", delay=0.5)
    (stopped,) = events(tmp_path / "a", "stopped")
    assert events(out_b, "stopped")[-1]["step"] == stopped["step"] < 3 + 14
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def test_a_master_killed_before_any_checkpoint_is_reported_as_killed(tmp_path, monkeypatch):
    """Not the unrelated last line of the master's log: the signal, and that nothing can be resumed."""
    monkeypatch.setenv(DELAY_ENV, "1.0")  # the first step outlasts the kill
    X, y = blobs(300, d=4, k=3)
    write_shards(X, y, str(tmp_path / "shards"), 2)
    out = tmp_path / "out"
    killed = []

    def on_record(rec):
        if rec.get("event") == "worker_registered" and not killed:
            killed.append(kill_master(out))

    with pytest.raises(MasterKilled) as info:
        run_job(program=SLOW_SOFTMAX, program_config={"n_classes": 3, "epochs": 5}, shards=str(tmp_path / "shards"),
                workers=2, output=str(out), on_record=on_record)
    assert killed and killed[0] is not None
    assert str(info.value) == f"the master was killed by SIGKILL (logs in {out / 'logs'}); no checkpoint"
    assert info.value.checkpoint is None


def test_every_worker_crashing_fails_the_job_with_the_last_error(tmp_path):
    X, _ = blobs(200, d=4, k=3)
    write_shards(X, None, str(tmp_path / "shards"), 2)  # softmax needs labels: the workers crash
    seen = []
    with pytest.raises(LocalJobError) as info:
        run_job(program=SOFTMAX, program_config={"n_classes": 3, "epochs": 2}, shards=str(tmp_path / "shards"),
                workers=2, output=str(tmp_path / "out"), max_restarts=1, on_record=seen.append, timeout=90)
    message = str(info.value)
    assert "every worker failed and used up its 1 restarts" in message
    assert "softmax regression needs a 'label' column" in message
    assert str(tmp_path / "out" / "logs") in message
    last_lines = []
    for name in ("worker-0", "worker-1"):
        lines = [ln.strip() for ln in (tmp_path / "out" / "logs" / f"{name}.log").read_text().splitlines() if ln.strip()]
        last_lines.append(lines[-1])
    assert any(f"last error: {line} (logs in" in message for line in last_lines), (message, last_lines)
    restarted = sorted(r["worker"] for r in seen if r.get("event") == "worker_restarted")
    gave_up = sorted(r["worker"] for r in seen if r.get("event") == "worker_gave_up")
    assert restarted == gave_up == ["worker-0", "worker-1"]
    assert all(r["error"] for r in seen if r.get("event") in ("worker_restarted", "worker_gave_up"))
    assert not records(tmp_path / "out")  # no step ever completed
    # Every process of the job is gone.
    address = master_info(tmp_path / "out")["address"]
    assert not worker_pids(address, "worker-0") and not worker_pids(address, "worker-1")
    assert not Path(tmp_path / "out" / "parameters.npz").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_the_launcher_ending_by_any_signal_stops_the_whole_job(tmp_path, signum):
    """A launcher stopped politely (a scheduler's SIGTERM, a dropped ssh session's SIGHUP) stops
    its master and workers itself; one killed with SIGKILL cannot, so they notice it is gone."""
    import subprocess
    import sys
    import time

    X, y = blobs(300, d=4, k=3)
    write_shards(X, y, str(tmp_path / "shards"), 2)
    script = (
        "import sys; sys.path.insert(0, %r)\n"
        "from iterreduce.launch.local import run_local\nfrom iterreduce.master import MasterConfig\n"
        "run_local(MasterConfig(program=%r, program_config={'n_classes': 3, 'epochs': 10000}, shards=%r, workers=2, "
        "token='', output=%r))\n"
    ) % (str(Path(__file__).resolve().parents[1]), SOFTMAX, str(tmp_path / "shards"), str(tmp_path / "out"))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.npz").write_bytes(b"an earlier run's model")
    launcher = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 60
    while not records(tmp_path / "out"):
        assert time.monotonic() < deadline and launcher.poll() is None, "the job did not start"
        time.sleep(0.2)
    address = master_info(tmp_path / "out")["address"]
    master_pid = master_info(tmp_path / "out")["pid"]
    folders = job_folders(master_pid)  # this job's own, whatever other jobs run on the machine
    assert len(folders) == 1 + sharedmem.available() and all(os.path.isdir(folder) for folder in folders)
    launcher.send_signal(signum)
    assert launcher.wait(timeout=30) == (-signum if signum == signal.SIGKILL else 128 + signum)

    def job_alive() -> bool:
        master = Path(f"/proc/{master_pid}").exists() and "iterreduce.master" in " ".join(cmdline(master_pid))
        return master or bool(worker_pids(address, "worker-0") or worker_pids(address, "worker-1"))

    deadline = time.monotonic() + 5  # the bar: nothing of the job alive 5 s after the launcher died
    while job_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not job_alive()
    assert (tmp_path / "out" / "model.npz").read_bytes() == b"an earlier run's model"
    # The folders it made for the job go too: the master removes them when the launcher could not.
    assert [folder for folder in folders if os.path.lexists(folder)] == []


def job_folders(pid: int) -> list[str]:
    """The scratch and shared-memory folders the launcher made for the job of process ``pid`` (its
    master or a worker), as the launcher named them in its environment: this job's alone."""
    from iterreduce.storage.rowfile import LOCAL_DIR_VAR

    items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    environ = dict(item.split(b"=", 1) for item in items if b"=" in item)
    return [os.fsdecode(environ[var.encode()]) for var in (LOCAL_DIR_VAR, sharedmem.SHARED_DIR_VAR)
            if environ.get(var.encode())]


@pytest.mark.parametrize("threads, workers, expected", [(None, 2, None), (1, 2, "1"), (3, 1, "3")])
def test_worker_processes_get_their_share_of_blas_threads(tmp_path, threads, workers, expected):
    """``[cluster] threads_per_process`` caps each worker's BLAS threads; unset, the cores are shared out."""
    import os

    from iterreduce.launch.local import LocalCluster
    from iterreduce.master import MasterConfig
    from iterreduce import THREAD_VARS

    config = MasterConfig(program=SOFTMAX, program_config={}, shards=[], workers=workers, token="t",
                          output=str(tmp_path))
    cluster = LocalCluster(config, threads_per_worker=threads)
    expected = expected or str(max(1, (os.cpu_count() or 1) // workers))
    for index in range(workers):
        env = cluster._env(index)
        assert all(env[var] == expected for var in THREAD_VARS)
    master_env = cluster._env(None)
    assert all(master_env.get(var) == os.environ.get(var) for var in THREAD_VARS)  # the master keeps the launcher's


def test_threads_per_process_reaches_the_local_launcher(monkeypatch, tmp_path):
    """The job file's setting is what the local mini-cluster is started with."""
    from dbn.jobs import run as run_module
    from dbn.jobs.spec import JobSpec

    seen = {}

    def fake_run_local(config, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(run_module, "run_local", fake_run_local)
    X, y = blobs(40, 6, 3)
    np.savez(tmp_path / "train.npz", X=X, y=y)
    spec = JobSpec.from_dict({"data": {"train": str(tmp_path / "train.npz")},
                              "cluster": {"workers": 2, "threads_per_process": 1}})
    assert spec.cluster.threads_per_process == 1
    with pytest.raises(SystemExit):
        run_module.MiniCluster().train(spec, tmp_path / "out", on_record=lambda record: None)
    assert seen["threads_per_worker"] == 1


@pytest.mark.parametrize("stream", [False, True], ids=["in-memory", "streamed"])
def test_master_sigkill_then_resume_is_bit_identical_on_a_table(tmp_path, monkeypatch, stream):
    """A table read in place: the statistics' first step, then training; killed mid-run and
    resumed, the new workers scale their raw rows by the checkpointed statistics again."""
    from test_table_jobs import write_animals

    from dbn.data.table_data import open_table, table_shards
    from dbn.jobs.spec import DataSection

    write_animals(tmp_path / "table")
    data = DataSection(train=str(tmp_path / "table"), features=("vec", "x0", "x1", "x2", "x3"), label="animal",
                       filter="split == 'train'")
    shards = table_shards(open_table(data), 2, str(tmp_path / "shares"))
    config = dict(hidden_layers=[16, 8], pretrain_epochs=2, finetune_epochs=2, top_layer_epochs=1, n_classes=3,
                  seed=0, stream=stream, scale="min_max", pretrain_batch_size=20, finetune_batch_size=20)
    # Steps: stats; transform, 2 pretrain (layer 0); transform, 2 pretrain (layer 1); 2 finetune.
    a, b, out_b = kill_master_then_resume(tmp_path, monkeypatch, program=SLOW_DBN, config=config, shards=shards,
                                          workers=2, kill_at=4, n_steps=9, result_file="model.npz")
    assert {"scaler.offset", "rbm.0.weights"} <= set(a)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def test_the_log_level_variable_reaches_master_and_workers(tmp_path, monkeypatch):
    """ITERREDUCE_LOG_LEVEL=debug: the master's log names each step's compute seconds by worker
    (whose spread is the time the others waited); a level that does not exist stops the job
    with the variable and the value named, not a traceback."""
    from iterreduce import LOG_LEVEL_VAR

    X, y = blobs(300, d=4, k=3)
    write_shards(X, y, str(tmp_path / "shards"), 2)
    monkeypatch.setenv(LOG_LEVEL_VAR, "debug")
    run_job(program=SOFTMAX, program_config={"n_classes": 3, "epochs": 2}, shards=str(tmp_path / "shards"),
            workers=2, output=str(tmp_path / "out"))
    lines = [ln for ln in (tmp_path / "out" / "logs" / "master.log").read_text().splitlines()
             if "compute seconds by worker" in ln]
    assert [ln.split("step ")[1].split(":")[0] for ln in lines] == ["0", "1"]
    assert all("worker-0#" in ln and "worker-1#" in ln for ln in lines), lines
    recs = records(tmp_path / "out")
    assert all(0 < r["compute_seconds_min"] <= r["compute_seconds"] for r in recs), recs

    monkeypatch.setenv(LOG_LEVEL_VAR, "loud")
    with pytest.raises(LocalJobError, match=f"{LOG_LEVEL_VAR}='loud': not a log level"):
        run_job(program=SOFTMAX, program_config={"n_classes": 3, "epochs": 2}, shards=str(tmp_path / "shards"),
                workers=2, output=str(tmp_path / "out2"), timeout=60)


def test_a_worker_whose_program_takes_seconds_to_import_is_not_taken_for_lost(tmp_path, monkeypatch):
    """A worker learns its program when it registers, then imports it (CuPy's import may take seconds):
    it beats from its registration on, so the master does not drop it as silent meanwhile."""
    subprocess_env(monkeypatch)
    monkeypatch.setenv("SLOW_IMPORT_S", "6")  # three heartbeat timeouts
    X, y = blobs(300)
    uris = write_shards(X, y, str(tmp_path / "shards"), 3)
    out = run_job(program="slow_import_program:SlowImportSoftmax", program_config={"n_classes": 3, "epochs": 2},
                  shards=uris, workers=3, output=str(tmp_path / "out"), heartbeat_timeout=2.0, timeout=120)
    assert events(out, "worker_lost") == []
    assert [r["shards"] for r in records(out)] == [3, 3]
