"""Tables as Spark and Hive write them, read in place: a directory of Parquet or ORC files,
hive-partitioned (``year=2024/country=NL/part-...``) or not, or one file, at any URI
:func:`~iterreduce.storage.filesystems.filesystem` reaches (plain paths, ``file://``, ``hdfs://``, ``s3://``).

The steps, one function each:

- :func:`open_source` opens a :class:`TableSource`'s table at one version: :func:`open_dataset`
  finds the data files (skipping Spark's and Hadoop's side files) and :func:`resolve` checks
  the source against the schema before any data is read;
- :func:`shardio.pieces.pieces` cuts the table into work units (a Parquet row group, or an ORC
  file), plain data a master can send, and :func:`shardio.pieces.assign` balances them among
  workers by rows;
- :func:`shardio.reading.read_piece` reads one as float32 features (rows x features) and int64
  classes; :func:`shardio.reading.label_classes` builds the :class:`~shardio.labels.LabelMap` from
  the label column;
- :class:`shardio.table_shard.TableShard`, a worker's share of the pieces, is the reader of a
  ``.table.json`` URI.

Errors found in the data (a missing or non-numeric column, a null, a ragged array) are
:class:`~iterreduce.exceptions.ShardError` naming the file, column and row; errors in the
source as written (an unknown key, a filter that is not allowed) are :class:`TableError`.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds

from iterreduce.exceptions import ShardError, TableError
from iterreduce.specification import Specification

from . import delta, iceberg
from .columns import STORED_NAME
from .filters import RowFilter, row_filter
from .folder_tables import FolderTable, partition_names
from .lakehouse import parse_version
from .metastore import RegisteredTable, split_reference
from .schema_checks import check_filter, check_label, feature_columns

#: A table's format, and the format of its data files: a Delta Lake table's are Parquet files
#: that its log lists (:mod:`shardio.delta`), an Apache Iceberg table's those its metadata
#: lists (:mod:`shardio.iceberg`).
FILE_FORMATS = {"parquet": "parquet", "orc": "orc", "delta": "parquet", "iceberg": "parquet"}
FORMATS = tuple(FILE_FORMATS)
#: The reader of each format's tables, each with ``version_number(uri, version, allow_outside)``,
#: ``dataset(uri, version, allow_outside)`` and ``deleted_rows(uri, version, allow_outside)``: a new
#: format is a new reader here.
TABLE_READERS = {"parquet": FolderTable("parquet"), "orc": FolderTable("orc"), "delta": delta, "iceberg": iceberg}
#: The formats whose tables have versions (``version``: a Delta version or an Iceberg snapshot id, or a time).
VERSIONED_FORMATS = ("delta", "iceberg")
ROW = "__row_in_file"  # the column read_piece adds: each row's index in its file, for errors


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
    ``metastore_table``: a Parquet or ORC table that a Hive metastore names
    (``thrift://HOST:PORT/db.table``, :mod:`shardio.metastore`): its registered partitions are the
    table, wherever they are, not the folders under ``uri`` (its location).
    """

    uri: str
    features: str | tuple[str, ...]
    label: str | None = None
    format: str = "parquet"
    filter: str | None = None
    version: int | str | None = None
    stored_names: tuple = ()  # ((column, its name in the data files), ...) where a table maps them (resolve)
    allow_outside_files: bool = False  # a Delta or Iceberg log may name files outside the table's folder
    metastore_table: str | None = None  # thrift://HOST:PORT/db.table: the table is its registered partitions

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
        if self.metastore_table is not None:
            split_reference(self.metastore_table)
            if self.format not in ("parquet", "orc"):
                raise TableError(f"table source: 'metastore_table' is for a Parquet or ORC table, and the format is "
                                 f"{self.format!r}")
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
        for key in ("allow_outside_files", "metastore_table"):  # written only when set: shares read as before they were
            if not d[key]:
                del d[key]
        return d


def reader_of(source: TableSource):
    """The reader of ``source``'s table: its format's (:data:`TABLE_READERS`), or for a table the
    metastore names, its registered partitions' (:class:`~shardio.metastore.RegisteredTable`)."""
    if source.metastore_table is not None:
        return RegisteredTable(source.metastore_table, source.format)
    return TABLE_READERS[source.format]


# ------------------------------------------------------------------ opening and checking


def with_version_fixed(source: TableSource) -> TableSource:
    """``source`` with its version fixed to the number it names now (the newest when none), so
    that every step of a job reads the same files however the table changes meanwhile; a
    table without versions as it is."""
    if source.format not in VERSIONED_FORMATS or isinstance(source.version, int):
        return source
    number = reader_of(source).version_number(source.uri, source.version, source.allow_outside_files)
    return dataclasses.replace(source, version=number)


def open_dataset(source: TableSource) -> ds.FileSystemDataset:
    """The table of ``source`` as a ``pyarrow.dataset`` of its data files at its version, read by
    its format's reader (:data:`TABLE_READERS`): a folder's files (:mod:`shardio.folder_tables`), or
    a Delta Lake or Iceberg table's live files at its version."""
    return reader_of(source).dataset(source.uri, with_version_fixed(source).version, source.allow_outside_files)


def open_source(source: TableSource) -> tuple[TableSource, ds.FileSystemDataset]:
    """The table of ``source`` opened once at a fixed version (:func:`with_version_fixed`), and
    ``source`` resolved against it (:func:`resolve`): the one step a reader takes before it
    lists pieces or reads rows."""
    source = with_version_fixed(source)
    dataset = open_dataset(source)
    return resolve(source, dataset), dataset


def resolve(source: TableSource, dataset: ds.FileSystemDataset) -> TableSource:
    """``source`` with its features as the list of columns they name in ``dataset`` (a glob
    expanded in schema order), after checking, before any data is read, that every feature is
    numeric, the label integer or string, and the filter's columns there and comparable.
    Workers given the resolved source read the same columns from every piece."""
    partitions = set(partition_names(dataset))
    stored = [name for name in dataset.schema.names if name not in partitions]

    def found_in(name: str) -> str:
        if name not in stored:
            return "a partition column, from the folder names"
        return f"in {_file_with_column(dataset, name)}"

    names = feature_columns(source, dataset.schema, stored, source.uri, found_in)
    if source.label is not None:
        check_label(dataset.schema, source.label, source.uri, found_in)
    if source.filter is not None:
        check_filter(source.rows_kept, dataset.schema, source.uri)
    stored_names = tuple((field.name, field.metadata[STORED_NAME].decode()) for field in dataset.schema
                         if field.metadata and STORED_NAME in field.metadata)
    return dataclasses.replace(source, features=tuple(names), stored_names=stored_names)


def _file_with_column(dataset: ds.FileSystemDataset, name: str) -> str:
    """The first file (by path) whose own schema has column ``name`` of the table's type."""
    wanted = dataset.schema.field(name).type
    for fragment in sorted(dataset.get_fragments(), key=lambda f: f.path):
        schema = fragment.physical_schema
        if name in schema.names and schema.field(name).type == wanted:
            return fragment.path
    return dataset.files[0]
