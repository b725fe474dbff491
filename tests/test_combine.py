"""One update for a worker's shards (issue 54, part 1): ``[cluster] combine``.

Where the master's reduce reads only the updates' sample-weighted mean (Program.averages), a worker
holding several shards pushes their mean instead of one update a shard (TaskHeader.combine,
UpdateHeader.combined); the DBN worker makes it from its models' own device arrays. One process
holding every shard gives the bits of one update a shard; several give the separate updates'
average within a bound of float32 ulps (a group's mean rounds once more); on NumPy the worker's
mean is the runtime's host combine bit for bit.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from iterreduce.program import Update, combine_updates, weighted_average


def _ulps(got: np.ndarray, want: np.ndarray, of: np.ndarray) -> float:
    """The largest difference of ``got`` from ``want`` in float32 ulps of ``of``."""
    return float((np.abs(got.astype(np.float64) - want) / np.spacing(np.abs(of).astype(np.float32))).max())


def _updates(shards: range, size: int = 50_000, seed: int = 0) -> list[Update]:
    rng = np.random.default_rng(seed)
    return [Update(s, int(rng.integers(50, 500)), {"w": rng.normal(0, 0.1, size).astype(np.float32),
                                                   "b": rng.normal(0, 1, 7).astype(np.float32)},
                   {"loss": float(rng.random()), "tag": "x"}) for s in shards]


def test_a_combined_update_is_its_shards_mean_with_their_samples_and_weighted_metrics():
    updates = _updates(range(3, 7))
    combined = combine_updates(list(reversed(updates)), ["w", "b"])
    assert (combined.shard, combined.combined) == (3, (4, 5, 6))
    assert combined.samples == sum(u.samples for u in updates)
    total = combined.samples
    assert combined.metrics == {"loss": pytest.approx(sum(u.metrics["loss"] * u.samples for u in updates) / total)}
    mean = weighted_average(updates, ["w", "b"])
    for name in ("w", "b"):
        np.testing.assert_array_equal(combined.arrays[name], mean[name])


def test_the_masters_average_of_combined_updates_is_within_its_bound_of_the_separate_updates_average():
    """Workers' groups of two to four shards: each weighted term rounds to float32 and a group's mean
    rounds once more, so the master's average differs from that of the separate updates (it does on
    this data) by at most 4.5 ulps of the largest of the shards' values at each element (the bound of
    combine_updates; the worst measured is 1.5)."""
    worst = 0.0
    for seed in range(4):
        updates = _updates(range(8), size=20_000, seed=seed)
        separate = weighted_average(updates, ["w"])["w"]
        largest = np.max([np.abs(u.arrays["w"]) for u in updates], axis=0)
        for size in (2, 3, 4):
            groups = [combine_updates(updates[i:i + size], ["w"]) for i in range(0, 8, size)]
            together = weighted_average(groups, ["w"])["w"]
            assert not np.array_equal(together, separate)  # why a bound is stated, not the bits
            worst = max(worst, _ulps(together, separate, largest))
    assert worst <= 4.5


def test_a_group_without_samples_combines_to_an_update_the_master_ignores():
    updates = [Update(0, 0, {"w": np.ones(3, np.float32)}), Update(1, 0, {"w": np.zeros(3, np.float32)})]
    combined = combine_updates(updates, ["w"])
    assert (combined.samples, combined.combined) == (0, (1,))
    kept = Update(2, 10, {"w": np.full(3, 2.0, np.float32)})
    np.testing.assert_array_equal(weighted_average([combined, kept], ["w"])["w"], kept.arrays["w"])


# ------------------------------------------------------------------ the master takes a combined push only where asked

def _rounds(combine: bool, shards=(0, 1, 2)):
    from iterreduce.master.rounds import Rounds

    rounds = Rounds(wake=threading.Condition(), event=lambda *args, **fields: None)
    rounds.combine = combine
    rounds.expected = set(shards)
    rounds.in_flight = {s: "w1" for s in shards}
    return rounds


def _push(combined: bool, stray: bool = False):
    from iterreduce.proto import iterreduce_pb2 as pb

    header = pb.UpdateHeader(worker_id="w1", step=1, round=0, combined=combined, results=[
        pb.ShardResult(index=0, samples=30), pb.ShardResult(index=1, samples=5 if stray else 0),
        pb.ShardResult(index=2)])
    w = np.zeros((2, 3), np.float32)
    updates = {0: Update(0, 30, {"w": w}, combined=(1, 2)), 1: Update(1, 5 if stray else 0), 2: Update(2, 0)}
    return header, updates, {"w": w}


def test_a_combined_push_is_taken_where_the_round_asked_for_one_and_refused_elsewhere():
    from iterreduce.master.pushes import Refused

    header, updates, parameters = _push(combined=True)
    rounds = _rounds(combine=True)
    rounds.check_push(header, "w1", updates, ("w",), parameters)
    rounds.take_push(header, "w1", updates, {})
    assert set(rounds.results) == {0, 1, 2} and rounds.results[0].samples == 30
    with pytest.raises(Refused, match="did not ask") as refused:
        _rounds(combine=False).check_push(header, "w1", updates, ("w",), parameters)
    assert not refused.value.abort
    header, updates, parameters = _push(combined=True, stray=True)
    with pytest.raises(Refused, match=r"beside its first shard's \(shards \[1\]\)"):
        _rounds(combine=True).check_push(header, "w1", updates, ("w",), parameters)
    header, updates, parameters = _push(combined=False)  # uncombined, the others lack their arrays
    with pytest.raises(Refused, match="shard 1 update lacks"):
        _rounds(combine=True).check_push(header, "w1", updates, ("w",), parameters)


# ------------------------------------------------------------------ the DBN worker's mean, and a job

def test_the_dbn_workers_combined_update_is_the_host_combine_of_its_updates_bit_for_bit(tmp_path, mnist_small):
    """DBNWorker.run_combined averages its models' device arrays (on NumPy: the host's float64 sum in
    shard order), grouped or one by one (610 rows: unequal minibatch counts)."""
    from dbn.jobs.dbn_program import DBNProgram, DBNWorker
    from iterreduce.program import shard_seed
    from shardio.readers import shard_info
    from shardio.shards import write_shards

    x_train, y_train, _, _ = mnist_small
    config = dict(hidden_layers=[24], pretrain_epochs=1, pretrain_batch_size=20, finetune_epochs=1,
                  finetune_batch_size=20, dropout=0.5, n_classes=10, seed=1)
    for rows in (600, 610):
        folder = tmp_path / f"shards{rows}"
        uris = write_shards(x_train[:rows], y_train[:rows], str(folder), 3)
        program = DBNProgram(config)
        parameters = program.initial_parameters(0, shard_info(uris))
        for phase in ("pretrain", "finetune"):
            step = next(s for s in program.schedule(shard_info(uris)) if s.phase == phase)
            assert program.averages(step)
            parameters = program.before_step(step, parameters)
            seeds = [shard_seed(0, 1, i) for i in range(3)]
            made = []
            for combined in (True, False):
                worker = DBNWorker(config)
                shards = [worker.load_shard(uri, i) for i, uri in enumerate(uris)]
                made.append(worker.run_combined(step, parameters, shards, seeds) if combined
                            else combine_updates(worker.run_shards(step, parameters, shards, seeds), step.arrays))
            a, b = made
            assert (a.shard, a.samples, a.metrics, a.combined) == (b.shard, b.samples, b.metrics, b.combined)
            assert sorted(a.arrays) == sorted(step.arrays)
            # The mean a GPU worker makes on the device, run on NumPy: the same float64 sums in shard order.
            updates = worker.run_shards(step, parameters, shards, seeds)
            on_device = worker._device_mean(updates, step.arrays)
            for name in step.arrays:
                np.testing.assert_array_equal(a.arrays[name], b.arrays[name], err_msg=f"{rows} {phase} {name}")
                np.testing.assert_array_equal(on_device[name], b.arrays[name], err_msg=f"{rows} {phase} {name}")


@pytest.fixture
def _subprocess_env(monkeypatch):
    from conftest_runtime import subprocess_env

    subprocess_env(monkeypatch)


def test_combined_pushes_train_the_model_of_one_update_a_shard_bit_for_bit_in_one_process_and_within_bounds_in_two(
        tmp_path, mnist_small, _subprocess_env):
    """With combine on, the master gets one update a pre-training, fine-tuning or input-mean step from
    each process holding several shards (one a shard for the feature statistics, which merge), with
    the same samples. One process holding all three shards: its mean is the master's own sum, so the
    model is that of three workers holding one shard each, bit for bit. Two processes (shards 0 and 1
    combined, shard 2 alone): the same model within the rounding bound a sync."""
    from conftest_runtime import DBN_PROGRAM, load_npz, records, run_job
    from shardio.shards import write_shards

    x_train, y_train, _, _ = mnist_small
    shards = str(tmp_path / "shards")
    write_shards(x_train[:600], y_train[:600], shards, 3)
    config = dict(hidden_layers=[32, 16], pretrain_epochs=2, pretrain_batch_size=25, finetune_epochs=2,
                  finetune_batch_size=25, top_layer_epochs=1, dropout=0.3, n_classes=10, seed=3)
    runs = {}
    for workers, combine in ((1, True), (2, True), (3, False)):
        out = run_job(program=DBN_PROGRAM, program_config=config, shards=shards, workers=workers, combine=combine,
                      output=str(tmp_path / f"out{workers}"), timeout=180,
                      threads_per_worker=1)  # the same BLAS arithmetic in each (conftest_runtime.run_job)
        runs[workers] = (records(out), load_npz(out / "model.npz"))
    separate = runs[3][0]
    for workers, updates in ((1, 1), (2, 2)):
        assert [r["phase"] for r in runs[workers][0]] == [r["phase"] for r in separate]
        for mine, theirs in zip(runs[workers][0], separate):
            assert mine["shards"] == theirs["shards"] == theirs["updates"] == 3
            assert mine["samples"] == theirs["samples"]
            assert mine["updates"] == (3 if mine["phase"] == "stats" else updates), mine
    alone = runs[3][1]
    assert sorted(runs[1][1]) == sorted(runs[2][1]) == sorted(alone)
    for name in alone:
        np.testing.assert_array_equal(runs[1][1][name], alone[name], err_msg=name)
        np.testing.assert_allclose(runs[2][1][name], alone[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_combine_is_on_where_the_workers_train_on_a_gpu_unless_set(tmp_path):
    from dbn.jobs.spec import JobSpec

    def master_config(**values):
        spec = JobSpec.from_dict({"data": {"train": "mnist"}, "cluster": {"workers": 2, **values.pop("cluster", {})},
                                  **values})
        return spec.master_config(shards=[str(tmp_path / "a.parquet")], output=str(tmp_path / "out"),
                                  on_yarn=values.get("yarn") is not None)

    assert master_config().combine is False  # the CPU: one update a shard, the bits whatever the layout
    assert master_config(cluster={"combine": True}).combine is True
    assert master_config(yarn={"worker_gpus": 1}).combine is True
    assert master_config(yarn={"worker_gpus": 1}, cluster={"combine": False}).combine is False
