"""What a model does to raw rows before its network sees them, and to class indices after.

The training job scales a table's features with an :class:`dbn.model.scaler.Scaler` and maps
its labels to class indices 0..K-1 with an :class:`shardio.labels.LabelMap`. A
:class:`~dbn.model.estimator.DBN` that carries both (``DBN.set_inputs``) takes raw rows of
the same table and gives label values; it also names the table's columns it reads, so that a
table whose columns come in another order gives it the same features. This module checks them,
applies them and gives their model-file form: the scaler's kind, the classes (integers or
strings, exactly, as JSON) and the columns in the header, the scaler's offset and scale as
float64 arrays named :data:`SCALER_ARRAYS`.

:mod:`shardio.labels` (and with it pyarrow) is imported on first use, so that ``import dbn``
stays quick.
"""

from __future__ import annotations

import collections

import numpy as np

from dbn.model.scaler import Scaler
from iterreduce.exceptions import ShardError

from ..data.validation import check_label_shape
from ..errors import DataError

SCALER_KINDS = ("min_max", "standard")
#: The model-file arrays of a scaler's fields (float64, one value per feature).
SCALER_ARRAYS = {"offset": "scaler.offset", "scale": "scaler.scale"}
_INT64 = np.iinfo(np.int64)


# ------------------------------------------------------------------ checks

def check_scaler(scaler, n_features: int | None = None) -> Scaler:
    """A checked copy of ``scaler`` (an :class:`dbn.model.scaler.Scaler`): a known kind, offset and
    scale 1-D, finite, float64 and of one length, ``n_features`` when given. The copy keeps later
    changes to the caller's arrays out of the model."""
    if not isinstance(scaler, Scaler):
        raise TypeError(f"scaler must be an dbn.model.scaler.Scaler, got {type(scaler).__name__}")
    if scaler.kind not in SCALER_KINDS:
        raise ValueError(f"scaler kind must be one of {SCALER_KINDS}, got {scaler.kind!r}")
    fields = {}
    for name in SCALER_ARRAYS:
        value = np.array(getattr(scaler, name), dtype=np.float64)
        if value.ndim != 1 or value.size == 0:
            raise ValueError(f"scaler {name} has shape {value.shape}, expected (n_features,) with at least 1")
        bad = ~np.isfinite(value)
        if bad.any():
            raise ValueError(f"scaler {name} holds {int(bad.sum())} NaN or infinite value(s), "
                             f"the first at feature {int(np.argmax(bad))}")
        fields[name] = value
    width = fields["offset"].size
    if fields["scale"].size != width:
        raise ValueError(f"scaler scale has {fields['scale'].size} values but its offset {width}")
    if n_features is not None and width != n_features:
        raise ValueError(f"the scaler takes {width} features but the model has {n_features} (n_features_in_)")
    return Scaler(scaler.kind, fields["offset"], fields["scale"])


def check_classes(classes, n_classes: int | None = None) -> np.ndarray:
    """The label values ``classes`` (class i is ``classes[i]``) as a 1-D NumPy array, checked: all
    integers (that fit int64) or all strings, sorted and distinct as a LabelMap holds them,
    ``n_classes`` of them when given."""
    if isinstance(classes, (str, bytes, dict)) or not hasattr(classes, "__iter__"):
        raise TypeError(f"classes must be a sequence of label values, got {type(classes).__name__}")
    if isinstance(classes, np.ndarray) and classes.ndim != 1:
        raise ValueError(f"classes must be 1-D, got shape {classes.shape}")
    values = [v.item() if isinstance(v, np.generic) else v for v in classes]  # NumPy scalars as Python's
    if not values:
        raise ValueError("classes is empty")
    kind = str if isinstance(values[0], str) else int
    for i, v in enumerate(values):
        if not isinstance(v, kind) or isinstance(v, bool):
            raise ValueError(f"classes must be all integers or all strings: {v!r} (at {i}) is of type "
                             f"{type(v).__name__}" + (f", class 0 {values[0]!r} of type {kind.__name__}" if i else ""))
        if kind is int and not _INT64.min <= v <= _INT64.max:
            raise ValueError(f"class {v} (at {i}) does not fit in 64 bits")
    for i, (a, b) in enumerate(zip(values, values[1:]), start=1):
        if a >= b:
            raise ValueError(f"classes must be sorted and distinct: {b!r} (at {i}) comes after {a!r}")
    if n_classes is not None and len(values) != n_classes:
        raise ValueError(f"classes has {len(values)} values but the model has {n_classes} classes (n_classes_)")
    array = np.array(values, dtype=np.int64 if kind is int else str)
    if kind is str and array.tolist() != values:  # NumPy strings drop trailing NULs
        i = next(i for i, (a, b) in enumerate(zip(array.tolist(), values)) if a != b)
        raise ValueError(f"class {values[i]!r} (at {i}) ends in NUL characters, which NumPy strings drop")
    return array


def check_columns(columns) -> tuple[str, ...]:
    """The table columns a model reads, in order (each gives one feature, or a list or vector
    column several), checked: a non-empty sequence of distinct, non-empty strings."""
    if isinstance(columns, (str, bytes, dict)) or not hasattr(columns, "__iter__"):
        raise TypeError(f"columns must be a sequence of column names, got {type(columns).__name__}")
    names = tuple(columns)
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ValueError(f"columns must be non-empty strings, got {list(names)!r}")
    twice = sorted(name for name, n in collections.Counter(names).items() if n > 1)
    if twice:
        raise ValueError(f"columns names {', '.join(map(repr, twice))} twice")
    return names


def check_widths(widths, columns: tuple[str, ...], n_features: int | None = None) -> tuple[int, ...]:
    """The features each of ``columns`` gives a row, checked: one positive integer a column, adding
    up to ``n_features`` where that is known."""
    try:
        values = tuple(int(w) for w in widths)
    except (TypeError, ValueError):
        raise TypeError(f"widths must be a sequence of integers, got {widths!r}") from None
    if len(values) != len(columns) or any(w < 1 or w != v for w, v in zip(values, widths)):
        raise ValueError(f"widths must be one positive integer for each of the {len(columns)} columns, got "
                         f"{list(widths)!r}")
    if n_features is not None and sum(values) != n_features:
        raise ValueError(f"widths {list(values)} add up to {sum(values)} features, but the model takes {n_features}")
    return values


# ------------------------------------------------------------------ applying them

def scale(scaler: Scaler, X) -> np.ndarray:
    """Raw rows ``X`` (checked: 2-D, numeric, finite, of the scaler's width) scaled as the training
    data was, by :meth:`Scaler.transform <dbn.model.scaler.Scaler.transform>` itself: float32 on the host."""
    if type(X).__module__.startswith("cupy"):
        X = X.get()  # the Scaler works on the host; its result goes to the model's device next
    return scaler.transform(X)


def encode_labels(classes: np.ndarray, y, n_samples: int, name: str = "y") -> np.ndarray:
    """The class index (int64) of each label value in ``y`` (1-D, ``n_samples`` of them), by
    :meth:`LabelMap.encode <shardio.labels.LabelMap.encode>` as the training job maps them;
    a value that is not one of ``classes`` raises :class:`DataError` naming it and its row."""
    from shardio.labels import LabelMap  # pyarrow: only when labels are encoded

    if type(y).__module__.startswith("cupy"):
        y = y.get()
    check_label_shape(y, n_samples, name)
    try:
        return LabelMap(tuple(classes.tolist())).encode(y, where=name)
    except ShardError as exc:  # a value that is not a class, or labels of the other type
        raise DataError(str(exc)) from None
    except (TypeError, ValueError) as exc:  # pyarrow cannot read them as one type (e.g. [1, "a"])
        kind = "strings" if classes.dtype.kind == "U" else "integers"
        raise DataError(f"{name}: labels that are not all {kind}, as the model's classes are: {exc}") from None


# ------------------------------------------------------------------ model file

def to_file(scaler: Scaler | None, classes: np.ndarray | None, columns: tuple[str, ...] | None = None,
            widths: tuple[int, ...] | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """(header entries, arrays) of a model file for ``scaler``, ``classes``, ``columns`` and their
    ``widths``: ``"scaler": {"kind": ...}`` with the arrays :data:`SCALER_ARRAYS`, ``"classes": [...]``,
    ``"columns": [...]``, ``"widths": [...]``; empty for None."""
    header, arrays = {}, {}
    if columns is not None:
        header["columns"] = list(columns)
    if widths is not None:
        header["widths"] = [int(w) for w in widths]
    if scaler is not None:
        header["scaler"] = {"kind": scaler.kind}
        arrays = {array: np.asarray(getattr(scaler, field), np.float64) for field, array in SCALER_ARRAYS.items()}
    if classes is not None:
        header["classes"] = np.asarray(classes).tolist()
    return header, arrays


def from_file(header: dict, arrays: dict) -> tuple[Scaler | None, list | None, list | None, list | None]:
    """The scaler, classes, columns and widths :func:`to_file` wrote (None where the file has none), unchecked
    against the model (``DBN.set_inputs`` does that). A scaler's array without the header's
    entry, or the other way round, is a ValueError (KeyError for a missing array)."""
    scaler = None
    if "scaler" in header:
        entry = header["scaler"]
        if not isinstance(entry, dict) or not isinstance(entry.get("kind"), str):
            raise ValueError(f"header 'scaler' must be {{'kind': ...}}, got {entry!r}")
        scaler = Scaler(entry["kind"], **{field: arrays[array] for field, array in SCALER_ARRAYS.items()})
    else:
        stray = [array for array in SCALER_ARRAYS.values() if array in arrays]
        if stray:
            raise ValueError(f"array {stray[0]!r} but no 'scaler' in the header")
    classes = header.get("classes")
    if classes is not None and not isinstance(classes, list):
        raise ValueError(f"header 'classes' must be a list, got {classes!r}")
    columns, widths = header.get("columns"), header.get("widths")
    for name, value in (("columns", columns), ("widths", widths)):
        if value is not None and not isinstance(value, list):
            raise ValueError(f"header {name!r} must be a list, got {value!r}")
    return scaler, classes, columns, widths
