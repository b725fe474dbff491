"""Workers leave a node that is being decommissioned, before it goes.

An administrator drains a node with ``yarn rmadmin -refreshNodes -g SECONDS`` (the node in the
ResourceManager's exclude file): the node is DECOMMISSIONING, gets no new containers, and is
decommissioned once its containers have ended, or at the timeout, when YARN kills those left.
skein's application master hears of the new state in its heartbeat but passes nothing on, so the
:class:`Drainer`, in the job's application master, asks the ResourceManager itself every
``interval`` seconds (Hadoop's own ``yarn node -list -states DECOMMISSIONING``, run with the
application master's credentials, in which skein ships a ResourceManager delegation token). Each
worker on such a node is drained (:meth:`Master.drain <iterreduce.master.master.Master.drain>`): its shards
go to the other workers at the next step's start, it retires (exit 0, nothing counted), and the
keeper asks for a container on any node for its slot, which YARN places on another node; the new
worker takes the slot's shards back at the following step. The model stays the same.
"""

from __future__ import annotations

import logging
import os
import subprocess

from ...storage import hadoopconf
from .appspec import DECOMMISSION_CHECK_VAR, WORKER_SERVICE
from .keeper import held_slots
from .watcher import Watcher

log = logging.getLogger("iterreduce.yarn")

#: Hadoop's ``yarn node`` tool, and how long one run may take.
NODE_CLI = "org.apache.hadoop.yarn.client.cli.NodeCLI"
LIST_TIMEOUT_S = 60.0
#: A small, quick JVM for it (it shares the application master's container): about 1.3 s of CPU
#: and 105 MB a run, against 3.5 s and 112 MB with the JVM's defaults (benchmarks/RESULTS.md).
NODE_CLI_OPTIONS = ("-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
#: The node state of a node being drained (Hadoop's NodeState).
DECOMMISSIONING = "DECOMMISSIONING"


def parse_node_list(text: str) -> set[str]:
    """The hosts of the DECOMMISSIONING nodes in ``yarn node -list`` output (rows of Node-Id
    ``host:port``, Node-State, ...)."""
    hosts = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] == DECOMMISSIONING and ":" in fields[0]:
            hosts.add(fields[0].rsplit(":", 1)[0])
    return hosts


def decommissioning_hosts(token_file: str | None = None) -> set[str]:
    """The hosts the ResourceManager is decommissioning now, by Hadoop's ``yarn node`` tool on this
    container's classpath; ``token_file``: the credentials to run it with (the container's own where
    None). Raises RuntimeError saying why when it cannot tell."""
    command = hadoopconf.java_tool(NODE_CLI, NODE_CLI_OPTIONS)
    if command is None:
        raise RuntimeError("no java (JAVA_HOME) or no Hadoop classpath (yarn.application.classpath) here")
    env = {**os.environ, **({"HADOOP_TOKEN_FILE_LOCATION": token_file} if token_file else {})}
    done = subprocess.run([*command, "-list", "-states", DECOMMISSIONING], capture_output=True, text=True,
                          timeout=LIST_TIMEOUT_S, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"`yarn node -list` exit {done.returncode}: "
                           f"{hadoopconf.tool_output_tail(done.stdout, done.stderr)}")
    return parse_node_list(done.stdout)


class Drainer(Watcher):
    """Drains, through ``master`` (its ``drain(name, why)``), each worker of ``app`` (a skein
    application client) running on a host that ``hosts()`` names (the decommissioning ones),
    every ``interval`` seconds (:meth:`start`) or once (:meth:`check`). ``am_host``: the
    application master's own host, which it cannot leave (it says so, once)."""

    name, what = "drain-nodes", "look for nodes being decommissioned"

    def __init__(self, app, master, interval: float, hosts=decommissioning_hosts, am_host: str = ""):
        super().__init__(interval)
        self.app, self.master, self.hosts, self.am_host = app, master, hosts, am_host
        self.drained: dict[str, str] = {}  # container id -> its host, once its worker was drained
        self._failing = self._looked = False
        self._told_am = False

    @classmethod
    def from_container(cls, app, master, token_file: str | None) -> Drainer | None:
        """The drainer of this application master, looking every ``$ITERREDUCE_DECOMMISSION_CHECK`` seconds (None
        where that is 0), with the credentials of ``token_file`` (those the container started with:
        skein's ResourceManager token is in them)."""
        raw = os.environ.get(DECOMMISSION_CHECK_VAR, "")
        try:
            interval = float(raw or 0)
        except ValueError:
            log.warning("%s=%r is not a number of seconds: no look for nodes being decommissioned",
                        DECOMMISSION_CHECK_VAR, raw)
            return None
        if interval <= 0:
            return None
        if hadoopconf.java_tool(NODE_CLI) is None:
            log.warning("no java or Hadoop classpath in the application master's container: workers on a node "
                        "being decommissioned stay until YARN ends them")
            return None
        return cls(app, master, interval, hosts=lambda: decommissioning_hosts(token_file),
                   am_host=os.environ.get("NM_HOST", ""))

    def check(self) -> list[str]:
        """Drain the workers on the nodes being decommissioned now; returns their names."""
        try:
            hosts = self.hosts()
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            if not self._failing:  # once, until a look succeeds: the next looks would say the same
                log.warning("cannot tell which nodes are being decommissioned: %s", exc)
            self._failing = True
            return []
        if self._failing or not self._looked:  # the first answer, and the first after failures: it works
            log.info("nodes being decommissioned: %s (a look every %g s)", ", ".join(sorted(hosts)) or "none",
                     self.poll)
        self._failing, self._looked = False, True
        if self.am_host in hosts and not self._told_am:
            self._told_am = True
            log.warning("the application master's node %s is being decommissioned: the job goes on there until "
                        "YARN ends it, and the next attempt resumes elsewhere", self.am_host)
        if not hosts:
            return []
        names = {container: name for name, container in held_slots(self.app).values()}
        drained = []
        for container in self.app.get_containers(states=["running"]):
            host = (container.yarn_node_http_address or "").rsplit(":", 1)[0]
            name = names.get(container.id)
            if (host in hosts and name is not None and container.id not in self.drained
                    and container.service_name.startswith(WORKER_SERVICE)):
                why = f"its node {host} is being decommissioned"
                if self.master.drain(name, why):
                    drained.append(name)
                    log.warning("%s (%s) moves off: %s", name, container.id, why)
                self.drained[container.id] = host
        return drained
