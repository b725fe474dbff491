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

from dataclasses import dataclass
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .exceptions import ShardError

FEATURES = "features"
LABEL = "label"


@dataclass
class ShardData:
    """One shard in memory: float32 features (rows x features) and optional labels."""

    index: int
    uri: str
    features: np.ndarray
    labels: np.ndarray | None

    @property
    def rows(self) -> int:
        return int(self.features.shape[0])


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system and path for ``uri``."""
    scheme = urlparse(uri).scheme
    if scheme == "hdfs":
        try:
            import hdfs_native.fsspec  # noqa: F401  (registers fsspec's "hdfs" protocol)
            import fsspec
        except ImportError:
            return pafs.FileSystem.from_uri(uri)  # libhdfs, from a Hadoop install
        fs = fsspec.filesystem("hdfs", host=urlparse(uri).netloc.split(":")[0],
                               port=urlparse(uri).port or 8020)
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), urlparse(uri).path
    if scheme in ("", "file"):
        path = urlparse(uri).path if scheme == "file" else uri
        return pafs.LocalFileSystem(), str(path)
    return pafs.FileSystem.from_uri(uri)


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def list_shards(uri: str) -> list[str]:
    """URIs of the ``*.parquet`` files in directory ``uri`` (or ``uri`` itself if a file), sorted."""
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
    names = sorted(e.base_name for e in entries if e.is_file and e.base_name.endswith(".parquet"))
    if not names:
        raise ShardError(f"{uri}: directory holds no .parquet shards")
    return [join(uri, name) for name in names]


def read_shard(uri: str, index: int = 0, n_features: int | None = None, need_labels: bool = False) -> ShardData:
    """Read one shard, checking its schema; every error names the file."""
    fs, path = filesystem(uri)
    try:
        table = pq.read_table(path, filesystem=fs)
    except FileNotFoundError as exc:
        raise ShardError(f"{uri}: shard not found") from exc
    except (OSError, pa.ArrowException) as exc:
        raise ShardError(f"{uri}: not a readable Parquet file: {exc}") from exc
    if FEATURES not in table.column_names:
        raise ShardError(f"{uri}: no '{FEATURES}' column (columns: {table.column_names})")
    if table.num_rows == 0:
        raise ShardError(f"{uri}: shard is empty")
    column = table.column(FEATURES).combine_chunks()
    if not (pa.types.is_fixed_size_list(column.type) or pa.types.is_list(column.type)):
        raise ShardError(f"{uri}: '{FEATURES}' must be a list of float32 or uint8, got {column.type}")
    value_type = column.type.value_type
    if value_type not in (pa.float32(), pa.uint8(), pa.float64()):
        raise ShardError(f"{uri}: '{FEATURES}' values must be float32 or uint8, got {value_type}")
    if column.null_count:
        raise ShardError(f"{uri}: '{FEATURES}' has {column.null_count} null rows")
    lengths = column.value_lengths().to_numpy() if pa.types.is_list(column.type) else None
    width = column.type.list_size if lengths is None else int(lengths[0])
    if lengths is not None and (lengths != width).any():
        raise ShardError(f"{uri}: rows have different feature counts ({sorted(set(lengths.tolist()))[:5]})")
    if n_features is not None and width != n_features:
        raise ShardError(f"{uri}: {width} features per row, expected {n_features}")
    values = column.flatten().to_numpy(zero_copy_only=False).reshape(table.num_rows, width)
    features = values.astype(np.float32) / 255.0 if value_type == pa.uint8() else values.astype(np.float32)
    if not np.isfinite(features).all():
        raise ShardError(f"{uri}: '{FEATURES}' contains NaN or infinite values")
    labels = None
    if LABEL in table.column_names:
        label_col = table.column(LABEL)
        if not pa.types.is_integer(label_col.type):
            raise ShardError(f"{uri}: '{LABEL}' must be an integer column, got {label_col.type}")
        if label_col.null_count:
            raise ShardError(f"{uri}: '{LABEL}' has {label_col.null_count} nulls")
        labels = label_col.to_numpy().astype(np.int64)
    elif need_labels:
        raise ShardError(f"{uri}: no '{LABEL}' column, but this job needs labels")
    return ShardData(index, uri, features, labels)


def write_shards(X: np.ndarray, y: np.ndarray | None, uri: str, n_shards: int, *, prefix: str = "part") -> list[str]:
    """Split rows of ``X`` (and ``y``) into ``n_shards`` Parquet files of near-equal size."""
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ShardError(f"{uri}: need a non-empty 2-D feature matrix, got shape {X.shape}")
    if not 1 <= n_shards <= X.shape[0]:
        raise ShardError(f"{uri}: cannot cut {X.shape[0]} rows into {n_shards} shards")
    if X.dtype not in (np.uint8, np.float32):
        X = X.astype(np.float32)
    fs, path = filesystem(uri)
    fs.create_dir(path, recursive=True)
    # Shards of an earlier write (e.g. into more shards) would be read as part of this data set.
    for stale in fs.get_file_info(pafs.FileSelector(path)):
        if stale.base_name.startswith(f"{prefix}-") and stale.base_name.endswith(".parquet"):
            fs.delete_file(stale.path)
    written = []
    for i, rows in enumerate(np.array_split(np.arange(X.shape[0]), n_shards)):
        flat = pa.array(X[rows].reshape(-1))
        columns = {FEATURES: pa.FixedSizeListArray.from_arrays(flat, X.shape[1])}
        if y is not None:
            columns[LABEL] = pa.array(np.asarray(y)[rows].astype(np.int64))
        name = f"{prefix}-{i:05d}.parquet"
        pq.write_table(pa.table(columns), join(path, name), filesystem=fs)
        written.append(join(uri, name))
    return written
