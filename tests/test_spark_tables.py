"""Tables written by Apache Spark itself, trained on in place (issue 39, part 5).

Spark in local mode (tests/sparktables.py) writes what users' jobs write: a Parquet and an ORC
table partitioned by ``split`` and ``day`` with a ``VectorAssembler`` column and a string label;
a Delta Lake table whose DELETE and UPDATE leave deletion vectors; an Iceberg table whose
merge-on-read DELETE and UPDATE leave positional delete files. Each trains on exactly the rows
Spark reads as the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyspark")

from dbn import DBN  # noqa: E402
from dbn.cli import main  # noqa: E402
from minihadoop import ToolMissing  # noqa: E402
from sparktables import start_spark  # noqa: E402
from test_delta import job as delta_job  # noqa: E402

pytestmark = pytest.mark.spark

LABELS = ("cat", "dog", "eel")
SCALARS = ["x0", "x1", "x2", "x3", "x4"]


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    try:
        session = start_spark(tmp_path_factory.mktemp("warehouse"))
    except ToolMissing as missing:
        pytest.skip(str(missing))
    yield session
    session.stop()


def animals(spark, n: int = 600, seed: int = 0):
    """A DataFrame of ``n`` rows: ``id``, five features around a centre per label, ``label``,
    ``split`` (train or test) and ``day``."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(LABELS), n)
    X = rng.normal(0, 1.5, (len(LABELS), len(SCALARS)))[y] + rng.normal(0, 1.0, (n, len(SCALARS)))
    rows = [(i, *map(float, X[i]), LABELS[y[i]], "test" if i % 4 == 0 else "train", int(1 + i % 3))
            for i in range(n)]
    return spark.createDataFrame(rows, ["id", *SCALARS, "label", "split", "day"])


#: Enough training for a test error to mean something.
MODEL = """hidden_layers = [16]
pretrain_epochs = 2
finetune_epochs = 8
pretrain_batch_size = 20
finetune_batch_size = 20
finetune_learning_rate = 0.3
"""


def job(tmp_path: Path, uri, fmt: str, features, data: str = "") -> Path:
    return delta_job(tmp_path, uri, data, fmt=fmt, features=features, model=MODEL)


def train(tmp_path: Path, uri, fmt: str, features, data: str = "", workers: int = 2) -> tuple[dict, DBN]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    args = ["train", str(job(tmp_path, uri, fmt, features, data)), "--quiet", "--no-ui"]
    assert main(args + (["--local", str(workers)] if workers else [])) == 0
    out = tmp_path / "out"
    return json.loads((out / "result.json").read_text()), DBN.load(out / "model.npz", device="cpu")


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_a_spark_table_with_an_assembled_vector_trains_in_place(tmp_path, spark, fmt):
    from pyspark.ml.feature import VectorAssembler

    table = tmp_path / f"animals-{fmt}"
    rows = VectorAssembler(inputCols=SCALARS[:4], outputCol="vec").transform(animals(spark))
    rows.drop(*SCALARS[:4]).write.partitionBy("split", "day").format(fmt).save(str(table))
    assert (table / "_SUCCESS").is_file() and (table / "split=train" / "day=1").is_dir()
    result, model = train(tmp_path / "run", table, fmt, ["vec", "x4"],
                          f"filter = \"split == 'train'\"\ntest = \"{table}\"\ntest_filter = \"split == 'test'\"")
    written = spark.read.format(fmt).load(str(table))
    assert result["n_train"] == written.filter("split = 'train'").count() == 450
    assert result["n_test"] == 150 and result["test_error"] < 0.2
    assert list(model.classes_) == list(LABELS)


def test_a_delta_table_with_deletion_vectors_trains_on_exactly_its_rows(tmp_path, spark):
    table = tmp_path / "delta"
    (animals(spark).write.format("delta").option("delta.enableDeletionVectors", "true").partitionBy("day")
     .save(str(table)))
    spark.sql(f"DELETE FROM delta.`{table}` WHERE label = 'dog' AND x4 > 0")
    spark.sql(f"UPDATE delta.`{table}` SET label = 'fox' WHERE x0 > 1.5")
    assert list(table.glob("deletion_vector_*.bin"))  # the rows are marked, not rewritten
    now = spark.read.format("delta").load(str(table))
    result, model = train(tmp_path / "now", table, "delta", SCALARS)
    assert result["n_train"] == now.count() < 600
    assert list(model.classes_) == sorted(r.label for r in now.select("label").distinct().collect())
    first, model = train(tmp_path / "first", table, "delta", SCALARS, "version = 0", workers=0)  # in one process
    assert first["n_train"] == 600 and list(model.classes_) == list(LABELS)


def test_an_iceberg_table_with_positional_delete_files_trains_on_exactly_its_rows(tmp_path, spark):
    spark.sql("CREATE TABLE ice.db.animals (id bigint, x0 double, x1 double, x2 double, x3 double, x4 double, "
              "label string, split string, day int) USING iceberg PARTITIONED BY (day) TBLPROPERTIES "
              "('format-version' = '2', 'write.delete.mode' = 'merge-on-read', 'write.update.mode' = 'merge-on-read')")
    animals(spark).writeTo("ice.db.animals").append()
    first = spark.sql("SELECT snapshot_id FROM ice.db.animals.snapshots ORDER BY committed_at").first()[0]
    spark.sql("DELETE FROM ice.db.animals WHERE label = 'dog' AND x4 > 0")
    spark.sql("UPDATE ice.db.animals SET label = 'fox' WHERE x0 > 1.5")
    folder = Path(spark.conf.get("spark.sql.catalog.ice.warehouse")) / "db" / "animals"
    assert list((folder / "data").rglob("*-deletes.parquet"))  # merge-on-read: delete files, not rewrites
    now = spark.table("ice.db.animals")
    result, model = train(tmp_path / "now", folder, "iceberg", SCALARS)
    assert result["n_train"] == now.count() < 600
    assert list(model.classes_) == sorted(r.label for r in now.select("label").distinct().collect())
    then, model = train(tmp_path / "first", folder, "iceberg", SCALARS, f"version = {first}", workers=0)
    assert then["n_train"] == 600 and list(model.classes_) == list(LABELS)


def test_an_iceberg_table_of_orc_files_is_refused_naming_a_file(tmp_path, spark, capsys):
    spark.sql("CREATE TABLE ice.db.orc_animals (id bigint, x0 double, label string) USING iceberg "
              "TBLPROPERTIES ('write.format.default' = 'orc')")
    animals(spark).select("id", "x0", "label").writeTo("ice.db.orc_animals").append()
    folder = Path(spark.conf.get("spark.sql.catalog.ice.warehouse")) / "db" / "orc_animals"
    path = job(tmp_path, folder, "iceberg", ["x0"])
    assert main(["train", str(path), "--quiet", "--no-ui"]) == 2
    err = capsys.readouterr().err
    assert ".orc is ORC: this reader reads Apache Iceberg tables of Parquet files" in err
    assert not (tmp_path / "out").exists()


def test_an_mlflow_export_scores_a_spark_dataframe_as_a_udf(tmp_path, spark):
    """docs/serving.md's Spark recipe (issue 41, part 4): the exported model as mlflow's Spark UDF
    gives each row the label DBN.predict gives it."""
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("scipy")
    table = tmp_path / "animals"
    animals(spark).write.parquet(str(table))
    result, model = train(tmp_path / "run", table, "parquet", SCALARS, workers=0)
    out = tmp_path / "mlflow-model"
    assert main(["export", str(tmp_path / "run" / "out" / "model.npz"), "--format", "mlflow", "--out", str(out)]) == 0

    predict = mlflow.pyfunc.spark_udf(spark, str(out), result_type="string")
    rows = spark.read.parquet(str(table))
    scored = rows.withColumn("prediction", predict(*SCALARS)).select("id", *SCALARS, "prediction").toPandas()
    assert len(scored) == 600
    assert list(scored["prediction"]) == list(model.predict(scored[SCALARS]))
