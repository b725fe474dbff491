"""The Hadoop client configuration this process sees, and how to reach a NameNode by it.

The configuration is what Hadoop's own clients and hdfs-native read: ``core-site.xml``,
``hdfs-site.xml`` and ``yarn-site.xml`` in ``$HADOOP_CONF_DIR`` (else ``$HADOOP_HOME/etc/hadoop``). On a cluster's
nodes that is the cluster's configuration; containers see their NodeManager's.

:func:`namenode_address` says how to name a NameNode so that a container finds the HDFS
delegation token YARN gave it: Hadoop names a token's service after the NameNode's *IP
address* and port (``hadoop.security.token.service.use_ip``, true by default) or, for an
HA name service, ``ha-hdfs:NAMESERVICE``, while hdfs-native picks the token whose service
is the address it was given, as written. ``hdfs://namenode.example.com:8020`` would find
no token under ``10.1.2.3:8020``, and a container, which holds no Kerberos ticket, could
not read HDFS at all.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import xml.etree.ElementTree as ET
from functools import lru_cache
from pathlib import Path

from ..exceptions import HadoopConfigError

#: The files read, in Hadoop's order (a later one's value wins).
SITE_FILES = ("core-site.xml", "hdfs-site.xml", "yarn-site.xml")
#: Hive's client configuration (the metastore's address: ``hive.metastore.uris``).
HIVE_SITE_FILE = "hive-site.xml"
#: A site file larger than this is refused (they hold a few hundred settings: tens of KB).
MAX_SITE_BYTES = 16 * 2**20
#: HDFS's RPC port where a URI names none (Hadoop's ``DFS_NAMENODE_RPC_PORT_DEFAULT``).
DEFAULT_NAMENODE_PORT = 8020


def conf_dir() -> Path | None:
    """``$HADOOP_CONF_DIR``, else ``$HADOOP_HOME/etc/hadoop``; None when neither is set."""
    if os.environ.get("HADOOP_CONF_DIR"):
        return Path(os.environ["HADOOP_CONF_DIR"])
    if os.environ.get("HADOOP_HOME"):
        return Path(os.environ["HADOOP_HOME"]) / "etc" / "hadoop"
    return None


def settings() -> dict[str, str]:
    """Every property of the site files in :func:`conf_dir` (``{}`` where there are none).
    Raises :class:`~iterreduce.exceptions.HadoopConfigError` naming a file that is too large or not XML."""
    folder = conf_dir()
    return {} if folder is None else site_settings(folder, SITE_FILES)


def hive_settings() -> dict[str, str]:
    """The properties of ``hive-site.xml`` in ``$HIVE_CONF_DIR``, else in :func:`conf_dir`, as Hive's
    and Spark's clients find it (``{}`` where there is none)."""
    for folder in (os.environ.get("HIVE_CONF_DIR"), conf_dir()):
        if folder and (Path(folder) / HIVE_SITE_FILE).is_file():
            return site_settings(Path(folder), (HIVE_SITE_FILE,))
    return {}


def site_settings(folder: Path, names: tuple[str, ...]) -> dict[str, str]:
    """The properties of the site files ``names`` in ``folder`` (a later file's value wins), read
    again only when a file changes."""
    stamps = []
    for name in names:
        try:
            st = (folder / name).stat()
            stamps.append((name, st.st_mtime_ns, st.st_size))
        except OSError:
            continue
    return dict(_read(str(folder), tuple(stamps)))


def get(name: str, default: str | None = None) -> str | None:
    """One property of :func:`settings`, or ``default``."""
    return settings().get(name, default)


def is_true(name: str, default: bool) -> bool:
    """A boolean property (Hadoop's ``Configuration.getBoolean``: ``true``/``false``, any case)."""
    value = get(name)
    return default if value is None else value.strip().lower() == "true"


@lru_cache(maxsize=8)
def _read(folder: str, stamps: tuple) -> tuple[tuple[str, str], ...]:
    """The properties of the site files, as of ``stamps`` (their mtime and size: read again when they change)."""
    found: dict[str, str] = {}
    for name, _, size in stamps:
        path = Path(folder) / name
        if size > MAX_SITE_BYTES:
            raise HadoopConfigError(f"{path}: {size} bytes, more than a Hadoop site file holds ({MAX_SITE_BYTES}); "
                              f"check HADOOP_CONF_DIR")
        try:
            root = ET.fromstring(path.read_bytes())
        except (OSError, ET.ParseError) as exc:
            raise HadoopConfigError(f"{path}: not a readable Hadoop configuration file: {exc}") from exc
        for prop in root.iter("property"):
            key, value = prop.findtext("name"), prop.findtext("value")
            if key and value is not None:
                found[key.strip()] = value.strip()
    return tuple(found.items())


def is_name_service(host: str) -> bool:
    """Whether ``host`` is an HA name service of the configuration (``dfs.ha.namenodes.HOST``), not a host."""
    return bool(get(f"dfs.ha.namenodes.{host}"))


def namenode_address(host: str, port: int | None) -> tuple[str, int | None]:
    """The ``(host, port)`` to give hdfs-native for an ``hdfs://host[:port]`` URI: an HA name
    service as it is (no port: hdfs-native finds its NameNodes in the configuration); a
    NameNode's host by its IP address where Hadoop names delegation tokens so (see the module
    docstring; a name that does not resolve stays as written), with port 8020 if none is given."""
    if port is None and is_name_service(host):
        return host, None
    port = port or DEFAULT_NAMENODE_PORT
    if not is_true("hadoop.security.token.service.use_ip", True):
        return host, port
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0], port
    except (OSError, IndexError):
        return host, port


#: ``yarn.application.classpath`` where the configuration is silent (Hadoop's cross-platform default).
DEFAULT_APPLICATION_CLASSPATH = (
    "{{HADOOP_CONF_DIR}},{{HADOOP_COMMON_HOME}}/share/hadoop/common/*,{{HADOOP_COMMON_HOME}}/share/hadoop/common/lib/*,"
    "{{HADOOP_HDFS_HOME}}/share/hadoop/hdfs/*,{{HADOOP_HDFS_HOME}}/share/hadoop/hdfs/lib/*,"
    "{{HADOOP_YARN_HOME}}/share/hadoop/yarn/*,{{HADOOP_YARN_HOME}}/share/hadoop/yarn/lib/*")


def application_classpath() -> str:
    """Hadoop's client classpath in a YARN container: ``yarn.application.classpath`` (what YARN
    gives an application master's JVM as ``CLASSPATH``; skein's master script does not inherit
    it), its ``{{VAR}}`` and ``$VAR`` taken from the container's environment."""
    entries = (get("yarn.application.classpath") or DEFAULT_APPLICATION_CLASSPATH).replace("\n", ",").split(",")
    expanded = [os.path.expandvars(re.sub(r"\{\{(\w+)\}\}", r"${\1}", entry.strip())) for entry in entries]
    return ":".join(entry for entry in expanded if entry and "$" not in entry)


def java() -> str | None:
    """The ``java`` that runs Hadoop's tools here: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else shutil.which("java")


def java_tool(main: str, options: tuple[str, ...] = ()) -> list[str] | None:
    """The command that runs Hadoop's class ``main`` (add its arguments) with JVM ``options`` on this
    container's Hadoop classpath (``$CLASSPATH``, else :func:`application_classpath`); None without a
    java or a classpath."""
    executable, classpath = java(), os.environ.get("CLASSPATH") or application_classpath()
    return [executable, *options, "-cp", classpath, main] if executable and classpath else None


def tool_output_tail(stdout: str, stderr: str, lines: int = 3) -> str:
    """What a Hadoop tool that failed said, for an error message: its last ``lines`` lines that are
    not INFO logging, joined by `` | `` ("no output" when it said nothing else)."""
    said = [line for line in (stderr + stdout).splitlines() if line.strip() and " INFO " not in line]
    return " | ".join(said[-lines:]) or "no output"
