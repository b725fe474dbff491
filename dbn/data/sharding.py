"""Turn a dataset into Parquet shards for the distributed runtime (``dbn shard``).

Sources: ``mnist`` (the IDX files; the training set, or the test set with
``split="test"``), a NumPy ``.npz`` with arrays ``X`` and optional ``y``, or a CSV
file whose columns are the features plus an optional ``label`` column.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from iterreduce.exceptions import ShardError
from iterreduce.process import memory as machine_memory
from iterreduce.storage import npzfile
from iterreduce.storage.filesystems import check_output_file, open_output_file
from shardio.readers import describe_shard, list_shards, read_shard, same_classes, shard_classes
from shardio.shards import as_float32, write_shards

from ..model.preprocess import encode_labels
from .mnist import load_mnist
from .validation import DataError, check_features, check_labels, integer_labels, is_string_labels, label_indices


#: What ``dbn predict`` writes for each row, beside its number or the columns it keeps: the label, its probability.
PREDICTION_COLUMNS = ("prediction", "probability")
#: What ``dbn transform`` writes instead: the top hidden layer's activations, a fixed-size list of
#: float32 as the shards' features are (so that another job can read them as its features).
FEATURES_COLUMNS = ("features",)
#: Where a data file keeps its labels unless ``[data] label`` names another: a .npz's array, a .csv's column.
NPZ_LABELS, CSV_LABELS = "y", "label"


def output_columns(model, X, *, features: bool = False) -> dict:
    """The columns that ``dbn predict`` (or with ``features``, ``dbn transform``) writes for the
    raw rows ``X``: ``prediction`` and its ``probability``, or the ``features``."""
    if features:
        top = np.ascontiguousarray(model.transform(X), dtype=np.float32)
        return {FEATURES_COLUMNS[0]: pa.FixedSizeListArray.from_arrays(pa.array(top.ravel()), top.shape[1])}
    proba = model.predict_proba(X)
    best = proba.argmax(axis=1)
    classes = model.learned("classes_")
    return {PREDICTION_COLUMNS[0]: pa.array(best if classes is None else classes[best]),
            PREDICTION_COLUMNS[1]: pa.array(proba[np.arange(len(best)), best].astype(np.float32))}


#: Endings of ``--out`` that name another format than the two written: refused, not written as Parquet.
OTHER_FORMATS = (".tsv", ".txt", ".json", ".jsonl", ".npz", ".npy", ".orc", ".avro", ".feather", ".arrow",
                 ".xlsx", ".xls", ".gz", ".zip")


def output_format(out: str) -> str:
    """How ``dbn predict`` and ``dbn transform`` write ``out``: "csv" for a name ending in .csv,
    else "parquet"; a name ending like another format (:data:`OTHER_FORMATS`) is refused."""
    name = str(out).rstrip("/").rsplit("/", 1)[-1].lower()
    if name.endswith(".csv"):
        return "csv"
    if name.endswith(OTHER_FORMATS):
        raise DataError(f"--out {out}: the rows are written as Parquet (.parquet, or any other name) or as CSV "
                        f"(.csv), not as {'.' + name.rsplit('.', 1)[-1]}")
    return "parquet"


class RowsWriter:
    """Writes the tables of ``dbn predict`` / ``dbn transform`` one after another into ``stream``,
    as Parquet or CSV (:func:`output_format`). CSV has no list columns: a fixed-size list
    column (``features``) becomes one float column per element, ``features_0``, ``features_1``..."""

    def __init__(self, stream, fmt: str):
        self.stream, self.format, self._writer = stream, fmt, None

    def write(self, table) -> None:
        if self.format == "csv":
            columns = {}
            for name, column in zip(table.column_names, table.columns):
                if pa.types.is_fixed_size_list(column.type):
                    values = column.combine_chunks().flatten().to_numpy().reshape(len(column), -1)
                    columns.update({f"{name}_{j}": values[:, j] for j in range(values.shape[1])})
                else:
                    columns[name] = column
            table = pa.table(columns)
        if self._writer is None:
            if self.format == "csv":
                self._writer = pacsv.CSVWriter(self.stream, table.schema)
            else:
                self._writer = pq.ParquetWriter(self.stream, table.schema)
        self._writer.write_table(table)

    @property
    def empty(self) -> bool:
        return self._writer is None

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def load_source(source: str, *, split: str = "train", mnist_dir: str | None = None,
                limit: int | None = None, label: str | None = None,
                columns: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Features and labels from ``source`` ("mnist", a .npz or a .csv file). ``label`` names the
    labels (``[data] label``): a .npz's array (default ``y``; the features are ``X``) or a .csv's
    column (default ``label``; every other column is a feature, or with ``columns``, a model's
    ``input_columns_``, those columns by name); a named one that is missing is an error. Labels
    are class indices (checked) or strings, label values as they were in the file (map them
    with :func:`~dbn.data.validation.label_indices`)."""
    if source == "mnist":
        data = load_mnist(mnist_dir)
        X, y = (data.x_train, data.y_train) if split == "train" else (data.x_test, data.y_test)
    else:
        path = Path(source).expanduser()
        if path.is_dir():
            raise DataError(f"{path}: a directory, not a data file: Parquet shards (`dbn shard`'s) go in "
                            f"[cluster] shards; a table (Spark's or Hive's Parquet or ORC) is read in place when "
                            f"[data] features names its columns (README, \"Your own data\")")
        if not path.is_file():
            raise DataError(f"{path}: no such data file (use 'mnist', a .npz with arrays X and y, or a .csv)")
        if path.suffix == ".npz":
            X, y = _read_npz(path, label)
        elif path.suffix == ".csv":
            X, y = _read_csv(path, label, columns)
        else:
            raise DataError(f"{path}: unknown data format {path.suffix!r} (use .npz or .csv)")
        X = check_features(X, name=str(path))
        if y is not None:  # class indices, or label values (strings, integer codes: see label_indices)
            y = y if is_string_labels(y) else integer_labels(y, n_samples=X.shape[0], name=f"{path} labels")
    if limit is not None:
        X, y = X[:limit], (None if y is None else y[:limit])
    return X, y


#: dtype kinds a data .npz may hold: numbers, and strings for its labels (never Python objects)
NPZ_KINDS = npzfile.PLAIN_KINDS + "US"


def _read_npz(path: Path, label: str | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Arrays ``X`` and the labels (``label``, else ``y``, None if absent) of the .npz at ``path``,
    read within :mod:`iterreduce.storage.npzfile`'s limits for data files: a header that claims more than
    its member holds, a member whose stream holds more or less than the zip declares, or members
    that claim more than the machine's available memory, are an error naming the file, the
    member and the size. However far it compresses, a data file is the user's own (one-hot,
    sparse): no ratio to its size limits it, as one limits model files."""
    memory = machine_memory.available_memory()  # by the module's name: tests set it
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            names = npzfile.array_names(f, size, memory)
            if "X" not in names:
                raise DataError(f"{path}: no array 'X' (arrays: {names})")
            if label is not None and label not in names:
                raise DataError(f"{path}: no array {label!r} ([data] label; arrays: {names})")
            name = label or NPZ_LABELS
            arrays = npzfile.read_npz(f, size, only={"X", name}, kinds=NPZ_KINDS, memory=memory)
    except (OSError, npzfile.NpzError) as exc:
        raise DataError(f"{path}: not a readable .npz file: {exc}") from exc
    return arrays["X"], arrays.get(name)




def load_dataset(source: str, *, split: str = "train", mnist_dir: str | None = None, limit: int | None = None,
                 labels: bool = False, label: str | None = None,
                 columns: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Features ready to train on and labels, from ``source`` ("mnist", a .npz or a .csv, as
    :func:`load_source`); ``labels=True`` requires them. uint8 features (MNIST's pixels, a .npz
    of images) are intensities, read as [0, 1] as the shards read them
    (:func:`shardio.shards.as_float32`): the same rows in this process, on the workers and
    when a model is tested."""
    X, y = load_source(source, split=split, mnist_dir=mnist_dir, limit=limit, label=label, columns=columns)
    if labels and y is None:
        raise no_labels(source, label)
    return as_float32(X), y


def no_labels(source: str, label: str | None) -> DataError:
    """The error for a data file without labels where a classifier needs them."""
    return DataError(f"{source}: no labels (a .npz's array {label or NPZ_LABELS!r}, a CSV's column "
                     f"{label or CSV_LABELS!r}; [data] label or --label names another), but a classifier is "
                     f"fine-tuned and tested on labels ([model] finetune_epochs = 0 pre-trains only, without them)")


def load_shards(uri: str, *, limit: int | None = None, n_classes: int | None = None,
                unit_interval: bool = False, labels: bool = True):
    """``(X, y, classes)``: the features and class indices of every Parquet shard under ``uri``
    (a directory or URI), in order, and the label classes the shards were written with
    (:func:`shardio.readers.shard_classes`), for training in one process on the shards a job
    names; the first ``limit`` rows only. Each shard is checked as a worker would: a label
    outside ``0..n_classes-1``, or (with ``unit_interval``) a feature outside [0, 1], is an
    error naming its shard and row. ``labels=False`` (pre-training only) reads shards without
    labels too, and then gives ``y`` None."""
    uris = list_shards(uri)
    parts = [read_shard(shard, i, need_labels=labels) for i, shard in enumerate(uris)]
    labels = labels or all(part.labels is not None for part in parts)
    for part in parts:
        check_features(part.features, name=part.uri, unit_interval=unit_interval)
        if labels:
            check_labels(part.labels, n_samples=part.rows, n_classes=n_classes, name=f"{part.uri}: 'label'")
    widths = {part.features.shape[1]: part.uri for part in parts}
    if len(widths) > 1:
        raise ShardError(f"{uri}: shards disagree on the feature count: " +
                         ", ".join(f"{name} has {width}" for width, name in sorted(widths.items())))
    classes = shard_classes(uris)  # after the rows: their errors name the row and column
    X = np.concatenate([part.features for part in parts])
    y = np.concatenate([part.labels for part in parts]) if labels else None
    return (X, y, classes) if limit is None else (X[:limit], None if y is None else y[:limit], classes)


def csv_columns(source: str, label: str | None = None) -> list[str] | None:
    """The feature columns of a .csv ``source`` as :func:`load_source` reads them (every column
    but the label), from its header alone; None for other sources, whose features have no names."""
    if not str(source).lower().endswith(".csv"):
        return None
    path = Path(source).expanduser()
    try:
        with pacsv.open_csv(path) as reader:
            names = reader.schema.names
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad CSV
        raise DataError(f"{path}: not a readable CSV file: {exc}") from exc
    return [name for name in names if name != (label or CSV_LABELS)]


def _read_csv(path: Path, label: str | None = None, columns: tuple[str, ...] | None = None):
    """Features (every column but the ``label`` column, or ``columns`` by name, all numeric) and
    labels (None without the column, an error when ``label`` names one that is not there; an
    empty cell is a null, which :func:`~dbn.data.validation.label_indices` names)."""
    try:
        table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(strings_can_be_null=True))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad CSV
        raise DataError(f"{path}: not a readable CSV file: {exc}") from exc
    if label is not None and label not in table.column_names:
        raise DataError(f"{path}: no column {label!r} ([data] label; columns: {', '.join(table.column_names[:20])}"
                        f"{', ...' if len(table.column_names) > 20 else ''})")
    name = label or CSV_LABELS
    y = table.column(name).to_numpy(zero_copy_only=False) if name in table.column_names else None
    features = [c for c in table.column_names if c != name] if columns is None else list(columns)
    if not features:
        raise DataError(f"{path}: no feature columns")
    missing = [c for c in features if c not in table.column_names]
    if missing:
        shown = ", ".join(features[:10]) + (", ..." if len(features) > 10 else "")
        raise DataError(f"{path}: no column {missing[0]!r}{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}"
                        f": the model reads the columns it was trained on, by name ({shown})")
    for column_name in features:
        type_ = table.schema.field(column_name).type
        if not (pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)
                or pa.types.is_null(type_)):
            first = next((v for v in table.column(column_name).to_pylist() if v is not None), None)
            hint = (": the file seems separated by ';' or tabs, not commas" if any(c in column_name for c in ";\t")
                    else f"; a CSV's columns are the features and its labels ({name!r} unless [data] label "
                         f"or --label names another)")
            raise DataError(f"{path}: column {column_name!r} is not numeric (type {type_}, e.g. {first!r}){hint}")
    X = np.column_stack([table.column(c).to_numpy(zero_copy_only=False) for c in features])
    return X.astype(np.float32), y


def shard_dataset(source: str, out: str, n_shards: int, *, labels: bool = False, **kwargs) -> list[str]:
    """Write ``source`` as ``n_shards`` Parquet shards under ``out`` (a path or URI); string
    labels are written as class indices, their classes kept in every shard's metadata.
    ``labels=True`` (a job that fine-tunes) refuses a source without labels before writing, and a
    source inside ``out`` (whose earlier shards the new set replaces) before anything is read."""
    from iterreduce.storage.ownership import check_not_within

    if source != "mnist":
        check_not_within("the source", source, out, "the folder the shards are written into (its set is replaced)")
    X, y = load_source(source, **kwargs)
    if labels and y is None:
        raise no_labels(source, kwargs.get("label"))
    if n_shards < 1 or n_shards > X.shape[0]:
        raise ShardError(f"{source}: cannot cut {X.shape[0]} rows into {n_shards} shards (a job cuts one a "
                         f"worker: at most {X.shape[0]} workers)")
    if X.dtype != np.uint8:
        X = X.astype(np.float32)
    classes = None
    if y is not None:
        y, classes = label_indices(y, n_samples=X.shape[0], name=f"{source} labels")
    return write_shards(X, y, out, n_shards, classes=classes, columns=csv_columns(source, kwargs.get("label")))


def predict_file(model, source: str, out: str, *, mnist_dir: str | None = None, split: str = "test",
                 label: str | None = None, features: bool = False, overwrite: bool = False) -> dict:
    """Predict every row of a data file (``source``: "mnist" (its ``split``), a .npz or a .csv,
    read as :func:`load_dataset` reads it) with ``model`` and write one Parquet (or, for a name
    ending in .csv, CSV: :func:`output_format`) file at ``out`` (any URI): each row's number in the file (``row``), its ``prediction`` (a label value of the
    model's classes) and that class's ``probability``; with ``features``, its ``features``
    instead (:func:`output_columns`). A file already at ``out`` is refused before anything is
    read (:class:`~iterreduce.exceptions.OutputExists`, the file untouched) unless
    ``overwrite``, which replaces it atomically. Returns the rows written, and the error of the
    predictions where the file has labels."""
    fmt = output_format(out)
    check_output_file(out, overwrite=overwrite)
    X, y = load_dataset(source, split=split, mnist_dir=mnist_dir, label=label,
                        columns=model.learned("input_columns_"))  # by name, as the model was trained
    columns = output_columns(model, X, features=features)
    table = pa.table({"row": pa.array(np.arange(len(X), dtype=np.int64)), **columns})
    with open_output_file(out, overwrite=overwrite) as stream:
        writer = RowsWriter(stream, fmt)
        writer.write(table)
        writer.close()
    error = None
    if y is not None and not features:  # the labels as DBN.score takes them: class indices, or the classes' values
        name, classes = f"{source} labels", model.learned("classes_")
        truth = (check_labels(y, n_samples=len(X), n_classes=model.n_classes_, name=name) if classes is None
                 else encode_labels(classes, y, len(X), name=name))
        predicted = columns[PREDICTION_COLUMNS[0]].to_numpy(zero_copy_only=False)
        error = float(np.mean(predicted != (truth if classes is None else classes[truth])))
    return {"table": source, "filter": None, "rows": int(len(X)), "out": out, "error": error,
            "label": None if error is None else label or (NPZ_LABELS if source.endswith(".npz") else CSV_LABELS)}


def load_validation(uri: str, *, n_features: int, classes=None, scaler=None) -> tuple[np.ndarray, np.ndarray]:
    """The rows and class indices of the validation shard ``uri`` (``[cluster] validation``),
    ready to score a model trained in this process: scaled by the training data's ``scaler``,
    checked to have ``n_features`` features and the training labels' ``classes`` (a LabelMap,
    None: class indices), as a distributed job checks it."""
    info = describe_shard(uri)
    part = read_shard(uri, 0, need_labels=True)
    if part.features.shape[1] != n_features:
        raise DataError(f"{uri}: the validation shard has {part.features.shape[1]} features per row but the "
                        f"training data has {n_features}")
    same_classes(info, {"uri": "the training data", "classes": None if classes is None else classes.to_dict()})
    X = as_float32(part.features)
    return (X if scaler is None else scaler.transform(X)), check_labels(part.labels, n_samples=part.rows,
                                                                         name=f"{uri}: 'label'")
