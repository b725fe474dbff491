"""The values read from a table (shardio.reading, shardio.labels, dbn.model.scaler): bad values (nulls,
NaN, ragged lists, malformed Spark ML vectors, a column whose type changed) named by file, column
and row; labels mapped to their sorted classes; feature statistics merged from parts, and the
scalers made of them."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from dbn.model.scaler import FeatureStats, Scaler
from iterreduce.exceptions import ShardError
from iterreduce.exceptions import TableError
from shardio.labels import LabelMap
from shardio.pieces import pieces
from shardio.reading import label_classes, read_piece
from shardio.tables import TableSource, open_dataset, resolve
from test_tables import (FRUITS, SCALARS, VECTOR, expected_features, part_name, read_all, spark_rows,
                         spark_table, write_parquet)  # noqa: F401 - spark_table: a fixture


# ------------------------------------------------------------------ bad values, named


def write_one(tmp_path, table: pa.Table, name: str = part_name(0)) -> tuple[str, str]:
    folder = tmp_path / "t" / "day=2024-01-01"
    folder.mkdir(parents=True, exist_ok=True)
    write_parquet(table, folder / name)
    return str(tmp_path / "t"), str(folder / name)


def read_every_piece(source: TableSource, **kwargs):
    dataset = open_dataset(source)
    return [read_piece(source, piece, **kwargs) for piece in pieces(dataset, source.filter)]


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
