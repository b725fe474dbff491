"""The DBN as an IterativeReduce program, on the local mini-cluster with real MNIST."""

from __future__ import annotations

import numpy as np
import pytest

from conftest_runtime import DBN_PROGRAM, InProcessJob, events, load_npz, records, run_job, simulate, subprocess_env
from dbn import DBN
from dbn.errors import DataError
from dbn.jobs.dbn_program import DBNProgram
from iterreduce.launch.local import LocalJobError
from shardio.readers import list_shards, shard_info
from shardio.shards import write_shards


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    subprocess_env(monkeypatch)


def phases(recs) -> list[str]:
    return [r["phase"] for r in recs]


def test_small_dbn_on_three_workers_classifies_mnist(tmp_path, mnist_small):
    x_train, y_train, x_test, y_test = mnist_small
    shards = str(tmp_path / "shards")
    write_shards(x_train[:900], y_train[:900], shards, 3)
    config = dict(hidden_layers=[64, 32], pretrain_epochs=2, pretrain_batch_size=25, finetune_epochs=10,
                  finetune_batch_size=25, finetune_learning_rate=0.5, top_layer_epochs=1, n_classes=10, seed=0)
    out = run_job(program=DBN_PROGRAM, program_config=config, shards=shards, workers=3, output=str(tmp_path / "out"))

    recs = records(out)
    assert phases(recs) == ["transform", "pretrain", "pretrain"] * 2 + ["finetune"] * 10
    assert all(r["samples"] == 900 and r["shards"] == 3 for r in recs)
    finetune = [r for r in recs if r["phase"] == "finetune"]
    assert [r["top_only"] for r in finetune] == [True] + [False] * 9
    assert finetune[-1]["train_error"] < finetune[0]["train_error"]

    model = DBN.load(out / "model.npz", device="cpu")
    assert model.hidden_layers == [64, 32] and model.n_features_in_ == x_train.shape[1] and model.n_classes_ == 10
    assert len(model.rbms_) == 2
    predictions = model.predict(x_test)
    assert predictions.shape == (len(x_test),) and set(np.unique(predictions)) <= set(range(10))
    accuracy = float(np.mean(predictions == y_test))
    assert accuracy > 0.6, accuracy  # chance is 0.1 (this seed gives about 0.77)
    assert model.score(x_test, y_test) == pytest.approx(accuracy)

    # The distributed run is the sequential one: every shard, every step, same seeds, same reduce.
    expected = DBNProgram(config).to_model(simulate(DBN_PROGRAM, config, list_shards(shards)))
    for i in range(3):
        np.testing.assert_allclose(model.network_.weights[i], expected.network_.weights[i], rtol=1e-4, atol=1e-5)
    for i in range(2):
        np.testing.assert_allclose(model.rbms_[i].weights_, expected.rbms_[i].weights_, rtol=1e-4, atol=1e-5)


def test_sync_every_gives_more_steps_and_completes(tmp_path, mnist_small):
    x_train, y_train, x_test, y_test = mnist_small
    shards = str(tmp_path / "shards")
    write_shards(x_train[:200], y_train[:200], shards, 2)  # 100 rows a shard: 4 minibatches of 25
    base = dict(hidden_layers=[16], pretrain_epochs=2, pretrain_batch_size=25, finetune_epochs=2,
                finetune_batch_size=25, top_layer_epochs=1, n_classes=10, seed=0)
    config = {**base, "sync_every": 2}
    info = shard_info(list_shards(shards))
    plain_steps = list(DBNProgram(base).schedule(info))
    sync_steps = list(DBNProgram(config).schedule(info))
    assert len(plain_steps) == 1 + 2 + 2 and len(sync_steps) == 1 + 2 * 2 + 2 * 2

    out = run_job(program=DBN_PROGRAM, program_config=config, shards=shards, workers=2, output=str(tmp_path / "out"))
    recs = records(out)
    assert len(recs) == len(sync_steps)
    assert phases(recs) == ["transform"] + ["pretrain"] * 4 + ["finetune"] * 4
    pretrain = [r for r in recs if r["phase"] == "pretrain"]
    assert [(r["epoch"], r["part"], r["batches"]) for r in pretrain] == \
        [(0, 0, [0, 2]), (0, 1, [2, 4]), (1, 0, [0, 2]), (1, 1, [2, 4])]
    # each part is 2 minibatches of 25 rows on each of the 2 shards
    assert all(r["samples"] == 2 * 2 * 25 for r in pretrain)
    finetune = [r for r in recs if r["phase"] == "finetune"]
    assert [(r["epoch"], r["batches"], r["top_only"]) for r in finetune] == \
        [(0, [0, 2], True), (0, [2, 4], True), (1, [0, 2], False), (1, [2, 4], False)]
    model = DBN.load(out / "model.npz", device="cpu")
    assert model.predict(x_test[:50]).shape == (50,)
    assert len(events(out, "done")) == 1


def test_shard_with_the_wrong_feature_count_fails_clearly(tmp_path, mnist_small):
    x_train, y_train, _, _ = mnist_small
    shards = str(tmp_path / "shards")
    write_shards(x_train[:100], y_train[:100], shards, 1, prefix="a")
    width = x_train.shape[1]
    write_shards(x_train[100:200, :width - 10], y_train[100:200], shards, 1, prefix="b")  # 10 features short
    config = dict(hidden_layers=[8], pretrain_epochs=1, finetune_epochs=1, n_classes=10, seed=0)
    with pytest.raises(LocalJobError) as info:
        run_job(program=DBN_PROGRAM, program_config=config, shards=shards, workers=2, output=str(tmp_path / "out"),
                max_restarts=0)
    message = str(info.value)
    assert message.startswith("the job stopped on bad data: ")  # refused from the footers, before any worker
    assert "shards disagree on the feature count" in message
    assert f"a-00000.parquet has {width}" in message and f"b-00000.parquet has {width - 10}" in message
    assert (tmp_path / "out" / "error.txt").read_text().strip() in message
    assert not records(tmp_path / "out")


def test_finetune_on_shards_without_labels_fails_clearly(tmp_path, mnist_small):
    x_train, _, _, _ = mnist_small
    shards = str(tmp_path / "shards")
    write_shards(x_train[:200], None, shards, 2)
    config = dict(hidden_layers=[8], pretrain_epochs=1, finetune_epochs=1, n_classes=10, seed=0)
    with pytest.raises(LocalJobError) as info:
        run_job(program=DBN_PROGRAM, program_config=config, shards=shards, workers=2, output=str(tmp_path / "out"),
                max_restarts=0)
    message = str(info.value)
    # Refused by the master before any pre-training, naming the shards.
    assert message.startswith("the job stopped on bad data: ")
    assert "fine-tuning needs labels" in message and "part-0000" in message
    assert not records(tmp_path / "out")


def test_missing_labels_are_refused_before_pretraining(tmp_path):
    X = np.random.default_rng(0).random((40, 12), dtype=np.float32)
    uris = write_shards(X, None, str(tmp_path / "shards"), 2)
    with pytest.raises(DataError, match=r"part-00000.parquet: no 'label' column, but fine-tuning needs labels"):
        InProcessJob(tmp_path / "out", uris, workers=1, program=DBN_PROGRAM, start_timeout=0.5,
                     program_config=dict(hidden_layers=[4], pretrain_epochs=1, finetune_epochs=1, n_classes=2))


def test_pretrain_only_job_needs_no_labels(tmp_path):
    """finetune_epochs=0: unlabeled shards are fine; the model has RBMs and no classifier."""
    X = (np.random.default_rng(1).random((60, 10)) < 0.3).astype(np.float32)
    uris = write_shards(X, None, str(tmp_path / "shards"), 2)
    config = dict(hidden_layers=[6, 4], pretrain_epochs=2, finetune_epochs=0, n_classes=2, seed=3)
    job = InProcessJob(tmp_path / "out", uris, workers=2, program=DBN_PROGRAM, program_config=config)
    job.run_to_end("w0", "w1")
    assert phases(records(tmp_path / "out")) == ["transform", "pretrain", "pretrain"] * 2
    model = DBN.load(tmp_path / "out" / "model.npz", device="cpu")
    assert model.network_ is None and len(model.rbms_) == 2
    assert model.transform(X).shape == (60, 4)
    saved = load_npz(tmp_path / "out" / "model.npz")
    expected = simulate(DBN_PROGRAM, config, uris, seed=0)
    for layer in range(2):
        for key in ("weights", "hidden_bias", "visible_bias"):
            assert np.array_equal(saved[f"rbm.{layer}.{key}"], expected[f"rbm.{layer}.{key}"]), (layer, key)


def test_the_dropout_recipe_reaches_the_workers(tmp_path, mnist_small):
    """The fine-tuning schedule (decaying rate, rising momentum) and the max-norm bound are
    the estimator's, step by step, on the workers too."""
    x_train, y_train = mnist_small[:2]
    uris = write_shards(x_train[:200], y_train[:200], str(tmp_path / "shards"), 2)
    config = dict(hidden_layers=[16], pretrain_epochs=1, pretrain_batch_size=25, finetune_epochs=6,
                  finetune_batch_size=25, finetune_learning_rate=2.0, finetune_lr_decay=0.9, finetune_momentum=0.5,
                  finetune_final_momentum=0.95, finetune_momentum_epochs=4, max_norm=0.7, dropout=0.5,
                  top_layer_epochs=1, n_classes=10, seed=0)
    program = DBNProgram(config)
    steps = [s for s in program.schedule(shard_info(uris)) if s.phase == "finetune"]
    assert [(s.info["learning_rate"], s.info["momentum"]) for s in steps] == \
        [DBN(**{k: v for k, v in config.items() if k != "seed"}).finetune_schedule(e) for e in range(6)]
    assert [s.info["momentum"] for s in steps][3:] == pytest.approx([0.8375, 0.95, 0.95])
    model = program.to_model(simulate(DBN_PROGRAM, config, uris))
    for i, w in enumerate(model.network_.weights):
        assert np.linalg.norm(w, axis=0).max() <= 0.7 * (1 + 1e-5), f"layer {i}"
    unbounded = DBNProgram({**config, "max_norm": 0.0}).to_model(simulate(DBN_PROGRAM, {**config, "max_norm": 0.0}, uris))
    assert max(np.linalg.norm(w, axis=0).max() for w in unbounded.network_.weights) > 0.7
