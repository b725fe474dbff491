"""Data shards: a directory of Parquet files, addressed by URI.

Schema of every shard:

- ``features``: fixed-size list (or list) of float32 or uint8. uint8 values are
  read as intensities 0..255 and scaled to [0, 1];
- ``label`` (optional): integer class.

URIs: plain paths, ``file://``, ``hdfs://`` and ``s3://`` (any scheme pyarrow
understands; ``hdfs://`` goes through the pure-Rust ``hdfs-native`` client when it
is installed, so no libhdfs is needed).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import multiprocessing
import os
import posixpath
import sys
import uuid
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from . import durable, hadoopconf, kerberos
from .exceptions import HdfsAccessError, IterReduceError, OutputExists, ShardError
from .lifeline import follow_parent
from .rowfile import RowFile
from . import ownership

FEATURES = "features"
LABEL = "label"
#: Parquet metadata key of a shard written from string labels: its classes, JSON ({"classes": [...]}),
#: label i being classes[i]. Every shard of one data set holds the same.
CLASSES_KEY = b"iterreduce.label_classes"
#: Parquet metadata key of a shard written from named columns (a CSV file's): their names, JSON
#: ([...]), feature i coming from column i, so that a model reads the same columns of later files.
COLUMNS_KEY = b"iterreduce.feature_columns"
TABLE_SHARD_SUFFIX = ".table.json"  # a table's share, read in place (iterreduce.tables.TableShard)
FEATURE_TYPES = (pa.float32(), pa.uint8(), pa.float64())


@dataclass
class ShardData:
    """One shard: float32 features (rows x features) and optional int64 labels. The features
    are an array in memory, or a :class:`~iterreduce.rowfile.RowFile` on local disk for a
    shard streamed by :func:`spill_shard` (same rows, same bits, read on demand)."""

    index: int
    uri: str
    features: np.ndarray | RowFile
    labels: np.ndarray | None

    @property
    def rows(self) -> int:
        return int(self.features.shape[0])


#: The environment that names the Kerberos principal and keytab HDFS is reached as (:func:`kerberos_login`):
#: variables, so that this process's helper processes (spawned) reach it so too.
KEYTAB_LOGIN_VARS = ("ITERREDUCE_HDFS_PRINCIPAL", "ITERREDUCE_HDFS_KEYTAB")


def kerberos_login(principal: str | None, keytab: str | None) -> None:
    """Reach HDFS as ``principal``, logged in with ``keytab`` (``dbn submit --principal/--keytab``),
    instead of with the ticket cache (``kinit``), in this process and those it starts; both
    None: the ticket cache again."""
    if principal and keytab:
        os.environ.update(zip(KEYTAB_LOGIN_VARS, (principal, os.path.abspath(os.path.expanduser(keytab)))))
    else:
        for var in KEYTAB_LOGIN_VARS:
            os.environ.pop(var, None)


def keytab_login() -> tuple[str | None, str | None]:
    """The principal and keytab of :func:`kerberos_login`, or ``(None, None)`` (the ticket cache)."""
    principal, keytab = (os.environ.get(var) or None for var in KEYTAB_LOGIN_VARS)
    return (principal, keytab) if principal and keytab else (None, None)


#: What an HDFS client of this process depends on besides its NameNode: fsspec keeps one file system
#: (and its client) per set of values, so that one made for another configuration or login is not reused.
CLIENT_ENVIRONMENT = ("HADOOP_CONF_DIR", "HADOOP_HOME", "KRB5CCNAME", "KRB5_CONFIG", "HADOOP_TOKEN_FILE_LOCATION",
                      *KEYTAB_LOGIN_VARS)


def _client_environment() -> tuple[str, ...]:
    return tuple(os.environ.get(var, "") for var in CLIENT_ENVIRONMENT)


def _hdfs_native(host: str, port: int | None):
    """hdfs-native's fsspec file system for a NameNode, logged in as :func:`kerberos_login` says,
    one per :data:`CLIENT_ENVIRONMENT` (a key of hdfs-native's configuration that nothing reads)."""
    import fsspec

    key = hashlib.sha256("\n".join(_client_environment()).encode()).hexdigest()[:16]
    environment = {"iterreduce.client.environment": key}
    principal, keytab = keytab_login()
    if not (principal and keytab):
        return fsspec.filesystem("hdfs", host=host, port=port, **environment)
    return _keytab_hdfs_class()(host=host, port=port, kerberos=(principal, keytab), **environment)


@functools.lru_cache(maxsize=1)
def _keytab_hdfs_class():
    """hdfs-native's fsspec file system whose client logs in with a keytab (fsspec's
    ``storage_options`` reach only the client's configuration); made on first use, as
    hdfs-native is optional."""
    from hdfs_native import Client
    from hdfs_native.fsspec import HdfsFileSystem

    class KeytabHdfsFileSystem(HdfsFileSystem):
        def __init__(self, host=None, port=None, kerberos=("", ""), **storage_options):
            super().__init__(host, port, **storage_options)
            principal, keytab = kerberos
            self.client = Client(self.unstrip_protocol("/").rstrip("/"), storage_options or None,
                                 kerberos_principal=principal, kerberos_keytab=keytab)

    return KeytabHdfsFileSystem


class _HdfsHandler(pafs.FSSpecHandler):
    """pyarrow's handler of an fsspec file system, for hdfs-native's: a file that cannot be
    opened because HDFS refused (an expired token, no ticket) is said so, not reported missing
    (pyarrow's own asks fsspec's ``isfile``, which takes any failure for "no such file"), and
    every refusal is an :class:`~iterreduce.exceptions.HdfsAccessError` naming the file and
    saying what to do (:func:`iterreduce.kerberos.hdfs_error`). ``base``: the URI's scheme and
    NameNode as the user wrote them, for messages."""

    def __init__(self, fs, base: str):
        super().__init__(fs)
        self.base = base

    def open_input_stream(self, path):
        return self._open(path)

    def open_input_file(self, path):
        return self._open(path)

    def _open(self, path):
        if self.fs.info(path)["type"] != "file":  # FileNotFoundError when it is not there
            raise IsADirectoryError(errno.EISDIR, "a folder, not a file", path)
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")


def _refusals_explained(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (RuntimeError, OSError) as exc:
            if isinstance(exc, OSError) and type(exc) is not OSError:
                raise  # "not found", "permission denied", ...: said as they are
            # hdfs-native's other errors: RuntimeError (RPC, GSSAPI), a bare OSError (connection)
            paths = [a for a in args if isinstance(a, str)] or [p for a in args if isinstance(a, list) for p in a[:1]]
            raise kerberos.hdfs_error(self.base + (paths[0] if paths else ""), exc) from None
    return call


for _name in ("get_file_info", "get_file_info_selector", "create_dir", "delete_dir", "delete_dir_contents",
              "delete_root_dir_contents", "delete_file", "move", "copy_file", "open_input_stream", "open_input_file",
              "open_output_stream", "open_append_stream"):
    setattr(_HdfsHandler, _name, _refusals_explained(getattr(_HdfsHandler, _name)))


@functools.lru_cache(maxsize=16)
def _check_kerberos_client(environment: tuple[str, ...]) -> None:
    """:func:`iterreduce.kerberos.check_client`, once per :data:`CLIENT_ENVIRONMENT` (a refusal is not
    kept: it is checked again next time)."""
    kerberos.check_client(*keytab_login())


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system and path for ``uri``. An ``hdfs://`` URI's NameNode is reached
    as Hadoop names its delegation tokens (:func:`iterreduce.hadoopconf.namenode_address`), so
    that a YARN container, which holds tokens and no Kerberos ticket, finds them."""
    parts = urlparse(uri)
    scheme = parts.scheme
    if scheme == "hdfs":
        try:
            import hdfs_native.fsspec  # noqa: F401  (registers fsspec's "hdfs" protocol)
        except ImportError:
            return pafs.FileSystem.from_uri(uri)  # libhdfs, from a Hadoop install
        _check_kerberos_client(_client_environment())
        host, port = hadoopconf.namenode_address(parts.hostname or "", parts.port)
        return pafs.PyFileSystem(_HdfsHandler(_hdfs_native(host, port), f"hdfs://{parts.netloc}")), parts.path
    if scheme in ("", "file"):
        path = urlparse(uri).path if scheme == "file" else uri
        return pafs.LocalFileSystem(), str(path)
    return pafs.FileSystem.from_uri(uri)


#: How a file already at the path a command writes is refused (:func:`check_output_file`).
EXISTS_HINT = "pass --overwrite to replace it, or choose another --out"


def check_output_file(uri: str, *, overwrite: bool = False, resolve=None) -> None:
    """Refuse to write the file at ``uri`` (a path or URI) before anything is computed: a folder
    there raises :class:`IsADirectoryError`, and, unless ``overwrite``, a file there raises
    :class:`~iterreduce.exceptions.OutputExists`, naming it (Spark's ErrorIfExists, ``hdfs dfs
    -put`` without ``-f``): a user's own file, a table's part file, is never replaced unasked.
    Nothing is read, written or made. ``resolve`` (default :func:`filesystem`) maps ``uri`` to
    its file system and path. :func:`open_output_file` checks the same again when it starts
    and, without ``overwrite``, when it moves the finished file in."""
    fs, path = (resolve or filesystem)(uri)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.Directory:
        raise IsADirectoryError(errno.EISDIR, "a folder is there: name the file to write", uri)
    if kind != pafs.FileType.NotFound and not overwrite:
        raise OutputExists(f"{uri}: already exists; {EXISTS_HINT}")


@contextlib.contextmanager
def open_output_file(uri: str, *, resolve=None, overwrite: bool = True):
    """A stream that writes the file at ``uri`` (a path or URI), its folder made first where
    the path has one (a bare name is a file in the current folder).

    The bytes go to a hidden ``.tmp`` file beside it, moved to ``uri`` only when the ``with``
    block ends without an error: a failed write leaves no partial file, readers never see half
    a file, and an earlier file stays whole. The bytes are made durable and the move replaces
    an earlier file atomically where the file system allows it (:mod:`iterreduce.durable`:
    local disk and HDFS do). ``overwrite=False`` (a file the user names, ``dbn predict --out``):
    a file already there is refused by :func:`check_output_file` before the stream opens, and
    one that appears while writing is left as it is (:func:`~iterreduce.durable.place_new`),
    the new bytes discarded, with the same error. A folder at ``uri`` is always refused.
    ``resolve`` (default :func:`filesystem`) maps ``uri`` to its file system and path."""
    fs, path = (resolve or filesystem)(uri)
    durable.restore(fs, path)  # an earlier replacement cut short between its renames: its file back first
    check_output_file(uri, overwrite=overwrite, resolve=lambda _: (fs, path))
    folder, name = posixpath.split(path)
    if folder:
        fs.create_dir(folder, recursive=True)
    partial = durable.hidden_name(path, durable.PARTIAL_SUFFIX)
    try:
        with durable.output_stream(fs, partial) as stream:
            yield stream
        if overwrite:
            durable.replace(fs, partial, path)
        elif not durable.place_new(fs, partial, path):
            raise OutputExists(f"{uri}: already exists (it appeared while this file was written); {EXISTS_HINT}")
    except BaseException:
        with contextlib.suppress(OSError, pa.ArrowException):
            fs.delete_file(partial)
        raise


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def list_shards(uri: str) -> list[str]:
    """URIs of the ``*.parquet`` shards (and ``*.table.json`` shares of a table, see
    :class:`~iterreduce.tables.TableShard`) in directory ``uri`` (or ``uri`` itself if a file), sorted."""
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
    names = sorted(e.base_name for e in entries if e.is_file and e.base_name.endswith((".parquet", TABLE_SHARD_SUFFIX)))
    if not names:
        raise ShardError(f"{uri}: directory holds no .parquet shards")
    return [join(uri, name) for name in names]


#: Read buffer of a streamed shard: a few large reads per column chunk, on HDFS too.
STREAM_BUFFER_BYTES = 8 * 2**20


def open_shard(uri: str, *, streaming: bool = False) -> pq.ParquetFile:
    """The Parquet file at ``uri`` with its footer read and its schema checked; a missing,
    truncated or unreadable file, or a schema other than the module docstring's, raises
    :class:`ShardError` naming it. ``streaming``: for reading block by block in bounded
    memory (pyarrow's pre-buffering keeps every row group read until the file is closed)."""
    fs, path = filesystem(uri)
    buffering = {"pre_buffer": False, "buffer_size": STREAM_BUFFER_BYTES} if streaming else {}
    try:
        # Pages written with checksums (as write_shards does) are verified as they are read.
        parquet = pq.ParquetFile(path, filesystem=fs, page_checksum_verification=True, **buffering)
    except FileNotFoundError as exc:
        raise ShardError(f"{uri}: shard not found") from exc
    except HdfsAccessError:
        raise  # HDFS refused this process: not a fault of the shard
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise unreadable(uri, exc) from exc
    try:
        check_schema(uri, parquet.schema_arrow)
    except ShardError:
        parquet.close()
        raise
    return parquet


def unreadable(uri: str, exc: Exception) -> ShardError:
    """The error for a shard pyarrow cannot read (a truncated file, a corrupt page or footer)."""
    return ShardError(f"{uri}: not a readable Parquet file ({type(exc).__name__}: {exc})")


def check_schema(uri: str, schema: pa.Schema) -> None:
    """Refuse a shard schema other than the module docstring's, naming the column at fault."""
    for name in (FEATURES, LABEL):
        if schema.names.count(name) > 1:
            raise ShardError(f"{uri}: {schema.names.count(name)} columns are named '{name}'")
    if FEATURES not in schema.names:
        raise ShardError(f"{uri}: no '{FEATURES}' column (columns: {schema.names})")
    ftype = schema.field(FEATURES).type
    if not (pa.types.is_fixed_size_list(ftype) or pa.types.is_list(ftype)):
        raise ShardError(f"{uri}: '{FEATURES}' must be a list of float32 or uint8, got {ftype}")
    if ftype.value_type not in FEATURE_TYPES:
        raise ShardError(f"{uri}: '{FEATURES}' values must be float32 or uint8, got {ftype.value_type}")
    if pa.types.is_fixed_size_list(ftype) and ftype.list_size == 0:
        raise ShardError(f"{uri}: '{FEATURES}' lists are empty: no feature to train on")
    if LABEL in schema.names and not pa.types.is_integer(schema.field(LABEL).type):
        raise ShardError(f"{uri}: '{LABEL}' must be an integer column, got {schema.field(LABEL).type} "
                         f"(classes are 0, 1, 2, ...)")


def footer_ranges(parquet: pq.ParquetFile, uri: str = "") -> dict:
    """The smallest and largest feature value and label the footer's statistics record, as
    ``{"features": (lo, hi) or None, "label": (lo, hi) or None}`` (None where a row group has
    no numeric statistics). Parquet writers leave NaN out of the statistics, infinities not."""
    try:
        leaves = {}  # the Parquet leaf column of each: the features' values, the labels
        for i in range(len(parquet.schema)):
            path = parquet.schema.column(i).path.split(".")
            if path[0] == FEATURES or path == [LABEL]:
                leaves.setdefault(path[0], i)
        meta, ranges = parquet.metadata, {}
        for name in (FEATURES, LABEL):
            lo = hi = None
            for g in range(meta.num_row_groups if name in leaves else 0):
                stats = meta.row_group(g).column(leaves[name]).statistics
                numeric = stats is not None and stats.has_min_max and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in (stats.min, stats.max))
                if not numeric:
                    lo = hi = None
                    break
                lo, hi = (stats.min, stats.max) if lo is None else (min(lo, stats.min), max(hi, stats.max))
            ranges[name] = None if lo is None else (lo, hi)
    except Exception as exc:  # noqa: BLE001 - a corrupt footer
        raise ShardError(f"{uri}: not a readable Parquet footer ({type(exc).__name__}: {exc})") from exc
    if ranges[FEATURES] and parquet.schema_arrow.field(FEATURES).type.value_type == pa.uint8():
        ranges[FEATURES] = tuple(v / 255.0 for v in ranges[FEATURES])  # read as intensities
    return ranges


def read_shard(uri: str, index: int = 0, n_features: int | None = None, need_labels: bool = False) -> ShardData:
    """Read one shard into memory, checking its schema and values; every error names the
    file (and the row and column where known). It is read a block at a time into its
    float32 array, so reading needs little more memory than the features themselves."""
    if is_table_shard(uri):
        return _read_table_shard(uri, index, n_features, need_labels)
    features, labels = None, None
    for start, values, block_labels, parquet in _blocks(uri, n_features, need_labels):
        if features is None:
            rows = parquet.metadata.num_rows
            features = np.empty((rows, values.shape[1]), dtype=np.float32)
            labels = None if block_labels is None else np.empty(rows, dtype=np.int64)
        features[start:start + len(values)] = as_float32(values)
        if labels is not None:
            labels[start:start + len(values)] = block_labels
    return ShardData(index, uri, features, labels)


def _read_table_shard(uri: str, index: int, n_features: int | None, need_labels: bool) -> ShardData:
    """:func:`read_shard` of a table's share: its pieces read in place, scaled, labels mapped."""
    blocks = list(_table_blocks(uri, n_features, need_labels))
    features = np.concatenate([values for _, values, _, _ in blocks])
    labels = None if blocks[0][2] is None else np.concatenate([block_labels for _, _, block_labels, _ in blocks])
    return ShardData(index, uri, features, labels)


def _table_blocks(uri: str, n_features: int | None, need_labels: bool):
    """:func:`_blocks` for a table's share: one block a piece, the file argument None."""
    shard = read_table_shard(uri)
    if need_labels and shard.source.label is None:
        raise ShardError(f"{uri}: the table source names no label column, but this job needs labels")
    if n_features is not None and n_features != shard.n_features:
        raise ShardError(f"{uri}: {shard.n_features} features per row, expected {n_features}")
    start = 0
    for values, labels in shard.blocks():
        if len(values):
            yield start, values, labels, None
            start += len(values)
    if start == 0:
        raise ShardError(f"{uri}: shard is empty (no row of its pieces passes the filter)")


def spill_shard(uri: str, directory: str, index: int = 0, n_features: int | None = None,
                need_labels: bool = False) -> ShardData:
    """Copy one shard to a :class:`~iterreduce.rowfile.RowFile` in local ``directory``, a
    block at a time, with the checks of :func:`read_shard`: the shard's features never sit
    whole in memory (its labels do, 8 bytes a row). Rows come back from the file with the
    bits :func:`read_shard` gives them."""
    rows, labels = None, []
    try:
        for _, values, block_labels, _ in _blocks(uri, n_features, need_labels):
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


#: Rows read from a Parquet file at a time (a few MB of features).
STREAM_ROWS = 8192


def _blocks(uri: str, n_features: int | None, need_labels: bool):
    """``(first row, stored feature values, labels or None, the open file)`` for each block of
    :data:`STREAM_ROWS` rows of a shard, checked by :func:`feature_rows` and :func:`_labels`.
    Parquet's own memory goes back to the system at the end (its pool would keep it)."""
    if is_table_shard(uri):
        yield from _table_blocks(uri, n_features, need_labels)
        return
    start, width = 0, None
    try:
        with open_shard(uri, streaming=True) as parquet:
            has_labels = LABEL in parquet.schema_arrow.names
            if not has_labels and need_labels:
                raise ShardError(f"{uri}: no '{LABEL}' column, but this job needs labels")
            for batch in parquet.iter_batches(batch_size=STREAM_ROWS):
                values = feature_rows(uri, batch.column(FEATURES), start, n_features)
                if width is not None and values.shape[1] != width:
                    raise ShardError(f"{uri}: rows have different feature counts: row {start} has "
                                     f"{values.shape[1]}, row 0 has {width}")
                width = values.shape[1]
                yield start, values, (_labels(uri, batch.column(LABEL), start) if has_labels else None), parquet
                start += batch.num_rows
    except ShardError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt page or a truncated column
        raise unreadable(uri, exc) from exc
    finally:
        pa.default_memory_pool().release_unused()
    if start == 0:
        raise ShardError(f"{uri}: shard is empty")


def feature_rows(uri: str, column: pa.Array, first_row: int = 0, n_features: int | None = None) -> np.ndarray:
    """The ``features`` column (or a block of it starting at row ``first_row``) as a rows x
    features array, uint8 kept as stored and other types as float32, refusing nulls, rows of
    different lengths and NaN or infinite values, naming the row."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    value_type = column.type.value_type
    if column.null_count:
        first = first_row + int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
        raise ShardError(f"{uri}: '{FEATURES}' has {column.null_count} null rows, the first at row {first}")
    lengths = column.value_lengths().to_numpy() if pa.types.is_list(column.type) else None
    width = column.type.list_size if lengths is None else int(lengths[0])
    if lengths is not None and (lengths != width).any():
        row = int(np.argmax(lengths != width))
        raise ShardError(f"{uri}: rows have different feature counts: row {first_row + row} has "
                         f"{int(lengths[row])}, row {first_row} has {width}")
    if width == 0:
        raise ShardError(f"{uri}: '{FEATURES}' lists are empty: no feature to train on")
    if n_features is not None and width != n_features:
        raise ShardError(f"{uri}: {width} features per row, expected {n_features}")
    flat = column.flatten()
    if flat.null_count and value_type == pa.uint8():  # NaN in float columns is refused below, nulls included
        first = int(np.argmax(flat.is_null().to_numpy(zero_copy_only=False)))
        raise ShardError(f"{uri}: '{FEATURES}' has {flat.null_count} null values, the first at row "
                         f"{first_row + first // width}, column {first % width}")
    values = flat.to_numpy(zero_copy_only=False).reshape(len(column), width)
    if value_type == pa.uint8():
        return values
    values = values.astype(np.float32)
    bad = ~np.isfinite(values)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ShardError(f"{uri}: '{FEATURES}' contains NaN or infinite values ({int(bad.sum())}, nulls "
                         f"included), the first at row {first_row + row}, column {col}")
    return values


def as_float32(values: np.ndarray) -> np.ndarray:
    """Stored feature values as the float32 features programs see: uint8 intensities scaled
    to [0, 1]; a spilled shard's :class:`~iterreduce.rowfile.RowFile` converts with it too."""
    return values.astype(np.float32) / 255.0 if values.dtype == np.uint8 else values


def read_labels(uri: str) -> np.ndarray:
    """The labels of one shard, reading only that column (e.g. to count the classes)."""
    if is_table_shard(uri):
        return read_table_shard(uri).labels()
    try:
        with open_shard(uri) as parquet:
            if LABEL not in parquet.schema_arrow.names:
                raise ShardError(f"{uri}: no '{LABEL}' column: a classifier needs labels")
            column = parquet.read(columns=[LABEL]).column(LABEL)
    except ShardError:
        raise
    except Exception as exc:  # noqa: BLE001 - a corrupt page or a truncated column
        raise unreadable(uri, exc) from exc
    return _labels(uri, column)


def _labels(uri: str, column, first_row: int = 0) -> np.ndarray:
    """An integer label column (or a block of it starting at row ``first_row``) as int64
    classes, refusing nulls and negative values (by row)."""
    if column.null_count:
        row = first_row + int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
        raise ShardError(f"{uri}: '{LABEL}' has {column.null_count} nulls, the first at row {row}")
    labels = column.to_numpy().astype(np.int64)
    if (labels < 0).any():
        row = int(np.argmax(labels < 0))
        raise ShardError(f"{uri}: '{LABEL}' at row {first_row + row} is {labels[row]}: classes are 0, 1, 2, ...")
    return labels


def shard_info(uris: list[str]) -> list[dict]:
    """What the footers say of each shard, without reading its data: ``uri``, ``rows``,
    ``features`` (per row), ``labels`` (whether it has them) and ``ranges`` (see
    :func:`footer_ranges`). Refuses a shard the footer already shows to be unusable:
    unreadable, of another schema, empty, with infinite features or negative labels.

    The footers are read in a helper process: on some corrupt footers pyarrow ends the
    process that reads them (std::terminate), which must be an error naming the shard,
    not the death of the master."""
    global _footer_reader
    info = []
    for uri in uris:
        if _footer_reader is None:
            quiet_resource_tracker()
            # spawn, not fork: a forked child would inherit the HDFS client's runtime threads half-made.
            _footer_reader = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=follow_parent)
        try:
            info.append(_footer_reader.submit(_describe_as_caller, uri, _client_environment()).result())
        except BrokenProcessPool:
            _footer_reader = None
            raise ShardError(f"{uri}: not a readable Parquet file (reading its footer crashed the Parquet "
                             f"reader)") from None
    return info


_footer_reader: ProcessPoolExecutor | None = None  # shard_info's helper process, started on first use

#: multiprocessing's resource tracker (a process of its own, writing to this process's stderr) warns of
#: "leaked semaphore objects" when this process is killed: in a master's log, a line written after the
#: launcher took stock of it, which made the run's log unprovable and refused its --resume.
_TRACKER_WARNING = "ignore::UserWarning:multiprocessing.resource_tracker"


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker, if it is not running yet, without that warning (it
    takes this interpreter's -W options when it starts)."""
    if _TRACKER_WARNING not in sys.warnoptions:
        sys.warnoptions.append(_TRACKER_WARNING)


def _describe_as_caller(uri: str, environment: tuple[str, ...]) -> dict:
    """:func:`describe_shard` in the helper process, which outlives the environment it was started
    with: HDFS is reached with the caller's configuration and login (:data:`CLIENT_ENVIRONMENT`)."""
    for var, value in zip(CLIENT_ENVIRONMENT, environment):
        if value:
            os.environ[var] = value
        else:
            os.environ.pop(var, None)
    return describe_shard(uri)


def describe_shard(uri: str) -> dict:
    """One shard's entry of :func:`shard_info`, read in this process. A table's share also
    gives its label ``classes`` (as a dict) and its feature ``columns``, which the model keeps;
    its raw rows have no footer range to check."""
    if is_table_shard(uri):
        shard = read_table_shard(uri)
        if shard.rows == 0:
            raise ShardError(f"{uri}: shard is empty")
        return {"uri": uri, "rows": shard.rows, "features": shard.n_features, "labels": shard.source.label is not None,
                "ranges": {FEATURES: None, LABEL: None if shard.classes is None else (0, len(shard.classes) - 1)},
                "classes": None if shard.classes is None else shard.classes.to_dict(),
                "columns": list(shard.source.features)}
    with open_shard(uri) as parquet:
        rows = parquet.metadata.num_rows
        if rows == 0:
            raise ShardError(f"{uri}: shard is empty")
        width = getattr(parquet.schema_arrow.field(FEATURES).type, "list_size", None)
        if width is None:  # a variable-length list: its first row says (read_shard checks the rest)
            try:
                width = len(parquet.read_row_group(0, columns=[FEATURES]).column(0)[0])
            except Exception as exc:  # noqa: BLE001 - a corrupt page
                raise unreadable(uri, exc) from exc
            if width == 0:
                raise ShardError(f"{uri}: '{FEATURES}' lists are empty: no feature to train on")
        ranges = footer_ranges(parquet, uri)
        has_labels = LABEL in parquet.schema_arrow.names
        classes = _classes_in(parquet.schema_arrow.metadata, uri)
        columns = _columns_in(parquet.schema_arrow.metadata, uri, width)
    features, labels = ranges[FEATURES], ranges[LABEL]
    if features and not np.isfinite(features).all():
        raise ShardError(f"{uri}: '{FEATURES}' holds infinite values (the footer's statistics: "
                         f"min {features[0]}, max {features[1]})")
    if labels and labels[0] < 0:
        raise ShardError(f"{uri}: '{LABEL}' holds negative values (the footer's statistics: min {labels[0]}): "
                         f"classes are 0, 1, 2, ...")
    if classes is not None and labels and labels[1] >= len(classes["classes"]):
        raise ShardError(f"{uri}: '{LABEL}' holds class {labels[1]} but the shard's metadata names "
                         f"{len(classes['classes'])} classes")
    return {"uri": uri, "rows": rows, "features": width, "labels": has_labels, "ranges": ranges, "classes": classes,
            "columns": columns}


def _columns_in(metadata: dict | None, uri: str, width: int) -> list[str] | None:
    """The feature columns' names a shard's Parquet metadata holds (:data:`COLUMNS_KEY`), one a
    feature of its ``width``; None if none."""
    text = (metadata or {}).get(COLUMNS_KEY)
    if text is None:
        return None
    try:
        columns = json.loads(text)
    except ValueError as exc:
        raise ShardError(f"{uri}: unreadable feature columns in its metadata ({COLUMNS_KEY.decode()}): {exc}") from None
    if not isinstance(columns, list) or len(columns) != width or not all(isinstance(c, str) and c for c in columns):
        raise ShardError(f"{uri}: its metadata's feature columns ({COLUMNS_KEY.decode()}) are not {width} names "
                         f"(one a feature): {str(columns)[:200]}")
    return columns


def _classes_in(metadata: dict | None, uri: str) -> dict | None:
    """The label classes a shard's Parquet metadata holds (:data:`CLASSES_KEY`), as a dict; None if none."""
    text = (metadata or {}).get(CLASSES_KEY)
    if text is None:
        return None
    try:
        classes = json.loads(text)
        from .tables import LabelMap

        return LabelMap.from_dict(classes).to_dict()
    except (ValueError, IterReduceError) as exc:
        raise ShardError(f"{uri}: unreadable label classes in its metadata ({CLASSES_KEY.decode()}): {exc}") from None


def shard_classes(infos_or_uris) -> object:
    """The :class:`~iterreduce.tables.LabelMap` the shards' labels index (None: class i is i), from
    :func:`shard_info` entries or shard URIs; shards that disagree raise :class:`ShardError`
    naming two of them."""
    from .tables import LabelMap

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


def write_shards(X: np.ndarray, y: np.ndarray | None, uri: str, n_shards: int, *, prefix: str = "part",
                 classes=None, columns: list[str] | None = None) -> list[str]:
    """Split rows of ``X`` (and class indices ``y``) into ``n_shards`` Parquet files of near-equal
    size; ``classes`` (a :class:`~iterreduce.tables.LabelMap`), the label values ``y`` index,
    and ``columns``, the names of the source columns the features come from (one a feature),
    go into every file's metadata (:data:`CLASSES_KEY`, :data:`COLUMNS_KEY`). The folder
    ``uri`` must be empty or hold shards written here (:func:`shard_set`): an earlier set of
    the same ``prefix`` is replaced, nothing else is touched."""
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ShardError(f"{uri}: need a non-empty 2-D feature matrix, got shape {X.shape}")
    if not 1 <= n_shards <= X.shape[0]:
        raise ShardError(f"{uri}: cannot cut {X.shape[0]} rows into {n_shards} shards")
    if X.dtype not in (np.uint8, np.float32):
        X = X.astype(np.float32)
    if columns is not None and len(columns) != X.shape[1]:
        raise ShardError(f"{uri}: {len(columns)} column names for {X.shape[1]} features")
    metadata = {}
    if classes is not None:
        metadata[CLASSES_KEY] = json.dumps(classes.to_dict()).encode()
    if columns is not None:
        metadata[COLUMNS_KEY] = json.dumps(list(columns)).encode()
    names = [f"{prefix}-{i:05d}.parquet" for i in range(n_shards)]
    written = []
    with shard_set(uri, names, prefix) as (fs, path):
        for name, rows in zip(names, np.array_split(np.arange(X.shape[0]), n_shards)):
            flat = pa.array(X[rows].reshape(-1))
            arrays = {FEATURES: pa.FixedSizeListArray.from_arrays(flat, X.shape[1])}
            if y is not None:
                arrays[LABEL] = pa.array(np.asarray(y)[rows].astype(np.int64))
            table = pa.table(arrays)
            if metadata:
                table = table.replace_schema_metadata(metadata)
            pq.write_table(table, join(path, name), filesystem=fs, write_page_checksum=True)
            written.append(join(uri, name))
    return written


@contextlib.contextmanager
def shard_set(uri: str, names: list[str], prefix: str = "part"):
    """Write the shard files ``names`` (of a set named ``prefix``-...) into folder ``uri`` in the
    ``with`` block, which gets ``(file system, path)``. Only shards this module wrote and listed
    in the folder's manifest (:data:`iterreduce.ownership.MANIFEST_NAME`) are replaced: the
    earlier set of the same prefix goes, other sets it lists stay, and a folder holding any file
    it does not list is refused (:class:`~iterreduce.exceptions.ForeignFileError`) untouched."""
    fs, path = filesystem(uri)
    ownership.start_shard_set(fs, path, uri, names, prefix)
    yield fs, path
    ownership.finish_shard_set(fs, path, names)


def shard_note(uri: str, key: str):
    """A note kept with the shards in folder ``uri`` (their manifest's), None if none or no folder."""
    fs, path = filesystem(uri)
    return ownership.shard_note(fs, path, key)


def set_shard_note(uri: str, key: str, value) -> None:
    """Keep ``value`` (JSON) as the note ``key`` of the shards in folder ``uri``, e.g. their source."""
    fs, path = filesystem(uri)
    ownership.set_shard_note(fs, path, key, value)


def is_table_shard(uri: str) -> bool:
    """Whether ``uri`` names a table's share (:class:`~iterreduce.tables.TableShard`)."""
    return uri.endswith(TABLE_SHARD_SUFFIX)


def read_table_shard(uri: str):
    """The :class:`~iterreduce.tables.TableShard` at ``uri`` (imported here on use: tables imports this module)."""
    from .tables import read_table_shard as read

    return read(uri)
