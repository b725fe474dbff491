"""Checks on user data, with errors that say what is wrong and where."""

from __future__ import annotations

import numpy as np

from iterreduce.exceptions import IterReduceError

from ..errors import DataError

#: A class with fewer examples than this share of the median class is reported as rare.
RARE_CLASS_SHARE = 0.05
#: Fewer minibatches than this an epoch (on the smallest shard) draw a warning: the paper's batch
#: of 100 on a few hundred rows makes a handful of updates, and the model learns next to nothing.
FEW_MINIBATCHES = 10
#: Integer labels are class indices 0..max, unless that makes more classes than rows by more than
#: this: then they are codes (years, category numbers), and their sorted values are the classes.
MAX_EMPTY_CLASSES = 1000

UNIT_INTERVAL_HINT = ("scale the data (e.g. pixels / 255; in a job file [data] scale = \"min_max\") or use "
                      "visible='gaussian' for real-valued inputs")


def check_features(X, *, name: str = "X", n_features: int | None = None, unit_interval: bool = False) -> np.ndarray:
    """Validate a 2-D feature matrix and return it as a NumPy (or CuPy) array.

    Raises :class:`DataError` for: non-numeric or non-2-D data, no rows, a feature
    count other than ``n_features``, NaN or infinite values, and (with
    ``unit_interval``) values outside [0, 1], which Bernoulli visible units need.
    """
    xp = _array_module(X)
    X = xp.asarray(X)
    if X.dtype.kind not in "biuf":
        raise DataError(f"{name} must be numeric, got dtype {X.dtype}")
    if X.ndim != 2:
        hint = f": one sample per row, e.g. images flattened, X.reshape({X.shape[0]}, -1)" if X.ndim > 2 else ""
        raise DataError(f"{name} must be 2-D (samples x features), got shape {X.shape}{hint}")
    if X.shape[0] == 0:
        raise DataError(f"{name} is empty: it has no samples")
    if n_features is not None and X.shape[1] != n_features:
        raise DataError(f"{name} has {X.shape[1]} features but the model expects {n_features}")
    if X.dtype.kind == "f":
        bad = ~xp.isfinite(X)
        if bool(bad.any()):
            row, col = (int(i) for i in xp.argwhere(bad)[0])
            raise DataError(
                f"{name} contains {int(bad.sum())} NaN or infinite value(s), "
                f"the first at row {row}, column {col}"
            )
    if unit_interval:
        lo, hi = float(X.min()), float(X.max())
        if lo < 0 or hi > 1:
            row, col = (int(i) for i in xp.argwhere((X < 0) | (X > 1))[0])
            raise DataError(
                f"{name} has values in [{lo:g}, {hi:g}] (the first outside [0, 1] at row {row}, column {col}) "
                f"but Bernoulli visible units need [0, 1]: {UNIT_INTERVAL_HINT}"
            )
    return X


def check_labels(y, *, n_samples: int, n_classes: int | None = None, name: str = "y") -> np.ndarray:
    """Validate integer class labels 0..n_classes-1 for ``n_samples`` rows.

    Without ``n_classes``, labels that are codes (:func:`codes`) are refused: each class is an
    output of the network, and labels such as 20240101 would make millions of them
    (:func:`label_indices` maps codes to classes)."""
    y = integer_labels(y, n_samples, name)
    if y.size and y.min() < 0:
        row = int(np.argmax(y < 0))
        raise DataError(f"{name} has negative label {int(y[row])} at row {row}: labels must be 0..n_classes-1")
    if n_classes is not None and y.size and y.max() >= n_classes:
        row = int(np.argmax(y >= n_classes))
        raise DataError(f"{name} has label {int(y[row])} at row {row}, outside the model's classes "
                        f"0..{n_classes - 1} (n_classes = {n_classes})")
    if n_classes is None and codes(y, n_samples):
        row = int(np.argmax(y))
        raise DataError(f"{name} has label {int(y[row])} at row {row}: as a class index it would make "
                        f"{int(y[row]) + 1:,} classes for {n_samples:,} rows. Labels that are codes need a "
                        f"map to classes 0..K-1: cut the data with `dbn shard`, which maps them, or write "
                        f"labels 0..K-1")
    return y


def codes(y: np.ndarray, n_samples: int) -> bool:
    """Whether non-negative integer labels ``y`` are codes (years, category numbers) rather than
    class indices: as indices 0..max they would make more classes than there are rows by more
    than :data:`MAX_EMPTY_CLASSES`."""
    return bool(y.size) and int(y.min()) >= 0 and int(y.max()) + 1 > n_samples + MAX_EMPTY_CLASSES


def integer_labels(y, n_samples: int, name: str = "y") -> np.ndarray:
    """``y`` as int64 labels, one per row, of any value (class indices or codes, checked by
    :func:`label_indices`); floats must be whole (a NaN is a missing label)."""
    y = np.asarray(_to_host(y))
    check_label_shape(y, n_samples, name)
    if y.dtype.kind == "f":
        if not np.all(np.isfinite(y)):
            row = int(np.argmax(~np.isfinite(y)))
            raise DataError(f"{name} has no label at row {row} ({y[row]}: a null or an empty cell?)")
        if not np.all(y == np.round(y)):
            row = int(np.argmax(y != np.round(y)))
            raise DataError(f"{name} must hold integer class labels, got {y[row]} at row {row}")
    elif y.dtype.kind not in "iub":
        raise DataError(f"{name} must hold integer class labels, got dtype {y.dtype}")
    return y.astype(np.int64)


def check_label_shape(y, n_samples: int, name: str = "y") -> None:
    """Refuse labels that are not one per sample, saying how to get them from the common
    shapes: a column (n, 1), one-hot rows (n, K)."""
    shape = np.shape(y)
    if len(shape) != 1:
        hint = ""
        if len(shape) == 2 and shape[1] == 1:
            hint = ": a column of labels; pass y.ravel()"
        elif len(shape) == 2 and _one_hot(np.asarray(y)):
            hint = ": one-hot rows; pass the class indices, y.argmax(axis=1)"
        raise DataError(f"{name} must be 1-D (one label per sample), got shape {shape}{hint}")
    if shape[0] != n_samples:
        raise DataError(f"{name} has {shape[0]} labels but X has {n_samples} samples")


def _one_hot(y: np.ndarray) -> bool:
    return y.dtype.kind in "biuf" and bool(((y == 0) | (y == 1)).all()) and bool((y.sum(axis=1) == 1).all())


def is_string_labels(y) -> bool:
    """Whether labels ``y`` are label values (text) rather than class indices."""
    y = np.asarray(_to_host(y)) if not isinstance(y, np.ndarray) else y
    if y.dtype.kind in "US":
        return True
    return y.dtype.kind == "O" and y.size > 0 and all(isinstance(v, (str, bytes)) or v is None for v in y.flat)


def label_indices(y, *, n_samples: int, n_classes: int | None = None, classes=None, name: str = "y"):
    """``(indices, classes)``: the class index (int64) of each label in ``y``, and the label
    classes they index, a sorted :class:`~shardio.labels.LabelMap` (None: class i is i).

    Integer labels are class indices 0..n_classes-1 (:func:`check_labels`); ``classes``, when
    given, is returned with them. Without ``classes`` and ``n_classes``, integer codes
    (:func:`codes`: years, category numbers) are label values instead. String labels are
    always label values: they index ``classes`` (a LabelMap or a sequence of the values, e.g. a
    model's ``classes_``) when given. Label values without ``classes`` are classed by their
    sorted distinct values, as a table's labels are. A null or a value that is not a class
    raises :class:`DataError` naming it and its row.
    """
    from shardio.labels import LabelMap  # pyarrow: only when labels are strings to map

    host = np.asarray(_to_host(y))
    if classes is not None and not isinstance(classes, LabelMap):
        classes = LabelMap(tuple(v.item() if isinstance(v, np.generic) else v for v in classes))
    strings = is_string_labels(host)
    if strings:
        check_label_shape(host, n_samples, name)
        values = [v.decode() if isinstance(v, bytes) else v for v in host.tolist()]
        if None in values:
            raise DataError(f"{name} has no label at row {values.index(None)} (a null)")
    else:
        labels = integer_labels(host, n_samples, name)
        if classes is not None:  # integers beside known classes are their indices (a job's encoded labels)
            return check_labels(labels, n_samples=n_samples, n_classes=n_classes or len(classes), name=name), classes
        if n_classes is not None or not codes(labels, n_samples):
            return check_labels(labels, n_samples=n_samples, n_classes=n_classes, name=name), None
        values = labels.tolist()
    try:
        classes = LabelMap(tuple(sorted(set(values)))) if classes is None else classes
        indices = classes.encode(values, where=name)
    except IterReduceError as exc:  # a value that is not a class, or labels of the other type
        raise DataError(str(exc)) from None
    if n_classes is not None and len(classes) != n_classes:
        raise DataError(f"{name}: {len(classes)} label classes ({_some(classes.classes)}) but n_classes = "
                        f"{n_classes}: string labels are their own classes (leave n_classes unset)")
    return indices, classes


def _some(values, shown: int = 5) -> str:
    return ", ".join(map(repr, values[:shown])) + (", ..." if len(values) > shown else "")


def minibatch_warnings(rows: int, model, *, name: str = "the data", fine_tunes: bool = True,
                       python: bool = False) -> list[str]:
    """A warning when ``rows`` (one shard's, the smallest) make fewer than :data:`FEW_MINIBATCHES`
    minibatches an epoch at ``model``'s batch sizes (a :class:`dbn.DBN`'s pre-training and, when
    ``fine_tunes``, fine-tuning), with the batch size that would make that many: as a job file's
    ``[model]`` settings, or with ``python`` as the estimator's arguments."""
    phases = [("pretrain_batch_size", model.pretrain_batch_size, model.pretrain_epochs)]
    if fine_tunes:
        phases.append(("finetune_batch_size", model.finetune_batch_size, model.finetune_epochs))
    if rows < 2:
        return []
    few = [(key, batch, epochs, n) for key, batch, epochs in phases
           if epochs and (n := rows // min(batch, rows)) < FEW_MINIBATCHES]
    if not few:
        return []
    made = "; ".join(f"{key} {batch} makes {n} ({counted(epochs, 'epoch')}: {counted(epochs * n, 'update')})"
                     for key, batch, epochs, n in few)
    smaller = max(1, rows // FEW_MINIBATCHES)
    settings = (f"DBN({', '.join(f'{key}={smaller}' for key, *_ in few)})" if python
                else "[model] " + ", ".join(f"{key} = {smaller}" for key, *_ in few))
    return [f"{name}: {rows} rows make few minibatches an epoch ({made}), too few updates to learn much: "
            f"a smaller batch trains more, e.g. {settings}"]


def class_warnings(counts, *, name: str = "the labels") -> list[str]:
    """Warnings about the class counts ``counts[c]`` (examples of class c): a single class,
    classes with none, and classes with very few next to the others (fewer than
    :data:`RARE_CLASS_SHARE` of the median class present), as a stray label makes. Long
    lists of classes are cut short, so a label column of IDs gives a few lines, not thousands."""
    counts = np.asarray(counts)
    present = counts[counts > 0]
    typical = float(np.median(present)) if present.size else 0.0
    warnings = []
    if present.size == 1:
        warnings.append(f"{name}: one class only ({int(np.flatnonzero(counts)[0])}): the classifier can answer "
                        f"nothing else; is this the label column?")
    empty = np.flatnonzero(counts == 0).tolist()
    if empty:
        which = f"class {empty[0]} has" if len(empty) == 1 else f"classes {listing(empty)} have"
        warnings.append(f"{name}: {which} no examples (the classes run 0..{counts.size - 1})")
    rare = np.flatnonzero((counts > 0) & (counts < RARE_CLASS_SHARE * typical)).tolist()
    hint = "a stray label? set [model] n_classes to make labels outside 0..n_classes-1 an error"
    if len(rare) > 3:
        warnings.append(f"{name}: {len(rare)} classes ({listing(rare)}) have fewer than {RARE_CLASS_SHARE:.0%} "
                        f"of the median class's {typical:.0f} examples: {hint}")
    else:
        for c in rare:
            n = int(counts[c])
            warnings.append(f"{name}: class {c} has only {n} example{'s' if n > 1 else ''} (the median class has "
                            f"{typical:.0f}): {hint}")
    if present.size > 0.5 * counts.sum() and counts.size > 20:
        warnings.append(f"{name}: {present.size} classes for {int(counts.sum())} rows, most with one example: "
                        f"is this an ID column rather than the label?")
    return warnings


def counted(n: int, one: str, many: str | None = None) -> str:
    """"1 worker", "2 workers" ("1 process", "2 processes" with ``many``)."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def listing(items, shown: int = 10) -> str:
    """``items`` as "a, b, c, ... (N in all)" when there are more than ``shown``."""
    items = list(items)
    head = ", ".join(map(str, items[:shown]))
    return head if len(items) <= shown else f"{head}, ... ({len(items)} in all)"


def _array_module(x):
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _to_host(x):
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return x
