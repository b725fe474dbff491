"""Raw rows in, label values out: what a :class:`~dbn.model.estimator.DBN` keeps of the table it
was trained on (its feature scaler, label classes and feature columns, :meth:`RawInputs.set_inputs`)
and how it reads new rows with them (a pyarrow Table or pandas DataFrame by column name, scaled,
checked) and maps labels to class indices."""

from __future__ import annotations

import numpy as np

from iterreduce.exceptions import ShardError

from ..data.validation import DataError, check_features, check_labels, is_string_labels
from . import preprocess


class RawInputs:
    """The raw-row side of a DBN (a mixin): it uses the model's ``rbms_``, ``network_``,
    ``n_features_in_``, ``n_classes_``, ``visible``, ``backend`` and :meth:`learned`."""

    def set_inputs(self, scaler=None, classes=None, columns=None, widths=None) -> "RawInputs":
        """Attach what turned the raw table into the training data, so that the model takes raw
        rows and answers in label values; returns self. Saved with the model (:meth:`save`).

        scaler : dbn.model.scaler.Scaler or None
            Scales every row that :meth:`transform`, :meth:`predict_proba`, :meth:`predict` and
            :meth:`score` get, before the input checks: raw rows outside [0, 1] suit Bernoulli
            visible units when the scaler maps them into [0, 1]. Its width must be
            ``n_features_in_`` (when fitted). Kept as a float64 copy in ``input_scaler_``.
        classes : sequence of int or str, or None
            The label value of each class in class-index order, sorted and distinct (a
            ``LabelMap``'s ``classes``), ``n_classes_`` of them (when fine-tuned):
            :meth:`predict` returns these values, :meth:`score` takes them as ``y``, and the
            columns of :meth:`predict_proba` are in their order. Kept as a NumPy array in ``classes_``.
        columns : sequence of str, or None
            The names of the columns (of a table or a CSV file) the features come from, in order
            (a column gives one feature, or a list or vector column several): ``dbn predict``,
            ``dbn transform``, ``dbn evaluate`` and a job's test read these columns, by name,
            whatever the order of columns there or the job file's ``[data] features``. Kept as a
            tuple in ``input_columns_``.
        widths : sequence of int, or None
            With ``columns``: the features each column gives a row (1 for a number, a list's or
            vector's width), adding up to ``n_features_in_``; what an exported model's input
            example is made of. Kept as a tuple in ``input_widths_`` (None: not known).

        None for any means none (rows as given; classes 0..K-1; columns as a job file names
        them). Set before training, the scaler and classes are checked against the data then.
        Training (``fit``, ``pretrain``, ``finetune``) still takes scaled features and class
        indices, as the training job makes them.
        """
        n_features = self.learned("n_features_in_") if self.rbms_ else None
        n_classes = self.network_.n_classes if self.network_ is not None else None
        scaler = None if scaler is None else preprocess.check_scaler(scaler, n_features)
        classes = None if classes is None else preprocess.check_classes(classes, n_classes)
        columns = None if columns is None else preprocess.check_columns(columns)
        if widths is not None and columns is None:
            raise ValueError("widths without columns: they are the features each of the columns gives")
        widths = None if widths is None else preprocess.check_widths(widths, columns, n_features)
        self.input_scaler_, self.classes_, self.input_columns_ = scaler, classes, columns
        self.input_widths_ = widths
        return self

    def _check_inputs(self, n_features: int | None = None, n_classes: int | None = None) -> None:
        """Training data of ``n_features`` features and ``n_classes`` classes must fit inputs set before training."""
        scaler, classes = self.learned("input_scaler_"), self.learned("classes_")
        try:
            if scaler is not None and n_features is not None:
                preprocess.check_scaler(scaler, n_features)
            if classes is not None and n_classes is not None:
                preprocess.check_classes(classes, n_classes)
        except ValueError as exc:
            raise DataError(f"the training data does not fit the inputs given to set_inputs: {exc}") from None

    def _input_X(self, X):
        """Raw rows as the network takes them: scaled by ``input_scaler_`` when set, then checked
        as scaled (the [0, 1] of Bernoulli units is a property of what the network sees)."""
        X = self._rows(X)
        scaler = self.learned("input_scaler_")
        if scaler is None:
            return self._check_X(X)
        X = check_features(X, n_features=self.n_features_in_)  # numeric, 2-D, finite and of the model's width
        return self._check_X(preprocess.scale(scaler, X), name=f"X scaled by the model's {scaler.kind} scaler")

    def _class_indices(self, y, n_samples: int) -> np.ndarray:
        """``y`` as class indices: label values of ``classes_`` when set, else indices 0..n_classes_-1."""
        classes = self.learned("classes_")
        if classes is None:
            if is_string_labels(y):
                raise DataError(f"y: labels that are strings (e.g. {np.asarray(y).ravel()[0].item()!r}), but this model "
                                f"was trained on class indices 0..{self.n_classes_ - 1} and has no classes_")
            return check_labels(y, n_samples=n_samples, n_classes=self.n_classes_)
        return preprocess.encode_labels(classes, y, n_samples)

    def _rows(self, X, record: bool = False):
        """``X`` as rows: a pyarrow Table or a pandas DataFrame with column names is read by name,
        the columns ``input_columns_`` names where set, else all of them in order, which ``record``
        (training from scratch) keeps as ``input_columns_``; anything else is returned as it is."""
        if type(X).__module__.partition(".")[0] not in ("pyarrow", "pandas"):
            return X
        import pyarrow as pa

        from shardio.reading import named_blocks, named_features  # a table's reader: only for Arrow rows

        if isinstance(X, pa.RecordBatch):
            X = pa.Table.from_batches([X])
        elif not isinstance(X, pa.Table):
            if not hasattr(X, "columns") or not all(isinstance(name, str) for name in X.columns):
                return X  # a Series, or a DataFrame of numbered columns: by position
            X = pa.Table.from_pandas(X, preserve_index=False)
        columns = self.learned("input_columns_")
        try:
            if columns is None and record:  # the table's columns, and the features each gives, kept
                columns = tuple(X.column_names)
                blocks = named_blocks(X, columns)
                self.set_inputs(scaler=self.learned("input_scaler_"), classes=self.learned("classes_"),
                                columns=columns, widths=[b.shape[1] for b in blocks] if blocks else None)
                return np.hstack(blocks) if blocks else named_features(X, columns)
            return named_features(X, columns if columns is not None else tuple(X.column_names))
        except ShardError as exc:  # the runtime's: the model's callers catch DataError
            raise DataError(str(exc)) from None

    def _check_X(self, X, fitted: bool = True, name: str = "X"):
        n_features = self.learned("n_features_in_") if fitted else None
        X = check_features(X, name=name, n_features=n_features, unit_interval=self.visible == "bernoulli")
        return self.backend.asarray(X)
