"""`dbn predict` and `dbn transform` write what --out names: Parquet, or CSV for a .csv name.

Found trying our own data (scikit-learn's digits as CSV, 2026-11-25): `--out pred.csv`
wrote Parquet bytes into a file called pred.csv. Now the name picks the format, the two
formats hold the same values, and a name of another format is refused before anything is
written.
"""

from __future__ import annotations

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from dbn.cli import main
from dbn.data.sharding import output_format
from test_cli import job  # noqa: F401 - the fixture: a tiny job on a generated .npz
from test_table_jobs import animals, train  # noqa: F401 - the fixture, and a trained table job


@pytest.fixture(scope="module")
def trained(tmp_path_factory, animals):  # noqa: F811
    root, rows = animals
    tmp = tmp_path_factory.mktemp("formats")
    train(tmp, root, 0)
    return tmp / "out" / "model.npz", tmp / "job.toml", rows


def write(capsys, trained, command, out, *flags) -> int:
    model, job, _ = trained
    code = main([command, str(model), str(job), "--out", str(out), "--device", "cpu", *flags])
    capsys.readouterr()
    return code


@pytest.mark.parametrize("name", ["predictions.csv", "PREDICTIONS.CSV"])
def test_predictions_to_csv_hold_the_values_of_the_parquet_file(tmp_path, capsys, trained, name):
    assert write(capsys, trained, "predict", tmp_path / "p.parquet", "--keep", "id") == 0
    assert write(capsys, trained, "predict", tmp_path / name, "--keep", "id") == 0
    assert (tmp_path / name).read_bytes()[:4] != b"PAR1"
    parquet, csv = pq.read_table(tmp_path / "p.parquet"), pacsv.read_csv(tmp_path / name)
    assert csv.column_names == parquet.column_names == ["id", "prediction", "probability"]
    assert csv.column("prediction").to_pylist() == parquet.column("prediction").to_pylist()
    assert csv.column("id").to_pylist() == parquet.column("id").to_pylist()
    np.testing.assert_allclose(csv.column("probability").to_numpy(), parquet.column("probability").to_numpy(),
                               rtol=1e-6)


def test_features_to_csv_are_one_column_each(tmp_path, capsys, trained):
    assert write(capsys, trained, "transform", tmp_path / "f.parquet") == 0
    assert write(capsys, trained, "transform", tmp_path / "f.csv") == 0
    features = np.array(pq.read_table(tmp_path / "f.parquet").column("features").to_pylist(), dtype=np.float32)
    csv = pacsv.read_csv(tmp_path / "f.csv")
    assert csv.column_names == [f"features_{j}" for j in range(features.shape[1])]
    np.testing.assert_allclose(np.column_stack([c.to_numpy() for c in csv.columns]), features, rtol=1e-6)


def test_a_data_file_predicts_to_csv_too(tmp_path, capsys, job):  # noqa: F811 - test_cli's job on a .npz
    config, out = job
    assert main(["train", str(config), "--out", str(out), "--quiet"]) == 0
    assert main(["predict", str(out / "model.npz"), str(config), "--out", str(tmp_path / "p.csv")]) == 0
    table = pacsv.read_csv(tmp_path / "p.csv")
    assert table.column_names == ["row", "prediction", "probability"]
    assert table.column("row").to_pylist() == list(range(table.num_rows)) and table.num_rows > 0


@pytest.mark.parametrize("name", ["p.json", "p.tsv", "p.npz", "p.csv.gz"])
@pytest.mark.parametrize("command", ["predict", "transform"])
def test_an_output_named_as_another_format_is_refused_and_nothing_written(tmp_path, capsys, trained, name, command):
    model, job, _ = trained
    assert main([command, str(model), str(job), "--out", str(tmp_path / name), "--device", "cpu"]) == 2
    assert f"not as .{name.rsplit('.', 1)[-1]}" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("out,fmt", [("a.csv", "csv"), ("hdfs://nn/x/a.CSV", "csv"), ("a.parquet", "parquet"),
                                     ("hdfs://nn/out/part-0", "parquet"), ("a.pq", "parquet"), ("run.v2", "parquet")])
def test_the_format_follows_the_name(out, fmt):
    assert output_format(out) == fmt
