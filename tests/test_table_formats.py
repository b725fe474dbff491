"""Tables in the other shapes Spark writes and Arrow reads: ORC files (a piece per file), decimal
columns, a table without partition folders, and Arrow list views turned into lists."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

from iterreduce.exceptions import ShardError
from shardio.pieces import pieces
from shardio.reading import label_classes, read_piece
from shardio.tables import TableSource, open_dataset, resolve
from test_tables import PARTITIONS, expected_features, read_all, sorted_rows, write_spark_table


# ------------------------------------------------------------------ ORC


def test_orc_tables_are_read_a_file_a_piece(tmp_path):
    def write_orc(table, path):
        unsigned = [name for name in table.column_names if pa.types.is_unsigned_integer(table.schema.field(name).type)]
        orc.write_table(table.drop_columns(unsigned), str(path))  # ORC has no unsigned integers

    files = write_spark_table(tmp_path, write_orc, "snappy.orc", seed=3)
    source = TableSource(str(tmp_path), ["id", "f1", "f5", "emb", "vec", "year"], label="fruit", format="orc",
                         filter="country == 'NL'")
    dataset = open_dataset(source)
    listed = pieces(dataset, source.filter)
    assert [p.path for p in listed] == sorted(path for _, country, path in files if country == "NL")
    assert all(p.row_group is None and p.start == 0 for p in listed)
    nl_sizes = [n for (_, country), sizes in PARTITIONS.items() if country == "NL" for n in sizes]
    assert [p.rows for p in listed] == nl_sizes
    classes = label_classes(source)
    X, y = read_all(source, workers=2, classes=classes)
    expected, labels = expected_features([f for f in files if f[1] == "NL"], list(source.features))
    np.testing.assert_array_equal(sorted_rows(X, y), sorted_rows(expected, classes.encode(labels)))


def test_decimal_columns_as_spark_writes_them_are_features(tmp_path):
    from decimal import Decimal

    price = pa.array([Decimal("12.50"), Decimal("0.01"), Decimal("99999.99")], pa.decimal128(7, 2))
    table = pa.table({"price": price, "qty": pa.array([1, 2, 3], pa.int32()), "label": ["a", "b", "a"]})
    pq.write_table(table, tmp_path / "part-00000.snappy.parquet")
    source = TableSource(str(tmp_path), "*", label="label")
    dataset = open_dataset(source)
    resolved = resolve(source, dataset)
    assert resolved.features == ("price", "qty")
    (piece,) = pieces(dataset)
    X, y = read_piece(resolved, piece, classes=label_classes(resolved, dataset))
    assert X.dtype == np.float32
    np.testing.assert_array_equal(X, np.array([[12.5, 1], [0.01, 2], [99999.99, 3]], np.float32))
    assert y.tolist() == [0, 1, 0]


def test_an_unpartitioned_table_has_no_partition_columns(tmp_path):
    """A table without key=value folders: every column is stored (pyarrow's discovered hive
    partitioning of such a table reports all of them as partition fields)."""
    pq.write_table(pa.table({"x1": [0.5, 1.5], "x2": [2, 3], "y": [1, 0]}), tmp_path / "part-00000.parquet")
    source = TableSource(str(tmp_path), "x*", label="y")
    dataset = open_dataset(source)
    (piece,) = pieces(dataset)
    assert piece.partition == ()
    X, y = read_piece(resolve(source, dataset), piece, classes=label_classes(source, dataset))
    np.testing.assert_array_equal(X, [[0.5, 2], [1.5, 3]])
    assert y.tolist() == [1, 0]
    with pytest.raises(ShardError, match=r"feature column 'name' is string \(in .*part-00001.parquet\)"):
        pq.write_table(pa.table({"name": ["a", "b"], "y": [1, 0]}), tmp_path / "part-00001.parquet")
        resolve(TableSource(str(tmp_path / "part-00001.parquet"), ["name"]),
                open_dataset(TableSource(str(tmp_path / "part-00001.parquet"), ["name"])))


def test_list_views_become_lists_of_the_same_rows_in_any_order_and_with_nulls():
    """pyarrow's cast of a list_view a filter had reordered gave wrong lengths: the lists here are
    rebuilt from the views' lengths and values, nulls kept."""
    from shardio.columns import as_large_list, without_list_views

    views = pa.ListViewArray.from_arrays(pa.array([4, 0, 2, 0], pa.int32()), pa.array([2, 1, 2, 0], pa.int32()),
                                         pa.array([0.0, 1, 2, 3, 4, 5]), mask=pa.array([False, False, False, True]))
    rows = views.to_pylist()
    assert rows == [[4.0, 5.0], [0.0], [2.0, 3.0], None]
    assert as_large_list(views).to_pylist() == rows
    assert as_large_list(views.filter(pa.array([True, False, True, True]))).to_pylist() == [rows[0], rows[2], None]
    table = without_list_views(pa.table({"v": views, "n": [1, 2, 3, 4]}))
    assert pa.types.is_large_list(table.schema.field("v").type) and table.column("v").to_pylist() == rows
