"""`dbn export --format onnx` (issue 41, part 1): ONNX Runtime gives DBN.predict's labels and
predict_proba's probabilities (within 1e-5) from raw rows: the MNIST test set, and tables with
string labels, scaled features and their columns in another order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from dbn import DBN  # noqa: E402
from dbn.cli import main  # noqa: E402
from dbn.data.mnist import load_mnist  # noqa: E402
from dbn.model.onnx_export import to_onnx  # noqa: E402
from test_table_jobs import write_animals  # noqa: E402

TOLERANCE = 1e-5


def session(model: DBN):
    return ort.InferenceSession(to_onnx(model).SerializeToString(), providers=["CPUExecutionProvider"])


def table_job(tmp_path: Path, root: Path, features: str, extra: str = "") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f"""
[data]
train = "{root}"
features = {features}
label = "animal"
{extra}
[model]
hidden_layers = [16, 8]
pretrain_epochs = 2
finetune_epochs = 6
pretrain_batch_size = 20
finetune_batch_size = 20
[output]
dir = "{tmp_path / 'out'}"
[job]
seed = 2
device = "cpu"
""")
    return path


def scaled_table(tmp_path: Path, seed: int) -> tuple[Path, dict]:
    """A table of four scalar columns ``m 0``..``m 3`` on scales 1 to 1,000 and a string label
    ``animal``; returns its folder and the columns."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, 600)
    columns = {f"m {i}": rng.normal(0, 1, 600) * 10 ** i + 3 * y for i in range(4)}
    root = tmp_path / "table"
    root.mkdir()
    pq.write_table(pa.table({**columns, "animal": np.array(["cat", "dog", "eel"])[y]}), root / "part-0.parquet")
    return root, columns


def test_mnist_test_set_through_onnx_runtime(tmp_path):
    data = load_mnist()
    model = DBN(hidden_layers=[64], pretrain_epochs=1, finetune_epochs=2, seed=0, device="cpu")
    model.fit(data.x_train[:3000] / np.float32(255), data.y_train[:3000])
    X = data.x_test / np.float32(255)
    label, probabilities = session(model).run(None, {"features": X})
    assert np.abs(probabilities - model.predict_proba(X)).max() <= TOLERANCE
    assert np.array_equal(label, model.predict(X)) and label.dtype == np.int64 and len(label) == 10_000


def test_a_table_with_string_labels_and_scaled_columns_one_input_a_column(tmp_path, capsys):
    """Scalar columns on scales far from [0, 1] (min-max scaled in the graph), string labels: each
    column is an input by name, so rows whose columns come in another order feed it as they are."""
    root, columns = scaled_table(tmp_path, seed=0)
    assert main(["train", str(table_job(tmp_path, root, '["m *"]')), "--quiet"]) == 0
    model = DBN.load(tmp_path / "out" / "model.npz", device="cpu")
    assert model.input_scaler_ is not None and list(model.input_columns_) == ["m 0", "m 1", "m 2", "m 3"]

    out = tmp_path / "model.onnx"
    assert main(["export", str(tmp_path / "out" / "model.npz"), "--out", str(out)]) == 0
    assert "inputs m 0, m 1, m 2, m 3" in capsys.readouterr().out
    reordered = pa.table({name: columns[name] for name in reversed(columns)})  # another order, beyond the range too
    reordered = reordered.set_column(0, "m 3", pa.array(reordered.column("m 3").to_numpy() * 1.5))
    feeds = {name: reordered.column(name).to_numpy().astype(np.float32).reshape(-1, 1) for name in reordered.column_names}
    label, probabilities = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.abs(probabilities - model.predict_proba(reordered)).max() <= TOLERANCE
    assert list(label) == list(model.predict(reordered)) and set(label) <= {"cat", "dog", "eel"}


def test_a_table_with_a_vector_column_takes_one_input_of_all_features(tmp_path):
    root = tmp_path / "animals"
    rows = write_animals(root)
    assert main(["train", str(table_job(tmp_path, root, '["x3", "vec", "x0", "x1", "x2"]',
                                        'filter = "split == \'train\'"')), "--quiet"]) == 0
    model = DBN.load(tmp_path / "out" / "model.npz", device="cpu")
    stored = rows["test"][0]  # the vector's values, then x0..x3
    width = stored.shape[1] - 4
    X = stored[:, [width + 3, *range(width), width, width + 1, width + 2]]  # the job's order: x3, vec, x0..x2
    label, probabilities = session(model).run(None, {"features": X.astype(np.float32)})
    assert np.abs(probabilities - model.predict_proba(X)).max() <= TOLERANCE
    assert list(label) == list(model.predict(X))


def test_an_existing_file_is_refused_and_a_pre_trained_stack_has_nothing_to_export(tmp_path, capsys):
    X = (np.random.default_rng(0).random((200, 6)) < 0.5).astype(np.float32)
    stack = DBN(hidden_layers=[4], pretrain_epochs=1, finetune_epochs=0, device="cpu").fit(X)
    stack.save(tmp_path / "stack.npz")
    assert main(["export", str(tmp_path / "stack.npz"), "--out", str(tmp_path / "s.onnx")]) == 2
    assert "pre-trained only" in capsys.readouterr().err and not (tmp_path / "s.onnx").exists()

    model = DBN(hidden_layers=[4], pretrain_epochs=1, finetune_epochs=1, device="cpu").fit(X, np.arange(200) % 2)
    model.save(tmp_path / "m.npz")
    (tmp_path / "m.onnx").write_bytes(b"mine")
    assert main(["export", str(tmp_path / "m.npz"), "--out", str(tmp_path / "m.onnx")]) == 2
    assert (tmp_path / "m.onnx").read_bytes() == b"mine"
    assert main(["export", str(tmp_path / "m.npz"), "--out", str(tmp_path / "m.onnx"), "--overwrite"]) == 0
    assert ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, {"features": X})[0].tolist() == \
        model.predict(X).tolist()
