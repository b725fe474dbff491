"""The same job on the older Hadoops that users' clusters run (:data:`minihadoop.OLDER_VERSIONS`:
3.3.6 as on EMR 6.x and Dataproc 2.1/2.2, 3.4.x as on EMR 7.x), beside the suite's 3.5.0.

Each version is a two-node cluster of its own (each node a DataNode and a NodeManager on an address of
its own), whose jars run everything Hadoop in the job: the daemons, skein's driver and application
master, and the tools the job calls (``hdfs fsck`` for locality, ``yarn node`` for the decommission
look, ``dtutil`` for tokens). One job a version shows it all: workers next to their shards, the live
page through YARN's web proxy, a node drained mid-job and left by its worker, SUCCEEDED, and the
model of an undisturbed run on this machine.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from urllib.parse import urlparse

import numpy as np
import pytest

from dbn import DBN
from dbn.cli import main
from iterreduce.launch.yarn import client as yarn_client
from minihadoop import OLDER_VERSIONS, MiniHadoop, ensure_jars
from shardio.shards import write_shards
from yarnjobs import KEEP_CLUSTERS, N_FEATURES, job_file, labelled_rows, shared_driver, started

pytestmark = [pytest.mark.multinode, pytest.mark.yarn, pytest.mark.hdfs,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module", params=OLDER_VERSIONS)
def cluster(request, tmp_path_factory):
    """A two-node Hadoop of one of the older versions. Its NameNode hands out delegation tokens
    without Kerberos (``dfs.namenode.delegation.token.always-use``), so that the token fetch a job
    with a keytab does runs on an insecure cluster too."""
    version = request.param
    with started(MiniHadoop(nodes=2, gpus=0, memory_mb=3072, version=version, keep=KEEP_CLUSTERS,
                            base_dir=tmp_path_factory.mktemp(f"hadoop-{version}"),
                            conf={"dfs.namenode.delegation.token.always-use": "true"}),
                 f"Hadoop {version}") as hadoop:
        yield hadoop


@pytest.fixture(scope="module")
def yarn(cluster, tmp_path_factory):
    with shared_driver(cluster, tmp_path_factory.mktemp("skein")) as yarn:
        yield yarn


#: Long enough for a drained worker's slot to move to the other node while the job trains.
EPOCHS, FINETUNE = 40, 20


def dbn(capsys, *args) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().out


def test_the_cluster_runs_the_version_it_was_asked_for(yarn):
    version = subprocess.run(["java", *yarn.hadoop._java_options(), "-cp", f"{ensure_jars(yarn.hadoop.version)}/*",
                              "org.apache.hadoop.util.VersionInfo"], capture_output=True, text=True, timeout=60)
    assert f"Hadoop {yarn.hadoop.version}" in version.stdout, version.stdout + version.stderr
    nodes = {n.id.split(":")[0] for n in yarn.client.get_nodes()}
    assert nodes == set(yarn.hadoop.node_hosts) == {"127.0.0.2", "127.0.0.3"}


def test_a_job_runs_by_its_data_shows_its_page_leaves_a_draining_node_and_trains_the_undisturbed_model(
        yarn, tmp_path, capsys):
    hadoop = yarn.hadoop
    X, y = labelled_rows()
    shards = hadoop.uri("/data/shards")
    write_shards(X, y, shards, 2)
    output = hadoop.uri("/user/test/job")
    path = job_file(tmp_path, output, workers=2, epochs=EPOCHS, finetune=FINETUNE,
                    extra=f'python = "{sys.executable}"\nlocality_wait = 5\ndecommission_check = 2',
                    cluster_extra=f'shards = "{shards}"')
    code, out = dbn(capsys, "submit", path, "--quiet")
    assert code == 0, out
    app_id = out.strip()
    yarn.wait_step(app_id, 1)

    # Locality and the live page, as `dbn status` shows them.
    code, out = dbn(capsys, "status", app_id)
    assert code == 0 and "% of its data there)" in out, out
    page = next(line.split()[-1] for line in out.splitlines() if "live view:" in line)
    assert page.startswith(f"http://{hadoop.rm_web}/proxy/{app_id}/"), page
    with urllib.request.urlopen(page, timeout=60) as response:  # through YARN's web proxy
        assert response.status == 200 and "<title>Training job</title>" in response.read().decode()

    # The decommission look: the node without the application master drained, its worker leaves it.
    am_host = yarn.report(app_id).host
    on = {w["name"]: w["host"] for w in yarn_client.status(yarn.client, app_id).workers}
    host = next(h for h in hadoop.node_hosts if h != am_host)
    leaving = sorted(name for name in on if on[name] == host)
    k = hadoop.node_hosts.index(host)
    started_at = time.monotonic()
    try:
        hadoop.decommission(k, timeout_s=600)
        while [c for c in yarn.containers(app_id, states=["RUNNING"]) if c.yarn_node_http_address.startswith(host)]:
            report = yarn.report(app_id)
            assert str(report.state) == "RUNNING", f"{app_id} {report.state} before its workers left {host}"
            assert time.monotonic() - started_at < 120, f"the job's workers still on {host} after 120 s"
            time.sleep(1)
        print(f"Hadoop {hadoop.version}: {leaving} left the draining {host} in {time.monotonic() - started_at:.1f} s")
    finally:
        hadoop.recommission(k)
    report = yarn.wait(app_id, timeout=300)
    yarn.assert_succeeded(report, app_id)

    records = yarn.hdfs_json_lines(urlparse(output).path + "/log.jsonl")
    first = {}
    for r in records:
        if r.get("event") == "worker_registered":
            first.setdefault(r["worker"].split("#")[0], r)
    assert sorted(first) == ["worker-0", "worker-1"] and all(r["local"] == 1.0 for r in first.values()), first
    why = f"its node {host} is being decommissioned"
    assert leaving and sorted((r["worker"].split("#")[0], r["reason"]) for r in records
                              if r.get("event") == "worker_retired") == [(name, why) for name in leaving]
    assert not [r for r in records if r.get("event") in ("container_lost", "worker_lost")]

    local = tmp_path / "undisturbed"
    local_path = job_file(tmp_path, str(local), workers=2, epochs=EPOCHS, finetune=FINETUNE,
                          cluster_extra=f'shards = "{shards}"')
    assert main(["train", local_path, "--local", "2", "--quiet", "--no-ui"]) == 0
    with hadoop.fs().open_input_stream(urlparse(output).path + "/model.npz") as f:
        (tmp_path / "yarn-model.npz").write_bytes(f.read())
    drained, undisturbed = DBN.load(tmp_path / "yarn-model.npz"), DBN.load(local / "model.npz")
    assert np.array_equal(drained.predict_proba(X), undisturbed.predict_proba(X))


@pytest.fixture(scope="module", params=OLDER_VERSIONS)
def secure_cluster(request, tmp_path_factory):
    """A Kerberos-secured single-node Hadoop of one of the older versions (:class:`securehadoop.SecureHadoop`)."""
    from securehadoop import SecureHadoop

    version = request.param
    with started(SecureHadoop(version=version, realm_name="OLDER", keep=KEEP_CLUSTERS,
                              base_dir=tmp_path_factory.mktemp(f"securehadoop-{version}")),
                 f"the Kerberos-secured Hadoop {version}") as hadoop:
        yield hadoop


def test_a_job_submitted_with_a_keytab_fetches_its_tokens_with_this_versions_tools(secure_cluster, tmp_path, capsys,
                                                                                   monkeypatch):
    """`dbn submit --principal --keytab` without a ticket: the application master obtains the job's HDFS
    tokens with the keytab (this version's dtutil), hands them to the workers, asks the secured
    ResourceManager for nodes being decommissioned, and the job ends SUCCEEDED."""
    from iterreduce.launch.yarn.skein_import import skein
    from iterreduce.storage.filesystems import KEYTAB_LOGIN_VARS
    from yarnjobs import Yarn

    cluster = secure_cluster
    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KRB5CCNAME", f"FILE:{tmp_path / 'no-ticket'}")  # the keytab alone
    monkeypatch.delenv("ITERREDUCE_SKEIN_DRIVER", raising=False)  # a driver of its own, logged in from the keytab
    skein.Security.new_credentials().to_directory(str(tmp_path / "skein"))
    monkeypatch.setenv("SKEIN_CONFIG", str(tmp_path / "skein"))
    for var in KEYTAB_LOGIN_VARS:  # `dbn submit --keytab` logs this process's HDFS access in: undone afterwards
        monkeypatch.setenv(var, "")
    output = cluster.uri(f"/user/{cluster.principal.split('@')[0]}/keytab-job")
    path = job_file(tmp_path, output, epochs=4, finetune=2,
                    extra=f'python = "{sys.executable}"\ndecommission_check = 1')
    code, out = dbn(capsys, "submit", path, "--quiet", "--principal", cluster.principal,
                    "--keytab", str(cluster.user_keytab))
    assert code == 0, out
    app_id = out.strip()
    # The test's own credentials, named: skein's default is ~/.skein, made there when missing.
    with skein.Client(principal=cluster.principal, keytab=str(cluster.user_keytab),
                      security=skein.Security.from_directory(str(tmp_path / "skein"))) as client:
        yarn = Yarn(cluster, client)
        report = yarn.wait(app_id)
        yarn.assert_succeeded(report, app_id)
        logs = yarn.node_logs(app_id, tail=10**6)
    for text in (f"new HDFS delegation tokens (set 1) for {cluster.url}", "using the master's HDFS delegation tokens",
                 "nodes being decommissioned: none (a look every 1 s)"):
        assert text in logs, text
