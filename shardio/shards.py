"""Parquet shards: a folder of Parquet files written by :func:`write_shards`, addressed by URI
(any file system :func:`iterreduce.storage.filesystems.filesystem` reaches), and :class:`ParquetShard`,
the reader of one (:mod:`shardio.readers` chooses it for a ``.parquet`` URI).

Schema of every shard:

- ``features``: fixed-size list (or list) of float32 or uint8. uint8 values are
  read as intensities 0..255 and scaled to [0, 1];
- ``label`` (optional): integer class.
"""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iterreduce.exceptions import HdfsAccessError, IterReduceError, ShardError
from iterreduce.storage import durable, ownership
from iterreduce.storage.filesystems import filesystem, join

from .labels import LabelMap

FEATURES = "features"
LABEL = "label"
#: Parquet metadata key of a shard written from string labels: its classes, JSON ({"classes": [...]}),
#: label i being classes[i]. Every shard of one data set holds the same.
CLASSES_KEY = b"iterreduce.label_classes"
#: Parquet metadata key of a shard written from named columns (a CSV file's): their names, JSON
#: ([...]), feature i coming from column i, so that a model reads the same columns of later files.
COLUMNS_KEY = b"iterreduce.feature_columns"
FEATURE_TYPES = (pa.float32(), pa.uint8(), pa.float64())


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


#: What a footer that miscounts the rows is, and what to do
ALTERED = "a damaged or altered Parquet file: write it again"


def footer_rows(parquet: pq.ParquetFile, uri: str) -> int:
    """The row count the footer of the open shard says, refused where its row groups say otherwise:
    a damaged or altered footer. Readers check it against the rows they read, too
    (:meth:`ParquetShard.blocks`), and believe it with memory only so far (:func:`believed_rows`)."""
    meta = parquet.metadata
    try:
        groups = sum(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
    except Exception as exc:  # noqa: BLE001 - a corrupt footer
        raise ShardError(f"{uri}: not a readable Parquet footer ({type(exc).__name__}: {exc})") from exc
    if meta.num_rows < 0 or groups != meta.num_rows:
        raise ShardError(f"{uri}: its footer says {meta.num_rows} rows, but its row groups say {groups} "
                         f"({ALTERED})")
    return meta.num_rows


def miscounted(uri: str, claimed: int, held: int) -> ShardError:
    """The error for a shard whose footer says ``claimed`` rows where its pages hold ``held``."""
    return ShardError(f"{uri}: its footer says {claimed} rows, but the file holds {held} ({ALTERED})")


#: A footer is believed, before its rows are read, for the float32 features of at most this many
#: times the file's bytes: real features compress a few times, and a tiny file that claims
#: billions of rows must not get an array of that size. A file holding more rows (a column of
#: one repeated value) gets an array that grows as its rows come.
BELIEVED_EXPANSION = 64


def believed_rows(claimed: int, file_bytes: int, width: int) -> int:
    """The rows to allocate, before reading them, for a shard of ``file_bytes`` bytes whose footer
    says ``claimed`` rows of ``width`` features (:data:`BELIEVED_EXPANSION`)."""
    return min(claimed, BELIEVED_EXPANSION * file_bytes // (4 * width))


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


#: Rows read from a Parquet file at a time (a few MB of features).
STREAM_ROWS = 8192


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
    to [0, 1]; a spilled shard's :class:`~iterreduce.storage.rowfile.RowFile` converts with it too."""
    return values.astype(np.float32) / 255.0 if values.dtype == np.uint8 else values


def label_rows(uri: str, column, first_row: int = 0) -> np.ndarray:
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


class ParquetShard:
    """The reader of one Parquet shard (:class:`shardio.readers.ShardReader`): its footer
    described, its rows read whole or a block of :data:`STREAM_ROWS` at a time, every value
    checked, every error naming the file (and the row and column where known)."""

    suffix = ".parquet"

    def __init__(self, uri: str):
        self.uri = uri

    @classmethod
    def open(cls, uri: str) -> ParquetShard:
        """The reader of the shard at ``uri`` (nothing is read before it is asked for)."""
        return cls(uri)

    def describe(self) -> dict:
        """What the footer says, without reading the data (:func:`shardio.readers.describe_shard`);
        refuses a shard the footer already shows to be unusable."""
        uri = self.uri
        with open_shard(uri) as parquet:
            rows = footer_rows(parquet, uri)
            if rows == 0:
                raise ShardError(f"{uri}: shard is empty")
            width = getattr(parquet.schema_arrow.field(FEATURES).type, "list_size", None)
            if width is None:  # a variable-length list: its first row says (read checks the rest)
                try:  # that row alone: reading a row group allocates for the rows its footer claims
                    first = next(parquet.iter_batches(batch_size=1, columns=[FEATURES]), None)
                except Exception as exc:  # noqa: BLE001 - a corrupt page
                    raise unreadable(uri, exc) from exc
                if first is None:
                    raise miscounted(uri, rows, 0)
                width = len(first.column(0)[0])
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
        return {"uri": uri, "rows": rows, "features": width, "labels": has_labels, "ranges": ranges,
                "classes": classes, "columns": columns}

    def read(self, n_features: int | None, need_labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Every row: float32 features and int64 labels (or None), read a block at a time into
        arrays of the footer's row count, so reading needs little more memory than the features.
        The count is believed only as far as the file's size makes plausible (:func:`believed_rows`);
        the arrays grow, up to it, as more rows come, and rows that miss it are an error (:meth:`blocks`)."""
        features, labels, start = None, None, 0
        with open_shard(self.uri, streaming=True) as parquet:
            claimed = footer_rows(parquet, self.uri)
            for values, block_labels in self._blocks(parquet, n_features, need_labels):
                stop = start + len(values)  # never past the footer's count: _blocks refuses those rows
                if features is None:
                    rows = max(stop, believed_rows(claimed, self._file_bytes(), values.shape[1]))
                    features = np.empty((rows, values.shape[1]), dtype=np.float32)
                    labels = None if block_labels is None else np.empty(rows, dtype=np.int64)
                elif stop > len(features):  # more rows than believed: room for twice as many
                    rows = min(claimed, max(stop, 2 * len(features)))
                    features, labels = _grown(features, rows), None if labels is None else _grown(labels, rows)
                features[start:stop] = as_float32(values)
                if labels is not None:
                    labels[start:stop] = block_labels
                start = stop
        return features, labels

    def _file_bytes(self) -> int:
        fs, path = filesystem(self.uri)
        return fs.get_file_info(path).size

    def blocks(self, n_features: int | None, need_labels: bool):
        """``(stored feature values, labels or None)`` for each block of :data:`STREAM_ROWS` rows,
        checked by :func:`feature_rows` and :func:`label_rows` (uint8 intensities as stored:
        :func:`as_float32` makes them features). Rows other than the footer's count are an error
        naming both (:meth:`_counted_batches`): no block past it is given."""
        with open_shard(self.uri, streaming=True) as parquet:
            yield from self._blocks(parquet, n_features, need_labels)

    def _blocks(self, parquet: pq.ParquetFile, n_features: int | None, need_labels: bool):
        """:meth:`blocks` of the open file. Parquet's own memory goes back to the system at the end
        (its pool would keep it)."""
        uri, start, width = self.uri, 0, None
        try:
            has_labels = LABEL in parquet.schema_arrow.names
            if not has_labels and need_labels:
                raise ShardError(f"{uri}: no '{LABEL}' column, but this job needs labels")
            for batch in self._counted_batches(parquet):
                values = feature_rows(uri, batch.column(FEATURES), start, n_features)
                if width is not None and values.shape[1] != width:
                    raise ShardError(f"{uri}: rows have different feature counts: row {start} has "
                                     f"{values.shape[1]}, row 0 has {width}")
                width = values.shape[1]
                yield values, (label_rows(uri, batch.column(LABEL), start) if has_labels else None)
                start += batch.num_rows
        except (ShardError, HdfsAccessError):
            raise  # said as they are: HDFS refusing this process is not a fault of the shard
        except Exception as exc:  # noqa: BLE001 - a corrupt page or a truncated column
            raise unreadable(uri, exc) from exc
        finally:
            pa.default_memory_pool().release_unused()
        if start == 0:
            raise ShardError(f"{uri}: shard is empty")

    def _counted_batches(self, parquet: pq.ParquetFile, columns: list[str] | None = None):
        """The open file's rows in batches of :data:`STREAM_ROWS` (never a whole row group: pyarrow
        allocates one for the rows its footer claims), refusing rows other than the footer's count
        (:func:`miscounted`): as soon as they pass it (the rest counted, a batch at a time), or at the end."""
        claimed, held = footer_rows(parquet, self.uri), 0
        batches = parquet.iter_batches(batch_size=STREAM_ROWS, columns=columns)
        for batch in batches:
            held += batch.num_rows
            if held > claimed:
                raise miscounted(self.uri, claimed, held + sum(rest.num_rows for rest in batches))
            yield batch
        if held != claimed:
            raise miscounted(self.uri, claimed, held)

    def labels(self) -> np.ndarray:
        """The labels alone, reading only that column (e.g. to count the classes), a batch at a
        time and counted as :meth:`blocks` counts the rows."""
        uri = self.uri
        try:
            with open_shard(uri, streaming=True) as parquet:
                if LABEL not in parquet.schema_arrow.names:
                    raise ShardError(f"{uri}: no '{LABEL}' column: a classifier needs labels")
                column = pa.chunked_array([batch.column(0) for batch in self._counted_batches(parquet, [LABEL])],
                                          type=parquet.schema_arrow.field(LABEL).type)
        except (ShardError, HdfsAccessError):
            raise  # said as they are, as blocks() says them
        except Exception as exc:  # noqa: BLE001 - a corrupt page or a truncated column
            raise unreadable(uri, exc) from exc
        return label_rows(uri, column)


def _grown(array: np.ndarray, rows: int) -> np.ndarray:
    """``array`` (this module's own, no view of it kept) with room for ``rows`` rows: resized in
    place, a ``realloc``, so that growing never holds two copies of the rows."""
    array.resize((rows,) + array.shape[1:], refcheck=False)
    return array


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
        return LabelMap.from_dict(json.loads(text)).to_dict()
    except (ValueError, IterReduceError) as exc:
        raise ShardError(f"{uri}: unreadable label classes in its metadata ({CLASSES_KEY.decode()}): {exc}") from None


def write_shards(X: np.ndarray, y: np.ndarray | None, uri: str, n_shards: int, *, prefix: str = "part",
                 classes=None, columns: list[str] | None = None) -> list[str]:
    """Split rows of ``X`` (and class indices ``y``) into ``n_shards`` Parquet files of near-equal
    size; ``classes`` (a :class:`~shardio.labels.LabelMap`), the label values ``y`` index,
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
    with shard_set(uri, names, prefix) as shards:
        for name, rows in zip(names, np.array_split(np.arange(X.shape[0]), n_shards)):
            flat = pa.array(X[rows].reshape(-1))
            arrays = {FEATURES: pa.FixedSizeListArray.from_arrays(flat, X.shape[1])}
            if y is not None:
                arrays[LABEL] = pa.array(np.asarray(y)[rows].astype(np.int64))
            table = pa.table(arrays)
            if metadata:
                table = table.replace_schema_metadata(metadata)
            with shards.writing(name) as (path, _):
                pq.write_table(table, path, filesystem=shards.fs, write_page_checksum=True)
            written.append(join(uri, name))
    return written


class ShardSetWriter:
    """The shard files of one set being written into a folder (:func:`shard_set`)."""

    def __init__(self, fs, path: str, uri: str):
        self.fs, self.path, self.uri = fs, path, uri

    @contextlib.contextmanager
    def writing(self, name: str):
        """Write the shard file ``name`` in the ``with`` block, which gets ``(file system path, URI)``
        of a hidden name beside it to write the whole file to; once the block ends the file is
        recorded with its SHA-256 and renamed to ``name``
        (:func:`iterreduce.storage.ownership.commit_shard`). A block that fails leaves no file."""
        hidden = durable.hidden_name(name, durable.PARTIAL_SUFFIX)
        try:
            yield join(self.path, hidden), join(self.uri, hidden)
            ownership.commit_shard(self.fs, self.path, name, hidden)
        except BaseException:
            with contextlib.suppress(OSError, pa.ArrowException):
                self.fs.delete_file(join(self.path, hidden))
            raise


@contextlib.contextmanager
def shard_set(uri: str, names: list[str], prefix: str = "part"):
    """Write the shard files ``names`` (of a set named ``prefix``-...) into folder ``uri`` in the
    ``with`` block, which gets a :class:`ShardSetWriter` (each file written through its
    ``writing(name)``). Only shards this module wrote and listed in the folder's manifest
    (:data:`iterreduce.storage.ownership.MANIFEST_NAME`) with the SHA-256 of their bytes are
    replaced: the earlier set of the same prefix goes, other sets it lists stay, and a folder
    holding any file it cannot prove its own is refused (:class:`~iterreduce.exceptions.ForeignFileError`)
    untouched. One writer at a time: the folder is held (:func:`iterreduce.storage.ownership.shard_folder`)
    for the whole write, and a second writer is refused (:class:`~iterreduce.exceptions.OutputBusy`)."""
    fs, path = filesystem(uri)
    with ownership.shard_folder(fs, path, uri):
        ownership.start_shard_set(fs, path, uri, names, prefix)
        yield ShardSetWriter(fs, path, uri)
        ownership.finish_shard_set(fs, path, names)


def shard_note(uri: str, key: str):
    """A note kept with the shards in folder ``uri`` (their manifest's), None if none or no folder."""
    fs, path = filesystem(uri)
    return ownership.shard_note(fs, path, key)


def set_shard_note(uri: str, key: str, value) -> None:
    """Keep ``value`` (JSON) as the note ``key`` of the shards in folder ``uri``, e.g. their source."""
    fs, path = filesystem(uri)
    ownership.set_shard_note(fs, path, key, value)


