"""A worker's share of a table read in place (:class:`TableShard`): the resolved source, its
pieces and the label classes, saved as a small ``.table.json`` file whose URI the runtime hands out
as it does a Parquet shard's."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from iterreduce.exceptions import ShardError
from iterreduce.specification import Specification, unsaved
from iterreduce.storage.filesystems import filesystem, open_output_file

from .labels import LabelMap
from .pieces import Piece
from .reading import label_column, read_piece
from .tables import TableSource


# ------------------------------------------------------------------ a worker's share of a table


@dataclass(frozen=True)
class TableShard(Specification):
    """One worker's share of a table, read in place: the source, its pieces, and the label
    classes (the same for every share). Saved as a small JSON file whose URI the runtime hands
    out like a Parquet shard's: it is the :class:`shardio.readers.ShardReader` of a
    ``.table.json`` URI."""

    source: TableSource           # resolved (:func:`resolve`): a glob names the same columns everywhere
    pieces: tuple[Piece, ...]
    n_features: int
    classes: LabelMap | None = None
    widths: tuple[int, ...] | None = None  # the features each column gives a row (None: not known)
    uri: str = unsaved("")  # where it was saved, for errors

    suffix = ".table.json"  # how a share's URI ends

    @classmethod
    def open(cls, uri: str) -> TableShard:
        """The share saved at ``uri``; a file that is not one raises :class:`ShardError`."""
        fs, path = filesystem(uri)
        try:
            with fs.open_input_stream(path) as f:
                return dataclasses.replace(cls.from_dict(json.loads(f.read())), uri=uri)
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(f"{uri}: cannot read the table shard: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:  # not JSON, or not a table shard's fields
            raise ShardError(f"{uri}: not a table shard ({type(exc).__name__}: {exc})") from exc

    def save(self, uri: str) -> None:
        """Write the share to ``uri`` (a name ending in :attr:`suffix`), on any file system."""
        with open_output_file(uri) as f:
            f.write(json.dumps(self.to_dict()).encode())

    @property
    def rows(self) -> int:
        """The rows of the pieces as stored (a filter on stored columns may keep fewer)."""
        return sum(p.rows for p in self.pieces)

    def describe(self) -> dict:
        """The reader's description (:meth:`shardio.readers.ShardReader.describe`): raw rows
        have no footer range to check; the label ``classes`` and feature ``columns`` are the
        share's, which the model keeps."""
        if self.rows == 0:
            raise ShardError(f"{self.uri}: shard is empty")
        return {"uri": self.uri, "rows": self.rows, "features": self.n_features, "labels": self.source.label is not None,
                "ranges": {"features": None, "label": None if self.classes is None else (0, len(self.classes) - 1)},
                "classes": None if self.classes is None else self.classes.to_dict(),
                "columns": list(self.source.features), "widths": None if self.widths is None else list(self.widths)}

    def read(self, n_features: int | None, need_labels: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Every row that passes the filter: float32 features and int64 classes (or None)."""
        blocks = list(self.blocks(n_features, need_labels))
        features = np.concatenate([values for values, _ in blocks])
        labels = None if blocks[0][1] is None else np.concatenate([block_labels for _, block_labels in blocks])
        return features, labels

    def blocks(self, n_features: int | None = None, need_labels: bool = False):
        """``(float32 features, int64 classes or None)`` for each piece with rows, in turn."""
        if need_labels and self.source.label is None:
            raise ShardError(f"{self.uri}: the table source names no label column, but this job needs labels")
        if n_features is not None and n_features != self.n_features:
            raise ShardError(f"{self.uri}: {self.n_features} features per row, expected {n_features}")
        found = 0
        for piece in self.pieces:
            X, y = read_piece(self.source, piece, classes=self.classes, n_features=self.n_features)
            if len(X):
                yield X, y
                found += len(X)
        if found == 0:
            raise ShardError(f"{self.uri}: shard is empty (no row of its pieces passes the filter)")

    def labels(self) -> np.ndarray:
        """The classes of every row, reading the label column alone."""
        if self.source.label is None:
            raise ShardError(f"{self.source.uri}: the table source names no 'label' column: a classifier needs labels")
        parts = []
        for piece in self.pieces:
            parts.append(self.classes.encode(label_column(self.source, piece), where=piece.path))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    @classmethod
    def from_dict(cls, d: dict) -> TableShard:
        """The share :meth:`to_dict` wrote."""
        widths = d.get("widths")  # shares written before widths were kept have none
        return cls(TableSource.from_dict(d["source"]), tuple(Piece.from_dict(p) for p in d["pieces"]),
                   int(d["n_features"]), None if d["classes"] is None else LabelMap.from_dict(d["classes"]),
                   None if widths is None else tuple(int(w) for w in widths))
