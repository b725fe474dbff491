"""A real, throw-away HDFS (one NameNode + one DataNode) on the loopback interface.

No registry ships Hadoop itself, but the PyPI source distribution of
``pyspark==2.4.8`` carries the Hadoop 2.7.3 jars, ``hadoop-hdfs`` among them, and
those run on a current Java (17+). This module

- fetches that sdist once with the current interpreter's pip, keeps only the jars
  that NameNode and DataNode need (about 33 MB) in a per-user cache, and drops the
  220 MB tarball (:func:`ensure_hadoop_jars`);
- starts a fresh, formatted HDFS in a temporary directory, every address on
  127.0.0.1 and on free ports, and stops it again, JVMs and files
  (:class:`MiniHDFS`).

Clients talk to it through ``hdfs-native`` (a Rust HDFS client: no JVM, no
``libhdfs``), which registers fsspec's ``hdfs`` protocol; :meth:`MiniHDFS.fs`
wraps it as a pyarrow file system, as ``iterreduce.shards.filesystem`` does.

Typical use::

    with MiniHDFS() as hdfs:
        fs = hdfs.fs()
        fs.create_dir("/data")
        print(hdfs.url)  # hdfs://127.0.0.1:PORT

or from a shell, for a person: ``python tests/minihdfs.py`` prints the URL and keeps
the file system up until Ctrl-C.

Environment:

- ``DBN_HADOOP_JARS``: a directory of Hadoop jars to use as is (never downloaded
  into); otherwise the cache below is filled on first use.
- ``XDG_CACHE_HOME``: the cache lives in ``$XDG_CACHE_HOME/dbn-yarn/hadoop-2.7.3/jars``
  (``~/.cache/...`` when unset).
- ``JAVA_HOME``: the ``java`` used is ``$JAVA_HOME/bin/java`` when that exists,
  otherwise the first ``java`` on ``PATH``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Self
from xml.sax.saxutils import escape

__all__ = ["HADOOP_VERSION", "HadoopJarsError", "MiniHDFS", "MiniHDFSError", "default_cache_dir",
           "ensure_hadoop_jars", "java_available", "java_executable"]

HADOOP_VERSION = "2.7.3"
PYSPARK_SDIST = "pyspark==2.4.8"  # its deps/jars/ holds Hadoop 2.7.3
MIN_JAVA = 17
JARS_ENV = "DBN_HADOOP_JARS"

# What NameNode and DataNode load (found with -Xlog:class+load over format, start,
# writes, reads, renames, deletes and a missing file), plus the other compile-time
# dependencies of hadoop-common/-hdfs that are small and in the sdist, so that rarer
# code paths (errors, metrics, servlets) find their classes too. ZooKeeper, Curator,
# Kerberos (apacheds) and native compression are left out: HA, secure mode and
# compressed images are not used here. Exact names: the sdist is pinned.
HADOOP_JARS = (
    # loaded
    "hadoop-annotations-2.7.3.jar",
    "hadoop-auth-2.7.3.jar",
    "hadoop-common-2.7.3.jar",
    "hadoop-hdfs-2.7.3.jar",
    "guava-14.0.1.jar",
    "protobuf-java-2.5.0.jar",
    "htrace-core-3.1.0-incubating.jar",
    "commons-cli-1.2.jar",
    "commons-codec-1.10.jar",
    "commons-collections-3.2.2.jar",
    "commons-configuration-1.6.jar",
    "commons-io-2.4.jar",
    "commons-lang-2.6.jar",
    "commons-logging-1.1.3.jar",
    "log4j-1.2.17.jar",
    "slf4j-api-1.7.16.jar",
    "slf4j-log4j12-1.7.16.jar",
    "jackson-core-asl-1.9.13.jar",
    "jackson-mapper-asl-1.9.13.jar",
    "jetty-6.1.26.jar",
    "jetty-util-6.1.26.jar",
    "javax.servlet-api-3.1.0.jar",
    "javax.ws.rs-api-2.0.1.jar",
    "netty-all-4.1.47.Final.jar",
    "xercesImpl-2.9.1.jar",
    # declared, for rarer paths
    "commons-beanutils-1.9.4.jar",
    "commons-compress-1.20.jar",
    "commons-digester-1.8.jar",
    "commons-math3-3.4.1.jar",
    "commons-net-3.1.jar",
    "avro-1.8.2.jar",
    "paranamer-2.8.jar",
    "gson-2.2.4.jar",
    "httpclient-4.5.6.jar",
    "httpcore-4.4.10.jar",
    "jsp-api-2.1.jar",
    "jsr305-1.3.9.jar",
    "leveldbjni-all-1.8.jar",
    "netty-3.9.9.Final.jar",
    "xmlenc-0.52.jar",
)


class HadoopJarsError(RuntimeError):
    """The Hadoop jars could not be found or installed (e.g. no access to PyPI)."""


class MiniHDFSError(RuntimeError):
    """The HDFS did not come up (the message carries the tail of the JVM logs)."""


# ---------------------------------------------------------------- Java


def java_executable() -> str | None:
    """Path of the ``java`` to run: ``$JAVA_HOME/bin/java`` if present, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def _java_major(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    # `java -version` writes e.g. 'openjdk version "17.0.15" 2025-04-15' (or "1.8.0_392") to stderr.
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def java_available() -> str | None:
    """None when a Java 17+ is there to run HDFS, else the reason why not (for a skip)."""
    java = java_executable()
    if java is None:
        return "no Java: neither $JAVA_HOME/bin/java nor java on PATH (install a JDK 17+ to run a real HDFS)"
    major = _java_major(java)
    if major is None:
        return f"{java} -version did not run or did not say its version"
    if major < MIN_JAVA:
        return f"{java} is Java {major}; a real HDFS here needs Java {MIN_JAVA}+"
    return None


# ---------------------------------------------------------------- jars


def default_cache_dir() -> Path:
    """Where :func:`ensure_hadoop_jars` keeps the jars unless told otherwise."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "dbn-yarn" / f"hadoop-{HADOOP_VERSION}" / "jars"


def _missing_jars(directory: Path) -> list[str]:
    return [name for name in HADOOP_JARS if not (directory / name).is_file()]


def ensure_hadoop_jars(cache_dir: str | os.PathLike | None = None) -> Path:
    """The directory of Hadoop jars to run HDFS from, installed there first if need be.

    - ``cache_dir`` given: find the jars there, or install them there.
    - otherwise ``$DBN_HADOOP_JARS`` when set: an existing directory of Hadoop jars,
      used as is and never downloaded into (raises if it holds no hadoop-hdfs jar);
    - otherwise the per-user cache (:func:`default_cache_dir`).

    Installing downloads the ``pyspark==2.4.8`` sdist (about 220 MB) with
    ``python -m pip download`` of this interpreter, extracts the jars of
    :data:`HADOOP_JARS` into a temporary directory beside the cache and renames it
    into place, so an interrupted download never leaves a half-filled cache; the
    tarball is deleted. A file lock keeps concurrent sessions from downloading twice.
    Raises :class:`HadoopJarsError` (with pip's output) when that fails.
    """
    if cache_dir is None and os.environ.get(JARS_ENV):
        given = Path(os.environ[JARS_ENV]).expanduser()
        if not given.is_dir():
            raise HadoopJarsError(f"${JARS_ENV}={given}: no such directory")
        if not list(given.glob("hadoop-hdfs-*.jar")) or not list(given.glob("hadoop-common-*.jar")):
            raise HadoopJarsError(f"${JARS_ENV}={given}: holds no hadoop-hdfs-*.jar and hadoop-common-*.jar")
        return given
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if not _missing_jars(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be installing right now
        if _missing_jars(target):
            # Left by an installer that was killed (SIGKILL skips its clean-up); none can
            # be running now that we hold the lock.
            for stale in target.parent.glob(f".{target.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
            _install_jars(target)
    return target


def _install_jars(target: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        sdist = _download_sdist(work)
        staged = work / "jars"
        staged.mkdir()
        _extract_jars(sdist, staged)
        sdist.unlink()
        missing = _missing_jars(staged)
        if missing:
            raise HadoopJarsError(f"{sdist.name} lacks jars this module expects: {missing}")
        if target.exists():  # an older or incomplete cache: move it aside, then swap
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            target.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        staged.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _pip(args: list[str], env: dict | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=timeout,
                              preexec_fn=_death_signal())
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HadoopJarsError(f"{' '.join(command)} failed: {exc}") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()
        raise HadoopJarsError(
            f"could not get the Hadoop {HADOOP_VERSION} jars (from the {PYSPARK_SDIST} sdist on PyPI; "
            f"is PyPI reachable? Or point ${JARS_ENV} at a directory of Hadoop jars).\n"
            f"$ {' '.join(command)}\nexit {done.returncode}:\n" + "\n".join(output[-25:]))
    return done


def _download_sdist(work: Path) -> Path:
    # pip prepares the metadata of an sdist even to download it; pyspark 2.4.8's
    # setup.py needs setuptools with bdist_wheel, and its build isolation fails (it
    # pulls a pypandoc whose API the setup.py predates). So: put setuptools and
    # wheel in a private directory (the environment stays as it was, and a fresh
    # venv without setuptools works too) and download without build isolation.
    tools = work / "build-tools"
    _pip(["install", "--quiet", "--target", str(tools), "setuptools>=70.1", "wheel"], timeout=600)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tools), env.get("PYTHONPATH")]))
    env.pop("PIP_REQUIRE_VIRTUALENV", None)
    download = work / "download"
    _pip(["download", "--no-deps", "--no-build-isolation", "--progress-bar", "off",
          PYSPARK_SDIST, "-d", str(download)], env=env)
    found = sorted(download.glob("pyspark-*.tar.gz"))
    if not found:
        raise HadoopJarsError(f"pip download of {PYSPARK_SDIST} left no pyspark-*.tar.gz in {download}")
    shutil.rmtree(tools, ignore_errors=True)
    return found[0]


def _extract_jars(sdist: Path, out: Path) -> None:
    wanted = set(HADOOP_JARS)
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:  # streamed: one pass over the 220 MB
            parts = member.name.split("/")
            if (member.isfile() and len(parts) >= 4 and parts[-3:-1] == ["deps", "jars"]
                    and parts[-1] in wanted):
                with tar.extractfile(member) as src, open(out / parts[-1], "wb") as dst:
                    shutil.copyfileobj(src, dst)


# ---------------------------------------------------------------- HDFS


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together while picking)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def _site_xml(properties: dict[str, str]) -> str:
    body = "".join(f"  <property><name>{escape(k)}</name><value>{escape(str(v))}</value></property>\n"
                   for k, v in properties.items())
    return f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'


_LOG4J = """\
log4j.rootLogger=INFO, console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.target=System.err
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n
log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR
log4j.logger.org.mortbay=WARN
"""


def _death_signal():
    """A ``preexec_fn`` that has the kernel SIGKILL the child if this process dies first
    (Linux ``PR_SET_PDEATHSIG``, kept across ``exec``), or None elsewhere.

    ``prctl`` is looked up here, in the parent, so that the forked child only makes
    the one call (no ``dlopen``, no import: nothing that could wait on a lock held by
    another thread at the fork). Best effort: ``stop()`` is the real clean-up.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig, sigkill = 1, int(signal.SIGKILL)

    def preexec():  # pragma: no cover - runs in the forked child
        prctl(pr_set_pdeathsig, sigkill)

    return preexec


class MiniHDFS:
    """One NameNode and one DataNode in a temporary directory, on 127.0.0.1.

    ``start()`` formats a fresh name directory, starts both JVMs, and returns once a
    client can write and read a file (i.e. the DataNode has registered); ``stop()``
    ends the JVMs (their whole process groups) and removes the directory. Use it as
    a context manager. Both JVMs are also SIGKILLed by the kernel should the Python
    process die without stopping them (Linux).

    Parameters: ``jars`` (a directory of jars; default :func:`ensure_hadoop_jars`),
    ``heap`` (each JVM's ``-Xmx``), ``startup_timeout`` (seconds), ``conf`` (extra
    ``hdfs-site.xml`` properties, e.g. ``{"dfs.blocksize": "1048576"}``), ``base_dir``
    (parent of the temporary directory), ``keep`` (leave the directory, with its
    logs, after ``stop()``), ``java_options`` (more JVM flags).
    """

    def __init__(self, jars: str | os.PathLike | None = None, *, heap: str = "256m",
                 startup_timeout: float = 90.0, conf: dict[str, str] | None = None,
                 base_dir: str | os.PathLike | None = None, keep: bool = False,
                 java_options: list[str] | None = None):
        self._jars = Path(jars) if jars is not None else None
        self.heap = heap
        self.startup_timeout = startup_timeout
        self.extra_conf = dict(conf or {})
        self.base_dir = base_dir
        self.keep = keep
        self.java_options = list(java_options or [])
        self.dir: Path | None = None
        self.port: int | None = None
        self.ports: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    # -------------------------------------------------------- public

    host = "127.0.0.1"

    @property
    def url(self) -> str:
        """``hdfs://127.0.0.1:PORT`` (the NameNode's RPC address)."""
        if self.port is None:
            raise MiniHDFSError("MiniHDFS is not started")
        return f"hdfs://{self.host}:{self.port}"

    def uri(self, path: str) -> str:
        """The full ``hdfs://`` URI of absolute ``path`` on this file system."""
        return self.url + "/" + path.lstrip("/")

    def fsspec(self):
        """An fsspec file system (hdfs-native's) on this HDFS."""
        from hdfs_native.fsspec import HdfsFileSystem

        return HdfsFileSystem(host=self.host, port=self.port, skip_instance_cache=True)

    def fs(self):
        """A ``pyarrow.fs.FileSystem`` on this HDFS (hdfs-native through fsspec); paths are absolute."""
        import pyarrow.fs as pafs

        return pafs.PyFileSystem(pafs.FSSpecHandler(self.fsspec()))

    @property
    def running(self) -> bool:
        return bool(self._procs) and all(p.poll() is None for p in self._procs.values())

    @property
    def log_dir(self) -> Path | None:
        return None if self.dir is None else self.dir / "logs"

    def start(self) -> Self:
        """Format and start; returns self once the file system takes writes."""
        if self._procs:
            raise MiniHDFSError("MiniHDFS already started")
        reason = java_available()
        if reason:
            raise MiniHDFSError(reason)
        java = java_executable()
        jars = self._jars or ensure_hadoop_jars()
        self.dir = Path(tempfile.mkdtemp(prefix="minihdfs-", dir=self.base_dir))
        try:
            for attempt in range(3):  # a free port may be taken before the JVM binds it
                try:
                    self._start_once(java, jars)
                    return self
                except _PortTaken:
                    self._kill()
                    if attempt == 2:
                        raise MiniHDFSError("ports kept being taken:\n" + self._log_tails()) from None
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """End both JVMs and remove the temporary directory (unless ``keep``). Idempotent."""
        self._kill()
        if self.dir is not None and not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        self.port = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):  # last resort; stop() is the way
        with contextlib.suppress(Exception):
            self._kill()

    def __repr__(self) -> str:
        state = self.url if self.port is not None else "stopped"
        return f"<MiniHDFS {state}>"

    # -------------------------------------------------------- internals

    def _configure(self) -> Path:
        nn_rpc, nn_http, dn_xfer, dn_http, dn_ipc = _free_ports(5)
        self.ports = {"namenode_rpc": nn_rpc, "namenode_http": nn_http, "datanode": dn_xfer,
                      "datanode_http": dn_http, "datanode_ipc": dn_ipc}
        self.port = nn_rpc
        d = self.dir
        conf = d / "conf"
        conf.mkdir(exist_ok=True)
        for webapp in ("hdfs", "datanode", "secondary", "static"):  # HttpServer2 looks them up on the classpath
            (conf / "webapps" / webapp).mkdir(parents=True, exist_ok=True)
        (conf / "log4j.properties").write_text(_LOG4J)
        (conf / "core-site.xml").write_text(_site_xml({
            "fs.defaultFS": f"hdfs://{self.host}:{nn_rpc}",
            "hadoop.tmp.dir": str(d / "tmp"),
            "hadoop.security.authentication": "simple",
            "ipc.client.connect.retry.interval": "200",  # the DataNode polls for the NameNode
            "ipc.client.connect.max.retries": "1000",
        }))
        (conf / "hdfs-site.xml").write_text(_site_xml({
            "dfs.namenode.name.dir": (d / "name").as_uri(),
            "dfs.datanode.data.dir": (d / "data").as_uri(),
            "dfs.namenode.rpc-address": f"{self.host}:{nn_rpc}",
            "dfs.namenode.http-address": f"{self.host}:{nn_http}",
            "dfs.namenode.https-address": f"{self.host}:0",
            "dfs.namenode.secondary.http-address": f"{self.host}:0",
            "dfs.namenode.secondary.https-address": f"{self.host}:0",
            "dfs.namenode.backup.address": f"{self.host}:0",
            "dfs.namenode.backup.http-address": f"{self.host}:0",
            "dfs.datanode.address": f"{self.host}:{dn_xfer}",
            "dfs.datanode.http.address": f"{self.host}:{dn_http}",
            "dfs.datanode.https.address": f"{self.host}:0",
            "dfs.datanode.ipc.address": f"{self.host}:{dn_ipc}",
            "dfs.datanode.hostname": self.host,
            "dfs.namenode.datanode.registration.ip-hostname-check": "false",
            "dfs.replication": "1",
            "dfs.permissions.enabled": "false",
            "dfs.webhdfs.enabled": "false",
            "dfs.namenode.safemode.extension": "0",
            "dfs.namenode.safemode.min.datanodes": "0",
            "dfs.heartbeat.interval": "1",
            "dfs.namenode.handler.count": "4",
            "dfs.datanode.handler.count": "4",
            "dfs.namenode.service.handler.count": "2",
            "dfs.datanode.du.reserved": "0",
            "dfs.namenode.resource.du.reserved": "0",
            "dfs.namenode.fs-limits.min-block-size": "0",
            **self.extra_conf,
        }))
        return conf

    def _command(self, java: str, jars: Path, conf: Path, main: str, *args: str) -> list[str]:
        classpath = os.pathsep.join([*(str(p) for p in sorted(jars.glob("*.jar"))), str(conf)])
        return [java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Djava.net.preferIPv4Stack=true", f"-Dhadoop.home.dir={self.dir}",
                f"-Dhadoop.log.dir={self.dir / 'logs'}", "-Dhadoop.security.logger=ERROR,console",
                *self.java_options, "-cp", classpath, main, *args]

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed in _kill
        self._logs.append(log)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HADOOP_", "HDFS_"))}
        # preexec_fn: see _death_signal, which keeps the child's part fork-safe.
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                cwd=self.dir, env=env, start_new_session=True,
                                preexec_fn=_death_signal())  # noqa: PLW1509
        self._procs[name] = proc
        return proc

    def _start_once(self, java: str, jars: Path) -> None:
        for sub in ("name", "data"):  # a retry starts from an empty file system
            shutil.rmtree(self.dir / sub, ignore_errors=True)
        self.log_dir.mkdir(exist_ok=True)
        conf = self._configure()
        nn = "org.apache.hadoop.hdfs.server.namenode.NameNode"
        # The DataNode starts alongside the format: its JVM warms up meanwhile, and it
        # keeps retrying the NameNode's address until that is up.
        self._spawn("datanode", self._command(java, jars, conf, "org.apache.hadoop.hdfs.server.datanode.DataNode"))
        fmt = self._spawn("format", self._command(java, jars, conf, nn, "-format", "-nonInteractive", "-force"))
        try:
            code = fmt.wait(timeout=self.startup_timeout)
        except subprocess.TimeoutExpired:
            raise MiniHDFSError(f"NameNode -format took over {self.startup_timeout:.0f} s:\n"
                                + self._log_tails()) from None
        self._procs.pop("format")
        if code != 0:
            raise MiniHDFSError(f"NameNode -format failed (exit {code}):\n" + self._log_tails())
        self._spawn("namenode", self._command(java, jars, conf, nn))
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Return once a file can be written and read back; raise if a JVM dies or time runs out.

        Each probe runs in a daemon thread: an hdfs-native call has no timeout of its
        own and could wait forever (e.g. on a port that something else answers), so the
        loop keeps watching the JVMs and the clock while it runs.
        """
        deadline = time.monotonic() + self.startup_timeout
        path = f"/.minihdfs-ready-{uuid.uuid4().hex[:8]}"
        last_error: BaseException | None = None
        pending: tuple[threading.Thread, dict] | None = None
        while True:
            self._check_alive()
            if pending is None and _port_open(self.host, self.port):
                box: dict = {}
                thread = threading.Thread(target=self._probe, args=(path, box), name="minihdfs-probe", daemon=True)
                thread.start()
                pending = (thread, box)
            elif pending is None:
                last_error = ConnectionError(f"NameNode RPC port {self.port} not open yet")
            if pending is not None:
                thread, box = pending
                thread.join(0.25)
                if not thread.is_alive():
                    pending = None
                    if "error" not in box:
                        return
                    last_error = box["error"]
            if time.monotonic() > deadline:
                raise MiniHDFSError(f"HDFS not ready after {self.startup_timeout:.0f} s (last client error: "
                                    f"{last_error!r}):\n" + self._log_tails())
            if pending is None:
                time.sleep(0.25)

    def _probe(self, path: str, box: dict) -> None:
        try:
            client = self.fsspec()
            with client.open(path, "wb") as f:  # needs a registered DataNode
                f.write(b"ready")
            with client.open(path, "rb") as f:
                if f.read() != b"ready":
                    raise MiniHDFSError(f"probe file {path} read back wrong")
            client.rm(path)
        except BaseException as exc:  # noqa: BLE001 - not up yet: hdfs-native raises several types
            box["error"] = exc

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                log = self._log_text(name)
                if "BindException" in log or "Address already in use" in log:
                    raise _PortTaken(name)
                raise MiniHDFSError(f"the {name} exited with code {proc.returncode} while starting:\n"
                                    + self._log_tails())

    def _kill(self) -> None:
        procs, self._procs = list(self._procs.values()), {}
        # Signal whole process groups (a JVM may have a `du` or `df` running), but only
        # while the JVM is not reaped yet: until then its pid, which is the group's id,
        # cannot be taken by another process.
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            if proc.returncode is None:
                _wait_exit_unreaped(proc.pid, timeout=10)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)  # a hung JVM, or what is left in its group
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        logs, self._logs = self._logs, []
        for log in logs:
            log.close()

    def _log_text(self, name: str) -> str:
        path = None if self.log_dir is None else self.log_dir / f"{name}.log"
        try:
            return path.read_text(errors="replace") if path else ""
        except OSError:
            return ""

    def _log_tails(self, lines: int = 30) -> str:
        out = []
        for name in ("format", "namenode", "datanode"):
            text = self._log_text(name)
            if text:
                tail = "\n".join(text.splitlines()[-lines:])
                out.append(f"--- {name}.log, last {lines} lines:\n{tail}")
        return "\n".join(out) or "(no JVM log written)"


class _PortTaken(MiniHDFSError):
    pass


def _wait_exit_unreaped(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` s for child ``pid`` to exit, leaving it a zombie (not reaped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def main(argv: list[str] | None = None) -> int:
    """``python tests/minihdfs.py``: start an HDFS, print its URL, wait for Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jars", help="directory of Hadoop jars (default: the cache, filled on first use)")
    parser.add_argument("--heap", default="256m", help="-Xmx of each JVM (default: 256m)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and its logs")
    args = parser.parse_args(argv)
    reason = java_available()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    started = time.monotonic()
    try:
        jars = Path(args.jars) if args.jars else ensure_hadoop_jars()
        hdfs = MiniHDFS(jars, heap=args.heap, keep=args.keep).start()
    except (HadoopJarsError, MiniHDFSError) as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        print(f"HDFS up in {time.monotonic() - started:.1f} s: {hdfs.url}", flush=True)
        print(f"  files and logs: {hdfs.dir}\n  NameNode web UI port {hdfs.ports['namenode_http']}"
              f" (empty pages)\n  Ctrl-C stops it.", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while hdfs.running:
            time.sleep(1)
        print("a JVM exited:\n" + hdfs._log_tails(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        hdfs.stop()


if __name__ == "__main__":
    sys.exit(main())
