"""Integer labels that are codes (years, dates, category numbers) rather than class indices.

Integer labels are class indices 0..max: labels 3, 7 and 42 make 43 classes (40 without
examples, which the job warns about). Before, labels such as 20240101 made 20 million classes:
a .npz of 400 rows took the machine's 24 GB and most of a minute before anything was said.
Now labels whose indices would make more classes than rows by more than
:data:`~dbn.data.validation.MAX_EMPTY_CLASSES` are label values, as strings and a table's
labels are: their sorted distinct values are the classes, on every path that sees all the
labels at once (``DBN.fit``, a .npz or .csv job, ``dbn shard``); shards written by something
else, read one at a time, are refused with an error that says what to do."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from dbn import DBN
from dbn.cli import main
from dbn.data.validation import MAX_EMPTY_CLASSES, DataError, check_labels, label_indices
from shardio.shards import write_shards

CODES = np.array([19990101, 20231231, 20240101])


def coded(n: int, seed: int = 0):
    """Three separable classes in [0, 1], labelled by a date code."""
    rng = np.random.default_rng(seed)
    which = rng.integers(0, 3, n)
    centers = np.random.default_rng(7).random((3, 6))
    X = np.clip(centers[which] + rng.normal(0, 0.05, (n, 6)), 0, 1).astype(np.float32)
    return X, CODES[which]


def test_where_indices_end_and_codes_begin():
    n = 50
    for labels, classes in (([3, 7, 42], None), ([0, n + MAX_EMPTY_CLASSES - 1], None),
                            ([0, n + MAX_EMPTY_CLASSES], (0, n + MAX_EMPTY_CLASSES))):
        y = np.resize(np.asarray(labels), n)
        indices, found = label_indices(y, n_samples=n)
        assert (found and found.classes) == classes
        assert indices.tolist() == (y if classes is None else np.searchsorted(classes, y)).tolist()
    y = np.resize(CODES, n)
    with pytest.raises(DataError, match="outside the model's classes"):  # n_classes set: indices
        label_indices(y, n_samples=n, n_classes=3)
    with pytest.raises(DataError, match="negative label -1"):  # a stray -1 stays bad data
        label_indices(np.resize(np.array([-1, 20240101]), n), n_samples=n)
    with pytest.raises(DataError, match=r"label 20240101 at row 2: as a class index it would make 20,240,102 "
                                        r"classes for 50 rows.*`dbn shard`"):
        check_labels(y, n_samples=n)


def test_dbn_fit_classes_codes_by_their_values(tmp_path):
    X, y = coded(300)
    model = DBN(hidden_layers=[8], pretrain_epochs=2, finetune_epochs=30, device="cpu", seed=0).fit(X, y)
    assert model.n_classes_ == 3 and model.classes_.tolist() == CODES.tolist()
    assert set(model.predict(X).tolist()) <= set(CODES.tolist())
    assert model.score(X, y) > 0.9
    model.save(tmp_path / "model.npz")
    assert DBN.load(tmp_path / "model.npz").classes_.tolist() == CODES.tolist()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_csv_of_codes_trains_evaluates_and_predicts_in_codes(tmp_path, capsys, workers):
    X, y = coded(400)
    with open(tmp_path / "data.csv", "w") as f:
        f.write(",".join([f"f{i}" for i in range(X.shape[1])] + ["label"]) + "\n")
        for row, label in zip(X, y):
            f.write(",".join(f"{v:.6g}" for v in row) + f",{label}\n")
    (tmp_path / "job.toml").write_text(
        "[data]\ntrain = 'data.csv'\n[model]\nhidden_layers = [8]\npretrain_epochs = 2\nfinetune_epochs = 30\n"
        "[job]\ndevice = 'cpu'\nseed = 0\n")
    out = tmp_path / "out"
    assert main(["train", str(tmp_path / "job.toml"), "--out", str(out), "--quiet", "--no-ui",
                 *(["--local", str(workers)] if workers else [])]) == 0
    model = DBN.load(out / "model.npz", device="cpu")
    assert model.n_classes_ == 3 and model.classes_.tolist() == CODES.tolist()
    capsys.readouterr()
    assert main(["evaluate", str(out / "model.npz"), "--data", str(tmp_path / "data.csv"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["test_error"] < 0.1
    assert main(["predict", str(out / "model.npz"), str(tmp_path / "job.toml"), "--out",
                 str(tmp_path / "pred.parquet")]) == 0
    assert set(pq.read_table(tmp_path / "pred.parquet").column("prediction").to_pylist()) <= set(CODES.tolist())


def test_dbn_shard_maps_codes_and_shards_of_codes_from_elsewhere_are_refused(tmp_path, capsys):
    X, y = coded(200)
    np.savez(tmp_path / "data.npz", X=X, y=y)
    assert main(["shard", str(tmp_path / "data.npz"), str(tmp_path / "cut"), "--shards", "2"]) == 0
    write_shards(X, y, str(tmp_path / "raw"), 2)  # the codes as they are, no classes in the metadata
    for shards, ok in (("cut", True), ("raw", False)):
        (tmp_path / f"{shards}.toml").write_text(
            f"[model]\nhidden_layers = [8]\npretrain_epochs = 1\nfinetune_epochs = 2\n[cluster]\nshards = '{tmp_path / shards}'\n"
            "[job]\ndevice = 'cpu'\n")
        code = main(["train", str(tmp_path / f"{shards}.toml"), "--out", str(tmp_path / f"out-{shards}"),
                     "--quiet", "--no-ui", "--local", "2"])
        err = capsys.readouterr().err
        if ok:
            assert code == 0, err
            assert DBN.load(tmp_path / "out-cut" / "model.npz", device="cpu").classes_.tolist() == CODES.tolist()
        else:
            assert code == 2
            assert f"{tmp_path}/raw/part-00000.parquet: 'label' has label" in err and "classes for 100 rows" in err
            assert "cut the data with `dbn shard`, which maps them" in err
