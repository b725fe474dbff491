"""Reading a table's pieces: :func:`read_piece` gives one piece's rows that pass the filter as
float32 features and int64 classes, naming the file, column and row of a bad value;
:func:`label_classes` reads the label column alone for the table's classes."""

from __future__ import annotations

import functools
import operator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from iterreduce.exceptions import ShardError, TableError
from iterreduce.storage.filesystems import filesystem

from .columns import feature_block, leave_out_missing, non_null, plain_schema, type_width, without_list_views
from .counted import checked_group_rows, counted_batches, miscounted_rows
from .labels import LabelMap, label_values
from .pieces import Piece, table_pieces
from .shards import STREAM_ROWS
from .schema_checks import (ABSENT, EXPRESSION_ERRORS, GLOB_CHARS, check_feature_type, check_label, column_type,
                            feature_columns, is_absent)
from .tables import FILE_FORMATS, ROW, TableSource, open_dataset


# ------------------------------------------------------------------ reading


def read_piece(source: TableSource, piece: Piece, *, classes: LabelMap | None = None,
               n_features: int | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """One piece's rows that pass the filter: float32 features (rows x features, the columns in
    the source's order, each giving one value or its list's or vector's width) and int64
    classes from ``classes`` (None when the source has no label). Refuses nulls, NaN and
    infinite values, lists of different lengths and a width other than ``n_features``, naming
    the file, the column and the row within the file. Pass a :func:`resolve`\\ d source, so a
    glob names the same columns in every piece."""
    if source.label is not None and classes is None:
        raise TableError(f"{source.uri}: reading the label {source.label!r} needs its classes "
                         f"(the LabelMap from label_classes)")
    fragment, schema = _open_piece(source, piece)
    stored = [name for name in schema.names if name not in {p[0] for p in piece.partition}]
    names = feature_columns(source, schema, stored, piece.path)
    if source.label is not None:
        check_label(schema, source.label, piece.path)
    table = _read_rows(source, piece, fragment, schema, names + ([source.label] if source.label else []))
    rows = table.column(ROW).to_numpy()
    if table.num_rows:
        features = np.hstack([feature_block(table.column(name).combine_chunks(), name, piece.path, rows)
                              for name in names])
    else:  # every row filtered out: only the column types tell the width
        features = np.zeros((0, n_features if n_features is not None else type_width(schema, names)), np.float32)
    if n_features is not None and features.shape[1] != n_features:
        raise ShardError(f"{piece.path}: {features.shape[1]} features per row from row {rows[0]} on, "
                         f"expected {n_features} (columns: {', '.join(names)})")
    labels = None
    if source.label is not None:
        labels = classes.encode(non_null(table.column(source.label).combine_chunks(), source.label,
                                          piece.path, rows), where=piece.path)
    return features, labels


def column_widths(source: TableSource, piece: Piece) -> tuple[int, ...] | None:
    """The features each of ``source``'s feature columns gives a row of ``piece``, in order (a
    number 1, a list or vector its rows' width), read from its rows that pass the filter, checked
    as :func:`read_piece` checks them; None where no row passes."""
    fragment, schema = _open_piece(source, piece)
    stored = [name for name in schema.names if name not in {p[0] for p in piece.partition}]
    names = feature_columns(source, schema, stored, piece.path)
    table = _read_rows(source, piece, fragment, schema, names)
    if not table.num_rows:
        return None
    rows = table.column(ROW).to_numpy()
    return tuple(feature_block(table.column(name).combine_chunks(), name, piece.path, rows).shape[1] for name in names)


def named_features(table: pa.Table, names, where: str = "X") -> np.ndarray:
    """Float32 features (rows x features) of the columns ``names`` of an in-memory ``table``, by
    name, in that order (a model's ``input_columns_``, whatever the table's order of columns),
    each checked as :func:`read_piece` checks a file's: a number, a list of numbers or a Spark
    ML vector a row, no null, NaN or infinity, lists of one width. Errors name ``where``, the
    column and the row."""
    blocks = named_blocks(table, names, where)
    return np.hstack(blocks) if table.num_rows else np.zeros((0, type_width(table.schema, list(names))), np.float32)


def named_blocks(table: pa.Table, names, where: str = "X") -> list[np.ndarray]:
    """:func:`named_features` a column at a time: each column's float32 features (rows x its width;
    none for a table without rows)."""
    names = list(names)
    for name in names:
        check_feature_type(table.schema, name, where)
    if not table.num_rows:
        return []
    rows = np.arange(table.num_rows)
    return [feature_block(table.column(name).combine_chunks(), name, where, rows, in_file=False) for name in names]


def read_columns(source: TableSource, piece: Piece, names: list[str]) -> pa.Table:
    """Columns ``names`` (any type: ids, keys, the label as stored) of the piece's rows that
    pass the filter, row for row as :func:`read_piece` gives them."""
    fragment, schema = _open_piece(source, piece)
    return _read_rows(source, piece, fragment, schema, list(names)).select(list(names))


def _open_piece(source: TableSource, piece: Piece) -> tuple[ds.FileFragment, pa.Schema]:
    """The piece as a fragment and its schema: the file's own columns, then the partition ones."""
    fs, _ = filesystem(source.uri)
    conditions = [pc.field(name).is_null() if value is None
                  else pc.field(name) == pa.scalar(value, pa.type_for_alias(t)) for name, t, value in piece.partition]
    known = functools.reduce(operator.and_, conditions) if conditions else None
    try:
        if FILE_FORMATS[source.format] == "parquet":
            fragment = ds.ParquetFileFormat().make_fragment(piece.path, filesystem=fs, partition_expression=known,
                                                            row_groups=[piece.row_group])
        else:
            fragment = ds.OrcFileFormat().make_fragment(piece.path, filesystem=fs, partition_expression=known)
        physical = plain_schema(fragment.physical_schema)
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(f"{piece.path}: not a readable {FILE_FORMATS[source.format]} file ({type(exc).__name__}: {exc})") from exc
    if source.stored_names:  # the files' own names, as the table names the columns
        table_name = {stored: name for name, stored in source.stored_names}
        physical = pa.schema([field.with_name(table_name.get(field.name, field.name)) for field in physical])
    extra = [pa.field(name, pa.type_for_alias(t)) for name, t, _ in piece.partition if name not in physical.names]
    known = set(physical.names) | {field.name for field in extra}
    absent = [pa.field(name, pa.null(), metadata={ABSENT: b"1"}) for name in _named_columns(source) if name not in known]
    return fragment, pa.schema(list(physical) + extra + absent)


def _named_columns(source: TableSource) -> list[str]:
    """The columns ``source`` reads by name: its features (a resolved source's), label and filter's."""
    features = source.features if isinstance(source.features, tuple) else (source.features,)
    names = [name for name in features if not any(char in name for char in GLOB_CHARS)]
    names += [source.label] if source.label is not None else []
    return list(dict.fromkeys(names + list(source.filter_columns)))


def _absent_error(path: str, name: str, rows: int) -> ShardError:
    """The error for ``rows`` rows of the file at ``path``, which lacks column ``name``, read as features or labels."""
    return ShardError(f"{path}: no column {name!r} in this file, though the table's other files have it (a column "
                      f"added since this file was written: null in its {rows} row{'s' if rows > 1 else ''} used "
                      f"here){leave_out_missing(name)}")


def _read_rows(source: TableSource, piece: Piece, fragment: ds.FileFragment, schema: pa.Schema,
               columns: list[str]) -> pa.Table:
    """``columns`` of the piece's rows that pass the filter, with :data:`ROW`, each row's index
    in its file (numbered before filtering, so errors name the row as stored)."""
    wanted = list(dict.fromkeys(columns + list(source.filter_columns)))
    for name in wanted:
        column_type(schema, name, piece.path)
    stored = dict(source.stored_names)
    in_file = set(fragment.physical_schema.names)  # a partition column is not: it keeps the table's name
    as_stored = {name: stored[name] for name in schema.names if stored.get(name) in in_file}
    try:
        if isinstance(fragment, ds.ParquetFileFragment):
            table = _row_group_table(piece, fragment, schema, wanted, as_stored)
        else:
            table = fragment.to_table(schema=pa.schema([f.with_name(as_stored.get(f.name, f.name)) for f in schema]),
                                      columns=[as_stored.get(name, name) for name in wanted])
        table = without_list_views(table.rename_columns(wanted))
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(f"{piece.path}: cannot read {', '.join(wanted)} ({type(exc).__name__}: {exc})") from exc
    if table.num_rows != piece.rows:  # an ORC footer's count, which its stripes may not hold
        raise miscounted_rows(piece.path, piece.rows, table.num_rows, piece.row_group)
    table = table.append_column(ROW, pa.array(np.arange(piece.start, piece.start + table.num_rows)))
    if piece.deleted:  # rows the table's delete files removed
        table = table.filter(pc.invert(pc.is_in(table.column(ROW), pa.array(piece.deleted, pa.int64()))))
    if source.filter:
        try:
            table = table.filter(source.rows_kept.expression)
        except EXPRESSION_ERRORS as exc:
            raise ShardError(f"{piece.path}: filter {source.filter!r} cannot be applied: {exc}") from None
    absent = [name for name in columns if is_absent(schema, name)]  # a filter's column may be: null, it keeps no row
    if absent and table.num_rows:
        raise _absent_error(piece.path, absent[0], table.num_rows)
    return table.select(columns + [ROW])


def _row_group_table(piece: Piece, fragment: ds.ParquetFileFragment, schema: pa.Schema, wanted: list[str],
                     as_stored: dict[str, str]) -> pa.Table:
    """Columns ``wanted`` of the piece's row group, of the types of the piece's ``schema`` (a
    partition column from its folder, a column the file lacks null), the file's own read a batch
    at a time and counted against its footer (:func:`counted_batches`): pyarrow's dataset reader
    allocates for the rows a row group claims, however few the file holds."""
    in_file = set(fragment.physical_schema.names)
    stored = {name: as_stored.get(name, name) for name in wanted}
    read = list(dict.fromkeys(stored[name] for name in wanted if stored[name] in in_file))
    parquet = pq.ParquetFile(piece.path, filesystem=fragment.filesystem, metadata=fragment.metadata, pre_buffer=False)
    with parquet:
        claimed = checked_group_rows(parquet.metadata, piece.path, piece.row_group)
        batches = parquet.iter_batches(batch_size=STREAM_ROWS, row_groups=[piece.row_group], columns=read)
        rows = pa.Table.from_batches(list(counted_batches(batches, claimed, piece.path, piece.row_group)),
                                     schema=pa.schema([parquet.schema_arrow.field(name) for name in read]))
    folder = {name: value for name, _, value in piece.partition}
    columns = []
    for name in wanted:
        type_ = schema.field(name).type
        if stored[name] in in_file:
            columns.append(rows.column(stored[name]).cast(type_))
        else:  # a partition column, or one the file lacks (null)
            columns.append(pa.array([folder.get(name)] * rows.num_rows, type_))
    return pa.table(columns, names=wanted) if wanted else rows


# ------------------------------------------------------------------ labels


def label_column(source: TableSource, piece: Piece) -> pa.Array:
    """The label values of the piece's rows that pass the filter, read alone; a null raises,
    naming the file and the row."""
    fragment, schema = _open_piece(source, piece)
    check_label(schema, source.label, piece.path)
    table = _read_rows(source, piece, fragment, schema, [source.label])
    return non_null(table.column(source.label).combine_chunks(), source.label, piece.path, table.column(ROW).to_numpy())


def label_classes(source: TableSource, dataset: ds.FileSystemDataset | None = None) -> LabelMap:
    """The :class:`LabelMap` of ``source``'s label column over the rows its filter keeps, read
    in one pass over that column alone; a null label raises, naming the file and the row."""
    if source.label is None:
        raise TableError(f"{source.uri}: the table source names no 'label' column")
    dataset = open_dataset(source) if dataset is None else dataset
    check_label(dataset.schema, source.label, source.uri)
    classes: set = set()
    for piece in table_pieces(source, dataset):
        classes.update(pc.unique(label_values(label_column(source, piece))).to_pylist())
    if not classes:  # not a null among them (that raised): no rows
        raise ShardError(f"{source.uri}: no row passes the filter {source.filter!r}" if source.filter
                         else f"{source.uri}: the table has no rows")
    try:
        return LabelMap(tuple(sorted(classes)))
    except TypeError:  # integers in some files, strings in others
        raise ShardError(f"{source.uri}: label column {source.label!r} holds integers in some files and "
                         f"strings in others") from None
