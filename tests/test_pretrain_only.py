"""A job with ``finetune_epochs = 0`` pre-trains only, and needs no labels, wherever it runs.

Before, the launchers disagreed on it: on the local mini-cluster it trained unlabelled data into a
pre-trained stack ("pre-trained only: no classifier to test"), while in one process it refused
the same data ("no labels"), and with labels it fine-tuned nothing yet saved a classifier whose
softmax layer was never trained, reporting its chance-level test error as the job's result. And a
job that does fine-tune learned only after its shards were written, from the master, that the data
had no labels. Now one fact, :attr:`dbn.DBN.fine_tunes`, decides on every path, and a missing
label is found before anything is written, naming the user's file or table."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbn import DBN
from dbn.cli import main
from dbn.jobs.spec import load_spec

JOB = "[model]\nhidden_layers = [8]\npretrain_epochs = 2\nfinetune_epochs = {ft}\n[job]\ndevice = 'cpu'\nseed = 0\n"


def data(n: int = 200, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = (rng.random((n, 12)) < 0.2 + 0.6 * (np.arange(12) % 3 == y[:, None])).astype(np.float32)
    return X, y


def write_csv(path, X, y=None):
    with open(path, "w") as f:
        f.write(",".join([f"f{i}" for i in range(X.shape[1])] + (["label"] if y is not None else [])) + "\n")
        for i, row in enumerate(X):
            f.write(",".join(f"{v:g}" for v in row) + (f",{y[i]}" if y is not None else "") + "\n")


def test_dbn_fit_without_fine_tuning_pretrains_only_and_needs_no_labels():
    X, y = data()
    model = DBN(hidden_layers=[8], pretrain_epochs=1, finetune_epochs=0, device="cpu").fit(X)
    assert not model.fine_tunes and model.network_ is None and model.transform(X).shape == (200, 8)
    with pytest.raises(RuntimeError, match="pre-trained only"):
        model.predict(X)
    assert DBN(hidden_layers=[8], pretrain_epochs=1, finetune_epochs=0, device="cpu").fit(X, y).network_ is None
    with pytest.raises(ValueError, match=r"y is None, but fine-tuning \(3 epochs\) needs labels"):
        DBN(hidden_layers=[8], pretrain_epochs=1, finetune_epochs=3, device="cpu").fit(X)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("labelled", [False, True])
def test_a_pretraining_job_gives_the_same_kind_of_model_in_one_process_and_on_workers(tmp_path, capsys, workers,
                                                                                      labelled):
    X, y = data()
    write_csv(tmp_path / "data.csv", X, y if labelled else None)
    (tmp_path / "job.toml").write_text("[data]\ntrain = 'data.csv'\n" + ("test = 'data.csv'\n" if labelled else "")
                                       + JOB.format(ft=0))
    out = tmp_path / "out"
    assert main(["train", str(tmp_path / "job.toml"), "--out", str(out), "--no-ui",
                 *(["--local", str(workers)] if workers else [])]) == 0
    assert "pre-trained only: no classifier to test" in capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    assert result["test_error"] is None and result["layers"] == [12, 8, None]
    model = DBN.load(out / "model.npz", device="cpu")
    assert model.network_ is None and model.transform(X).shape == (200, 8)
    for argv in (["evaluate", str(out / "model.npz"), "--data", str(tmp_path / "data.csv")],
                 ["predict", str(out / "model.npz"), str(tmp_path / "job.toml"), "--table", str(tmp_path / "data.csv"),
                  "--out", str(tmp_path / "p.parquet")]):
        assert main(argv) == 2  # a clear error, once a traceback for predict
        assert "a pre-trained stack without a classifier (finetune_epochs = 0): nothing to" in capsys.readouterr().err


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fine_tuning_job_on_unlabelled_data_is_refused_before_anything_is_written(tmp_path, capsys, workers):
    X, _ = data()
    np.savez(tmp_path / "data.npz", X=X)
    (tmp_path / "job.toml").write_text("[data]\ntrain = 'data.npz'\n" + JOB.format(ft=2))
    out = tmp_path / "out"
    assert main(["train", str(tmp_path / "job.toml"), "--out", str(out), "--no-ui",
                 *(["--local", str(workers)] if workers else [])]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'data.npz'}: no labels (a .npz's array 'y'" in err
    assert "finetune_epochs = 0 pre-trains only" in err
    assert not out.exists()  # no shards cut, no folder left behind


def test_a_table_without_a_label_column_is_refused_before_its_shares_are_written(tmp_path, capsys):
    X, y = data()
    (tmp_path / "table").mkdir()
    pq.write_table(pa.table({f"x{i}": X[:, i] for i in range(12)} | {"y": y}), tmp_path / "table" / "a.parquet")
    (tmp_path / "job.toml").write_text("[data]\ntrain = 'table'\nfeatures = 'x*'\n" + JOB.format(ft=2))
    out = tmp_path / "out"
    for workers in ("0", "2"):
        assert main(["train", str(tmp_path / "job.toml"), "--out", str(out), "--no-ui", "--local", workers]) == 2
        err = capsys.readouterr().err
        assert "fine-tuning needs labels ([model] finetune_epochs = 0 pre-trains only)" in err, err
        assert not out.exists()
    spec = load_spec(tmp_path / "job.toml", {"cluster.workers": 2, "model.finetune_epochs": 0})
    spec.check_distributed()  # pre-training only: no label needed
    load_spec(tmp_path / "job.toml", {"cluster.workers": 2, "data.label": "y"}).check_distributed()


def test_the_summary_line_speaks_of_pre_training_only_when_there_was_some():
    from dbn.jobs.progress import summary_line

    result = {"test_error": 0.1, "layers": [12, 8, 3], "wall_seconds": 4.0, "model": "m.npz", "sync_fraction": 0.8}
    assert "80.0 % of pre-training in sync" in summary_line({**result, "epochs": {"pretrain": 2, "finetune": 2}})
    assert "in sync" not in summary_line({**result, "epochs": {"pretrain": 0, "finetune": 2}})


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("test, words", [
    ("missing.npz", "missing.npz: no such data file"),
    ("unlabelled.csv", "unlabelled.csv: no labels"),
    ("images.npz", "must be 2-D (samples x features), got shape (200, 3, 4)"),
    ("wide.npz", "wide.npz: 15 features a row, but the training data"),
])
def test_a_test_set_that_cannot_be_tested_is_refused_before_training(tmp_path, capsys, workers, test, words):
    """``[data] test`` was first read after training: a typo in its name ended a finished
    training (hours for the main job) with an error and no result."""
    X, y = data()
    np.savez(tmp_path / "data.npz", X=X, y=y)
    np.savez(tmp_path / "images.npz", X=X.reshape(200, 3, 4), y=y)
    np.savez(tmp_path / "wide.npz", X=np.hstack([X, X[:, :3]]), y=y)
    write_csv(tmp_path / "unlabelled.csv", X)
    (tmp_path / "job.toml").write_text(f"[data]\ntrain = 'data.npz'\ntest = '{test}'\n" + JOB.format(ft=2))
    out = tmp_path / "out"
    assert main(["train", str(tmp_path / "job.toml"), "--out", str(out), "--no-ui",
                 *(["--local", str(workers)] if workers else [])]) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_dbn_transform_writes_the_features_of_a_pre_trained_stack_or_a_classifier(tmp_path, capsys):
    """`dbn transform MODEL JOB --out F --keep id`: what a pre-trained-only job is for, from the
    command line: each row's top hidden activations, beside its kept columns, in a column that
    another job can read as its features."""
    X, y = data()
    table = tmp_path / "table"
    table.mkdir()
    pq.write_table(pa.table({"id": np.arange(200) + 1000, **{f"x{i}": X[:, i] for i in range(12)}, "y": y}),
                   table / "part-0.parquet")
    (tmp_path / "job.toml").write_text(f"[data]\ntrain = '{table}'\nfeatures = 'x*'\n" + JOB.format(ft=0))
    for ft in (0, 3):
        out = tmp_path / f"out-{ft}"
        assert main(["train", str(tmp_path / "job.toml"), "--out", str(out), "--quiet", "--no-ui",
                     "--set", f"model.finetune_epochs={ft}", "--set", "data.label=y"]) == 0
        capsys.readouterr()
        assert main(["transform", str(out / "model.npz"), str(tmp_path / "job.toml"), "--out",
                     str(tmp_path / f"features-{ft}.parquet"), "--keep", "id"]) == 0
        assert f"200 rows of {table} transformed" in capsys.readouterr().out
        written = pq.read_table(tmp_path / f"features-{ft}.parquet")
        assert written.column_names == ["id", "features"]
        assert written.column("id").to_pylist() == list(range(1000, 1200))
        features = np.stack(written.column("features").to_numpy(zero_copy_only=False))
        np.testing.assert_allclose(features, DBN.load(out / "model.npz", device="cpu").transform(X), atol=1e-6)
    # The features feed another job as its array column.
    (tmp_path / "next.toml").write_text(f"[data]\ntrain = '{tmp_path / 'features-0.parquet'}'\nfeatures = 'features'\n"
                                        + JOB.format(ft=0))
    assert main(["train", str(tmp_path / "next.toml"), "--out", str(tmp_path / "next"), "--quiet", "--no-ui"]) == 0
    assert DBN.load(tmp_path / "next" / "model.npz", device="cpu").n_features_in_ == 8
    # A data file: each row's number and its features; a kept column may not take the written one's name.
    np.savez(tmp_path / "data.npz", X=X, y=y)
    (tmp_path / "file.toml").write_text("[data]\ntrain = 'data.npz'\n" + JOB.format(ft=0))
    assert main(["transform", str(tmp_path / "out-0" / "model.npz"), str(tmp_path / "file.toml"), "--out",
                 str(tmp_path / "f.parquet")]) == 0
    assert pq.read_table(tmp_path / "f.parquet").column_names == ["row", "features"]
    capsys.readouterr()
    assert main(["transform", str(tmp_path / "out-0" / "model.npz"), str(tmp_path / "job.toml"), "--out",
                 str(tmp_path / "g.parquet"), "--keep", "id,features"]) == 2
    assert "'features' would clash with the column of that name that transform writes" in capsys.readouterr().err


def test_training_data_faults_come_before_the_test_sets_width(tmp_path, capsys):
    """The default test set (MNIST's 784 pixels) against 12-wide unlabelled data: the error is
    the training data's missing labels, which the user must fix first, not the width."""
    X, _ = data()
    np.savez(tmp_path / "data.npz", X=X)
    assert main(["train", "--set", f"data.train={tmp_path / 'data.npz'}", "--layers", "8", "--out",
                 str(tmp_path / "out"), "--quiet", "--no-ui"]) == 2
    err = capsys.readouterr().err
    assert "data.npz: no labels" in err and "features a row" not in err
