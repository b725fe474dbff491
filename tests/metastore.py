"""A real Hive metastore for the tests: Hive's standalone metastore server (``HiveMetaStore``)
on an embedded Derby database, its warehouse on the session's HDFS.

Nothing is built: Maven fetches the server's release archive once (``hive/pom.xml``) into
the cache beside Hadoop's jars; Hadoop's own jars are the mini cluster's. :class:`HiveMetastore`
initialises the database with Hive's own schema tool and starts the server as a child that
stops when this process is gone (``hive/Metastore.java``, as the mini cluster does).
"""

from __future__ import annotations

import fcntl
import re
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Self
from xml.sax.saxutils import escape

from minihadoop import HadoopError, cache_dir, ensure_jars, fetch_jars, java_home
from mlflowserver import free_port
from shardio.metastore import MetastoreClient

HERE = Path(__file__).resolve().parent / "hive"
POM = HERE / "pom.xml"
LAUNCHER = HERE / "Metastore.java"
HIVE_VERSION = re.search(r"<hive.version>([^<]+)<", POM.read_text()).group(1)  # one place: the pom
#: Seconds the server may take to listen (it starts in seconds; a loaded machine is slower).
STARTUP_TIMEOUT_S = 240


def server_home() -> Path:
    """The server's release (``lib/``, ``scripts/``), fetched and unpacked once into the cache."""
    fetched = fetch_jars(POM, cache_dir().parent / f"hive-metastore-{HIVE_VERSION}" / "fetched")
    home = fetched.parent / "release"
    if (home / ".complete").is_file():
        return home
    with open(fetched.parent / ".unpack-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / ".complete").is_file():
            return home
        staged = Path(tempfile.mkdtemp(prefix=".release-", dir=fetched.parent))
        (archive,) = fetched.glob("hive-standalone-metastore-server-*-bin.tar.gz")
        with tarfile.open(archive) as tar:
            tar.extractall(staged, filter="data")
        (top,) = [p for p in staged.iterdir() if p.is_dir()]
        for jar in fetched.glob("*.jar"):  # what the release lacks beside Hadoop 3.5 (commons-collections)
            shutil.copy(jar, top / "lib" / jar.name)
        (top / ".complete").write_text(HIVE_VERSION + "\n")
        shutil.rmtree(home, ignore_errors=True)
        top.rename(home)
        shutil.rmtree(staged)
    return home


class HiveMetastore:
    """A metastore server for ``hadoop`` (a started :class:`minihadoop.MiniHadoop`), its Derby
    database and logs in a fresh folder under ``base_dir``, its warehouse ``/warehouse/hive`` on
    that HDFS. :attr:`uri` is what a job's ``[data] metastore`` names."""

    def __init__(self, hadoop, base_dir: Path):
        self.hadoop, self.base_dir = hadoop, Path(base_dir)
        self.dir: Path | None = None
        self.port = 0
        self._proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"thrift://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> str:
        return self.hadoop.uri("/warehouse/hive")

    def start(self) -> Self:
        home = server_home()
        java = str(Path(java_home()) / "bin" / "java")
        self.dir = Path(tempfile.mkdtemp(prefix="metastore-", dir=self.base_dir))
        conf = self.dir / "conf"
        conf.mkdir()
        self.port = free_port()
        settings = {
            "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={self.dir / 'db'};create=true",
            "javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
            "metastore.thrift.port": self.port,
            "metastore.thrift.bind.host": "127.0.0.1",  # this machine's tests alone reach it
            "metastore.thrift.uris": self.uri,
            "metastore.warehouse.dir": self.warehouse,
            "metastore.warehouse.external.dir": self.warehouse,
            "metastore.event.db.notification.api.auth": "false",
            "metastore.metrics.enabled": "false",
        }
        (conf / "metastore-site.xml").write_text(
            "<configuration>\n" + "".join(f"<property><name>{escape(k)}</name><value>{escape(str(v))}</value></property>\n"
                                          for k, v in settings.items()) + "</configuration>\n")
        classpath = ":".join([str(conf), str(self.hadoop.conf_dir), str(home / "lib" / "*"),
                              str(ensure_jars() / "*")])
        env = {"METASTORE_HOME": str(home), "JAVA_HOME": java_home(), "PATH": "/usr/bin:/bin"}
        init = subprocess.run([java, "-cp", classpath, "org.apache.hadoop.hive.metastore.tools.schematool."
                               "MetastoreSchemaTool", "-initSchema", "-dbType", "derby"],
                              capture_output=True, text=True, env=env, cwd=self.dir, timeout=300)
        if init.returncode != 0:
            raise HadoopError(f"the metastore's schema tool failed:\n{(init.stdout + init.stderr)[-3000:]}")
        log = open(self.dir / "metastore.log", "wb")
        with log:
            # stdin is a pipe nobody writes to: when this process dies, the server reads end-of-file and stops.
            self._proc = subprocess.Popen([java, "-Xmx512m", "-cp", classpath, str(LAUNCHER), "-p", str(self.port)],
                                          stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          cwd=self.dir)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._listening():
            if self._proc.poll() is not None:
                raise HadoopError(f"the metastore exited with {self._proc.returncode}:\n{self._tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise HadoopError(f"the metastore did not listen within {STARTUP_TIMEOUT_S} s:\n{self._tail()}")
            time.sleep(0.5)
        return self

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def client(self):
        """A connected Thrift client of the metastore (``hive_metastore``'s), for a ``with`` block."""
        return MetastoreClient(self.uri)

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def _tail(self) -> str:
        log = self.dir / "metastore.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.is_file() else ""
