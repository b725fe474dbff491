"""RBMs trained in lockstep as one computation (issue 54, part 1: :mod:`dbn.model.rbm_group`):
each member ends where its RBM alone on its data ends, bit for bit on NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from dbn.model.rbm import RBM
from dbn.model.rbm_group import GroupError, RBMGroup


def shards(n_members: int, rows: int, n_visible: int, gaussian: bool = False) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    if gaussian:
        return [rng.normal(0, 1, (rows, n_visible)).astype(np.float32) for _ in range(n_members)]
    return [(rng.random((rows, n_visible)) < 0.3).astype(np.float32) for _ in range(n_members)]


def member(seed: int, X: np.ndarray, **params) -> RBM:
    return RBM(params.pop("n_hidden", 7), device="cpu", seed=seed, **params).initialize(X)


@pytest.mark.parametrize("params", [
    {}, {"cd_k": 3}, {"visible": "gaussian", "learning_rate": 0.01}, {"batch_size": 16, "momentum_epoch": 1},
    {"n_hidden": 1}], ids=["cd1", "cd3", "gaussian", "batch16-momentum-switch", "one-hidden"])
def test_each_member_ends_where_its_rbm_alone_ends_bit_for_bit(params):
    Xs = shards(3, 96, 11, gaussian=params.get("visible") == "gaussian")
    alone = [member(100 + g, X, **dict(params)) for g, X in enumerate(Xs)]
    together = [member(100 + g, X, **dict(params)) for g, X in enumerate(Xs)]
    group = RBMGroup(together)
    for epoch in range(3):
        expected = [rbm.train_epoch(X, epoch) for rbm, X in zip(alone, Xs)]
        got = group.train_epoch(Xs, epoch)
        assert [s.reconstruction_error for s in got] == [s.reconstruction_error for s in expected]
        assert [s.n_samples for s in got] == [s.n_samples for s in expected]
    for mine, theirs in zip(together, alone):
        a, b = mine.get_state(), theirs.get_state()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_a_range_of_minibatches_steps_the_members_as_their_own_ranges_do():
    Xs = shards(2, 120, 9)
    alone = [member(5 + g, X, batch_size=10) for g, X in enumerate(Xs)]
    group = RBMGroup([member(5 + g, X, batch_size=10) for g, X in enumerate(Xs)])
    for part in (range(0, 4), range(4, 12)):
        for rbm, X in zip(alone, Xs):
            rbm.train_epoch(X, 0, part)
        group.train_epoch(Xs, 0, part)
    for mine, theirs in zip(group.members, alone):
        np.testing.assert_array_equal(mine.get_state()["weights"], theirs.get_state()["weights"])


def test_a_members_state_loaded_later_is_what_the_group_trains():
    """A worker loads each superstep's parameters with set_state: in place, so into the group's stacks."""
    Xs = shards(2, 64, 8)
    together = [member(g, X) for g, X in enumerate(Xs)]
    group = RBMGroup(together)
    state = member(42, Xs[0]).get_state()
    together[1].set_state(state)
    np.testing.assert_array_equal(group.weights[1], state["weights"])
    alone = member(1, Xs[1]).set_state(state)
    alone.train_epoch(Xs[1], 0)
    group.train_epoch(Xs, 0)
    np.testing.assert_array_equal(together[1].get_state()["weights"], alone.get_state()["weights"])


def test_what_cannot_step_together_is_refused_before_anything_is_trained():
    Xs = shards(2, 64, 8)
    with pytest.raises(GroupError, match="differ in learning_rate"):
        RBMGroup([member(0, Xs[0]), member(1, Xs[1], learning_rate=0.5)])
    with pytest.raises(GroupError, match="persistent CD"):
        RBMGroup([member(0, Xs[0], persistent=True), member(1, Xs[1], persistent=True)])
    with pytest.raises(GroupError, match="differ in shape"):
        RBMGroup([member(0, Xs[0]), member(1, shards(1, 64, 9)[0])])
    group = RBMGroup([member(0, Xs[0]), member(1, Xs[1])])
    before = group.weights.copy()
    with pytest.raises(GroupError, match=r"\[64, 50\] rows\) make minibatches of different sizes or numbers"):
        group.train_epoch([Xs[0], Xs[1][:50]], 0)
    np.testing.assert_array_equal(group.weights, before)


# ------------------------------------------------------------------ in a job: a worker's shards as one computation


@pytest.fixture
def _subprocess_env(monkeypatch):
    from conftest_runtime import subprocess_env

    subprocess_env(monkeypatch)


@pytest.mark.parametrize("extra", [{}, {"cd_k": 2, "sync_every": 3},
                                   {"dropout": 0.5, "input_dropout": 0.2, "max_norm": 2.0, "finetune_epochs": 3}],
                         ids=["plain", "cd2-parts", "dropout"])
def test_one_worker_holding_three_shards_trains_the_model_of_three_workers_holding_one_each(
        tmp_path, mnist_small, _subprocess_env, extra):
    """The worker runs its shards' pre-training and fine-tuning steps as one group each
    (DBNWorker.run_shards); each shard's update is the bits its own run gives, so the master
    averages the same updates and the model is that of three workers with a shard each, bit for bit."""
    from conftest_runtime import DBN_PROGRAM, load_npz, records, run_job
    from shardio.shards import write_shards

    x_train, y_train, _, _ = mnist_small
    shards = str(tmp_path / "shards")
    write_shards(x_train[:600], y_train[:600], shards, 3)
    config = {**dict(hidden_layers=[32, 16], pretrain_epochs=2, pretrain_batch_size=25, finetune_epochs=2,
                     finetune_batch_size=25, top_layer_epochs=1, n_classes=10, seed=3), **extra}
    models = {}
    for workers in (1, 3):
        out = run_job(program=DBN_PROGRAM, program_config=config, shards=shards, workers=workers,
                      output=str(tmp_path / f"out{workers}"), timeout=180,
                      threads_per_worker=1)  # the same BLAS arithmetic in each (conftest_runtime.run_job)
        assert {r["shards"] for r in records(out)} == {3}
        models[workers] = load_npz(out / "model.npz")
    assert sorted(models[1]) == sorted(models[3])
    for name in models[3]:
        np.testing.assert_array_equal(models[1][name], models[3][name], err_msg=name)


def test_a_workers_shards_train_as_one_group_and_fall_back_one_by_one_where_they_cannot(tmp_path, mnist_small):
    """DBNWorker.run_shards groups a pre-training or fine-tuning step's shards (its groups hold their
    RBMs and networks), and gives the updates of run() one shard at a time; shards of unequal
    minibatch counts run one by one."""
    from dbn.jobs.dbn_program import DBNProgram, DBNWorker
    from iterreduce.program import Step, shard_seed
    from shardio.readers import list_shards, shard_info
    from shardio.shards import write_shards

    x_train, y_train, _, _ = mnist_small
    config = dict(hidden_layers=[24], pretrain_epochs=1, pretrain_batch_size=20, finetune_epochs=1,
                  finetune_batch_size=20, dropout=0.5, n_classes=10, seed=1)
    for rows, grouped in ((600, True), (610, False)):  # 610: shards of 240, 200, 170 rows: 12, 10, 8 minibatches
        folder = tmp_path / f"shards{rows}"
        uris = write_shards(x_train[:rows], y_train[:rows], str(folder), 3) if rows == 600 else [
            *write_shards(x_train[:240], y_train[:240], str(folder), 1, prefix="a"),
            *write_shards(x_train[240:440], y_train[240:440], str(folder), 1, prefix="b"),
            *write_shards(x_train[440:610], y_train[440:610], str(folder), 1, prefix="c")]
        program = DBNProgram(config)
        parameters = program.initial_parameters(0, shard_info(list_shards(str(folder))))
        for phase, group in (("pretrain", "_group"), ("finetune", "_net_group")):
            step = next(s for s in program.schedule(shard_info(uris)) if s.phase == phase)
            parameters = program.before_step(step, parameters)  # fine-tuning: the network, as the master makes it
            results = {}
            for together in (True, False):
                worker = DBNWorker(config)
                shards = [worker.load_shard(uri, i) for i, uri in enumerate(uris)]
                seeds = [shard_seed(0, 1, i) for i in range(3)]
                updates = (worker.run_shards(step, parameters, shards, seeds) if together
                           else [worker.run(step, parameters, s, seed) for s, seed in zip(shards, seeds)])
                assert (getattr(worker, group) is not None) == (together and grouped), (phase, rows)
                results[together] = updates
            for a, b in zip(results[True], results[False]):
                assert (a.shard, a.samples, a.metrics) == (b.shard, b.samples, b.metrics)
                for name in b.arrays:
                    np.testing.assert_array_equal(a.arrays[name], b.arrays[name], err_msg=name)


# ------------------------------------------------------------------ fine-tuning


def networks(n_members: int, sizes=(11, 9, 7, 4), seed: int = 0):
    from dbn.model.backend import get_backend
    from dbn.model.network import Network

    rng = np.random.default_rng(seed)
    weights = [rng.normal(0, 0.3, (a, b)).astype(np.float32) for a, b in zip(sizes, sizes[1:])]
    biases = [rng.normal(0, 0.1, b).astype(np.float32) for b in sizes[1:]]
    return [Network(weights, biases, get_backend("cpu")) for _ in range(n_members)]


@pytest.mark.parametrize("options", [
    {}, {"dropout": [0.2, 0.5, 0.5]}, {"dropout": [0.0, 0.5, 0.5], "max_norm": 1.5, "weight_cost": 1e-3},
    {"train_layers": slice(-1, None)}, {"batches": range(1, 4)}],
    ids=["plain", "dropout", "dropout-maxnorm-decay", "top-only", "minibatch-range"])
def test_each_network_ends_where_it_ends_alone_bit_for_bit(options):
    from dbn.model.backend import get_backend
    from dbn.model.network_group import NetworkGroup

    rng = np.random.default_rng(3)
    Xs = [rng.random((90, 11), dtype=np.float32) for _ in range(3)]
    ys = [rng.integers(0, 4, 90) for _ in range(3)]
    seeds, draws = [11, 12, 13], [21, 22, 23]
    settings = dict(learning_rate=0.3, momentum=0.5, batch_size=20, **options)
    alone, together = networks(3), networks(3)
    group = NetworkGroup(together)
    for epoch in range(3):
        expected = []
        for net, X, y, seed, draw in zip(alone, Xs, ys, seeds, draws):
            net.backend.reseed(draw)
            expected.append(net.train_epoch(X, y, epoch, seed=seed, **settings))
        got = group.train_epoch(Xs, ys, epoch, seeds=seeds, streams=[get_backend("cpu", seed=d) for d in draws],
                                **settings)
        assert [(s.n_samples, s.loss, s.train_error) for s in got] == \
            [(s.n_samples, s.loss, s.train_error) for s in expected]
    for mine, theirs in zip(together, alone):
        a, b = mine.get_state(), theirs.get_state()
        for key in b:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_a_grouped_job_whose_workers_are_killed_redoes_their_shards_and_gives_the_undisturbed_model(
        tmp_path, monkeypatch, mnist_small):
    """Three workers holding two shards each train them as groups; two are SIGKILLed mid-job (one
    pre-training, one fine-tuning), their shards move to the others (groups of other members) and are
    redone within the step: the model is the undisturbed run's, bit for bit."""
    from conftest_runtime import SLOW_DBN, assert_same_bits, events, kill_worker, load_npz, run_job, subprocess_env
    from shardio.shards import write_shards

    subprocess_env(monkeypatch, delay=0.1)
    x_train, y_train, _, _ = mnist_small
    shards = str(tmp_path / "shards")
    write_shards(x_train[:600], y_train[:600], shards, 6)
    config = dict(hidden_layers=[16, 8], pretrain_epochs=2, pretrain_batch_size=20, finetune_epochs=3,
                  finetune_batch_size=20, dropout=0.3, top_layer_epochs=1, n_classes=10, seed=2)
    kills, killed = {2: "worker-1", 7: "worker-2"}, []
    out = tmp_path / "churned"

    def on_record(rec):
        if "event" not in rec and rec.get("step") in kills and rec["step"] not in killed:
            killed.append(rec["step"])
            kill_worker(out, kills[rec["step"]])

    run_job(program=SLOW_DBN, program_config=config, shards=shards, workers=3, output=str(out), on_record=on_record,
            timeout=240, lost_shards="redo")
    assert killed == sorted(kills) and len(events(out, "worker_lost")) >= 2
    calm = run_job(program=SLOW_DBN, program_config=config, shards=shards, workers=3, output=str(tmp_path / "calm"),
                   timeout=240)
    assert_same_bits(load_npz(out / "model.npz"), load_npz(calm / "model.npz"))
