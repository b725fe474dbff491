"""The same model whatever comes and goes (issue 52, part 3): ``lost_shards = "redo"``.

A shard's update depends only on the step's parameters, the shard and a seed of (job seed, step,
shard), and the reduce sums the shards in shard order. So when the live workers redo a lost
worker's unfinished shards within the step, the model is bit-identical to the undisturbed run's
(:func:`conftest_runtime.simulate`: every shard every step, in this process), however often a
worker is lost; under "skip" the step goes on without them and the model differs. Real processes
on the local mini-cluster; a worker is SIGKILLed mid-job and restarted by the launcher.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest_runtime import (SLOW_SOFTMAX, SOFTMAX, assert_same_bits, blobs, events, kill_worker, load_npz, records,
                              run_job, simulate, subprocess_env)
from iterreduce.master import MasterConfig
from shardio.readers import list_shards
from shardio.shards import write_shards

CONFIG = {"n_classes": 3, "epochs": 16, "batch_size": 0, "local_steps": 1, "learning_rate": 0.5}
KILLS = {3: "worker-1", 8: "worker-2", 12: "worker-1"}  # step -> the worker SIGKILLed once that step is in


def churned_job(tmp_path, monkeypatch, lost_shards: str, reduce: str):
    """Three workers on six shards, a worker killed at each step of :data:`KILLS` (the slow program's
    0.1 s a shard lets the kill land mid-step); returns the model and the undisturbed one."""
    subprocess_env(monkeypatch, delay=0.1)
    X, y = blobs(900, d=8, k=3, seed=4)
    shards = str(tmp_path / "shards")
    write_shards(X, y, shards, 6)
    out = tmp_path / f"out-{lost_shards}-{reduce}"
    killed = []

    def on_record(rec):
        if "event" not in rec and rec.get("step") in KILLS and rec["step"] not in killed:
            killed.append(rec["step"])
            kill_worker(out, KILLS[rec["step"]])

    run_job(program=SLOW_SOFTMAX, program_config=CONFIG, shards=shards, workers=3, output=str(out),
            on_record=on_record, timeout=180, reduce=reduce, lost_shards=lost_shards)
    assert killed == sorted(KILLS)
    assert len(events(out, "worker_lost")) >= 3
    assert [r["step"] for r in records(out)] == list(range(CONFIG["epochs"]))
    return out, load_npz(out / "parameters.npz"), simulate(SOFTMAX, CONFIG, list_shards(shards))


@pytest.mark.parametrize("reduce", ["master", "workers"])
def test_with_redo_a_job_whose_workers_are_killed_gives_the_undisturbed_model_bit_for_bit(tmp_path, monkeypatch,
                                                                                       reduce):
    out, model, undisturbed = churned_job(tmp_path, monkeypatch, "redo", reduce)
    assert all(r["shards"] == 6 for r in records(out))  # every shard in every step
    assert_same_bits(model, undisturbed)


def test_with_skip_the_steps_a_worker_was_lost_in_go_on_without_its_shards(tmp_path, monkeypatch):
    out, model, undisturbed = churned_job(tmp_path, monkeypatch, "skip", "master")
    assert any(r["shards"] < 6 for r in records(out))
    assert any(model[k].tobytes() != undisturbed[k].tobytes() for k in undisturbed)
    for k in undisturbed:  # close, not the same
        np.testing.assert_allclose(model[k], undisturbed[k], rtol=0.1, atol=0.05 * np.abs(undisturbed[k]).max())


def test_lost_shards_is_skip_or_redo(tmp_path):
    with pytest.raises(ValueError, match=r"lost_shards = 'retry': expected one of 'skip', 'redo'"):
        MasterConfig(program=SOFTMAX, program_config={}, shards=[], workers=1, token="", output=str(tmp_path),
                     lost_shards="retry")


def test_a_dbn_job_redoes_lost_shards_unless_told_to_skip_them(tmp_path):
    """The DBN job's default is "redo" (one step's compute a loss buys the undisturbed model,
    benchmarks/lost_shards_cost.py); the job file can still choose "skip"."""
    from dbn.jobs.spec import load_spec

    def policy(**overrides):
        spec = load_spec(None, {"cluster.workers": 2, **overrides}, quick=True)
        return spec.master_config(shards=["a", "b"], output=str(tmp_path)).lost_shards

    assert policy() == "redo"
    assert policy(**{"cluster.lost_shards": "skip"}) == "skip"
