"""Tables by name in a real Hive metastore (issue 55, parts 1 and 2).

Hive's standalone metastore 4.0.1 on Derby (tests/metastore.py), its warehouse on the session's
HDFS; Spark with Hive support writes and registers the tables as users' jobs do. A partitioned
table has one partition dropped from the metastore but left on disk and one added from a folder
outside the table's location: a job naming the table trains on exactly the rows Spark SQL counts
in it, in one process, on the local mini-cluster and on YARN. An ORC table and an Iceberg table
registered in the metastore train in place by name too.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("hive_metastore")

from dbn.cli import main  # noqa: E402
from iterreduce.exceptions import ShardError, TableError  # noqa: E402
from shardio import metastore as hms  # noqa: E402
from test_spark_tables import LABELS, MODEL  # noqa: E402  (enough training for a test error to mean something)

pytestmark = pytest.mark.spark

SCALARS = ["x0", "x1", "x2", "x3"]


# ------------------------------------------------------------------ without a server


@pytest.mark.parametrize("value, expected", [
    ("sales.events", ("sales", "events")), ("db_1.t_2", ("db_1", "t_2")),
    ("train.parquet", None), ("data.csv", None), ("mnist", None), ("hdfs://nn/warehouse/t", None),
    ("/data/sales.events", None), ("a.b.c", None), ("1db.t", None)])
def test_a_name_is_a_metastore_table_only_in_the_form_db_table(value, expected):
    assert hms.table_name(value) == expected


def test_a_file_of_that_name_is_a_file_not_a_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sales.events").write_text("x")
    assert hms.table_name("sales.events") is None
    assert hms.table_name("sales.orders", base=tmp_path) == ("sales", "orders")
    (tmp_path / "sales.orders").mkdir()
    assert hms.table_name("sales.orders", base=tmp_path) is None


def test_the_metastore_comes_from_the_setting_else_hive_site(tmp_path, monkeypatch):
    monkeypatch.delenv("HIVE_CONF_DIR", raising=False)
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path / "none"))
    with pytest.raises(TableError, match=r"sales\.events: names a table in a Hive metastore.*\[data\] metastore"):
        hms.metastore_uri(None, "sales.events")
    with pytest.raises(TableError, match="expected thrift://HOST:PORT"):
        hms.metastore_uri("http://host:9083", "sales.events")
    (tmp_path / "hive").mkdir()
    (tmp_path / "hive" / "hive-site.xml").write_text(
        "<configuration><property><name>hive.metastore.uris</name>"
        "<value>thrift://ms1:9083,thrift://ms2:9083</value></property></configuration>")
    monkeypatch.setenv("HIVE_CONF_DIR", str(tmp_path / "hive"))
    assert hms.metastore_uri(None, "sales.events") == "thrift://ms1:9083"
    assert hms.metastore_uri("thrift://mine:9083", "sales.events") == "thrift://mine:9083"


def test_partition_values_take_the_columns_types_and_hives_null():
    table = hms.MetastoreTable("s.t", "thrift://h:1", "parquet", "/t",
                               (("day", pa.int32()), ("country", pa.string())), ())
    expression = hms.partition_expression(table, hms.Partition(("7", None), "/t/x"))
    assert ds.get_partition_keys(expression) == {"day": 7, "country": None}
    with pytest.raises(ShardError, match=r"s\.t: partition /t/y: day = 'seven' is not a int32"):
        hms.partition_expression(table, hms.Partition(("seven", "NL"), "/t/y"))
    with pytest.raises(ShardError, match="has 1 values for 2 partition columns"):
        hms.partition_expression(table, hms.Partition(("7",), "/t/z"))


def test_an_unreachable_metastore_is_a_clear_error_at_once(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens there once closed
    with pytest.raises(TableError, match=rf"metastore thrift://127.0.0.1:{port}: cannot connect"):
        hms.lookup(f"thrift://127.0.0.1:{port}", "sales.events")


# ------------------------------------------------------------------ a real metastore


@pytest.fixture(scope="module")
def metastore(hadoop, tmp_path_factory):
    from metastore import HiveMetastore
    from yarnjobs import started

    with started(HiveMetastore(hadoop, tmp_path_factory.mktemp("metastore")), "the Hive metastore") as server:
        yield server


@pytest.fixture(scope="module")
def spark(metastore, hadoop):
    from sparktables import start_hive_spark, stop_spark

    session = start_hive_spark(metastore.uri, metastore.warehouse, hadoop.uri("/warehouse/iceberg"))
    yield session
    stop_spark(session)


def animals(spark, n: int, seed: int, days=(1, 2, 3)):
    """``n`` rows: four features around a centre per label, a string ``label``, ``split`` and ``day``."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(LABELS), n)
    X = np.random.default_rng(99).normal(0, 2.0, (len(LABELS), len(SCALARS)))[y] + rng.normal(0, 1.0, (n, len(SCALARS)))
    rows = [(*map(float, X[i]), LABELS[y[i]], "test" if i % 5 == 0 else "train", int(days[i % len(days)]))
            for i in range(n)]
    return spark.createDataFrame(rows, [*SCALARS, "label", "split", "day"])


def count(spark, sql: str) -> int:
    return spark.sql(sql).collect()[0][0]


@pytest.fixture(scope="module")
def events(spark, hadoop):
    """``sales.events``: Parquet partitioned by ``day`` (1, 2, 3) as Spark's ``saveAsTable`` writes
    it; day 2 then dropped from the metastore, its folder left; day 9 added from a folder outside
    the table's location. Returns the table's location and Spark SQL's count of its rows."""
    spark.sql("CREATE DATABASE IF NOT EXISTS sales")
    animals(spark, 600, 0).write.mode("overwrite").format("parquet").partitionBy("day").saveAsTable("sales.events")
    location = spark.sql("DESCRIBE FORMATTED sales.events").where("col_name = 'Location'").collect()[0][1]
    spark.sql("ALTER TABLE sales.events SET TBLPROPERTIES ('external.table.purge' = 'false')")  # drop keeps files
    spark.sql("ALTER TABLE sales.events DROP PARTITION (day = 2)")
    outside = hadoop.uri("/elsewhere/events-day-9")
    animals(spark, 150, 1, days=(9,)).drop("day").write.mode("overwrite").parquet(outside)
    spark.sql(f"ALTER TABLE sales.events ADD PARTITION (day = 9) LOCATION '{outside}'")
    return location, count(spark, "SELECT COUNT(*) FROM sales.events")


def job(tmp_path: Path, metastore, train: str, *, test: str | None = None, extra_data: str = "",
        output: str | None = None, extra: str = "") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f"""
[data]
train = "{train}"
{f'test = "{test}"' if test else ''}
metastore = "{metastore.uri}"
features = {json.dumps(SCALARS)}
label = "label"
{extra_data}
[model]
{MODEL}
[output]
dir = "{output or tmp_path / 'out'}"
[job]
seed = 1
device = "cpu"
{extra}
""")
    return path


def trained(tmp_path: Path, path: Path, *args: str) -> dict:
    assert main(["train", str(path), "--quiet", "--no-ui", *args]) == 0
    return json.loads((tmp_path / "out" / "result.json").read_text())


def test_the_scenario_differs_from_the_folder(events, hadoop, spark):
    """The table is not its folder: a dropped partition's files stay there, an added one is elsewhere."""
    location, rows = events
    folders = hadoop.fs().get_file_info(pafs.FileSelector(urlparse(location).path))
    assert "day=2" in {info.base_name for info in folders}
    on_disk = count(spark, f"SELECT COUNT(*) FROM parquet.`{location}`")
    assert rows == on_disk - count(spark, f"SELECT COUNT(*) FROM parquet.`{location}/day=2`") + 150
    assert rows != on_disk


@pytest.mark.parametrize("workers", [0, 2], ids=["one-process", "local-2"])
def test_a_table_by_name_trains_on_exactly_its_registered_partitions(tmp_path, metastore, events, spark, workers):
    _, rows = events
    train_rows = count(spark, "SELECT COUNT(*) FROM sales.events WHERE split = 'train'")
    path = job(tmp_path, metastore, "sales.events", test="sales.events",
               extra_data="filter = \"split == 'train'\"\ntest_filter = \"split == 'test'\"")
    result = trained(tmp_path, path, *(["--local", str(workers)] if workers else []))
    assert result["n_train"] == train_rows
    assert result["n_train"] + result["n_test"] == rows
    assert result["test_error"] < 0.2


def test_an_orc_table_by_name_trains_in_place(tmp_path, metastore, spark):
    spark.sql("CREATE DATABASE IF NOT EXISTS sales")
    animals(spark, 300, 2).write.mode("overwrite").format("orc").saveAsTable("sales.events_orc")
    result = trained(tmp_path, job(tmp_path, metastore, "sales.events_orc"))
    assert result["n_train"] == count(spark, "SELECT COUNT(*) FROM sales.events_orc") == 300


def test_an_iceberg_table_registered_in_the_metastore_trains_its_current_snapshot(tmp_path, metastore, spark, hadoop):
    """Spark writes an Iceberg table and deletes from it; the table is registered in the metastore as
    Iceberg's Hive catalog registers one (``table_type``, ``metadata_location``), through the Thrift API."""
    from hive_metastore.ttypes import (Database, FieldSchema, NoSuchObjectException, SerDeInfo, StorageDescriptor,
                                       Table)

    animals(spark, 400, 3).writeTo("ice.db.animals").using("iceberg").createOrReplace()
    spark.sql("DELETE FROM ice.db.animals WHERE day = 3")
    rows = count(spark, "SELECT COUNT(*) FROM ice.db.animals")
    metadata = spark.sql("SELECT file FROM ice.db.animals.metadata_log_entries ORDER BY timestamp DESC LIMIT 1"
                         ).collect()[0][0]
    with metastore.client() as client:
        try:
            client.get_database("lake")
        except NoSuchObjectException:
            client.create_database(Database(name="lake", locationUri=hadoop.uri("/warehouse/hive/lake.db")))
        location = metadata.rsplit("/metadata/", 1)[0]
        client.create_table(Table(
            tableName="animals", dbName="lake", tableType="EXTERNAL_TABLE",
            parameters={"EXTERNAL": "TRUE", "table_type": "ICEBERG", "metadata_location": metadata},
            sd=StorageDescriptor(cols=[FieldSchema(name=c, type="double") for c in SCALARS], location=location,
                                 inputFormat="org.apache.hadoop.mapred.FileInputFormat",
                                 outputFormat="org.apache.hadoop.mapred.FileOutputFormat",
                                 serdeInfo=SerDeInfo(serializationLib="org.apache.hadoop.hive.serde2.lazy.LazySimpleSerDe"))))
    result = trained(tmp_path, job(tmp_path, metastore, "lake.animals"))
    assert result["n_train"] == rows < 400
    fixed = json.loads((tmp_path / "out" / "config.json").read_text())
    assert fixed["data"]["train"] == "lake.animals"  # the job as asked; the run read the metadata file of then


def test_a_missing_table_is_named_with_its_metastore(tmp_path, metastore, capsys):
    path = job(tmp_path, metastore, "sales.nothing_here")
    assert main(["train", str(path), "--quiet", "--no-ui"]) != 0
    err = capsys.readouterr().err
    assert f"sales.nothing_here: no such table in the metastore {metastore.uri}" in err
    assert not (tmp_path / "out").exists()


def test_a_table_by_name_trains_on_its_registered_partitions_on_yarn(tmp_path, metastore, events, yarn):
    """The client asks the metastore and cuts the shares (each piece names its file and partition
    values); the containers read the files, with no metastore of their own."""
    from dbn.jobs.run import Yarn, run
    from dbn.jobs.spec import load_spec

    _, rows = events
    output = yarn.hadoop.uri("/user/test/metastore-job")
    path = job(tmp_path, metastore, "sales.events", output=output,
               extra=f'[cluster]\nworkers = 2\nheartbeat_timeout = 6.0\n[yarn]\npython = "{sys.executable}"\n'
                     'worker_memory = "512 MiB"\nworker_vcores = 1\nmaster_memory = "1 GiB"\n')
    result = run(load_spec(str(path)), Yarn(str(tmp_path / "report"), log=lambda msg: None, poll=1.0))
    assert result["n_train"] == rows


def test_a_kerberos_secured_metastore_is_refused_with_what_to_do(tmp_path, monkeypatch):
    (tmp_path / "hive-site.xml").write_text(
        "<configuration><property><name>hive.metastore.sasl.enabled</name><value>true</value></property>"
        "<property><name>hive.metastore.uris</name><value>thrift://ms:9083</value></property></configuration>")
    monkeypatch.setenv("HIVE_CONF_DIR", str(tmp_path))
    with pytest.raises(TableError, match="a Kerberos-secured metastore.*name the table by its location"):
        hms.metastore_uri(None, "sales.events")


@pytest.mark.parametrize("kind, parameters, message", [
    ("VIRTUAL_VIEW", {}, "a view in the metastore"),
    ("MANAGED_TABLE", {"transactional": "true"}, "a Hive ACID"),
    ("EXTERNAL_TABLE", {}, "stored as org.apache.hadoop.mapred.TextInputFormat")])
def test_tables_that_are_not_read_are_refused_naming_them(kind, parameters, message):
    from hive_metastore.ttypes import SerDeInfo, StorageDescriptor, Table

    table = Table(tableName="t", dbName="s", tableType=kind, parameters=parameters,
                  sd=StorageDescriptor(location="hdfs://nn/t", inputFormat="org.apache.hadoop.mapred.TextInputFormat",
                                       serdeInfo=SerDeInfo(serializationLib="LazySimpleSerDe", parameters={})))
    with pytest.raises(TableError, match=rf"s\.t: {message}"):
        hms.described("thrift://h:1", "s.t", table, [])


def _table(keys=(("day", "string"),), serde=True):
    from hive_metastore.ttypes import FieldSchema, SerDeInfo, StorageDescriptor, Table

    return Table(tableName="t", dbName="s", tableType="EXTERNAL_TABLE", parameters={},
                 partitionKeys=[FieldSchema(name=n, type=t) for n, t in keys],
                 sd=StorageDescriptor(location="hdfs://nn/t", inputFormat="org.apache.hadoop.hive.ql.io.parquet."
                                      "MapredParquetInputFormat",
                                      serdeInfo=SerDeInfo(serializationLib="ParquetHiveSerDe") if serde else None))


def _partition(values, location="hdfs://nn/t/day=1"):
    from hive_metastore.ttypes import Partition, StorageDescriptor

    return Partition(values=values, sd=None if location is None else StorageDescriptor(location=location))


@pytest.mark.parametrize("partition, what", [
    (lambda: _partition(None), "without its 1 values"), (lambda: _partition(["1", "2"]), "without its 1 values"),
    (lambda: _partition(["1"], location=None), "without a location"), (lambda: _partition([None]), "without its 1"),
])
def test_a_reply_with_an_unset_field_is_a_clear_error_naming_the_partition(partition, what):
    """Issue 64, class 5: a partition with `sd` or `values` unset was a traceback (exit 1)."""
    with pytest.raises(TableError, match=rf"s\.t: the metastore thrift://h:1 lists its partition 1 {what}"):
        hms.described("thrift://h:1", "s.t", _table(), [_partition(["0"], "hdfs://nn/t/day=0"), partition()])


def test_unset_optional_fields_of_a_table_are_read_as_their_defaults():
    table = hms.described("thrift://h:1", "s.t", _table(keys=(("day", None),), serde=False), [_partition(["1"])])
    assert table.partition_columns == (("day", pa.string()),) and table.format == "parquet"


def test_a_partition_listed_five_times_is_read_once_and_two_on_one_folder_each():
    """The same partition listed five times trained 1,000 rows from 200; two partitions (by their
    values) registered on one folder are two, as Spark reads them."""
    same = [_partition(["1"]) for _ in range(5)]
    table = hms.described("thrift://h:1", "s.t", _table(), [*same, _partition(["2"], "hdfs://nn/t/day=1")])
    assert [(p.values, p.location) for p in table.partitions] == [(("1",), "hdfs://nn/t/day=1"),
                                                                  (("2",), "hdfs://nn/t/day=1")]


def test_a_relative_partition_location_is_refused_before_reading(monkeypatch):
    """A relative location `../../x` resolved against this process's folder."""
    table = hms.described("thrift://h:1", "s.t", _table(), [_partition(["1"], "../../x")])
    monkeypatch.setattr(hms, "lookup", lambda *args, **kwargs: table)
    monkeypatch.setattr(hms, "split_reference", lambda reference: ("thrift://h:1", "s.t"))
    with pytest.raises(ShardError, match="is not an absolute location"):
        hms.RegisteredTable("thrift://h:1#s.t", "parquet").dataset("hdfs://nn/t")
