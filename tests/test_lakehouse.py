"""A lakehouse table's folder is never read as plain Parquet (issue 39, part 1).

Delta Lake, Apache Iceberg and Apache Hudi keep files that are no longer the table (replaced by an
overwrite, removed by a delete) beside those that are, until a VACUUM or an expiry: read as plain
Parquet their folder trains on rows the table no longer holds. Each is told by its log or metadata
folder (``_delta_log/``, ``metadata/*.metadata.json``, ``.hoodie/``) and refused before anything is
read, by every command that reads a table: train, a test table, predict. Here the markers are laid
beside a Spark-layout table as the formats lay them; Delta and Iceberg tables as their writers make
them, read as such, are in tests/test_delta.py and tests/test_iceberg.py.
"""

from __future__ import annotations

import pytest

from dbn.cli import main
from iterreduce.exceptions import TableError
from iterreduce.storage.filesystems import filesystem
from shardio.lakehouse import lakehouse_format
from test_table_jobs import write_animals

FEATURES = '["vec", "x0", "x1", "x2", "x3"]'


def mark(table, kind: str) -> None:
    """Lay ``kind``'s log or metadata folder in ``table`` as its writer does."""
    if kind == "delta":
        (table / "_delta_log").mkdir()
        (table / "_delta_log" / "00000000000000000000.json").write_text('{"commitInfo": {}}\n')
    elif kind == "iceberg":
        (table / "metadata").mkdir()
        (table / "metadata" / "00000-3f6b.metadata.json").write_text("{}")
        (table / "metadata" / "version-hint.text").write_text("1")
    else:
        (table / ".hoodie").mkdir()
        (table / ".hoodie" / "hoodie.properties").write_text("hoodie.table.name=animals\n")


def job(tmp_path, train, test=None) -> str:
    path = tmp_path / "job.toml"
    path.write_text(f'[data]\ntrain = "{train}"\nfeatures = {FEATURES}\nlabel = "animal"\n'
                    f'{f"test = {chr(34)}{test}{chr(34)}{chr(10)}" if test else ""}'
                    f'[model]\nhidden_layers = [6]\npretrain_epochs = 1\nfinetune_epochs = 1\n'
                    f'[job]\nname = "lake"\ndevice = "cpu"\n')
    return str(path)


NAMES = {"delta": ("Delta Lake", "_delta_log"), "iceberg": ("Apache Iceberg", "metadata"), "hudi": ("Apache Hudi", ".hoodie")}
#: What the refusal says to do: Delta and Iceberg tables are read as such (tests/test_delta.py,
#: tests/test_iceberg.py), Hudi not yet.
REMEDY = {"delta": "read it as one with format = 'delta'", "iceberg": "read it as one with format = 'iceberg'",
          "hudi": "write the version to train on as plain Parquet"}


@pytest.mark.parametrize("kind", ["delta", "iceberg", "hudi"])
@pytest.mark.parametrize("local", [None, "2"])
def test_a_lakehouse_tables_folder_is_refused_before_anything_is_read(tmp_path, capsys, kind, local):
    table = tmp_path / "animals"
    write_animals(table)
    mark(table, kind)
    out = tmp_path / "out"
    code = main(["train", job(tmp_path, table), "--out", str(out), "--quiet", "--no-ui",
                 *(["--local", local] if local else [])])
    err = capsys.readouterr().err
    name, marker = NAMES[kind]
    assert code == 2 and err.startswith(f"dbn: error: {table}: part of ") and err.count("\n") == 1, err
    assert f"{name} table ({table / marker} says" in err and REMEDY[kind] in err
    assert not out.exists()  # nothing written: refused before any data was read


def test_a_partition_folder_of_a_delta_table_and_a_test_table_inside_one_are_refused(tmp_path, capsys):
    table = tmp_path / "animals"
    write_animals(table)
    mark(table, "delta")
    partition = table / "split=train"
    assert main(["train", job(tmp_path, partition), "--out", str(tmp_path / "a"), "--quiet", "--no-ui"]) == 2
    assert f"{partition}: part of a Delta Lake table ({table / '_delta_log'} says" in capsys.readouterr().err

    plain = tmp_path / "plain"
    write_animals(plain)
    assert main(["train", job(tmp_path, plain, test=partition), "--out", str(tmp_path / "b"), "--quiet",
                 "--no-ui"]) == 2  # the test table, before training
    assert "part of a Delta Lake table" in capsys.readouterr().err
    assert not (tmp_path / "b" / "model.npz").exists()


def test_predict_refuses_a_lakehouse_table(tmp_path, capsys):
    plain = tmp_path / "plain"
    write_animals(plain)
    assert main(["train", job(tmp_path, plain), "--out", str(tmp_path / "run"), "--quiet", "--no-ui"]) == 0
    lake = tmp_path / "lake"
    write_animals(lake)
    mark(lake, "iceberg")
    capsys.readouterr()
    code = main(["predict", str(tmp_path / "run" / "model.npz"), job(tmp_path, plain), "--table", str(lake),
                 "--out", str(tmp_path / "p.parquet")])
    assert code == 2 and "part of an Apache Iceberg table" in capsys.readouterr().err
    assert not (tmp_path / "p.parquet").exists()


def test_plain_folders_are_not_taken_for_lakehouse_tables(tmp_path):
    """A folder named metadata without Iceberg's files, and a plain table, are what they are."""
    table = tmp_path / "animals"
    write_animals(table)
    (table / "metadata").mkdir()
    (table / "metadata" / "notes.txt").write_text("not Iceberg's")
    fs, path = filesystem(str(table))
    assert lakehouse_format(fs, path) is None
    assert lakehouse_format(fs, path + "/split=train/day=1") is None
    mark(table, "hudi")
    assert lakehouse_format(fs, path + "/split=train/day=1") == ("Apache Hudi", f"{path}/.hoodie")
    assert issubclass(TableError, ValueError)  # a bad source, exit 2 at the command line
