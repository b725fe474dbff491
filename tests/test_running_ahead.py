"""Workers running ahead (reduce = "workers"): each computes the next step's updates from the
parameters the all-gather gave it while the master ends the step, keeps them, bit for bit the
sequential run, when its task comes, and drops them when the master changed a parameter between
steps (before_step, after_step); softmax and DBN programs."""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest_runtime import assert_same_bits, events, load_npz, records, simulate
from dbn.jobs.dbn_program import DBNProgram
from iterreduce.program import weighted_average
from iterreduce.worker import Worker
from softmax_program import SoftmaxRegression, SoftmaxWorker
from shardio.shards import write_shards
from test_exchange import _run, layout, uris  # noqa: F401 - layout, uris: fixtures


# ------------------------------------------------------------------ running ahead


class SlowEndSoftmax(SoftmaxRegression):
    """The master takes 0.2 s to end each step (its evaluate): long enough for the workers to
    compute the next step's updates from the all-gather's parameters before their task comes."""

    worker_class = f"{__name__}:CountingSoftmaxWorker"

    def evaluate(self, step, parameters):
        time.sleep(0.2)
        return {}


class RescalingSoftmax(SlowEndSoftmax):
    """The master changes a parameter the workers read before step 1 (``before_step``), and
    another after step 2 (``after_step``): workers that ran ahead to steps 1 and 3 must not keep
    what they computed."""

    def before_step(self, step, parameters):
        if step.info["epoch"] == 1:
            return {**parameters, "bias": (parameters["bias"] * 0.5).astype(np.float32)}
        return parameters

    def after_step(self, step, parameters, metrics):
        if step.info["epoch"] == 2:
            return {**parameters, "weights": (parameters["weights"] * 0.75).astype(np.float32)}
        return parameters

    def reduce(self, step, parameters, updates):  # the default one, declared elementwise: as the simulation runs it
        return weighted_average(updates, step.arrays)

    elementwise_reduce = True


class CountingSoftmaxWorker(SoftmaxWorker):
    """Counts its runs: (epoch, shard) of each, in every worker of this process."""

    runs: list = []

    def run(self, step, parameters, shard, seed):
        self.runs.append((step.info["epoch"], shard.index))
        return super().run(step, parameters, shard, seed)


class AheadCountingWorker(Worker):
    """Records, a task at a time, the seconds of the updates it computed ahead and kept."""

    def _take_ahead(self, header):
        seconds, joined = super()._take_ahead(header)
        self.kept_ahead = getattr(self, "kept_ahead", []) + [(header.step, seconds)]
        return seconds, joined


EVERY_SHARD_ONCE = sorted((epoch, shard) for epoch in range(4) for shard in range(5))  # 4 steps of 5 shards


def _run_ahead_job(tmp_path, uris, program: str, worker_class):
    """A job of ``program`` (this module's) on 3 workers that reduce, each step once, with the
    sequential run's bits; ``job.runs``: its workers' runs (see CountingSoftmaxWorker)."""
    CountingSoftmaxWorker.runs = []
    job, _ = _run(tmp_path, uris, "ahead", program=f"{__name__}:{program}", worker_class=worker_class,
                  reduce="workers")
    job.runs = list(CountingSoftmaxWorker.runs)
    assert job.master.rounds.round == 4 and not events(job.output, "exchange_failed")
    assert_same_bits(load_npz(job.output / "parameters.npz"), simulate(job.config.program, job.config.program_config, uris))
    return job


def test_workers_compute_the_next_step_while_the_master_ends_one_and_keep_the_bits(tmp_path, uris, layout):
    job = _run_ahead_job(tmp_path, uris, "SlowEndSoftmax", AheadCountingWorker)
    # Steps 1-3 were computed ahead, each while the master evaluated the step before, and kept.
    for worker in job.worker_objects:
        assert [step for step, _ in worker.kept_ahead] == [0, 1, 2, 3]
        assert worker.kept_ahead[0][1] == 0.0 and all(seconds > 0 for _, seconds in worker.kept_ahead[1:])
    assert sorted(job.runs) == EVERY_SHARD_ONCE  # nothing was computed twice
    # A step run ahead is timed from the reduce of the one before, when its compute could start:
    # the master's 0.2 s end of that step, longer than this tiny compute, is time the workers waited.
    recs = records(job.output)
    assert all(r["sync_seconds"] >= 0.19 and r["seconds"] >= 0.2 for r in recs[1:]), recs
    assert recs[0]["seconds"] < 0.2
    assert all(0 < r["compute_seconds_min"] <= r["compute_seconds"] for r in recs), recs  # fastest, slowest of 3


class LateAheadWorker(AheadCountingWorker):
    """Starts computing ahead only once the master answered its push."""

    def _run_ahead(self, header, names, pending):
        pending.exception()  # waits for the answer
        return super()._run_ahead(header, names, pending)


def test_a_worker_runs_ahead_while_the_master_answers_wait(tmp_path, uris, monkeypatch):
    # The master takes longer to end a step (0.2 s) than a request for a task waits (1 ms): the
    # answer is WAIT, which is no task, so the worker computes ahead all the same.
    import iterreduce.master.service

    monkeypatch.setattr(iterreduce.master.service, "LONG_POLL_S", 0.001)
    job = _run_ahead_job(tmp_path, uris, "SlowEndSoftmax", LateAheadWorker)
    for worker in job.worker_objects:
        assert all(seconds > 0 for _, seconds in worker.kept_ahead[1:])
    assert sorted(job.runs) == EVERY_SHARD_ONCE


def test_updates_computed_ahead_are_dropped_when_the_master_changes_a_parameter(tmp_path, uris, layout):
    job = _run_ahead_job(tmp_path, uris, "RescalingSoftmax", AheadCountingWorker)
    # Step 1 follows a before_step change, step 3 an after_step one: computed ahead, dropped,
    # computed again; step 2's guess held.
    for worker in job.worker_objects:
        assert [seconds > 0 for _, seconds in worker.kept_ahead] == [False, False, True, False]
    runs = job.runs
    assert sorted(set(runs)) == EVERY_SHARD_ONCE and len(runs) == 20 + 2 * 5
    assert sorted({epoch for epoch, shard in runs if runs.count((epoch, shard)) == 2}) == [1, 3]  # ran twice


def test_a_parameter_the_master_changes_between_steps_reaches_every_worker(tmp_path, uris):
    # Whoever reduces, a program hook's change to an array the workers hold is theirs at the next
    # task (a version counted in steps gave a changed array the version the workers held).
    program = f"{__name__}:RescalingSoftmax"
    expected = simulate(program, {"n_classes": 3, "epochs": 4, "batch_size": 20}, uris)
    for reduce in ("master", "workers"):
        job, _ = _run(tmp_path, uris, reduce, program=program, reduce=reduce)
        assert job.master.rounds.round == 4 and not events(job.output, "exchange_failed")
        assert_same_bits(load_npz(job.output / "parameters.npz"), expected)


class SlowEndDBN(DBNProgram):
    """The DBN program, its master 0.1 s slower to end each step: the workers run ahead."""

    def evaluate(self, step, parameters):
        time.sleep(0.1)
        return super().evaluate(step, parameters)


@pytest.mark.parametrize("stream", [False, True])
def test_a_dbn_whose_workers_run_ahead_is_the_sequential_run(tmp_path, mnist_small, stream):
    x_train, y_train, _, _ = mnist_small
    uris = write_shards(x_train[:300], y_train[:300], str(tmp_path / "shards"), 3)
    config = dict(hidden_layers=[24, 12], pretrain_epochs=2, finetune_epochs=3, top_layer_epochs=1, n_classes=10,
                  seed=0, pretrain_batch_size=10, finetune_batch_size=10, sync_every=4, block_momentum=0.5,
                  pretrain_block_momentum=0.3, stream=stream)
    program = f"{__name__}:SlowEndDBN"
    job, _ = _run(tmp_path, uris, "workers", program=program, program_config=config, reduce="workers",
                  worker_class=AheadCountingWorker)
    steps = records(job.output)
    assert job.master.rounds.round == len(steps) and not events(job.output, "exchange_failed")
    # Within a layer's pre-training and within fine-tuning (the same arrays), the next part ran
    # ahead; never across a phase or a layer, nor into the top-layer-only epochs' end.
    phases = [(r["phase"], r.get("layer"), r.get("top_only")) for r in steps]
    for worker in job.worker_objects:
        ahead = {step for step, seconds in worker.kept_ahead if seconds > 0}
        assert ahead and all(phases[s] == phases[s - 1] and phases[s][0] in ("pretrain", "finetune") for s in ahead)
    assert_same_bits(job.master.parameters, simulate(program, config, uris))
