"""Fresh delegation tokens for a job submitted with a keytab (iterreduce.launch.yarn.tokens), without a cluster:
Hadoop's dtutil stood in for by a script that checks its arguments, skein's key-value store by one that
hands out real skein events. tests/test_kerberos_yarn.py runs the real thing on the secured Hadoop."""

from __future__ import annotations

import os
import queue
import stat
import time

import pytest
from iterreduce.launch.yarn.skein_import import skein

from iterreduce.exceptions import JobFailed
from iterreduce.launch.yarn import tokens
from iterreduce.launch.yarn.appspec import YarnOptions, build_spec


def site(folder, settings: dict[str, str]) -> None:
    body = "".join(f"<property><name>{k}</name><value>{v}</value></property>" for k, v in settings.items())
    (folder / "hdfs-site.xml").write_text(f"<configuration>{body}</configuration>")


@pytest.fixture
def conf(tmp_path, monkeypatch):
    folder = tmp_path / "conf"
    folder.mkdir()
    monkeypatch.setenv("HADOOP_CONF_DIR", str(folder))
    return folder


@pytest.mark.parametrize("settings, every", [
    ({}, 43_200),  # Hadoop's defaults: renewed within a day, dead after a week: half a day
    ({"dfs.namenode.delegation.token.renew-interval": "60000",
      "dfs.namenode.delegation.token.max-lifetime": "300000"}, 30),
    ({"dfs.namenode.delegation.token.renew-interval": "600000",
      "dfs.namenode.delegation.token.max-lifetime": "100000"}, 20),  # the lifetime, less hdfs-native's minute
    ({"dfs.namenode.delegation.token.renew-interval": "2000"}, tokens.MIN_REFRESH_S),
])
def test_tokens_are_renewed_well_before_they_could_die(conf, settings, every):
    site(conf, settings)
    assert tokens.refresh_interval() == every


@pytest.fixture(autouse=True)
def token_file_location(monkeypatch):
    """Whatever a test makes of HADOOP_TOKEN_FILE_LOCATION (tokens.use sets it) is undone after it: a
    file named there that is gone stops every later Hadoop client in this process (skein's driver too)."""
    monkeypatch.setenv("HADOOP_TOKEN_FILE_LOCATION", "")
    monkeypatch.delenv("HADOOP_TOKEN_FILE_LOCATION")


@pytest.fixture
def dtutil(tmp_path, monkeypatch):
    """A ``java`` that plays Hadoop's dtutil: checks its arguments and adds a "token" line per file
    system to the file named last; ``FAIL`` in the environment makes it fail as a bad keytab does."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("""#!/bin/sh
[ "$2" = "hadoop-classpath" ] && [ "$3" = org.apache.hadoop.security.token.DtUtilShell ] || exit 9
[ "$4" = -keytab ] && [ "$6" = -principal ] && [ "$8" = get ] && [ "${10}" = -renewer ] && [ "${12}" = -format ] || exit 8
if [ -n "$FAIL" ]; then echo "26/11/26 22:04:17 INFO security.UserGroupInformation: noise" >&2; echo "Login failure for $7 from keytab $5" >&2; exit 1; fi
echo "token for $9 renewed by ${11} as ${13}" >> "${14}"
""")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(home))
    monkeypatch.setenv("CLASSPATH", "hadoop-classpath")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_fetch_gets_a_token_of_every_file_system_into_a_private_file(dtutil):
    out = dtutil / "fetched"
    data = tokens.fetch("alice@EXAMPLE.COM", "/k/alice.keytab", ["hdfs://nn1:8020", "hdfs://nn2:8020"], out)
    assert data.decode().splitlines() == ["token for hdfs://nn1:8020 renewed by alice as protobuf",
                                          "token for hdfs://nn2:8020 renewed by alice as protobuf"]
    assert out.read_bytes() == data and stat.S_IMODE(out.stat().st_mode) == 0o600
    assert not list(dtutil.glob("*.partial"))


def test_a_failed_fetch_says_which_file_system_principal_and_why(dtutil, monkeypatch):
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(JobFailed, match=r"for hdfs://nn1:8020 as alice@EXAMPLE.COM with its keytab \(dtutil exit 1\): "
                                        r"Login failure for alice@EXAMPLE.COM from keytab /k/alice.keytab$"):
        tokens.fetch("alice@EXAMPLE.COM", "/k/alice.keytab", ["hdfs://nn1:8020"], dtutil / "fetched")


def test_use_makes_the_tokens_this_processs_own(tmp_path, monkeypatch):
    path = tokens.use(b"first", tmp_path / "tokens")
    assert os.environ["HADOOP_TOKEN_FILE_LOCATION"] == str(path) and path.read_bytes() == b"first"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    tokens.use(b"second", tmp_path / "tokens")
    assert path.read_bytes() == b"second" and [p.name for p in tmp_path.iterdir()] == ["tokens"]


def test_the_refresher_fetches_at_once_then_again_and_survives_a_failure(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    answers = iter([b"set 1", RuntimeError("KDC down"), b"set 2"])

    def fetch(principal, keytab, file_systems, out):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise JobFailed(str(answer))
        return answer

    monkeypatch.setattr(tokens, "fetch", fetch)
    monkeypatch.setattr(tokens, "RETRY_S", 0.05)
    published: list[bytes] = []
    refresher = tokens.TokenRefresher("alice@EXAMPLE.COM", "k", ["hdfs://nn:8020"], published.append, interval=0.1)
    refresher.start()
    assert published == [b"set 1"]  # before start returns: the job never runs on older tokens
    deadline = time.monotonic() + 10
    while len(published) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    refresher.stop(timeout=5)
    assert published == [b"set 1", b"set 2"]
    assert (tmp_path / tokens.TOKEN_FILE).read_bytes() == b"set 2"


def test_the_interval_counts_from_each_fetchs_start_however_long_a_fetch_takes(tmp_path, monkeypatch):
    """A fetch starts a Java process and logs in to Kerberos: on a busy node it takes seconds, and
    the tokens' time runs from when they were issued. Fetches taking 0.3 s every 0.5 s start 0.5 s
    apart, not 0.8 s (as the tokens of a 20-s renewal interval died under the suite's load)."""
    monkeypatch.chdir(tmp_path)
    starts: list[float] = []

    def slow_fetch(principal, keytab, file_systems, out):
        starts.append(time.monotonic())
        time.sleep(0.3)
        return b"set"

    monkeypatch.setattr(tokens, "fetch", slow_fetch)
    refresher = tokens.TokenRefresher("a@R", "k", ["hdfs://nn:8020"], lambda data: None, interval=0.5).start()
    deadline = time.monotonic() + 10
    while len(starts) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    refresher.stop(timeout=5)  # the fetch under way ends here, in tmp_path
    gaps = [b - a for a, b in zip(starts, starts[1:5])]
    assert len(gaps) == 4 and all(0.45 < gap < 0.75 for gap in gaps), gaps


def test_a_first_fetch_that_fails_fails_the_job(tmp_path, monkeypatch):
    monkeypatch.setattr(tokens, "fetch", lambda *a: (_ for _ in ()).throw(JobFailed("no KDC")))
    with pytest.raises(JobFailed, match="no KDC"):
        tokens.TokenRefresher("a@R", "k", ["hdfs://nn:8020"], print, interval=1).start()


def test_from_container_needs_the_keytab_and_adds_the_default_file_system(conf, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (conf / "core-site.xml").write_text("<configuration><property><name>fs.defaultFS</name>"
                                        "<value>hdfs://nn0:8020</value></property></configuration>")
    monkeypatch.setenv(tokens.PRINCIPAL_VAR, "alice@EXAMPLE.COM")
    monkeypatch.setenv(tokens.FILE_SYSTEMS_VAR, "hdfs://nn1:8020,hdfs://nn2:9000")
    assert tokens.TokenRefresher.from_container(print) is None  # a ticket-cache job: no keytab shipped
    (tmp_path / tokens.KEYTAB_FILE).write_bytes(b"keys")
    refresher = tokens.TokenRefresher.from_container(print)
    assert refresher.principal == "alice@EXAMPLE.COM" and refresher.keytab == str(tmp_path / tokens.KEYTAB_FILE)
    assert refresher.file_systems == ["hdfs://nn1:8020", "hdfs://nn2:9000", "hdfs://nn0:8020"]


class FakeKV:
    """skein's key-value store as :func:`tokens.follow` uses it, with skein's own event objects."""

    def __init__(self, value: bytes | None):
        self.value, self.queue = value, queue.Queue()

    def events(self, key, event_type):
        assert (key, event_type) == (tokens.KV_TOKENS, "PUT")
        return iter(self.queue.get, None)

    def wait(self, key):
        assert key == tokens.KV_TOKENS and self.value is not None
        return self.value

    def put(self, value: bytes):
        self.value = value
        self.queue.put(skein.kv.Event(tokens.KV_TOKENS, skein.kv.ValueOwnerPair(value, None), skein.kv.EventType.PUT,
                                      None))


class FakeApp:
    def __init__(self, value):
        self.kv = FakeKV(value)


def test_a_worker_takes_the_masters_tokens_and_every_later_set(tmp_path, monkeypatch):
    app = FakeApp(b"set 1")
    monkeypatch.delenv(tokens.FROM_MASTER_VAR, raising=False)
    assert tokens.follow(app, tmp_path / "t") is None  # a ticket-cache job: the container's own tokens
    assert "HADOOP_TOKEN_FILE_LOCATION" not in os.environ
    monkeypatch.setenv(tokens.FROM_MASTER_VAR, "1")
    thread = tokens.follow(app, tmp_path / "t")
    assert (tmp_path / "t").read_bytes() == b"set 1" and os.environ["HADOOP_TOKEN_FILE_LOCATION"] == str(tmp_path / "t")
    app.kv.put(b"set 2")
    deadline = time.monotonic() + 10
    while (tmp_path / "t").read_bytes() != b"set 2" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (tmp_path / "t").read_bytes() == b"set 2" and thread.is_alive()
    app.kv.queue.put(None)
    thread.join(5)


def test_the_keytab_goes_to_the_application_master_alone(tmp_path):
    keytab = tmp_path / "alice.keytab"
    keytab.write_bytes(b"keys")
    opts = YarnOptions(python="/usr/bin/python3", principal="alice@EXAMPLE.COM", keytab=str(keytab),
                       file_systems=["hdfs://nn:8020"])
    spec = build_spec("j", str(tmp_path / "job.json"), opts)
    assert spec.master.files[tokens.KEYTAB_FILE].source.endswith(str(keytab))
    assert tokens.KEYTAB_FILE not in spec.services["worker-0"].files
    assert spec.master.env[tokens.PRINCIPAL_VAR] == "alice@EXAMPLE.COM"
    assert spec.master.env[tokens.FILE_SYSTEMS_VAR] == "hdfs://nn:8020"
    assert spec.services["worker-0"].env[tokens.FROM_MASTER_VAR] == "1"
    plain = build_spec("j", str(tmp_path / "job.json"), YarnOptions(python="/usr/bin/python3"))
    assert tokens.KEYTAB_FILE not in plain.master.files and tokens.FROM_MASTER_VAR not in plain.services["worker-0"].env
