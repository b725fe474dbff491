"""On the suite's real YARN: a new application attempt resumes only its own submission's
checkpoints (issue 36, item 4).

Before, the application master's second attempt resumed from the newest checkpoint of the job
(its fingerprint: program, configuration, seed, shard sizes, schedule) in the checkpoint folder,
whoever wrote it: a submission whose first attempt died before its own first checkpoint went
on from an earlier submission's checkpoint of the same job, here its last: it trained nothing.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from iterreduce import checkpoint
from test_yarn import env_archive, job_file, submit, venv, yarn  # noqa: F401 - the fixtures, shared

pytestmark = [pytest.mark.yarn, pytest.mark.hdfs, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def newest_job_file() -> dict:
    """The job file ``dbn submit`` just wrote and shipped."""
    from dbn.jobs.yarn import CACHE

    path = max((CACHE / "submissions").glob("*/job.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(path.read_text())


def plant_another_submissions_checkpoint(job: dict, tmp_path) -> tuple[str, str]:
    """A checkpoint of the very same job, as an earlier submission into that output folder would
    have left it, at the job's last step; returns (its URI, the job's fingerprint)."""
    from iterreduce.master import Master
    from iterreduce.yarn.container import master_config

    config = master_config(job, tmp_path / "planted", "token", restart=False, run_id="application_0_0001")
    master = Master(config)
    n_steps = len(master.steps)
    arrays = master.program.initial_parameters(config.seed, master.shards)
    uri = checkpoint.save(config.checkpoint_dir, n_steps, {"n_steps": n_steps, "seed": config.seed,
                                                           "program": config.program,
                                                           "fingerprint": master.fingerprint,
                                                           "run": "application_0_0001"}, arrays)
    return uri, master.fingerprint


def test_a_new_attempt_never_resumes_another_submissions_checkpoint_of_the_same_job(yarn, env_archive, tmp_path,
                                                                                    capsys):
    output = yarn.hadoop.uri("/user/test/own-checkpoints")
    app_id = submit(capsys, job_file(tmp_path, output, env=env_archive, epochs=6))
    planted, _ = plant_another_submissions_checkpoint(newest_job_file(), tmp_path)
    # Kill the first attempt as early as it can be seen: before its first checkpoint.
    am_container = f"container_{app_id.removeprefix('application_')}_01_000001"
    deadline = time.monotonic() + 120
    while not (pids := yarn.pids(am_container, "com.anaconda.skein.ApplicationMaster")):
        assert time.monotonic() < deadline, yarn.node_logs(app_id)
        time.sleep(0.2)
    os.killpg(os.getpgid(pids[0]), signal.SIGKILL)  # the whole container: skein's AM and our master

    report = yarn.wait(app_id, timeout=300)
    assert str(report.final_status) == "SUCCEEDED", (report.diagnostics, yarn.node_logs(app_id))
    assert any(p.name.endswith("_02_000001") for p in yarn.hadoop.dir.glob(f"cluster/**/{app_id}/container_*"))
    records = yarn.hdfs_json_lines("/user/test/own-checkpoints/log.jsonl")
    resumed = [r for r in records if r.get("event") == "resumed"]
    assert all(r["checkpoint"] != planted for r in resumed), resumed
    steps = [r["step"] for r in records if "step" in r and "phase" in r]
    assert steps and steps[-1] == [r for r in records if "phase" in r][-1]["of"] - 1  # it trained to the end
    assert steps[0] == (resumed[0]["step"] if resumed else 0)  # from its own checkpoint, or from the start
    for r in resumed:  # a checkpoint this very submission wrote (its first attempt's), if any
        header, _ = checkpoint.load(r["checkpoint"])
        assert header["run"] == app_id, header
    finals = [r for r in records if r.get("event") == "checkpoint"]
    assert finals and checkpoint.load(finals[-1]["path"])[0]["run"] == app_id
