"""A real, throw-away single-node Hadoop 3 (HDFS + YARN) on this machine.

Hadoop's own test clusters, MiniDFSCluster and MiniYARNCluster, run a real NameNode,
DataNode, ResourceManager and NodeManager in one JVM (``hadoop/MiniHadoop.java``);
the NodeManager starts containers as real processes. Nothing is built:

- :func:`ensure_jars` has Maven copy ``org.apache.hadoop:hadoop-minicluster`` and its
  dependencies (``hadoop/pom.xml``, about 115 MB) into a per-user cache once;
- :class:`MiniHadoop` starts the JVM in a fresh directory, waits until the client
  configuration is written, and gives what clients need: ``HADOOP_CONF_DIR`` and a
  ``bin/`` with ``yarn`` and ``hdfs`` scripts, so that skein's own Java driver
  (which runs ``yarn classpath --glob``) and a person's ``yarn logs`` work unmodified.

The cluster has log aggregation on (the nodes keep their copy of a finished application's logs
while the cluster lives) and declares ``yarn.io/gpu`` as a countable
resource with ``gpus`` units on the NodeManager (no GPU is used: YARN only counts them).

By hand, for a person who wants to try ``dbn submit`` without a cluster::

    .venv/bin/python tests/minihadoop.py          # prints the exports, Ctrl-C stops it

Environment: ``DBN_HADOOP_JARS`` (a folder of Hadoop jars to use as is),
``XDG_CACHE_HOME`` (the cache is ``$XDG_CACHE_HOME/dbn-yarn/hadoop-VERSION``, under
``~/.cache`` when unset), ``JAVA_HOME``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Self
from xml.sax.saxutils import escape

from leftovers import kill_leftovers, processes_of  # noqa: F401 (processes_of: the tests' too)

HERE = Path(__file__).resolve().parent / "hadoop"
POM = HERE / "pom.xml"
LAUNCHER = HERE / "MiniHadoop.java"
NODE_LAUNCHER = HERE / "MiniNode.java"
HADOOP_VERSION = re.search(r"<hadoop.version>([^<]+)<", POM.read_text()).group(1)  # one place: the pom
#: The older Hadoops the suite also proves a job on (tests/test_hadoop_versions.py): those that users'
#: clusters run (EMR 6.x and Dataproc 2.1/2.2: 3.3.6; EMR 7.x: 3.4.x). Their jars are cached beside
#: :data:`HADOOP_VERSION`'s.
OLDER_VERSIONS = ("3.3.6", "3.4.2")
JARS_ENV = "DBN_HADOOP_JARS"
MIN_JAVA = 17


class HadoopError(RuntimeError):
    """The cluster could not be set up or started; the message says why."""


class ToolMissing(HadoopError):
    """Java or Maven is not installed (tests skip on this, and only on this)."""


# ---------------------------------------------------------------- Java and Maven


def java_executable() -> str | None:
    """``$JAVA_HOME/bin/java`` if present, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def java_home() -> str:
    """The JDK the cluster and its containers run on; raises :class:`ToolMissing` without Java 17+."""
    java = java_executable()
    if java is None:
        raise ToolMissing("no Java: neither $JAVA_HOME/bin/java nor java on PATH (a real Hadoop needs JDK 17+)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    match = re.search(r'version "(\d+)', out.stderr + out.stdout)
    if not match or int(match.group(1)) < MIN_JAVA:
        raise ToolMissing(f"{java} is not Java {MIN_JAVA}+ ({(out.stderr or out.stdout).strip()[:80]})")
    return os.environ.get("JAVA_HOME") or str(Path(java).resolve().parents[1])


def cache_dir(version: str = HADOOP_VERSION) -> Path:
    """Where :func:`ensure_jars` keeps the jars of Hadoop ``version``."""
    from dbn.user_cache import cache_dir as user_cache

    return user_cache(f"hadoop-{version}")


def ensure_jars(version: str = HADOOP_VERSION) -> Path:
    """The folder of Hadoop ``version``'s jars: ``$DBN_HADOOP_JARS`` (for :data:`HADOOP_VERSION`
    only), or the cache, filled by Maven on first use.

    Maven copies into a temporary folder that is renamed into place when complete, so an
    interrupted download never leaves a half-filled cache; a file lock keeps parallel
    sessions from downloading twice. Raises :class:`ToolMissing` without ``mvn`` and
    :class:`HadoopError` (with Maven's output) when the download fails.
    """
    given = os.environ.get(JARS_ENV)
    if given and version == HADOOP_VERSION:
        jars = Path(given).expanduser()
        if not list(jars.glob("hadoop-minicluster-*.jar")):
            raise HadoopError(f"${JARS_ENV}={jars}: holds no hadoop-minicluster-*.jar")
        return jars
    return fetch_jars(POM, cache_dir(version) / "jars", version)


def fetch_jars(pom: Path, target: Path, version: str = HADOOP_VERSION) -> Path:
    """``target``, filled once by Maven with the dependencies of ``pom`` at ``hadoop.version`` =
    ``version`` (see :func:`ensure_jars`)."""
    if (target / ".complete").is_file():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ToolMissing("no Maven (mvn) on PATH: it fetches Hadoop's jars from Maven Central on first use")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").is_file():
            return target
        staged = Path(tempfile.mkdtemp(prefix=".jars-", dir=target.parent))
        started = time.monotonic()
        print(f"fetching the jars of {pom.name} with Maven into {target} (once)", file=sys.stderr)
        older = ["-Dolder.hadoop"] if version in OLDER_VERSIONS else []  # the pom's profile for them
        proc = subprocess.run([mvn, "-B", "-q", "-f", str(pom), "dependency:copy-dependencies", *older,
                               f"-Dhadoop.version={version}", f"-DoutputDirectory={staged}"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(staged, ignore_errors=True)
            raise HadoopError(f"Maven could not fetch the jars of {pom} (is Maven Central "
                              f"reachable?):\n" + (proc.stdout + proc.stderr)[-3000:])
        size = sum(p.stat().st_size for p in staged.glob("*.jar"))
        (staged / ".complete").write_text(f"{len(list(staged.glob('*.jar')))} jars, {size} bytes, "
                                          f"{time.monotonic() - started:.0f} s\n")
        shutil.rmtree(target, ignore_errors=True)
        staged.rename(target)
    return target


# ---------------------------------------------------------------- the cluster


#: Starts with fresh ports when one was taken before the JVM bound it (the picks are only free "now").
PORT_TRIES = 3


class _PortTaken(Exception):
    """A port picked for the cluster was taken before the JVM bound it."""


def _free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 now (held together while picking)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def _site_xml(properties: dict[str, object]) -> str:
    body = "".join(f"  <property><name>{escape(k)}</name><value>{escape(str(v))}</value></property>\n"
                   for k, v in properties.items())
    return f'<?xml version="1.0"?>\n<configuration>\n{body}</configuration>\n'


_LOG4J = """\
log4j.rootLogger=WARN, console
log4j.appender.console=org.apache.log4j.ConsoleAppender
log4j.appender.console.target=System.err
log4j.appender.console.layout=org.apache.log4j.PatternLayout
log4j.appender.console.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n
log4j.logger.org.apache.hadoop.util.NativeCodeLoader=ERROR
"""

# `yarn SUBCOMMAND` and `hdfs SUBCOMMAND` -> (main class, whether it takes the subcommand as its first argument),
# as Hadoop's own scripts map them; `yarn classpath` is answered by the script itself (skein's driver calls it).
_COMMANDS = {
    "yarn": {"application": ("org.apache.hadoop.yarn.client.cli.ApplicationCLI", True),
             "applicationattempt": ("org.apache.hadoop.yarn.client.cli.ApplicationCLI", True),
             "container": ("org.apache.hadoop.yarn.client.cli.ApplicationCLI", True),
             "node": ("org.apache.hadoop.yarn.client.cli.NodeCLI", False),
             "rmadmin": ("org.apache.hadoop.yarn.client.cli.RMAdminCLI", False),
             "logs": ("org.apache.hadoop.yarn.client.cli.LogsCLI", False)},
    "hdfs": {"dfs": ("org.apache.hadoop.fs.FsShell", False),
             "fsck": ("org.apache.hadoop.hdfs.tools.DFSck", False),
             "getconf": ("org.apache.hadoop.hdfs.tools.GetConf", False),
             "haadmin": ("org.apache.hadoop.hdfs.tools.DFSHAAdmin", False),
             "fetchdt": ("org.apache.hadoop.hdfs.tools.DelegationTokenFetcher", False)},
}


def _script(name: str, java: str, conf: Path, jars: Path, java_options: list[str] = ()) -> str:
    """The ``bin/NAME`` script: ``java JAVA_OPTIONS -cp CLASSPATH`` and the subcommand's main class; the
    classpath is the configuration folder, ``$HADOOP_CONF_DIR`` where set (as Hadoop's own scripts do),
    else ``conf``, then the jars."""
    classpath = f"${{HADOOP_CONF_DIR:-{conf}}}:{jars}/*"
    cases = "".join(f'  {sub}) main={main}; {"" if keep else "shift; "};;\n'
                    for sub, (main, keep) in _COMMANDS[name].items())
    return (f"#!/bin/sh\n# `{name}` of a MiniHadoop: the subcommands below, as Hadoop's own script runs them.\n"
            f'CLASSPATH="{classpath}"\n'
            + ('if [ "$1" = classpath ]; then echo "$CLASSPATH"; exit 0; fi\n' if name == "yarn" else "")
            + f'case "$1" in\n{cases}'
            f'  *) echo "{name} $1: not available in this MiniHadoop (it has: {" ".join(_COMMANDS[name])})" >&2;'
            f' exit 1;;\nesac\nexec "{java}" {"".join(shlex.quote(o) + " " for o in java_options)}-cp "$CLASSPATH" '
            f'"$main" "$@"\n')


#: The ResourceManager's exclude file (yarn.resourcemanager.nodes.exclude-path), in the configuration folder.
EXCLUDE_FILE = "excluded-nodes"
#: How long a NodeManager keeps what it would delete (a finished application's logs and files): longer
#: than a suite runs.
KEEP_NODE_FILES_S = 4 * 3600
#: Seconds after which a silent NodeManager is lost to the ResourceManager, and (about) a silent
#: DataNode dead to the NameNode, on a multi-node cluster (production: 10 minutes each).
NODE_EXPIRY_S = 15
#: What every Java of a test cluster runs with (the cluster's JVMs, its tools, skein's driver, and in
#: containers skein's application master): the quick compiler only and the serial collector. A test
#: cluster mostly idles and each tool or master lives seconds, so the optimising compiler's work never
#: pays back; measured 2026-12-07 (the 2-core VM): a cluster's start 28 -> 14 s of CPU, idle 7.5 -> 3.8 %
#: of a core.
LEAN_JAVA = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-XX:CICompilerCount=1")
#: What a Hadoop before 3.5 needs on Java 17 besides: its web apps' Guice makes classes with cglib by
#: reflection into java.lang, which Java 16+ refuses unless opened (3.5 runs without).
OLDER_HADOOP_ON_JAVA17 = ("--add-opens=java.base/java.lang=ALL-UNNAMED",)


class MiniHadoop:
    """HDFS + YARN in a fresh directory; ``start()``/``stop()`` or a context manager.

    ``nodes``: 1 runs a DataNode and a NodeManager in the cluster's JVM, on 127.0.0.1; more run
    each node (a DataNode and a NodeManager) in a JVM of its own on an address of its own,
    ``127.0.0.2`` and on (:attr:`node_hosts`, ``hadoop/MiniNode.java``), with blocks replicated
    twice: :meth:`kill_node`, :meth:`stop_nodemanager` and :meth:`stop_datanode` take one away.
    ``gpus``: ``yarn.io/gpu`` units the (first) NodeManager declares, the others none;
    ``memory_mb``/``vcores``: each NodeManager's capacity for containers; ``conf``: more Hadoop
    settings; ``base_dir``: parent of the cluster's directory; ``keep``: leave that directory (data
    and logs) after ``stop()``; ``version``: the Hadoop release (:data:`HADOOP_VERSION`, or one of
    :data:`OLDER_VERSIONS`), whose jars the cluster, its tools and its containers run;
    ``name_service``: HDFS highly available under that name (one node only): two NameNodes, ``nn1``
    active and ``nn2`` standby, reached as ``hdfs://NAME`` (:attr:`url`); :meth:`fail_over` moves the
    active role to the standby and stops the old active (once).
    """

    def __init__(self, *, nodes: int = 1, gpus: int = 2, memory_mb: int = 8192, vcores: int = 8, heap: str = "1g",
                 conf: dict[str, object] | None = None, base_dir: str | os.PathLike | None = None,
                 keep: bool = False, startup_timeout: float = 180.0, version: str = HADOOP_VERSION,
                 name_service: str | None = None):
        if nodes < 1:
            raise ValueError(f"nodes={nodes}: a cluster has at least one node")
        if name_service is not None and (nodes != 1 or not re.fullmatch(r"[a-z][a-z0-9-]*", name_service)):
            raise ValueError(f"name_service={name_service!r}: a lower-case name, on a cluster of one node")
        self.name_service = name_service
        if version not in (HADOOP_VERSION, *OLDER_VERSIONS):
            raise ValueError(f"version={version!r}: the suite's Hadoops are {HADOOP_VERSION}, {', '.join(OLDER_VERSIONS)}")
        self.version = version
        self.nodes, self.gpus, self.memory_mb, self.vcores, self.heap = nodes, gpus, memory_mb, vcores, heap
        self.extra_conf = dict(conf or {})
        self.base_dir, self.keep, self.startup_timeout = base_dir, keep, startup_timeout
        self.dir: Path | None = None
        self.url = self.rm_address = self.rm_web = self.nn_http = ""
        self._proc: subprocess.Popen | None = None
        self._nodes: list[subprocess.Popen | None] = []

    # -------------------------------------------------------- what clients use

    @property
    def node_hosts(self) -> list[str]:
        """Each node's address, which is also its host name to HDFS and YARN."""
        return ["127.0.0.1"] if self.nodes == 1 else [f"127.0.0.{2 + k}" for k in range(self.nodes)]

    @property
    def conf_dir(self) -> Path:
        return self.dir / "conf"

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def log_file(self) -> Path:
        return self.dir / "minihadoop.log"

    def env(self) -> dict[str, str]:
        """Environment variables a client needs: HADOOP_CONF_DIR, JAVA_HOME, PATH with ``yarn``/``hdfs``,
        and ``SKEIN_DRIVER_JAVA_OPTIONS`` (the cluster's Java options for skein's driver)."""
        return {"HADOOP_CONF_DIR": str(self.conf_dir), "JAVA_HOME": self._java_home,
                "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                "SKEIN_DRIVER_JAVA_OPTIONS": " ".join(self._java_options())}

    def uri(self, path: str) -> str:
        """The full ``hdfs://`` URI of absolute ``path``."""
        return self.url + "/" + path.lstrip("/")

    def fsspec(self):
        """An fsspec file system (hdfs-native's, no JVM) on this HDFS (a name service's NameNodes found
        in the cluster's configuration)."""
        from hdfs_native.fsspec import HdfsFileSystem

        if self.name_service:  # hdfs-native's configuration: the service's keys of the cluster's own
            from iterreduce.storage.hadoopconf import SITE_FILES, site_settings

            settings = site_settings(self.conf_dir, SITE_FILES)
            service = {k: v for k, v in settings.items() if k == "dfs.nameservices" or self.name_service in k}
            return HdfsFileSystem(host=self.name_service, skip_instance_cache=True, **service)
        host, port = self.url.removeprefix("hdfs://").split(":")
        return HdfsFileSystem(host=host, port=int(port), skip_instance_cache=True)

    def fs(self):
        """A ``pyarrow.fs.FileSystem`` on this HDFS; paths are absolute."""
        import pyarrow.fs as pafs

        return pafs.PyFileSystem(pafs.FSSpecHandler(self.fsspec()))

    def run(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run this cluster's ``yarn`` or ``hdfs`` script (e.g. ``run("hdfs", "dfs", "-ls", "/")``)."""
        return subprocess.run([str(self.bin_dir / tool), *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env()})

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -------------------------------------------------------- life cycle

    def start(self) -> Self:
        """Start HDFS and YARN; returns once the NodeManager has registered and the configuration is written."""
        if self._proc is not None:
            raise HadoopError("MiniHadoop already started")
        self._java_home = java_home()
        jars = ensure_jars(self.version)
        for attempt in range(1, PORT_TRIES + 1):
            self.dir = Path(tempfile.mkdtemp(prefix="minihadoop-", dir=self.base_dir))
            try:
                self._start(jars)
                return self
            except _PortTaken:  # another process took a port between our pick and the JVM's bind
                self.stop()
                if attempt == PORT_TRIES:
                    raise HadoopError(f"MiniHadoop could not bind its ports in {PORT_TRIES} tries") from None
            except BaseException:
                self.stop()
                raise
        return self

    def kill_node(self, k: int) -> None:
        """Lose node ``k`` as a machine is lost: SIGKILL its JVM (DataNode and NodeManager) and every
        container process it started. The ResourceManager and NameNode notice once it stays silent
        (:data:`NODE_EXPIRY_S`)."""
        proc = self._node(k)
        proc.kill()
        proc.wait()
        kill_leftovers(self.dir / "nodes" / str(k))
        self._nodes[k] = None

    def fail_over(self) -> None:
        """HDFS's active NameNode fails over, as an administrator's ``hdfs haadmin -failover`` followed by
        the old active's loss: it steps down to standby, the standby becomes active, then the old one
        is stopped. Returns when done. Once a cluster: then no standby is left (:class:`HadoopError`)."""
        if not self.name_service:
            raise HadoopError("fail_over: this cluster's HDFS is not highly available (name_service)")
        said = re.compile(r"^MiniHadoop: fail over: (done|failed: .*)$", re.MULTILINE)
        before = len(said.findall(self.log_file.read_text(errors="replace")))
        self._proc.stdin.write(b"fail over\n")
        self._proc.stdin.flush()
        deadline = time.monotonic() + 180
        while len(answers := said.findall(self.log_file.read_text(errors="replace"))) == before:
            if time.monotonic() > deadline or self._proc.poll() is not None:
                raise HadoopError(f"HDFS did not fail over in 180 s:\n{self._tail()}")
            time.sleep(0.2)
        if answers[-1] != "done":
            raise HadoopError(f"HDFS could not fail over: {answers[-1]}\n{self._tail()}")

    def stop_nodemanager(self, k: int) -> None:
        """Stop node ``k``'s NodeManager (its containers go with it; it leaves the cluster)."""
        self._command(k, "stop nodemanager")

    def stop_datanode(self, k: int) -> None:
        """Stop node ``k``'s DataNode (its blocks' other replicas remain)."""
        self._command(k, "stop datanode")

    def start_nodemanager(self, k: int) -> None:
        """Start node ``k``'s stopped NodeManager again (a new one: it registers anew)."""
        self._command(k, "start nodemanager")

    def start_datanode(self, k: int) -> None:
        """Start node ``k``'s stopped DataNode again, with the blocks it had."""
        self._command(k, "start datanode")

    def decommission(self, k: int, timeout_s: int = 600) -> None:
        """Drain node ``k`` as an administrator does (graceful decommission): its host in the
        ResourceManager's exclude file, then ``yarn rmadmin -refreshNodes -g TIMEOUT -server``. The
        node is DECOMMISSIONING: no new containers; decommissioned once its containers and the
        applications that ran there have ended, or at the timeout (YARN kills what is left)."""
        (self.conf_dir / EXCLUDE_FILE).write_text(self.node_hosts[k] + "\n")
        self._refresh_nodes("-g", str(timeout_s), "-server")

    def recommission(self, k: int, timeout: float = 60.0) -> None:
        """Take node ``k`` back: the exclude file emptied and the nodes refreshed. A node still
        DECOMMISSIONING runs again at once; a decommissioned one's NodeManager was shut down by the
        ResourceManager, so it is started again. Returns once every node is live."""
        (self.conf_dir / EXCLUDE_FILE).write_text("")
        self._refresh_nodes()
        if self.node_states().get(self.node_hosts[k]) != "RUNNING":
            self.stop_nodemanager(k)  # the node's handle on the NodeManager the ResourceManager shut down
            self.start_nodemanager(k)
        self.wait_nodes(timeout)

    def node_states(self) -> dict[str, str]:
        """Each NodeManager host's state at the ResourceManager (RUNNING, DECOMMISSIONING, ...)."""
        import json
        import urllib.request

        states = "NEW,RUNNING,UNHEALTHY,DECOMMISSIONING,DECOMMISSIONED,LOST,REBOOTED,SHUTDOWN"
        with urllib.request.urlopen(f"http://{self.rm_web}/ws/v1/cluster/nodes?states={states}", timeout=10) as r:
            nodes = (json.load(r).get("nodes") or {}).get("node", [])
        # A NodeManager started again on a host is a new node (a new port): the old one stays listed,
        # SHUTDOWN or LOST, beside it, in no fixed order. The host's state is its newest NodeManager's.
        gone = ("SHUTDOWN", "LOST")
        found: dict[str, str] = {}
        for node in sorted(nodes, key=lambda n: n["state"] not in gone):  # the gone first, the live override
            found[node["nodeHostName"]] = node["state"]
        return found

    def _refresh_nodes(self, *args: str) -> None:
        done = self.run("yarn", "rmadmin", "-refreshNodes", *args)
        if done.returncode != 0:
            raise HadoopError(f"yarn rmadmin -refreshNodes {' '.join(args)}: exit {done.returncode}: "
                              f"{done.stderr[-2000:]}")

    def wait_nodes(self, timeout: float = 60.0) -> None:
        """Wait until YARN and HDFS count every node live again."""
        hosts, deadline = sorted(self.node_hosts), time.monotonic() + timeout
        while self._live_or_why() != str((hosts, hosts)):
            if time.monotonic() > deadline:
                raise HadoopError(f"nodes not all live after {timeout:.0f} s: {self._live_or_why()}")
            time.sleep(0.5)

    def live_nodes(self) -> tuple[list[str], list[str]]:
        """The hosts of the NodeManagers YARN runs containers on and of the DataNodes HDFS counts live."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"http://{self.rm_web}/ws/v1/cluster/nodes?states=RUNNING", timeout=10) as r:
            yarn = [n["nodeHostName"] for n in (json.load(r).get("nodes") or {}).get("node", [])]
        query = "Hadoop:service=NameNode,name=NameNodeInfo"
        with urllib.request.urlopen(f"http://{self.nn_http}/jmx?qry={query}", timeout=10) as r:
            live = json.loads(json.load(r)["beans"][0]["LiveNodes"])
        hdfs = [info["infoAddr"].rsplit(":", 1)[0] for info in live.values()]
        return sorted(yarn), sorted(hdfs)

    def stop(self) -> None:
        """Stop the JVM (it stops its containers first) and remove the directory unless ``keep``. Idempotent."""
        for k, node in enumerate(self._nodes):
            if node is not None and node.poll() is None:
                with contextlib.suppress(OSError):
                    node.stdin.close()  # end of input: the node stops its NodeManager and DataNode
        for node in self._nodes:
            if node is not None:
                try:
                    node.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    node.kill()
                    node.wait()
        self._nodes = []
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()  # the JVM's shutdown hook stops YARN (and its containers), then HDFS
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            if self._proc.poll() is None:
                try:
                    self._proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        self._after_stop()
        if self.dir is not None:
            kill_leftovers(self.dir)
            if not self.keep:
                shutil.rmtree(self.dir, ignore_errors=True)
                self.dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<MiniHadoop {self.version} {self.url or 'stopped'} RM {self.rm_address or '-'}>"

    # -------------------------------------------------------- internals

    def _java_options(self) -> list[str]:
        """The options of every Java the cluster runs (:data:`LEAN_JAVA`, and what an older Hadoop needs;
        a subclass adds its own)."""
        return [*LEAN_JAVA, *(OLDER_HADOOP_ON_JAVA17 if self.version in OLDER_VERSIONS else ())]

    def _container_env(self) -> dict[str, str]:
        """What the NodeManagers set in every container (``yarn.nodemanager.admin-env``): YARN's default,
        and the cluster's Java options for the Java there (as clusters set ``JAVA_TOOL_OPTIONS``)."""
        return {"MALLOC_ARENA_MAX": "$MALLOC_ARENA_MAX", "JAVA_TOOL_OPTIONS": " ".join(self._java_options())}

    def _after_stop(self) -> None:
        """Called once the cluster's JVM has stopped, before the directory goes (a subclass's hook)."""

    def _settings(self, jars: Path) -> dict[str, object]:
        # Fixed, free ports: with ephemeral ones MiniYARNCluster hands out tracking URLs with port 0.
        ports = dict(zip(["yarn.resourcemanager.address", "yarn.resourcemanager.scheduler.address",
                          "yarn.resourcemanager.resource-tracker.address", "yarn.resourcemanager.admin.address",
                          "yarn.resourcemanager.webapp.address", "yarn.nodemanager.localizer.address",
                          "yarn.nodemanager.webapp.address"], _free_ports(7)))
        return {
            "yarn.minicluster.fixed.ports": "true",
            **{key: f"localhost:{port}" for key, port in ports.items()},
            "dfs.replication": min(2, self.nodes),
            "yarn.minicluster.yarn.nodemanager.resource.memory-mb": self.memory_mb,  # MiniYARNCluster's own key
            "yarn.nodemanager.resource.cpu-vcores": self.vcores,
            "yarn.scheduler.minimum-allocation-mb": 128,
            "yarn.nodemanager.vmem-check-enabled": "false",  # virtual memory means little on 64-bit Linux
            "yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage": 100,
            "yarn.log-aggregation-enable": "true",
            # Aggregation deletes a finished application's container logs from its nodes a moment
            # after its end, where the tests read them (Yarn.node_logs): keep them as long as a
            # cluster of the suite lives (the folder goes with the cluster).
            "yarn.nodemanager.delete.debug-delay-sec": KEEP_NODE_FILES_S,
            "yarn.nodemanager.admin-env": ",".join(f"{k}={v}" for k, v in self._container_env().items()),
            # The hosts an administrator takes out (decommission): none until decommission() names one.
            "yarn.resourcemanager.nodes.exclude-path": str(self.conf_dir / EXCLUDE_FILE),
            # The minicluster jar has no capacity-scheduler.xml: one queue, and GPUs counted by the scheduler.
            "yarn.scheduler.capacity.root.queues": "default",
            "yarn.scheduler.capacity.root.default.capacity": 100,
            "yarn.scheduler.capacity.maximum-am-resource-percent": 0.5,
            "yarn.scheduler.capacity.resource-calculator":
                "org.apache.hadoop.yarn.util.resource.DominantResourceCalculator",
            # What skein's application master and our containers run Java with.
            "yarn.application.classpath": f"{self.conf_dir},{jars}/*",
            **(self._node_settings() if self.nodes > 1 else {}),
            **({"minihadoop.ha.nameservice": self.name_service} if self.name_service else {}),
            **self.extra_conf,
        }

    def _node_settings(self) -> dict[str, object]:
        """The NameNode's and ResourceManager's settings for nodes in JVMs of their own."""
        return {
            "minihadoop.nodes.in.process": 0,
            # A rack a node (HDFS and YARN read the same table): YARN's relaxed requests then stay on
            # their node for a while, where one rack would let them go to any node after a few heartbeats.
            "net.topology.node.switch.mapping.impl": "org.apache.hadoop.net.TableMapping",
            # and off-rack only after as many missed chances as rack-local (else after one, on a small cluster)
            "yarn.scheduler.capacity.rack-locality-additional-delay": 0,
            "net.topology.table.file.name": str(self.dir / "conf" / "racks.txt"),
            # The ResourceManager's own store on local disk: HDFS has no DataNode yet when it starts.
            "yarn.node-attribute.fs-store.root-dir": f"file://{self.dir}/cluster/nodeattributes",
            # The nodes' addresses have no names: hosts are their IPs, on both sides.
            "dfs.namenode.datanode.registration.ip-hostname-check": "false",
            # A lost node is noticed within seconds (a DataNode is dead after 2 rechecks + 10 heartbeats).
            "yarn.nm.liveness-monitor.expiry-interval-ms": NODE_EXPIRY_S * 1000,
            "dfs.heartbeat.interval": 1,
            "dfs.namenode.heartbeat.recheck-interval": (NODE_EXPIRY_S - 10) * 1000 // 2,
        }

    def _start(self, jars: Path) -> None:
        conf, bin_dir = self.conf_dir, self.bin_dir
        conf.mkdir()
        bin_dir.mkdir()
        (conf / "racks.txt").write_text("".join(f"{host} /rack{k}\n" for k, host in enumerate(self.node_hosts)))
        # Read by every JVM that has the conf folder on its classpath: the cluster, skein's driver and
        # application master, and the scripts' tools (so all know the GPU resource type).
        (conf / "resource-types.xml").write_text(_site_xml({"yarn.resource-types": "yarn.io/gpu"}))
        (conf / "node-resources.xml").write_text(
            _site_xml({"yarn.nodemanager.resource-type.yarn.io/gpu": self.gpus}))
        (conf / "log4j.properties").write_text(_LOG4J)
        (conf / EXCLUDE_FILE).write_text("")
        java = str(Path(self._java_home) / "bin" / "java")
        for tool in _COMMANDS:
            (bin_dir / tool).write_text(_script(tool, java, conf, jars, self._java_options()))
            (bin_dir / tool).chmod(0o755)
        work = self.dir / "cluster"
        work.mkdir()
        (work / "log4j.properties").write_text(_LOG4J.replace("WARN, console", "INFO, console"))
        command = [java, f"-Xmx{self.heap}", "-Dlog4j.configuration=file:" + str(work / "log4j.properties"),
                   *self._java_options(),
                   "-cp", self._cluster_classpath(jars), str(LAUNCHER), str(conf),
                   *(f"{k}={v}" for k, v in self._settings(jars).items())]
        env = {**os.environ, **self.env()}
        with open(self.log_file, "wb") as log:
            # stdin is a pipe nobody writes to: when this process dies, however it dies, the JVM reads
            # end-of-file and stops the cluster. (Not PR_SET_PDEATHSIG in a preexec_fn: a fork that runs
            # Python code in a threaded process can deadlock, as fsspec's at-fork handler did.)
            self._proc = subprocess.Popen(command, cwd=work, stdin=subprocess.PIPE, stdout=log,
                                          stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_timeout
        ready = conf / "ready"
        # The JVM creates the file, then writes it: wait for its four addresses, not for the file alone.
        while len(ready.read_text().split() if ready.is_file() else ()) < 4:
            if b"java.net.BindException" in self.log_file.read_bytes():  # the JVM does not exit on it
                raise _PortTaken()
            if self._proc.poll() is not None:
                raise HadoopError(f"the MiniHadoop JVM exited with {self._proc.returncode}:\n{self._tail()}")
            if time.monotonic() > deadline:
                raise HadoopError(f"MiniHadoop not up after {self.startup_timeout:.0f} s:\n{self._tail()}")
            time.sleep(0.5)
        self.url, self.rm_address, self.rm_web, self.nn_http = ready.read_text().split()[:4]
        if self.nodes > 1:
            self._start_nodes(java, jars, deadline)

    def _start_nodes(self, java: str, jars: Path, deadline: float) -> None:
        """Start one JVM a node (``hadoop/MiniNode.java``) and wait until YARN and HDFS count them all."""
        for k, host in enumerate(self.node_hosts):
            node_dir = self.dir / "nodes" / str(k)
            (node_dir / "conf").mkdir(parents=True)
            (node_dir / "conf" / "node-resources.xml").write_text(
                _site_xml({"yarn.nodemanager.resource-type.yarn.io/gpu": self.gpus if k == 0 else 0}))
            settings = {"yarn.nodemanager.resource.memory-mb": self.memory_mb,
                        "yarn.nodemanager.resource.cpu-vcores": self.vcores}
            command = [java, "-Xmx384m", "-Dlog4j.configuration=file:" + str(self.dir / "cluster" / "log4j.properties"),
                       *self._java_options(), "-cp", f"{node_dir / 'conf'}:{self._cluster_classpath(jars)}",
                       str(NODE_LAUNCHER), host, str(node_dir), *(f"{key}={v}" for key, v in settings.items())]
            with open(node_dir / "node.log", "wb") as log:
                self._nodes.append(subprocess.Popen(command, cwd=node_dir, stdin=subprocess.PIPE, stdout=log,
                                                    stderr=subprocess.STDOUT, env={**os.environ, **self.env()}))
        hosts = sorted(self.node_hosts)
        while True:
            for k, node in enumerate(self._nodes):
                if node.poll() is not None:
                    log = (self.dir / "nodes" / str(k) / "node.log").read_text(errors="replace")
                    raise HadoopError(f"node {k} ({self.node_hosts[k]}) exited with {node.returncode}:\n{log[-3000:]}")
            with contextlib.suppress(OSError, ValueError, KeyError):
                if self.live_nodes() == (hosts, hosts):
                    return
            if time.monotonic() > deadline:
                raise HadoopError(f"the {self.nodes} nodes not all up after {self.startup_timeout:.0f} s "
                                  f"(YARN's and HDFS's live nodes: {self._live_or_why()})")
            time.sleep(0.5)

    def _live_or_why(self) -> str:
        try:
            return str(self.live_nodes())
        except (OSError, ValueError, KeyError) as exc:
            return f"unknown: {exc}"

    def _node(self, k: int) -> subprocess.Popen:
        if not 0 <= k < len(self._nodes) or self._nodes[k] is None:
            raise HadoopError(f"no running node {k} (the cluster has {self.nodes})")
        return self._nodes[k]

    def _command(self, k: int, line: str) -> None:
        """Send node ``k`` a command and wait until it says it is done."""
        proc, log = self._node(k), self.dir / "nodes" / str(k) / "node.log"
        done = f"MiniNode {self.node_hosts[k]}: {line}: done"
        proc.stdin.write(f"{line}\n".encode())
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while done not in log.read_text(errors="replace"):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise HadoopError(f"node {k} did not {line} (its log: {log})")
            time.sleep(0.2)

    def _cluster_classpath(self, jars: Path) -> str:
        """The cluster JVM's classpath: the configuration folder, then Hadoop's jars."""
        return f"{self.conf_dir}:{jars}/*"

    def _tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            text = self.log_file.read_text(errors="replace").splitlines()
            errors = [line for line in text if "ERROR" in line or "Exception" in line][-10:]
            return "\n".join(errors + ["..."] + text[-lines:])
        return "(no log)"


def main(argv: list[str] | None = None) -> int:
    """``python tests/minihadoop.py``: start the cluster, print how to use it, run until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1, help="nodes, each on an address of its own (default 1)")
    parser.add_argument("--gpus", type=int, default=2, help="yarn.io/gpu units the first node declares (default 2)")
    parser.add_argument("--memory-mb", type=int, default=8192, help="NodeManager memory for containers")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory (data, logs)")
    parser.add_argument("--hadoop", default=HADOOP_VERSION, choices=(HADOOP_VERSION, *OLDER_VERSIONS),
                        help=f"the Hadoop release (default {HADOOP_VERSION})")
    parser.add_argument("--fetch-jars", action="store_true",
                        help="only fetch every suite Hadoop's jars into the cache (bootstrap.sh test), then exit")
    args = parser.parse_args(argv)
    if args.fetch_jars:
        try:
            for version in (HADOOP_VERSION, *OLDER_VERSIONS):
                print(ensure_jars(version))
        except HadoopError as exc:
            print(f"minihadoop: {exc}", file=sys.stderr)
            return 1
        return 0
    started = time.monotonic()
    try:
        cluster = MiniHadoop(nodes=args.nodes, gpus=args.gpus, memory_mb=args.memory_mb, keep=args.keep,
                             version=args.hadoop).start()
    except HadoopError as exc:
        print(f"minihadoop: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        env = cluster.env()
        print(f"Hadoop {cluster.version} up in {time.monotonic() - started:.0f} s: HDFS {cluster.url}, "
              f"ResourceManager {cluster.rm_address} (web http://{cluster.rm_web})\nIn another shell:\n"
              f"  export HADOOP_CONF_DIR={env['HADOOP_CONF_DIR']} JAVA_HOME={env['JAVA_HOME']} "
              f"PATH={cluster.bin_dir}:$PATH\n"
              f"  .venv/bin/dbn submit examples/yarn.toml --python \"$PWD/.venv/bin/python\" --workers 2 "
              f"--worker-memory '1 GiB' --set output.dir={cluster.uri('/user/me/run')} --set data.limit=6000 "
              f"--set model.pretrain_epochs=2 --set model.finetune_epochs=2 --wait\n"
              f"Logs: {cluster.log_file}. Ctrl-C stops it.", flush=True)
        while cluster.running:
            time.sleep(1)
        print(f"the cluster's JVM exited:\n{cluster._tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
