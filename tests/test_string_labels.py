"""Labels as text ("red", "white", "rose"), the most common form of a CSV's label column, on every
path a job or a user takes: ``DBN.fit`` from Python, a .npz or .csv trained in this process,
``dbn shard`` then the local mini-cluster, shards trained in one process, ``dbn evaluate`` and
the job's test set. The sorted distinct values are the classes, saved with the model, which
then predicts and scores in those values, as for a table's string labels. Before, every path
but tables refused them ("labels must hold integer class labels, got dtype object")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dbn import DBN
from dbn.cli import main
from dbn.data.sharding import load_shards, shard_dataset
from dbn.data.validation import label_indices
from dbn.errors import DataError
from iterreduce.exceptions import ShardError
from shardio.labels import LabelMap
from shardio.readers import describe_shard, list_shards, shard_classes
from shardio.shards import CLASSES_KEY, write_shards

NAMES = np.array(["red", "rose", "white"])  # sorted: class i is NAMES[i]
FEATURES = 8


def wines(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three separable classes in [0, 1], labelled by name, in no particular order."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(7).random((3, FEATURES))
    y = rng.integers(0, 3, n)
    X = np.clip(centers[y] + rng.normal(0, 0.05, (n, FEATURES)), 0, 1)
    return X.astype(np.float32), NAMES[y]


def write_csv(path: Path, X: np.ndarray, labels) -> Path:
    with open(path, "w") as f:
        f.write(",".join([f"f{i}" for i in range(X.shape[1])] + ["label"]) + "\n")
        for row, label in zip(X, labels):
            f.write(",".join(f"{v:.6g}" for v in row) + f",{label}\n")
    return path


@pytest.fixture
def data(tmp_path):
    X, y = wines(600)
    np.savez(tmp_path / "train.npz", X=X, y=y)
    write_csv(tmp_path / "train.csv", X, y)
    Xt, yt = wines(300, seed=1)
    write_csv(tmp_path / "test.csv", Xt, yt)
    return tmp_path


def job(root: Path, train: str, **cluster) -> Path:
    path = root / f"job-{Path(train).stem}.toml"
    path.write_text(f"[data]\ntrain = '{train}'\ntest = 'test.csv'\n"
                    "[model]\nhidden_layers = [16]\npretrain_epochs = 3\nfinetune_epochs = 20\n"
                    "[job]\ndevice = 'cpu'\nseed = 0\n" +
                    ("[cluster]\n" + "".join(f"{k} = '{v}'\n" for k, v in cluster.items()) if cluster else ""))
    return path


def train(path: Path, out: Path, *extra: str) -> tuple[dict, DBN]:
    assert main(["train", str(path), "--out", str(out), "--quiet", "--no-ui", *extra]) == 0
    return json.loads((out / "result.json").read_text()), DBN.load(out / "model.npz", device="cpu")


def test_fit_takes_string_labels_and_answers_in_them(tmp_path):
    X, y = wines(600)
    model = DBN(hidden_layers=[16], pretrain_epochs=3, finetune_epochs=20, seed=0, device="cpu").fit(X, y)
    assert model.classes_.tolist() == NAMES.tolist()
    Xt, yt = wines(300, seed=1)
    assert set(model.predict(Xt)) <= set(NAMES)
    assert model.score(Xt, yt) > 0.95
    model.save(tmp_path / "model.npz")
    loaded = DBN.load(tmp_path / "model.npz", device="cpu")
    assert loaded.classes_.tolist() == NAMES.tolist()
    np.testing.assert_array_equal(loaded.predict(Xt), model.predict(Xt))
    # A second fine-tuning takes the same values; one it has never seen is named.
    model.finetune(X, y[::-1].copy())
    with pytest.raises(DataError, match="'sparkling'"):
        model.finetune(X, np.where(y == "rose", "sparkling", y))


def test_integer_labels_stay_class_indices():
    X, y = wines(300)
    model = DBN(hidden_layers=[8], pretrain_epochs=1, finetune_epochs=2, seed=0, device="cpu")
    model.fit(X, np.searchsorted(NAMES, y))
    assert getattr(model, "classes_", None) is None
    assert model.predict(X[:5]).dtype.kind == "i"


@pytest.mark.parametrize("labels, message", [
    (np.array(["a", None] * 5, dtype=object), "no label at row 1"),
    (np.array(["a", 3] * 5, dtype=object), "must hold integer class labels"),
    (np.array(["a", "b"] * 4), "8 labels but X has 10 samples"),
    (np.array([["a"]] * 10), "1-D"),
])
def test_bad_string_labels_are_named(labels, message):
    with pytest.raises(DataError, match=message):
        label_indices(labels, n_samples=10)


def test_bytes_labels_are_text_too():
    indices, classes = label_indices(np.array([b"b", b"a", b"b"]), n_samples=3)
    assert indices.tolist() == [1, 0, 1] and classes.classes == ("a", "b")


def test_string_labels_against_n_classes_and_known_classes():
    with pytest.raises(DataError, match="n_classes = 4"):
        label_indices(NAMES, n_samples=3, n_classes=4)
    indices, classes = label_indices(np.array(["white", "red"]), n_samples=2, classes=NAMES)
    assert indices.tolist() == [2, 0] and len(classes) == 3  # the known classes, those absent too


@pytest.mark.parametrize("source", ["train.npz", "train.csv"])
def test_shards_keep_the_classes_of_string_labels(data, source, tmp_path):
    uris = shard_dataset(str(data / source), str(tmp_path / "shards"), 3)
    for uri in uris:
        assert pq.read_table(uri).column("label").type == "int64"  # class indices on the wire
        assert describe_shard(uri)["classes"] == {"classes": NAMES.tolist()}
    assert shard_classes(uris) == LabelMap(tuple(NAMES))
    X, y, classes = load_shards(str(tmp_path / "shards"))
    assert classes == LabelMap(tuple(NAMES))
    np.testing.assert_array_equal(NAMES[y], np.load(data / "train.npz")["y"])


def test_shards_of_different_label_classes_are_refused(tmp_path):
    X, y = wines(100)
    write_shards(X, np.searchsorted(NAMES, y), str(tmp_path / "s"), 1, prefix="a", classes=LabelMap(tuple(NAMES)))
    write_shards(X, np.searchsorted(NAMES, y), str(tmp_path / "s"), 1, prefix="b")  # indices: no classes
    with pytest.raises(ShardError, match="differ from those of"):
        shard_classes(list_shards(str(tmp_path / "s")))


def test_a_shard_whose_labels_exceed_its_classes_is_refused(tmp_path):
    X, y = wines(100)
    (uri,) = write_shards(X, np.full(100, 5), str(tmp_path / "s"), 1, classes=LabelMap(tuple(NAMES)))
    with pytest.raises(ShardError, match="class 5 but the shard's metadata names 3 classes"):
        describe_shard(uri)
    table = pq.read_table(uri)
    pq.write_table(table.replace_schema_metadata({CLASSES_KEY: b"not json"}), uri)
    with pytest.raises(ShardError, match="unreadable label classes"):
        describe_shard(uri)


@pytest.mark.parametrize("source, where", [
    ("train.csv", ()),
    ("train.npz", ()),
    ("train.csv", ("--local", "2")),
], ids=["csv-in-process", "npz-in-process", "csv-local-2"])
def test_jobs_train_test_and_evaluate_on_string_labels(data, source, where, capsys):
    result, model = train(job(data, source), data / f"out-{Path(source).stem}-{len(where)}", *where)
    assert model.classes_.tolist() == NAMES.tolist()
    assert result["test_error"] < 0.05  # the job's test set, a CSV of names
    out = data / f"out-{Path(source).stem}-{len(where)}" / "model.npz"
    capsys.readouterr()
    assert main(["evaluate", str(out), "--data", str(data / "test.csv"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["test_error"] == pytest.approx(result["test_error"])


def test_shards_of_string_labels_train_in_one_process(data, tmp_path):
    shard_dataset(str(data / "train.csv"), str(tmp_path / "shards"), 2)
    result, model = train(job(data, "train.csv", shards=tmp_path / "shards"), tmp_path / "out")
    assert model.classes_.tolist() == NAMES.tolist()
    assert result["test_error"] < 0.05


def test_predict_writes_a_data_files_rows_in_label_values(data, capsys):
    out = data / "out-predict"
    train(job(data, "train.csv"), out)
    Xt, yt = wines(300, seed=1)
    np.savez(data / "unlabelled.npz", X=Xt)
    capsys.readouterr()
    assert main(["predict", str(out / "model.npz"), str(job(data, "train.csv")), "--out", str(data / "p.parquet"),
                 "--json"]) == 0  # [data] test: the labelled CSV
    record = json.loads(capsys.readouterr().out)
    assert record["rows"] == 300 and record["error"] < 0.05
    predicted = pq.read_table(data / "p.parquet")
    assert predicted.column_names == ["row", "prediction", "probability"]
    assert np.mean(np.asarray(predicted.column("prediction").to_pylist()) != yt) == pytest.approx(record["error"])
    assert main(["predict", str(out / "model.npz"), str(job(data, "train.csv")), "--table",
                 str(data / "unlabelled.npz"), "--out", str(data / "q.parquet"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["error"] is None
    assert pq.read_table(data / "q.parquet").column("prediction").to_pylist() == \
        predicted.column("prediction").to_pylist()
    assert main(["predict", str(out / "model.npz"), str(job(data, "train.csv")), "--out", str(data / "r.parquet"),
                 "--keep", "id"]) == 2
    assert "--keep and --filter are for tables" in capsys.readouterr().err


def test_evaluate_names_the_data_when_labels_do_not_fit_the_model(data, tmp_path, capsys):
    X, y = wines(100)
    np.savez(tmp_path / "indices.npz", X=X, y=np.searchsorted(NAMES, y))
    np.savez(tmp_path / "names.npz", X=X, y=y)
    DBN(hidden_layers=[4], pretrain_epochs=1, finetune_epochs=1, device="cpu").fit(X, y).save(tmp_path / "names.npz.model")
    DBN(hidden_layers=[4], pretrain_epochs=1, finetune_epochs=1, device="cpu").fit(
        X, np.searchsorted(NAMES, y)).save(tmp_path / "indices.npz.model")
    for model, labels, says in [("names", "indices", "labels of type int64, but the classes are strings"),
                                ("indices", "names", f"labels that are strings (e.g. {str(y[0])!r}), but this model was "
                                                     "trained on class indices 0..2")]:
        capsys.readouterr()
        assert main(["evaluate", str(tmp_path / f"{model}.npz.model"), "--data", str(tmp_path / f"{labels}.npz")]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / labels}.npz against {tmp_path / model}.npz.model" in err and says in err, err


@pytest.mark.parametrize("where", [(), ("--local", "2")], ids=["in-process", "local-2"])
def test_the_validation_shard_is_scored_in_one_process_too_and_must_share_the_classes(data, tmp_path, where, capsys):
    Xv, yv = wines(200, seed=2)
    np.savez(tmp_path / "valid.npz", X=Xv, y=yv)
    shard_dataset(str(tmp_path / "valid.npz"), str(tmp_path / "valid"), 1)
    (valid,) = list_shards(str(tmp_path / "valid"))
    out = tmp_path / f"out{len(where)}"
    result, model = train(job(data, "train.csv"), out, *where, "--set", f"cluster.validation={valid}")
    epochs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    errors = [r["valid_error"] for r in epochs if r.get("phase") == "finetune" and "valid_error" in r]
    assert len(errors) == 20  # every fine-tuning epoch (was none in one process)
    assert errors[-1] == pytest.approx(1 - model.score(Xv, yv))
    # A validation shard of other classes (here: class indices, the training labels being names) is refused.
    write_shards(Xv, np.searchsorted(NAMES, yv) + 1, str(tmp_path / "other"), 1)
    (other,) = list_shards(str(tmp_path / "other"))
    capsys.readouterr()
    assert main(["train", str(job(data, "train.csv")), "--out", str(tmp_path / f"bad{len(where)}"), "--quiet",
                 "--no-ui", *where, "--set", f"cluster.validation={other}"]) == 2
    err = capsys.readouterr().err
    assert f"{other}: its label classes none (class i is i) differ from those of" in err, err


def test_one_validation_set_at_a_time(data, capsys):
    shard_dataset(str(data / "train.csv"), str(data / "valid"), 1)
    capsys.readouterr()
    assert main(["train", str(job(data, "train.csv")), "--out", str(data / "out"), "--quiet", "--set",
                 f"cluster.validation={list_shards(str(data / 'valid'))[0]}", "--set",
                 "model.validation_fraction=0.1"]) == 2
    assert "choose one validation set" in capsys.readouterr().err
