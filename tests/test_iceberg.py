"""Apache Iceberg tables read in place (issue 39, part 3), written by pyiceberg through an SQL catalog.

The table has three snapshots: 600 rows of classes a, b, c partitioned by an int ``day``; an
overwrite with 600 rows of classes x, y; a delete (pyiceberg rewrites the files it touches).
The replaced files stay on disk, so a reader that lists the folder trains on rows the table no
longer holds. What the table holds at a snapshot is what pyiceberg itself reads.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyiceberg")
pytest.importorskip("sqlalchemy")

from pyiceberg.catalog.sql import SqlCatalog  # noqa: E402

from dbn import DBN  # noqa: E402
from dbn.cli import main  # noqa: E402
from shardio.readers import list_shards  # noqa: E402
from shardio.table_shard import TableShard  # noqa: E402
from shardio.tables import TableSource, with_version_fixed  # noqa: E402
from test_delta import animals, job as delta_job, train as delta_train  # noqa: E402


@pytest.fixture(scope="module")
def catalog(tmp_path_factory):
    root = tmp_path_factory.mktemp("iceberg")
    catalog = SqlCatalog("test", uri=f"sqlite:///{root / 'catalog.db'}", warehouse=f"file://{root / 'warehouse'}")
    catalog.create_namespace("db")
    return catalog


@pytest.fixture(scope="module")
def table(catalog):
    """The three snapshots; returns the table (its location is the folder a job names)."""
    rng = np.random.default_rng(0)
    first = animals(rng, 600, "abc").cast(pa.schema([("vec", pa.large_list(pa.float32())), ("f4", pa.float64()),
                                                      ("f5", pa.float32()), ("label", pa.large_string()),
                                                      ("day", pa.int32())]))
    table = catalog.create_table("db.animals", schema=first.schema)
    with table.update_spec() as spec:
        spec.add_identity("day")
    table.append(first)
    table.overwrite(animals(rng, 600, "xy").cast(first.schema))
    table.delete("label == 'y' and f4 > 0")
    return catalog.load_table("db.animals")


def folder(table) -> Path:
    return Path(table.location().removeprefix("file://"))


def held(table, snapshot=None) -> pa.Table:
    return table.scan(snapshot_id=snapshot).to_arrow()


def job(tmp_path: Path, uri: str, data: str = "", workers: int = 0) -> Path:
    return delta_job(tmp_path, uri, data, workers, fmt="iceberg")


def train(tmp_path: Path, uri: str, data: str = "", workers: int = 0) -> tuple[dict, DBN]:
    return delta_train(tmp_path, uri, data, workers, fmt="iceberg")


def test_the_folder_holds_rows_the_table_no_longer_does(table):
    on_disk = sum(pq.read_metadata(p).num_rows for p in (folder(table) / "data").rglob("*.parquet"))
    assert on_disk > 600 > held(table).num_rows


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iceberg_table_trains_on_exactly_its_current_rows(tmp_path, table, workers):
    now = held(table)
    result, model = train(tmp_path, str(folder(table)), workers=workers)
    assert result["n_train"] == now.num_rows
    assert list(model.classes_) == sorted(set(now.column("label").to_pylist())) == ["x", "y"]
    if workers:
        live = {task.file.file_path.removeprefix("file://") for task in table.scan().plan_files()}
        shares = [TableShard.open(uri) for uri in list_shards(str(tmp_path / "out" / "shards"))]
        found = [p for share in shares for p in share.pieces]
        assert {p.path for p in found} == live and sum(p.rows for p in found) == now.num_rows
        assert {share.source.version for share in shares} == {table.current_snapshot().snapshot_id}


def test_an_older_snapshot_by_id_and_by_time(tmp_path, table):
    first = table.snapshots()[0]
    result, model = train(tmp_path, str(folder(table)), f"version = {first.snapshot_id}")
    assert result["n_train"] == held(table, first.snapshot_id).num_rows == 600
    assert list(model.classes_) == ["a", "b", "c"]
    second = table.snapshots()[1]
    when = datetime.datetime.fromtimestamp(second.timestamp_ms / 1000, datetime.timezone.utc).isoformat()
    at_time = with_version_fixed(TableSource(str(folder(table)), "f4", format="iceberg", version=when))
    assert at_time.version == second.snapshot_id


def test_the_table_is_named_by_its_folder_or_a_metadata_file(tmp_path, table):
    """The folder's newest metadata file is the table now; an older metadata file is the table then."""
    metadata = sorted((folder(table) / "metadata").glob("*.metadata.json"))
    assert str(metadata[-1]) == table.metadata_location.removeprefix("file://")
    now = with_version_fixed(TableSource(str(folder(table)), "f4", format="iceberg"))
    assert now.version == with_version_fixed(TableSource(str(metadata[-1]), "f4", format="iceberg")).version
    first = table.snapshots()[0].snapshot_id
    (then,) = [m for m in metadata if json.loads(m.read_text()).get("current-snapshot-id") == first]
    assert with_version_fixed(TableSource(f"file://{then}", "f4", format="iceberg")).version == first


def refused(tmp_path, capsys, uri, data: str = "") -> str:
    assert main(["train", str(job(tmp_path, uri, data)), "--quiet", "--no-ui"]) == 2
    assert not (tmp_path / "out").exists()
    return capsys.readouterr().err


def test_an_iceberg_folder_read_as_parquet_says_to_name_it_iceberg(tmp_path, capsys, table):
    path = job(tmp_path, str(folder(table)))
    path.write_text(path.read_text().replace('format = "iceberg"', 'format = "parquet"'))
    assert main(["train", str(path), "--quiet", "--no-ui"]) == 2
    assert "format = 'iceberg'" in capsys.readouterr().err


def test_a_snapshot_the_table_never_had_is_named(tmp_path, capsys, table):
    err = refused(tmp_path, capsys, str(folder(table)), "version = 12345")
    assert "has no snapshot at version 12345" in err and str(table.current_snapshot().snapshot_id) in err


def test_a_folder_that_is_no_iceberg_table_is_named(tmp_path, capsys):
    (tmp_path / "plain").mkdir()
    err = refused(tmp_path, capsys, str(tmp_path / "plain"))
    assert "no Apache Iceberg table there" in err


def test_renamed_columns_are_refused(tmp_path, capsys, catalog):
    """Files written before a rename hold the old name: read by name they would lack the column."""
    renamed = catalog.create_table("db.renamed", schema=animals(np.random.default_rng(1), 10, "ab").schema)
    renamed.append(animals(np.random.default_rng(1), 50, "ab"))
    with renamed.update_schema() as update:
        update.rename_column("f4", "g4")
    err = refused(tmp_path, capsys, renamed.location())
    assert "were renamed (f4 / g4)" in err


def test_a_table_named_in_a_catalog_trains_as_pyicebergs_configuration_describes_the_catalog(tmp_path, catalog,
                                                                                               table):
    """``[data] catalog``: train and test name tables in it; the catalog is configured as pyiceberg
    reads it, here from the environment (a new process, as a user runs dbn)."""
    import os
    import subprocess
    import sys

    path = job(tmp_path, "db.animals", 'catalog = "test"\ntest = "db.animals"\ntest_filter = "day == 1"')
    env = {**os.environ, "PYICEBERG_CATALOG__TEST__TYPE": "sql",
           "PYICEBERG_CATALOG__TEST__URI": catalog.properties["uri"],
           "PYICEBERG_CATALOG__TEST__WAREHOUSE": catalog.properties["warehouse"]}
    done = subprocess.run([sys.executable, "-m", "dbn.cli", "train", str(path), "--quiet", "--local", "2", "--no-ui"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    now = held(table)
    assert result["n_train"] == now.num_rows
    assert result["n_test"] == sum(1 for day in now.column("day").to_pylist() if day == 1)
    shares = [TableShard.open(uri) for uri in list_shards(str(tmp_path / "out" / "shards"))]
    assert {share.source.uri for share in shares} == {table.metadata_location}  # pinned to the file, not the name

    (tmp_path / "b").mkdir()
    missing = subprocess.run([sys.executable, "-m", "dbn.cli", "train", str(job(tmp_path / "b", "db.nothing",
                              'catalog = "test"')), "--quiet"], env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "db.nothing: no such table in the Apache Iceberg catalog 'test'" in missing.stderr


# ------------------------------------------------------------------ on HDFS (tests/test_hdfs.py)


class WritingIO:
    """pyiceberg's writes to HDFS for the tests (the project's own FileIO only reads): pyiceberg
    writes the table, its bytes going through the project's file systems."""

    def __new__(cls, properties=None):
        from pyiceberg.io import OutputFile

        from iterreduce.storage.filesystems import filesystem
        from shardio.iceberg_io import FileSystemInput, FileSystemIO

        class Output(OutputFile):
            def __init__(self, location):
                super().__init__(location)
                self._fs, self._path = filesystem(location)

            def __len__(self):
                return self._fs.get_file_info(self._path).size

            def exists(self):
                return self._fs.get_file_info(self._path).type.name != "NotFound"

            def to_input_file(self):
                return FileSystemInput(self.location)

            def create(self, overwrite=False):
                if not overwrite and self.exists():
                    raise FileExistsError(self.location)
                return self._fs.open_output_stream(self._path)

        class Writing(FileSystemIO):
            def new_output(self, location):
                return Output(location)

        return Writing(properties or {})


def write_on_hdfs(hdfs, tmp_path, folder: str):
    """The module's table written to HDFS by pyiceberg: three snapshots; returns it."""
    catalog = SqlCatalog("hdfs", uri=f"sqlite:///{tmp_path / 'catalog.db'}", warehouse=hdfs.uri(folder),
                         **{"py-io-impl": "test_iceberg.WritingIO"})
    catalog.create_namespace("db")
    rng = np.random.default_rng(0)
    first = animals(rng, 300, "abc").cast(pa.schema([("vec", pa.large_list(pa.float32())), ("f4", pa.float64()),
                                                      ("f5", pa.float32()), ("label", pa.large_string()),
                                                      ("day", pa.int32())]))
    table = catalog.create_table("db.animals", schema=first.schema)
    table.append(first)
    table.overwrite(animals(rng, 300, "xy").cast(first.schema))
    table.delete("label == 'y' and f4 > 0")
    return catalog.load_table("db.animals")


def test_the_metadata_is_read_through_the_projects_own_file_systems(table):
    from shardio.iceberg import load
    from shardio.iceberg_io import FileSystemIO

    loaded, snapshot = load(str(folder(table)))
    assert isinstance(loaded.io, FileSystemIO) and snapshot.snapshot_id == table.current_snapshot().snapshot_id
    with pytest.raises(PermissionError, match="never writes"):
        loaded.io.new_output(str(folder(table) / "metadata" / "x.json"))


def test_a_catalog_with_another_format_is_refused(tmp_path, capsys):
    path = job(tmp_path, "db.animals", 'catalog = "test"')
    path.write_text(path.read_text().replace('format = "iceberg"', 'format = "delta"'))
    assert main(["train", str(path), "--quiet", "--no-ui"]) == 2
    assert "[data] catalog = 'test' names an Apache Iceberg catalog, and [data] format is 'delta'" in \
        capsys.readouterr().err


def test_equality_delete_files_are_refused_naming_their_kind():
    """No writer here makes equality deletes (Spark writes positional ones; Flink and others write
    these): the scan task pyiceberg would plan holds one, in pyiceberg's own types."""
    from types import SimpleNamespace

    from pyiceberg.manifest import DataFileContent, FileFormat

    from shardio import iceberg
    from iterreduce.exceptions import TableError

    data = SimpleNamespace(file_path="file:///t/data/a.parquet", content=DataFileContent.DATA,
                           file_format=FileFormat.PARQUET)
    deletes = [SimpleNamespace(file_path="file:///t/data/eq.parquet", content=DataFileContent.EQUALITY_DELETES,
                               file_format=FileFormat.PARQUET)]
    planned = SimpleNamespace(plan_files=lambda: [SimpleNamespace(file=data, delete_files=deletes)])
    table = SimpleNamespace(scan=lambda snapshot_id: planned)
    with pytest.raises(TableError, match=r"/t: snapshot 7 of the Apache Iceberg table has 1 delete file of a kind "
                                         r"this reader does not apply \(equality deletes in PARQUET"):
        iceberg._tasks("/t", table, SimpleNamespace(snapshot_id=7))
