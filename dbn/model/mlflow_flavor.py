"""A trained classifier as an MLflow model: ``mlflow.pyfunc.load_model(DIR).predict(frame)``.

The folder holds ``model.npz`` itself and an ``MLmodel`` whose ``python_function`` flavor names
this module as its loader (no pickle: MLflow imports :func:`_load_pyfunc`), with the model's
signature (its columns in, its label out), an input example (a row of the training table: a
number, or a list, a column), and an environment that pins this package. ``predict`` reads a pandas DataFrame by
column name, as :meth:`~dbn.model.estimator.DBN.predict` does, and answers in the table's
labels; ``mlflow.pyfunc.spark_udf`` turns it into a Spark UDF.
"""

from __future__ import annotations

import numpy as np

from .. import __version__
from ..errors import ModelFileError
from .estimator import DBN

MODEL_FILE = "model.npz"


class DBNPyfunc:
    """What MLflow's ``load_model`` returns the model as: ``predict(frame)`` gives the labels."""

    def __init__(self, model):
        self.model = model

    def predict(self, model_input, params=None):
        """The label of each row of ``model_input`` (a DataFrame read by column name, or an array)."""
        return self.model.predict(model_input)


def _load_pyfunc(path: str) -> DBNPyfunc:
    """MLflow's entry point: the model in the folder's ``model.npz`` (``path`` is that file)."""

    return DBNPyfunc(DBN.load(path, device="cpu"))


def export_mlflow(model_file: str, out: str) -> dict:
    """Save the classifier in ``model_file`` as an MLflow model in the new folder ``out``."""
    try:
        import mlflow.pyfunc
        import pandas as pd
        from mlflow.models import infer_signature
    except ImportError:
        raise ModelFileError("exporting to MLflow needs mlflow (or mlflow-skinny) and pandas: "
                             "pip install 'dbn-yarn[mlflow]'") from None

    model = DBN.load(model_file, device="cpu")
    if model.network_ is None:
        raise ModelFileError("the model is pre-trained only: it has no classifier to export (fine-tune it: "
                             "[model] finetune_epochs > 0)")
    columns = model.learned("input_columns_")
    widths = model.learned("input_widths_")
    if columns is not None and widths is None and len(columns) == model.n_features_in_:
        widths = (1,) * len(columns)  # one feature a column
    example = None
    if columns is not None and widths is not None:  # a row of the table: a number, or a list, a column
        scaler = model.learned("input_scaler_")
        middle = np.zeros(model.n_features_in_) if scaler is None else scaler.offset + 0.5 / np.where(
            scaler.scale == 0, 1, scaler.scale)  # a raw row the scaler maps to the middle of the range
        ends = np.cumsum((0, *widths))
        cells = [middle[a] if b - a == 1 and w == 1 else middle[a:b].tolist()
                 for a, b, w in zip(ends[:-1], ends[1:], widths)]
        example = pd.DataFrame([cells], columns=list(columns))
    signature = infer_signature(example, model.predict(example)) if example is not None else None
    mlflow.pyfunc.save_model(out, loader_module=__name__, data_path=model_file, signature=signature,
                             input_example=example, pip_requirements=[f"dbn-yarn=={__version__}"])
    return {"out": str(out), "columns": None if columns is None else list(columns),
            "input_example": example is not None}
