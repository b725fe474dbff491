"""Training data read in place from a table as Spark or Hive wrote it (``[data] features`` set).

The job file names the table (``[data] train``, a directory or file URI), its feature
columns, its label column, an optional row filter and the feature scaling. This module
turns that into what training needs, with no copy of the data:

- :func:`open_table`: the table opened once (:class:`OpenedTable`), what the steps below take;
- :func:`table_shards`: the table's pieces (Parquet row groups, ORC files) split among the
  workers, balanced by rows, each share saved as a small ``.table.json`` file that the
  runtime hands out like a Parquet shard (:class:`shardio.table_shard.TableShard`);
- :func:`table_scaler`: the feature scaler from one pass over the rows (a distributed job
  gathers the same statistics on its workers: :data:`dbn.data.scaling.STATS`);
- :func:`read_table`: the whole table (or a test table with the same columns) in memory;
- the label classes (:class:`~shardio.labels.LabelMap`) and the feature scaler
  (:class:`~dbn.model.scaler.Scaler`), computed once, are the same for every share and
  are saved with the model, so that it predicts from raw rows.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pyarrow as pa

from dbn.model.scaler import FeatureStats, Scaler
from iterreduce.launch.yarn.locality import piece_blocks
from iterreduce.storage.filesystems import check_output_file, join, open_output_file
from shardio import iceberg, metastore
from shardio.labels import LabelMap
from shardio.shards import shard_set
from shardio.pieces import assign, table_pieces
from shardio.reading import column_widths, label_classes, read_columns, read_piece
from shardio.table_shard import TableShard
from shardio.tables import VERSIONED_FORMATS, TableSource, open_source, with_version_fixed

from .sharding import FEATURES_COLUMNS, PREDICTION_COLUMNS, RowsWriter, output_columns, output_format
from .validation import DataError


def source_of(data, test: bool = False) -> TableSource:
    """The :class:`TableSource` that a job's ``[data]`` section names: the training table
    (``train``, ``filter``), or with ``test`` the test table (``test``, ``test_filter``)."""
    features = data.features if isinstance(data.features, str) else tuple(data.features)
    name, filter_ = (data.test, data.test_filter) if test else (data.train, data.filter)
    version = data.version if name == data.train else None  # the training table's version, wherever it is read
    uri, fmt, registered = located(data, name)
    if str(uri).lower().endswith((".csv", ".npz")):
        raise DataError(f"{uri}: [data] features names the columns of a table (Parquet or ORC files), but this is "
                        f"a data file, read whole: every column but the label is a feature. Unset [data] features "
                        f"(and drop the columns that are not features), or write the data as Parquet")
    return TableSource(uri, features, data.label, fmt, filter_, version,
                       allow_outside_files=data.allow_outside_files, metastore_table=registered)


def located(data, name: str) -> tuple[str, str, str | None]:
    """Where the table ``name`` (``[data] train`` or ``test``) is, its format, and for a partitioned
    Parquet or ORC table that a metastore names, its reference (:attr:`~shardio.metastore.MetastoreTable.reference`):
    a ``db.table`` name through the Hive metastore (:mod:`shardio.metastore`); with ``[data] catalog``,
    the metadata file the Iceberg catalog holds for it now; else ``name`` itself in ``[data] format``."""
    parts = None if data.catalog is not None else metastore.table_name(name)
    if parts is not None:
        table = metastore.lookup(metastore.metastore_uri(data.metastore, name), name, partitions=False)
        return table.location, table.format, table.reference if table.partition_columns else None
    if data.catalog is None or name.endswith(iceberg.METADATA_SUFFIX):
        return name, data.format, None
    if data.format != "iceberg":
        raise DataError(f"[data] catalog = {data.catalog!r} names an Apache Iceberg catalog, and [data] format is "
                        f"{data.format!r}: set format = \"iceberg\", or unset catalog to name files")
    return iceberg.catalog_table(data.catalog, name), data.format, None


def data_with_version_fixed(data):
    """``data`` (a job's ``[data]``) with the training table's version fixed as a number (a Delta
    table's newest, or the one at the time named), so that every step of the job reads the same
    files; as it is for a table without versions. A table named through a catalog or the metastore
    is then named by where it is (an Iceberg table: its metadata file now), whatever they say later."""
    source = with_version_fixed(source_of(data))
    if source.uri != data.train and source.format in VERSIONED_FORMATS:
        return dataclasses.replace(data, train=source.uri, test=source.uri if data.test == data.train else data.test,
                                   format=source.format, version=source.version)
    return data if source.version == data.version else dataclasses.replace(data, version=source.version)


def _stats(source: TableSource, found, n_features: int) -> FeatureStats:
    """Per-feature statistics of every row the filter keeps, one piece at a time (features alone)."""
    features_only = dataclasses.replace(source, label=None)
    stats = FeatureStats.empty(n_features)
    for piece in found:
        X, _ = read_piece(features_only, piece, n_features=n_features)
        stats.update(X)
    return stats


@dataclasses.dataclass(frozen=True)
class OpenedTable:
    """A table as a job reads it, opened once (:func:`open_table`): its ``source`` (version fixed,
    columns resolved), the ``dataset`` and the ``pieces`` its filter keeps. The features each
    column gives (``widths``) and the label classes are read when first asked, once."""

    source: TableSource
    dataset: object
    pieces: tuple

    @functools.cached_property
    def widths(self) -> tuple[int, ...]:
        """The features each feature column gives a row, from the first piece with rows."""
        features_only = dataclasses.replace(self.source, label=None)
        for piece in self.pieces:
            widths = column_widths(features_only, piece)
            if widths is not None:
                return widths
        raise DataError(f"{self.source.uri}: no row passes the filter {self.source.filter!r}" if self.source.filter
                        else f"{self.source.uri}: the table has no rows")

    @property
    def n_features(self) -> int:
        """The features a row gives."""
        return sum(self.widths)

    @functools.cached_property
    def classes(self) -> LabelMap | None:
        """The label classes (one pass over the label column), None for a table read without labels."""
        return None if self.source.label is None else label_classes(self.source, self.dataset)

    def shard(self, pieces=None) -> TableShard:
        """The table (or its ``pieces``) as a :class:`TableShard`, the reader a worker is given."""
        return TableShard(self.source, tuple(self.pieces if pieces is None else pieces), self.n_features,
                          self.classes, self.widths)


def open_table(data, test: bool = False, columns: tuple[str, ...] | None = None) -> OpenedTable:
    """The training (or ``test``) table that ``data`` (a job's ``[data]``) names, opened once: its
    columns resolved (``columns``, those a model reads, instead of ``[data] features`` when given)
    and the pieces its filter keeps, none of them an error naming the table. Errors in the data
    are :class:`~iterreduce.exceptions.ShardError` naming the file, column and row."""
    source = source_of(data, test=test)
    if columns is not None:
        source = dataclasses.replace(source, features=tuple(columns))
    source, dataset = open_source(source)
    found = table_pieces(source, dataset)
    if not found:
        raise DataError(f"{source.uri}: no data file of the table passes the filter {source.filter!r}"
                        if source.filter else f"{source.uri}: the table has no rows")
    return OpenedTable(source, dataset, tuple(found))


def table_scaler(table: OpenedTable | TableShard, kind: str | None) -> Scaler | None:
    """The scaler of ``kind`` (None: none) from one pass over the rows of ``table`` (features alone)."""
    if kind is None:
        return None
    stats = _stats(table.source, table.pieces, table.n_features)
    if stats.count == 0:
        raise DataError(f"{table.source.uri}: no row passes the filter {table.source.filter!r}")
    return stats.scaler(kind)


def table_shards(whole: OpenedTable, workers: int, directory: str, locate=None) -> list[str]:
    """Split the opened table ``whole`` among ``workers`` (balanced by rows; fewer shares when it has fewer
    pieces) and save each share in ``directory``; returns their URIs in worker order. The
    shares hold raw rows: the workers gather the statistics that scale them (:data:`dbn.data.scaling.STATS`).
    ``locate``: where files' blocks are (:func:`iterreduce.launch.yarn.locality.file_blocks`), so that
    each share's pieces are stored on one host where the blocks allow (:func:`shardio.pieces.assign`).
    ``directory`` is empty or holds shards written here (:func:`shardio.shards.shard_set`)."""
    pieces = list(whole.pieces)
    homes = [b.on for b in piece_blocks(whole.source.uri, pieces, locate)] if locate else None
    shares = [share for share in assign(pieces, workers, homes) if share]
    names = [f"part-{i:05d}{TableShard.suffix}" for i in range(len(shares))]
    with shard_set(directory, names) as written:  # replaces only shards written here (proven), refuses others
        for name, share in zip(names, shares):
            with written.writing(name) as (_, uri):
                whole.shard(share).save(uri)
    return [join(directory, name) for name in names]


def read_table(table: OpenedTable | TableShard, scaler: Scaler | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """All rows of ``table`` in memory: float32 features (scaled by ``scaler`` where given) and classes."""
    blocks = [read_piece(table.source, p, classes=table.classes, n_features=table.n_features) for p in table.pieces]
    X = np.concatenate([X for X, _ in blocks]) if blocks else np.zeros((0, table.n_features), np.float32)
    y = None if table.classes is None else np.concatenate([y for _, y in blocks])
    return (X if scaler is None else scaler.transform(X)), y


def raw_table_rows(data, columns: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the test table (``[data] test`` and ``test_filter``) as they are stored:
    float32 features of ``columns`` (a model's ``input_columns_``; default ``[data] features``)
    and the label column's values, for a model that scales and maps them itself
    (:func:`attach_inputs`). Errors name the file, column and row."""
    table = open_test_table(data, columns)
    X, y = read_table(table)
    return X, table.classes.decode(y)


def open_test_table(data, columns: tuple[str, ...] | None = None) -> TableShard:
    """The test table (``[data] test`` and ``test_filter``) as one :class:`TableShard`, checked
    without reading its features: the columns there (``columns``, default ``[data] features``),
    a label column, rows that pass the filter (one pass over the label column). A job calls it
    before training, so that a typo in the test table's name or filter does not wait for the
    end of training to show."""
    table = open_table(data, test=True, columns=columns)
    if table.source.label is None:
        raise DataError(f"{table.source.uri}: [data] label names no column, but testing needs labels")
    return table.shard()


def attach_inputs(model, classes: LabelMap | None, scaler: Scaler | None, columns: tuple[str, ...] | None = None,
                  widths: tuple[int, ...] | None = None):
    """Give ``model`` a table's label classes, feature scaler and feature columns (with the
    features each gives, ``widths``), so that it scales raw rows, answers in the table's labels
    and reads the same columns of any table; returns it."""
    if classes is None and scaler is None and columns is None:
        return model
    return model.set_inputs(scaler=scaler, classes=None if classes is None else np.asarray(classes.classes),
                            columns=columns, widths=widths if columns is not None else None)


def predict_table(model, data, out: str, *, table: str | None = None, filter: str | None = None,
                  keep: tuple[str, ...] = (), features: bool = False, overwrite: bool = False) -> dict:
    """Predict every row of a table with ``model`` (which scales raw rows and answers in its
    labels) and write the predictions as one Parquet file (CSV for a name ending in .csv) at
    ``out`` (any URI): the ``keep`` columns as stored, ``prediction`` and its ``probability``;
    with ``features``, the rows' ``features`` instead (:func:`~dbn.data.sharding.output_columns`).
    The table and its columns are :func:`scored_table`'s. Reads and writes a piece at a time. A file
    already at ``out`` is refused before the table is opened
    (:class:`~iterreduce.exceptions.OutputExists`, the file untouched) unless ``overwrite``,
    which replaces it atomically. Returns the rows written, and the error of the predictions
    where the table has the label column."""
    fmt = output_format(out)
    check_kept(keep, features)
    check_output_file(out, overwrite=overwrite)
    scored = scored_table(model, data, table=table, filter=filter, features=features)
    rows = wrong = 0
    writer = None
    try:
        with open_output_file(out, overwrite=overwrite) as stream:
            writer = RowsWriter(stream, fmt)
            for piece in table_pieces(scored.source, scored.dataset):
                part = score_piece(model, scored.source, piece, scored.label, keep, features)
                if part is not None:
                    writer.write(part.table)
                    rows, wrong = rows + part.rows, wrong + part.wrong
            if writer.empty:
                raise scored.nothing()
            writer.close()
    finally:
        if writer is not None:
            writer.close()
    return {"table": scored.uri, "filter": scored.filter, "rows": rows, "out": out,
            "error": wrong / rows if scored.label else None, "label": scored.label}


def check_kept(keep: tuple[str, ...], features: bool) -> None:
    """Refuse ``--keep`` columns that clash with the columns predict (or transform) writes."""
    written = FEATURES_COLUMNS if features else PREDICTION_COLUMNS
    taken = [name for name in written if name in keep]
    if taken:
        raise DataError(f"--keep {','.join(keep)}: {', '.join(map(repr, taken))} would clash with the column of "
                        f"that name that {'transform' if features else 'predict'} writes")


@dataclasses.dataclass(frozen=True)
class ScoredTable:
    """A table as a model scores it: its ``source`` (resolved, the model's feature columns, no
    label read as classes), the opened ``dataset``, its ``uri`` and ``filter``, and ``label``:
    the label column where the table has it (the predictions' error is measured against it)."""

    source: TableSource
    dataset: object
    uri: str
    filter: str | None
    label: str | None

    def nothing(self) -> DataError:
        """The error for a table with no row to score."""
        return DataError(f"{self.uri}: no row to predict (filter {self.filter!r})" if self.filter
                         else f"{self.uri}: no row to predict")


def scored_table(model, data, *, table: str | None = None, filter: str | None = None,
                 features: bool = False) -> ScoredTable:
    """The table ``model`` scores: ``table`` (default ``[data] test``, else ``train``) with ``filter``
    (default that table's filter from the job); its feature columns are those the model was trained
    on (``input_columns_``), by name, else the job's ``[data] features``."""
    name = table or data.test or data.train
    if filter is None:
        filter = data.test_filter if name == data.test else data.filter if name == data.train else None
    uri, fmt, registered = located(data, name)
    columns = model.learned("input_columns_")  # the model's, by name, where it names them
    source = source_of(data)
    source = dataclasses.replace(source, uri=uri, format=fmt, metastore_table=registered, label=None, filter=filter,
                                 version=source.version if name == data.train else None,
                                 features=source.features if columns is None else tuple(columns))
    source, dataset = open_source(source)
    label = data.label if data.label in dataset.schema.names and not features else None
    return ScoredTable(source, dataset, uri, filter, label)


@dataclasses.dataclass(frozen=True)
class ScoredPiece:
    """One piece's output columns (``table``), its ``rows`` and, against the label, ``wrong`` ones."""

    table: pa.Table
    rows: int
    wrong: int


def score_piece(model, source: TableSource, piece, label: str | None = None, keep: tuple[str, ...] = (),
                features: bool = False) -> ScoredPiece | None:
    """The ``keep`` columns as stored and the model's outputs for one piece of ``source``'s table
    (None where its filter keeps no row); ``wrong`` counted against the ``label`` column, if any."""
    X, _ = read_piece(source, piece, n_features=model.n_features_in_)
    if not len(X):
        return None
    columns = read_columns(source, piece, list(dict.fromkeys([*keep, *([label] if label else [])])))
    outputs = output_columns(model, X, features=features)
    wrong = 0
    if label:
        truth = columns.column(label).to_numpy(zero_copy_only=False)
        truth = truth.astype(np.int64) if truth.dtype == bool else truth  # as the classes read them
        predicted = outputs[PREDICTION_COLUMNS[0]].to_numpy(zero_copy_only=False)
        wrong = int(np.sum(np.asarray(predicted).astype(str) != truth.astype(str)))
    return ScoredPiece(pa.table({**{name: columns.column(name) for name in keep}, **outputs}), len(X), wrong)
