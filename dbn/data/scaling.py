"""How a job scales its features: ``[data] scale`` resolved for its data and visible units
(:func:`scale_kind`), a scaler fitted on rows in memory (:func:`fit_scaler`), and the same
statistics gathered by a distributed job's workers as parameters of its first step (:data:`STATS`)
and merged by the master (:func:`merge_stats_arrays`) into the same scaler (:func:`gathered_scaler`).
The statistics and the scaler themselves are :mod:`dbn.model.scaler`'s."""

from __future__ import annotations

from dbn.model.scaler import FeatureStats, Scaler, merged

#: ``[data] scale``: how features are mapped before training. "auto": to [0, 1] by each
#: feature's min and max for Bernoulli visible units, to mean 0 and deviation 1 for Gaussian ones.
SCALINGS = ("auto", "min_max", "standard", "none")


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
    """``stats`` as the float64 arrays of :data:`STATS` (:meth:`FeatureStats.arrays`, each reduced
    element by element)."""
    return {f"input.{name}": values for name, values in stats.arrays().items()}


def merge_stats_arrays(parts: list[dict]) -> dict:
    """The :data:`STATS` arrays of all rows from each worker's (in shard order: the same bits every time)."""
    return stats_arrays(merged([stats_from(part) for part in parts]))


def stats_from(arrays: dict) -> FeatureStats:
    """The statistics in the :data:`STATS` arrays of a job's parameters."""
    return FeatureStats.from_arrays({name.removeprefix("input."): arrays[name] for name in STATS})


def fit_scaler(X, kind: str | None) -> Scaler | None:
    """The scaler of ``kind`` fitted on all rows of ``X`` in one pass (None: no scaling), with
    the same statistics and formula as the workers' gathered ones (:data:`STATS`)."""
    return None if kind is None else FeatureStats.of(X).scaler(kind)


def gathered_scaler(arrays: dict, kind: str | None) -> Scaler | None:
    """The scaler of ``kind`` from merged :data:`STATS` arrays (None: no scaling)."""
    return None if kind is None else stats_from(arrays).scaler(kind)
