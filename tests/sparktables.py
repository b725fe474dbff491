"""Apache Spark in local mode, as the tests' writer of tables: plain Parquet and ORC, Delta Lake
and Apache Iceberg, written the way users' Spark jobs write them.

``pyspark`` (the test extra) runs on the Java 17 already needed for Hadoop; the table formats'
jars (``tests/spark/pom.xml``) are fetched once by Maven into the cache beside Hadoop's. One
session per test run, one core, no UI: what Spark costs the suite is said in
``benchmarks/RESULTS.md`` ("Test suite").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from minihadoop import cache_dir, fetch_jars

POM = Path(__file__).resolve().parent / "spark" / "pom.xml"


def spark_jars() -> list[str]:
    """The Iceberg and Delta jars for Spark, fetched by Maven on first use."""
    folder = fetch_jars(POM, cache_dir().parent / "spark-table-formats" / "jars")
    return sorted(str(p) for p in folder.glob("*.jar"))


def _spawned(popen):
    """pyspark's ``Popen`` without its ``preexec_fn`` (which only ignores SIGINT in the JVM): with a
    preexec function Python forks and runs Python code before exec, and in the suite's process,
    full of threads (gRPC, hdfs-native), the child deadlocked on a lock another thread held at the
    fork. Without one, the JVM starts by a plain fork and exec, in a session of its own."""
    def spawn(*args, **kwargs):
        kwargs.pop("preexec_fn", None)
        return popen(*args, start_new_session=True, **kwargs)
    return spawn


def start_spark(warehouse: Path):
    """A local Spark session that writes Delta tables by path and Iceberg tables in the Hadoop
    catalog ``ice`` under ``warehouse``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyspark.java_gateway
    from pyspark.sql import SparkSession

    if not getattr(pyspark.java_gateway.Popen, "spawned", False):
        pyspark.java_gateway.Popen = _spawned(pyspark.java_gateway.Popen)
        pyspark.java_gateway.Popen.spawned = True

    return (SparkSession.builder.master("local[1]").appName("dbn-yarn-tests")
            .config("spark.jars", ",".join(spark_jars()))
            .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension,"
                                            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
            .config("spark.sql.catalog.ice", "org.apache.iceberg.spark.SparkCatalog")
            .config("spark.sql.catalog.ice.type", "hadoop")
            .config("spark.sql.catalog.ice.warehouse", str(warehouse))
            .config("spark.sql.warehouse.dir", str(warehouse / "spark-warehouse"))  # not the working folder
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.default.parallelism", "1")
            .config("spark.databricks.delta.snapshotPartitions", "1")
            .config("spark.driver.memory", "1g")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate())


#: The Hive client Spark speaks to a Hive 4 metastore with (its built-in 2.3 client calls Thrift
#: methods Hive 4 removed); Spark fetches its jars from Maven Central into Ivy's cache once.
HIVE_CLIENT_VERSION = "4.0.1"


def start_hive_spark(metastore_uri: str, warehouse: str, iceberg_warehouse: str):
    """A local Spark session whose catalog is the Hive metastore at ``metastore_uri`` (tables by
    name, ``saveAsTable`` registering them, partitions added and dropped as users do), managed
    tables under ``warehouse``, and Iceberg tables by path in the Hadoop catalog ``ice`` under
    ``iceberg_warehouse``. Stop it with :func:`stop_spark`: the next session starts afresh."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyspark.java_gateway
    from pyspark.sql import SparkSession

    if not getattr(pyspark.java_gateway.Popen, "spawned", False):
        pyspark.java_gateway.Popen = _spawned(pyspark.java_gateway.Popen)
        pyspark.java_gateway.Popen.spawned = True
    iceberg = [jar for jar in spark_jars() if "iceberg" in Path(jar).name]
    return (SparkSession.builder.master("local[1]").appName("dbn-yarn-tests-hive")
            .config("spark.jars", ",".join(iceberg))
            .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
            .config("spark.sql.catalogImplementation", "hive")
            .config("spark.sql.hive.metastore.version", HIVE_CLIENT_VERSION)
            .config("spark.sql.hive.metastore.jars", "maven")
            .config("spark.hadoop.hive.metastore.uris", metastore_uri)
            .config("spark.sql.warehouse.dir", warehouse)
            .config("spark.sql.catalog.ice", "org.apache.iceberg.spark.SparkCatalog")
            .config("spark.sql.catalog.ice.type", "hadoop")
            .config("spark.sql.catalog.ice.warehouse", iceberg_warehouse)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "1")
            .config("spark.default.parallelism", "1")
            .config("spark.driver.memory", "1g")
            .config("spark.sql.session.timeZone", "UTC")
            .enableHiveSupport()
            .getOrCreate())


def stop_spark(session) -> None:
    """Stop ``session`` and its JVM, so that a later session starts with its own settings and jars."""
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is not None:
        gateway.shutdown()
        proc = getattr(gateway, "proc", None)
        if proc is not None:
            proc.stdin.close()  # the JVM's PythonGatewayServer exits at end-of-file
            proc.wait(timeout=60)
        SparkContext._gateway = SparkContext._jvm = None
