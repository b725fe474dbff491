"""The skein application spec of an IterativeReduce job.

The application master's script starts the iterreduce master; each worker slot K has a service
``worker-K`` (:func:`worker_service`) of one container, which asks for the node holding slot K's
data where that is known (strictly for ``locality_wait`` seconds, then any node through the spare
service: :mod:`iterreduce.launch.yarn.relax`), and is restarted on its own (a container that YARN places
on another slot's node works as that slot: :func:`iterreduce.launch.yarn.container.slot_order`).
Every container gets the job file and the Python environment (an archive unpacked as
``environment``, or a Python already installed on the nodes). Validation is skein's own: a bad value raises skein's
``ValueError``, which :func:`build_spec` re-raises as :class:`AppSpecError` naming the option at fault.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

import yaml

from ... import LOG_LEVEL_VAR, THREAD_VARS, log_level
from ...exceptions import AppSpecError
from . import tokens
from .envpack import ENV_DIR
from .relax import SPARE_SERVICE, WAIT_VAR
from .skein_import import skein

JOB_FILE = "job.json"
#: Worker slot K's container is asked for as the single container of service ``worker-K``.
WORKER_SERVICE = "worker-"


#: skein's ``max_restarts`` of every worker service: a preempted container is restarted however
#: often it happens; the job's own budget is counted by the master (iterreduce.launch.yarn.keeper).
UNLIMITED_RESTARTS = -1
#: The application master's variable giving each worker service's budget of real failures.
MAX_FAILURES_VAR = "ITERREDUCE_MAX_RESTARTS"
#: The application master's variable giving the seconds between its looks for nodes being
#: decommissioned (iterreduce.launch.yarn.drain).
DECOMMISSION_CHECK_VAR = "ITERREDUCE_DECOMMISSION_CHECK"


def worker_service(slot: int) -> str:
    """The skein service of worker slot ``slot``."""
    return f"{WORKER_SERVICE}{slot}"


def slot_of(container_id: str) -> int | None:
    """The worker slot of a skein container id (``worker-3_0`` is slot 3), else None."""
    service = container_id.rsplit("_", 1)[0]
    number = service.removeprefix(WORKER_SERVICE)
    return int(number) if service.startswith(WORKER_SERVICE) and number.isdigit() else None

#: The application master's JVM options. skein 0.8.2's web UI (the tracking URL's page) renders its
#: list of service pages with mustache.java, which reflects into java.util's map entries: on Java 17+
#: that fails with HTTP 500 once a page is registered, unless java.util is opened to it.
AM_JAVA_OPTIONS = "--add-opens=java.base/java.util=ALL-UNNAMED"
#: Where they go: the `java` launcher's own variable (Java 9+; Java 8, which has no --add-opens, ignores
#: it). Not JAVA_TOOL_OPTIONS: a cluster's ``yarn.nodemanager.admin-env`` often sets that one (e.g. for
#: krb5.conf), and YARN joins the two values with ':', which breaks both.
AM_JAVA_OPTIONS_VAR = "JDK_JAVA_OPTIONS"


@dataclass
class YarnOptions:
    """Where and with what a job runs on YARN (the ``dbn submit`` flags)."""

    workers: int = 2
    worker_memory: str = "4 GiB"
    worker_vcores: int = 2
    worker_gpus: int = 0
    master_memory: str = "2 GiB"
    master_vcores: int = 1
    queue: str = "default"
    node_label: str = ""
    max_restarts: int = 3          # failures of the job's own per worker (a service each); preemptions are free
    max_attempts: int = 2          # of the application master; a new attempt resumes
    env_archive: str | None = None  # packed environment (local path or hdfs:// URI)
    python: str | None = None      # a Python installed on every node, instead of an archive
    file_systems: list[str] = field(default_factory=list)  # HDFS name services, for delegation tokens
    slot_hosts: list[str] = field(default_factory=list)  # each worker's node (its data's), "" for any
    files: dict[str, str] = field(default_factory=dict)  # more files for every container: {name: path or URI}
    locality_wait: float = 15.0    # seconds a worker waits for its node before any node; 0: YARN's own delay
    decommission_check: float = 30.0  # seconds between looks for nodes being decommissioned; 0: never
    tags: list[str] = field(default_factory=list)
    principal: str | None = None   # with keytab: shipped to the application master, which renews the tokens
    keytab: str | None = None


def _python(opts: YarnOptions) -> str:
    if opts.python:
        return shlex.quote(opts.python)
    return f'"$PWD/{ENV_DIR}/bin/python"'  # the archive's own interpreter, by its full path


def _script(opts: YarnOptions, role: str) -> str:
    return "\n".join([
        "set -e",
        "export PYTHONUNBUFFERED=1",
        f"exec {_python(opts)} -m iterreduce.launch.yarn.container {role} {JOB_FILE}",
    ])


def build_spec(name: str, job_file: str, opts: YarnOptions, device: str = "cpu") -> skein.ApplicationSpec:
    """The application spec: master + a ``worker-K`` service a worker, validated by skein.

    ``job_file`` is the local path (or URI) of the job's JSON description; skein
    uploads local files to the application's staging directory.
    """
    if opts.workers < 1:
        raise AppSpecError(f"--workers must be at least 1, got {opts.workers}")
    if not opts.python and not opts.env_archive:
        raise AppSpecError("no Python for the containers: give an environment archive (--env) or --python PATH")
    files = {JOB_FILE: skein.File(source=job_file, type="file"),
             **{name: skein.File(source=source, type="file") for name, source in opts.files.items()}}
    if not opts.python:
        # Kept in each NodeManager's cache of this user's files: the next job shipping the same archive
        # (same path and timestamp, e.g. on HDFS) starts without unpacking hundreds of MB again.
        files[ENV_DIR] = skein.File(source=opts.env_archive, type="archive", visibility="private")
    threads = str(max(1, opts.worker_vcores))
    try:  # a log level set where the job is submitted holds in its containers too
        log_env = {LOG_LEVEL_VAR: log_level()} if os.environ.get(LOG_LEVEL_VAR, "").strip() else {}
    except ValueError as exc:
        raise AppSpecError(str(exc)) from None
    worker_env = {"ITERREDUCE_DEVICE": "gpu" if opts.worker_gpus else device, **{var: threads for var in THREAD_VARS},
                  **log_env}
    # skein restarts every worker container that ends, whatever the cause (UNLIMITED_RESTARTS);
    # the master counts only the job's own failures against max_restarts (iterreduce.launch.yarn.keeper).
    if opts.decommission_check < 0:
        raise AppSpecError(f"decommission_check must be >= 0 seconds, got {opts.decommission_check}")
    master_env = {AM_JAVA_OPTIONS_VAR: AM_JAVA_OPTIONS, MAX_FAILURES_VAR: str(opts.max_restarts),
                  DECOMMISSION_CHECK_VAR: f"{opts.decommission_check:g}", **log_env}
    master_files = dict(files)
    if opts.keytab:  # to the application master alone: it renews the job's HDFS tokens (iterreduce.launch.yarn.tokens)
        master_files[tokens.KEYTAB_FILE] = skein.File(source=os.path.abspath(os.path.expanduser(opts.keytab)),
                                                      type="file")
        master_env.update({tokens.PRINCIPAL_VAR: opts.principal or "",
                           tokens.FILE_SYSTEMS_VAR: ",".join(opts.file_systems)})
        worker_env[tokens.FROM_MASTER_VAR] = "1"
    hosts = opts.slot_hosts or [""] * opts.workers
    if len(hosts) != opts.workers:
        raise AppSpecError(f"{len(hosts)} worker hosts for {opts.workers} workers")
    if opts.locality_wait < 0:
        raise AppSpecError(f"locality_wait must be >= 0 seconds, got {opts.locality_wait}")
    # A worker's node is asked for strictly while the master's relaxer waits (iterreduce.launch.yarn.relax);
    # GPU workers, and any job without that wait, leave it to YARN's delay (their node is a preference).
    strict = opts.locality_wait > 0 and not opts.worker_gpus and any(hosts)
    if strict:
        master_env[WAIT_VAR] = f"{opts.locality_wait:g}"
    try:
        def worker(instances: int, host: str, restarts: int) -> skein.Service:
            return skein.Service(
                resources=skein.Resources(memory=opts.worker_memory, vcores=opts.worker_vcores, gpus=opts.worker_gpus),
                script=_script(opts, "worker"), instances=instances, files=files, env=worker_env,
                max_restarts=restarts, node_label=opts.node_label,
                nodes=[host] if host else [], relax_locality=bool(host) and not strict)

        workers = {worker_service(k): worker(1, host, UNLIMITED_RESTARTS) for k, host in enumerate(hosts)}
        # Any node; started by the relaxer, one for each worker it withdraws, and by the keeper while
        # the job wants more workers than it has containers (dbn scale).
        workers[SPARE_SERVICE] = worker(0, "", UNLIMITED_RESTARTS)
        master = skein.Master(
            resources=skein.Resources(memory=opts.master_memory, vcores=opts.master_vcores),
            script=_script(opts, "master"), files=master_files, env=master_env)
        spec = skein.ApplicationSpec(
            name=name, queue=opts.queue, node_label=opts.node_label, max_attempts=opts.max_attempts,
            file_systems=list(opts.file_systems), tags=list(opts.tags) or ["iterreduce"],
            master=master, services=workers)  # skein validates on construction
    except (ValueError, TypeError) as exc:
        raise AppSpecError(f"invalid YARN application spec: {exc}") from exc
    return spec


def spec_yaml(spec: skein.ApplicationSpec) -> str:
    """``spec`` as skein reads it, in YAML, each line whole: a container's command stays one line to
    read and copy (skein's own ``to_yaml`` folds lines past 80 characters)."""
    return yaml.safe_dump(spec.to_dict(skip_nulls=True), default_flow_style=False, width=float("inf"))
