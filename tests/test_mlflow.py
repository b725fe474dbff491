"""`dbn export --format mlflow` (issue 41, part 2): MLflow's own loader gives DBN.predict's labels
from a pandas DataFrame read by column name; the signature, an input example and our pinned
environment are saved; no pickle."""

from __future__ import annotations

import pytest

mlflow = pytest.importorskip("mlflow")
pd = pytest.importorskip("pandas")

from dbn import DBN, __version__  # noqa: E402
from dbn.cli import main  # noqa: E402
from test_onnx import scaled_table, table_job  # noqa: E402


def test_an_mlflow_model_predicts_what_the_dbn_does_by_column_name(tmp_path, capsys):
    root, columns = scaled_table(tmp_path, seed=1)
    assert main(["train", str(table_job(tmp_path, root, '["m *"]')), "--quiet"]) == 0
    out = tmp_path / "mlflow-model"
    assert main(["export", str(tmp_path / "out" / "model.npz"), "--format", "mlflow", "--out", str(out)]) == 0

    served = mlflow.pyfunc.load_model(str(out))
    frame = pd.DataFrame({name: columns[name] for name in reversed(columns)})  # another order
    model = DBN.load(tmp_path / "out" / "model.npz", device="cpu")
    assert list(served.predict(frame)) == list(model.predict(frame))
    assert set(served.predict(frame)) <= {"cat", "dog", "eel"}
    assert [c.name for c in served.metadata.get_input_schema().inputs] == ["m 0", "m 1", "m 2", "m 3"]
    assert (out / "input_example.json").is_file() and not list(out.rglob("*.pkl"))
    assert f"dbn-yarn=={__version__}" in (out / "requirements.txt").read_text()
    assert "loader_module: dbn.model.mlflow_flavor" in (out / "MLmodel").read_text()

    capsys.readouterr()
    assert main(["export", str(tmp_path / "out" / "model.npz"), "--format", "mlflow", "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_a_model_of_a_vector_column_keeps_its_widths_and_saves_an_example_of_lists(tmp_path):
    """A table with a Spark ML vector column (6 features) and four numbers: the trained model
    keeps the features each column gives, the MLflow model saves a signature and an input example
    with a list in the vector's column, and predicts from rows given that way."""
    import numpy as np

    from test_table_jobs import VECTOR_WIDTH, job_file, write_animals

    rows = write_animals(tmp_path / "animals")
    assert main(["train", str(job_file(tmp_path, tmp_path / "animals", 0, test=False)), "--quiet"]) == 0
    model_file = next(tmp_path.rglob("model.npz"))
    model = DBN.load(model_file, device="cpu")
    assert model.input_columns_ == ("vec", "x0", "x1", "x2", "x3") and model.input_widths_ == (VECTOR_WIDTH, 1, 1, 1, 1)

    out = tmp_path / "mlflow-model"
    assert main(["export", str(model_file), "--format", "mlflow", "--out", str(out)]) == 0
    served = mlflow.pyfunc.load_model(str(out))
    assert [c.name for c in served.metadata.get_input_schema().inputs] == ["vec", "x0", "x1", "x2", "x3"]
    example = served.input_example
    assert len(example["vec"][0]) == VECTOR_WIDTH and np.isscalar(example["x0"][0])
    X = rows["train"][0][:20]
    frame = pd.DataFrame({"x3": X[:, VECTOR_WIDTH + 3], "vec": [list(r) for r in X[:, :VECTOR_WIDTH].astype(float)],
                          **{f"x{j}": X[:, VECTOR_WIDTH + j] for j in range(3)}})
    assert list(served.predict(frame)) == list(model.predict(frame))
    assert list(served.predict(example)) == list(model.predict(example))
