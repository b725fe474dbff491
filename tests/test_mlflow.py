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
