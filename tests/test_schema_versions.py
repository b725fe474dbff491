"""The columns are those of what is read (issue 51, class 8).

A Delta Lake version or an Apache Iceberg snapshot is read with its own schema, not the newest:
a glob of features expands over the columns the table had then. A folder of Parquet or ORC
files whose schemas differ (a column added in later partitions, a type widened) is read with
their merged schema, as Spark's ``mergeSchema`` reads it: a column that older files lack is null
there, and a feature or label that is null in a row used is an error naming the file and how a
filter leaves those rows out, never "no column 'f10' (did you mean 'f1'?)". Each file's footer is
read once to merge them, and that read is the one the pieces are cut from.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

from dbn import DBN
from dbn.cli import main
from iterreduce.exceptions import ShardError
from shardio.labels import LabelMap
from shardio.pieces import table_pieces
from shardio.reading import read_piece
from shardio.tables import TableSource, open_dataset, resolve

from test_delta import job as model_job

SMALL_MODEL = """hidden_layers = [8]
pretrain_epochs = 1
finetune_epochs = 1
pretrain_batch_size = 20
finetune_batch_size = 20
"""


def rows(seed: int, n: int, labels: str = "ab", extra=()) -> pa.Table:
    """``n`` rows of f1 (float64), f2 (float32), a string label, and a float64 column each of ``extra``."""
    rng = np.random.default_rng(seed)
    columns = {"f1": rng.normal(size=n), "f2": rng.normal(size=n).astype(np.float32)}
    columns.update({name: rng.normal(size=n) for name in extra})
    columns["label"] = pa.array(np.asarray(list(labels))[rng.integers(0, len(labels), n)])
    return pa.table(columns)


def job(tmp_path: Path, root, features, fmt: str = "parquet", data: str = "") -> Path:
    """A job file of this module's small model (test_delta's job files), in ``tmp_path``, made if missing."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    return model_job(tmp_path, root, data, fmt=fmt, features=features, model=SMALL_MODEL)


def run(tmp_path: Path, root, features, fmt: str = "parquet", data: str = "") -> int:
    return main(["train", str(job(tmp_path, root, features, fmt, data)), "--quiet", "--no-ui"])


def trained(tmp_path: Path) -> tuple[dict, DBN]:
    out = tmp_path / "out"
    return json.loads((out / "result.json").read_text()), DBN.load(out / "model.npz", device="cpu")


# ------------------------------------------------------------------ Delta Lake: a version's own schema


@pytest.fixture
def delta_table(tmp_path) -> Path:
    """Version 0: f1, f2 (150 rows); version 1 appends 100 rows with a new column f3."""
    deltalake = pytest.importorskip("deltalake")
    root = tmp_path / "delta"
    deltalake.write_deltalake(str(root), rows(0, 150))
    deltalake.write_deltalake(str(root), rows(1, 100, extra=["f3"]), mode="append", schema_mode="merge")
    return root


def test_an_older_delta_version_takes_that_versions_columns(tmp_path, delta_table):
    assert run(tmp_path, delta_table, ["f*"], "delta", "version = 0") == 0
    result, model = trained(tmp_path)
    assert list(model.input_columns_) == ["f1", "f2"] and result["n_train"] == 150


def test_a_delta_column_added_later_is_null_in_the_older_files(tmp_path, capsys, delta_table):
    assert run(tmp_path / "all", delta_table, ["f*"], "delta") != 0
    err = capsys.readouterr().err
    old = [p.name for p in delta_table.glob("*.parquet") if "f3" not in pq.read_schema(p).names]
    assert "no column 'f3' in this file" in err and any(name in err for name in old), err
    assert '"f3 is not None"' in err and "did you mean" not in err
    assert run(tmp_path / "new", delta_table, ["f*"], "delta", 'filter = "f3 is not None"') == 0
    result, model = trained(tmp_path / "new")
    assert list(model.input_columns_) == ["f1", "f2", "f3"] and result["n_train"] == 100


# ------------------------------------------------------------------ Apache Iceberg: a snapshot's own schema


@pytest.fixture
def iceberg_table(tmp_path):
    """Snapshot 1: f1, f2 (150 rows); then a column f3 is added and 100 rows with it appended."""
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.types import DoubleType

    catalog = SqlCatalog("evolve", uri=f"sqlite:///{tmp_path / 'catalog.db'}",
                         warehouse=f"file://{tmp_path / 'warehouse'}")
    catalog.create_namespace("db")
    first = rows(0, 150)
    table = catalog.create_table("db.evolving", schema=first.schema)
    table.append(first)
    with table.update_schema() as update:
        update.add_column("f3", DoubleType())
    table.append(rows(1, 100, extra=["f3"]).select(["f1", "f2", "label", "f3"]))
    return catalog.load_table("db.evolving")


def test_an_older_iceberg_snapshot_takes_that_snapshots_columns(tmp_path, iceberg_table):
    first = iceberg_table.snapshots()[0].snapshot_id
    where = iceberg_table.location().removeprefix("file://")
    assert run(tmp_path, where, ["f*"], "iceberg", f"version = {first}") == 0
    result, model = trained(tmp_path)
    assert list(model.input_columns_) == ["f1", "f2"] and result["n_train"] == 150


def test_an_iceberg_column_added_later_is_null_in_the_older_files(tmp_path, capsys, iceberg_table):
    where = iceberg_table.location().removeprefix("file://")
    assert run(tmp_path / "all", where, ["f*"], "iceberg") != 0
    err = capsys.readouterr().err
    assert "no column 'f3' in this file" in err and '"f3 is not None"' in err and "did you mean" not in err
    assert run(tmp_path / "new", where, ["f*"], "iceberg", 'filter = "f3 is not None"') == 0
    result, model = trained(tmp_path / "new")
    assert list(model.input_columns_) == ["f1", "f2", "f3"] and result["n_train"] == 100


# ------------------------------------------------------------------ plain folders: the files' merged schema


def write(table: pa.Table, path: Path, fmt: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "orc":
        orc.write_table(table, str(path))
    else:
        pq.write_table(table, str(path), row_group_size=50)
    return path


def grown_table(root: Path, fmt: str = "parquet") -> tuple[Path, Path]:
    """Day 1 written before the column f10 was added (120 rows); day 2 after (80 rows)."""
    old = write(rows(0, 120), root / "day=1" / f"part-00000.{fmt}", fmt)
    new = write(rows(1, 80, extra=["f10"]), root / "day=2" / f"part-00000.{fmt}", fmt)
    return old, new


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_a_column_only_later_files_hold_is_found_and_its_absence_named(tmp_path, capsys, fmt):
    old, _ = grown_table(tmp_path / "t", fmt)
    assert run(tmp_path / "all", tmp_path / "t", ["f1", "f10"], fmt) != 0
    err = capsys.readouterr().err
    assert f"{old}: no column 'f10' in this file" in err, err
    assert "the table's other files have it" in err and '"f10 is not None"' in err and "did you mean" not in err
    assert not (tmp_path / "all" / "out" / "model.npz").exists()
    assert run(tmp_path / "new", tmp_path / "t", ["f1", "f10"], fmt, 'filter = "f10 is not None"') == 0
    result, model = trained(tmp_path / "new")
    assert list(model.input_columns_) == ["f1", "f10"] and result["n_train"] == 80


def test_a_glob_expands_over_the_merged_columns_in_order_of_first_appearance(tmp_path):
    grown_table(tmp_path / "t")
    source = TableSource(str(tmp_path / "t"), "f*", label="label")
    assert resolve(source, open_dataset(source)).features == ("f1", "f2", "f10")


def test_widened_types_read_as_the_merged_type(tmp_path):
    """int32 then int64, float32 then float64: the wider type; every file still reads."""
    first = pa.table({"n": pa.array([1, 2, 3], pa.int32()), "x": pa.array([.5, 1, 2], pa.float32()),
                      "label": pa.array([0, 1, 0], pa.int32())})
    later = pa.table({"n": pa.array([2**40, 5], pa.int64()), "x": pa.array([.25, 3]),
                      "label": pa.array([1, 1], pa.int64())})
    write(first, tmp_path / "t" / "part-0.parquet", "parquet")
    write(later, tmp_path / "t" / "part-1.parquet", "parquet")
    source = TableSource(str(tmp_path / "t"), ["n", "x"], label="label")
    dataset = open_dataset(source)
    assert dataset.schema.field("n").type == pa.int64() and dataset.schema.field("x").type == pa.float64()
    source = resolve(source, dataset)
    read = [read_piece(source, piece, classes=LabelMap((0, 1))) for piece in table_pieces(source, dataset)]
    X = np.concatenate([x for x, _ in read])
    assert X.shape == (5, 2) and X[3, 0] == np.float32(2**40)


def test_a_column_of_another_kind_in_a_later_file_is_named_with_that_file(tmp_path):
    """Types that do not merge (numbers, then strings): the file whose column is not a feature is named."""
    write(pa.table({"x": [1.0, 2.0], "label": ["a", "b"]}), tmp_path / "t" / "part-0.parquet", "parquet")
    bad = write(pa.table({"x": ["1", "2"], "label": ["a", "b"]}), tmp_path / "t" / "part-1.parquet", "parquet")
    source = TableSource(str(tmp_path / "t"), ["x"])
    dataset = open_dataset(source)
    source = resolve(source, dataset)
    with pytest.raises(ShardError, match=f"{bad}: feature column 'x' is string"):
        [read_piece(source, piece) for piece in table_pieces(source, dataset)]


class CountingHandler(pafs.FileSystemHandler):
    """The local file system, counting the files opened for reading."""

    def __init__(self):
        self.local, self.opened = pafs.LocalFileSystem(), collections.Counter()

    def get_type_name(self):
        return "counting"

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def open_input_file(self, path):
        self.opened[path] += 1
        return self.local.open_input_file(path)

    def open_input_stream(self, path):
        self.opened[path] += 1
        return self.local.open_input_stream(path)

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def _refused(self, *args):
        raise PermissionError("read only")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _refused
    move = copy_file = open_output_stream = open_append_stream = _refused


def test_the_footers_merged_are_those_the_pieces_are_cut_from(tmp_path, monkeypatch):
    """Merging the schemas reads each footer once, and cutting the pieces reads none again."""
    import shardio.folder_tables as folder_tables

    for day in range(1, 6):
        write(rows(day, 60, extra=["f10"] if day > 3 else ()), tmp_path / "t" / f"day={day}" / "part-0.parquet",
              "parquet")
    handler = CountingHandler()
    counting = pafs.PyFileSystem(handler)
    monkeypatch.setattr(folder_tables, "filesystem", lambda uri: (counting, str(tmp_path / "t")))
    source = TableSource(str(tmp_path / "t"), ["f1", "f10"], label="label")
    dataset = open_dataset(source)
    found = table_pieces(resolve(source, dataset), dataset)
    assert len(handler.opened) == 5 and sum(p.rows for p in found) == 300
    assert sum(handler.opened.values()) <= 6  # one footer may be read twice: pyarrow's own look at the first file
