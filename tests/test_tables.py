"""Tables as Spark writes them (hive partition folders, part files, side files), read in place:
column resolution, filters, pieces and their assignment, reading, labels, statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

from dbn.model.scaler import FeatureStats, Scaler
from iterreduce.exceptions import ShardError
from iterreduce.exceptions import TableError
from shardio.filters import filter_columns, parse_filter
from shardio.labels import LabelMap
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


def test_a_missing_value_says_how_a_filter_leaves_its_rows_out(tmp_path):
    table = pa.table({"m 3": [1.0, None, 2.0], "age": pa.array([1.0, float("nan"), 2.0]),
                      "vec": pa.array([[1.0], [float("nan")], [1.0]], pa.list_(pa.float64()))})
    write_parquet(table, tmp_path / part_name(0))
    root = str(tmp_path)
    for features, words in ((["m 3"], "column 'm 3' is null at row 1 (1 null in rows 0..2): "
                                      "a filter such as \"`m 3` is not None\" leaves such rows out"),
                            (["age"], "column 'age' holds NaN or an infinite value (or a number float32 cannot "
                                      "hold) at row 1 (1 in this piece): a filter such as \"age is not None\""),
                            (["vec"], "column 'vec' holds NaN")):
        with pytest.raises(ShardError) as err:
            read_every_piece(TableSource(root, features))
        assert words in str(err.value)
        if features == ["vec"]:  # a filter cannot see into a list: no such advice
            assert "is not None" not in str(err.value)
        else:  # and the advice works
            name = features[0] if features[0].isidentifier() else f"`{features[0]}`"
            X, _ = read_every_piece(TableSource(root, features, filter=f"{name} is not None"))[0]
            np.testing.assert_array_equal(X, [[1.0], [2.0]])


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


# ------------------------------------------------------------------ bad values, named


def write_one(tmp_path, table: pa.Table, name: str = part_name(0)) -> tuple[str, str]:
    folder = tmp_path / "t" / "day=2024-01-01"
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet(table, folder / name)
    return str(tmp_path / "t"), str(folder / name)


def read_every_piece(source: TableSource, **kwargs):
    dataset = open_dataset(source)
    return [read_piece(source, piece, **kwargs) for piece in pieces(dataset, source.filter)]


@pytest.mark.parametrize("filter_", [None, "id != 3 and day == '2024-01-01'"])
@pytest.mark.parametrize("column", ["f1", "emb", "vec", "fruit"])
def test_a_null_names_the_file_column_and_row(tmp_path, column, filter_):
    table = spark_rows(np.random.default_rng(1), 0, 40)
    values = table.column(column).to_pylist()
    values[21] = None  # in the second row group: the row is counted from the file's start
    index = table.schema.get_field_index(column)
    table = table.set_column(index, column, pa.array(values, table.schema.field(column).type))
    root, path = write_one(tmp_path, table)
    source = TableSource(root, ["f1", "emb", "vec"] if column != "fruit" else ["f1"], label="fruit", filter=filter_)
    with pytest.raises(ShardError) as err:
        read_every_piece(source, classes=LabelMap(tuple(sorted(FRUITS))))
    assert f"{path}: column '{column}' is null at row 21" in str(err.value)
    if column == "fruit":
        with pytest.raises(ShardError, match=f"column 'fruit' is null at row 21"):
            label_classes(source)


def test_a_null_inside_a_list_names_the_row(tmp_path):
    table = pa.table({"emb": pa.array([[1.0, 2.0]] * 20 + [[1.0, None]] + [[3.0, 4.0]] * 5, pa.list_(pa.float32()))})
    root, path = write_one(tmp_path, table)
    with pytest.raises(ShardError, match=f"{path}: column 'emb' holds a null value at row 20"):
        read_every_piece(TableSource(root, "emb"))


def test_ragged_lists_and_vectors_name_the_row(tmp_path):
    emb = [[1.0, 2.0, 3.0, 4.0]] * 40
    emb[18] = [1.0, 2.0, 3.0]
    vec = [{"type": 1, "size": None, "indices": None, "values": [1.0, 2.0, 3.0]}] * 40
    vec[35] = {"type": 0, "size": 4, "indices": [0], "values": [7.0]}
    table = pa.table({"emb": pa.array(emb, pa.list_(pa.float32())), "vec": pa.array(vec, VECTOR)})
    root, path = write_one(tmp_path, table)
    with pytest.raises(ShardError) as err:
        read_every_piece(TableSource(root, "emb"))
    assert f"{path}: column 'emb' has 3 values at row 18 but 4 at row 16" in str(err.value)
    with pytest.raises(ShardError) as err:
        read_every_piece(TableSource(root, "vec"))
    assert f"{path}: column 'vec' has 4 values at row 35 but 3 at row 32" in str(err.value)
    # the pieces before the ragged rows are fine, and each piece's width is checked against the job's
    first = pieces(open_dataset(TableSource(root, "emb")))[0]
    assert read_piece(TableSource(root, "emb"), first, n_features=4)[0].shape == (16, 4)
    with pytest.raises(ShardError, match=f"{path}: 4 features per row from row 0 on, expected 5"):
        read_piece(TableSource(root, "emb"), first, n_features=5)


@pytest.mark.parametrize("vector, words", [
    ({"type": 0, "size": 3, "indices": [0, 3], "values": [1.0, 2.0]}, ["row 2 has index 3, outside its size 3"]),
    ({"type": 0, "size": 3, "indices": [0], "values": [1.0, 2.0]}, ["row 2 is not a Spark ML vector"]),
    ({"type": 2, "size": 3, "indices": [], "values": []}, ["row 2 is not a Spark ML vector"]),
    ({"type": 1, "size": None, "indices": None, "values": None}, ["row 2 is not a Spark ML vector"]),
])
def test_malformed_vectors_name_the_row(tmp_path, vector, words):
    rows = [{"type": 1, "size": None, "indices": None, "values": [1.0, 2.0, 3.0]},
            {"type": 0, "size": 3, "indices": [1], "values": [5.0]}, vector]
    root, path = write_one(tmp_path, pa.table({"vec": pa.array(rows, VECTOR)}))
    with pytest.raises(ShardError) as err:
        read_every_piece(TableSource(root, "vec"))
    assert str(err.value).startswith(f"{path}: column 'vec'")
    for word in words:
        assert word in str(err.value)


def test_nan_and_values_beyond_float32_name_the_row(tmp_path):
    root, path = write_one(tmp_path, pa.table({"a": [1.0, 2.0, np.nan], "b": [1.0, 1e300, 0.0]}))
    with pytest.raises(ShardError, match=f"{path}: column 'a' holds NaN .* at row 2"):
        read_every_piece(TableSource(root, ["a"]))
    with pytest.raises(ShardError, match=f"{path}: column 'b' holds NaN .* at row 1"):
        read_every_piece(TableSource(root, ["b"]))


def test_a_file_whose_column_changed_type_is_named(tmp_path):
    good = pa.table({"x": pa.array([1, 2], pa.int32()), "y": [0, 1]})
    root, _ = write_one(tmp_path, good, part_name(0))
    _, bad_path = write_one(tmp_path, pa.table({"x": ["1", "2"], "y": [0, 1]}), part_name(1))
    source = resolve(TableSource(root, ["x"]), open_dataset(TableSource(root, ["x"])))  # the first file's schema
    with pytest.raises(ShardError, match=f"{bad_path}: feature column 'x' is string"):
        read_every_piece(source)


def test_reading_a_label_needs_its_classes(spark_table):
    root, _ = spark_table
    source = TableSource(root, "f*", label="fruit")
    with pytest.raises(TableError, match="LabelMap"):
        read_piece(source, pieces(open_dataset(source))[0])
    with pytest.raises(ShardError, match="'cherry' .* is not one of the 2 classes"):
        read_piece(source, pieces(open_dataset(source))[0], classes=LabelMap(("apple", "banana")))


# ------------------------------------------------------------------ labels


def test_string_labels_map_to_sorted_classes(spark_table):
    root, files = spark_table
    classes = label_classes(TableSource(root, "f*", label="fruit"))
    assert classes.classes == ("apple", "banana", "cherry")
    _, labels = expected_features(files, ["f0"])
    codes = classes.encode(labels)
    assert codes.dtype == np.int64
    np.testing.assert_array_equal(codes, [sorted(FRUITS).index(v) for v in labels])
    assert classes.decode(codes).tolist() == labels.tolist()
    assert LabelMap.from_dict(json.loads(json.dumps(classes.to_dict()))) == classes
    categorical = pa.array(["banana", "apple", "banana"]).dictionary_encode()
    np.testing.assert_array_equal(classes.encode(categorical), [1, 0, 1])
    with pytest.raises(ShardError, match="label 'durian' .* not one of the 3 classes"):
        classes.encode(["apple", "durian"])
    with pytest.raises(ShardError, match="the classes are strings"):
        classes.encode([1, 2])


@pytest.mark.parametrize("values, type_, classes, codes", [
    ([2, 0, 1, 3, 1, 0], pa.int64(), (0, 1, 2, 3), [2, 0, 1, 3, 1, 0]),   # 0..K-1: themselves
    ([9, 3, 7, 7, 3, 9], pa.int16(), (3, 7, 9), [2, 0, 1, 1, 0, 2]),
    ([-1, 5, -1, 5, 5, 5], pa.int8(), (-1, 5), [0, 1, 0, 1, 1, 1]),
    (["b", "a", "c", "a", "b", "b"], pa.dictionary(pa.int32(), pa.string()), ("a", "b", "c"), [1, 0, 2, 0, 1, 1]),
])
def test_label_classes_from_a_table(tmp_path, values, type_, classes, codes):
    table = pa.table({"x": [0.5] * 6, "y": pa.array(values, type_)})
    root, _ = write_one(tmp_path, table)
    source = TableSource(root, ["x"], label="y")
    labels = label_classes(source)
    assert labels.classes == classes
    (X, y), = read_every_piece(source, classes=labels)
    np.testing.assert_array_equal(y, codes)
    assert labels.decode(y).tolist() == values
    with pytest.raises(TableError):
        labels.decode([len(classes)])


def test_label_maps_refuse_bad_classes():
    for bad in ((), (1, "a"), (3, 1), (1, 1), (True, False)):
        with pytest.raises(TableError):
            LabelMap(bad)
    with pytest.raises(TableError):
        LabelMap.from_dict({"labels": [1]})
    with pytest.raises(ShardError, match=r"label 4 .* not one of the 3 classes"):
        LabelMap((3, 7, 9)).encode(np.array([3, 4]))


# ------------------------------------------------------------------ statistics and scaling


def test_stats_merged_from_halves_are_the_stats_of_the_whole(spark_table):
    root, _ = spark_table
    X, _ = read_all(TableSource(root, ["id", *SCALARS, "emb"]))
    X = np.column_stack([X, np.full(len(X), 3.0, np.float32)])  # a constant feature
    half = len(X) // 2
    left = FeatureStats.empty(X.shape[1])
    for block in np.array_split(X[:half], 4):  # block by block, as a reader would
        left.update(block)
    right = FeatureStats.of(X[half:])
    whole = left.merge(right)
    assert left.count == half  # merge made a new one
    X64 = X.astype(np.float64)
    assert whole.count == len(X)
    np.testing.assert_array_equal(whole.min, X64.min(axis=0))
    np.testing.assert_array_equal(whole.max, X64.max(axis=0))
    np.testing.assert_allclose(whole.sum, X64.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(whole.sum_sq, (X64 ** 2).sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(whole.mean, X64.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(whole.std, X64.std(axis=0), rtol=1e-6, atol=1e-9)
    def same(a, b):
        return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    again = FeatureStats.from_arrays(whole.arrays())
    assert same(again.arrays(), whole.arrays())
    empty = FeatureStats.from_arrays(FeatureStats.empty(3).arrays())
    assert empty.count == 0 and same(empty.merge(FeatureStats.of(X[:, :3])).arrays(), FeatureStats.of(X[:, :3]).arrays())
    with pytest.raises(TableError):
        whole.merge(FeatureStats.empty(2))
    with pytest.raises(TableError):
        whole.update(X[:, :3])
    with pytest.raises(TableError, match="no rows"):
        FeatureStats.empty(3).standardizer()


def test_scalers_map_to_unit_range_and_to_mean_zero(spark_table):
    root, _ = spark_table
    X, _ = read_all(TableSource(root, [*SCALARS, "vec"]))
    X = np.column_stack([X, np.full(len(X), -2.5, np.float32)])  # a constant feature
    stats = FeatureStats.of(X)
    unit = stats.min_max_scaler().transform(X)
    assert unit.dtype == np.float32
    np.testing.assert_allclose(unit[:, :-1].min(axis=0), 0.0, atol=1e-6)
    np.testing.assert_allclose(unit[:, :-1].max(axis=0), 1.0, atol=1e-6)
    assert (unit[:, -1] == 0).all()
    standard = stats.standardizer().transform(X)
    np.testing.assert_allclose(standard[:, :-1].mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(standard[:, :-1].std(axis=0), 1.0, rtol=1e-4)
    assert (standard[:, -1] == 0).all()
    for scaler in (stats.min_max_scaler(), stats.standardizer()):
        saved = Scaler.from_dict(json.loads(json.dumps(scaler.to_dict())))
        assert saved.kind == scaler.kind
        np.testing.assert_array_equal(saved.transform(X), scaler.transform(X))
        with pytest.raises(TableError):
            scaler.transform(X[:, :2])


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
