"""Issue 51, class 6 for tables read in place: a Parquet or ORC footer's row counts are checked
before and while a table's rows are read, as a Parquet shard's are (tests/test_footer_trust.py).

- A Parquet footer that disagrees with itself (a file count other than its row groups' sum, a row
  group count other than its columns' value counts) is refused when the table is cut into pieces,
  naming the file and both counts.
- A footer that agrees with itself but claims more rows than the pages hold is refused when the
  piece is read, naming the file, the row group and both counts; a huge claim on a tiny file
  allocates no more than the file holds (pyarrow's dataset reader allocated gigabytes for it).
- An ORC footer's count is checked against the rows its stripes hold; an Iceberg positional delete
  file is read counted too; a job on such a table stops with a one-line error and writes no model.

Each test keeps the crafted files (and an earlier run's model, where a job runs) byte-identical.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

from dbn.cli import main
from iterreduce.exceptions import ShardError
from shardio import iceberg
from shardio.labels import LabelMap
from shardio.pieces import table_pieces
from shardio.reading import label_classes, read_piece
from shardio.table_shard import TableShard
from shardio.tables import TableSource, open_dataset, resolve
from test_bad_data import assert_refused, plant_earlier_model
from test_footer_trust import _encoded_i64, _list_header, _struct_fields, address_space_cap, footer_says

ROWS = 100  # each file's rows
ALTERED = "(a damaged or altered Parquet file: write it again)"


def write_table(root: Path, files: int = 2, fmt: str = "parquet") -> list[Path]:
    """A table folder of ``files`` files of ROWS rows each: features x0..x3, a label of 2 classes."""
    root.mkdir(parents=True)
    rng, paths = np.random.default_rng(0), []
    for k in range(files):
        table = pa.table({**{f"x{i}": rng.random(ROWS) for i in range(4)}, "label": rng.integers(0, 2, ROWS)})
        path = root / f"part-{k:05d}.{fmt}"
        if fmt == "parquet":
            pq.write_table(table, path)
        else:
            orc.write_table(table, path, compression="uncompressed")  # a plain footer to rewrite
        paths.append(path)
    return paths


def read_every_way(root: Path, fmt: str = "parquet") -> None:
    """What a job does with a table: cut it into pieces, gather its classes, read each piece's
    rows and labels (a worker's share)."""
    source = TableSource(str(root), "x*", label="label", format=fmt)
    dataset = open_dataset(source)
    source = resolve(source, dataset)
    pieces = table_pieces(source, dataset)
    classes = label_classes(source, dataset)
    for piece in pieces:
        read_piece(source, piece, classes=classes)
    TableShard(source, tuple(pieces), 4, classes).labels()


def footer_claims(path: Path, rows: int) -> bytes:
    """Rewrite the Parquet file at ``path`` so that its footer says ``rows`` rows consistently: the
    file's count, each row group's (RowGroup field 3) and each column chunk's value count
    (ColumnChunk field 3, ColumnMetaData field 5), all i64. The footer then agrees with itself, and
    only the pages tell. (The compact-protocol walk is tests/test_footer_trust.py's.)"""
    raw = path.read_bytes()
    (length,) = struct.unpack("<I", raw[-8:-4])
    pages, meta = raw[:-8 - length], raw[-8 - length:-8]
    fields, _ = _struct_fields(meta, 0)
    spans = [fields[3][1:]]
    groups, _, pos = _list_header(meta, fields[4][1])
    for _ in range(groups):
        group, pos = _struct_fields(meta, pos)
        spans.append(group[3][1:])
        chunks, _, at = _list_header(meta, group[1][1])
        for _ in range(chunks):
            chunk, at = _struct_fields(meta, at)
            column, _ = _struct_fields(meta, chunk[3][1])
            assert column[5][0] == 6, "ColumnMetaData: field 5 is the i64 count of values"
            spans.append(column[5][1:])
    for start, stop in sorted(spans, reverse=True):  # the last first: earlier spans keep their offsets
        meta = meta[:start] + _encoded_i64(rows) + meta[stop:]
    data = pages + meta + struct.pack("<I", len(meta)) + b"PAR1"
    path.write_bytes(data)
    footer = pq.read_metadata(path)
    assert footer.num_rows == rows and footer.row_group(0).num_rows == rows == footer.row_group(0).column(0).num_values
    return data


# ------------------------------------------------------------------ Parquet


#: (the footer's lie, the error's words after the file's path): a footer that disagrees with itself
SELF_CONTRADICTIONS = {
    "the file's count, more": (lambda p: footer_says(str(p), 2 * ROWS),
                               f"its footer says {2 * ROWS} rows, but its row groups say {ROWS}"),
    "the file's count, fewer": (lambda p: footer_says(str(p), ROWS // 2),
                                f"its footer says {ROWS // 2} rows, but its row groups say {ROWS}"),
    "its row groups too, more": (lambda p: footer_says(str(p), 2 * ROWS, row_groups=True),
                                 f"its footer says {2 * ROWS} rows in row group 0, but its column 'x0' holds "
                                 f"{ROWS} values there"),
    "its row groups too, fewer": (lambda p: footer_says(str(p), ROWS // 2, row_groups=True),
                                  f"its footer says {ROWS // 2} rows in row group 0, but its column 'x0' holds "
                                  f"{ROWS} values there"),
}


@pytest.mark.parametrize("lie", SELF_CONTRADICTIONS)
def test_a_parquet_footer_that_disagrees_with_itself_is_refused_naming_the_file_and_both_counts(tmp_path, lie):
    """Of old, more rows read the file's real rows and balanced the work by the lie; fewer, in
    the row groups, left rows out without a word."""
    _, bad = write_table(tmp_path / "table")
    rewrite, words = SELF_CONTRADICTIONS[lie]
    data = rewrite(bad)
    with pytest.raises(ShardError) as error:
        read_every_way(tmp_path / "table")
    assert str(error.value) == f"{bad}: {words} {ALTERED}"
    assert bad.read_bytes() == data


def test_a_parquet_footer_claiming_more_rows_than_its_pages_is_an_error_naming_both_counts(tmp_path):
    """The footer agrees with itself: only the rows read tell, for each way a job reads them."""
    _, bad = write_table(tmp_path / "table")
    data = footer_claims(bad, 2 * ROWS)
    source = TableSource(str(tmp_path / "table"), "x*", label="label")
    dataset = open_dataset(source)
    source = resolve(source, dataset)
    pieces = table_pieces(source, dataset)
    assert [p.rows for p in pieces] == [ROWS, 2 * ROWS]  # only reading can tell
    message = f"{bad}: its footer says {2 * ROWS} rows in row group 0, but the row group holds {ROWS} {ALTERED}"
    with pytest.raises(ShardError) as error:
        label_classes(source, dataset)
    assert str(error.value) == message
    for read in (lambda: read_piece(source, pieces[1], classes=LabelMap((0, 1))),
                 lambda: TableShard(source, (pieces[1],), 4, LabelMap((0, 1))).labels(),
                 lambda: list(TableShard(source, tuple(pieces), 4, LabelMap((0, 1))).blocks(4, True))):
        with pytest.raises(ShardError) as error:
            read()
        assert str(error.value) == message
    assert bad.read_bytes() == data


#: A child that reads each crafted table the way a job does and reports, as JSON lines, the error
#: and the most memory pyarrow's pool and NumPy allocated. Its address space is capped, so that the
#: reader of old could not take the machine's memory (it was refused an allocation instead).
MEASURE = """
import json, resource, sys, tracemalloc
from pathlib import Path
import pyarrow as pa
sys.path.insert(0, sys.argv[2])
from test_table_footer_trust import read_every_way
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
cap = int(sys.argv[1]) if hard == resource.RLIM_INFINITY else min(int(sys.argv[1]), hard)
resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
tracemalloc.start()
for root, fmt in zip(sys.argv[3::2], sys.argv[4::2]):
    tracemalloc.reset_peak()
    try:
        read_every_way(Path(root), fmt)
        error = None
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"root": root, "error": error, "numpy": tracemalloc.get_traced_memory()[1],
                      "arrow": pa.default_memory_pool().max_memory()}), flush=True)
"""


def test_a_huge_row_count_on_a_tiny_table_file_allocates_no_more_than_the_file_holds(tmp_path):
    """Footers claiming 10^8 rows (pyarrow's dataset reader of old allocated 2.7 GB for them) and
    10^12 (more than the machine's memory: the process was killed), consistent in themselves,
    in Parquet; and ORC stripes claiming them."""
    tables, kept, expected = [], {}, {}
    for claimed in (10**8, 10**12):
        for fmt in ("parquet", "orc"):
            root = tmp_path / f"{fmt}-{claimed}"
            _, bad = write_table(root, fmt=fmt)
            kept[bad] = footer_claims(bad, claimed) if fmt == "parquet" else orc_says(bad, claimed)
            tables += [str(root), fmt]
            expected[str(root)] = (f"ShardError: {bad}: its footer says {claimed} rows in row group 0, but the row "
                                   f"group holds {ROWS} " if fmt == "parquet" else f"ShardError: {bad}: ")
    bound = 64 * max(map(len, kept.values())) + (16 << 20)  # what a file of its size could hold, read buffers
    child = subprocess.run([sys.executable, "-c", MEASURE, str(address_space_cap()), str(Path(__file__).parent),
                            *tables], capture_output=True, text=True, timeout=120)
    results = [json.loads(line) for line in child.stdout.splitlines()]
    assert len(results) == len(expected), child.stderr
    for result in results:
        assert (result["error"] or "").startswith(expected[result["root"]]), result
        assert result["numpy"] < bound and result["arrow"] < bound, (result, bound)
    for path, data in kept.items():
        assert path.read_bytes() == data


# ------------------------------------------------------------------ ORC


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value, shift, pos = value | (byte & 0x7F) << shift, shift + 7, pos + 1
        if not byte & 0x80:
            return value, pos


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _protobuf_fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """``[(field number, wire type, the value's bytes)]`` of a protobuf message (varints and
    length-delimited values, as ORC's footer and postscript hold; fixed ones skipped whole)."""
    fields, pos = [], 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            end = _varint(data, pos)[1]
        elif wire == 2:
            size, pos = _varint(data, pos)
            end = pos + size
        else:
            end = pos + {1: 8, 5: 4}[wire]
        fields.append((number, wire, data[pos:end]))
        pos = end
    return fields


def _protobuf(fields: list[tuple[int, int, bytes]]) -> bytes:
    return b"".join(_uvarint(number << 3 | wire) + (_uvarint(len(value)) if wire == 2 else b"") + value
                    for number, wire, value in fields)


def orc_says(path: Path, rows: int, stripes: bool = True) -> bytes:
    """Rewrite the uncompressed ORC file at ``path`` so that its footer says ``rows`` rows
    (Footer field 6) and, with ``stripes``, each stripe too (StripeInformation field 5). An ORC
    file ends with its footer, its postscript (whose field 1 is the footer's length, 2 the
    compression) and the postscript's length, one byte."""
    raw = path.read_bytes()
    postscript = _protobuf_fields(raw[-1 - raw[-1]:-1])
    said = {number: value for number, _, value in postscript}
    assert said[2] == b"\x00", "an uncompressed footer"
    footer_end = len(raw) - 1 - raw[-1]
    footer_start = footer_end - _varint(said[1], 0)[0]
    footer = []
    for number, wire, value in _protobuf_fields(raw[footer_start:footer_end]):
        if number == 6:
            value = _uvarint(rows)
        elif number == 3 and stripes:
            value = _protobuf([(n, w, _uvarint(rows) if n == 5 else v) for n, w, v in _protobuf_fields(value)])
        footer.append((number, wire, value))
    footer = _protobuf(footer)
    postscript = _protobuf([(n, w, _uvarint(len(footer)) if n == 1 else v) for n, w, v in postscript])
    data = raw[:footer_start] + footer + postscript + bytes([len(postscript)])
    path.write_bytes(data)
    assert orc.ORCFile(str(path)).nrows == rows
    return data


@pytest.mark.parametrize("claimed", [2 * ROWS, ROWS // 2])
def test_an_orc_footer_whose_count_its_stripes_do_not_hold_is_an_error_naming_both_counts(tmp_path, claimed):
    """Of old, the work was balanced by the footer's count and the stripes' rows read silently."""
    _, bad = write_table(tmp_path / "table", fmt="orc")
    data = orc_says(bad, claimed, stripes=False)
    with pytest.raises(ShardError) as error:
        read_every_way(tmp_path / "table", "orc")
    assert str(error.value) == f"{bad}: its footer says {claimed} rows, but the file holds {ROWS} {ALTERED}"
    assert bad.read_bytes() == data


def test_orc_stripes_claiming_more_rows_than_they_hold_are_an_error_naming_the_file(tmp_path):
    """pyarrow's ORC reader itself refuses to read past a stripe's data: the error names the file."""
    _, bad = write_table(tmp_path / "table", fmt="orc")
    data = orc_says(bad, 2 * ROWS)
    with pytest.raises(ShardError, match="^" + str(bad).replace(".", r"\.") + ": cannot read"):
        read_every_way(tmp_path / "table", "orc")
    assert bad.read_bytes() == data


# ------------------------------------------------------------------ Iceberg positional delete files


def test_an_iceberg_delete_file_whose_footer_lies_is_an_error_naming_both_counts(tmp_path, monkeypatch):
    """The delete files of a snapshot as pyiceberg would plan them (no writer here makes positional
    deletes: Spark does, tests/test_spark_tables.py); one claims twice its rows. Of old it was read
    whole by pq.read_table, which believed the footer."""
    from pyiceberg.manifest import DataFileContent, FileFormat

    data_file = f"file://{tmp_path}/data/a.parquet"
    deletes = tmp_path / "data" / "deletes.parquet"
    deletes.parent.mkdir()
    pq.write_table(pa.table({"file_path": [data_file] * ROWS, "pos": np.arange(ROWS, dtype=np.int64)}), deletes)
    data = footer_claims(deletes, 2 * ROWS)
    delete = SimpleNamespace(file_path=f"file://{deletes}", content=DataFileContent.POSITION_DELETES,
                             file_format=FileFormat.PARQUET)
    task = SimpleNamespace(file=SimpleNamespace(file_path=data_file), delete_files=[delete])
    monkeypatch.setattr(iceberg, "load", lambda uri, version, allow_outside: (None, None))
    monkeypatch.setattr(iceberg, "_tasks", lambda uri, table, snapshot: [task])
    monkeypatch.setattr(iceberg, "_paths", lambda locations, *args: [loc.removeprefix("file://") for loc in locations])
    iceberg.deleted_rows.cache_clear()
    with pytest.raises(ShardError) as error:
        iceberg.deleted_rows(str(tmp_path), 7)
    assert str(error.value) == (f"{deletes}: its footer says {2 * ROWS} rows in row group 0, but the row group "
                                f"holds {ROWS} {ALTERED}")
    assert deletes.read_bytes() == data
    pq.write_table(pa.table({"file_path": [data_file] * 3, "pos": np.array([5, 1, 5], np.int64)}), deletes)
    iceberg.deleted_rows.cache_clear()
    found = iceberg.deleted_rows(str(tmp_path), 7)  # an honest one: its rows, as before
    iceberg.deleted_rows.cache_clear()
    assert list(found) == [f"{tmp_path}/data/a.parquet"] and found[f"{tmp_path}/data/a.parquet"].tolist() == [1, 5]


# ------------------------------------------------------------------ a job


@pytest.mark.parametrize("rewrite", ["consistent", "self-contradicting"])
def test_a_table_with_a_lying_footer_stops_a_job_before_it_trains(tmp_path, capsys, rewrite):
    """The issue's case, for a table: a footer saying twice the rows. Of old the job trained on."""
    _, bad = write_table(tmp_path / "table")
    if rewrite == "consistent":
        data = footer_claims(bad, 2 * ROWS)
    else:
        data = footer_says(str(bad), 2 * ROWS, row_groups=True)
    out = tmp_path / "out"
    out.mkdir()
    plant_earlier_model(out)
    job = tmp_path / "job.toml"
    job.write_text(f"[data]\ntrain = '{tmp_path / 'table'}'\nfeatures = 'x*'\nlabel = 'label'\n"
                   "[model]\nhidden_layers = [4]\npretrain_epochs = 1\nfinetune_epochs = 1\n"
                   "pretrain_batch_size = 20\nfinetune_batch_size = 20\n"
                   f"[output]\ndir = '{out}'\n[job]\ndevice = 'cpu'\n")
    code = main(["train", str(job), "--overwrite", "--quiet", "--no-ui"])
    held = f"the row group holds {ROWS}" if rewrite == "consistent" else f"its column 'x0' holds {ROWS} values there"
    counts = f"its footer says {2 * ROWS} rows in row group 0, but {held}"
    assert_refused(capsys, code, out, f"{bad}: {counts}")
    assert bad.read_bytes() == data


def test_honest_tables_read_every_way(tmp_path):
    """The same readers on honest files, of several row groups, and a filter: every row, as stored."""
    root = tmp_path / "table"
    root.mkdir()
    rng = np.random.default_rng(1)
    X = rng.random((250, 3))
    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "label": np.arange(250) % 3}),
                   root / "part-0.parquet", row_group_size=60)
    source = TableSource(str(root), ["a", "b", "c"], label="label", filter="a >= 0")
    dataset = open_dataset(source)
    source = resolve(source, dataset)
    pieces = table_pieces(source, dataset)
    assert [p.rows for p in pieces] == [60, 60, 60, 60, 10]
    classes = label_classes(source, dataset)
    features, labels = TableShard(source, tuple(pieces), 3, classes).read(3, True)
    np.testing.assert_array_equal(features, X.astype(np.float32))
    np.testing.assert_array_equal(labels, np.arange(250) % 3)
    write_table(tmp_path / "orc", fmt="orc")
    read_every_way(tmp_path / "orc", "orc")  # raises on any fault
