"""A table's pieces (:class:`Piece`: a Parquet row group, or an ORC file), the units of work:
:func:`pieces` lists those a filter may keep, reading only the footers, and :func:`assign`
balances them among workers by rows, each worker's on a host that stores its blocks where it can."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from iterreduce.exceptions import ShardError, TableError
from iterreduce.specification import Specification

from .counted import checked_row_groups
from .filters import row_filter
from .folder_tables import partition_names
from .schema_checks import EXPRESSION_ERRORS
from .tables import TableSource, reader_of


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
    """The pieces of ``source``'s table that its filter may keep, each with the rows the table's
    delete files removed from it (``source`` and ``dataset`` as :func:`~shardio.tables.open_source`
    gives them: one version of the table)."""
    return pieces(dataset, source.filter, deleted_rows(source))


def deleted_rows(source: TableSource) -> dict[str, np.ndarray]:
    """The rows of each data file (by path) that ``source``'s table no longer holds although the
    file does (an Iceberg table's positional delete files); none for other tables. ``source``:
    as :func:`~shardio.tables.open_source` gives it, its version fixed."""
    return reader_of(source).deleted_rows(source.uri, source.version, source.allow_outside_files)


def pieces(dataset: ds.FileSystemDataset, filter: str | None = None,
           deleted: dict[str, np.ndarray] | None = None) -> list[Piece]:
    """The pieces of ``dataset``, sorted by path then row group, leaving out files whose
    partition folders ``filter`` rules out, and pieces with no rows. Reads only the footers.
    ``deleted``: rows removed from each file (:func:`deleted_rows`), given to the pieces they fall in."""
    deleted = deleted or {}
    expression = row_filter(filter).expression if filter else None
    partition_fields = [dataset.schema.field(name) for name in partition_names(dataset)]
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
