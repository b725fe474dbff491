"""A trained classifier as an ONNX graph: raw rows in, the table's labels and their probabilities out.

The whole inference path of :meth:`~dbn.model.estimator.DBN.predict` is in the graph: the saved
feature scaler (in float64, then rounded to float32, as :class:`~dbn.model.scaler.Scaler`
does), the sigmoid layers, the softmax, and the label classes (strings or integers) as a
constant the most probable class indexes. Where the model knows its columns and each gives one
feature, each column is an input of its own, by name ([N, 1]); otherwise one input ``features``
([N, n_features]) takes them in the model's order (the metadata ``columns`` names them). The
batch dimension is free. ONNX Runtime serves the file in Python, Java, C++ and Triton.

The graph's own values (constants, intermediate results) are named under a prefix no input name
starts with (``dbn/``, else ``dbn1/``...), so a column may be called anything a value of the graph
is: one graph holds one value a name, inputs included. The outputs keep the names users rely on
(``label``, ``probabilities``): a model with a column named like one of them, or like nothing an
input can be, takes its rows in the one input ``features``.
"""

from __future__ import annotations

import json

import numpy as np

from .. import __version__
from ..errors import ModelFileError

#: The opset the graph is written for (ONNX Runtime 1.16 and later run it).
OPSET = 17
LABEL, PROBABILITIES, FEATURES = "label", "probabilities", "features"
#: The graph's outputs, by the names docs/serving.md gives them.
OUTPUTS = (LABEL, PROBABILITIES)
#: The start of the names of the graph's own values (:func:`internal_prefix`).
PREFIX = "dbn"


def to_onnx(model):
    """The ONNX ``ModelProto`` of fine-tuned ``model`` (:mod:`dbn.model.onnx_export`); a model
    that is pre-trained only has no classes to answer in: :class:`ModelFileError`."""
    try:
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        raise ModelFileError("exporting to ONNX needs the onnx package: pip install 'dbn-yarn[onnx]'") from None
    if model.network_ is None:
        raise ModelFileError("the model is pre-trained only: it has no classifier to export (fine-tune it: "
                             "[model] finetune_epochs > 0)")
    be = model.backend
    weights = [be.to_numpy(w).astype(np.float32) for w in model.network_.weights]
    biases = [be.to_numpy(b).astype(np.float32) for b in model.network_.biases]
    columns = model.learned("input_columns_")
    scaler = model.learned("input_scaler_")
    classes = model.learned("classes_")
    n_features = weights[0].shape[0]

    nodes, constants = [], []

    def constant(name: str, value: np.ndarray) -> str:
        constants.append(numpy_helper.from_array(value, name))
        return name

    def node(op: str, inputs: list[str], output: str, **attributes) -> str:
        nodes.append(helper.make_node(op, inputs, [output], **attributes))
        return output

    per_column = input_names(columns, n_features)
    own = internal_prefix(per_column or [FEATURES])  # the prefix of the graph's own names
    if per_column:
        graph_inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 1]) for name in per_column]
        x = node("Concat", per_column, own + "rows", axis=1)
    else:
        graph_inputs = [helper.make_tensor_value_info(FEATURES, TensorProto.FLOAT, ["N", n_features])]
        x = FEATURES
    if scaler is not None:  # (x - offset) * scale in float64, clipped to [0, 1] for min-max, rounded once
        x = node("Cast", [x], own + "rows64", to=TensorProto.DOUBLE)
        x = node("Sub", [x, constant(own + "scaler_offset", np.asarray(scaler.offset, np.float64))], own + "centred")
        x = node("Mul", [x, constant(own + "scaler_scale", np.asarray(scaler.scale, np.float64))], own + "scaled64")
        if scaler.kind == "min_max":
            x = node("Clip", [x, constant(own + "zero", np.array(0.0)), constant(own + "one", np.array(1.0))],
                     own + "clipped")
        x = node("Cast", [x], own + "scaled", to=TensorProto.FLOAT)
    for i, (w, b) in enumerate(zip(weights, biases)):
        x = node("MatMul", [x, constant(f"{own}W{i}", w)], f"{own}product{i}")
        x = node("Add", [x, constant(f"{own}b{i}", b)], f"{own}input{i}")
        if i < len(weights) - 1:
            x = node("Sigmoid", [x], f"{own}hidden{i}")
    node("Softmax", [x], PROBABILITIES, axis=1)
    index = node("ArgMax", [PROBABILITIES], own + "class_index", axis=1, keepdims=0)
    n_classes = weights[-1].shape[1]
    if classes is None:
        node("Identity", [index], LABEL)
        label_type = TensorProto.INT64
    else:
        values = np.asarray(classes)
        text = values.dtype.kind in "UO"
        node("Gather", [constant(own + "classes", values.astype(object) if text else values.astype(np.int64)),
                        index], LABEL, axis=0)
        label_type = TensorProto.STRING if text else TensorProto.INT64
    outputs = [helper.make_tensor_value_info(LABEL, label_type, ["N"]),
               helper.make_tensor_value_info(PROBABILITIES, TensorProto.FLOAT, ["N", n_classes])]
    graph = helper.make_graph(nodes, "dbn", graph_inputs, outputs, constants)
    exported = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="dbn-yarn",
                                 producer_version=__version__)
    exported.ir_version = min(exported.ir_version, 9)  # what ONNX Runtime 1.16+ reads
    metadata = {"columns": json.dumps(list(columns) if columns is not None else None),
                "classes": json.dumps(None if classes is None else np.asarray(classes).tolist()),
                "scaler": "none" if scaler is None else scaler.kind, "layers": json.dumps(
                    [n_features, *(w.shape[1] for w in weights)])}
    onnx.helper.set_model_props(exported, metadata)
    try:
        onnx.checker.check_model(exported)
    except onnx.checker.ValidationError as exc:
        raise ModelFileError(f"the ONNX graph of {_naming(columns, str(exc))} is not valid: {exc}") from None
    _check_loads(exported, columns)
    return exported


def input_names(columns, n_features: int) -> list[str] | None:
    """The graph's inputs where each of ``columns`` gives one feature and can be an input by its
    name (:func:`can_be_input`): the columns' names; else None (one input ``features``)."""
    if columns is None or len(columns) != n_features or not all(can_be_input(name) for name in columns):
        return None
    return list(columns)


def can_be_input(name) -> bool:
    """Whether ``name`` can name an input of its own: text UTF-8 carries (as ONNX stores names),
    not empty, and not the name of an output (users read ``label`` and ``probabilities``)."""
    if not isinstance(name, str) or not name or name in OUTPUTS:
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, e.g. from a pandas column name
        return False
    return True


def internal_prefix(inputs: list[str]) -> str:
    """The start of the names of the graph's own values: ``dbn/``, or the first of ``dbn1/``,
    ``dbn2/``... that no input name starts with, so no input can take the place of one of them."""
    prefix, n = f"{PREFIX}/", 0
    while any(name.startswith(prefix) for name in inputs):
        n += 1
        prefix = f"{PREFIX}{n}/"
    return prefix


def _check_loads(exported, columns) -> None:
    """Refuse a graph ONNX Runtime would not load, where ONNX Runtime is installed (it is not
    needed to export), naming the columns: :class:`ModelFileError`."""
    try:
        import onnxruntime
    except ImportError:
        return
    try:
        onnxruntime.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's errors share no base class but Exception
        raise ModelFileError(f"ONNX Runtime does not load the ONNX graph of {_naming(columns, str(exc))}: "
                             f"{exc}") from None


def _naming(columns, message: str, most: int = 8) -> str:
    """The columns an error is about, for its message: those ``message`` names, else all of them
    (the first ``most``); the input ``features`` where the model knows no columns."""
    if not columns:
        return f"the model's input {FEATURES!r}"
    named = [name for name in columns if name in message] or list(columns)
    more = f" and {len(named) - most} more" if len(named) > most else ""
    return f"the model's column{'s' if len(named) > 1 else ''} {', '.join(map(repr, named[:most]))}{more}"


def export_onnx(model, uri: str, *, overwrite: bool = False) -> dict:
    """Write ``model`` (:func:`to_onnx`) to ``uri`` (a path or an ``hdfs://``, ``s3://`` URI), whole
    or not at all; a file already there is refused unless ``overwrite``. Returns what it holds."""
    from iterreduce.storage.filesystems import open_output_file  # pyarrow's file systems: only to write

    exported = to_onnx(model)
    with open_output_file(uri, overwrite=overwrite) as stream:
        stream.write(exported.SerializeToString())
    return {"out": str(uri), "inputs": [i.name for i in exported.graph.input],
            "outputs": [o.name for o in exported.graph.output], "opset": OPSET}
