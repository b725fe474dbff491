"""A job's training data, decided once from ``[data]`` and ``[cluster]`` (:func:`training_data`).

Three kinds, one class each, with what every path needs of them:

- :class:`ShardFolder`: ``[cluster] shards``, Parquet shards already written (``dbn shard``);
- :class:`Table`: ``[data] train`` with ``[data] features``, a table read in place;
- :class:`DataFile`: ``[data] train`` read whole ("mnist", a .npz, .csv or Parquet file).

In one process a job reads them with :meth:`TrainingData.read` (rows scaled and labels mapped
as the model will keep them); a distributed job hands its workers :meth:`TrainingData.shards`
(written into a folder where they are not already shards); its :meth:`TrainingData.columns` and
:meth:`TrainingData.width` are what a test set must match. :func:`scored_rows` is the same
decision for the rows a trained model reads (the test set, ``dbn predict``, ``dbn transform``).
A new kind of source is one more class here and a line in :func:`training_data`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from dbn.model.scaler import Scaler
from shardio.labels import LabelMap
from shardio.readers import describe_shard, list_shards, shard_info

from ..errors import UsageError
from .scaling import fit_scaler, scale_kind
from .sharding import csv_columns, load_dataset, load_shards, load_source, no_labels, predict_file, shard_dataset
from .table_data import (OpenedTable, data_with_version_fixed, open_table, open_test_table, predict_table,
                         raw_table_rows, read_table, source_of, table_scaler, table_shards)
from .validation import DataError, check_features, counted, label_indices


@dataclass
class Rows:
    """The training rows in memory, as the network sees them, and what the model keeps of them."""

    X: np.ndarray                    # float32 features, scaled by ``scaler``
    y: np.ndarray | None             # class indices (None: no labels read)
    classes: LabelMap | None         # the label values the indices stand for (None: class i is i)
    scaler: Scaler | None            # how raw rows are scaled (None: they are not)
    columns: list[str] | tuple[str, ...] | None  # the columns the features come from, by name
    widths: tuple[int, ...] | None = None  # the features each of them gives (None: one each, or not known)


class TrainingData(ABC):
    """The training data of ``spec`` (a :class:`dbn.jobs.spec.JobSpec`); see the module docstring."""

    #: the rows are a table read in place (whose features "auto" scales to [0, 1] for Bernoulli units)
    in_place = False

    def __init__(self, spec):
        self.spec = spec

    @property
    def uri(self) -> str:
        """What messages name: the folder, table or file."""
        return self.spec.data.train

    def scaling(self) -> str | None:
        """How the features are scaled: "min_max", "standard" or None (:func:`dbn.data.scaling.scale_kind`)."""
        return scale_kind(self.spec.data, self.spec.model.visible, table=self.in_place)

    @abstractmethod
    def read(self) -> Rows:
        """Every training row in this process, scaled, with class indices where the job fine-tunes."""

    @abstractmethod
    def columns(self) -> list[str] | tuple[str, ...] | None:
        """The columns the features come from, by name (None: unnamed), read cheaply."""

    @abstractmethod
    def width(self) -> tuple[int, bool]:
        """``(features a row, whether the rows have labels)``, read cheaply where the data allows it."""

    @abstractmethod
    def shards(self, folder: str, n: int, locate=None) -> list[str]:
        """The URIs of the shards ``n`` workers read, written into ``folder`` where the data is
        not shards already (only shards written there are ever replaced). ``locate``: where files'
        blocks are (:func:`iterreduce.launch.yarn.locality.file_blocks`), for data cut by where it is stored."""

    def cut_message(self, n: int, folder: str) -> str:
        """What :meth:`shards` does for ``n`` workers into ``folder``, for the log."""
        return f"sharding {self.uri} into {n} shards under {folder}"

    @abstractmethod
    def source_note(self, n: int) -> dict | None:
        """What shards cut into a job's own folder come from (their manifest's note: a later run of
        the same data reuses them); None where the data is shards already."""

    def why_fewer(self, n: int) -> str:
        """Why the data makes only ``n`` shards, for fewer workers than asked."""
        return f"{self.uri} makes {n}"

    def spec_for_run(self, earlier: dict | None = None):
        """The job with what it reads fixed for the whole run (a table's version: :meth:`Table.spec_for_run`);
        ``earlier``: the :meth:`source_note` of the shards a resumed run was cut from."""
        return self.spec

    def _scaled(self, X: np.ndarray, y, classes, columns) -> Rows:
        """Rows whose scaler is fitted on ``X`` itself (data read whole), checked for Bernoulli units."""
        scaler = fit_scaler(X, self.scaling())
        X = X if scaler is None else scaler.transform(X)
        if self.spec.model.visible == "bernoulli":  # named here: the model would only say "X"
            check_features(X, name=str(self.uri) if scaler is None else f"{self.uri} scaled ({scaler.kind})",
                           unit_interval=True)
        return Rows(X, y, classes, scaler, columns)


class ShardFolder(TrainingData):
    """``[cluster] shards``: Parquet shards already written; training never reads ``[data] train``."""

    @property
    def uri(self) -> str:
        return self.spec.cluster.shards

    def read(self) -> Rows:
        spec = self.spec
        X, y, classes = load_shards(self.uri, limit=spec.data.limit, n_classes=spec.model.n_classes,
                                    unit_interval=spec.model.visible == "bernoulli" and not self.scaling(),
                                    labels=spec.fine_tunes)
        return self._scaled(X, y, classes, describe_shard(list_shards(self.uri)[0])["columns"])

    @functools.cached_property
    def _infos(self) -> list[dict]:
        return shard_info(list_shards(self.uri))

    def columns(self):
        return self._infos[0].get("columns")

    def width(self):
        return self._infos[0]["features"], all(info["labels"] for info in self._infos)

    def shards(self, folder: str, n: int, locate=None) -> list[str]:
        return list_shards(self.uri)

    def source_note(self, n: int) -> None:
        return None

    def why_fewer(self, n: int) -> str:
        return f"{self.uri} holds {counted(n, 'shard')}"


class Table(TrainingData):
    """``[data] train`` with ``[data] features``: a table read in place, a piece at a time; its
    workers' shares are small files naming their pieces."""

    in_place = True

    @functools.cached_property
    def data(self):
        """``[data]`` with the table's version fixed when first asked
        (:func:`~dbn.data.table_data.data_with_version_fixed`), so that the
        columns, the shares and the rows all come from one version of a Delta or Iceberg table."""
        return data_with_version_fixed(self.spec.data)

    def spec_for_run(self, earlier: dict | None = None):
        """The job with the table's version fixed for the whole run, so that its shares, the rows
        read and the test table (when it is the training table) are all of one version: on a
        resumed run the version its shares were cut from (``earlier``, when of this table),
        else the newest now (or the one at the time named); with ``[data] catalog``, the
        metadata file the catalog names now."""
        mine = _plain(dataclasses.asdict(self.spec.data))
        then = (earlier or {}).get("table")
        if then and mine["version"] is None and {**_plain(then), "version": None} == mine:
            return self.spec.replace(data={"version": then["version"]})
        fixed = _plain(dataclasses.asdict(self.data))
        return self.spec.replace(data={key: value for key, value in fixed.items() if value != mine[key]})

    @functools.cached_property
    def location(self) -> str:
        """Where the table is (with ``[data] catalog``, its metadata file; a name in the metastore, the
        location it gives): what the workers read."""
        return source_of(self.data).uri

    @functools.cached_property
    def table(self) -> OpenedTable:
        """The table opened once for the job (:func:`~dbn.data.table_data.open_table`): its
        columns, widths, classes and pieces, what reading, sizing and sharing it all take."""
        return open_table(self.data)

    def read(self) -> Rows:
        table = self.table
        scaler = table_scaler(table, self.scaling())
        X, y = read_table(table, scaler)
        if y is None and self.spec.fine_tunes:
            raise DataError(f"{self.uri}: [data] label names no column, but fine-tuning needs labels "
                            f"([model] finetune_epochs = 0 pre-trains only)")
        return Rows(X, y, table.classes, scaler, table.source.features, table.widths)

    def columns(self):
        return self.table.source.features

    def width(self):
        return self.table.n_features, True

    def shards(self, folder: str, n: int, locate=None) -> list[str]:
        return table_shards(self.table, n, folder, locate)

    def cut_message(self, n: int, folder: str) -> str:
        at = "" if self.data.version is None else f" at {self.data.format} version {self.data.version}"
        return f"splitting the table {self.uri}{at} among {n} workers (its shares under {folder})"

    def source_note(self, n: int) -> dict:
        return {"table": dataclasses.asdict(self.data), "visible": self.spec.model.visible, "shards": n}

    def why_fewer(self, n: int) -> str:
        return (f"the table has {counted(n, 'piece')}, a worker's unit of work (a Parquet row group, an "
                f"ORC file): write it in smaller row groups or more files to train on more workers")


class DataFile(TrainingData):
    """``[data] train`` read whole: "mnist", a .npz, .csv or Parquet file; cut into Parquet shards for workers."""

    def read(self) -> Rows:
        spec, data = self.spec, self.spec.data
        X, y = load_dataset(self.uri, split="train", mnist_dir=data.mnist_dir, limit=data.limit,
                            labels=spec.fine_tunes, label=data.label)
        classes = None
        if spec.fine_tunes:
            y, classes = label_indices(y, n_samples=X.shape[0], n_classes=spec.model.n_classes,
                                       name=f"{self.uri} labels")
        return self._scaled(X, y, classes, csv_columns(self.uri, data.label))

    def columns(self):
        return csv_columns(self.uri, self.spec.data.label)

    def width(self):
        data = self.spec.data
        X, y = load_source(self.uri, split="train", mnist_dir=data.mnist_dir, label=data.label)  # no float32 copy
        if y is None:  # the training data's own fault, named before any comparison
            raise no_labels(self.uri, data.label)
        return X.shape[1], True

    def shards(self, folder: str, n: int, locate=None) -> list[str]:  # written fresh: stored where HDFS puts it
        data = self.spec.data
        return shard_dataset(self.uri, folder, n, split="train", mnist_dir=data.mnist_dir, limit=data.limit,
                             label=data.label, labels=self.spec.fine_tunes)

    def source_note(self, n: int) -> dict:
        data = self.spec.data
        return {"train": data.train, "limit": data.limit, "shards": n, "mnist_dir": data.mnist_dir,
                **({"label": data.label} if data.label else {})}


def _plain(section: dict) -> dict:
    """A section's values as JSON gives them back (tuples as lists), for comparing with a note."""
    return json.loads(json.dumps(section))


def training_data(spec) -> TrainingData:
    """The training data of ``spec``: shards when ``[cluster] shards`` names them (``[data] train``
    is then never read), else a table read in place when ``[data] features`` names its columns,
    else a data file read whole."""
    if spec.cluster.shards:
        return ShardFolder(spec)
    if spec.data.features is not None:
        return Table(spec)
    return DataFile(spec)


# ------------------------------------------------------------------ the rows a trained model reads


class ScoredRows(ABC):
    """The rows a trained model reads, raw, by the columns it names (the model scales them and
    answers in its labels): the job's test set, or the rows ``dbn predict`` and ``dbn transform``
    write. A table when ``[data] features`` names columns, else a data file (:func:`scored_rows`)."""

    def __init__(self, data):
        self.data = data  # the job's [data] section

    @abstractmethod
    def test_rows(self, columns=None) -> tuple[np.ndarray, np.ndarray]:
        """The test set's features (of ``columns``, a model's, where given) and label values."""

    @abstractmethod
    def test_width(self, columns=None) -> int:
        """The test set's features a row, read as :meth:`test_rows` reads them (as cheaply as it can)."""

    def check_options(self, keep: tuple[str, ...], filter: str | None, job: str) -> None:
        """Refuse ``dbn predict`` options these rows cannot honour, before anything is read."""

    @abstractmethod
    def predict(self, model, out: str, *, table: str | None, filter: str | None, keep: tuple[str, ...],
                features: bool, overwrite: bool) -> dict:
        """Write ``model``'s predictions (or with ``features``, its features) of the rows to ``out``."""


class TableRows(ScoredRows):
    """A table's rows (``[data] test`` or another table with the training table's columns), a piece at a time."""

    def test_rows(self, columns=None):
        return raw_table_rows(self.data, columns)

    def test_width(self, columns=None):
        return open_test_table(self.data, columns).n_features

    def predict(self, model, out, *, table, filter, keep, features, overwrite):
        return predict_table(model, self.data, out, table=table, filter=filter, keep=keep, features=features,
                             overwrite=overwrite)


class FileRows(ScoredRows):
    """A data file's rows ("mnist", a .npz or .csv), read whole, every column but the label a feature."""

    def test_rows(self, columns=None):
        data = self.data
        return load_dataset(data.test, split="test", mnist_dir=data.mnist_dir, labels=True, label=data.label,
                            columns=columns)  # a CSV's columns by name

    def test_width(self, columns=None):
        return self.test_rows(columns)[0].shape[1]

    def check_options(self, keep, filter, job):
        if keep or filter:
            raise UsageError(f"{job}: [data] features names no columns, so the data is a file whose every "
                             f"column is a feature: --keep and --filter are for tables")

    def predict(self, model, out, *, table, filter, keep, features, overwrite):
        data = self.data
        return predict_file(model, table or data.test or data.train, out, mnist_dir=data.mnist_dir, label=data.label,
                            features=features, overwrite=overwrite)


def scored_rows(data) -> ScoredRows:
    """The rows a model trained on ``[data]`` (a job's section) reads: a table's when ``[data]
    features`` names its columns, else a data file's."""
    return FileRows(data) if data.features is None else TableRows(data)
