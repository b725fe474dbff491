"""A trained classifier as an ONNX graph: raw rows in, the table's labels and their probabilities out.

The whole inference path of :meth:`~dbn.model.estimator.DBN.predict` is in the graph: the saved
feature scaler (in float64, then rounded to float32, as :class:`~iterreduce.scaling.Scaler`
does), the sigmoid layers, the softmax, and the label classes (strings or integers) as a
constant the most probable class indexes. Where the model knows its columns and each gives one
feature, each column is an input of its own, by name ([N, 1]); otherwise one input ``features``
([N, n_features]) takes them in the model's order (the metadata ``columns`` names them). The
batch dimension is free. ONNX Runtime serves the file in Python, Java, C++ and Triton.
"""

from __future__ import annotations

import json

import numpy as np

from .. import __version__
from ..exceptions import ModelFileError

#: The opset the graph is written for (ONNX Runtime 1.16 and later run it).
OPSET = 17
LABEL, PROBABILITIES, FEATURES = "label", "probabilities", "features"


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

    per_column = columns is not None and len(columns) == n_features
    if per_column:
        graph_inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", 1]) for name in columns]
        x = node("Concat", list(columns), "rows", axis=1)
    else:
        graph_inputs = [helper.make_tensor_value_info(FEATURES, TensorProto.FLOAT, ["N", n_features])]
        x = FEATURES
    if scaler is not None:  # (x - offset) * scale in float64, clipped to [0, 1] for min-max, rounded once
        x = node("Cast", [x], "rows64", to=TensorProto.DOUBLE)
        x = node("Sub", [x, constant("scaler_offset", np.asarray(scaler.offset, np.float64))], "centred")
        x = node("Mul", [x, constant("scaler_scale", np.asarray(scaler.scale, np.float64))], "scaled64")
        if scaler.kind == "min_max":
            x = node("Clip", [x, constant("zero", np.array(0.0)), constant("one", np.array(1.0))], "clipped")
        x = node("Cast", [x], "scaled", to=TensorProto.FLOAT)
    for i, (w, b) in enumerate(zip(weights, biases)):
        x = node("MatMul", [x, constant(f"W{i}", w)], f"product{i}")
        x = node("Add", [x, constant(f"b{i}", b)], f"input{i}")
        if i < len(weights) - 1:
            x = node("Sigmoid", [x], f"hidden{i}")
    node("Softmax", [x], PROBABILITIES, axis=1)
    index = node("ArgMax", [PROBABILITIES], "class_index", axis=1, keepdims=0)
    n_classes = weights[-1].shape[1]
    if classes is None:
        node("Identity", [index], LABEL)
        label_type = TensorProto.INT64
    else:
        values = np.asarray(classes)
        text = values.dtype.kind in "UO"
        node("Gather", [constant("classes", values.astype(object) if text else values.astype(np.int64)), index],
             LABEL, axis=0)
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
    onnx.checker.check_model(exported)
    return exported


def export_onnx(model, uri: str, *, overwrite: bool = False) -> dict:
    """Write ``model`` (:func:`to_onnx`) to ``uri`` (a path or an ``hdfs://``, ``s3://`` URI), whole
    or not at all; a file already there is refused unless ``overwrite``. Returns what it holds."""
    from iterreduce.filesystems import open_output_file

    exported = to_onnx(model)
    with open_output_file(uri, overwrite=overwrite) as stream:
        stream.write(exported.SerializeToString())
    return {"out": str(uri), "inputs": [i.name for i in exported.graph.input],
            "outputs": [o.name for o in exported.graph.output], "opset": OPSET}
