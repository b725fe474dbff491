"""Parquet files read so that their footers cannot fool the reader: the row counts a footer says
are checked against each other (:func:`checked_row_groups`) and against the rows read, a batch
at a time (:func:`counted_batches`, :func:`read_counted`), so a tiny file claiming billions of
rows makes no allocation of that size. Errors are :class:`ShardError`\\ s naming the file."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from iterreduce.exceptions import ShardError

from .columns import some_columns
from .shards import ALTERED, STREAM_ROWS


def checked_row_groups(meta: pq.FileMetaData, path: str) -> list[int]:
    """The rows of each row group that the Parquet footer ``meta`` of the file at ``path`` says,
    refused (:class:`ShardError`) where the footer disagrees with itself: a file count other than
    its groups' sum, or a group whose flat columns hold another count of values (a damaged or
    altered footer). A footer that agrees with itself is still checked against the rows read
    (:func:`counted_batches`): no reader allocates by it."""
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    if meta.num_rows < 0 or min(groups, default=0) < 0 or sum(groups) != meta.num_rows:
        raise ShardError(f"{path}: its footer says {meta.num_rows} rows, but its row groups say {sum(groups)} "
                         f"({ALTERED})")
    return [checked_group_rows(meta, path, g) for g in range(meta.num_row_groups)]


def checked_group_rows(meta: pq.FileMetaData, path: str, group: int) -> int:
    """The rows the footer ``meta`` says row group ``group`` holds, refused where one of its flat
    columns (a value a row, nulls counted) holds another count of values."""
    rows = meta.row_group(group).num_rows
    for i in range(meta.num_columns):
        column = meta.row_group(group).column(i)
        if column.num_values != rows and meta.schema.column(i).max_repetition_level == 0:
            raise ShardError(f"{path}: its footer says {rows} rows in row group {group}, but its column "
                             f"{column.path_in_schema!r} holds {column.num_values} values there ({ALTERED})")
    return rows


def counted_batches(batches, claimed: int, path: str, group: int | None = None):
    """``batches``, the rows of the file at ``path`` (of its row group ``group``, or the whole
    file), in turn, refused where they are other than the ``claimed`` rows its footer says: as
    soon as they pass it (the rest counted, a batch at a time), or at the end. The error names
    the file and both counts."""
    held = 0
    for batch in batches:
        held += batch.num_rows
        if held > claimed:
            raise miscounted_rows(path, claimed, held + sum(rest.num_rows for rest in batches), group)
        yield batch
    if held != claimed:
        raise miscounted_rows(path, claimed, held, group)


def miscounted_rows(path: str, claimed: int, held: int, group: int | None) -> ShardError:
    """The error of a file (or of its row group ``group``) holding ``held`` rows where its footer says ``claimed``."""
    where = ("", "the file") if group is None else (f" in row group {group}", "the row group")
    return ShardError(f"{path}: its footer says {claimed} rows{where[0]}, but {where[1]} holds {held} ({ALTERED})")


def read_counted(path: str, fs, columns: list[str]) -> pa.Table:
    """``columns`` of the whole Parquet file at ``path`` on file system ``fs``, read a batch at a
    time and counted against its footer (:func:`checked_row_groups`, :func:`counted_batches`):
    a tiny file claiming billions of rows makes no allocation of that size."""
    parquet = pq.ParquetFile(path, filesystem=fs, pre_buffer=False)
    with parquet:
        missing = [name for name in columns if name not in parquet.schema_arrow.names]
        if missing:
            raise ShardError(f"{path}: no column {missing[0]!r} ({some_columns(parquet.schema_arrow.names)})")
        batches = []
        for group, claimed in enumerate(checked_row_groups(parquet.metadata, path)):
            rows = parquet.iter_batches(batch_size=STREAM_ROWS, row_groups=[group], columns=columns)
            batches += counted_batches(rows, claimed, path, group)
        return pa.Table.from_batches(batches, schema=pa.schema([parquet.schema_arrow.field(c) for c in columns]))
