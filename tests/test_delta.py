"""Delta Lake tables read in place (issue 39, part 2), written by delta-rs (the ``deltalake`` package).

The table here has four versions: 600 rows of classes a, b, c partitioned by an int ``day``;
an overwrite with 600 rows of classes x, y; a delete; an update that relabels some rows z. The
old files stay on disk throughout, so a reader that lists the folder trains on 1,200 rows of
five classes. What the table holds at a version is what ``deltalake`` itself reads.
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pytest

deltalake = pytest.importorskip("deltalake")

from dbn import DBN  # noqa: E402
from dbn.cli import main  # noqa: E402
from iterreduce.exceptions import TableError  # noqa: E402
from shardio.readers import list_shards  # noqa: E402
from shardio.pieces import pieces  # noqa: E402
from shardio.table_shard import TableShard  # noqa: E402
from shardio.tables import TableSource, open_dataset, with_version_fixed  # noqa: E402

FEATURES = 6


def animals(rng, n: int, labels: str, days=(1, 2, 3)) -> pa.Table:
    y = rng.integers(0, len(labels), n)
    centers = np.random.default_rng(len(labels)).normal(0, 1.5, (len(labels), FEATURES))
    X = centers[y] + rng.normal(0, 1.0, (n, FEATURES))
    return pa.table({"vec": pa.array(list(X[:, :4].astype(np.float32)), pa.list_(pa.float32())),
                     "f4": X[:, 4], "f5": X[:, 5].astype(np.float32),
                     "label": pa.array(np.asarray(list(labels))[y]),
                     "day": pa.array(rng.choice(days, n), pa.int32())})


def write_versions(root: Path) -> Path:
    """The four versions, each committed a moment after the one before (times tell them apart)."""
    rng = np.random.default_rng(0)
    deltalake.write_deltalake(str(root), animals(rng, 600, "abc"), partition_by=["day"])
    time.sleep(0.02)  # commit times are in milliseconds: two commits of one millisecond cannot be told apart
    deltalake.write_deltalake(str(root), animals(rng, 600, "xy"), mode="overwrite", partition_by=["day"])
    time.sleep(0.02)
    deltalake.DeltaTable(str(root)).delete("label = 'y' and f4 > 0")
    time.sleep(0.02)
    deltalake.DeltaTable(str(root)).update({"label": "'z'"}, predicate="f5 > 1")
    return root


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    return write_versions(tmp_path_factory.mktemp("delta") / "animals")


def held(root: Path, version=None, filter=None) -> pa.Table:
    """The rows the table holds at ``version``, as delta-rs reads them."""
    rows = deltalake.DeltaTable(str(root), version=version).to_pyarrow_table()
    return rows.filter(filter) if filter is not None else rows


#: The [model] of these tests' jobs: a small network, a few epochs.
SMALL_MODEL = """hidden_layers = [12]
pretrain_epochs = 1
finetune_epochs = 2
pretrain_batch_size = 20
finetune_batch_size = 20
"""


def job(tmp_path: Path, root, data: str = "", workers: int = 0, fmt: str = "delta",
        features=("vec", "f4", "f5"), model: str = SMALL_MODEL) -> Path:
    """A job file training on the table at ``root`` (of format ``fmt``) on ``features``, ``data``
    added to [data], ``model`` the [model] section."""
    path = tmp_path / "job.toml"
    path.write_text(f"""
[data]
train = "{root}"
format = "{fmt}"
features = {json.dumps(list(features))}
label = "label"
{data}
[model]
{model}
[cluster]
workers = {workers}

[output]
dir = "{tmp_path / 'out'}"

[job]
seed = 1
device = "cpu"
""")
    return path


def train(tmp_path: Path, root, data: str = "", workers: int = 0, fmt: str = "delta") -> tuple[dict, DBN]:
    args = ["train", str(job(tmp_path, root, data, workers, fmt)), "--quiet", "--no-ui"]
    assert main(args + (["--local", str(workers)] if workers else [])) == 0
    out = tmp_path / "out"
    return json.loads((out / "result.json").read_text()), DBN.load(out / "model.npz", device="cpu")


def test_the_folder_holds_rows_the_table_no_longer_does(table):
    """The premise: listed as plain Parquet, the folder has both versions' files."""
    on_disk = sum(pa.parquet.read_metadata(p).num_rows for p in table.rglob("*.parquet"))
    assert on_disk > held(table).num_rows and held(table).num_rows < 600


@pytest.mark.parametrize("workers", [0, 2])
def test_a_delta_table_trains_on_exactly_its_current_rows(tmp_path, table, workers):
    now = held(table)
    result, model = train(tmp_path, table, workers=workers)
    assert result["n_train"] == now.num_rows
    assert list(model.classes_) == sorted(set(now.column("label").to_pylist())) == ["x", "y", "z"]
    if workers:  # the shares name only files the log lists, each row group once, balanced
        live = set(deltalake.DeltaTable(str(table)).file_uris())
        shares = [TableShard.open(uri) for uri in list_shards(str(tmp_path / "out" / "shards"))]
        found = [p for share in shares for p in share.pieces]
        assert {p.path for p in found} <= live and len(found) == len({(p.path, p.row_group) for p in found})
        assert sum(p.rows for p in found) == now.num_rows
        assert {share.source.version for share in shares} == {3}  # pinned: the job reads one version


@pytest.mark.parametrize("workers", [0, 2])
def test_version_0_trains_on_exactly_the_first_versions_rows(tmp_path, table, workers):
    result, model = train(tmp_path, table, "version = 0", workers=workers)
    assert result["n_train"] == held(table, 0).num_rows == 600
    assert list(model.classes_) == ["a", "b", "c"]


def commit_time(root: Path, version: int) -> datetime.datetime:
    """When ``version`` was committed, by its commit file's modification time: the clock a reader's
    time travel goes by (Delta's protocol, without in-commit timestamps). The history's own
    timestamp is taken before the file is written, a few milliseconds earlier on a busy machine."""
    modified = (root / "_delta_log" / f"{version:020d}.json").stat().st_mtime_ns
    return datetime.datetime.fromtimestamp(modified / 1e9, datetime.timezone.utc)


@pytest.mark.parametrize("quoted", [True, False])
def test_a_time_names_the_version_current_then(tmp_path, table, quoted):
    first, second = commit_time(table, 1), commit_time(table, 2)
    assert second - first > datetime.timedelta(milliseconds=10)  # write_versions's pause
    when = (first + (second - first) / 2).isoformat()  # halfway between versions 1 and 2
    source = TableSource(str(table), "f4", format="delta", version=when)
    assert with_version_fixed(source).version == 1
    # In the job file a TOML time may be written bare (TOML's own type) or as a string.
    result, _ = train(tmp_path, table, f'version = "{when}"' if quoted else f"version = {when}")
    assert result["n_train"] == held(table, 1).num_rows == 600


def test_the_partition_values_come_from_the_log_and_a_filter_on_them_prunes_files(tmp_path, table):
    source = with_version_fixed(TableSource(str(table), ["vec", "f4", "day"], label="label", format="delta",
                                            filter="day == 2"))
    dataset = open_dataset(source)
    kept = pieces(dataset, source.filter)
    assert kept and all(dict((n, v) for n, _, v in p.partition)["day"] == 2 for p in kept)
    assert sum(p.rows for p in kept) == held(table, filter=pa.compute.field("day") == 2).num_rows
    # A partition column is a feature like any other: its value from the log, in every row.
    path = job(tmp_path, table, 'filter = "day >= 2"')
    path.write_text(path.read_text().replace('features = ["vec", "f4", "f5"]', 'features = ["vec", "f4", "day"]'))
    assert main(["train", str(path), "--quiet", "--no-ui"]) == 0
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["n_train"] == held(table, filter=pa.compute.field("day") >= 2).num_rows
    model = DBN.load(tmp_path / "out" / "model.npz", device="cpu")
    assert list(model.input_columns_) == ["vec", "f4", "day"]


def test_dbn_predict_reads_the_current_version(tmp_path, table, capsys):
    train(tmp_path, table)
    out = tmp_path / "predictions.parquet"
    assert main(["predict", str(tmp_path / "out" / "model.npz"), str(job(tmp_path, table)), "--table", str(table),
                 "--out", str(out), "--keep", "label"]) == 0
    written = pa.parquet.read_table(out)
    assert written.num_rows == held(table).num_rows
    assert set(written.column("label").to_pylist()) == {"x", "y", "z"}


# ------------------------------------------------------------------ refused, before anything is read


def refused(tmp_path, capsys, root, data: str = "", fmt: str | None = None) -> str:
    path = job(tmp_path, root, data)
    if fmt is not None:
        path.write_text(path.read_text().replace('format = "delta"', f'format = "{fmt}"'))
    assert main(["train", str(path), "--quiet", "--no-ui"]) == 2
    assert not (tmp_path / "out").exists()
    return capsys.readouterr().err


def test_a_delta_folder_read_as_parquet_says_to_name_it_delta(tmp_path, capsys, table):
    err = refused(tmp_path, capsys, table, fmt="parquet")
    assert "Delta Lake" in err and "format = 'delta'" in err


def test_a_folder_that_is_no_delta_table_is_named(tmp_path, capsys):
    plain = tmp_path / "plain"
    plain.mkdir()
    pa.parquet.write_table(animals(np.random.default_rng(1), 10, "ab"), plain / "part-0.parquet")
    err = refused(tmp_path, capsys, plain)
    assert f"{plain}: no Delta Lake table there" in err


def test_a_version_the_table_never_had_is_named(tmp_path, capsys, table):
    err = refused(tmp_path, capsys, table, "version = 9")
    assert f"{table}: cannot read the Delta Lake table at version 9" in err


@pytest.mark.parametrize("value", ["-1", '"yesterday"', "1.5"])
def test_a_version_that_is_neither_a_number_nor_a_time_is_refused(tmp_path, capsys, table, value):
    err = refused(tmp_path, capsys, table, f"version = {value}")
    assert "version" in err and "dbn: error:" in err


def test_a_version_of_a_table_without_versions_is_refused(tmp_path, capsys, table):
    with pytest.raises(TableError, match="'version' = 1 is for a Delta Lake or Apache Iceberg table"):
        TableSource(str(table), "f4", format="parquet", version=1)


def copy_of(table: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(table, tmp_path / "copy"))


def test_deletion_vectors_enabled_but_none_written_read_as_the_log_says(tmp_path, table):
    """delta-rs rewrites files on a delete even where the feature is on (and its own pyarrow
    reader then refuses the table): no file has a deletion vector, so the table reads."""
    root = copy_of(table, tmp_path)
    deltalake.DeltaTable(str(root)).alter.add_feature([deltalake.table.TableFeatures.DeletionVectors],
                                                      allow_protocol_versions_increase=True)
    deltalake.DeltaTable(str(root)).delete("label = 'z'")
    with pytest.raises(Exception, match="deletionVectors"):
        deltalake.DeltaTable(str(root)).to_pyarrow_table()
    expected = held(table, filter=pa.compute.field("label") != "z").num_rows
    result, model = train(tmp_path, root)
    assert result["n_train"] == expected and list(model.classes_) == ["x", "y"]


def test_deletion_vectors_that_cannot_be_read_are_refused(tmp_path, capsys, table):
    """A file whose rows a deletion vector marks (laid in the log by hand: delta-rs writes none;
    Spark-written ones come with part 5) is never read whole."""
    root = copy_of(table, tmp_path)
    deltalake.DeltaTable(str(root)).alter.add_feature([deltalake.table.TableFeatures.DeletionVectors],
                                                      allow_protocol_versions_increase=True)
    dt = deltalake.DeltaTable(str(root))
    add = pa.table(dt.get_add_actions(flatten=True)).to_pylist()[0]
    vector = {"storageType": "i", "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5EtOA",
              "offset": 1, "sizeInBytes": 36, "cardinality": 2}
    stamp = add["modification_time"] + 1
    actions = [{"commitInfo": {"timestamp": stamp, "operation": "DELETE"}},
               {"remove": {"path": add["path"], "deletionTimestamp": stamp, "dataChange": True}},
               {"add": {"path": add["path"], "partitionValues": {"day": str(add["partition.day"])},
                        "size": add["size_bytes"], "modificationTime": stamp, "dataChange": True,
                        "deletionVector": vector, "stats": json.dumps({"numRecords": add["num_records"]})}}]
    log = root / "_delta_log" / f"{dt.version() + 1:020d}.json"
    log.write_text("".join(json.dumps(action) + "\n" for action in actions))
    err = refused(tmp_path, capsys, root)
    assert "deletion vectors" in err and str(root) in err


@pytest.mark.parametrize("workers", [0, 2])
def test_column_mapping_reads_the_files_names_as_the_tables(tmp_path, workers):
    """delta.columnMapping.mode = name: the files hold col-<uuid> columns; the job names the table's."""
    root = tmp_path / "mapped"
    rows = animals(np.random.default_rng(2), 300, "ab")
    deltalake.write_deltalake(str(root), rows, partition_by=["day"], configuration={"delta.columnMapping.mode": "name"})
    deltalake.DeltaTable(str(root)).delete("f4 > 1")
    stored = pa.parquet.read_schema(next(root.rglob("*.parquet"))).names
    assert "f4" not in stored and all(name.startswith("col-") for name in stored)
    now = held(root)
    path = job(tmp_path, root, 'filter = "day >= 2"', workers)
    path.write_text(path.read_text().replace('["vec", "f4", "f5"]', '["vec", "f*", "day"]'))
    args = ["train", str(path), "--quiet", "--no-ui"] + (["--local", str(workers)] if workers else [])
    assert main(args) == 0
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["n_train"] == now.filter(pa.compute.field("day") >= 2).num_rows
    model = DBN.load(tmp_path / "out" / "model.npz", device="cpu")
    assert list(model.input_columns_) == ["vec", "f4", "f5", "day"] and list(model.classes_) == ["a", "b"]


def test_a_reader_feature_this_reader_does_not_know_is_refused(tmp_path, capsys):
    root = tmp_path / "variant"
    deltalake.write_deltalake(str(root), animals(np.random.default_rng(3), 50, "ab"))
    deltalake.DeltaTable(str(root)).alter.add_feature([deltalake.table.TableFeatures.VariantType],
                                                      allow_protocol_versions_increase=True)
    err = refused(tmp_path, capsys, root)
    assert "reader feature variantType" in err


def test_a_resumed_run_keeps_the_version_its_shares_were_cut_from(tmp_path, table):
    """The table moves on between a run and its --resume: the resumed run trains on the version it
    started with (its shares name it), and a new run of the same job on the newest."""
    from dbn.data.training import training_data
    from dbn.jobs.spec import load_spec

    root = copy_of(table, tmp_path)
    path = job(tmp_path, root, workers=2)
    before = held(root).num_rows
    assert training_data(load_spec(path)).spec_for_run().data.version == 3  # what the whole run reads
    args = ["train", str(path), "--quiet", "--no-ui", "--local", "2"]
    assert main(args) == 0
    deltalake.DeltaTable(str(root)).delete("label = 'x'")
    after = held(root).num_rows
    assert after < before
    assert main(args + ["--resume"]) == 0
    assert json.loads((tmp_path / "out" / "result.json").read_text())["n_train"] == before
    assert main(args) == 0
    assert json.loads((tmp_path / "out" / "result.json").read_text())["n_train"] == after
    assert {TableShard.open(uri).source.version for uri in list_shards(str(tmp_path / "out" / "shards"))} == {4}
