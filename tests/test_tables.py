"""Tables as Spark writes them (hive partition folders, part files, side files), read in place:
the source, column resolution, filters, pieces and their assignment, reading. The table helpers
here (spark_table, write_spark_table, read_all, ...) serve test_table_values.py (bad values named,
labels, statistics) and test_table_formats.py (ORC, decimals, unpartitioned tables, list views)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

from iterreduce.exceptions import ShardError
from iterreduce.exceptions import TableError
from shardio.filters import filter_columns, parse_filter
from shardio.pieces import Piece, assign, pieces
from shardio.reading import label_classes, read_piece
from shardio.tables import TableSource, open_dataset, resolve

# Spark ML's VectorUDT as Spark stores it in Parquet.
VECTOR = pa.struct([pa.field("type", pa.int8(), nullable=False), pa.field("size", pa.int32()),
                    pa.field("indices", pa.list_(pa.field("element", pa.int32(), nullable=False))),
                    pa.field("values", pa.list_(pa.field("element", pa.float64(), nullable=False)))])
VECTOR_WIDTH, EMB_WIDTH, ROW_GROUP = 5, 4, 16
FRUITS = ["cherry", "apple", "banana"]
SCALARS = ["f0", "f1", "f2", "f3", "f4", "f5", "f6"]
#: (year, country) -> rows of each part file
PARTITIONS = {(2023, "NL"): [40, 25], (2023, "DE"): [33], (2024, "NL"): [50, 7, 19]}
JOB_UUID = "2a3f7c1e-5b6d-4e8f-9a0b-1c2d3e4f5a6b"


def spark_vector(rng) -> dict:
    """A random Spark ML vector of VECTOR_WIDTH entries, dense or sparse (half each)."""
    if rng.random() < 0.5:
        return {"type": 1, "size": None, "indices": None, "values": rng.standard_normal(VECTOR_WIDTH).tolist()}
    nonzero = sorted(rng.choice(VECTOR_WIDTH, size=int(rng.integers(0, VECTOR_WIDTH)), replace=False).tolist())
    return {"type": 0, "size": VECTOR_WIDTH, "indices": nonzero, "values": rng.standard_normal(len(nonzero)).tolist()}


def dense(vector: dict) -> list[float]:
    """What a Spark ML vector stands for, decoded plainly (the test's own decoder)."""
    if vector["type"] == 1:
        return vector["values"]
    row = [0.0] * vector["size"]
    for i, v in zip(vector["indices"], vector["values"]):
        row[i] = v
    return row


def spark_rows(rng, first_id: int, n: int) -> pa.Table:
    """Rows with every kind of column: numbers of mixed types, a string, a list, a vector, a label."""
    return pa.table({
        "id": pa.array(np.arange(first_id, first_id + n), pa.int64()),
        "f0": pa.array(rng.integers(-100, 100, n), pa.int8()),
        "f1": pa.array(rng.integers(-10**6, 10**6, n), pa.int32()),
        "f2": pa.array(rng.integers(0, 2**40, n), pa.int64()),
        "fruit": pa.array(rng.choice(FRUITS, n)),  # the label, amid the features: a glob 'f*' must skip it
        "f3": pa.array(rng.standard_normal(n).astype(np.float32)),
        "f4": pa.array(rng.standard_normal(n) * 1e3),
        "f5": pa.array(rng.random(n) < 0.5),
        "f6": pa.array(rng.integers(0, 2**16, n), pa.uint16()),
        "name": pa.array([f"row {i}" for i in range(first_id, first_id + n)]),
        "emb": pa.array(rng.standard_normal((n, EMB_WIDTH)).astype(np.float32).tolist(), pa.list_(pa.float32())),
        "vec": pa.array([spark_vector(rng) for _ in range(n)], VECTOR),
    })


def part_name(k: int, suffix: str = "snappy.parquet") -> str:
    return f"part-{k:05d}-{JOB_UUID}-c000.{suffix}"


def write_spark_table(root: Path, write, suffix: str, partitions=PARTITIONS, seed: int = 0) -> list[tuple]:
    """A table laid out as Spark writes it: ``year=/country=`` folders of part files, each with
    its Hadoop ``.crc`` file, ``_SUCCESS`` and commit markers, and an unfinished attempt under
    ``_temporary/`` (of another schema). Returns ``(year, country, path)`` of each data file."""
    rng, files, next_id, k = np.random.default_rng(seed), [], 0, 0
    for (year, country), sizes in partitions.items():
        folder = root / f"year={year}" / f"country={country}"
        folder.mkdir(parents=True)
        for n in sizes:
            path = folder / part_name(k, suffix)
            write(spark_rows(rng, next_id, n), path)
            (folder / f".{path.name}.crc").write_bytes(b"crc\x00\x01")
            files.append((year, country, str(path)))
            next_id, k = next_id + n, k + 1
    (root / "_SUCCESS").touch()
    (root / "_committed_8061532841").write_text('{"added": []}')
    (root / "_started_8061532841").touch()
    attempt = root / "_temporary" / "0" / "_temporary" / "attempt_202401011200_0001_m_000000_0"
    attempt.mkdir(parents=True)
    write(pa.table({"other": [1, 2, 3]}), attempt / part_name(99, suffix))
    return files


def write_parquet(table: pa.Table, path: Path) -> None:
    pq.write_table(table, str(path), row_group_size=ROW_GROUP, compression="snappy")


@pytest.fixture(scope="module")
def spark_table(tmp_path_factory):
    root = tmp_path_factory.mktemp("events")
    return str(root), write_spark_table(root, write_parquet, "snappy.parquet")


def expected_features(files, features: list[str], keep=lambda year, country, table: None):
    """Feature rows and labels as this test decodes them from what pyarrow reads of each file;
    ``keep`` gives a mask of the rows to keep (None: all)."""
    blocks, labels = [], []
    for year, country, path in files:
        table = pq.read_table(path) if path.endswith("parquet") else orc.read_table(path)
        mask = keep(year, country, table)
        mask = np.ones(table.num_rows, bool) if mask is None else mask
        columns = []
        for name in features:
            if name == "year":
                columns.append(np.full((table.num_rows, 1), year, np.float32))
            elif name == "emb":
                columns.append(np.array(table.column(name).to_pylist(), np.float32))
            elif name == "vec":
                columns.append(np.array([dense(v) for v in table.column(name).to_pylist()], np.float32))
            else:
                columns.append(np.array(table.column(name).to_pylist(), np.float64).astype(np.float32)[:, None])
        blocks.append(np.hstack(columns)[mask])
        labels += [fruit for fruit, kept in zip(table.column("fruit").to_pylist(), mask) if kept]
    return np.concatenate(blocks), np.array(labels)


def read_all(source: TableSource, workers: int = 3, classes=None):
    """Every row, read piece by piece by each of ``workers`` in turn, as one matrix and labels."""
    dataset = open_dataset(source)
    source = resolve(source, dataset)
    blocks, labels = [], []
    for mine in assign(pieces(dataset, source.filter), workers):
        for piece in mine:
            X, y = read_piece(source, piece, classes=classes)
            assert X.dtype == np.float32 and X.ndim == 2
            blocks.append(X)
            labels.append(y)
    return np.concatenate(blocks), (np.concatenate(labels) if classes is not None else None)


def sorted_rows(X: np.ndarray, labels=None) -> np.ndarray:
    """The rows of X (with the labels as a last column) in lexicographic order: a multiset."""
    if labels is not None:
        X = np.column_stack([X.astype(np.float64), labels])
    return X[np.lexsort(X.T[::-1])]


# ------------------------------------------------------------------ the source


def test_source_round_trips_through_a_dict():
    d = {"uri": "hdfs://nn:8020/warehouse/events", "features": ["f0", "f1"], "label": "fruit",
         "format": "orc", "filter": "year >= 2020 and country == 'NL'", "version": None, "stored_names": []}
    source = TableSource.from_dict(d)
    assert source.features == ("f0", "f1")
    assert source.to_dict() == d
    assert TableSource.from_dict(json.loads(json.dumps(source.to_dict()))) == source
    delta = {**d, "format": "delta", "version": 7}  # a pinned Delta table's version travels with its pieces
    assert TableSource.from_dict(json.loads(json.dumps(TableSource.from_dict(delta).to_dict()))).version == 7
    glob = TableSource.from_dict({"uri": "/t", "features": "pixel_*"})
    assert (glob.label, glob.format, glob.filter) == (None, "parquet", None)


@pytest.mark.parametrize("d, words", [
    ({"uri": "/t", "features": "x", "lable": "y"}, ["unknown key 'lable'"]),
    ({"features": "x"}, ["missing key 'uri'"]),
    ({"uri": "/t"}, ["missing key 'features'"]),
    ({"uri": "", "features": "x"}, ["'uri'"]),
    ({"uri": "/t", "features": "x", "format": "csv"}, ["'format'", "'csv'"]),
    ({"uri": "/t", "features": []}, ["'features'"]),
    ({"uri": "/t", "features": ["a", ""]}, ["'features'"]),
    ({"uri": "/t", "features": ["a", "b", "a"]}, ["'features'", "'a' twice"]),
    ({"uri": "/t", "features": 3}, ["'features'"]),
    ({"uri": "/t", "features": ["a", "y"], "label": "y"}, ["'y'", "'label'"]),
    ({"uri": "/t", "features": "x", "filter": "year >"}, ["filter 'year >'"]),
    ({"uri": "/t", "features": "x", "filter": 2020}, ["'filter'"]),
    ("uri=/t", ["mapping"]),
])
def test_source_refuses_bad_keys_naming_them(d, words):
    with pytest.raises(TableError) as err:
        TableSource.from_dict(d)
    for word in words:
        assert word in str(err.value)


# ------------------------------------------------------------------ filters


def test_filters_select_the_rows_python_would():
    table = pa.table({"year": pa.array([2019, 2020, 2021, 2022, 2023], pa.int32()),
                      "country": ["NL", "DE", "NL", "FR", "NL"],
                      "day": ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-01", "2024-01-05"],
                      "temp": [-7.5, -1.0, 0.0, 3.5, 12.0]})
    rows = table.to_pylist()
    cases = {
        "year >= 2020 and country == 'NL'": lambda r: r["year"] >= 2020 and r["country"] == "NL",
        "day in ('2024-01-01', '2024-01-02')": lambda r: r["day"] in ("2024-01-01", "2024-01-02"),
        "country not in ['NL', 'FR']": lambda r: r["country"] not in ("NL", "FR"),
        "not (year < 2021) or temp <= -5": lambda r: not r["year"] < 2021 or r["temp"] <= -5,
        "2020 <= year < 2023": lambda r: 2020 <= r["year"] < 2023,
        "temp > -1.5 and country != 'DE'": lambda r: r["temp"] > -1.5 and r["country"] != "DE",
        "  year == 2019 or year == 2023  ": lambda r: r["year"] in (2019, 2023),
    }
    for text, keep in cases.items():
        got = table.filter(parse_filter(text)).to_pylist()
        assert got == [r for r in rows if keep(r)], text
        assert 0 < len(got) < len(rows), text  # each case tells rows apart
    assert filter_columns("year >= 2020 and (country == 'NL' or year < 1990)") == ["year", "country"]


@pytest.mark.parametrize("text, part", [
    ("__import__('os').system('rm -rf /')", "__import__('os').system('rm -rf /')"),
    ("year >= f(2)", "f(2)"),
    ("country.lower() == 'nl'", "country.lower()"),
    ("year + 1 > 2020", "year + 1"),
    ("year", "year"),
    ("year is 2020", "2020"),      # 'is' takes None alone: a missing value
    ("None is year", "None"),
    ("`m 3 > 0", "an unclosed `column name` at character 1"),
    ("`` > 0", "an empty `column name` at character 1"),
    ("`m 3`.lower() == 'x'", "`m 3`.lower()"),  # the part named as written, backticks and all
    ("country == None", "None"),
    ("year in range(3)", "range(3)"),
    ("year in (a, 1)", "a"),
    ("year in ('2020', 2021)", "('2020', 2021)"),
    ("year in ()", "()"),
    ("lambda: 1", "lambda: 1"),
    ("year >= 2020 and", "not an expression"),
    ("[x for x in y]", "[x for x in y]"),
])
def test_filters_refuse_anything_else_naming_the_part(text, part):
    with pytest.raises(TableError) as err:
        parse_filter(text)
    message = str(err.value)
    assert repr(text.strip()) in message and part in message


def test_filters_take_quoted_column_names_and_missing_values():
    """A column name that is not a Python name goes in backticks (as in pandas' query); 'is None'
    and 'is not None' test for a missing value: a null, or NaN in a float column."""
    table = pa.table({"m 3": [1.0, None, float("nan"), -2.0], "if": ["a", None, "b", "c"],
                      "n": pa.array([1, None, 3, 4], pa.int64())})
    cases = {
        "`m 3` is not None": [0, 3],
        "`m 3` is None": [1, 2],
        "`m 3` > 0 or `if` is None": [0, 1],
        "`if` in ('a', 'c') and n is not None": [0, 3],
        "not (n is None) and `m 3` is not None": [0, 3],
        "`if` == 'it`s'": [],  # a backtick inside a string literal is a character of the string
    }
    indexed = table.append_column("i", pa.array(range(4)))
    for text, rows in cases.items():
        assert indexed.filter(parse_filter(text)).column("i").to_pylist() == rows, text
    assert filter_columns("`m 3` > 0 and `if` is None and `m 3` < 9") == ["m 3", "if"]


def test_features_mix_names_and_globs_in_the_tables_order_of_columns(tmp_path):
    table = pa.table({"b 1": [1.0], "a[1]": [2.0], "b 0": [3.0], "label": [0], "b_label": [4], "age": [5]})
    write_parquet(table, tmp_path / part_name(0))
    root = str(tmp_path)
    dataset = open_dataset(TableSource(root, "age"))

    def resolved(features, label="label"):
        return list(resolve(TableSource(root, features, label=label), dataset).features)

    assert resolved(["b *", "age"]) == ["b 1", "b 0", "age"]          # a glob in a list, in stored order
    assert resolved(["age", "b*"]) == ["age", "b 1", "b 0", "b_label"]
    assert resolved(["b 0", "b *"]) == ["b 0", "b 1"]                 # a column an entry named before: once
    assert resolved("*", label="b_label") == ["b 1", "a[1]", "b 0", "label", "age"]  # never the label
    assert resolved(["a[1]"]) == ["a[1]"]                              # a column's own name, glob characters and all
    assert resolved("a[1]") == ["a[1]"]
    with pytest.raises(ShardError, match="no column matches features = 'c\\*'"):
        resolved(["age", "c*"])
    X, _ = read_piece(TableSource(root, ["b *", "age"]), pieces(dataset)[0])
    np.testing.assert_array_equal(X, [[1.0, 3.0, 5.0]])


# ------------------------------------------------------------------ opening, pieces, assignment


def test_side_files_are_not_data(spark_table):
    root, files = spark_table
    dataset = open_dataset(TableSource(root, "f*"))
    assert sorted(dataset.files) == sorted(path for _, _, path in files)
    assert dataset.schema.names[-2:] == ["year", "country"]  # the partition folders
    listed = pieces(dataset)
    assert all("/_" not in p.path and "/." not in p.path for p in listed)


def test_pieces_are_the_row_groups_in_order(spark_table):
    root, files = spark_table
    listed = pieces(open_dataset(TableSource(root, "f*")))
    assert listed == pieces(open_dataset(TableSource(root, "f*")))  # deterministic
    assert [(p.path, p.row_group) for p in listed] == sorted((p.path, p.row_group) for p in listed)
    expected = []
    for year, country, path in sorted(files, key=lambda f: f[2]):
        meta, start = pq.ParquetFile(path).metadata, 0
        for g in range(meta.num_row_groups):
            rows = meta.row_group(g).num_rows
            expected.append(Piece(path, g, start, rows, (("year", "int32", year), ("country", "string", country))))
            start += rows
    assert listed == expected
    assert sum(p.rows for p in listed) == sum(sum(sizes) for sizes in PARTITIONS.values())
    assert len({p.rows for p in listed}) > 2  # row groups of several sizes, for the balance test
    for p in listed:  # plain data: through JSON and back
        assert Piece.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def fake_pieces(rows: list[int]) -> list[Piece]:
    return [Piece(f"/t/part-{i:05d}.parquet", 0, 0, n) for i, n in enumerate(rows)]


def test_assign_is_longest_first_to_the_least_loaded():
    # 7 -> w0, 5 -> w1, 4 -> w1 (9), 3 -> w0 (10), 3 -> w1 (12), 2 -> w0 (12)
    listed = fake_pieces([3, 7, 2, 5, 4, 3])
    got = assign(listed, 2)
    assert [[p.rows for p in mine] for mine in got] == [[3, 7, 2], [5, 4, 3]]  # each in listing order
    assert [sum(p.rows for p in mine) for mine in got] == [12, 12]
    assert [sum(p.rows for p in mine) for mine in assign(fake_pieces([10] * 4), 2)] == [20, 20]
    assert assign(fake_pieces([5, 1]), 3)[2] == []
    for workers in (0, -1, 1.5):
        with pytest.raises(TableError):
            assign(listed, workers)


def test_assign_with_homes_keeps_each_workers_pieces_on_one_host_where_the_replicas_allow():
    from shardio.pieces import worker_hosts

    # Six files of one block, two replicas each, over three nodes (as HDFS spreads them).
    homes = [{"a": 10, "b": 10}, {"b": 10, "c": 10}, {"a": 10, "c": 10}, {"a": 10, "b": 10}, {"b": 10, "c": 10},
             {"a": 10, "c": 10}]
    listed = fake_pieces([10] * 6)
    assert worker_hosts(homes, 3) == ["a", "b", "c"]
    got = assign(listed, 3, homes)
    assert [sum(p.rows for p in mine) for mine in got] == [20, 20, 20]
    for host, mine in zip("abc", got):
        assert all(homes[listed.index(p)].get(host) for p in mine), (host, mine)  # every byte local
    assert assign(listed, 3, [{}] * 6) == assign(listed, 3)  # nothing known: by rows alone
    assert worker_hosts([{"a": 25, "b": 10}], 3) == ["a", "a", "b"]  # bytes per worker: a 25, 12.5, 8.3; b 10


@pytest.mark.parametrize("workers", [1, 2, 3, 7])
def test_assign_with_homes_keeps_the_balance_bound(workers):
    rng = np.random.default_rng(workers)
    listed = fake_pieces(rng.integers(1, 1000, 40).tolist())
    hosts = ["h1", "h2", "h3", "h4"]
    homes = [{h: int(rng.integers(1, 100)) for h in rng.choice(hosts, 2, replace=False)} for _ in listed]
    got = assign(listed, workers, homes)
    assert got == assign(list(listed), workers, homes)
    assert sorted(p.path for mine in got for p in mine) == sorted(p.path for p in listed)
    mean = sum(p.rows for p in listed) / workers
    assert max(sum(p.rows for p in mine) for mine in got) <= mean + max(p.rows for p in listed)


@pytest.mark.parametrize("workers", [1, 2, 3, 4, 7, 40])
def test_assign_balances_rows_deterministically(spark_table, workers):
    root, _ = spark_table
    rng = np.random.default_rng(workers)
    for listed in (pieces(open_dataset(TableSource(root, "f*"))), fake_pieces(rng.integers(1, 1000, 57).tolist())):
        got = assign(listed, workers)
        assert got == assign(list(listed), workers)
        assert len(got) == workers
        keys = sorted((p.path, p.row_group) for mine in got for p in mine)
        assert keys == sorted((p.path, p.row_group) for p in listed)  # each piece once
        loads = [sum(p.rows for p in mine) for mine in got]
        mean = sum(p.rows for p in listed) / workers
        assert max(loads) <= mean + max(p.rows for p in listed)
        assert all(mine == sorted(mine, key=listed.index) for mine in got)


# ------------------------------------------------------------------ resolving and reading

SPECS = {
    "list of scalars": ["id", *SCALARS],
    "glob": "f*",
    "array": "emb",
    "vector": "vec",
    "mixed, with a partition column": ["year", "f3", "emb", "vec"],
}


@pytest.mark.parametrize("spec", SPECS)
def test_all_pieces_of_all_workers_are_the_whole_table(spark_table, spec):
    root, files = spark_table
    source = TableSource(root, SPECS[spec], label="fruit")
    classes = label_classes(source)
    X, y = read_all(source, workers=3, classes=classes)
    columns = list(resolve(source, open_dataset(source)).features)
    expected, labels = expected_features(files, columns)
    assert X.shape == expected.shape
    np.testing.assert_array_equal(sorted_rows(X, y), sorted_rows(expected, classes.encode(labels)))
    assert sorted(classes.decode(y).tolist()) == sorted(labels.tolist())


def test_columns_resolve_in_schema_order(spark_table):
    root, _ = spark_table
    dataset = open_dataset(TableSource(root, "f*"))
    assert resolve(TableSource(root, "f*", label="fruit"), dataset).features == tuple(SCALARS)
    with pytest.raises(ShardError, match="feature column 'fruit' is string"):  # not the label: a feature
        resolve(TableSource(root, "f*"), dataset)
    assert resolve(TableSource(root, "f[0-2]"), dataset).features == ("f0", "f1", "f2")
    assert resolve(TableSource(root, "emb"), dataset).features == ("emb",)
    assert resolve(TableSource(root, ["vec", "f1"]), dataset).features == ("vec", "f1")
    piece = pieces(dataset)[0]
    assert read_piece(TableSource(root, "emb"), piece)[0].shape == (piece.rows, EMB_WIDTH)
    assert read_piece(TableSource(root, "vec"), piece)[0].shape == (piece.rows, VECTOR_WIDTH)
    assert read_piece(TableSource(root, "f[0-6]"), piece, n_features=7)[1] is None


@pytest.mark.parametrize("source, words", [
    (dict(features=["id", "f_3"]), ["no column 'f_3'", "did you mean 'f3'"]),
    (dict(features="f0", label="fruits"), ["no column 'fruits'", "'fruit'"]),
    (dict(features="zzz"), ["no column 'zzz'", "columns: id, f0"]),
    (dict(features="pixel_*"), ["no column matches features = 'pixel_*'"]),
    (dict(features="f[0-6]", filter="cuntry == 'NL'"), ["no column 'cuntry'", "'country'"]),
    (dict(features="f[0-6]", filter="country > 3"), ["filter 'country > 3'", "country is string"]),
    (dict(features="f[0-6]", label="f4"), ["label column 'f4' is double", "integers, strings or booleans"]),
])
def test_resolve_names_what_is_missing_or_wrong(spark_table, source, words):
    root, _ = spark_table
    with pytest.raises(ShardError) as err:
        resolve(TableSource(root, **source), open_dataset(TableSource(root, "f*")))
    assert root in str(err.value)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("column, type_name", [("name", "string"), ("country", "string")])
def test_a_non_numeric_feature_names_its_type_and_where_it_is(spark_table, column, type_name):
    root, files = spark_table
    with pytest.raises(ShardError) as err:
        resolve(TableSource(root, ["f0", column]), open_dataset(TableSource(root, "f*")))
    message = str(err.value)
    assert f"feature column '{column}' is {type_name}" in message
    assert "a column of categories; encode it as numbers first" in message
    if column == "name":
        assert any(path in message for _, _, path in files)  # the file it is in
    else:
        assert "partition column" in message


def test_a_missing_table_and_one_of_side_files_only(tmp_path):
    with pytest.raises(ShardError, match="no such file or directory"):
        open_dataset(TableSource(str(tmp_path / "nope"), "x"))
    (tmp_path / "_SUCCESS").touch()
    (tmp_path / ".part-00000.crc").touch()
    with pytest.raises(ShardError, match="no data files"):
        open_dataset(TableSource(str(tmp_path), "x"))


FILTERS = {
    "year >= 2024 or country == 'DE'": lambda year, country, t: None if year >= 2024 or country == "DE"
    else np.zeros(t.num_rows, bool),
    "country in ('NL',) and not year == 2023": lambda year, country, t: None if country == "NL" and year != 2023
    else np.zeros(t.num_rows, bool),
    "f0 > 0 and country != 'DE'": lambda year, country, t: (np.asarray(t.column("f0")) > 0) & (country != "DE"),
}


@pytest.mark.parametrize("text", FILTERS)
def test_filters_keep_only_their_rows(spark_table, text):
    root, files = spark_table
    source = TableSource(root, ["id", "f0", "year"], label="fruit", filter=text)
    classes = label_classes(source)
    X, y = read_all(source, workers=2, classes=classes)
    expected, labels = expected_features(files, ["id", "f0", "year"], FILTERS[text])
    assert 0 < len(expected) < sum(sum(s) for s in PARTITIONS.values())
    np.testing.assert_array_equal(sorted_rows(X, y), sorted_rows(expected, classes.encode(labels)))
    listed = pieces(open_dataset(source), text)
    if not text.startswith("f0"):  # a filter on partitions leaves out whole files
        assert {p.path for p in listed} == {path for year, country, path in files
                                            if FILTERS[text](year, country, pa.table({"x": [1]})) is None}


def test_a_filter_is_parsed_once_however_many_places_read_it(spark_table, monkeypatch):
    """The source, its check against the table's schema, the pieces it keeps and each piece's rows
    all take the one parse of the filter's text (shardio.filters.row_filter)."""
    from shardio import filters

    parsed = []
    parse = filters.FilterParser.parse
    monkeypatch.setattr(filters.FilterParser, "parse", lambda self: parsed.append(self.text) or parse(self))
    text = "year >= 2019 and f0 > -1000.5 and country != 'XX'"  # a text no other test parses
    given = TableSource(spark_table[0], ["f0"], label="fruit", filter=text)
    source = resolve(given, open_dataset(given))
    classes = label_classes(source)
    X, _ = read_all(source, workers=2, classes=classes)
    assert len(X) > 0 and parsed == [text]


def test_a_null_partition_is_a_null_column(tmp_path):
    # Spark writes a null partition value as __HIVE_DEFAULT_PARTITION__.
    for country, x in (("NL", [1.0, 2.0]), ("__HIVE_DEFAULT_PARTITION__", [3.0])):
        (tmp_path / f"country={country}").mkdir()
        write_parquet(pa.table({"x": x}), tmp_path / f"country={country}" / part_name(0))
    root = str(tmp_path)
    listed = pieces(open_dataset(TableSource(root, ["x"])))
    assert [p.partition for p in listed] == [(("country", "string", "NL"),), (("country", "string", None),)]
    source = TableSource(root, ["x"], filter="country in ('NL', 'DE')")
    assert [p.path for p in pieces(open_dataset(source), source.filter)] == [listed[0].path]
    np.testing.assert_array_equal(read_all(source)[0], [[1.0], [2.0]])
    assert read_piece(source, listed[1])[0].shape == (0, 1)  # read anyway: the filter keeps none of its rows
    assert read_piece(TableSource(root, ["x"]), listed[1])[0].tolist() == [[3.0]]
    with pytest.raises(ShardError, match=f"{listed[1].path}: column 'country' is null at row 0"):
        label_classes(TableSource(root, ["x"], label="country"))
    with pytest.raises(ShardError, match="filter 'cuntry == 1' cannot be applied"):
        pieces(open_dataset(source), "cuntry == 1")
