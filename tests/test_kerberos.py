"""The Kerberos-secured test Hadoop (tests/securehadoop.py) is secured: its NameNode, ResourceManager
and web pages refuse whoever has no ticket, and take the project's own clients (hdfs-native through
iterreduce, skein's driver) that have one."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from iterreduce.launch.yarn.skein_import import skein

from dbn.cli import main

pytestmark = pytest.mark.kerberos


#: What hdfs-native loads at run time for Kerberos (MIT's GSSAPI; Debian's libgssapi-krb5-2).
GSSAPI_LIBRARY = "libgssapi_krb5.so.2"


@pytest.fixture(scope="session")
def gssapi():
    """Skips where MIT Kerberos's GSSAPI library, which hdfs-native needs for Kerberos, is not installed."""
    import ctypes

    try:
        ctypes.CDLL(GSSAPI_LIBRARY)
    except OSError:
        pytest.skip(f"{GSSAPI_LIBRARY} is not installed (Debian: apt-get install libgssapi-krb5-2; bootstrap.sh "
                    "installs it): hdfs-native loads it at run time to speak Kerberos")


@pytest.fixture
def client_env(secure_hadoop, monkeypatch):
    """This process's environment set for the secured cluster (its ticket cache, KRB5_CONFIG,
    HADOOP_CONF_DIR), as a user's shell after ``kinit`` has it."""
    for key, value in secure_hadoop.env().items():
        monkeypatch.setenv(key, value)
    return secure_hadoop


def no_ticket(tmp_path: Path) -> str:
    """A ``KRB5CCNAME`` that names an empty ticket cache: a user who never ran ``kinit``."""
    return f"FILE:{tmp_path / 'no-ticket'}"


def audit(cluster, needle: str) -> list[str]:
    """The NameNode's audit lines (all in the cluster's log) that contain ``needle``."""
    return [line for line in cluster.log_file.read_text(errors="replace").splitlines()
            if "FSNamesystem.audit" in line and needle in line]


@pytest.mark.hdfs
def test_the_namenode_refuses_a_client_without_a_ticket(gssapi, client_env, tmp_path, monkeypatch):
    from hdfs_native import Client

    monkeypatch.setenv("KRB5CCNAME", no_ticket(tmp_path))
    with pytest.raises(RuntimeError, match="GSS_S_NO_CRED"):  # hdfs-native, MIT's GSSAPI: no credentials
        Client(client_env.url).get_file_info("/user")
    listing = subprocess.run([str(client_env.bin_dir / "hdfs"), "dfs", "-ls", "/user"], capture_output=True,
                             text=True, timeout=120, env=os.environ.copy())  # Hadoop's own Java client
    assert listing.returncode != 0
    assert "Client cannot authenticate via:[TOKEN, KERBEROS]" in listing.stderr, listing.stderr[-2000:]


@pytest.mark.hdfs
def test_with_a_ticket_hdfs_is_read_and_written_as_the_project_does_it(gssapi, client_env):
    """iterreduce's file system (hdfs-native, no JVM): Kerberos on RPC, SASL with privacy (encryption)
    on the DataNode's block transfers, as the client configuration in HADOOP_CONF_DIR asks."""
    from iterreduce.storage.filesystems import filesystem

    uri = client_env.uri(f"/user/{client_env.principal.split('@')[0]}/kerberos/blob.bin")
    payload = os.urandom(3 * 1024 * 1024 + 17)  # several packets
    fs, path = filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0])
    with fs.open_output_stream(path) as out:
        out.write(payload)
    with fs.open_input_stream(path) as f:
        assert f.read() == payload
    # The NameNode saw the user's own principal, authenticated by Kerberos (not a simple user name).
    assert audit(client_env, f"ugi={client_env.principal} (auth:KERBEROS)\tip=/127.0.0.1\tcmd=create\tsrc={path}")


@pytest.mark.hdfs
def test_hdfs_native_takes_a_ticket_from_java_and_a_keytab(gssapi, client_env, tmp_path, monkeypatch):
    """Without MIT's kinit the harness gets the ticket from Java (Kerby's client): MIT's library reads
    that cache. And hdfs-native logs in from a keytab itself (``kerberos_principal``/``kerberos_keytab``)."""
    from hdfs_native import Client

    ccache = tmp_path / "java-ticket"
    client_env.kinit(ccache=ccache, java=True)
    principal = client_env.principal
    assert Client(client_env.url, kerberos_principal=principal, kerberos_cache=str(ccache)).get_file_info("/user").isdir
    monkeypatch.setenv("KRB5CCNAME", no_ticket(tmp_path))
    keytab = Client(client_env.url, kerberos_principal=principal, kerberos_keytab=str(client_env.keytab))
    assert keytab.get_file_info("/user").isdir


@pytest.mark.hdfs
def test_hdfs_takes_a_short_lived_delegation_token_without_a_ticket(gssapi, client_env, tmp_path, monkeypatch):
    """What a container has: a token file (HADOOP_TOKEN_FILE_LOCATION) and no ticket. The token lives
    TOKEN_MAX_LIFETIME_S. hdfs-native picks the token whose service is the URL's host:port as written:
    Hadoop names the service by IP (hadoop.security.token.service.use_ip, true by default)."""
    from hdfs_native import Client
    from securehadoop import SERVICE, TOKEN_MAX_LIFETIME_S

    tokens = tmp_path / "tokens"
    renewer = SERVICE.split("/")[0]  # the ResourceManager's short name: YARN renews the tokens of its jobs
    fetched = client_env.run("hdfs", "fetchdt", "--renewer", renewer, str(tokens))
    assert fetched.returncode == 0 and tokens.is_file(), fetched.stderr[-2000:]
    created = [line for line in client_env.log_file.read_text(errors="replace").splitlines()
               if "Creating password for identifier" in line and "HDFS_DELEGATION_TOKEN" in line]
    issued, expires = (int(re.search(rf"{key}=(\d+)", created[-1]).group(1)) for key in ("issueDate", "maxDate"))
    assert expires - issued == TOKEN_MAX_LIFETIME_S * 1000
    monkeypatch.setenv("KRB5CCNAME", no_ticket(tmp_path))
    monkeypatch.setenv("HADOOP_TOKEN_FILE_LOCATION", str(tokens))
    port = client_env.url.rsplit(":", 1)[1]
    client = Client(f"hdfs://127.0.0.1:{port}")
    path = f"/user/{client_env.principal.split('@')[0]}/kerberos/token.bin"
    with client.create(path) as out:
        out.write(b"t" * 100_000)
    with client.read(path) as f:
        assert f.read() == b"t" * 100_000
    assert audit(client_env, f"ugi={client_env.principal} (auth:TOKEN)\tip=/127.0.0.1\tcmd=create\tsrc={path}")


def test_the_web_pages_want_spnego(secure_hadoop):
    for address, page in [(secure_hadoop.nn_http, "/jmx"), (secure_hadoop.rm_web, "/ws/v1/cluster/info")]:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://{address}{page}", timeout=60)
        assert refused.value.code == 401, (address, page)
        assert refused.value.headers.get("WWW-Authenticate") == "Negotiate", (address, page)


@pytest.mark.yarn
def test_the_resourcemanager_refuses_skein_without_a_ticket_and_runs_its_application_with_one(
        client_env, tmp_path, monkeypatch):
    """skein's driver (Hadoop's Java client) without a ticket is refused; with one, an application runs,
    its container holding delegation tokens (HADOOP_TOKEN_FILE_LOCATION) and no ticket."""
    security = skein.Security.new_credentials()
    with monkeypatch.context() as m:
        m.setenv("KRB5CCNAME", no_ticket(tmp_path))
        with skein.Client(security=security) as refused, \
                pytest.raises(skein.exceptions.DriverError, match="Kerberos ticket not found"):
            refused.get_applications()
    script = 'test -s "$HADOOP_TOKEN_FILE_LOCATION" && test -z "$KRB5CCNAME" && echo tokens-only'
    spec = skein.ApplicationSpec(name="kerberos-hello", max_attempts=1, master=skein.Master(
        resources=skein.Resources(memory="256 MiB", vcores=1), script=script))
    with skein.Client(security=security) as client:
        app_id = client.submit(spec)
        deadline = time.monotonic() + 180
        while str((report := client.application_report(app_id)).final_status) == "UNDEFINED":
            assert time.monotonic() < deadline, report.diagnostics
            time.sleep(0.5)
        assert str(report.final_status) == "SUCCEEDED", report.diagnostics
        assert any(app.id == app_id for app in client.get_applications(states=["FINISHED"]))
    logs = list(client_env.dir.glob(f"cluster/**/{app_id}/*/application.driver.log"))
    assert logs and logs[0].read_text().strip() == "tokens-only"


# ------------------------------------------------------------------ a client set up otherwise than the cluster


def client_conf(cluster, tmp_path: Path, authentication: str) -> Path:
    """A copy of ``cluster``'s client configuration that says ``hadoop.security.authentication=authentication``."""
    import shutil

    conf = tmp_path / f"conf-{authentication}"
    shutil.copytree(cluster.conf_dir, conf)
    for site in conf.glob("*-site.xml"):
        text = re.sub(r"(<name>hadoop\.security\.authentication</name>\s*<value>)\w+(</value>)",
                      rf"\g<1>{authentication}\g<2>", site.read_text())
        if "hadoop.security.authentication" not in text:
            text = text.replace("</configuration>", "<property><name>hadoop.security.authentication</name>"
                                f"<value>{authentication}</value></property></configuration>")
        site.write_text(text)
    return conf


def one_error(capsys, *argv) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("dbn: error: ") and err.count("\n") == 1, (code, err[-3000:])
    return err


@pytest.mark.yarn
@pytest.mark.hdfs
def test_a_client_configured_without_kerberos_is_told_that_the_cluster_wants_it(gssapi, client_env, tmp_path,
                                                                                monkeypatch, capsys):
    """HADOOP_CONF_DIR saying ``simple`` (another cluster's, or a laptop's): the ResourceManager refuses
    skein's driver and the NameNode hangs up on hdfs-native; each command says which setting to fix
    (skein alone would say "Unknown ApplicationId", hdfs-native "RPC listener disconnected")."""
    monkeypatch.setenv("HADOOP_CONF_DIR", str(client_conf(client_env, tmp_path, "simple")))
    monkeypatch.delenv("ITERREDUCE_SKEIN_DRIVER", raising=False)
    monkeypatch.setenv("SKEIN_CONFIG", str(tmp_path / "skein"))
    err = one_error(capsys, "status", "application_1795733247844_0001")
    assert "the cluster wants Kerberos, but this client's Hadoop configuration does not" in err, err
    assert "hadoop.security.authentication=kerberos" in err
    np.savez(tmp_path / "d.npz", X=np.zeros((4, 3), np.float32))
    shards = client_env.uri(f"/user/{client_env.principal.split('@')[0]}/kerberos/simple")
    err = one_error(capsys, "shard", str(tmp_path / "d.npz"), shards, "--shards", "1")
    assert "the NameNode hung up" in err and "hadoop.security.authentication=kerberos" in err, err
    monkeypatch.setenv("HADOOP_CONF_DIR", client_env.env()["HADOOP_CONF_DIR"])  # set right: in again, a new client
    assert main(["shard", str(tmp_path / "d.npz"), shards, "--shards", "1"]) == 0


@pytest.mark.yarn
def test_a_client_configured_for_kerberos_is_told_that_the_cluster_does_not_use_it(gssapi, client_env, hadoop,
                                                                                   tmp_path, monkeypatch, capsys):
    """The reverse: a ticket and a configuration that asks for Kerberos, against a cluster without it
    (the session's unsecured Hadoop): Hadoop's client will not fall back to no security unasked."""
    monkeypatch.setenv("HADOOP_CONF_DIR", str(client_conf(hadoop, tmp_path, "kerberos")))
    monkeypatch.setenv("PATH", f"{hadoop.bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("ITERREDUCE_SKEIN_DRIVER", raising=False)
    monkeypatch.setenv("SKEIN_CONFIG", str(tmp_path / "skein"))
    err = one_error(capsys, "status", "application_1795733247844_0001")
    assert "asks for Kerberos (hadoop.security.authentication), but the cluster does not use it" in err, err
