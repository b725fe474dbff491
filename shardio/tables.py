"""Tables as Spark and Hive write them, read in place: a directory of Parquet or ORC files,
hive-partitioned (``year=2024/country=NL/part-...``) or not, or one file, at any URI
:func:`~iterreduce.storage.filesystems.filesystem` reaches (plain paths, ``file://``, ``hdfs://``, ``s3://``).

The steps, one function each:

- :func:`open_dataset` finds the data files, skipping Spark's and Hadoop's side files;
- :func:`resolve` checks a :class:`TableSource` against the schema before any data is read;
- :func:`pieces` cuts the table into work units (a Parquet row group, or an ORC file), plain
  data a master can send, and :func:`assign` balances them among workers by rows;
- :func:`read_piece` reads one as float32 features (rows x features) and int64 classes;
- :func:`label_classes` builds the :class:`~shardio.labels.LabelMap` from the label column;
- :class:`TableShard`, a worker's share of the pieces, is the reader of a ``.table.json`` URI.

Errors found in the data (a missing or non-numeric column, a null, a ragged array) are
:class:`~iterreduce.exceptions.ShardError` naming the file, column and row; errors in the
source as written (an unknown key, a filter that is not allowed) are :class:`TableError`.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import fnmatch
import functools
import json
import operator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from iterreduce.exceptions import ShardError, TableError
from iterreduce.storage.filesystems import filesystem, open_output_file
from iterreduce.specification import Specification, unsaved

from . import delta, iceberg
from .columns import (STORED_NAME, feature_block, feature_kind, leave_out_missing, non_null, plain_schema,
                      some_columns, type_width, without_list_views)
from .counted import checked_group_rows, checked_row_groups, counted_batches, miscounted_rows
from .filters import RowFilter, row_filter
from .labels import LabelMap, is_label_type, label_values
from .lakehouse import check_not_lakehouse, parse_version
from .shards import STREAM_ROWS

#: A table's format, and the format of its data files: a Delta Lake table's are Parquet files
#: that its log lists (:mod:`shardio.delta`), an Apache Iceberg table's those its metadata
#: lists (:mod:`shardio.iceberg`).
FILE_FORMATS = {"parquet": "parquet", "orc": "orc", "delta": "parquet", "iceberg": "parquet"}
FORMATS = tuple(FILE_FORMATS)
#: The formats whose tables have versions (``version``: a Delta version or an Iceberg snapshot id,
#: or a time), and the module that reads each: ``version_number(uri, version)`` and ``dataset(uri, version)``.
VERSIONED_FORMATS = {"delta": delta, "iceberg": iceberg}
#: Names of Spark's and Hadoop's side files and folders (_SUCCESS, _committed_*, _started_*,
#: _temporary/, .part-*.crc): never data, and _temporary/ holds unfinished writes.
SIDE_FILE_PREFIXES = ("_", ".")
GLOB_CHARS = "*?["
#: What pyarrow raises when an expression does not fit the table's types.
EXPRESSION_ERRORS = (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid)
ROW = "__row_in_file"  # the column read_piece adds: each row's index in its file, for errors
#: Field metadata of a piece's schema: a column the table has and the piece's file lacks (written
#: before the column was added), null in the file's rows (:func:`_open_piece`).
ABSENT = b"iterreduce.absent"


# ------------------------------------------------------------------ the source


@dataclass(frozen=True)
class TableSource(Specification):
    """Where a table is and which columns to train on.

    ``features``: a column name, a glob such as ``"pixel_*"`` over the stored (non-partition)
    columns other than the label, in schema order, or a list of both (``["m_*", "age"]``).
    A column gives one feature (int, float or bool) or several (a list of numbers, or a Spark
    ML vector). ``label``: the class column (integers or strings), None for unlabelled data.
    ``filter``: the rows to keep, e.g. ``"year >= 2020 and country == 'NL'"`` (:func:`shardio.filters.parse_filter`).
    ``format``: one of :data:`FORMATS`. ``version``: a Delta Lake table's version or an Iceberg
    table's snapshot id, or an ISO 8601 time (the newest when None; :func:`with_version_fixed` fixes it
    before a job reads). ``allow_outside_files``: read the data files a Delta Lake log or an Iceberg
    manifest names by absolute URI outside the table's folder (refused otherwise, naming the entry).
    """

    uri: str
    features: str | tuple[str, ...]
    label: str | None = None
    format: str = "parquet"
    filter: str | None = None
    version: int | str | None = None
    stored_names: tuple = ()  # ((column, its name in the data files), ...) where a table maps them (resolve)
    allow_outside_files: bool = False  # a Delta or Iceberg log may name files outside the table's folder

    error = TableError  # what an unknown, missing or bad key raises (from_dict: a typo is never ignored)
    source_name = "table source"

    def __post_init__(self):
        if not isinstance(self.uri, str) or not self.uri:
            raise TableError(f"table source: 'uri' must be a non-empty string, got {self.uri!r}")
        if self.format not in FORMATS:
            raise TableError(f"table source: 'format' = {self.format!r}: expected one of "
                             f"{', '.join(map(repr, FORMATS))}")
        features = self.features
        if isinstance(features, (list, tuple)):
            if not features or not all(isinstance(f, str) and f for f in features):
                raise TableError(f"table source: 'features' must be a non-empty list of column names or "
                                 f"globs, got {list(features)!r}")
            twice = sorted(f for f, n in collections.Counter(features).items() if n > 1)
            if twice:
                raise TableError(f"table source: 'features' names {', '.join(map(repr, twice))} twice")
            object.__setattr__(self, "features", tuple(features))  # frozen, so a tuple
        elif not isinstance(features, str) or not features:
            raise TableError(f"table source: 'features' must be a column name, a glob such as 'pixel_*' "
                             f"or a list of them, got {features!r}")
        if self.label is not None and (not isinstance(self.label, str) or not self.label):
            raise TableError(f"table source: 'label' must be a column name or absent, got {self.label!r}")
        if self.label is not None and self.label in (self.features if isinstance(self.features, tuple)
                                                     else (self.features,)):
            raise TableError(f"table source: column {self.label!r} is both the 'label' and a feature")
        if self.filter is not None:
            if not isinstance(self.filter, str):
                raise TableError(f"table source: 'filter' must be a string expression, got {self.filter!r}")
            self.rows_kept  # parsed now: a filter that cannot be read is refused with the source
        object.__setattr__(self, "stored_names", tuple(tuple(pair) for pair in self.stored_names))
        if self.version is not None:
            if self.format not in VERSIONED_FORMATS:
                raise TableError(f"table source: 'version' = {self.version!r} is for a Delta Lake or Apache "
                                 f"Iceberg table (format = 'delta' or 'iceberg'), and the format is {self.format!r}")
            parse_version(self.version)
        if not isinstance(self.allow_outside_files, bool):
            raise TableError(f"table source: 'allow_outside_files' must be true or false, got {self.allow_outside_files!r}")

    @property
    def rows_kept(self) -> RowFilter | None:
        """The filter parsed (:func:`shardio.filters.row_filter`: once a process), None without one."""
        return None if self.filter is None else row_filter(self.filter)

    @property
    def filter_columns(self) -> tuple[str, ...]:
        """The columns the filter reads (none without one)."""
        return () if self.filter is None else self.rows_kept.columns

    def to_dict(self) -> dict:
        """The fields as a JSON-friendly dict (what :meth:`from_dict` reads back)."""
        d = super().to_dict()
        if not self.allow_outside_files:  # the default, written only when set: shares read the same as before it was
            del d["allow_outside_files"]
        return d


# ------------------------------------------------------------------ opening and checking


def with_version_fixed(source: TableSource) -> TableSource:
    """``source`` with its version fixed to the number it names now (the newest when none), so
    that every step of a job reads the same files however the table changes meanwhile; a
    table without versions as it is."""
    if source.format not in VERSIONED_FORMATS or isinstance(source.version, int):
        return source
    reader = VERSIONED_FORMATS[source.format]
    number = reader.version_number(source.uri, source.version, source.allow_outside_files)
    return dataclasses.replace(source, version=number)


def open_dataset(source: TableSource) -> ds.FileSystemDataset:
    """The table at ``source.uri`` as a ``pyarrow.dataset``: its data files (Spark's and
    Hadoop's side files skipped) and hive partition folders (``key=value``) as columns; a
    Delta Lake or Iceberg table's live files at its version (:data:`VERSIONED_FORMATS`). A
    lakehouse table's folder read as plain files is refused
    (:func:`shardio.lakehouse.check_not_lakehouse`)."""
    if source.format in VERSIONED_FORMATS:
        version = with_version_fixed(source).version
        return VERSIONED_FORMATS[source.format].dataset(source.uri, version, source.allow_outside_files)
    fs, path = filesystem(source.uri)
    check_not_lakehouse(fs, path, source.uri)  # its folder holds files that are no longer the table
    try:
        # exclude_invalid_files would open every file while listing (slow on HDFS): side files are
        # skipped by name instead, and a file that is not Parquet/ORC fails when read, named.
        options = dict(filesystem=fs, format=source.format, partitioning="hive",
                       ignore_prefixes=list(SIDE_FILE_PREFIXES), exclude_invalid_files=False)
        dataset = _with_merged_schema(ds.dataset(path, **options))
    except FileNotFoundError:
        raise ShardError(f"{source.uri}: no such file or directory") from None
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(f"{source.uri}: cannot open as a {source.format} table ({type(exc).__name__}: {exc})") from exc
    if not dataset.files:
        raise ShardError(f"{source.uri}: no data files (side files, whose names start with "
                         f"{' or '.join(map(repr, SIDE_FILE_PREFIXES))}, are skipped)")
    return dataset


def _with_merged_schema(dataset: ds.FileSystemDataset) -> ds.FileSystemDataset:
    """``dataset`` (discovered: the first file's schema) with the merged schema of all its files, as
    Spark's ``mergeSchema`` reads a table whose files differ: a column that older files lack is
    null in their rows (:data:`ABSENT`), a type that later files widen (int32 to int64, float to
    double) the wider; string views as the strings they hold. The footers are read once: the
    fragments keep them, and :func:`pieces` cuts the row groups from them."""
    fragments = sorted(dataset.get_fragments(), key=lambda fragment: fragment.path)
    schemas = [_physical_schema(fragment) for fragment in fragments]
    if not schemas or all(schema.equals(schemas[0]) for schema in schemas[1:]):
        merged = dataset.schema
    else:
        stored = _merged_fields(schemas)
        partitions = set(_partition_names(dataset)) - set(stored.names)
        merged = pa.schema(list(stored) + [field for field in dataset.schema if field.name in partitions])
    merged = plain_schema(merged)
    if merged == dataset.schema:
        return dataset
    return ds.FileSystemDataset(fragments, merged, dataset.format, filesystem=dataset.filesystem)


def _physical_schema(fragment: ds.FileFragment) -> pa.Schema:
    """The schema of one data file, from its footer; an unreadable file is named."""
    try:
        return fragment.physical_schema
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(f"{fragment.path}: not a readable data file ({type(exc).__name__}: {exc})") from exc


def _merged_fields(schemas: list[pa.Schema]) -> pa.Schema:
    """The columns of ``schemas`` in order of first appearance, each of the type its files' types
    widen to. Where a column's types do not merge (numbers in one file, strings in another), the
    first file's: each file's own type is checked where that file is read, naming it."""
    try:
        return pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        pass
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for field in schema:
            have = fields.setdefault(field.name, field)
            if have.type != field.type:
                try:
                    fields[field.name] = pa.unify_schemas([pa.schema([have]), pa.schema([field])],
                                                          promote_options="permissive").field(0)
                except (pa.ArrowTypeError, pa.ArrowInvalid):
                    pass
    return pa.schema(list(fields.values()))


def resolve(source: TableSource, dataset: ds.FileSystemDataset) -> TableSource:
    """``source`` with its features as the list of columns they name in ``dataset`` (a glob
    expanded in schema order), after checking, before any data is read, that every feature is
    numeric, the label integer or string, and the filter's columns there and comparable.
    Workers given the resolved source read the same columns from every piece."""
    partitions = set(_partition_names(dataset))
    stored = [name for name in dataset.schema.names if name not in partitions]

    def found_in(name: str) -> str:
        if name not in stored:
            return "a partition column, from the folder names"
        return f"in {_file_with_column(dataset, name)}"

    names = _feature_columns(source, dataset.schema, stored, source.uri, found_in)
    if source.label is not None:
        _check_label(dataset.schema, source.label, source.uri, found_in)
    if source.filter is not None:
        _check_filter(source.rows_kept, dataset.schema, source.uri)
    stored_names = tuple((field.name, field.metadata[STORED_NAME].decode()) for field in dataset.schema
                         if field.metadata and STORED_NAME in field.metadata)
    return dataclasses.replace(source, features=tuple(names), stored_names=stored_names)


def _partition_names(dataset: ds.FileSystemDataset) -> list[str]:
    """The columns that come from ``key=value`` folder names. (Read from the files' partition
    expressions: a discovered hive partitioning of a table without such folders reports
    every column in its schema.)"""
    keys: dict[str, None] = {}
    for fragment in dataset.get_fragments():
        keys.update(dict.fromkeys(ds.get_partition_keys(fragment.partition_expression)))
    return [name for name in dataset.schema.names if name in keys]


def _file_with_column(dataset: ds.FileSystemDataset, name: str) -> str:
    """The first file (by path) whose own schema has column ``name`` of the table's type."""
    wanted = dataset.schema.field(name).type
    for fragment in sorted(dataset.get_fragments(), key=lambda f: f.path):
        schema = fragment.physical_schema
        if name in schema.names and schema.field(name).type == wanted:
            return fragment.path
    return dataset.files[0]


def _feature_columns(source: TableSource, schema: pa.Schema, stored: list[str], where: str,
                     found_in=lambda name: "") -> list[str]:
    """The feature columns of ``source`` in ``schema``, each checked to be numeric. Each entry of
    ``source.features`` (one string, or each of a list) names a column or, where no column has
    that name and it holds a glob character, is a glob over ``stored`` (the file's own columns)
    in their order, leaving out the label and the columns an earlier entry gave."""
    entries = source.features if isinstance(source.features, tuple) else (source.features,)
    present = set(schema.names)  # sets, not lists: a wide table has thousands of columns
    names: dict[str, None] = {}  # in order, each once
    for entry in entries:
        if entry in present or not any(char in entry for char in GLOB_CHARS):
            names[entry] = None
            continue
        matched = [name for name in stored if fnmatch.fnmatchcase(name, entry) and name != source.label]
        if not matched:
            raise ShardError(f"{where}: no column matches features = {entry!r} ({some_columns(stored)})")
        names.update(dict.fromkeys(name for name in matched if name not in names))
    names = list(names)
    for name in names:
        _check_feature_type(schema, name, where, found_in)
    return names


def _check_feature_type(schema: pa.Schema, name: str, where: str, found_in=lambda name: "") -> None:
    """Refuse column ``name`` of ``schema`` unless it holds features, naming its type (and where it
    is found); a column of strings is named as one of categories."""
    type_ = _column_type(schema, name, where)
    if feature_kind(type_) is not None or _absent(schema, name):  # an absent column: its rows are refused if used
        return
    found = found_in(name)
    categories = pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_dictionary(type_)
    hint = (": a column of categories; encode it as numbers first (one 0/1 column a category, as "
            "Spark ML's OneHotEncoder writes), or leave it out of the features" if categories else "")
    raise ShardError(f"{where}: feature column {name!r} is {type_}{f' ({found})' if found else ''}: "
                     f"features must be numbers (int, float, bool), lists of numbers, or Spark ML vectors{hint}")


def _column_type(schema: pa.Schema, name: str, where: str) -> pa.DataType:
    # get_field_index is a lookup (schema.names a new list: thousands of columns made this quadratic);
    # -1 also means a name twice, which schema.field refuses below.
    if schema.get_field_index(name) < 0 and name not in schema.names:
        close = difflib.get_close_matches(name, schema.names, n=3)
        hint = (f"did you mean {' or '.join(map(repr, close))}?" if close else some_columns(schema.names))
        raise ShardError(f"{where}: no column {name!r} ({hint})")
    return schema.field(name).type


def _check_label(schema: pa.Schema, name: str, where: str, found_in=lambda name: "") -> None:
    type_ = _column_type(schema, name, where)
    if not is_label_type(type_) and not _absent(schema, name):
        found = found_in(name)
        raise ShardError(f"{where}: label column {name!r} is {type_}{f' ({found})' if found else ''}: "
                         f"labels must be integers, strings or booleans (one value per class)")


def _check_filter(rows: RowFilter, schema: pa.Schema, where: str) -> None:
    """Refuse a filter on a column ``schema`` lacks or comparing values of other types."""
    for name in rows.columns:
        _column_type(schema, name, f"{where}: filter {rows.text!r}")
    try:  # pyarrow checks the types when it evaluates: on no rows, that is all it does
        schema.empty_table().filter(rows.expression)
    except EXPRESSION_ERRORS as exc:
        types = ", ".join(f"{name} is {schema.field(name).type}" for name in rows.columns)
        raise ShardError(f"{where}: filter {rows.text!r} compares values of different types ({types}): {exc}") from None


# ------------------------------------------------------------------ pieces


@dataclass(frozen=True)
class Piece(Specification):
    """A unit of work: one row group of a Parquet file, or a whole ORC file. Plain data
    (:meth:`to_dict`) so a master can send it to a worker."""

    path: str                  # the file, as the table's file system names it
    row_group: int | None      # the Parquet row group; None: the whole file
    start: int                 # the piece's first row within its file (errors name rows in the file)
    rows: int                  # its rows as stored (a filter on stored columns may keep fewer)
    partition: tuple = ()      # ((column, arrow type name, value or None), ...) from the folder names
    deleted: tuple = ()        # rows of the piece (by their index in the file) a table's delete files removed

    @classmethod
    def from_dict(cls, d: dict) -> Piece:
        """The piece :meth:`to_dict` wrote."""
        return cls(d["path"], d["row_group"], d["start"], d["rows"], tuple(tuple(p) for p in d["partition"]),
                   tuple(d.get("deleted", ())))


def table_pieces(source: TableSource, dataset: ds.FileSystemDataset) -> list[Piece]:
    """The pieces of ``source``'s table (``dataset``, :func:`open_dataset`'s) that its filter may
    keep, each with the rows the table's delete files removed from it."""
    return pieces(dataset, source.filter, deleted_rows(source))


def deleted_rows(source: TableSource) -> dict[str, np.ndarray]:
    """The rows of each data file (by path) that ``source``'s table no longer holds although the
    file does (an Iceberg table's positional delete files); none for other tables."""
    reader = VERSIONED_FORMATS.get(source.format)
    if reader is None:
        return {}
    return reader.deleted_rows(source.uri, with_version_fixed(source).version, source.allow_outside_files)


def pieces(dataset: ds.FileSystemDataset, filter: str | None = None,
           deleted: dict[str, np.ndarray] | None = None) -> list[Piece]:
    """The pieces of ``dataset``, sorted by path then row group, leaving out files whose
    partition folders ``filter`` rules out, and pieces with no rows. Reads only the footers.
    ``deleted``: rows removed from each file (:func:`deleted_rows`), given to the pieces they fall in."""
    deleted = deleted or {}
    expression = row_filter(filter).expression if filter else None
    partition_fields = [dataset.schema.field(name) for name in _partition_names(dataset)]
    try:
        fragments = sorted(dataset.get_fragments(filter=expression), key=lambda f: f.path)
    except EXPRESSION_ERRORS as exc:
        raise ShardError(f"filter {filter!r} cannot be applied to this table: {exc}") from None
    found = []
    for fragment in fragments:
        keys = ds.get_partition_keys(fragment.partition_expression)
        partition = tuple((f.name, str(f.type), keys.get(f.name)) for f in partition_fields)
        gone = np.sort(np.asarray(deleted.get(fragment.path, ()), np.int64))
        start = 0
        for group, rows in enumerate(_row_groups(fragment)):
            mine = gone[np.searchsorted(gone, start):np.searchsorted(gone, start + rows)]
            if rows > len(mine):
                found.append(Piece(fragment.path, group if isinstance(fragment, ds.ParquetFileFragment) else None,
                                   start, rows, partition, tuple(int(i) for i in mine)))
            start += rows
    return found


def _row_groups(fragment: ds.FileFragment) -> list[int]:
    """The rows of each row group of a Parquet file; of the whole file for other formats."""
    try:
        if isinstance(fragment, ds.ParquetFileFragment):
            return checked_row_groups(fragment.metadata, fragment.path)
        return [fragment.count_rows()]
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(f"{fragment.path}: not a readable data file ({type(exc).__name__}: {exc})") from exc


def assign(pieces: list[Piece], workers: int, homes: list[dict[str, int]] | None = None) -> list[list[Piece]]:
    """``pieces`` split among ``workers``, balanced by rows: the largest piece first goes to the
    worker with the fewest rows so far (the lower number on a tie), so no worker has more than
    the mean plus one piece. Deterministic; each worker's pieces keep their order in ``pieces``
    (a file's row groups read in turn). A worker may get none when pieces are few.

    ``homes``: where each piece's bytes are stored (``{host: bytes}``, one per piece), so that
    each worker's pieces share a host, on which it can then run. Each worker is given a host
    first (:func:`worker_hosts`); a piece then goes to a worker below the mean whose host holds
    the most of it, the fewest rows first, and only where none does, to the worker with the
    fewest rows: the same bound on a worker's rows."""
    if not isinstance(workers, int) or workers < 1:
        raise TableError(f"cannot assign pieces to {workers!r} workers: need 1 or more")
    hosts = worker_hosts(homes, workers) if homes else [None] * workers
    mean = sum(p.rows for p in pieces) / workers
    rows = [0] * workers
    chosen: list[list[int]] = [[] for _ in range(workers)]
    for i in sorted(range(len(pieces)), key=lambda i: -pieces[i].rows):  # stable: ties keep their order
        on = homes[i] if homes else {}
        local = [w for w in range(workers) if on.get(hosts[w], 0) > 0 and rows[w] < mean]
        w = min(local or range(workers), key=lambda w: (-on.get(hosts[w], 0), rows[w], w))
        chosen[w].append(i)
        rows[w] += pieces[i].rows
    return [[pieces[i] for i in sorted(mine)] for mine in chosen]


def worker_hosts(homes: list[dict[str, int]], workers: int) -> list[str | None]:
    """A host for each of ``workers``, spread by the bytes the hosts hold (``homes``: each piece's
    ``{host: bytes}``): each next worker goes to the host with the most bytes per worker so far
    (by name on a tie); None for all where no host is known."""
    held: dict[str, int] = {}
    for on in homes:
        for host, n in on.items():
            held[host] = held.get(host, 0) + n
    if not held:
        return [None] * workers
    count: dict[str, int] = {}
    hosts = []
    for _ in range(workers):
        host = min(held, key=lambda h: (-held[h] / (1 + count.get(h, 0)), h))
        count[host] = count.get(host, 0) + 1
        hosts.append(host)
    return hosts


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
    names = _feature_columns(source, schema, stored, piece.path)
    if source.label is not None:
        _check_label(schema, source.label, piece.path)
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
    names = _feature_columns(source, schema, stored, piece.path)
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
        _check_feature_type(table.schema, name, where)
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


def _absent(schema: pa.Schema, name: str) -> bool:
    """Whether column ``name`` of a piece's schema is one its file lacks (:func:`_open_piece`)."""
    metadata = schema.field(name).metadata
    return bool(metadata) and ABSENT in metadata


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
        _column_type(schema, name, piece.path)
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
    absent = [name for name in columns if _absent(schema, name)]  # a filter's column may be: null, it keeps no row
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


def label_classes(source: TableSource, dataset: ds.FileSystemDataset | None = None) -> LabelMap:
    """The :class:`LabelMap` of ``source``'s label column over the rows its filter keeps, read
    in one pass over that column alone; a null label raises, naming the file and the row."""
    if source.label is None:
        raise TableError(f"{source.uri}: the table source names no 'label' column")
    dataset = open_dataset(source) if dataset is None else dataset
    _check_label(dataset.schema, source.label, source.uri)
    classes: set = set()
    for piece in table_pieces(source, dataset):
        fragment, schema = _open_piece(source, piece)
        _check_label(schema, source.label, piece.path)
        table = _read_rows(source, piece, fragment, schema, [source.label])
        column = non_null(table.column(source.label).combine_chunks(), source.label, piece.path,
                           table.column(ROW).to_numpy())
        classes.update(pc.unique(label_values(column)).to_pylist())
    if not classes:  # not a null among them (that raised): no rows
        raise ShardError(f"{source.uri}: no row passes the filter {source.filter!r}" if source.filter
                         else f"{source.uri}: the table has no rows")
    try:
        return LabelMap(tuple(sorted(classes)))
    except TypeError:  # integers in some files, strings in others
        raise ShardError(f"{source.uri}: label column {source.label!r} holds integers in some files and "
                         f"strings in others") from None


# ------------------------------------------------------------------ a worker's share of a table


@dataclass(frozen=True)
class TableShard(Specification):
    """One worker's share of a table, read in place: the source, its pieces, and the label
    classes (the same for every share). Saved as a small JSON file whose URI the runtime hands
    out like a Parquet shard's: it is the :class:`shardio.readers.ShardReader` of a
    ``.table.json`` URI."""

    source: TableSource           # resolved (:func:`resolve`): a glob names the same columns everywhere
    pieces: tuple[Piece, ...]
    n_features: int
    classes: LabelMap | None = None
    widths: tuple[int, ...] | None = None  # the features each column gives a row (None: not known)
    uri: str = unsaved("")  # where it was saved, for errors

    suffix = ".table.json"  # how a share's URI ends

    @classmethod
    def open(cls, uri: str) -> TableShard:
        """The share saved at ``uri``; a file that is not one raises :class:`ShardError`."""
        fs, path = filesystem(uri)
        try:
            with fs.open_input_stream(path) as f:
                return dataclasses.replace(cls.from_dict(json.loads(f.read())), uri=uri)
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(f"{uri}: cannot read the table shard: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:  # not JSON, or not a table shard's fields
            raise ShardError(f"{uri}: not a table shard ({type(exc).__name__}: {exc})") from exc

    def save(self, uri: str) -> None:
        """Write the share to ``uri`` (a name ending in :attr:`suffix`), on any file system."""
        with open_output_file(uri) as f:
            f.write(json.dumps(self.to_dict()).encode())

    @property
    def rows(self) -> int:
        """The rows of the pieces as stored (a filter on stored columns may keep fewer)."""
        return sum(p.rows for p in self.pieces)

    def describe(self) -> dict:
        """The reader's description (:meth:`shardio.readers.ShardReader.describe`): raw rows
        have no footer range to check; the label ``classes`` and feature ``columns`` are the
        share's, which the model keeps."""
        if self.rows == 0:
            raise ShardError(f"{self.uri}: shard is empty")
        return {"uri": self.uri, "rows": self.rows, "features": self.n_features, "labels": self.source.label is not None,
                "ranges": {"features": None, "label": None if self.classes is None else (0, len(self.classes) - 1)},
                "classes": None if self.classes is None else self.classes.to_dict(),
                "columns": list(self.source.features), "widths": None if self.widths is None else list(self.widths)}

    def read(self, n_features: int | None, need_labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Every row that passes the filter: float32 features and int64 classes (or None)."""
        blocks = list(self.blocks(n_features, need_labels))
        features = np.concatenate([values for values, _ in blocks])
        labels = None if blocks[0][1] is None else np.concatenate([block_labels for _, block_labels in blocks])
        return features, labels

    def blocks(self, n_features: int | None = None, need_labels: bool = False):
        """``(float32 features, int64 classes or None)`` for each piece with rows, in turn."""
        if need_labels and self.source.label is None:
            raise ShardError(f"{self.uri}: the table source names no label column, but this job needs labels")
        if n_features is not None and n_features != self.n_features:
            raise ShardError(f"{self.uri}: {self.n_features} features per row, expected {n_features}")
        found = 0
        for piece in self.pieces:
            X, y = read_piece(self.source, piece, classes=self.classes, n_features=self.n_features)
            if len(X):
                yield X, y
                found += len(X)
        if found == 0:
            raise ShardError(f"{self.uri}: shard is empty (no row of its pieces passes the filter)")

    def labels(self) -> np.ndarray:
        """The classes of every row, reading the label column alone."""
        if self.source.label is None:
            raise ShardError(f"{self.source.uri}: the table source names no 'label' column: a classifier needs labels")
        parts = []
        for piece in self.pieces:
            fragment, schema = _open_piece(self.source, piece)
            _check_label(schema, self.source.label, piece.path)
            table = _read_rows(self.source, piece, fragment, schema, [self.source.label])
            column = non_null(table.column(self.source.label).combine_chunks(), self.source.label, piece.path,
                               table.column(ROW).to_numpy())
            parts.append(self.classes.encode(column, where=piece.path))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    @classmethod
    def from_dict(cls, d: dict) -> TableShard:
        """The share :meth:`to_dict` wrote."""
        widths = d.get("widths")  # shares written before widths were kept have none
        return cls(TableSource.from_dict(d["source"]), tuple(Piece.from_dict(p) for p in d["pieces"]),
                   int(d["n_features"]), None if d["classes"] is None else LabelMap.from_dict(d["classes"]),
                   None if widths is None else tuple(int(w) for w in widths))
