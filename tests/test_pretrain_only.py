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
