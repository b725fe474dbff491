"""Jobs on a table as Spark writes it, read in place (``[data] features``): trained by ``dbn
train`` in this process and on the local mini-cluster, predicting from the table's raw rows,
the same model as the same rows converted to shards, and bad tables refused before training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest
from conftest import MNIST_DIR

from dbn import DBN
from dbn.cli import main
from dbn.data.table_data import read_table
from dbn.model.scaler import FeatureStats
from shardio.readers import list_shards, read_shard
from shardio.shards import write_shards
from shardio.table_shard import TableShard

# Spark ML's VectorUDT as Spark stores it in Parquet.
VECTOR = pa.struct([pa.field("type", pa.int8(), nullable=False), pa.field("size", pa.int32()),
                    pa.field("indices", pa.list_(pa.field("element", pa.int32(), nullable=False))),
                    pa.field("values", pa.list_(pa.field("element", pa.float64(), nullable=False)))])
ANIMALS = ["cat", "dog", "emu"]
VECTOR_WIDTH, SCALARS = 6, 4
#: split -> (days, files a day, rows a file)
LAYOUT = {"train": ([1, 2], 2, 90), "test": ([3], 2, 60)}


def spark_vector(row: np.ndarray) -> dict:
    """``row`` as Spark stores a vector: sparse when it has zeros, else dense."""
    nonzero = np.flatnonzero(row)
    if len(nonzero) < len(row):
        return {"type": 0, "size": len(row), "indices": nonzero.tolist(), "values": row[nonzero].tolist()}
    return {"type": 1, "size": None, "indices": None, "values": row.tolist()}


def write_animals(root: Path, seed: int = 0, unit: bool = False, fmt: str = "parquet") -> dict:
    """Three classes of animals, separable but not trivially, laid out as Spark writes a table:
    ``split=/day=`` folders, two part files each (several row groups), ``_SUCCESS``, Hadoop's
    ``.crc`` files; features in a vector column ``vec`` (some sparse) and scalar columns
    ``x0``.. of several types on scales far from [0, 1]; the label a string. Returns the rows
    of each split as (features, labels) in file order. ``unit``: every feature squashed into
    [0, 1] (the int column to 0 or 1), for jobs that train on the rows as they are."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 1.5, (len(ANIMALS), VECTOR_WIDTH + SCALARS))
    rows = {}
    k = 0
    for split, (days, files, n) in LAYOUT.items():
        xs, ys = [], []
        for day in days:
            folder = root / f"split={split}" / f"day={day}"
            folder.mkdir(parents=True)
            for _ in range(files):
                y = rng.integers(0, len(ANIMALS), n)
                X = centers[y] + rng.normal(0, 1.0, (n, VECTOR_WIDTH + SCALARS))
                X[:, :VECTOR_WIDTH][rng.random((n, VECTOR_WIDTH)) < 0.2] = 0.0  # sparse vectors
                X[:, VECTOR_WIDTH] = np.round(X[:, VECTOR_WIDTH] * 1000)  # an int column in the thousands
                X[:, VECTOR_WIDTH + 1] = X[:, VECTOR_WIDTH + 1] * 50 + 500
                if unit:
                    X = 1 / (1 + np.exp(-X / np.maximum(np.abs(X).max(axis=0), 1e-9) * 4))
                    X[:, :VECTOR_WIDTH][X[:, :VECTOR_WIDTH] < 0.2] = 0.0
                    X[:, VECTOR_WIDTH] = np.round(X[:, VECTOR_WIDTH])
                table = pa.table({
                    "id": pa.array(np.arange(k * n, (k + 1) * n), pa.int64()),
                    "vec": pa.array([spark_vector(r) for r in X[:, :VECTOR_WIDTH]], VECTOR),
                    "x0": pa.array(X[:, VECTOR_WIDTH].astype(np.int32)),
                    "x1": pa.array(X[:, VECTOR_WIDTH + 1]),
                    "x2": pa.array(X[:, VECTOR_WIDTH + 2].astype(np.float32)),
                    "x3": pa.array(X[:, VECTOR_WIDTH + 3]),
                    "animal": pa.array(np.asarray(ANIMALS)[y]),
                })
                if fmt == "orc":
                    path = folder / f"part-{k:05d}-0a1b2c3d-c000.snappy.orc"
                    orc.write_table(table, str(path), compression="snappy")
                else:
                    path = folder / f"part-{k:05d}-0a1b2c3d-c000.snappy.parquet"
                    pq.write_table(table, str(path), row_group_size=32, compression="snappy")
                (folder / f".{path.name}.crc").write_bytes(b"crc")
                xs.append(X.astype(np.float32))
                ys.append(np.asarray(ANIMALS)[y])
                k += 1
        rows[split] = (np.concatenate(xs), np.concatenate(ys))
    (root / "_SUCCESS").touch()
    return rows


@pytest.fixture(scope="module")
def animals(tmp_path_factory):
    root = tmp_path_factory.mktemp("animals")
    return root, write_animals(root)


@pytest.fixture(scope="module")
def unit_animals(tmp_path_factory):
    root = tmp_path_factory.mktemp("unit-animals")
    return root, write_animals(root, unit=True)


def job_file(tmp_path: Path, root: Path, workers: int, *, test: bool = True, cluster: str = "",
             data: str = "") -> Path:
    """A job file of a few lines naming the table as it is."""
    path = tmp_path / "job.toml"
    tested = f"""test = "{root}"
test_filter = "split == 'test'"
""" if test else ""
    path.write_text(f"""
[data]
train = "{root}"
filter = "split == 'train'"
features = ["vec", "x0", "x1", "x2", "x3"]
label = "animal"
{tested}{data}
[model]
hidden_layers = [24]
pretrain_epochs = 3
finetune_epochs = 12
pretrain_batch_size = 20
finetune_batch_size = 20
finetune_learning_rate = 0.3

[cluster]
workers = {workers}
{cluster}
[output]
dir = "{tmp_path / 'out'}"

[job]
seed = 3
device = "cpu"
""")
    return path


def train(tmp_path: Path, root: Path, workers: int, **kwargs) -> tuple[dict, DBN]:
    import json

    tmp_path.mkdir(parents=True, exist_ok=True)
    args = ["train", str(job_file(tmp_path, root, workers, **kwargs)), "--quiet", "--no-ui"]
    assert main(args + (["--local", str(workers)] if workers else [])) == 0
    out = tmp_path / "out"
    return json.loads((out / "result.json").read_text()), DBN.load(out / "model.npz", device="cpu")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_spark_table_trains_in_place_and_the_model_predicts_its_raw_rows(tmp_path, animals, workers):
    root, rows = animals
    result, model = train(tmp_path, root, workers)
    X_test, y_test = rows["test"]
    assert result["n_test"] == len(y_test) and result["test_error"] < 0.1
    if workers:  # no copy of the data: the shares are small JSON files naming the table's row groups
        shares = list_shards(str(tmp_path / "out" / "shards"))
        assert len(shares) == 2 and all(uri.endswith(".table.json") for uri in shares)
        assert not list((tmp_path / "out").rglob("*.parquet"))
        pieces = [p for uri in shares for p in TableShard.open(uri).pieces]
        assert len(pieces) == len({(p.path, p.row_group) for p in pieces})  # each row group once
        assert sum(p.rows for p in pieces) == len(rows["train"][1])
        assert abs(pieces_rows(shares[0]) - pieces_rows(shares[1])) <= 32  # balanced within a row group
    # The model scales raw rows itself and answers in the table's labels.
    predicted = model.predict(X_test)
    assert set(predicted) <= set(ANIMALS)
    assert np.mean(predicted != y_test) == pytest.approx(result["test_error"])
    assert model.score(X_test, y_test) == pytest.approx(1 - result["test_error"])


def pieces_rows(uri: str) -> int:
    return TableShard.open(uri).rows


def test_the_table_gives_the_model_of_the_same_rows_converted_to_shards(tmp_path, unit_animals):
    """Issue 16's bar: read in place, or converted to our shard format, each worker's rows are
    the same bits, and with the same seed so is the model. (Rows already in [0, 1], trained as
    they are, ``scale = "none"``: scaling adds a first superstep, below, which moves the
    per-step seeds.)"""
    root, _ = unit_animals
    _, in_place = train(tmp_path / "in-place", root, 2, data='scale = "none"')
    converted = tmp_path / "converted"
    for i, uri in enumerate(list_shards(str(tmp_path / "in-place" / "out" / "shards"))):
        X, y = read_table(TableShard.open(uri))  # the share's rows, classes mapped
        write_shards(X, y, str(converted), 1, prefix=f"part-{i:05d}")
        np.testing.assert_array_equal(read_shard(list_shards(str(converted))[i]).features, X)
    _, from_shards = train(tmp_path / "shards", root, 2, test=False, cluster=f'shards = "{converted}"')
    a, b = in_place.get_state(), from_shards.get_state()
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_the_workers_gather_the_scalers_statistics(tmp_path, animals):
    """Scaling needs statistics of the whole table: the workers gather them in the first
    superstep, each over its share, and the master merges them; the scaler is the one a single
    pass over all the training rows gives, and the model keeps it."""
    root, rows = animals
    _, model = train(tmp_path, root, 2)
    expected = FeatureStats.of(rows["train"][0]).min_max_scaler()
    np.testing.assert_array_equal(model.input_scaler_.offset, expected.offset)
    np.testing.assert_array_equal(model.input_scaler_.scale, expected.scale)
    steps = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()]
    phases = [r["phase"] for r in steps if "step" in r and "phase" in r]
    assert phases[0] == "stats" and phases[1] == "transform" and phases.count("stats") == 1


def write_one_file(root: Path, table: pa.Table) -> Path:
    folder = root / "split=train" / "day=1"
    folder.mkdir(parents=True)
    path = folder / "part-00000-c000.snappy.parquet"
    pq.write_table(table, str(path), row_group_size=8)
    return path


def good_rows(n: int = 20) -> dict:
    rng = np.random.default_rng(1)
    return {"vec": pa.array([spark_vector(r) for r in rng.normal(size=(n, VECTOR_WIDTH))], VECTOR),
            **{f"x{i}": pa.array(rng.normal(size=n)) for i in range(SCALARS)},
            "animal": pa.array(np.asarray(ANIMALS)[rng.integers(0, 3, n)])}


@pytest.mark.parametrize("change, words", [
    (lambda cols: cols.pop("x2"), ["no column 'x2'"]),
    (lambda cols: cols.update(x1=pa.array([f"s{i}" for i in range(20)])), ["x1", "string"]),
    (lambda cols: cols.update(x3=pa.array([0.5] * 11 + [None] + [0.5] * 8)), ["x3", "null", "row 11"]),
    (lambda cols: cols.update(animal=pa.array(["cat"] * 19 + [None])), ["animal", "null", "row 19"]),
])
def test_a_bad_column_is_named_with_its_file_before_training(tmp_path, capsys, change, words):
    columns = good_rows()
    change(columns)
    write_one_file(tmp_path / "table", pa.table(columns))
    job = job_file(tmp_path, tmp_path / "table", 2, test=False)
    assert main(["train", str(job), "--local", "2", "--quiet", "--no-ui"]) != 0
    message = capsys.readouterr().err
    assert "part-00000-c000.snappy.parquet" in message or str(tmp_path / "table") in message
    for word in words:
        assert word in message, message
    assert not (tmp_path / "out" / "model.npz").exists()
    log = tmp_path / "out" / "log.jsonl"  # refused before any training step (at most the statistics' step ran)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    assert not [r for r in records if r.get("phase") in ("transform", "pretrain", "finetune")]


def test_a_streamed_table_trains_the_same_model_as_one_in_memory(tmp_path, animals):
    """Workers streaming their share from local disk (scaled into a new row file) train the
    model that workers holding it in memory train, bit for bit."""
    root, _ = animals
    _, in_memory = train(tmp_path / "memory", root, 2, test=False, cluster='stream = "never"')
    _, streamed = train(tmp_path / "streamed", root, 2, test=False, cluster='stream = "always"')
    a, b = in_memory.get_state(), streamed.get_state()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    np.testing.assert_array_equal(in_memory.input_scaler_.offset, streamed.input_scaler_.offset)


def test_dbn_predict_writes_a_tables_predictions_beside_its_ids(tmp_path, animals, capsys):
    """`dbn predict MODEL JOB --out FILE --keep id`: the test table's raw rows in, one Parquet
    file out with the kept columns, the predicted labels and their probabilities."""
    root, rows = animals
    result, _ = train(tmp_path, root, 0)
    capsys.readouterr()
    out = tmp_path / "predictions" / "test.parquet"
    assert main(["predict", str(tmp_path / "out" / "model.npz"), str(tmp_path / "job.toml"), "--out", str(out),
                 "--keep", "id", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert f"{len(rows['test'][1])} rows of {root} predicted -> {out}" in printed
    assert f"error {100 * result['test_error']:.2f} % against 'animal'" in printed
    written = pq.read_table(out)
    assert written.column_names == ["id", "prediction", "probability"]
    predicted = np.asarray(written.column("prediction").to_pylist())
    assert np.mean(predicted != rows["test"][1]) == pytest.approx(result["test_error"])
    ids = written.column("id").to_numpy()
    assert len(set(ids)) == len(ids) == len(rows["test"][1])
    probability = written.column("probability").to_numpy()
    assert ((1 / len(ANIMALS) <= probability) & (probability <= 1)).all()
    # The label column kept beside the prediction (it once made pyarrow's "exists 2 times"), over the
    # file just written (--overwrite: an existing --out is refused without it); a kept column named
    # as one predict writes is refused.
    assert main(["predict", str(tmp_path / "out" / "model.npz"), str(tmp_path / "job.toml"), "--out", str(out),
                 "--keep", "id,animal", "--device", "cpu", "--overwrite"]) == 0
    written = pq.read_table(out)
    assert written.column_names == ["id", "animal", "prediction", "probability"]
    assert written.column("animal").to_pylist() == list(rows["test"][1])
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "out" / "model.npz"), str(tmp_path / "job.toml"), "--out", str(out),
                 "--keep", "id,probability"]) == 2
    assert "'probability' would clash with the column of that name that predict writes" in capsys.readouterr().err
    # A job file that names no table columns names a data file (tests/test_string_labels.py): MNIST's
    # images do not fit this model's features, which the error says; with --keep it is refused.
    plain = tmp_path / "plain.toml"
    plain.write_text(f"[data]\ntrain = \"mnist\"\nmnist_dir = \"{MNIST_DIR}\"\n")
    assert main(["predict", str(tmp_path / "out" / "model.npz"), str(plain), "--out", str(out), "--overwrite"]) == 2
    assert "features but the model expects" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "out" / "model.npz"), str(plain), "--out", str(out), "--keep", "id"]) == 2
    assert "--keep and --filter are for tables" in capsys.readouterr().err


def test_an_orc_table_trains_in_place_too(tmp_path):
    """Hive's other format: ORC files, one piece each."""
    rows = write_animals(tmp_path / "orc-table", fmt="orc")
    result, model = train(tmp_path / "job", tmp_path / "orc-table", 2, data='format = "orc"')
    shares = list_shards(str(tmp_path / "job" / "out" / "shards"))
    assert all(p.row_group is None for uri in shares for p in TableShard.open(uri).pieces)  # whole files
    assert result["test_error"] < 0.1
    X_test, y_test = rows["test"]
    assert np.mean(model.predict(X_test) != y_test) == pytest.approx(result["test_error"])


@pytest.mark.parametrize("workers", [0, 2])
def test_a_boolean_label_column_is_classes_0_and_1(tmp_path, capsys, workers):
    """A yes/no outcome (``is_fraud``) as Spark writes it, a boolean column: its classes are 0 and 1,
    as NumPy reads a .npz's booleans; it was refused ("labels must be integers or strings")."""
    rng = np.random.default_rng(0)
    y = rng.random(400) < 0.5
    X = np.clip(0.5 + 0.4 * (2 * y[:, None] - 1) * (np.arange(6) < 3) + rng.normal(0, 0.1, (400, 6)), 0, 1)
    root = tmp_path / "table"
    root.mkdir()
    pq.write_table(pa.table({"id": np.arange(400), **{f"x{i}": X[:, i] for i in range(6)}, "is_fraud": y}),
                   root / "part-0.parquet")
    job = tmp_path / "job.toml"
    job.write_text(f"[data]\ntrain = '{root}'\ntest = '{root}'\nfeatures = 'x*'\nlabel = 'is_fraud'\n"
                   "[model]\nhidden_layers = [8]\npretrain_epochs = 2\nfinetune_epochs = 10\n[job]\ndevice = 'cpu'\n")
    out = tmp_path / "out"
    assert main(["train", str(job), "--out", str(out), "--quiet", "--no-ui", "--local", str(workers)]) == 0
    result = json.loads((out / "result.json").read_text())
    model = DBN.load(out / "model.npz", device="cpu")
    assert model.classes_.tolist() == [0, 1] and result["test_error"] < 0.1
    capsys.readouterr()
    assert main(["predict", str(out / "model.npz"), str(job), "--out", str(tmp_path / "p.parquet"), "--keep",
                 "is_fraud", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["error"] == pytest.approx(result["test_error"])
    written = pq.read_table(tmp_path / "p.parquet")
    assert written.column("is_fraud").to_pylist() == y.tolist()  # kept as stored


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("setting", ["filter", "test_filter"])
def test_a_filter_that_keeps_no_row_is_named(tmp_path, animals, capsys, workers, setting):
    """A filter that keeps no row once ended in "label classes: none (an empty label column?)",
    naming neither the table nor the filter; the test table's, after the whole training."""
    root, _ = animals
    job = job_file(tmp_path, root, workers)
    job.write_text(job.read_text().replace(f'{setting} = "split == ', f'{setting} = "x0 > 1e9 and split == '))
    assert main(["train", str(job), "--quiet", "--no-ui", *(["--local", str(workers)] if workers else [])]) == 2
    err = capsys.readouterr().err
    assert f"{root}: no row passes the filter \"x0 > 1e9 and split == " in err, err
    assert not (tmp_path / "out").exists()  # refused before training: nothing written


def _small_table(root: Path, rows: int = 300, row_group_size: int | None = None) -> None:
    """Two classes on 6 features in [0, 1], a ``split`` column (stored, not a folder) that
    marks two thirds of the rows for training, in one Parquet file."""
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, rows)
    X = np.clip(0.5 + 0.35 * (2 * y[:, None] - 1) * (np.arange(6) < 3) + rng.normal(0, 0.1, (rows, 6)), 0, 1)
    split = np.where(np.arange(rows) % 3 == 0, "test", "train")
    root.mkdir()
    pq.write_table(pa.table({**{f"x{i}": X[:, i] for i in range(6)}, "label": y, "split": split}),
                   root / "part-0.parquet", row_group_size=row_group_size)


def _small_job(tmp_path: Path, root: Path, batch: int) -> Path:
    job = tmp_path / "job.toml"
    job.write_text(f"[data]\ntrain = '{root}'\ntest = '{root}'\nfeatures = 'x*'\nlabel = 'label'\n"
                   "filter = \"split == 'train'\"\ntest_filter = \"split == 'test'\"\n"
                   f"[model]\nhidden_layers = [8]\npretrain_epochs = 2\nfinetune_epochs = 20\n"
                   f"pretrain_batch_size = {batch}\nfinetune_batch_size = {batch}\n"
                   f"[output]\ndir = '{tmp_path / 'out'}'\n[job]\ndevice = 'cpu'\n")
    return job


@pytest.mark.parametrize("workers", [0, 2])
def test_a_filter_on_a_stored_column_trains_on_workers_too(tmp_path, capsys, workers):
    """A filter on an ordinary column (not a partition folder) keeps fewer rows than the pieces
    store: the workers' label check compared the two and stopped every such job ("'label' has
    200 labels but X has 300 samples"). The log counts the rows that pass."""
    _small_table(tmp_path / "table", row_group_size=100)
    job = _small_job(tmp_path, tmp_path / "table", batch=5)  # 13 minibatches an epoch of 67 rows: no warning
    args = ["train", str(job), "--quiet", "--no-ui", "--json", *(["--local", str(workers)] if workers else [])]
    assert main(args) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out.splitlines()[-1])  # after the log's records
    assert result["test_error"] < 0.1 and result["n_test"] == 100
    data = [json.loads(line) for line in (tmp_path / "out" / "log.jsonl").read_text().splitlines()
            if json.loads(line).get("event") == "data"]
    assert data[-1]["rows"] == 200 and sum(data[-1]["classes"]) == 200 and data[-1]["warnings"] == []


@pytest.mark.parametrize("workers", [0, 2])
def test_few_minibatches_an_epoch_are_warned_of_with_a_batch_size_that_makes_more(tmp_path, capsys, workers):
    """The paper's batch of 100 on a small table (200 training rows, 100 a shard on 2 workers)
    makes one or two updates an epoch and learns next to nothing; the job says so at its start,
    of the smallest shard on workers (3 row groups of 100 stored rows, 67 of each pass the filter)."""
    _small_table(tmp_path / "table", row_group_size=100)
    job = _small_job(tmp_path, tmp_path / "table", batch=100)
    assert main(["train", str(job), "--no-ui", *(["--local", str(workers)] if workers else [])]) == 0
    err = capsys.readouterr().err
    rows, made, suggested = (200, 2, 20) if not workers else (67, 1, 6)  # shards: 2 pieces, 1 piece of 67
    assert (f"{rows} rows make few minibatches an epoch (pretrain_batch_size 100 makes {made} (2 epochs: "
            f"{2 * made} updates); finetune_batch_size 100 makes {made} (20 epochs: {20 * made} updates)), "
            f"too few updates to learn much: a smaller batch trains more, e.g. [model] "
            f"pretrain_batch_size = {suggested}, finetune_batch_size = {suggested}") in err, err


def test_fewer_pieces_than_workers_asked_is_said_and_the_block_momentum_follows_the_shards(tmp_path, capsys):
    """A table of one row group makes one shard, whatever --local asks: the job says it trains on
    one worker and why, and averages as one worker does (no block momentum: 1 - 1/1)."""
    _small_table(tmp_path / "table")  # one row group
    job = _small_job(tmp_path, tmp_path / "table", batch=10)
    assert main(["train", str(job), "--no-ui", "--local", "3", "--json"]) == 0
    captured = capsys.readouterr()
    assert ("local mini-cluster of 1 worker: 1 shard for the 3 workers asked (the table has 1 piece, a worker's "
            "unit of work (a Parquet row group, an ORC file): write it in smaller row groups or more files to train "
            "on more workers)") in captured.err, captured.err
    result = json.loads(captured.out.splitlines()[-1])
    assert result["shards"] == 1 and result["block_momentum"] == 0.0
    job_json = json.loads((tmp_path / "out" / "job.json").read_text())
    assert job_json["program_config"]["block_momentum"] == 0.0
    assert job_json["program_config"]["block_nesterov"] is False


def _column_order_tables(root: Path) -> dict[str, Path]:
    """A table to train on (features "m 0".."m 3" and "age", a string label), and two test
    tables of the same rows: with the columns in the same order, and reversed with one more."""
    rng = np.random.default_rng(5)
    n_train, n_test = 320, 160
    X = rng.normal(size=(n_train + n_test, 4))
    columns = {f"m {i}": X[:, i] for i in range(4)}
    columns["age"] = rng.integers(18, 80, len(X))
    columns["churned"] = np.where(X[:, 0] - X[:, 1] + 0.5 * X[:, 2] > 0, "yes", "no")
    table = pa.table(columns)
    paths = {name: root / name for name in ("train", "test", "reversed")}
    for path in paths.values():
        path.mkdir(parents=True)
    pq.write_table(table.slice(0, n_train), paths["train"] / "part-0.parquet", row_group_size=n_train // 2)
    test = table.slice(n_train)
    pq.write_table(test, paths["test"] / "part-0.parquet")
    reversed_ = test.select(list(reversed(test.column_names))).append_column("note", pa.array(["x"] * n_test))
    pq.write_table(reversed_, paths["reversed"] / "part-0.parquet")
    return paths


@pytest.mark.parametrize("workers", [0, 2])
def test_the_model_reads_its_columns_by_name_from_tables_of_another_order(tmp_path, capsys, workers):
    """`[data] features = ["m *", "age"]` (a glob in a list) resolves against the training table;
    the model keeps those columns and reads them by name: a test table or a table to predict
    whose columns come in another order gives the same error and the same predictions (they
    were read by position, and a glob expanded in each table's own order, silently wrong)."""
    paths = _column_order_tables(tmp_path / "tables")
    outcomes = {}
    for test in ("test", "reversed"):
        job = tmp_path / f"{test}.toml"
        job.write_text(f"""
[data]
train = "{paths['train']}"
test = "{paths[test]}"
features = ["m *", "age"]
label = "churned"
scale = "auto"
[model]
hidden_layers = [16]
pretrain_epochs = 2
finetune_epochs = 20
finetune_learning_rate = 0.3
pretrain_batch_size = 16
finetune_batch_size = 16
[output]
dir = "{tmp_path / ('out-' + test)}"
[job]
seed = 1
device = "cpu"
""")
        args = ["train", str(job), "--quiet", "--no-ui"] + (["--local", str(workers)] if workers else [])
        assert main(args) == 0
        result = json.loads((tmp_path / f"out-{test}" / "result.json").read_text())
        model_path = tmp_path / f"out-{test}" / "model.npz"
        assert DBN.load(model_path, device="cpu").input_columns_ == ("m 0", "m 1", "m 2", "m 3", "age")
        out = tmp_path / f"predicted-{test}.parquet"
        assert main(["predict", str(model_path), str(job), "--out", str(out), "--device", "cpu"]) == 0
        outcomes[test] = result["test_error"], pq.read_table(out).select(["prediction", "probability"])
    assert outcomes["test"][0] < 0.25  # a model that learned something, so that a mix-up would show
    assert outcomes["reversed"][0] == outcomes["test"][0]
    assert outcomes["reversed"][1].equals(outcomes["test"][1])


@pytest.mark.parametrize("workers", [0, 2])
def test_view_typed_columns_read_as_the_plain_types_they_hold(tmp_path, workers):
    """A Parquet file whose Arrow schema records view layouts (string_view, list_view: delta-rs,
    DuckDB and Polars may write them) reads as strings and lists, the label and features alike."""
    root = tmp_path / "views"
    write_animals(root)
    for path in root.rglob("*.parquet"):
        table = pq.read_table(path)
        viewed = table.set_column(table.schema.get_field_index("animal"), "animal",
                                  table.column("animal").cast(pa.string_view()))
        x3 = viewed.column("x3").combine_chunks()
        listed = pa.ListViewArray.from_arrays(pa.array(np.arange(len(x3)), pa.int32()),
                                              pa.array(np.ones(len(x3)), pa.int32()), x3)
        viewed = viewed.set_column(viewed.schema.get_field_index("x3"), "x3", listed)
        pq.write_table(viewed, path, row_group_size=32, store_schema=True)
    assert pq.read_schema(next(root.rglob("*.parquet"))).field("animal").type == pa.string_view()
    result, model = train(tmp_path / "job", root, workers)
    assert set(model.classes_) == set(ANIMALS) and result["test_error"] < 0.1
