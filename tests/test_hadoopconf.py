"""The Hadoop client configuration (iterreduce.storage.hadoopconf): a NameNode is reached under the name Hadoop
gives its delegation tokens, else a YARN container (tokens, no ticket) finds none and cannot read HDFS."""

from __future__ import annotations

import os

import pytest

from iterreduce.exceptions import HadoopConfigError
from iterreduce.storage import hadoopconf
from iterreduce.storage.filesystems import filesystem


def site(folder, name: str, settings: dict[str, str]) -> None:
    body = "".join(f"<property><name>{k}</name><value>{v}</value></property>" for k, v in settings.items())
    (folder / name).write_text(f"<?xml version='1.0'?><configuration>{body}</configuration>")


@pytest.fixture
def conf(tmp_path, monkeypatch):
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("HADOOP_HOME", raising=False)
    return tmp_path


def test_a_namenode_host_is_reached_by_its_ip_as_hadoop_names_the_tokens(conf):
    site(conf, "core-site.xml", {"fs.defaultFS": "hdfs://localhost:9000"})
    assert hadoopconf.namenode_address("localhost", 9000) == ("127.0.0.1", 9000)
    assert hadoopconf.namenode_address("localhost", None) == ("127.0.0.1", hadoopconf.DEFAULT_NAMENODE_PORT)
    assert hadoopconf.namenode_address("no-such-host.invalid", 9000) == ("no-such-host.invalid", 9000)


def test_by_its_name_where_the_cluster_names_tokens_by_host(conf):
    site(conf, "core-site.xml", {"hadoop.security.token.service.use_ip": "False"})
    assert hadoopconf.namenode_address("localhost", 9000) == ("localhost", 9000)


def test_an_ha_name_service_is_named_as_it_is_without_a_port(conf):
    """Its tokens are named ha-hdfs:NAMESERVICE, as hdfs-native asks for them; a port would make
    hdfs-native take the name service for a host."""
    site(conf, "hdfs-site.xml", {"dfs.nameservices": "prod", "dfs.ha.namenodes.prod": "nn1,nn2"})
    assert hadoopconf.namenode_address("prod", None) == ("prod", None)


def test_a_later_site_file_wins_and_a_changed_file_is_read_again(conf):
    site(conf, "core-site.xml", {"a": "core", "b": "core"})
    site(conf, "hdfs-site.xml", {"b": "hdfs"})
    assert (hadoopconf.get("a"), hadoopconf.get("b"), hadoopconf.get("c", "-")) == ("core", "hdfs", "-")
    site(conf, "hdfs-site.xml", {"b": "changed, and longer"})
    assert hadoopconf.get("b") == "changed, and longer"


def test_no_configuration_is_no_settings(monkeypatch):
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("HADOOP_HOME", raising=False)
    assert hadoopconf.settings() == {}


def test_a_broken_or_huge_site_file_is_refused_naming_it(conf, monkeypatch):
    (conf / "core-site.xml").write_text("<configuration><property>")
    with pytest.raises(HadoopConfigError, match=r"core-site.xml: not a readable Hadoop configuration file"):
        hadoopconf.settings()
    site(conf, "core-site.xml", {"a": "b"})
    monkeypatch.setattr(hadoopconf, "MAX_SITE_BYTES", 10)
    with pytest.raises(HadoopConfigError, match=r"core-site.xml: \d+ bytes, more than a Hadoop site file holds"):
        hadoopconf.settings()


def test_the_projects_hdfs_file_system_reaches_the_namenode_by_that_address(conf):
    pytest.importorskip("hdfs_native")
    fs, path = filesystem("hdfs://localhost:9000/user/me/x")
    raw = fs.handler.fs
    assert (raw.host, raw.port, path) == ("127.0.0.1", 9000, "/user/me/x")


def test_a_client_made_for_another_configuration_or_login_is_not_reused(conf, tmp_path, monkeypatch):
    """fsspec keeps a file system per NameNode: a second one made after HADOOP_CONF_DIR, the ticket cache or
    the token file changed must not be the first (whose client kept the old ones: a secured cluster's
    NameNode then hangs up, or answers as another user)."""
    pytest.importorskip("hdfs_native")
    monkeypatch.setenv("KRB5CCNAME", "FILE:/tmp/a")
    first = filesystem("hdfs://localhost:9000/x")[0].handler.fs
    assert filesystem("hdfs://localhost:9000/y")[0].handler.fs is first
    monkeypatch.setenv("KRB5CCNAME", "FILE:/tmp/b")
    assert filesystem("hdfs://localhost:9000/x")[0].handler.fs is not first
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv("HADOOP_CONF_DIR", str(other))
    assert filesystem("hdfs://localhost:9000/x")[0].handler.fs is not first


def test_the_footer_reader_reaches_hdfs_as_its_caller_does_now(monkeypatch):
    """shard_info's helper process is started once and lives on: it must take the caller's configuration
    and login of each call, not those of its start (a later kinit, keytab or HADOOP_CONF_DIR). Here the
    helper's side runs in this process, its environment as the helper's was."""
    from shardio import readers as shards

    for var in shards.CLIENT_ENVIRONMENT:  # restored afterwards, whatever the call sets
        monkeypatch.setenv(var, "as the helper started")
    monkeypatch.setattr(shards, "describe_shard", lambda uri: {v: os.environ.get(v) for v in shards.CLIENT_ENVIRONMENT})
    caller = {var: "" for var in shards.CLIENT_ENVIRONMENT} | {"HADOOP_CONF_DIR": "/conf", "KRB5CCNAME": "FILE:/tmp/new"}
    got = shards.describe_as_caller("x", tuple(caller[var] for var in shards.CLIENT_ENVIRONMENT))
    assert got == {var: value or None for var, value in caller.items()}
