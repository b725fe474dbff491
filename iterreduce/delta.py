"""Delta Lake tables read in place: the live data files of one version, from the table's log.

A Delta table is a folder of Parquet files and a ``_delta_log/`` that says which of them are
the table at each version: an overwrite, a delete or an update adds new files and marks old
ones removed, which stay on disk until a VACUUM. The log is read with ``deltalake`` (delta-rs,
the ``delta`` extra); the files it names are then read as any other Parquet files, so the
pieces, the balance among workers and the checks are those of every table, and a worker
needs no Delta library: the version is pinned when the job starts, and the pieces it is sent
name the files.

Read: the newest version, or one named by number or by time (``version``); partition values
from the log; deletion vectors applied (the rows they mark are left out of each piece);
column mapping resolved (the files' ``col-<uuid>`` names read as the table's). A reader
feature of the protocol this reader does not know is refused, naming the table.
"""

from __future__ import annotations

import datetime
import functools
import json
import posixpath
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from .columns import STORED_NAME, plain_schema
from . import hadoopconf
from .exceptions import ShardError, TableError
from .filesystems import filesystem
from .lakehouse import once_a_version, parse_version

#: The schema's field metadata naming a column in the data files, where the table maps names.
PHYSICAL_NAME = "delta.columnMapping.physicalName"
#: Reader features whose tables this reader reads as the log lists them (the others change
#: what a data file's rows mean: deletion vectors, column mapping, type widening, ...).
KNOWN_READER_FEATURES = frozenset({"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck", "columnMapping"})


def _deltalake():
    try:
        import deltalake
    except ImportError:
        raise TableError("reading a Delta Lake table needs the deltalake package: "
                         "pip install 'dbn-yarn[delta]'") from None
    return deltalake


def table_uri(uri: str) -> str:
    """The URI delta-rs is given: an ``hdfs://`` table's NameNode as Hadoop's configuration names
    it (``hdfs:///warehouse/t`` has none of its own), a local path absolute."""
    parts = urlparse(uri)
    if parts.scheme == "hdfs":
        host, port = hadoopconf.namenode_address(parts.hostname or "", parts.port)
        return f"hdfs://{host}:{port}{parts.path}" if port else f"hdfs://{host}{parts.path}"
    if parts.scheme in ("", "file"):
        return posixpath.abspath(parts.path if parts.scheme else uri)
    return uri


def _load(uri: str, version=None):
    """The ``deltalake.DeltaTable`` at ``uri``, at ``version`` (see :func:`parse_version`), checked
    to be one this reader reads; :class:`TableError` naming the table otherwise."""
    deltalake = _deltalake()
    when = parse_version(version)
    try:
        table = deltalake.DeltaTable(table_uri(uri), version=when if isinstance(when, int) else None)
        if isinstance(when, datetime.datetime):
            table.load_as_version(when)
    except deltalake.exceptions.TableNotFoundError:
        raise TableError(f"{uri}: no Delta Lake table there (no _delta_log/ with a commit in it)") from None
    except (deltalake.exceptions.DeltaError, OSError, ValueError) as exc:
        at = f" at version {version!r}" if version is not None else ""
        raise TableError(f"{uri}: cannot read the Delta Lake table{at}: {_first_line(exc)}") from None
    _check_readable(uri, table)
    return table


#: A version number's table, read once (:func:`~iterreduce.lakehouse.once_a_version`).
load = once_a_version(_load)


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def _check_readable(uri: str, table) -> None:
    """Refuse what this reader would read wrongly: column mapping, deletion vectors on any file,
    a reader feature it does not know."""
    features = set(table.protocol().reader_features or ())
    mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mapping not in ("none", "name", "id"):
        raise TableError(f"{uri}: the Delta Lake table's delta.columnMapping.mode is {mapping!r}, which this "
                         f"reader does not know (it reads none, name and id)")
    if "deletionVectors" in features:
        _deletion_vectors(uri, table)  # refused now, not when a worker reads: they cannot be read
    unknown = sorted(features - KNOWN_READER_FEATURES - {"deletionVectors"})
    if unknown:
        raise TableError(f"{uri}: the Delta Lake table needs reader feature{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(unknown)}, which this reader does not know: write the version to train on "
                         f"as plain Parquet")


def dataset(uri: str, version: int) -> ds.FileSystemDataset:
    """The table at ``uri`` at ``version`` (a number: see :func:`pin`) as a ``pyarrow.dataset`` of its
    live files, the partition values from the log, the schema the table's own."""
    table = load(uri, version)
    schema = _with_stored_names(plain_schema(pa.schema(table.schema().to_arrow())), table)
    partition_columns = table.metadata().partition_columns
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    if not actions:
        raise ShardError(f"{uri}: the Delta Lake table holds no data files at version {table.version()}")
    fs, root = filesystem(uri)
    paths, partitions = [], []
    for action in actions:
        paths.append(_file_path(action["path"], root, uri))
        partitions.append(_partition_expression(action, partition_columns, schema, uri))
    return ds.FileSystemDataset.from_paths(paths, schema=schema, format=ds.ParquetFileFormat(), filesystem=fs,
                                           partitions=partitions)


def _with_stored_names(schema: pa.Schema, table) -> pa.Schema:
    """``schema`` with each column's name in the data files (column mapping: ``col-<uuid>``) in its
    field metadata (:data:`~iterreduce.columns.STORED_NAME`), where the table maps names."""
    stored = {field["name"]: field["metadata"].get(PHYSICAL_NAME)
              for field in json.loads(table.schema().to_json())["fields"]}
    return pa.schema([field.with_metadata({STORED_NAME: stored[field.name]}) if stored.get(field.name) else field
                      for field in schema])


def _file_path(path: str, root: str, uri: str) -> str:
    """A data file's path on the table's file system: the log names it relative to the table's
    folder, percent-encoded, or (a shallow clone's) as an absolute URI."""
    if "://" in path:
        parts = urlparse(path)
        if (parts.scheme or "file") != (urlparse(uri).scheme or "file"):
            raise TableError(f"{uri}: the Delta Lake log names a data file on another file system: {path}")
        return unquote(parts.path)
    return posixpath.join(root, unquote(path))


def _partition_expression(action: dict, names: list[str], schema: pa.Schema, uri: str):
    """The file's partition values as an expression (``year == 2024 and country == 'NL'``)."""
    conditions = []
    for name in names:
        value, type_ = action.get(f"partition.{name}"), schema.field(name).type
        if value is None:
            conditions.append(pc.field(name).is_null())
            continue
        try:
            scalar = pa.scalar(value).cast(type_) if not isinstance(value, str) or pa.types.is_string(type_) \
                else pa.array([value]).cast(type_)[0]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TableError(f"{uri}: partition value {name} = {value!r} of {action['path']} is not a {type_}: "
                             f"{exc}") from None
        conditions.append(pc.field(name) == scalar)
    if not conditions:
        return pc.scalar(True)
    expression = conditions[0]
    for condition in conditions[1:]:
        expression = expression & condition
    return expression


def pin(uri: str, version=None) -> int:
    """The version number the table at ``uri`` has at ``version`` (a number, a time, or None for
    the newest): what a job reads throughout, however the table changes meanwhile."""
    return load(uri, version).version()


@functools.lru_cache(maxsize=4)
def deleted_rows(uri: str, version: int) -> dict[str, np.ndarray]:
    """The rows of each data file (by its path on the table's file system) that the version's
    deletion vectors remove (Spark writes them for a DELETE, UPDATE or MERGE where
    ``delta.enableDeletionVectors`` is on)."""
    table = load(uri, version)
    if "deletionVectors" not in set(table.protocol().reader_features or ()):
        return {}
    _, root = filesystem(uri)
    vectors = _deletion_vectors(uri, table)
    found = {}
    for i in range(vectors.num_rows):
        keep = vectors.column("selection_vector")[i].values.to_numpy(zero_copy_only=False)
        found[_file_path(vectors.column("filepath")[i].as_py(), root, uri)] = np.flatnonzero(~keep)
    return found


def _deletion_vectors(uri: str, table) -> pa.Table:
    """``(filepath, selection_vector)`` of each file with a deletion vector (True: a row kept)."""
    try:
        return pa.table(table.deletion_vectors())
    except Exception as exc:  # delta-rs's own error type varies with the fault
        raise TableError(f"{uri}: cannot read the Delta Lake table's deletion vectors: {_first_line(exc)}") from None
