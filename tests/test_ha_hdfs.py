"""Jobs on a highly available HDFS, as every production HDFS is: a name service (``hdfs://nameservice1``)
of two NameNodes, one active and one standby (tests/minihadoop.py with ``name_service``), whose
active NameNode fails over while a job runs: it steps down, the standby takes over, and the old
active is stopped (:meth:`minihadoop.MiniHadoop.fail_over`).

Every client of the job finds the NameNodes in the cluster's configuration (``dfs.ha.namenodes``):
the submitting machine, skein's driver and the NodeManagers (Hadoop's Java client), the containers
(hdfs-native), and the tools the job runs (``hdfs fsck``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbn import DBN
from dbn.cli import main
from iterreduce.launch.yarn import client as yarn_client
from iterreduce.storage import hadoopconf
from yarnjobs import KEEP_CLUSTERS, N_FEATURES, job_file, labelled_rows, shared_driver, started

pytestmark = [pytest.mark.yarn, pytest.mark.hdfs, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SERVICE = "nameservice1"


def ha_hadoop(base_dir):
    """A single-node Hadoop whose HDFS is the name service :data:`SERVICE`; its NameNodes hand out
    delegation tokens without Kerberos (``dfs.namenode.delegation.token.always-use``), to show
    what they are named."""
    from minihadoop import MiniHadoop

    return started(MiniHadoop(name_service=SERVICE, gpus=0, memory_mb=4096, keep=KEEP_CLUSTERS, base_dir=base_dir,
                              conf={"dfs.namenode.delegation.token.always-use": "true"}),
                   "the Hadoop with a highly available HDFS")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The module's cluster (its NameNodes fail over once: the YARN job's)."""
    with ha_hadoop(tmp_path_factory.mktemp("ha-hdfs")) as hadoop:
        yield hadoop


@pytest.fixture
def own_cluster(tmp_path_factory):
    """A cluster of the test's own, whose NameNodes fail over once."""
    with ha_hadoop(tmp_path_factory.mktemp("ha-hdfs-own")) as hadoop:
        yield hadoop


@pytest.fixture(scope="module")
def yarn(cluster, tmp_path_factory):
    with shared_driver(cluster, tmp_path_factory.mktemp("skein")) as yarn:
        yield yarn


def model_at(cluster, uri: str, local: Path) -> DBN:
    with cluster.fs().open_input_stream(urlparse(uri).path) as f:
        local.write_bytes(f.read())
    return DBN.load(local)


def test_the_file_system_is_a_name_service_of_two_namenodes(yarn):
    hadoop = yarn.hadoop
    assert hadoop.url == f"hdfs://{SERVICE}" and hadoop.uri("/a") == f"hdfs://{SERVICE}/a"
    assert hadoopconf.get("dfs.ha.namenodes." + SERVICE) == "nn1,nn2"  # the client's configuration
    assert hadoopconf.namenode_address(SERVICE, None) == (SERVICE, None)  # hdfs-native resolves it itself
    states = [hadoop.run("hdfs", "haadmin", "-getServiceState", nn) for nn in ("nn1", "nn2")]
    assert [s.stdout.strip() for s in states] in (["active", "standby"], ["standby", "active"]), states


def test_a_yarn_job_survives_a_failover_mid_job_with_the_model_of_an_undisturbed_run(yarn, tmp_path, capsys):
    """`dbn shard` writes the shards through the name service, a `dbn submit` job trains on them and
    writes its checkpoints, log and model there; at superstep 2 the active NameNode fails over (and
    the old one is stopped). The job ends SUCCEEDED, asked YARN for the name service's delegation
    tokens (its file systems), and its model is bit-identical to an undisturbed `--local 2` run's."""
    hadoop = yarn.hadoop
    X, y = labelled_rows()
    np.savez(tmp_path / "rows.npz", X=X, y=y)
    shards, output = hadoop.uri("/data/shards"), hadoop.uri("/user/test/failover")
    assert main(["shard", str(tmp_path / "rows.npz"), shards, "--shards", "2"]) == 0
    path = job_file(tmp_path, output, workers=2, epochs=30, finetune=10,
                    extra=f'python = "{sys.executable}"', cluster_extra=f'shards = "{shards}"')
    capsys.readouterr()
    assert main(["submit", path, "--quiet"]) == 0
    app_id = capsys.readouterr().out.strip()
    yarn.wait_step(app_id, 2)
    spec = yarn_client.application(yarn.client, app_id).get_specification()
    assert spec.file_systems == [f"hdfs://{SERVICE}"]  # skein gets their tokens (ha-hdfs:nameservice1)
    hadoop.fail_over()
    assert str(yarn.report(app_id).state) == "RUNNING"  # mid-job
    report = yarn.wait(app_id, timeout=300)
    yarn.assert_succeeded(report, app_id)
    records = yarn.hdfs_json_lines(urlparse(output).path + "/log.jsonl")
    assert records[-1]["event"] == "done", records[-3:]

    local = tmp_path / "undisturbed"
    local_path = job_file(tmp_path, str(local), workers=2, epochs=30, finetune=10, cluster_extra=f'shards = "{shards}"')
    assert main(["train", local_path, "--local", "2", "--quiet", "--no-ui"]) == 0
    failed_over, undisturbed = model_at(hadoop, output + "/model.npz", tmp_path / "yarn.npz"), DBN.load(local / "model.npz")
    assert np.array_equal(failed_over.predict_proba(X), undisturbed.predict_proba(X))


def write_table(fs, folder: str, X, y, files=3) -> None:
    """A plain Parquet table of ``files`` files."""
    for i, part in enumerate(np.array_split(np.arange(len(y)), files)):
        columns = {f"f{j}": X[part, j] for j in range(N_FEATURES)} | {"label": y[part]}
        pq.write_table(pa.table(columns), f"{folder}/part-{i:05d}.parquet", filesystem=fs)


def test_a_local_job_reads_a_table_in_place_through_a_failover(own_cluster, tmp_path, monkeypatch):
    """A `--local 2` job (its own processes, hdfs-native in each) trains on a table read in place from the
    name service and tests on another there; the active NameNode fails over while it trains (the
    stopped NameNode is the first the configuration names). The job ends well, its test figures
    read after the failover, with the model of an undisturbed run."""
    hadoop = own_cluster
    for key, value in hadoop.env().items():  # this process a client of the cluster too (the undisturbed run)
        monkeypatch.setenv(key, value)
    fs = hadoop.fs()
    X, y = labelled_rows(seed=1)
    write_table(fs, "/tables/train", X, y)
    write_table(fs, "/tables/test", *labelled_rows(rows=150, seed=2), files=1)
    features = ", ".join(f'"f{j}"' for j in range(N_FEATURES))

    def job(out: Path) -> str:
        path = Path(job_file(tmp_path, str(out), workers=2, epochs=60, finetune=20))
        text = path.read_text()
        table = (f'train = "{hadoop.uri("/tables/train")}"\ntest = "{hadoop.uri("/tables/test")}"\n'
                 f'features = [{features}]\nlabel = "label"\n')
        path.write_text(text[:text.index("[data]")] + "[data]\n" + table + text[text.index("[model]"):])
        return str(path)

    failed_over = tmp_path / "failed-over"
    command = [sys.executable, "-m", "dbn.cli", "train", job(failed_over), "--local", "2", "--quiet", "--no-ui"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((failed_over / "checkpoints").glob("ckpt-*")):  # training, its data read
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint in 120 s"
        time.sleep(0.2)
    hadoop.fail_over()
    mid_run = proc.poll() is None
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    print(f"failed over {'while the job trained' if mid_run else 'after the job had ended'}")
    assert mid_run
    undisturbed = tmp_path / "undisturbed"
    assert main(["train", job(undisturbed), "--local", "2", "--quiet", "--no-ui"]) == 0
    figures = [{k: v for k, v in json.loads((out / "result.json").read_text()).items() if k in ("test_error", "n_test")}
               for out in (failed_over, undisturbed)]
    assert figures[0]["n_test"] == 150 and figures[0] == figures[1], figures
    assert np.array_equal(DBN.load(failed_over / "model.npz").predict_proba(X),
                          DBN.load(undisturbed / "model.npz").predict_proba(X))


def test_the_name_services_delegation_token_is_named_by_the_service(yarn, tmp_path):
    """What a secured cluster hands a job for ``hdfs://nameservice1`` (Hadoop's own ``hdfs fetchdt``):
    one token, whose service is ``ha-hdfs:nameservice1``, not a NameNode's address; hdfs-native,
    given the service's name (:func:`hadoopconf.namenode_address`), looks tokens up under it."""
    hadoop = yarn.hadoop
    done = hadoop.run("hdfs", "fetchdt", "--renewer", "me", str(tmp_path / "token"))
    assert done.returncode == 0, done.stderr[-2000:]
    from minihadoop import ensure_jars

    printed = subprocess.run(["java", "-cp", f"{hadoop.conf_dir}:{ensure_jars()}/*",
                              "org.apache.hadoop.security.token.DtUtilShell", "print", str(tmp_path / "token")],
                             capture_output=True, text=True, timeout=120)
    rows = [line.split() for line in printed.stdout.splitlines() if line.startswith("HDFS_DELEGATION_TOKEN")]
    assert [row[1] for row in rows] == [f"ha-hdfs:{SERVICE}"], printed.stdout + printed.stderr
