"""Features on scales the visible units cannot learn from: every kind of data a job takes (a
.npz, a .csv, Parquet shards; in this process and on the local mini-cluster) is scaled as
``[data] scale`` asks, by the same statistics on every path, and the model keeps the scaler so
that it predicts from raw rows. Before, Gaussian units on raw features far from zero mean and
unit variance trained without an error and learnt nothing (chance error)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dbn import DBN
from dbn.cli import main
from dbn.jobs.spec import load_spec
from shardio.shards import write_shards

CLASSES, FEATURES = 3, 12


def blobs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Separable classes on a scale far from [0, 1] and from unit variance (mean 1000, std ~150)."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(99).normal(0, 3, (CLASSES, FEATURES))
    y = rng.integers(0, CLASSES, n)
    X = (centers[y] + rng.normal(0, 1.0, (n, FEATURES))) * 50 + 1000
    return X.astype(np.float32), y


@pytest.fixture
def data(tmp_path):
    X, y = blobs(600)
    np.savez(tmp_path / "train.npz", X=X, y=y)
    Xt, yt = blobs(300, seed=1)
    np.savez(tmp_path / "test.npz", X=Xt, y=yt)
    with open(tmp_path / "train.csv", "w") as f:
        f.write(",".join([f"f{i}" for i in range(FEATURES)] + ["label"]) + "\n")
        for row, label in zip(X, y):
            f.write(",".join(f"{v:.6g}" for v in row) + f",{label}\n")
    write_shards(X, y, str(tmp_path / "shards"), 2)
    return tmp_path


def job(root: Path, visible: str, train: str = "train.npz", scale: str | None = None) -> Path:
    path = root / f"job-{visible}-{Path(train).stem}-{scale}.toml"
    path.write_text(f"[data]\ntrain = '{train}'\ntest = 'test.npz'\n" + (f"scale = '{scale}'\n" if scale else "") +
                    f"[model]\nhidden_layers = [16]\nvisible = '{visible}'\npretrain_epochs = 3\n"
                    f"finetune_epochs = {8 if visible == 'gaussian' else 30}\npretrain_learning_rate = {0.01 if visible == 'gaussian' else 0.1}\n"
                    f"[job]\ndevice = 'cpu'\nseed = 0\n")
    return path


def train(path: Path, out: Path, *extra: str) -> tuple[dict, DBN]:
    assert main(["train", str(path), "--out", str(out), "--quiet", "--no-ui", *extra]) == 0
    return json.loads((out / "result.json").read_text()), DBN.load(out / "model.npz", device="cpu")


def test_auto_scaling_standardises_for_gaussian_units_only_outside_tables():
    assert load_spec(None).scaling() is None  # MNIST on Bernoulli units: as it is (the main job's bits)
    assert load_spec(None, {"model.visible": "gaussian"}).scaling() == "standard"
    assert load_spec(None, {"model.visible": "gaussian", "data.scale": "none"}).scaling() is None
    assert load_spec(None, {"data.scale": "min_max"}).scaling() == "min_max"
    assert load_spec(None, {"cluster.shards": "s", "model.visible": "gaussian"}).scaling() == "standard"
    table = {"data.train": "t", "data.features": "x*", "data.label": "y"}
    assert load_spec(None, table).scaling() == "min_max"  # a table's raw columns
    assert load_spec(None, {**table, "cluster.shards": "s"}).scaling() is None  # shards: taken as they are


@pytest.mark.parametrize("where", [(), ("--local", "2")], ids=["in-process", "local-2"])
@pytest.mark.parametrize("train_on", ["train.npz", "train.csv", "shards"])
def test_gaussian_units_learn_from_raw_features_of_any_source(data, where, train_on):
    extra = ("--set", f"cluster.shards={data / 'shards'}") if train_on == "shards" else ()
    result, model = train(job(data, "gaussian", "train.npz" if train_on == "shards" else train_on),
                          data / f"out-{train_on}-{len(where)}", *where, *extra)
    assert result["test_error"] < 0.05, result["test_error"]  # chance is 0.67; unscaled it was
    scaler = model.input_scaler_
    assert scaler.kind == "standard"
    X, y = blobs(600)
    if train_on == "shards":  # the shard holds float32 rows: its statistics are of those values
        X = X.astype(np.float32)
    # The scaler is the training rows' own mean and standard deviation, on every path.
    np.testing.assert_allclose(scaler.offset, X.astype(np.float64).mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(1 / scaler.scale, X.astype(np.float64).std(axis=0), rtol=1e-4)
    Xt, yt = blobs(300, seed=1)
    assert np.mean(model.predict(Xt) != yt) == pytest.approx(result["test_error"])  # raw rows in


def test_the_workers_scale_as_one_process_does(data):
    (_, one), (_, two) = (train(job(data, "gaussian"), data / f"out-{n}", *where)
                          for n, where in ((1, ()), (2, ("--local", "2"))))
    # The same statistics, summed per shard then merged: equal but for float64 rounding.
    np.testing.assert_allclose(one.input_scaler_.offset, two.input_scaler_.offset, rtol=1e-12)
    np.testing.assert_allclose(one.input_scaler_.scale, two.input_scaler_.scale, rtol=1e-11)


@pytest.mark.parametrize("where", [(), ("--local", "2")], ids=["in-process", "local-2"])
def test_bernoulli_units_take_raw_features_scaled_to_the_unit_interval_only_when_asked(data, where, capsys):
    out = data / f"refused-{len(where)}"
    assert main(["train", str(job(data, "bernoulli")), "--out", str(out), "--quiet", "--no-ui", *where]) == 2
    err = capsys.readouterr().err
    assert "Bernoulli visible units need [0, 1]" in err and '[data] scale = "min_max"' in err
    assert not (out / "model.npz").exists()
    result, model = train(job(data, "bernoulli", scale="min_max"), data / f"out-{len(where)}", *where)
    assert result["test_error"] < 0.05 and model.input_scaler_.kind == "min_max"
    X, _ = blobs(600)
    assert model.input_scaler_.transform(X).min() == 0 and model.input_scaler_.transform(X).max() == 1


def test_the_validation_shard_is_scaled_as_the_training_rows(data):
    Xv, yv = blobs(200, seed=2)
    (valid,) = write_shards(Xv, yv, str(data / "valid"), 1)
    out = data / "out-valid"
    train(job(data, "gaussian"), out, "--local", "2", "--set", f"cluster.validation={valid}")
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    errors = [r["valid_error"] for r in records if r.get("phase") == "finetune" and "valid_error" in r]
    assert errors and errors[-1] < 0.05, errors  # raw validation rows scored unscaled: chance


@pytest.mark.parametrize("where", [(), ("--local", "2")], ids=["in-process", "local-2"])
def test_uint8_features_are_intensities_on_every_path(data, where, capsys):
    """A .npz of uint8 images: the workers' shards read them as [0, 1] (MNIST's rule); this process
    and the test did not (0..255 refused by Bernoulli units), so a model trained on the workers
    could not be tested on the same file."""
    rng = np.random.default_rng(3)
    def images(n, seed):
        y = np.random.default_rng(seed).integers(0, CLASSES, n)
        stripes = np.zeros((CLASSES, FEATURES), np.uint8)
        for c in range(CLASSES):
            stripes[c, c::CLASSES] = 255
        noise = rng.integers(0, 60, (n, FEATURES))
        return np.clip(stripes[y].astype(int) - noise + noise[:, ::-1], 0, 255).astype(np.uint8), y
    np.savez(data / "img.npz", **dict(zip("Xy", images(600, 0))))
    np.savez(data / "img-test.npz", **dict(zip("Xy", images(300, 1))))
    path = data / "img.toml"
    path.write_text("[data]\ntrain = 'img.npz'\ntest = 'img-test.npz'\n[model]\nhidden_layers = [16]\n"
                    "pretrain_epochs = 3\nfinetune_epochs = 30\n[job]\ndevice = 'cpu'\nseed = 0\n")
    out = data / f"img-{len(where)}"
    result, model = train(path, out, *where)
    assert result["test_error"] < 0.05 and getattr(model, "input_scaler_", None) is None
    capsys.readouterr()
    assert main(["evaluate", str(out / "model.npz"), "--data", str(data / "img-test.npz"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["test_error"] == pytest.approx(result["test_error"])
