"""Table columns as features: a number, a list of numbers or a Spark ML vector a row, decoded into
float32 rows x features and checked (no null, NaN or infinity, lists of one width), every error
naming the file (or frame), the column and the row."""

from __future__ import annotations

import keyword

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iterreduce.exceptions import ShardError

#: The fields of a Spark ML vector as Spark stores it: type 1 dense (``values`` holds every
#: entry), type 0 sparse (``size`` entries, the nonzero ``values`` at ``indices``).
VECTOR_FIELDS = frozenset({"type", "size", "indices", "values"})


#: Field metadata of a table's schema: the column's name in the data files, where the table maps its
#: names to others there (Delta Lake's column mapping).
STORED_NAME = b"iterreduce.stored_name"


def plain_type(type_: pa.DataType) -> pa.DataType:
    """``type_`` with Arrow's view layouts of strings and bytes (``string_view``, ``binary_view``,
    as delta-rs, DuckDB and Polars may record them in a Parquet file's Arrow schema) as the plain
    types that hold the same values: what the label checks know, and what a scan casts them to.
    (A ``list_view`` a scan cannot cast: it stays, a list like any other: :func:`is_list`.)"""
    if pa.types.is_string_view(type_):
        return pa.string()
    if pa.types.is_binary_view(type_):
        return pa.binary()
    return type_


def without_list_views(table: pa.Table) -> pa.Table:
    """``table`` with its ``list_view`` columns as large lists of the same values (:func:`as_large_list`)."""
    for i, field in enumerate(table.schema):
        if is_list_view(field.type):
            table = table.set_column(i, field.name, as_large_list(table.column(i).combine_chunks()))
    return table


def is_list_view(type_: pa.DataType) -> bool:
    return pa.types.is_list_view(type_) or pa.types.is_large_list_view(type_)


def as_large_list(column: pa.Array) -> pa.Array:
    """A ``list_view`` array as a large list array of the same rows, built from its lengths and
    flattened values: pyarrow's own cast gave wrong lengths for views a filter had reordered."""
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]), pa.int64())
    return pa.LargeListArray.from_arrays(offsets, pc.list_flatten(column),
                                         mask=column.is_null() if column.null_count else None)


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column's type :func:`plain_type`."""
    return pa.schema([field.with_type(plain_type(field.type)) for field in schema], schema.metadata)


def is_number(type_: pa.DataType) -> bool:
    """Whether a column of ``type_`` holds one number a row (integers, floats, booleans)."""
    return pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)


def is_list(type_: pa.DataType) -> bool:
    """Whether ``type_`` is a list type (of any length kind or layout)."""
    return (pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_)
            or is_list_view(type_))


def feature_kind(type_: pa.DataType) -> str | None:
    """"scalar" (one feature), "array" (a list of numbers), "vector" (a Spark ML vector) or
    None for a type that holds no features. Spark and Hive write money and measurements
    as DECIMAL: a scalar too, read through float64."""
    if is_number(type_) or pa.types.is_decimal(type_):
        return "scalar"
    if is_list(type_) and is_number(type_.value_type):
        return "array"
    if pa.types.is_struct(type_) and {type_.field(i).name for i in range(type_.num_fields)} == VECTOR_FIELDS:
        parts = {name: type_.field(name).type for name in VECTOR_FIELDS}
        if (pa.types.is_integer(parts["type"]) and pa.types.is_integer(parts["size"])
                and is_list(parts["indices"]) and pa.types.is_integer(parts["indices"].value_type)
                and is_list(parts["values"]) and is_number(parts["values"].value_type)):
            return "vector"
    return None


def non_null(column: pa.Array, name: str, path: str, rows: np.ndarray, in_file: bool = True) -> pa.Array:
    """``column``, refused naming its first null (and, ``in_file``, the filter that leaves such rows out)."""
    if column.null_count:
        first = int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
        raise ShardError(f"{path}: column {name!r} is null at row {rows[first]} "
                         f"({column.null_count} null{'s' if column.null_count > 1 else ''} in rows "
                         f"{rows[0]}..{rows[-1]}){leave_out_missing(name) if in_file else ''}")
    return column


def leave_out_missing(name: str) -> str:
    """How a filter leaves out the rows where column ``name`` is missing (null or NaN)."""
    quoted = name if name.isidentifier() and not keyword.iskeyword(name) else f"`{name}`"
    return f": a filter such as \"{quoted} is not None\" leaves such rows out, or fill them in first"


def feature_block(column: pa.Array, name: str, path: str, rows: np.ndarray, in_file: bool = True) -> np.ndarray:
    """One feature column as float32 rows x (1, or its lists' or vectors' width), checked (errors
    of a file, ``in_file``, say how a filter leaves rows with missing values out)."""
    non_null(column, name, path, rows, in_file)
    kind = feature_kind(column.type)
    with np.errstate(over="ignore"):  # a float64 float32 cannot hold becomes inf, refused just below
        if kind == "scalar":
            if pa.types.is_decimal(column.type):
                column = column.cast(pa.float64())
            block = column.to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, 1)
        elif kind == "array":
            if is_list_view(column.type):
                column = as_large_list(column)
            block = _array_rows(column, name, path, rows)
        else:
            block = _vector_rows(column, name, path, rows)
    bad = ~np.isfinite(block)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        where = f", value {col}" if block.shape[1] > 1 else ""
        missing = leave_out_missing(name) if in_file and kind == "scalar" and np.isnan(block[row, col]) else ""
        raise ShardError(f"{path}: column {name!r} holds NaN or an infinite value (or a number float32 "
                         f"cannot hold) at row {rows[row]}{where} ({int(bad.sum())} in this piece){missing}")
    return block


def _same_width(widths: np.ndarray, name: str, path: str, rows: np.ndarray) -> int:
    width = int(widths[0])
    ragged = widths != width
    if ragged.any():
        i = int(np.argmax(ragged))
        raise ShardError(f"{path}: column {name!r} has {int(widths[i])} values at row {rows[i]} but {width} at "
                         f"row {rows[0]}: every row needs the same number")
    if width == 0:
        raise ShardError(f"{path}: column {name!r} holds empty lists at row {rows[0]}: no feature to train on")
    return width


def _null_element(values: pa.Array, parents: pa.Array, name: str, path: str, rows: np.ndarray) -> None:
    if values.null_count:
        first = int(np.argmax(values.is_null().to_numpy(zero_copy_only=False)))
        raise ShardError(f"{path}: column {name!r} holds a null value at row {rows[parents[first].as_py()]}")


def _array_rows(column: pa.Array, name: str, path: str, rows: np.ndarray) -> np.ndarray:
    """A column of lists of numbers as rows x width."""
    width = _same_width(pc.list_value_length(column).to_numpy(zero_copy_only=False), name, path, rows)
    values = pc.list_flatten(column)
    _null_element(values, pc.list_parent_indices(column), name, path, rows)
    return values.to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(column), width)


def _vector_rows(column: pa.Array, name: str, path: str, rows: np.ndarray) -> np.ndarray:
    """A column of Spark ML vectors, dense and sparse, as dense rows x width."""
    def part(field: str) -> pa.Array:
        return pc.struct_field(column, field)

    def numbers(array: pa.Array) -> np.ndarray:  # a null (a missing part) as -1, which no valid part is
        return array.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)

    kind, size = numbers(part("type")), numbers(part("size"))
    values, indices = part("values"), part("indices")
    n_values, n_indices = numbers(pc.list_value_length(values)), numbers(pc.list_value_length(indices))
    dense = kind == 1
    malformed = (n_values < 0) | ~(dense | (kind == 0)) | (~dense & ((size < 0) | (n_indices != n_values)))
    if malformed.any():
        i = int(np.argmax(malformed))
        raise ShardError(f"{path}: column {name!r} at row {rows[i]} is not a Spark ML vector ({column[i]}): type 1 "
                         f"needs values, type 0 needs size and as many indices as values")
    width = _same_width(np.where(dense, n_values, size), name, path, rows)
    flat, parents = pc.list_flatten(values), pc.list_parent_indices(values)
    _null_element(flat, parents, name, path, rows)
    parents = parents.to_numpy()
    # Each value's place in its row: its position in the values list (dense), its index (sparse).
    first = np.cumsum(n_values) - n_values
    place = np.arange(len(flat)) - first[parents]
    sparse = ~dense[parents]
    if sparse.any():
        flat_indices, index_parents = pc.list_flatten(indices), pc.list_parent_indices(indices)
        _null_element(flat_indices, index_parents, name, path, rows)
        # A sparse row has as many indices as values, so they pair up in order.
        place[sparse] = flat_indices.to_numpy()[~dense[index_parents.to_numpy()]]
        outside = sparse & ((place < 0) | (place >= width))
        if outside.any():
            i = int(np.argmax(outside))
            raise ShardError(f"{path}: column {name!r} at row {rows[parents[i]]} has index {place[i]}, outside "
                             f"its size {width}")
    block = np.zeros((len(column), width), np.float32)
    block[parents, place] = flat.to_numpy(zero_copy_only=False)
    return block


def type_width(schema: pa.Schema, names: list[str]) -> int:
    """The features the column types alone give: 1 per number, a fixed-size list's size (0 for
    other lists and vectors, whose width only their rows tell)."""
    width = 0
    for name in names:
        type_ = schema.field(name).type
        width += 1 if feature_kind(type_) == "scalar" else getattr(type_, "list_size", 0)
    return width


def some_columns(names: list[str], shown: int = 10) -> str:
    """A list of ``names`` to show in an error: the first ``shown`` of them and how many in all."""
    listed = ", ".join(names[:shown]) + (f", ... ({len(names)} in all)" if len(names) > shown else "")
    return f"columns: {listed}" if names else "no columns"
