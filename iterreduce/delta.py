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
feature of the protocol this reader does not know is refused, naming the table; so is a file the
log names outside the table's folder (a relative path always, an absolute URI unless the user
allows it: a shallow clone's), naming the commit file and the entry.
"""

from __future__ import annotations

import datetime
import functools
import json
import posixpath
import re
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .columns import STORED_NAME, plain_schema
from . import hadoopconf
from .exceptions import ShardError, TableError
from .filesystems import filesystem
from .lakehouse import inside_table, once_a_version, outside_table, parse_version

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


def _load(uri: str, version=None, allow_outside: bool = False):
    """The ``deltalake.DeltaTable`` at ``uri``, at ``version`` (see :func:`parse_version`), checked
    to be one this reader reads (``allow_outside``: its deletion vectors may lie outside the table's
    folder); :class:`TableError` naming the table otherwise."""
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
    _check_readable(uri, table, allow_outside)
    return table


#: A version number's table, read once (:func:`~iterreduce.lakehouse.once_a_version`).
load = once_a_version(_load)


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


def _check_readable(uri: str, table, allow_outside: bool = False) -> None:
    """Refuse what this reader would read wrongly: column mapping, deletion vectors on any file (or
    stored outside the table's folder, unless ``allow_outside``), a reader feature it does not know."""
    features = set(table.protocol().reader_features or ())
    mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    if mapping not in ("none", "name", "id"):
        raise TableError(f"{uri}: the Delta Lake table's delta.columnMapping.mode is {mapping!r}, which this "
                         f"reader does not know (it reads none, name and id)")
    if "deletionVectors" in features:
        _check_vector_paths(uri, table, allow_outside)  # before delta-rs opens what the log names
        _deletion_vectors(uri, table)  # refused now, not when a worker reads: they cannot be read
    unknown = sorted(features - KNOWN_READER_FEATURES - {"deletionVectors"})
    if unknown:
        raise TableError(f"{uri}: the Delta Lake table needs reader feature{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(unknown)}, which this reader does not know: write the version to train on "
                         f"as plain Parquet")


#: Names in ``_delta_log/``: a commit, and a classic checkpoint (one file, or part i of n).
COMMIT = re.compile(r"(\d{20})\.json")
CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(\.\d+\.\d+)?\.parquet")


def _check_vector_paths(uri: str, table, allow_outside: bool) -> None:
    """Refuse a deletion vector the log stores by absolute path (``storageType`` "p") outside the
    table's folder, unless ``allow_outside``: :class:`TableError` naming the log file and the entry."""
    fs, root = filesystem(uri)
    for log_file, entry in _vector_paths(fs, root, table.version()):
        parts = urlparse(entry)
        if parts.scheme and parts.scheme != (urlparse(uri).scheme or "file"):
            raise TableError(f"{uri}: the Delta Lake log ({log_file}) names a deletion vector on another file "
                             f"system: {entry}")
        if not allow_outside and not inside_table(unquote(parts.path), root, fs):
            raise outside_table(uri, f"the Delta Lake log ({log_file})", entry, absolute=True)


def _vector_paths(fs, root: str, version: int):
    """``(log file, path)`` of each deletion vector stored by path that the log at ``version`` may
    hold live: those of the newest checkpoint at or before it and of the commits after that."""
    folder = posixpath.join(root, "_delta_log")
    checkpoints: dict[int, list[str]] = {}
    commits: dict[int, str] = {}
    for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
        if (found := CHECKPOINT.fullmatch(info.base_name)) and int(found[1]) <= version:
            checkpoints.setdefault(int(found[1]), []).append(info.path)
        elif (found := COMMIT.fullmatch(info.base_name)) and int(found[1]) <= version:
            commits[int(found[1])] = info.path
    start = max(checkpoints, default=-1)
    for path in checkpoints.get(start, []):
        add = pq.read_schema(path, filesystem=fs).field("add").type
        if add.get_field_index("deletionVector") < 0:
            continue
        vectors = pq.read_table(path, filesystem=fs, columns=["add.deletionVector.storageType",
                                                              "add.deletionVector.pathOrInlineDv"])
        for kind, entry in zip(*(vectors.column(i).to_pylist() for i in range(2))):
            if kind == "p":
                yield path, entry
    for number in sorted(n for n in commits if n > start):
        with fs.open_input_stream(commits[number]) as stream:
            for line in stream.read().splitlines():
                try:
                    vector = json.loads(line).get("add", {}).get("deletionVector") or {}
                except (ValueError, AttributeError):
                    continue
                if isinstance(vector, dict) and vector.get("storageType") == "p":
                    yield commits[number], str(vector.get("pathOrInlineDv"))


def dataset(uri: str, version: int, allow_outside: bool = False) -> ds.FileSystemDataset:
    """The table at ``uri`` at ``version`` (a number: see :func:`pin`) as a ``pyarrow.dataset`` of its
    live files, the partition values from the log, the schema the table's own at that version.
    A file the log names outside the table's folder is refused (:func:`_file_path`) unless
    ``allow_outside`` and named by an absolute URI (a shallow clone's)."""
    table = load(uri, version, allow_outside)
    schema = _with_stored_names(plain_schema(pa.schema(table.schema().to_arrow())), table)
    partition_columns = table.metadata().partition_columns
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    if not actions:
        raise ShardError(f"{uri}: the Delta Lake table holds no data files at version {table.version()}")
    fs, root = filesystem(uri)
    paths, partitions = [], []
    for action in actions:
        paths.append(_file_path(action["path"], fs, root, uri, table.version(), allow_outside))
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


def _file_path(entry: str, fs, root: str, uri: str, version: int, allow_outside: bool) -> str:
    """A data file's path on the table's file system: the log names it relative to the table's
    folder, percent-encoded, or (a shallow clone's) by an absolute URI. It must lie in the table's
    folder (``..`` resolved, links followed), an absolute one also outside it where ``allow_outside``:
    else :class:`TableError` naming the table, the log file and the entry."""
    parts = urlparse(entry)
    absolute = bool(parts.scheme) or entry.startswith("/")
    if parts.scheme and parts.scheme != (urlparse(uri).scheme or "file"):
        raise TableError(f"{uri}: the Delta Lake log names a data file on another file system: {entry}")
    path = unquote(parts.path) if absolute else posixpath.normpath(posixpath.join(root, unquote(entry)))
    if not inside_table(path, root, fs) and not (absolute and allow_outside):
        raise outside_table(uri, f"the Delta Lake log ({_log_file(fs, root, entry, version)})", entry, absolute)
    return path


def _log_file(fs, root: str, entry: str, version: int) -> str:
    """The commit file that adds ``entry`` (the newest at or before ``version``), for errors; the log's
    folder where a checkpoint holds it."""
    folder = posixpath.join(root, "_delta_log")
    commits = sorted((info.path for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
                      if re.fullmatch(r"\d{20}\.json", info.base_name) and int(info.base_name[:20]) <= version),
                     reverse=True)
    for path in commits:
        with fs.open_input_stream(path) as stream:
            for line in stream.read().splitlines():
                try:
                    action = json.loads(line)
                except ValueError:
                    continue
                if isinstance(action, dict) and isinstance(action.get("add"), dict) and action["add"].get("path") == entry:
                    return path
    return f"{folder}, a checkpoint"


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


def pin(uri: str, version=None, allow_outside: bool = False) -> int:
    """The version number the table at ``uri`` has at ``version`` (a number, a time, or None for
    the newest): what a job reads throughout, however the table changes meanwhile. ``allow_outside``: its
    deletion vectors may lie outside the table's folder (:func:`_check_vector_paths`)."""
    return load(uri, version, allow_outside).version()


@functools.lru_cache(maxsize=4)
def deleted_rows(uri: str, version: int, allow_outside: bool = False) -> dict[str, np.ndarray]:
    """The rows of each data file (by its path on the table's file system, as :func:`dataset`
    checks it) that the version's deletion vectors remove (Spark writes them for a DELETE, UPDATE
    or MERGE where ``delta.enableDeletionVectors`` is on)."""
    table = load(uri, version, allow_outside)
    if "deletionVectors" not in set(table.protocol().reader_features or ()):
        return {}
    fs, root = filesystem(uri)
    vectors = _deletion_vectors(uri, table)
    found = {}
    for i in range(vectors.num_rows):
        keep = vectors.column("selection_vector")[i].values.to_numpy(zero_copy_only=False)
        path = _file_path(vectors.column("filepath")[i].as_py(), fs, root, uri, table.version(), allow_outside)
        found[path] = np.flatnonzero(~keep)
    return found


def _deletion_vectors(uri: str, table) -> pa.Table:
    """``(filepath, selection_vector)`` of each file with a deletion vector (True: a row kept)."""
    try:
        return pa.table(table.deletion_vectors())
    except Exception as exc:  # delta-rs's own error type varies with the fault
        raise TableError(f"{uri}: cannot read the Delta Lake table's deletion vectors: {_first_line(exc)}") from None
