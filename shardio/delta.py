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
log names outside the table's folder (a relative path's ``..`` always; an absolute URI, a shallow
clone's, or a link in the folder, a partition folder on another disk, unless the user allows it),
naming the commit file and the entry; deletion vectors' files (stored by path or by UUID, in commits,
checkpoints or sidecars) alike, before delta-rs opens them.
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import posixpath
import re
import uuid
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from iterreduce.exceptions import ShardError, TableError
from iterreduce.storage import hadoopconf
from iterreduce.storage.filesystems import filesystem

from .columns import STORED_NAME, plain_schema
from .lakehouse import check_inside, once_a_version, parse_version

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


#: A version number's table, read once (:func:`~shardio.lakehouse.once_a_version`).
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


#: Names in ``_delta_log/``: a commit; a checkpoint, classic (one file, or part i of n) or v2
#: (``N.checkpoint.<uuid>.json`` or ``.parquet``, whose ``sidecar`` actions name files in ``_sidecars/``);
#: a compacted run of commits (``N.M.compacted.json``).
COMMIT = re.compile(r"(\d{20})\.json")
CHECKPOINT = re.compile(r"(\d{20})\.checkpoint(\.\d+\.\d+|\.[0-9a-fA-F-]+)?\.(parquet|json)")
COMPACTED = re.compile(r"(\d{20})\.(\d{20})\.compacted\.json")
#: The Z85 alphabet a ``storageType`` "u" deletion vector's UUID is written in, and Python's base85
#: alphabet, digit for digit (the same big-endian arithmetic: :func:`base64.b85decode` decodes it).
Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"
_FROM_Z85 = str.maketrans(Z85, B85)


def _check_vector_paths(uri: str, table, allow_outside: bool) -> None:
    """Refuse, before delta-rs opens any, a deletion vector file outside the table's folder: one stored
    by absolute path (``storageType`` "p") unless ``allow_outside``, one stored by UUID ("u": relative to
    the table) as a relative data file is (:func:`~shardio.lakehouse.check_inside`); a
    :class:`TableError` naming the log file and the entry. deltalake does not show a live file's
    deletion vector descriptor, so they are read from the log here."""
    fs, root = filesystem(uri)
    for log_file, kind, entry in _vector_descriptors(fs, root, table.version()):
        found = _vector_file(uri, root, log_file, kind, entry)
        if found is not None:
            path, relative = found
            check_inside(uri, f"the Delta Lake log ({log_file})", entry, path, root, fs, relative=relative,
                         allow_outside=allow_outside)


def _vector_file(uri: str, root: str, log_file: str, kind, entry) -> tuple[str, bool] | None:
    """``(path, relative)`` of the file a deletion vector descriptor names (the protocol's storage
    types: "u", ``<prefix><z85 UUID>``, the file ``<table>/<prefix>/deletion_vector_<uuid>.bin``; "p",
    an absolute URI; "i", inline, no file); a :class:`TableError` naming it where it is none of these."""
    if kind == "i":
        return None
    where = f"{uri}: the Delta Lake log ({log_file}) names a deletion vector"
    if kind == "u" and isinstance(entry, str) and len(entry) >= 20:
        try:
            name = f"deletion_vector_{uuid.UUID(bytes=base64.b85decode(entry[-20:].translate(_FROM_Z85)))}.bin"
        except ValueError:
            raise TableError(f"{where} whose UUID is not Z85: {entry!r}") from None
        return posixpath.normpath(posixpath.join(root, entry[:-20], name)), True
    if kind == "p" and isinstance(entry, str):
        parts = urlparse(entry)
        if parts.scheme and parts.scheme != (urlparse(uri).scheme or "file"):
            raise TableError(f"{where} on another file system: {entry}")
        return unquote(parts.path), False
    raise TableError(f"{where} this reader does not know: storageType {kind!r}, {entry!r}")



def _vector_descriptors(fs, root: str, version: int):
    """``(log file, storage type, path or inline data)`` of each deletion vector the log at ``version``
    may hold live: those of the newest checkpoint at or before it (its sidecars included) and of the
    commits and compacted commits after that."""
    folder = posixpath.join(root, "_delta_log")
    checkpoints: dict[int, list[str]] = {}
    after: dict[tuple[int, int], str] = {}  # (first, last) commit -> a commit or compacted file
    for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
        if (found := CHECKPOINT.fullmatch(info.base_name)) and int(found[1]) <= version:
            checkpoints.setdefault(int(found[1]), []).append(info.path)
        elif (found := COMMIT.fullmatch(info.base_name)) and int(found[1]) <= version:
            after[int(found[1]), int(found[1])] = info.path
        elif (found := COMPACTED.fullmatch(info.base_name)) and int(found[2]) <= version:
            after[int(found[1]), int(found[2])] = info.path
    start = max(checkpoints, default=-1)
    for path in checkpoints.get(start, []):
        for log_file, action in _log_actions(fs, path, root):
            yield from _descriptor(log_file, action)
    for first, _ in sorted(after):
        if first > start:
            for log_file, action in _log_actions(fs, after[first, _], root):
                yield from _descriptor(log_file, action)


def _descriptor(log_file: str, action: dict):
    vector = action.get("add", {}).get("deletionVector") if isinstance(action.get("add"), dict) else None
    if isinstance(vector, dict):
        yield log_file, vector.get("storageType"), vector.get("pathOrInlineDv")


def _log_actions(fs, path: str, root: str):
    """``(file, action)`` of the add actions (their deletion vectors only) in the log file at ``path``
    (a commit, a checkpoint of JSON or Parquet), and in the sidecars a v2 checkpoint names: each
    sidecar must lie in the table's folder, always."""
    if path.endswith(".json"):
        with fs.open_input_stream(path) as stream:
            lines = stream.read().splitlines()
        actions = []
        for line in lines:
            try:
                action = json.loads(line)
            except ValueError:
                continue
            if isinstance(action, dict):
                actions.append(action)
    else:
        actions = _parquet_actions(fs, path)
    for action in actions:
        sidecar = action.get("sidecar")
        if isinstance(sidecar, dict) and isinstance(sidecar.get("path"), str):
            found = posixpath.normpath(posixpath.join(root, "_delta_log", "_sidecars", unquote(sidecar["path"])))
            check_inside(root, f"the Delta Lake checkpoint {path}", sidecar["path"], found, root, fs,
                         relative=True, allow_outside=False)
            yield from _log_actions(fs, found, root)
        else:
            yield path, action


def _parquet_actions(fs, path: str) -> list[dict]:
    """The deletion vectors of the add actions, and the sidecar actions, of a Parquet checkpoint or sidecar."""
    schema = pq.read_schema(path, filesystem=fs)
    columns = []
    if "add" in schema.names and schema.field("add").type.get_field_index("deletionVector") >= 0:
        columns += ["add.deletionVector.storageType", "add.deletionVector.pathOrInlineDv"]
    if "sidecar" in schema.names:
        columns.append("sidecar.path")
    if not columns:
        return []
    read = pq.read_table(path, filesystem=fs, columns=columns)  # a column each, in that order, named by its leaf
    found = dict(zip(columns, (read.column(i).to_pylist() for i in range(len(columns)))))
    actions = []
    kinds, entries = found.get("add.deletionVector.storageType", []), found.get("add.deletionVector.pathOrInlineDv", [])
    for kind, entry in zip(kinds, entries):
        if kind is not None:
            actions.append({"add": {"deletionVector": {"storageType": kind, "pathOrInlineDv": entry}}})
    actions += [{"sidecar": {"path": sidecar}} for sidecar in found.get("sidecar.path", []) if sidecar is not None]
    return actions


def dataset(uri: str, version: int, allow_outside: bool = False) -> ds.FileSystemDataset:
    """The table at ``uri`` at ``version`` (a number: see :func:`version_number`) as a ``pyarrow.dataset`` of its
    live files, the partition values from the log, the schema the table's own at that version.
    A file the log names outside the table's folder is refused (:func:`_file_path`) unless
    ``allow_outside`` and named by an absolute URI (a shallow clone's) or reached through a link."""
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
    field metadata (:data:`~shardio.columns.STORED_NAME`), where the table maps names."""
    stored = {field["name"]: field["metadata"].get(PHYSICAL_NAME)
              for field in json.loads(table.schema().to_json())["fields"]}
    return pa.schema([field.with_metadata({STORED_NAME: stored[field.name]}) if stored.get(field.name) else field
                      for field in schema])


def _file_path(entry: str, fs, root: str, uri: str, version: int, allow_outside: bool) -> str:
    """A data file's path on the table's file system: the log names it relative to the table's
    folder, percent-encoded, or (a shallow clone's) by an absolute URI. It must lie in the table's
    folder (``..`` resolved, links followed), where ``allow_outside`` also outside it when named by an
    absolute URI or reached through a link in the folder (a partition folder on another disk), never by a
    relative path's ``..``: else :class:`TableError` naming the table, the log file and the entry."""
    parts = urlparse(entry)
    absolute = bool(parts.scheme) or entry.startswith("/")
    if parts.scheme and parts.scheme != (urlparse(uri).scheme or "file"):
        raise TableError(f"{uri}: the Delta Lake log names a data file on another file system: {entry}")
    path = unquote(parts.path) if absolute else posixpath.normpath(posixpath.join(root, unquote(entry)))
    check_inside(uri, lambda: f"the Delta Lake log ({_log_file(fs, root, entry, version)})", entry, path, root, fs,
                 relative=not absolute, allow_outside=allow_outside)  # the log file looked for only if refused
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


def version_number(uri: str, version=None, allow_outside: bool = False) -> int:
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
