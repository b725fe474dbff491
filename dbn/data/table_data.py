"""Training data read in place from a table as Spark or Hive wrote it (``[data] features`` set).

The job file names the table (``[data] train``, a directory or file URI), its feature
columns, its label column, an optional row filter and the feature scaling. This module
turns that into what training needs, with no copy of the data:

- :func:`table_shards`: the table's pieces (Parquet row groups, ORC files) split among the
  workers, balanced by rows, each share saved as a small ``.table.json`` file that the
  runtime hands out like a Parquet shard (:class:`iterreduce.tables.TableShard`);
- :func:`read_table`: the whole table (or a test table with the same columns) in memory;
- the label classes (:class:`~iterreduce.tables.LabelMap`) and the feature scaler
  (:class:`~iterreduce.tables.Scaler`), computed once, are the same for every share and
  are saved with the model, so that it predicts from raw rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from iterreduce.shards import join, shard_set
from iterreduce.tables import (TABLE_SHARD_SUFFIX, FeatureStats, LabelMap, Scaler, TableShard, TableSource,
                               assign, label_classes, open_dataset, pieces, read_piece, resolve,
                               write_table_shard)

from .sharding import FEATURES_COLUMNS, PREDICTION_COLUMNS, RowsWriter, output_columns, output_format
from .validation import DataError

#: ``[data] scale``: how features are mapped before training. "auto": to [0, 1] by each
#: feature's min and max for Bernoulli visible units, to mean 0 and deviation 1 for Gaussian ones.
SCALINGS = ("auto", "min_max", "standard", "none")


def source_of(data, test: bool = False) -> TableSource:
    """The :class:`TableSource` that a job's ``[data]`` section names: the training table
    (``train``, ``filter``), or with ``test`` the test table (``test``, ``test_filter``)."""
    features = data.features if isinstance(data.features, str) else tuple(data.features)
    uri, filter_ = (data.test, data.test_filter) if test else (data.train, data.filter)
    if str(uri).lower().endswith((".csv", ".npz")):
        raise DataError(f"{uri}: [data] features names the columns of a table (Parquet or ORC files), but this is "
                        f"a data file, read whole: every column but the label is a feature. Unset [data] features "
                        f"(and drop the columns that are not features), or write the data as Parquet")
    return TableSource(uri, features, data.label, data.format, filter_)


def _stats(source: TableSource, found, n_features: int) -> FeatureStats:
    """Per-feature statistics of every row the filter keeps, one piece at a time (features alone)."""
    features_only = dataclasses.replace(source, label=None)
    stats = FeatureStats.empty(n_features)
    for piece in found:
        X, _ = read_piece(features_only, piece, n_features=n_features)
        stats.update(X)
    return stats


def _width(source: TableSource, found) -> int:
    """Features per row, from the first piece with rows (its features alone)."""
    features_only = dataclasses.replace(source, label=None)
    for piece in found:
        X, _ = read_piece(features_only, piece)
        if len(X):
            return X.shape[1]
    raise DataError(f"{source.uri}: no row passes the filter {source.filter!r}" if source.filter
                    else f"{source.uri}: the table has no rows")


def scale_kind(data, visible: str, table: bool = True) -> str | None:
    """The scaling ``[data] scale`` asks for: "min_max", "standard" or None. "auto" standardises
    every feature for Gaussian visible units, whatever the data; for Bernoulli units it maps a
    table's features to [0, 1] by their range, while other data (MNIST, a .npz or .csv, Parquet
    shards: ``table=False``) is taken as it is, which those units check is within [0, 1]."""
    if data.scale == "auto":
        if visible == "gaussian":
            return "standard"
        return "min_max" if table else None
    return None if data.scale == "none" else data.scale


#: The per-feature statistics of a table's raw rows, as arrays of the distributed job's
#: parameters: its first superstep ("stats") has every worker count its rows and the master
#: add them up; each worker then scales its rows by them, as the model scales new rows.
STATS = ("input.count", "input.min", "input.max", "input.sum", "input.sum_sq")


def stats_arrays(stats: FeatureStats) -> dict:
    """``stats`` as the float64 arrays of :data:`STATS` (the count repeated per feature, so
    that every array is reduced element by element)."""
    return {"input.count": np.full(stats.n_features, float(stats.count)), "input.min": stats.min,
            "input.max": stats.max, "input.sum": stats.sum, "input.sum_sq": stats.sum_sq}


def merge_stats_arrays(parts: list[dict]) -> dict:
    """The :data:`STATS` arrays of all rows from each worker's (in shard order: the same bits every time)."""
    return {"input.count": np.sum([p["input.count"] for p in parts], axis=0),
            "input.min": np.minimum.reduce([p["input.min"] for p in parts]),
            "input.max": np.maximum.reduce([p["input.max"] for p in parts]),
            "input.sum": np.sum([p["input.sum"] for p in parts], axis=0),
            "input.sum_sq": np.sum([p["input.sum_sq"] for p in parts], axis=0)}


def scaler_of(X, kind: str | None) -> Scaler | None:
    """The scaler of ``kind`` fitted on all rows of ``X`` in one pass (None: no scaling), with
    the same statistics and formula as the workers' gathered ones (:data:`STATS`)."""
    return None if kind is None else scaler_from(stats_arrays(FeatureStats.of(X)), kind)


def scaler_from(arrays: dict, kind: str | None) -> Scaler | None:
    """The scaler of ``kind`` from merged :data:`STATS` arrays (None: no scaling)."""
    if kind is None:
        return None
    stats = FeatureStats(int(arrays["input.count"][0]), arrays["input.min"], arrays["input.max"],
                         arrays["input.sum"], arrays["input.sum_sq"])
    return stats.min_max_scaler() if kind == "min_max" else stats.standardizer()


def _opened(data, test: bool = False, columns: tuple[str, ...] | None = None):
    """``(source, dataset, pieces)`` of the training (or ``test``) table: its columns resolved
    (``columns``, those a model reads, instead of ``[data] features`` when given), the pieces
    its filter keeps, none of them an error naming the table."""
    source = source_of(data, test=test)
    if columns is not None:
        source = dataclasses.replace(source, features=tuple(columns))
    dataset = open_dataset(source)
    source = resolve(source, dataset)
    found = pieces(dataset, source.filter)
    if not found:
        raise DataError(f"{source.uri}: no data file of the table passes the filter {source.filter!r}"
                        if source.filter else f"{source.uri}: the table has no rows")
    return source, dataset, found


def table_layout(data) -> tuple[tuple[str, ...], int]:
    """The columns ``[data] features`` names in the training table (a glob expanded in its order
    of columns: what a model trained on it reads from any other table, by name), and the
    features a row they give (from its first piece with rows)."""
    source, _, found = _opened(data)
    return source.features, _width(source, found)


def prepare(data, visible: str, *, statistics: bool = True) -> TableShard:
    """The whole table as one :class:`TableShard`: resolved columns, the pieces the filter
    keeps, the label classes and (unless ``statistics=False``: a distributed job gathers them
    on its workers) the feature scaler from one pass over the rows. Raises
    :class:`~iterreduce.exceptions.ShardError` naming the file, column and row of bad data."""
    source, dataset, found = _opened(data)
    classes = label_classes(source, dataset) if source.label is not None else None
    n_features = _width(source, found)
    if not statistics:
        return TableShard(source, tuple(found), n_features, classes)
    stats = _stats(source, found, n_features)
    if stats.count == 0:
        raise DataError(f"{source.uri}: no row passes the filter {source.filter!r}")
    return TableShard(source, tuple(found), n_features, classes, scaler_from(stats_arrays(stats), scale_kind(data, visible)))


def table_shards(data, visible: str, workers: int, directory: str) -> list[str]:
    """Split the table among ``workers`` (balanced by rows; fewer shares when it has fewer
    pieces) and save each share in ``directory``; returns their URIs in worker order. The
    shares hold raw rows: the workers gather the statistics that scale them (:data:`STATS`).
    ``directory`` is empty or holds shards written here (:func:`iterreduce.shards.shard_set`)."""
    whole = prepare(data, visible, statistics=False)
    shares = [share for share in assign(list(whole.pieces), workers) if share]
    names = [f"part-{i:05d}{TABLE_SHARD_SUFFIX}" for i in range(len(shares))]
    with shard_set(directory, names):  # replaces only shards written here (their manifest's), refuses others
        for name, share in zip(names, shares):
            write_table_shard(join(directory, name), dataclasses.replace(whole, pieces=tuple(share)))
    return [join(directory, name) for name in names]


def read_table(shard: TableShard, *, scaled: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """All rows of ``shard`` in memory: float32 features (scaled by its scaler unless
    ``scaled=False``) and classes."""
    blocks = list(shard.blocks()) if scaled else [read_piece(shard.source, p, classes=shard.classes,
                                                             n_features=shard.n_features) for p in shard.pieces]
    X = np.concatenate([X for X, _ in blocks]) if blocks else np.zeros((0, shard.n_features), np.float32)
    y = None if shard.classes is None else np.concatenate([y for _, y in blocks])
    return X, y


def raw_table_rows(data, columns: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the test table (``[data] test`` and ``test_filter``) as they are stored:
    float32 features of ``columns`` (a model's ``input_columns_``; default ``[data] features``)
    and the label column's values, for a model that scales and maps them itself
    (:func:`attach_inputs`). Errors name the file, column and row."""
    table = open_test_table(data, columns)
    X, y = read_table(table, scaled=False)
    return X, table.classes.decode(y)


def open_test_table(data, columns: tuple[str, ...] | None = None) -> TableShard:
    """The test table (``[data] test`` and ``test_filter``) as one :class:`TableShard`, checked
    without reading its features: the columns there (``columns``, default ``[data] features``),
    a label column, rows that pass the filter (one pass over the label column). A job calls it
    before training, so that a typo in the test table's name or filter does not wait for the
    end of training to show."""
    source, dataset, found = _opened(data, test=True, columns=columns)
    if source.label is None:
        raise DataError(f"{source.uri}: [data] label names no column, but testing needs labels")
    return TableShard(source, tuple(found), _width(source, found), label_classes(source, dataset))


def attach_inputs(model, classes: LabelMap | None, scaler: Scaler | None, columns: tuple[str, ...] | None = None):
    """Give ``model`` a table's label classes, feature scaler and feature columns, so that it
    scales raw rows, answers in the table's labels and reads the same columns of any table;
    returns it."""
    if classes is None and scaler is None and columns is None:
        return model
    return model.set_inputs(scaler=scaler, classes=None if classes is None else np.asarray(classes.classes),
                            columns=columns)


def predict_table(model, data, out: str, *, table: str | None = None, filter: str | None = None,
                  keep: tuple[str, ...] = (), features: bool = False, overwrite: bool = False) -> dict:
    """Predict every row of a table with ``model`` (which scales raw rows and answers in its
    labels) and write the predictions as one Parquet file (CSV for a name ending in .csv) at
    ``out`` (any URI): the ``keep`` columns as stored, ``prediction`` and its ``probability``;
    with ``features``, the rows' ``features`` instead (:func:`~dbn.data.sharding.output_columns`). The table is ``table``
    (default ``[data] test``, else ``train``) with ``filter`` (default that table's filter from
    the job); its feature columns are those the model was trained on (``input_columns_``), by
    name, else the job's ``[data] features``. Reads and writes a piece at a time. A file
    already at ``out`` is refused before the table is opened
    (:class:`~iterreduce.exceptions.OutputExists`, the file untouched) unless ``overwrite``,
    which replaces it atomically. Returns the rows written, and the error of the predictions
    where the table has the label column."""
    import pyarrow as pa

    from iterreduce.shards import check_output_file, open_output_file
    from iterreduce.tables import read_columns

    fmt = output_format(out)
    written = FEATURES_COLUMNS if features else PREDICTION_COLUMNS
    taken = [name for name in written if name in keep]
    if taken:
        raise DataError(f"--keep {','.join(keep)}: {', '.join(map(repr, taken))} would clash with the column of "
                        f"that name that {'transform' if features else 'predict'} writes")
    check_output_file(out, overwrite=overwrite)
    uri = table or data.test or data.train
    if filter is None:
        filter = data.test_filter if uri == data.test else data.filter if uri == data.train else None
    columns = getattr(model, "input_columns_", None)  # the model's, by name, where it names them
    source = source_of(data)
    source = dataclasses.replace(source, uri=uri, label=None, filter=filter,
                                 features=source.features if columns is None else tuple(columns))
    dataset = open_dataset(source)
    source = resolve(source, dataset)
    label = data.label if data.label in dataset.schema.names and not features else None
    rows = wrong = 0
    writer = None
    try:
        with open_output_file(out, overwrite=overwrite) as stream:
            writer = RowsWriter(stream, fmt)
            for piece in pieces(dataset, source.filter):
                X, _ = read_piece(source, piece, n_features=model.n_features_in_)
                if not len(X):
                    continue
                columns = read_columns(source, piece, list(dict.fromkeys([*keep, *([label] if label else [])])))
                outputs = output_columns(model, X, features=features)
                if label:
                    truth = columns.column(label).to_numpy(zero_copy_only=False)
                    truth = truth.astype(np.int64) if truth.dtype == bool else truth  # as the classes read them
                    predicted = outputs[PREDICTION_COLUMNS[0]].to_numpy(zero_copy_only=False)
                    wrong += int(np.sum(np.asarray(predicted).astype(str) != truth.astype(str)))
                writer.write(pa.table({**{name: columns.column(name) for name in keep}, **outputs}))
                rows += len(X)
            if writer.empty:
                raise DataError(f"{uri}: no row to predict (filter {filter!r})" if filter else f"{uri}: no row to predict")
            writer.close()
    finally:
        if writer is not None:
            writer.close()
    return {"table": uri, "filter": filter, "rows": rows, "out": out,
            "error": wrong / rows if label else None, "label": label}
