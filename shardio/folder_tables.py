"""A table that is the data files of a folder, as Spark and Hive write them: Parquet or ORC files,
hive-partitioned (``year=2024/country=NL/part-...``) or not, or one file, at any URI
:func:`~iterreduce.storage.filesystems.filesystem` reaches. It has no versions: what the folder
holds now is the table (a Delta Lake or Iceberg table's folder read so is refused: it holds files
that are no longer the table). :class:`FolderTable` reads it as :mod:`shardio.delta` and
:mod:`shardio.iceberg` read theirs (``version_number``, ``dataset``, ``deleted_rows``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from iterreduce.exceptions import ShardError
from iterreduce.storage.filesystems import filesystem

from .columns import plain_schema
from .lakehouse import check_not_lakehouse

#: Names of Spark's and Hadoop's side files and folders (_SUCCESS, _committed_*, _started_*,
#: _temporary/, .part-*.crc): never data, and _temporary/ holds unfinished writes.
SIDE_FILE_PREFIXES = ("_", ".")


class FolderTable:
    """The reader of a folder's tables of ``file_format`` ("parquet" or "orc") files."""

    def __init__(self, file_format: str):
        self.file_format = file_format

    def version_number(self, uri: str, version=None, allow_outside: bool = False) -> None:
        """None: a folder's table has no versions."""
        return None

    def dataset(self, uri: str, version=None, allow_outside: bool = False) -> ds.FileSystemDataset:
        """The folder at ``uri`` as a ``pyarrow.dataset``: its data files (Spark's and Hadoop's side
        files skipped) and hive partition folders (``key=value``) as columns, with the merged
        schema of its files (:func:`with_merged_schema`)."""
        fs, path = filesystem(uri)
        check_not_lakehouse(fs, path, uri)  # its folder holds files that are no longer the table
        try:
            # exclude_invalid_files would open every file while listing (slow on HDFS): side files are
            # skipped by name instead, and a file that is not Parquet/ORC fails when read, named.
            options = dict(filesystem=fs, format=self.file_format, partitioning="hive",
                           ignore_prefixes=list(SIDE_FILE_PREFIXES), exclude_invalid_files=False)
            dataset = with_merged_schema(ds.dataset(path, **options))
        except FileNotFoundError:
            raise ShardError(f"{uri}: no such file or directory") from None
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(f"{uri}: cannot open as a {self.file_format} table ({type(exc).__name__}: {exc})") from exc
        if not dataset.files:
            raise ShardError(f"{uri}: no data files (side files, whose names start with "
                             f"{' or '.join(map(repr, SIDE_FILE_PREFIXES))}, are skipped)")
        return dataset

    def deleted_rows(self, uri: str, version=None, allow_outside: bool = False) -> dict[str, np.ndarray]:
        """None: a folder's files hold their rows."""
        return {}


def partition_names(dataset: ds.FileSystemDataset) -> list[str]:
    """The columns that come from ``key=value`` folder names. (Read from the files' partition
    expressions: a discovered hive partitioning of a table without such folders reports
    every column in its schema.)"""
    keys: dict[str, None] = {}
    for fragment in dataset.get_fragments():
        keys.update(dict.fromkeys(ds.get_partition_keys(fragment.partition_expression)))
    return [name for name in dataset.schema.names if name in keys]


def with_merged_schema(dataset: ds.FileSystemDataset) -> ds.FileSystemDataset:
    """``dataset`` (discovered: the first file's schema) with the merged schema of all its files, as
    Spark's ``mergeSchema`` reads a table whose files differ: a column that older files lack is
    null in their rows (:data:`shardio.schema_checks.ABSENT`), a type that later files widen (int32 to int64, float to
    double) the wider; string views as the strings they hold. The footers are read once: the
    fragments keep them, and :func:`shardio.pieces.pieces` cuts the row groups from them."""
    fragments = sorted(dataset.get_fragments(), key=lambda fragment: fragment.path)
    schemas = [_physical_schema(fragment) for fragment in fragments]
    if not schemas or all(schema.equals(schemas[0]) for schema in schemas[1:]):
        merged = dataset.schema
    else:
        stored = _merged_fields(schemas)
        partitions = set(partition_names(dataset)) - set(stored.names)
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
