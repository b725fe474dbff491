"""Reading a shard, whatever holds its rows: the one place that chooses the reader from the URI.

A shard URI names a Parquet shard (``.parquet``: :class:`shardio.shards.ParquetShard`) or a
worker's share of a table read in place (``.table.json``: :class:`shardio.table_shard.TableShard`).
Both are :class:`ShardReader`\\ s; the functions here (what programs call) work on either, and a
new kind of shard is one more class in :data:`READERS`. :class:`ShardFiles` is what the runtime
is given of them (a program's :attr:`~iterreduce.program.Program.reader`).

Run as a module, this is the footer reader's helper process (:mod:`shardio.footers`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from iterreduce.exceptions import ShardError
from iterreduce.process import stopping
from iterreduce.program import Reader
from iterreduce.storage.filesystems import CLIENT_ENVIRONMENT, client_environment, filesystem, join
from iterreduce.storage.rowfile import RowFile

from . import footers
from .labels import LabelMap
from .shards import ParquetShard, as_float32
from .table_shard import TableShard


class ShardReader(Protocol):
    """What the runtime needs of one shard. Errors are :class:`~iterreduce.exceptions.ShardError`
    naming the file (and the row and column where known)."""

    suffix: str  # how the URIs of this kind of shard end

    @classmethod
    def open(cls, uri: str) -> ShardReader:
        """The reader of the shard at ``uri``."""

    def describe(self) -> dict:
        """``uri``, ``rows``, ``features`` (per row), ``labels`` (whether it has them), ``ranges``
        (:func:`shardio.shards.footer_ranges`' form), ``classes`` (a :class:`LabelMap` as a
        dict, or None) and ``columns`` (the feature columns' names, or None), read cheaply."""

    def read(self, n_features: int | None, need_labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Every row: float32 features (rows x features) and int64 classes (or None)."""

    def blocks(self, n_features: int | None, need_labels: bool) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
        """The rows a block at a time: feature values (float32, or uint8 intensities that
        :func:`shardio.shards.as_float32` makes features) and int64 classes (or None)."""

    def labels(self) -> np.ndarray:
        """Every row's class, reading the labels alone."""


#: The kinds of shard, told apart by how their URIs end.
READERS = (ParquetShard, TableShard)
SUFFIXES = tuple(kind.suffix for kind in READERS)


def open_reader(uri: str) -> ShardReader:
    """The reader of the shard at ``uri``, chosen by how the URI ends (a Parquet shard otherwise)."""
    return next((kind for kind in READERS if uri.endswith(kind.suffix)), ParquetShard).open(uri)


@dataclass
class ShardData:
    """One shard: float32 features (rows x features) and optional int64 labels. The features
    are an array in memory, or a :class:`~iterreduce.storage.rowfile.RowFile` on local disk for a
    shard streamed by :func:`spill_shard` (same rows, same bits, read on demand)."""

    index: int
    uri: str
    features: np.ndarray | RowFile
    labels: np.ndarray | None

    @property
    def rows(self) -> int:
        return int(self.features.shape[0])


def list_shards(uri: str) -> list[str]:
    """URIs of the shards (of every kind in :data:`READERS`) in directory ``uri`` (or ``uri``
    itself if a file), sorted."""
    fs, path = filesystem(uri)
    try:
        info = fs.get_file_info(path)
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(f"{uri}: cannot read: {exc}") from exc
    if info.type == pafs.FileType.NotFound:
        raise ShardError(f"{uri}: no such shard file or directory")
    if info.type == pafs.FileType.File:
        return [uri]
    entries = fs.get_file_info(pafs.FileSelector(path))
    names = sorted(e.base_name for e in entries if e.is_file and e.base_name.endswith(SUFFIXES))
    if not names:
        raise ShardError(f"{uri}: directory holds no .parquet shards")
    return [join(uri, name) for name in names]


def read_shard(uri: str, index: int = 0, n_features: int | None = None, need_labels: bool = False) -> ShardData:
    """Read one shard into memory, checking its schema and values; every error names the
    file (and the row and column where known)."""
    features, labels = open_reader(uri).read(n_features, need_labels)
    return ShardData(index, uri, features, labels)


def spill_shard(uri: str, directory: str, index: int = 0, n_features: int | None = None,
                need_labels: bool = False) -> ShardData:
    """Copy one shard to a :class:`~iterreduce.storage.rowfile.RowFile` in local ``directory``, a
    block at a time, with the checks of :func:`read_shard`: the shard's features never sit
    whole in memory (its labels do, 8 bytes a row). Rows come back from the file with the
    bits :func:`read_shard` gives them."""
    rows, labels = None, []
    try:
        for values, block_labels in open_reader(uri).blocks(n_features, need_labels):
            if rows is None:
                rows = RowFile.new(directory, f"shard-{index:05d}-", values.shape[1], values.dtype,
                                   convert=as_float32)
            rows.append(values)
            if block_labels is not None:
                labels.append(block_labels)
    except BaseException:
        if rows is not None:
            rows.close()
        raise
    return ShardData(index, uri, rows, np.concatenate(labels) if labels else None)


def read_labels(uri: str) -> np.ndarray:
    """The labels of one shard, reading only them (e.g. to count the classes)."""
    return open_reader(uri).labels()


def describe_shard(uri: str) -> dict:
    """One shard's entry of :func:`shard_info` (:meth:`ShardReader.describe`), read in this process."""
    return open_reader(uri).describe()


def shard_info(uris: list[str]) -> list[dict]:
    """What the footers say of each shard, without reading its data (:meth:`ShardReader.describe`).
    Refuses a shard the footer already shows to be unusable: unreadable, of another schema,
    empty, with infinite features or negative labels.

    The footers are read in a helper process (:mod:`shardio.footers`): on some corrupt footers
    pyarrow ends the process that reads them (std::terminate), which must be an error naming the
    shard, not the death of the master."""
    return [_footer_reader.describe(uri, client_environment()) for uri in uris]


_footer_reader = footers.FooterReader("shardio.readers")  # this module: shard_info's helper process, started on first use


class ShardFiles(Reader):
    """Parquet shards and shares of tables, as the runtime sees them: :func:`list_shards`,
    :func:`shard_info`."""

    def list_shards(self, uri: str) -> list[str]:
        return list_shards(uri)

    def describe(self, uris: list[str]) -> list[dict]:
        return shard_info(uris)


def describe_as_caller(uri: str, environment: tuple[str, ...]) -> dict:
    """:func:`describe_shard` in the helper process, which outlives the environment it was started
    with: HDFS is reached with the caller's configuration and login (:data:`CLIENT_ENVIRONMENT`)."""
    for var, value in zip(CLIENT_ENVIRONMENT, environment):
        if value:
            os.environ[var] = value
        else:
            os.environ.pop(var, None)
    return describe_shard(uri)


def shard_classes(infos_or_uris) -> LabelMap | None:
    """The :class:`~shardio.labels.LabelMap` the shards' labels index (None: class i is i), from
    :func:`shard_info` entries or shard URIs; shards that disagree raise :class:`ShardError`
    naming two of them."""
    infos = [describe_shard(x) if isinstance(x, str) else x for x in infos_or_uris]
    for info in infos[1:]:
        same_classes(info, infos[0])
    first = infos[0].get("classes") if infos else None
    return None if first is None else LabelMap.from_dict(first)


def same_classes(info: dict, reference: dict) -> None:
    """Raise :class:`ShardError` unless the shards of :func:`shard_info` entries ``info`` and
    ``reference`` hold the same label classes (e.g. a validation shard and the training shards)."""
    def own(c):  # integer classes 0..K-1 are what a shard without classes means
        return None if c is None or c["classes"] == list(range(len(c["classes"]))) else c["classes"]

    if own(info.get("classes")) != own(reference.get("classes")):
        def show(c):
            return "none (class i is i)" if c is None else repr(c["classes"][:10])
        raise ShardError(f"{info['uri']}: its label classes {show(info.get('classes'))} differ from those of "
                         f"{reference['uri']} ({show(reference.get('classes'))}): the shards come from different "
                         f"data sets")


if __name__ == "__main__":  # the footer reader's helper; SIGINT, SIGTERM: end by the signal, with no traceback
    raise SystemExit(stopping.run(lambda: footers.serve(describe_as_caller)))
