"""Reusing an output directory (issue 11, part 6): refuse another job's run unless --overwrite,
never destroy the earlier run's files before the new run has its own, and let --resume
continue the newest run of the same job.

Jobs are tiny (24 features, a few hundred rows, layers of 16 and 8, 1-4 epochs): in this
process for most cases, on a local mini-cluster where checkpoints and killed masters matter.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest_runtime import DELAY_ENV, SLOW_DBN, events, kill_master, records, subprocess_env
from dbn import DBN
from dbn.cli import main
from dbn.jobs.run import why_another_job
from dbn.jobs.spec import load_spec
from iterreduce.master import checkpoint
from iterreduce.storage import ownership
from iterreduce.storage.ownership import prune_previous, set_aside
from test_cli import make_dataset

RUN_FILES = ("model.npz", "result.json", "config.json", "log.jsonl")


@pytest.fixture
def job(tmp_path):
    """A tiny job file (in-process by default) and its output dir: (config, out)."""
    make_dataset(tmp_path / "train.npz")
    make_dataset(tmp_path / "test.npz", n=120, seed=1)
    config = tmp_path / "tiny.toml"
    config.write_text(
        "[data]\ntrain = 'train.npz'\ntest = 'test.npz'\n"
        "[model]\nhidden_layers = [16, 8]\npretrain_epochs = 1\nfinetune_epochs = 2\ntop_layer_epochs = 1\n"
        "pretrain_batch_size = 20\nfinetune_batch_size = 20\n"
        "[job]\nseed = 1\ndevice = 'cpu'\n"
    )
    return config, tmp_path / "out"


def train(config, out, *flags) -> int:
    return main(["train", str(config), "--out", str(out), "--quiet", *flags])


def snapshot(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in RUN_FILES if (out / name).exists()}


# ------------------------------------------------------------- another job's run


def test_another_jobs_run_is_refused_and_left_as_it_was(job, capsys):
    config, out = job
    assert train(config, out) == 0
    before = snapshot(out)
    assert set(before) == set(RUN_FILES)
    capsys.readouterr()

    assert train(config, out, "--layers", "12") == 2
    err = capsys.readouterr().err
    assert err.startswith("dbn: error: ") and "Traceback" not in err
    assert f"{out}: holds a run of another job" in err
    assert "model.hidden_layers [16, 8] there, [12] here" in err  # what differs
    assert "--overwrite" in err and "--out" in err  # what to do
    assert snapshot(out) == before and not (out / "previous").exists()


@pytest.mark.parametrize("local", [(), ("--local", "2", "--no-ui")], ids=["in-process", "local-2"])
def test_an_output_that_is_a_file_is_refused_and_left_as_it_was(job, capsys, local):
    config, out = job
    out.write_bytes(b"someone's file")
    assert train(config, out, *local) == 2
    err = capsys.readouterr().err
    assert f"{out}: a file, not a directory" in err and "Traceback" not in err
    assert out.read_bytes() == b"someone's file"


@pytest.mark.parametrize("uri", ["hdfs://namenode:8020/user/me/run", "file:///tmp/run", "s3://bucket/run"])
@pytest.mark.parametrize("local", [(), ("--local", "2", "--no-ui")], ids=["in-process", "local-2"])
def test_a_run_on_this_machine_refuses_an_output_uri_and_writes_nothing(job, capsys, local, uri, monkeypatch):
    """A URI taken as a path made a local folder `hdfs:` holding the run (2026-12-08): refused, naming
    the setting and what to do, before anything is written."""
    config, _ = job
    monkeypatch.chdir(config.parent)
    before = sorted(config.parent.rglob("*"))
    assert train(config, uri, *local) == 2
    err = capsys.readouterr().err
    assert f"[output] dir = {uri!r}: a run on this machine" in err and "dbn submit" in err and "Traceback" not in err
    assert sorted(config.parent.rglob("*")) == before


def test_an_output_of_the_root_folder_is_refused_and_a_tilde_is_the_home(job, capsys, monkeypatch, tmp_path):
    """`--out /` wrote the run's files into / (2026-12-08); `--out "~"` made a folder named ~."""
    config, _ = job
    assert train(config, "/") == 2
    assert "[output] dir = '/': the file system's root" in capsys.readouterr().err
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert train(config, "~/run") == 0
    assert (home / "run" / "model.npz").is_file() and not (tmp_path / "~").exists()


def test_a_model_without_config_is_another_jobs_run(job, capsys):
    config, out = job
    assert train(config, out) == 0
    (out / "config.json").unlink()  # e.g. a model copied in by hand: of which job, nobody knows
    before = snapshot(out)
    capsys.readouterr()
    assert train(config, out) == 2
    assert "model.npz, result.json but no config.json" in capsys.readouterr().err
    assert snapshot(out) == before
    assert train(config, out, "--overwrite") == 0


def test_a_failed_attempt_holds_no_run(job, capsys, monkeypatch):
    """A folder with a log but no model, result or checkpoint (a run that failed) is no one's.
    (The failed run is a real one now: config.json and log.jsonl written by hand are no run's
    files, and are refused untouched: tests/test_ownership.py.)"""
    from dbn.errors import DataError

    config, out = job
    out.mkdir()  # not made by the run: a failed run leaves what it wrote

    def fail(self, X):
        raise DataError("injected: training failed")

    with monkeypatch.context() as patch:
        patch.setattr(DBN, "pretrain", fail)
        assert train(config, out, "--layers", "3") == 2
    log = (out / "log.jsonl").read_bytes()
    assert b'"event": "start"' in log and not (out / "model.npz").exists()
    assert why_another_job(out, load_spec(config, {})) is None
    assert train(config, out) == 0
    assert (out / "previous" / "1" / "log.jsonl").read_bytes() == log


@pytest.mark.parametrize("where", [(), ("--local", "2")])
def test_an_unclear_environment_setting_is_refused_before_anything_is_written(job, capsys, monkeypatch, where):
    config, out = job
    monkeypatch.setenv("DBN_CUDA_GRAPHS", "perhaps")
    assert train(config, out, *where) == 2
    assert "DBN_CUDA_GRAPHS='perhaps'" in capsys.readouterr().err
    assert not out.exists()


def test_a_folder_with_only_the_config_and_empty_files_is_no_trace(tmp_path, monkeypatch):
    """A run that fails before writing anything is removed whole: config.json, folders and
    empty files (a log opened before the failure) are not a trace; anything else is."""
    from dbn.jobs import run as run_module

    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "config.json").write_text("{}")
    (out / "log.jsonl").write_text("")
    assert run_module._nothing_but_config(out)
    (out / "log.jsonl").write_text('{"event": "start"}\n')
    assert not run_module._nothing_but_config(out)
    (out / "log.jsonl").write_text("")
    (out / "checkpoints" / "config.json").write_text("{}")  # a config.json elsewhere is something
    assert not run_module._nothing_but_config(out)


def test_settings_of_where_a_job_runs_do_not_make_another_job(job):
    config, out = job
    assert train(config, out) == 0
    assert why_another_job(out, load_spec(config, {"cluster.max_restarts": 9, "output.dir": "elsewhere"})) is None
    assert "model.pretrain_epochs 1 there, 2 here" in why_another_job(out, load_spec(config, {"model.pretrain_epochs": 2}))


# ------------------------------------------------------------------ --overwrite


def test_overwrite_keeps_the_earlier_model_until_the_new_one_is_written(job, monkeypatch):
    config, out = job
    assert train(config, out) == 0
    earlier = snapshot(out)
    seen_at_save = []
    save = DBN.save

    def checked_save(self, path):  # the moment the new model replaces the earlier one
        seen_at_save.append(snapshot(out))
        save(self, path)

    monkeypatch.setattr(DBN, "save", checked_save)
    assert train(config, out, "--layers", "12", "--overwrite") == 0
    assert len(seen_at_save) == 1
    assert seen_at_save[0]["model.npz"] == earlier["model.npz"]  # byte-identical until replaced
    assert seen_at_save[0]["result.json"] == earlier["result.json"]
    assert DBN.load(out / "model.npz", device="cpu").hidden_layers == [12]
    # The earlier run is kept whole: model, result, config and log.
    assert snapshot(out / "previous" / "1") == earlier
    assert json.loads((out / "config.json").read_text())["model"]["hidden_layers"] == [12]


@pytest.mark.parametrize("local", [False, True], ids=["in-process", "local-cluster"])
@pytest.mark.parametrize("fault", ["no labels", "out of range"])
def test_a_failing_run_leaves_the_model_byte_identical(job, tmp_path, capsys, local, fault):
    """Bad data found before the run claims the folder (no labels: the pre-flight that reads the
    data beside the test set) leaves the whole folder as it was; found after (values outside
    [0, 1], which training checks), the model and result stay and config and log are set aside."""
    config, out = job
    assert train(config, out) == 0
    earlier = snapshot(out)
    if fault == "no labels":
        np.savez(tmp_path / "bad.npz", X=np.zeros((30, 24), np.float32))
    else:
        np.savez(tmp_path / "bad.npz", X=np.full((30, 24), 5, np.float32), y=np.arange(30) % 3)
    flags = ["--local", "2"] if local else []
    assert train(config, out, "--overwrite", "--set", f"data.train={tmp_path / 'bad.npz'}", *flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("dbn: error: ") and ("no labels" in err if fault == "no labels" else "Bernoulli visible units need [0, 1]" in err), err
    assert (out / "model.npz").read_bytes() == earlier["model.npz"]
    assert (out / "result.json").read_bytes() == earlier["result.json"]
    if fault == "no labels":
        assert snapshot(out) == earlier and not (out / "previous").exists()  # not touched at all
    else:
        assert snapshot(out / "previous" / "1") == earlier  # config and log were set aside, not deleted


# ----------------------------------------------------------- the same job again


def test_rerunning_the_same_job_keeps_the_earlier_run(job, monkeypatch):
    """The same job into its own folder needs no --overwrite: the earlier run moves to
    previous/1 (its model.npz and result.json stay until the new run replaces them)."""
    config, out = job
    assert train(config, out) == 0
    earlier = snapshot(out)
    assert train(config, out) == 0
    assert snapshot(out / "previous" / "1") == earlier
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["event"] for r in log if r["event"] in ("start", "summary")] == ["start", "summary"]  # this run's only
    assert (out / "config.json").read_bytes() == earlier["config.json"]


def test_previous_runs_are_numbered_and_pruned_only_when_asked(tmp_path):
    """(Each run's files are recorded as a run's, as a run records them when it ends: set_aside
    moves nothing else, tests/test_ownership.py.)"""
    out = tmp_path / "out"
    for i in range(1, 6):
        (out / "checkpoints").mkdir(parents=True)
        (out / "checkpoints" / "ckpt-000000001.npz").write_text(f"run {i}")
        (out / "log.jsonl").write_text(f"log {i}")
        (out / "model.npz").write_text(f"model {i}")
        ownership.claim(out, ("checkpoints", "log.jsonl", "model.npz"))
        ownership.settle(out, ("checkpoints", "log.jsonl", "model.npz"))
        assert set_aside(out, keep_in_place=("model.npz",)) == out / "previous" / str(i)
        assert (out / "model.npz").read_text() == f"model {i}"  # stays in place ...
        assert (out / "previous" / str(i) / "model.npz").read_text() == f"model {i}"  # ... and is kept
        (out / "model.npz").unlink()
    assert sorted(p.name for p in (out / "previous").iterdir()) == ["1", "2", "3", "4", "5"]
    assert set_aside(out) is None  # nothing of a run left to set aside
    prune_previous(out, keep=3)
    assert sorted(p.name for p in (out / "previous").iterdir()) == ["3", "4", "5"]
    assert (out / "previous" / "5" / "checkpoints" / "ckpt-000000001.npz").read_text() == "run 5"


# --------------------------------------------------------- --resume and checkpoints


def test_checkpoint_latest_picks_the_newest_of_the_job(tmp_path):
    directory = str(tmp_path / "ck")
    for step in (11, 12):
        checkpoint.save(directory, step, {"fingerprint": "old job"}, {"a": np.zeros(2)})
    for step in (1, 2, 3):
        checkpoint.save(directory, step, {"fingerprint": "new job"}, {"a": np.ones(2)})
    (tmp_path / "ck" / "ckpt-000000013.npz").write_bytes(b"not a checkpoint")
    assert checkpoint.latest(directory).endswith("ckpt-000000013.npz")  # without a fingerprint: the highest step
    assert checkpoint.latest(directory, fingerprint="new job").endswith("ckpt-000000003.npz")
    assert checkpoint.latest(directory, fingerprint="old job").endswith("ckpt-000000012.npz")
    assert checkpoint.latest(directory, fingerprint="a third job") is None
    assert checkpoint.latest(str(tmp_path / "none"), fingerprint="new job") is None


def test_checkpoint_pruning_spares_other_jobs(tmp_path):
    """Another job's higher-numbered checkpoints never push this job's out (keep=2 of its own)."""
    directory = str(tmp_path / "ck")
    for step in (11, 12):
        checkpoint.save(directory, step, {"fingerprint": "old job"}, {"a": np.zeros(2)})
    for step in (1, 2, 3):
        checkpoint.save(directory, step, {"fingerprint": "new job"}, {"a": np.ones(2)}, keep=2)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == \
        ["ckpt-000000002.npz", "ckpt-000000003.npz", "ckpt-000000011.npz", "ckpt-000000012.npz"]


def _kill_master_when_checkpointed(out: Path, killed: list, stop: threading.Event) -> None:
    """Watch the new run in ``out`` (once the earlier one is set aside); SIGKILL its master
    once a step has been checkpointed."""
    while not stop.is_set():
        if (out / "previous" / "1").exists() and records(out) and any((out / "checkpoints").glob("ckpt-*.npz")):
            pid = kill_master(out)
            if pid:
                killed.append(pid)
                return
        time.sleep(0.05)


def test_resume_continues_the_new_run_not_the_earlier_jobs_checkpoints(job, monkeypatch, capsys):
    """Job A finishes with checkpoints 9 and 10; job B (--overwrite) is killed after a step or
    two, and `--resume` goes on from B's own newest checkpoint."""
    config, out = job
    subprocess_env(monkeypatch)
    monkeypatch.setattr("dbn.jobs.spec.PROGRAM", SLOW_DBN)  # the real program, slower steps to kill one in
    assert train(config, out, "--local", "2", "--epochs", "3") == 0  # A: 2 x (1 + 3) + 2 = 10 steps
    a_checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert a_checkpoints == ["ckpt-000000009.npz", "ckpt-000000010.npz"]

    monkeypatch.setenv(DELAY_ENV, "0.4")
    killed, stop = [], threading.Event()
    watcher = threading.Thread(target=_kill_master_when_checkpointed, args=(out, killed, stop), daemon=True)
    watcher.start()
    try:
        code = train(config, out, "--local", "2", "--layers", "12", "--overwrite")  # B: 1 + 1 + 2 = 4 steps
    finally:
        stop.set()
        watcher.join()
    assert killed, "the job ended before its master could be killed"
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("dbn: error: the master was killed by SIGKILL")
    assert f"checkpoints in {out / 'checkpoints'}" in err and "--resume" in err
    b_checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert b_checkpoints and all(name < "ckpt-000000005.npz" for name in b_checkpoints)
    assert sorted(p.name for p in (out / "previous" / "1" / "checkpoints").iterdir()) == a_checkpoints

    monkeypatch.setenv(DELAY_ENV, "0")
    assert train(config, out, "--local", "2", "--layers", "12", "--resume") == 0
    (resumed,) = events(out, "resumed")
    assert resumed["checkpoint"] == str(out / "checkpoints" / b_checkpoints[-1])
    assert [r["step"] for r in records(out)][-1] == 3 and all(r["of"] == 4 for r in records(out))
    assert DBN.load(out / "model.npz", device="cpu").hidden_layers == [12]
    assert not (out / "previous" / "2").exists()  # the resume set nothing aside
    # result.json says the run resumed, and where: its wall time is the resumed part's only
    assert json.loads((out / "result.json").read_text())["resumed_at_step"] == resumed["step"]


def test_resume_passes_over_another_jobs_checkpoints_in_the_directory(tmp_path, monkeypatch):
    """Another job's higher-numbered checkpoints in the very checkpoint folder (e.g. a shared
    [cluster] checkpoint folder on HDFS): the master resumes from its own job's newest."""
    from conftest_runtime import SOFTMAX, blobs, run_job
    from shardio.shards import write_shards

    subprocess_env(monkeypatch)
    X, y = blobs(300, d=4, k=3)
    write_shards(X, y, str(tmp_path / "shards"), 2)
    job = {"program": SOFTMAX, "program_config": {"n_classes": 3, "epochs": 4}, "shards": str(tmp_path / "shards"),
           "workers": 2, "output": str(tmp_path / "out")}
    run_job(**job)
    ckpts = str(tmp_path / "out" / "checkpoints")
    for step in (11, 12):  # another job's, newer by step number
        checkpoint.save(ckpts, step, {"fingerprint": "another job"}, {"weights": np.zeros((4, 3), np.float32)})
    # ... written by this tool into the run's folder (a file no run of it wrote is refused: test_ownership.py)
    ownership.claim(tmp_path / "out", ("checkpoints",))
    ownership.settle(tmp_path / "out", ("checkpoints",))
    run_job(**job, resume=True)
    (resumed,) = events(tmp_path / "out", "resumed")
    assert resumed["checkpoint"] == f"{ckpts}/ckpt-000000004.npz" and resumed["step"] == 4


def test_dbn_mnist_passes_overwrite_on_to_its_runs(job, monkeypatch, capsys):
    """`dbn mnist` starts its runs through mnist_eval; --overwrite must reach each of them."""
    import dbn.jobs.mnist_eval as mnist_eval
    from dbn.jobs.run import InProcess, run

    config, out = job
    assert train(config, out) == 0
    other = load_spec(config, {"model.hidden_layers": [12], "output.dir": str(out)})

    def command(**kwargs):  # what mnist_eval.command does, on the tiny job instead of MNIST
        return str(out), run(other, InProcess(), overwrite=kwargs["overwrite"])

    monkeypatch.setattr(mnist_eval, "command", command)
    assert main(["mnist", "--quiet", "--json"]) == 2
    assert f"{out}: holds a run of another job" in capsys.readouterr().err
    assert main(["mnist", "--quiet", "--json", "--overwrite"]) == 0
    assert DBN.load(out / "model.npz", device="cpu").hidden_layers == [12]


@pytest.mark.parametrize("local", [(), ("--local", "2", "--no-ui")], ids=["in-process", "local-2"])
def test_a_run_refused_by_a_folder_of_someone_elses_leaves_no_lock_there(job, capsys, local):
    """A folder holding a person's config.json: the run is refused, and the folder is as it was (its
    lock, made for the run, went with it; 2026-12-08 it stayed)."""
    config, out = job
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}')
    (out / "notes.txt").write_text("mine")
    before = sorted(p.name for p in out.iterdir())
    assert train(config, out, *local) == 2
    capsys.readouterr()
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_refused_run_keeps_a_lock_that_was_there(job, capsys):
    """The lock of an earlier run of the project stays (it is the folder's, not this run's)."""
    config, out = job
    assert train(config, out) == 0
    assert (out / ownership.LOCK_NAME).exists()
    assert train(config, out, "--layers", "12") == 2  # another job: refused
    capsys.readouterr()
    assert (out / ownership.LOCK_NAME).exists()


@pytest.mark.parametrize("below", ["", "sub"], ids=["the-link", "below-it"])
def test_an_output_through_a_symbolic_link_is_refused_and_its_target_untouched(job, capsys, tmp_path, below,
                                                                              monkeypatch):
    """`--out LINK` and `--out LINK/sub` wrote into the link's target (docs/cli.md: no write goes
    through a symbolic link)."""
    config, _ = job
    target = tmp_path / "someone-elses"
    target.mkdir()
    (target / "theirs.txt").write_text("theirs")
    (tmp_path / "LINK").symlink_to(target)
    monkeypatch.chdir(tmp_path)
    out = "LINK/sub" if below else "LINK"
    assert train(config, out) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'LINK'} is a symbolic link, and a run writes through none" in err, err
    assert sorted(p.name for p in target.iterdir()) == ["theirs.txt"]
