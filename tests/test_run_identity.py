"""A submission resumes only its own checkpoints (issue 36, item 4).

Before, the job's fingerprint (program, configuration, seed, shard sizes, schedule) was all a
checkpoint carried: two submissions of the same job into one checkpoint folder could not be
told apart, and a second application attempt whose first died before its own first checkpoint
went on from the *earlier submission's* checkpoint. Now every run has an id (a YARN
application's id; a fresh one for each local run) written in each of its checkpoints; a
restart of the run (a later application attempt) resumes only checkpoints carrying it, while
the user's explicit ``--resume`` still takes the job's newest checkpoint, whoever wrote it.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest_runtime import InProcessJob, blobs, events, records, run_job, subprocess_env, SOFTMAX
from iterreduce.master import checkpoint
from shardio.shards import write_shards

CONFIG = {"n_classes": 3, "epochs": 4}


@pytest.fixture
def uris(tmp_path):
    X, y = blobs(120, d=4, k=3)
    return write_shards(X, y, str(tmp_path / "shards"), 1)


def run(tmp_path, name, uris, **config) -> InProcessJob:
    """Run the job to its end in this process (one worker); returns it."""
    job = InProcessJob(tmp_path / name, uris, workers=1, program_config=CONFIG, **config)
    job.run_to_end("w")
    return job


def headers(folder) -> dict[str, dict]:
    return {p.name: checkpoint.load(str(p))[0] for p in sorted(folder.glob("ckpt-*.npz"))}


def test_every_checkpoint_carries_its_runs_id(tmp_path, uris):
    ckpt = tmp_path / "ckpt"
    run(tmp_path, "a", uris, checkpoint_dir=str(ckpt), run_id="run-a", checkpoint_keep=10)
    found = headers(ckpt)
    assert len(found) == 4 and {h["run"] for h in found.values()} == {"run-a"}


def test_a_restart_passes_over_another_submissions_checkpoints_of_the_same_job(tmp_path, uris):
    """The earlier submission finished (its checkpoint is at the last step): a restart of a new
    submission that has none of its own starts at step 0, not from the other's."""
    ckpt = str(tmp_path / "ckpt")
    earlier = run(tmp_path, "earlier", uris, checkpoint_dir=ckpt, run_id="application_1_0001")
    restarted = run(tmp_path, "mine", uris, checkpoint_dir=ckpt, run_id="application_1_0002", resume_own=True)
    assert restarted.master.fingerprint == earlier.master.fingerprint  # the same job: only the run tells them apart
    assert events(tmp_path / "mine", "resumed") == []
    assert [r["step"] for r in records(tmp_path / "mine")] == [0, 1, 2, 3]


def test_a_restart_resumes_its_own_newest_checkpoint_not_a_newer_one_of_another_run(tmp_path, uris):
    ckpt = tmp_path / "ckpt"
    run(tmp_path, "earlier", uris, checkpoint_dir=str(ckpt), run_id="earlier", checkpoint_keep=10)
    (ckpt / "ckpt-000000002.npz").unlink()
    (ckpt / "ckpt-000000004.npz").unlink()  # the earlier run's step 3 is left, the newest here
    own = run(tmp_path, "mine", uris, checkpoint_dir=str(tmp_path / "own"), run_id="mine", checkpoint_keep=10)
    (tmp_path / "own" / "ckpt-000000002.npz").rename(ckpt / "ckpt-000000002.npz")  # this run's, at step 2
    restarted = run(tmp_path, "again", uris, checkpoint_dir=str(ckpt), run_id="mine", resume_own=True)
    (resumed,) = events(tmp_path / "again", "resumed")
    assert resumed["step"] == 2 and resumed["checkpoint"].endswith("ckpt-000000002.npz")
    assert [r["step"] for r in records(tmp_path / "again")] == [2, 3]
    assert restarted.master.fingerprint == own.master.fingerprint


def test_a_restart_without_a_run_id_starts_at_step_0(tmp_path, uris, caplog):
    ckpt = str(tmp_path / "ckpt")
    run(tmp_path, "earlier", uris, checkpoint_dir=ckpt)
    run(tmp_path, "mine", uris, checkpoint_dir=ckpt, resume_own=True)
    assert events(tmp_path / "mine", "resumed") == []
    assert "cannot tell its own checkpoints" in caplog.text


def test_the_users_resume_still_takes_the_jobs_newest_checkpoint_whoever_wrote_it(tmp_path, uris):
    ckpt = tmp_path / "ckpt"
    run(tmp_path, "earlier", uris, checkpoint_dir=str(ckpt), run_id="earlier", checkpoint_keep=10)
    (ckpt / "ckpt-000000004.npz").unlink()
    run(tmp_path, "later", uris, checkpoint_dir=str(ckpt), run_id="later", resume=True)
    (resumed,) = events(tmp_path / "later", "resumed")
    assert resumed["step"] == 3


def test_checkpoint_latest_by_run(tmp_path):
    folder = str(tmp_path)
    for step, run_id in ((1, "a"), (2, "b"), (3, "a"), (4, None)):
        header = {"fingerprint": "job"} | ({"run": run_id} if run_id else {})
        checkpoint.save(folder, step, header, {"w": np.zeros(2)}, keep=10)
    checkpoint.save(folder, 5, {"fingerprint": "other job", "run": "a"}, {"w": np.zeros(2)}, keep=10)
    assert checkpoint.latest(folder, "job", run="a").endswith("ckpt-000000003.npz")
    assert checkpoint.latest(folder, "job", run="b").endswith("ckpt-000000002.npz")
    assert checkpoint.latest(folder, "job", run="c") is None
    assert checkpoint.latest(folder, "job").endswith("ckpt-000000004.npz")  # any run of the job
    with pytest.raises(ValueError, match="fingerprint"):
        checkpoint.latest(folder, run="a")


def test_a_later_application_attempt_restarts_its_own_run(tmp_path):
    """What the application master's container makes of its job file and attempt."""
    from iterreduce.launch.yarn.container import master_config

    job = {"master": {"program": SOFTMAX, "program_config": CONFIG, "shards": ["a.parquet"], "workers": 1,
                      "output": "hdfs://nn/out"}}
    first = master_config(job, tmp_path, "token", restart=False, run_id="application_1_0002")
    assert (first.run_id, first.resume, first.resume_own) == ("application_1_0002", False, False)
    assert first.checkpoint_dir == "hdfs://nn/out/checkpoints"
    second = master_config(job, tmp_path, "token", restart=True, run_id="application_1_0002")
    assert (second.run_id, second.resume, second.resume_own) == ("application_1_0002", False, True)
    named = master_config({"master": {**job["master"], "run_id": "mine", "resume": True}}, tmp_path, "token",
                          restart=True, run_id="application_1_0002")
    assert (named.run_id, named.resume, named.resume_own) == ("mine", True, True)  # the job file's word wins


def test_each_local_run_gets_its_own_id_and_a_resume_takes_the_jobs_newest(tmp_path, monkeypatch):
    """run_local: a fresh id for every run; ``--resume`` continues the job's newest checkpoint,
    written by the run before, and so that run: its checkpoints carry that run's id (and prune
    that run's older ones, as before)."""
    subprocess_env(monkeypatch)
    X, y = blobs(120, d=4, k=3)
    write_shards(X, y, str(tmp_path / "shards"), 1)
    job = {"program": SOFTMAX, "program_config": CONFIG, "shards": str(tmp_path / "shards"), "workers": 1,
           "output": str(tmp_path / "out"), "checkpoint_keep": 10}
    run_job(**job)
    ckpts = tmp_path / "out" / "checkpoints"
    first = {h["run"] for h in headers(ckpts).values()}
    assert len(first) == 1 and re.fullmatch(r"[0-9a-f]{32}", next(iter(first)))
    (ckpts / "ckpt-000000004.npz").unlink()
    run_job(**job, resume=True)
    (resumed,) = events(tmp_path / "out", "resumed")
    assert resumed["step"] == 3
    runs = {name: h["run"] for name, h in headers(ckpts).items()}
    assert "ckpt-000000004.npz" in runs and set(runs.values()) == first
    run_job(**{**job, "output": str(tmp_path / "again")})
    (again,) = {h["run"] for h in headers(tmp_path / "again" / "checkpoints").values()}
    assert again not in first  # a new run, a new id


def test_a_run_prunes_only_its_own_checkpoints_never_another_submissions(tmp_path):
    """Two submissions of the same job into one checkpoint folder: each keeps its newest
    ``keep``; neither deletes the other's (before, the job's fingerprint alone decided)."""
    folder = str(tmp_path)
    checkpoint.save(folder, 4, {"fingerprint": "job", "run": "earlier"}, {"w": np.zeros(2)}, keep=1)
    for step in (1, 2):
        checkpoint.save(folder, step, {"fingerprint": "job", "run": "later"}, {"w": np.ones(2)}, keep=1)
    assert {p.name: checkpoint.load(str(p))[0]["run"] for p in sorted(tmp_path.glob("ckpt-*.npz"))} == {
        "ckpt-000000002.npz": "later", "ckpt-000000004.npz": "earlier"}
