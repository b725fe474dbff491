"""A model trained on a CSV file keeps its columns' names (``input_columns_``) and reads them by
name from every later file: the job's test file, ``dbn evaluate``'s and ``dbn predict``'s. Before,
a CSV's features were its columns in file order, so a file with the same columns in another
order (an export from another tool) gave the model the wrong features, silently. The names
travel with the data: in this process, and through the shards a distributed job (or ``dbn
shard``) writes, in their Parquet metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from dbn import DBN
from dbn.cli import main
from iterreduce.exceptions import ShardError
from shardio.readers import describe_shard
from shardio.shards import COLUMNS_KEY, write_shards

COLUMNS = ["price", "rooms", "area", "age"]


def houses(n: int, seed: int) -> pa.Table:
    """Two classes ("cheap", "dear") from 4 features in [0, 1] of different weights, a label column."""
    rng = np.random.default_rng(seed)
    X = rng.random((n, len(COLUMNS)))
    dear = 2 * X[:, 0] + X[:, 1] - X[:, 3] > 1.0
    return pa.table({**{name: X[:, i] for i, name in enumerate(COLUMNS)},
                     "label": np.where(dear, "dear", "cheap")})


@pytest.fixture
def files(tmp_path):
    pacsv.write_csv(houses(400, seed=0), tmp_path / "train.csv")
    test = houses(200, seed=1)
    pacsv.write_csv(test, tmp_path / "test.csv")
    reordered = test.select(["age", "label", "area", "price", "rooms"]).append_column("id", pa.array(range(200)))
    pacsv.write_csv(reordered, tmp_path / "reordered.csv")
    pacsv.write_csv(test.drop(["rooms"]), tmp_path / "no-rooms.csv")
    return tmp_path


def job(root: Path, test: str, train: str = "train.csv", cluster: str = "") -> Path:
    path = root / f"job-{Path(test).stem}-{Path(train).stem}.toml"
    path.write_text(f"[data]\ntrain = '{root / train}'\ntest = '{root / test}'\n"
                    "[model]\nhidden_layers = [12]\npretrain_epochs = 2\nfinetune_epochs = 15\n"
                    "pretrain_batch_size = 20\nfinetune_batch_size = 20\nfinetune_learning_rate = 0.3\n"
                    f"[cluster]\n{cluster}\n[output]\ndir = '{root / ('out-' + path.stem)}'\n"
                    "[job]\nseed = 2\ndevice = 'cpu'\n")
    return path


def run(path: Path, *extra: str) -> tuple[dict, Path]:
    assert main(["train", str(path), "--quiet", "--no-ui", *extra]) == 0
    out = path.parent / f"out-{path.stem}"
    return json.loads((out / "result.json").read_text()), out / "model.npz"


@pytest.mark.parametrize("how", ["in-process", "local-2", "shards"])
def test_a_csv_models_columns_are_read_by_name_from_every_later_file(files, how, capsys):
    extra, cluster = {"in-process": ((), ""), "local-2": (("--local", "2"), ""),
                      "shards": ((), f"shards = '{files / 'shards'}'")}[how]
    if how == "shards":  # `dbn shard` keeps the CSV's names in the shards' metadata
        assert main(["shard", str(files / "train.csv"), str(files / "shards"), "--shards", "2"]) == 0
        assert describe_shard(str(files / "shards" / "part-00000.parquet"))["columns"] == COLUMNS
    results = {}
    for test in ("test.csv", "reordered.csv"):
        result, model_path = run(job(files, test, cluster=cluster), *extra)
        assert DBN.load(model_path, device="cpu").input_columns_ == tuple(COLUMNS)
        results[test] = result["test_error"]
    assert results["test.csv"] < 0.2  # it learned: a mix-up of columns would show
    assert results["reordered.csv"] == results["test.csv"]
    capsys.readouterr()
    predictions = {}
    for data in ("test.csv", "reordered.csv"):
        assert main(["evaluate", str(model_path), "--data", str(files / data), "--json"]) == 0
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["test_error"] == results["test.csv"]
        out = files / f"predicted-{data}.parquet"
        assert main(["predict", str(model_path), str(job(files, data, cluster=cluster)), "--out", str(out)]) == 0
        predictions[data] = pq.read_table(out).select(["prediction", "probability"])
    assert predictions["reordered.csv"].equals(predictions["test.csv"])


def test_a_test_file_without_a_models_column_is_named_before_training(files, capsys):
    path = job(files, "no-rooms.csv")
    assert main(["train", str(path), "--quiet", "--no-ui"]) == 2
    err = capsys.readouterr().err
    assert "no-rooms.csv: no column 'rooms': the model reads the columns it was trained on, by name" in err
    assert not (files / f"out-{path.stem}" / "model.npz").exists()  # refused before training
    _, model_path = run(job(files, "test.csv"))
    capsys.readouterr()
    assert main(["evaluate", str(model_path), "--data", str(files / "no-rooms.csv")]) == 2
    assert "no column 'rooms'" in capsys.readouterr().err


def test_shards_keep_their_columns_checked(tmp_path):
    X = np.random.default_rng(0).random((6, 3)).astype(np.float32)
    uri = write_shards(X, None, str(tmp_path / "s"), 1, columns=["a", "b", "c"])[0]
    assert describe_shard(uri)["columns"] == ["a", "b", "c"]
    assert describe_shard(write_shards(X, None, str(tmp_path / "plain"), 1)[0])["columns"] is None
    with pytest.raises(ShardError, match="2 column names for 3 features"):
        write_shards(X, None, str(tmp_path / "bad"), 1, columns=["a", "b"])
    table = pq.read_table(uri)
    for bad in (b"not json", json.dumps(["a", "b"]).encode(), json.dumps(["a", "", "c"]).encode()):
        pq.write_table(table.replace_schema_metadata({COLUMNS_KEY: bad}), uri)
        with pytest.raises(ShardError, match=f"{uri}: .*feature columns"):
            describe_shard(uri)
