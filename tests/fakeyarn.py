"""A one-machine stand-in for Hadoop YARN with skein's driver and application masters.

No YARN ResourceManager can run in the test environment, so this module plays both
halves of skein's server side, speaking skein's own gRPC protocols (the ``Driver`` and
``AppMaster`` services of ``skein/proto/skein.proto``) over TLS. The code under test
uses the *real* clients unchanged::

    with FakeYarn() as fy:
        client = skein.Client(address=fy.address, security=fy.security)
        app_id = client.submit(spec)
        app = client.connect(app_id)          # a real skein.ApplicationClient
        app.kv["x"] = b"1"
        fy.wait(app_id)                       # -> skein.model.ApplicationReport

Applications run for real on this machine: the master's ``script`` and every service
container's ``script`` are ``bash`` processes (each in its own session, so a container
is a process group), in YARN-like container directories, with the environment a real
skein container gets (``SKEIN_*``, ``CONTAINER_ID``, ``LOCAL_DIRS`` holding
``<CONTAINER_ID>/.skein.{crt,pem}``, ...), so ``skein.ApplicationClient.from_current()``
works in them unchanged.

Semantics follow skein 0.8's Java ``Driver`` and ``ApplicationMaster`` (read from its
sources) and YARN's resource manager. The points where a test could care:

* **Application states.** ``submit`` -> SUBMITTED -> ACCEPTED -> RUNNING (the
  application master is up: ``host``/``port`` are its gRPC address). When an attempt
  ends the way skein unregisters it, the state is **FINISHED** with ``final_status``
  SUCCEEDED / FAILED / KILLED and skein's own diagnostics message, e.g.
  ``"Application driver failed with exit code 1, see logs for more information."``
  (as on a real cluster: a failed skein app reads FINISHED + FAILED, not state FAILED).
  ``kill_application`` gives state KILLED, final status KILLED. State FAILED is only
  reached through :meth:`FakeYarn.fail_attempt` (the AM container dying without
  unregistering, which is retried like any failed attempt) on the last attempt.
* **How an attempt ends** (``ApplicationMaster.java``): the master script exits 0
  (SUCCEEDED), exits non-zero (FAILED, message naming the exit code; a process killed
  by signal N exits 128+N as Java reports it), ``app.shutdown(status, diagnostics)``
  (that status; default diagnostics ``"Shutdown requested by user."``), a service fails
  beyond its restarts without ``allow_failures`` (FAILED, ``"Failure in service
  <name>, see logs for more information."``), or, with no master script, every service
  container has finished (SUCCEEDED). Ending an attempt stops all its containers
  (SIGTERM to each process group, SIGKILL after ``kill_grace`` seconds, like the node
  manager) and then its AM server; the application reads RUNNING until that is done,
  so once a test sees a completed state every process has exited and the logs are whole.
* **Attempts.** The number of attempts is ``min(spec.max_attempts, am_max_attempts)``
  (YARN's ``yarn.resourcemanager.am.max-attempts``, default 2). As in skein, an attempt
  that ends with any status other than SUCCEEDED is retried while attempts remain
  (this includes ``app.shutdown("FAILED")`` and a service failure, not only a crashing
  master). The new attempt is a new AM: a new gRPC port, a **fresh, empty key-value
  store**, fresh service containers whose instance numbers start again at 0, and YARN
  container ids carrying the attempt number (``container_<ts>_0001_02_000001`` is the
  second attempt's AM). skein keeps all AM state in the AM's memory, so nothing
  survives an attempt. Between attempts the application reads ACCEPTED.
* **Service containers.** A container whose process exits 0 is SUCCEEDED; non-zero
  or killed from outside (e.g. :meth:`FakeYarn.kill_container`, an OOM killer) is
  FAILED, and if the service has restarts left a NEW container is added with the next
  instance index (``worker_1`` replaces ``worker_0``) and the same environment,
  including ``add_container`` overrides. ``max_restarts`` (-1 = unlimited) counts the
  restarts of the whole service, not of each container (skein's ServiceTracker). Once
  they are used up, the next failure fails the service and with it the attempt
  (FAILED, retried if attempts remain) unless the service has ``allow_failures``.
  ``app.kill_container(id)`` and ``app.scale`` down are what skein calls KILLED: the
  process is stopped and **not** restarted (exactly as skein's ``killContainer``).
  ``depends`` is honoured (a service's containers wait until its dependencies' initial
  containers are running).
* **Key-value store**: ``GetRange``/``PutKey``/``DeleteRange``/``Transaction``/``Watch``
  with skein's range, owner, condition and event semantics; keys owned by a container
  are deleted (with DELETE events) when that container finishes, however it finishes.
* **Logs.** Each container has a log directory (``LOG_DIRS``) outside its working
  directory, as in YARN: the AM container holds ``application.master.log`` (this
  module's own account of the attempt) and ``application.driver.log`` (the master
  script's stdout+stderr); a service container holds ``<service>.log`` (its script's
  stdout+stderr). ``getLogs`` answers like skein after log aggregation: a mapping of
  YARN container id -> ``LogType:``/``Log Contents:`` sections, and only once the
  application has completed (``ValueError`` in the client before, as with skein)
  unless ``logs_while_running=True``. :meth:`FakeYarn.logs` reads them any time.
* **Files.** ``files`` of the master and services are localized once per application
  at submit time (skein uploads them at submit) into ``<appcache>/filecache`` and
  symlinked into each container directory under their target names. ``type: archive``
  is extracted (``.tar.gz``/``.tgz``/``.tar``/``.tar.bz2``/``.tar.xz``/``.zip``/``.jar``)
  into a directory of that name. Sources with a scheme other than ``file`` (``hdfs://``)
  go to the ``resolve_file(source, dest)`` hook, which must write the file at ``dest``;
  with no hook they are only recorded (:meth:`FakeYarn.remote_files`) and not created.
  A missing local file makes ``submit`` fail (``DriverError``), as skein's upload does.

RPCs implemented: Driver ``ping``, ``submit``, ``getStatus``, ``getApplications``,
``waitForStart``, ``kill``, ``getLogs``; AppMaster ``shutdown``, ``GetRange``,
``PutKey``, ``DeleteRange``, ``Transaction``, ``Watch``, ``getApplicationSpec``
(returns the spec as submitted), ``getContainers``, ``killContainer``, ``scale``,
``addContainer``, ``SetProgress``. The others (``getNodes``, queues,
``moveApplication``, the web UI proxies) abort with UNIMPLEMENTED. Error codes follow
skein so the clients raise what they raise against YARN (INVALID_ARGUMENT /
FAILED_PRECONDITION -> ``ValueError``; an unknown application id is a ``ValueError``).
"""

from __future__ import annotations

import getpass
import itertools
import os
import queue
import shutil
import signal
import subprocess
import tarfile
import tempfile
import threading
import time
import zipfile
from concurrent import futures
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

import grpc
import skein
from skein.proto import skein_pb2 as pb
from skein.proto import skein_pb2_grpc as pbg

__all__ = ["FakeYarn", "FakeContainer"]

_TERMINAL = ("FINISHED", "FAILED", "KILLED")
_STARTED = ("RUNNING",) + _TERMINAL
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz2", ".tar.xz", ".zip", ".jar")
# Inherited variables that would make a container look like some other container.
_SCRUBBED = ("CONTAINER_ID", "LOCAL_DIRS", "LOG_DIRS", "NM_HOST", "NM_PORT", "NM_HTTP_PORT")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _exit_code(returncode: int) -> int:
    """A Popen return code as YARN / Java report it: killed by signal N -> 128 + N."""
    return returncode if returncode >= 0 else 128 - returncode


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _url_string(url: pb.Url) -> str:
    netloc = "%s:%d" % (url.host, url.port) if url.host and url.port else url.host
    return "%s://%s%s" % (url.scheme or "file", netloc, url.file)


def _in_range(key: str, start: str, end: str) -> bool:
    """Whether ``key`` lies in skein's [start, end) with '' (or '\\0' start) unbounded."""
    return (start in ("", "\x00") or key >= start) and (end == "" or key < end)


class FakeContainer:
    """One container of a fake application: a real process group on this machine.

    Returned by :meth:`FakeYarn.containers`. ``service`` / ``instance`` / ``id`` are
    None for the application master's container (whose process is the master script,
    when there is one).

    Attributes: ``app_id``, ``attempt`` (1, 2, ...), ``service``, ``instance``, ``id``
    (skein's ``"<service>_<instance>"``), ``yarn_id`` (YARN container id, '' until
    allocated), ``state`` ('WAITING', 'REQUESTED', 'RUNNING', 'SUCCEEDED', 'FAILED',
    'KILLED'), ``env`` (the process environment), ``workdir``, ``log_dir``,
    ``log_path``, ``process`` (``subprocess.Popen`` or None), ``returncode`` (exit code
    as YARN reports it, 128+N for signal N; None while running), ``start_time`` /
    ``finish_time`` (ms), ``exit_message``.
    """

    def __init__(self, attempt: "_Attempt", service: Optional[str], instance: Optional[int],
                 env_overrides: Mapping[str, str], state: str):
        self._attempt = attempt
        self.app_id = attempt.app.id
        self.attempt = attempt.number
        self.service = service
        self.instance = instance
        self.env_overrides = dict(env_overrides)
        self.state = state
        self.yarn_id = ""
        self.env: dict = {}
        self.workdir: Optional[Path] = None
        self.log_dir: Optional[Path] = None
        self.log_path: Optional[Path] = None
        self.process: Optional[subprocess.Popen] = None
        self.returncode: Optional[int] = None
        self.start_time = 0
        self.finish_time = 0
        self.exit_message = ""
        self.owned_keys: set = set()
        self.exited = threading.Event()

    @property
    def id(self) -> Optional[str]:
        return None if self.service is None else "%s_%d" % (self.service, self.instance)

    @property
    def is_master(self) -> bool:
        return self.service is None

    @property
    def pid(self) -> Optional[int]:
        return None if self.process is None else self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the container's whole process group, from outside YARN.

        The exit is seen as the container dying (FAILED, restarted if the service has
        restarts left; for the master, the attempt fails).
        """
        if self.process is not None:
            _signal_group(self.process.pid, sig)

    def read_log(self) -> str:
        """The container's log files, concatenated (empty if none yet)."""
        if self.log_dir is None or not self.log_dir.exists():
            return ""
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.iterdir()))

    def to_protobuf(self) -> pb.Container:
        return pb.Container(service_name=self.service or "", instance=self.instance or 0,
                            state=pb.Container.State.Value(self.state),
                            yarn_container_id=self.yarn_id,
                            yarn_node_http_address=(self._attempt.app.fy.host + ":8042"
                                                    if self.yarn_id else ""),
                            start_time=self.start_time, finish_time=self.finish_time,
                            exit_message=self.exit_message)

    def __repr__(self):
        return "FakeContainer<%s %s %s pid=%s>" % (self.id or "master", self.yarn_id or "-",
                                                   self.state, self.pid)


class _Service:
    """skein's ServiceTracker: the containers of one service in one attempt."""

    def __init__(self, attempt: "_Attempt", name: str, spec: pb.Service):
        self.attempt, self.name, self.spec = attempt, name, spec
        self.containers: list[FakeContainer] = []
        self.depends = set(spec.depends)
        self.dependents: list[_Service] = []
        self.initial_running = False
        self.num_failed = self.num_restarted = 0

    def active(self) -> list:
        return [c for c in self.containers if c.state in ("WAITING", "REQUESTED", "RUNNING")]

    def is_finished(self) -> bool:
        return not self.active()

    def is_failed(self) -> bool:
        return self.num_failed > self.num_restarted and not self.spec.allow_failures

    def get(self, instance: int) -> Optional[FakeContainer]:
        return self.containers[instance] if 0 <= instance < len(self.containers) else None

    def add_container(self, env: Mapping[str, str] = ()) -> FakeContainer:
        ready = not self.depends
        c = FakeContainer(self.attempt, self.name, len(self.containers), dict(env),
                          "REQUESTED" if ready else "WAITING")
        self.containers.append(c)
        self.attempt.log("%s: %s" % (c.state, c.id))
        if ready:
            self.attempt.request(c)
        return c

    def notify_running(self, dependency: str) -> None:
        self.depends.discard(dependency)
        if not self.depends:
            for c in self.containers:
                if c.state == "WAITING":
                    c.state = "REQUESTED"
                    self.attempt.log("REQUESTED: %s" % c.id)
                    self.attempt.request(c)

    def check_initial_running(self) -> None:
        if not self.initial_running and not any(c.state == "REQUESTED" for c in self.containers):
            self.initial_running = True
            for dep in self.dependents:
                dep.notify_running(self.name)


class _Attempt:
    """One application master attempt: its gRPC server, key-value store and containers."""

    def __init__(self, app: "_Application", number: int):
        self.app, self.number = app, number
        self.lock = app.lock
        self.kv: dict = {}  # key -> pb.KeyValue
        self.watchers: dict = {}  # watch_id -> (start, end, put, delete, out_queue, stream)
        self.watch_ids = itertools.count(1)
        self.container_numbers = itertools.count(1)
        self.progress = -1.0
        self.finished = False
        self.crashed = False  # ended without unregistering (FakeYarn.fail_attempt)
        self.final_status = "FAILED"
        self.message = ""
        self.torn_down = threading.Event()
        self.server: Optional[grpc.Server] = None
        self.port = 0
        self.master = FakeContainer(self, None, None, {}, "RUNNING")
        self.services = {name: _Service(self, name, spec) for name, spec in app.spec.services.items()}
        for svc in self.services.values():
            for dep in svc.spec.depends:
                self.services[dep].dependents.append(svc)

    # -------------------------------------------------------------- helpers

    @property
    def address(self) -> str:
        return "%s:%d" % (self.app.fy.host, self.port)

    @property
    def attempt_id(self) -> str:
        return "appattempt_%d_%04d_%06d" % (self.app.fy.cluster_timestamp, self.app.seq, self.number)

    def new_yarn_id(self) -> str:
        return "container_%d_%04d_%02d_%06d" % (self.app.fy.cluster_timestamp, self.app.seq,
                                                 self.number, next(self.container_numbers))

    def log(self, msg: str) -> None:
        """A line in this attempt's application.master.log."""
        path = self.master.log_dir
        if path is not None:
            with open(path / "application.master.log", "a") as f:
                f.write("%s %s\n" % (time.strftime("%H:%M:%S"), msg))

    def all_containers(self) -> list:
        out = [self.master]
        for svc in self.services.values():
            out.extend(svc.containers)
        return out

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the AM server, the services and the master script (the app lock is not held)."""
        fy, app = self.app.fy, self.app
        self.master.yarn_id = self.new_yarn_id()
        self.master.start_time = _now_ms()
        app.prepare_container_dirs(self.master)
        self.log("Starting attempt %d (%s) of %s" % (self.number, self.attempt_id, app.id))
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=128, thread_name_prefix="fakeyarn-am"))
        pbg.add_AppMasterServicer_to_server(_AppMasterServicer(self), server)
        creds = grpc.ssl_server_credentials([(app.key, app.cert)], root_certificates=app.cert,
                                            require_client_auth=True)
        self.port = server.add_secure_port("%s:0" % fy.host, creds)
        server.start()
        with self.lock:
            if self.finished:  # killed while starting: the teardown missed this server
                server.stop(None)
                return
            self.server = server
        self.log("gRPC server started at %s" % self.address)
        master = app.spec.master
        env = app.container_env(self.master, master.env, master.resources)
        env.pop("SKEIN_CONTAINER_ID", None)  # skein gives the driver no container id
        self.master.env = env
        with self.lock:
            if self.finished:
                return
            app.attempt_running(self)
            for svc in self.services.values():
                for _ in range(svc.spec.instances):
                    svc.add_container()
            if master.script:
                (self.master.workdir / ".skein.sh").write_text(master.script)
                self.master.log_path = self.master.log_dir / "application.driver.log"
                self.log("Starting application driver")
                try:
                    self.spawn(self.master)
                except OSError as exc:
                    self.shutdown("FAILED", "Failed to start application driver: %s" % exc)
                    return
            self.maybe_shutdown()

    def spawn(self, c: FakeContainer) -> None:
        """Start ``bash .skein.sh`` for container ``c`` (lock held) and watch for its exit."""
        with open(c.log_path, "ab") as log:
            c.process = subprocess.Popen(["bash", ".skein.sh"], cwd=str(c.workdir), env=c.env,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, close_fds=True)
        threading.Thread(target=self._waiter, args=(c,), daemon=True,
                         name="fakeyarn-wait-%s" % c.yarn_id).start()

    def request(self, c: FakeContainer) -> None:
        """Allocate and launch a REQUESTED service container in the background."""
        threading.Thread(target=self._launch, args=(c,), daemon=True,
                         name="fakeyarn-launch-%s" % c.id).start()

    def _launch(self, c: FakeContainer) -> None:
        app = self.app
        svc = self.services[c.service]
        with self.lock:
            if c.state != "REQUESTED" or self.finished:
                return
            c.yarn_id = self.new_yarn_id()
            c.state = "RUNNING"
            c.start_time = _now_ms()
        try:
            app.prepare_container_dirs(c)
            env = dict(svc.spec.env)
            env.update(c.env_overrides)
            c.env = app.container_env(c, env, svc.spec.resources)
            (c.workdir / ".skein.sh").write_text(svc.spec.script)
            c.log_path = c.log_dir / ("%s.log" % c.service)
        except Exception as exc:  # a localization failure: the container fails to start
            with self.lock:
                self.finish_container(c, "FAILED", "Failed to start, exception raised: %s" % exc)
            return
        with self.lock:
            if c.state != "RUNNING" or self.finished:
                return  # killed while being launched
            try:
                self.spawn(c)
            except OSError as exc:
                self.finish_container(c, "FAILED", "Failed to start, exception raised: %s" % exc)
                return
            self.log("RUNNING: %s on %s" % (c.id, c.yarn_id))
            svc.check_initial_running()

    def _waiter(self, c: FakeContainer) -> None:
        rc = c.process.wait()
        _signal_group(c.process.pid, signal.SIGKILL)  # leftovers of the container go with it
        code = _exit_code(rc)
        with self.lock:
            c.returncode = code
            c.exited.set()
            if self.finished or c.state != "RUNNING":
                if not c.finish_time:
                    c.finish_time = _now_ms()
                return
            if c.is_master:
                c.finish_time = _now_ms()
                if code == 0:
                    c.state = "SUCCEEDED"
                    self.shutdown("SUCCEEDED", "Application driver completed successfully.")
                elif code == 143:
                    c.state = "FAILED"
                    self.shutdown("FAILED", "Application driver failed with exit code 143. This is "
                                  "often due to the application master memory limit being "
                                  "exceeded. See the diagnostics for more information.")
                else:
                    c.state = "FAILED"
                    self.shutdown("FAILED", "Application driver failed with exit code %d, see "
                                  "logs for more information." % code)
            elif code == 0:
                self.finish_container(c, "SUCCEEDED", "Completed successfully.")
            else:
                self.finish_container(c, "FAILED", "Container failed during execution, see logs "
                                      "for more information.")

    def _stop_process(self, c: FakeContainer) -> None:
        """SIGTERM the container's group, SIGKILL it after the grace period (as the NM does)."""
        if c.process is None or c.exited.is_set():
            return
        _signal_group(c.process.pid, signal.SIGTERM)
        if not c.exited.wait(self.app.fy.kill_grace):
            _signal_group(c.process.pid, signal.SIGKILL)
        c.exited.wait(10)

    def finish_container(self, c: FakeContainer, state: str, message: str) -> None:
        """skein's ServiceTracker.finishContainer (lock held)."""
        svc = self.services[c.service]
        if c.state not in ("WAITING", "REQUESTED", "RUNNING"):
            return
        if c.state == "RUNNING":
            c.finish_time = _now_ms()
            if c.process is not None and not c.exited.is_set():
                threading.Thread(target=self._stop_process, args=(c,), daemon=True).start()
        if state == "FAILED":
            svc.num_failed += 1
        c.state, c.exit_message = state, message
        self.log("%s: %s - %s" % (state, c.id, message))
        for key in sorted(c.owned_keys):
            kv = self.kv.pop(key, None)
            if kv is not None:
                self.notify(key, pb.WatchResponse.DELETE, pb.KeyValue(key=key))
        c.owned_keys.clear()
        if state == "FAILED" and (svc.spec.max_restarts == -1
                                  or svc.num_restarted < svc.spec.max_restarts):
            svc.num_restarted += 1
            self.log("RESTARTING: adding new container to replace %s." % c.id)
            svc.add_container(c.env_overrides)
        if svc.is_finished() or svc.is_failed():
            self.maybe_shutdown()

    def maybe_shutdown(self) -> None:
        finished = not self.app.spec.master.script
        for svc in self.services.values():
            finished = finished and svc.is_finished()
            if svc.is_failed():
                self.shutdown("FAILED", "Failure in service %s, see logs for more information."
                              % svc.name)
                return
        if finished:
            self.shutdown("SUCCEEDED", "Application completed successfully.")

    def shutdown(self, status: str, message: str, crashed: bool = False) -> None:
        """End this attempt with ``status`` (first call wins); tear down in the background.
        ``crashed``: the AM dies without unregistering (YARN decides the final state)."""
        with self.lock:
            if self.finished:
                return
            self.finished = True
            self.crashed = crashed
            self.final_status, self.message = status, message
            self.log("Shutting down: %s" % message)
        threading.Thread(target=self._teardown, daemon=True, name="fakeyarn-teardown").start()

    def _teardown(self) -> None:
        with self.lock:
            victims = [c for c in self.all_containers() if c.process is not None and not c.exited.is_set()]
            now = _now_ms()
            for c in self.all_containers():
                if c.state in ("WAITING", "REQUESTED", "RUNNING"):
                    c.state = "KILLED"
                    c.exit_message = c.exit_message or "Killed by application master shutdown."
                    c.finish_time = c.finish_time or now
        for c in victims:
            _signal_group(c.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.app.fy.kill_grace
        for c in victims:
            c.exited.wait(max(0.0, deadline - time.monotonic()))
        for c in victims:
            if not c.exited.is_set():
                _signal_group(c.process.pid, signal.SIGKILL)
        for c in victims:
            c.exited.wait(10)
        with self.lock:
            server = self.server
        if server is not None:
            server.stop(None).wait(5)
        with self.lock:
            self.master.finish_time = self.master.finish_time or _now_ms()
            self.log("Attempt %d ended: %s" % (self.number, self.final_status))
        self.torn_down.set()
        self.app.attempt_ended(self)

    # -------------------------------------------------------------- key-value store

    def select(self, start: str, end: str) -> list:
        if start not in ("", "\x00") and end != "" and start > end:
            return []
        return sorted(k for k in self.kv if _in_range(k, start, end))

    def notify(self, key: str, kind: int, kv: pb.KeyValue) -> None:
        for wid, (start, end, put, delete, out, _) in list(self.watchers.items()):
            if _in_range(key, start, end) and (put if kind == pb.WatchResponse.PUT else delete):
                out.put(pb.WatchResponse(type=kind, watch_id=wid, event=[kv]))

    def owner_container(self, owner: pb.ContainerInstance) -> Optional[FakeContainer]:
        svc = self.services.get(owner.service_name)
        return None if svc is None else svc.get(owner.instance)


class _Application:
    """A submitted application: its spec, YARN-level state and successive attempts."""

    def __init__(self, fy: "FakeYarn", seq: int, spec: pb.ApplicationSpec):
        self.fy, self.seq, self.spec = fy, seq, spec
        self.id = "application_%d_%04d" % (fy.cluster_timestamp, seq)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.state = "NEW"
        self.final_status = "UNDEFINED"
        self.diagnostics = ""
        self.start_time = _now_ms()
        self.finish_time = 0
        self.progress = 0.0
        self.user = spec.user or fy.user
        self.queue = spec.queue or "default"
        self.max_attempts = max(1, min(spec.max_attempts or 1, fy.am_max_attempts))
        self.attempts: list[_Attempt] = []
        self.killed = False
        self.appcache = fy.workdir / "nm-local-dir" / "usercache" / self.user / "appcache" / self.id
        self.logroot = fy.workdir / "userlogs" / self.id
        self.filecache: dict = {}  # (source, archive) -> localized path
        self.remote_files: list = []  # (source, target name) recorded without a resolver
        self.cert, self.key = self._credentials()

    def _credentials(self):
        """(cert, key) bytes: the spec's ``master.security`` if given, else the driver's."""
        if not self.spec.master.HasField("security"):
            return self.fy.security._get_bytes("cert"), self.fy.security._get_bytes("key")
        sec = self.spec.master.security

        def read(kind):
            if sec.WhichOneof(kind) == kind + "_bytes":
                return getattr(sec, kind + "_bytes")
            return Path(getattr(sec, kind + "_file").source.file).read_bytes()
        return read("cert"), read("key")

    @property
    def current(self) -> Optional[_Attempt]:
        return self.attempts[-1] if self.attempts else None

    # -------------------------------------------------------------- files

    def localize_all(self) -> None:
        """Localize every file of the spec into the application's filecache (at submit)."""
        specs = [self.spec.master] + list(self.spec.services.values())
        for spec in specs:
            for target, f in spec.files.items():
                self._localize(target, f)

    def _localize(self, target: str, f: pb.File) -> Optional[Path]:
        source = _url_string(f.source)
        archive = f.type == pb.File.ARCHIVE
        cache_key = (source, archive)
        if cache_key in self.filecache:
            return self.filecache[cache_key]
        name = os.path.basename(f.source.file.rstrip("/")) or target
        slot = self.appcache / "filecache" / str(len(self.filecache) + 1)
        slot.mkdir(parents=True)
        if f.source.scheme in ("", "file"):
            raw = Path(f.source.file)
            if not raw.exists():
                raise FileNotFoundError("File %s does not exist" % raw)
        elif self.fy.resolve_file is None:
            self.remote_files.append((source, target))
            self.filecache[cache_key] = None
            return None
        else:
            raw = slot / (".download-" + name)
            self.fy.resolve_file(source, str(raw))
        dest = slot / name
        downloaded = raw.parent == slot
        if archive and name.lower().endswith(_ARCHIVE_SUFFIXES):
            _extract(raw, dest)
            if downloaded:
                raw.unlink()
        elif downloaded:
            os.replace(raw, dest)
        elif raw.is_dir():
            shutil.copytree(raw, dest, symlinks=True)
        else:
            shutil.copy2(raw, dest)
        self.filecache[cache_key] = dest
        return dest

    def prepare_container_dirs(self, c: FakeContainer) -> None:
        """Create the working and log directories of ``c`` with its files and credentials."""
        c.workdir = self.appcache / c.yarn_id
        c.log_dir = self.logroot / c.yarn_id
        c.workdir.mkdir(parents=True)
        c.log_dir.mkdir(parents=True)
        (c.workdir / ".skein.crt").write_bytes(self.cert)
        (c.workdir / ".skein.pem").write_bytes(self.key)
        os.chmod(c.workdir / ".skein.pem", 0o600)
        spec = self.spec.master if c.is_master else self.spec.services[c.service]
        if c.is_master:
            (c.workdir / ".skein.proto").write_bytes(self.spec.SerializeToString())
        for target, f in spec.files.items():
            local = self._localize(target, f)
            if local is not None:
                link = c.workdir / target
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(local)

    def container_env(self, c: FakeContainer, spec_env: Mapping[str, str],
                      resources: pb.Resources) -> dict:
        """The environment of a container process: inherited + spec + skein + YARN."""
        fy, attempt = self.fy, c._attempt
        env = dict(fy.base_env)
        env.update(spec_env)
        env.update({
            "SKEIN_APPLICATION_ID": self.id,
            "SKEIN_APPMASTER_ADDRESS": attempt.address,
            "SKEIN_RESOURCE_MEMORY": str(resources.memory),
            "SKEIN_RESOURCE_VCORES": str(resources.vcores),
            "HADOOP_USER_NAME": self.user,
            # set by the node manager
            "CONTAINER_ID": c.yarn_id,
            "LOCAL_DIRS": str(self.appcache),
            "LOG_DIRS": str(c.log_dir),
            "PWD": str(c.workdir),
            "NM_HOST": fy.host,
            "NM_PORT": "8041",
            "NM_HTTP_PORT": "8042",
            "USER": self.user,
            "LOGNAME": self.user,
        })
        if c.id is not None:
            env["SKEIN_CONTAINER_ID"] = c.id
        return env

    # -------------------------------------------------------------- state

    def set_state(self, state: str) -> None:
        with self.lock:
            self.state = state
            self.changed.notify_all()

    def run(self) -> None:
        """Submission thread: SUBMITTED -> ACCEPTED -> first attempt."""
        self.set_state("SUBMITTED")
        self.set_state("ACCEPTED")
        if self.fy.accept_delay:
            time.sleep(self.fy.accept_delay)
        self.start_attempt()

    def start_attempt(self) -> None:
        with self.lock:
            if self.killed or self.state in _TERMINAL:
                return
            attempt = _Attempt(self, len(self.attempts) + 1)
            self.attempts.append(attempt)
        try:
            attempt.start()
        except Exception as exc:  # the AM failed to come up
            attempt.shutdown("FAILED", "Unexpected error in application master:\n%s" % exc)

    def attempt_running(self, attempt: _Attempt) -> None:
        with self.lock:
            if self.current is attempt and not self.killed:
                self.state = "RUNNING"
                self.changed.notify_all()

    def attempt_ended(self, attempt: _Attempt) -> None:
        with self.lock:
            if self.killed or self.state in _TERMINAL:
                return
            if attempt.crashed and attempt.number >= self.max_attempts:
                self.finalize("FAILED", "FAILED", "Application %s failed %d times due to AM "
                              "Container for %s exited: %s Failing the application."
                              % (self.id, attempt.number, attempt.attempt_id, attempt.message))
                return
            if not attempt.crashed and (attempt.final_status == "SUCCEEDED"
                                        or attempt.number >= self.max_attempts):
                self.finalize("FINISHED", attempt.final_status, attempt.message, progress=1.0)
                return
            self.diagnostics = ("Attempt %d (%s) failed: %s Starting attempt %d."
                                % (attempt.number, attempt.attempt_id, attempt.message,
                                   attempt.number + 1))
            self.state = "ACCEPTED"
            self.progress = 0.0
            self.changed.notify_all()
        self.start_attempt()

    def finalize(self, state: str, final_status: str, diagnostics: str, progress=None) -> None:
        with self.lock:
            if self.state in _TERMINAL:
                return
            self.state, self.final_status, self.diagnostics = state, final_status, diagnostics
            self.finish_time = _now_ms()
            if progress is not None:
                self.progress = progress
            self.changed.notify_all()

    def kill(self, diagnostics: str) -> None:
        with self.lock:
            if self.state in _TERMINAL:
                return
            self.killed = True
            attempt = self.current
        if attempt is not None:
            attempt.shutdown("KILLED", diagnostics)
            attempt.torn_down.wait(30)
        self.finalize("KILLED", "KILLED", diagnostics)

    def report(self) -> pb.ApplicationReport:
        with self.lock:
            attempt = self.current
            running = self.state == "RUNNING" and attempt is not None
            if running:
                self.progress = 0.1 if attempt.progress < 0 else attempt.progress
            used_mem = used_vc = n = 0
            mem_s = vc_s = 0
            now = _now_ms()
            for a in self.attempts:
                for c in a.all_containers():
                    if not c.yarn_id or not c.start_time:
                        continue
                    res = (self.spec.master.resources if c.is_master
                           else self.spec.services[c.service].resources)
                    end = c.finish_time or now
                    mem_s += res.memory * (end - c.start_time) // 1000
                    vc_s += res.vcores * (end - c.start_time) // 1000
                    if a is attempt and not c.finish_time and self.state == "RUNNING":
                        n += 1
                        used_mem += res.memory
                        used_vc += res.vcores
            usage = pb.ResourceUsageReport(
                memory_seconds=mem_s, vcore_seconds=vc_s, num_used_containers=n,
                used_resources=pb.Resources(memory=used_mem, vcores=used_vc),
                reserved_resources=pb.Resources(), needed_resources=pb.Resources(memory=used_mem, vcores=used_vc))
            return pb.ApplicationReport(
                id=self.id, name=self.spec.name, user=self.user, queue=self.queue,
                tags=list(self.spec.tags),
                host=self.fy.host if running else "N/A",
                port=attempt.port if running else -1,
                tracking_url="http://%s:8088/proxy/%s/" % (self.fy.host, self.id),
                state=pb.ApplicationState.Type.Value(self.state),
                final_status=pb.FinalStatus.Type.Value(self.final_status),
                progress=self.progress, usage=usage, diagnostics=self.diagnostics,
                start_time=self.start_time, finish_time=self.finish_time)

    def logs(self) -> dict:
        """YARN container id -> aggregated-log text of that container."""
        out = {}
        if not self.logroot.exists():
            return out
        for cdir in sorted(self.logroot.iterdir()):
            parts = []
            for f in sorted(cdir.iterdir()):
                text = f.read_text(errors="replace")
                mtime = time.strftime("%a %b %d %H:%M:%S %z %Y", time.localtime(f.stat().st_mtime))
                parts.append("LogType:%s\nLog Upload Time:%s\nLogLength:%d\nLog Contents:\n%s\n"
                             "End of LogType:%s\n" % (f.name, mtime, len(text.encode()), text, f.name))
            out[cdir.name] = "\n".join(parts).rstrip()
        return out


def _extract(archive: Path, dest: Path) -> None:
    """Unpack ``archive`` into the directory ``dest`` as YARN's localizer does."""
    dest.mkdir(parents=True)
    name = archive.name.lower()
    if name.endswith((".zip", ".jar")):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                path = zf.extract(info, dest)
                mode = (info.external_attr >> 16) & 0o7777
                if mode and not info.is_dir():
                    os.chmod(path, mode)
    else:
        with tarfile.open(archive) as tf:
            if hasattr(tarfile, "fully_trusted_filter"):
                tf.extractall(dest, filter="fully_trusted")
            else:  # pragma: no cover - Python without extraction filters
                tf.extractall(dest)


def _abort_unimplemented(name: str):
    def method(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "%s is not implemented by FakeYarn" % name)
    method.__name__ = name
    return method


class _DriverServicer(pbg.DriverServicer):
    """skein's Driver service, backed by :class:`FakeYarn`."""

    def __init__(self, fy: "FakeYarn"):
        self.fy = fy

    def _app(self, app_id: str, context) -> _Application:
        app = self.fy._apps.get(app_id)
        if app is None:
            if not app_id.startswith("application_"):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Invalid ApplicationId '%s'" % app_id)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Unknown ApplicationId '%s'" % app_id)
        return app

    def ping(self, request, context):
        return pb.Empty()

    def submit(self, request, context):
        if not request.master.script and not request.services:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "There must be at least one service or a master script")
        for name, svc in request.services.items():
            if not svc.script:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Service '%s' has no script" % name)
            for dep in svc.depends:
                if dep not in request.services:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  "Service '%s' depends on unknown service '%s'" % (name, dep))
        app = self.fy._new_application(request)
        try:
            app.localize_all()
        except Exception as exc:
            with self.fy._lock:
                self.fy._apps.pop(app.id, None)
            context.abort(grpc.StatusCode.INTERNAL,
                          "Failed to submit application, exception:\n%s" % exc)
        threading.Thread(target=app.run, daemon=True, name="fakeyarn-%s" % app.id).start()
        return pb.Application(id=app.id)

    def getStatus(self, request, context):
        return self._app(request.id, context).report()

    def waitForStart(self, request, context):
        app = self._app(request.id, context)
        with app.lock:
            while app.state not in _STARTED and context.is_active():
                app.changed.wait(0.2)
        return app.report()

    def getApplications(self, request, context):
        states = ({pb.ApplicationState.Type.Name(s) for s in request.states}
                  or {"SUBMITTED", "ACCEPTED", "RUNNING"})
        started_end = request.started_end or 2 ** 62
        finished_end = request.finished_end or 2 ** 62
        reports = []
        for app in self.fy._app_list():
            r = app.report()
            if (pb.ApplicationState.Type.Name(r.state) not in states
                    or (request.name and r.name != request.name)
                    or (request.user and r.user != request.user)
                    or (request.queue and r.queue != request.queue)
                    or not request.started_begin <= r.start_time <= started_end
                    or not request.finished_begin <= r.finish_time <= finished_end):
                continue
            reports.append(r)
        return pb.ApplicationsResponse(reports=reports)

    def kill(self, request, context):
        self._app(request.id, context).kill(
            "Application %s was killed by user %s" % (request.id, request.user or self.fy.user))
        return pb.Empty()

    def getLogs(self, request, context):
        app = self._app(request.id, context)
        if app.state not in _TERMINAL and not self.fy.logs_while_running:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "Application %s has not completed, logs are not available" % request.id)
        return pb.LogsResponse(logs=app.logs())

    getNodes = _abort_unimplemented("getNodes")
    getQueue = _abort_unimplemented("getQueue")
    getChildQueues = _abort_unimplemented("getChildQueues")
    getAllQueues = _abort_unimplemented("getAllQueues")
    moveApplication = _abort_unimplemented("moveApplication")


class _AppMasterServicer(pbg.AppMasterServicer):
    """skein's AppMaster service for one attempt."""

    def __init__(self, attempt: _Attempt):
        self.a = attempt

    # ---------------------------------------------------------- checks

    def _service(self, name: str, context) -> _Service:
        svc = self.a.services.get(name)
        if svc is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Unknown service '%s'" % name)
        return svc

    def _instance(self, service: str, instance: int, not_completed: bool, context) -> FakeContainer:
        c = self._service(service, context).get(instance)
        if c is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "Service '%s' has no container instance %d" % (service, instance))
        if not_completed and c.state not in ("WAITING", "REQUESTED", "RUNNING"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "Container '%s_%d' has already completed" % (service, instance))
        return c

    # ---------------------------------------------------------- application

    def shutdown(self, request, context):
        status = pb.FinalStatus.Type.Name(request.final_status)
        self.a.shutdown(status, request.diagnostics or "Shutdown requested by user.")
        return pb.Empty()

    def getApplicationSpec(self, request, context):
        return self.a.app.spec

    def SetProgress(self, request, context):
        if not 0.0 <= request.progress <= 1.0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "progress must be between 0 and 1, got %s" % request.progress)
        with self.a.lock:
            self.a.progress = request.progress
        return pb.Empty()

    def getContainers(self, request, context):
        with self.a.lock:
            names = list(request.services) or sorted(self.a.services)
            svcs = [self._service(n, context) for n in names]
            states = ({pb.Container.State.Name(s) for s in request.states}
                      or {"WAITING", "REQUESTED", "RUNNING"})
            return pb.ContainersResponse(containers=[
                c.to_protobuf() for s in svcs for c in s.containers if c.state in states])

    def killContainer(self, request, context):
        with self.a.lock:
            c = self._instance(request.service_name, request.instance, False, context)
            self.a.finish_container(c, "KILLED", "Killed by user request.")
        return pb.Empty()

    def scale(self, request, context):
        count, delta = request.count, request.delta
        if delta != 0 and count != 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Can't specify both count and delta")
        if delta == 0 and count < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "count must be >= 0")
        with self.a.lock:
            svc = self._service(request.service_name, context)
            active = svc.active()
            delta = count - len(active) if delta == 0 else max(delta, -len(active))
            out = []
            if delta > 0:
                out = [svc.add_container() for _ in range(delta)]
            else:
                order = {"WAITING": 0, "REQUESTED": 1, "RUNNING": 2}
                victims = sorted(active, key=lambda c: order[c.state])[:-delta]
                for c in victims:
                    self.a.finish_container(c, "KILLED", "Killed by user request.")
                out = victims
            return pb.ContainersResponse(containers=[c.to_protobuf() for c in out])

    def addContainer(self, request, context):
        with self.a.lock:
            svc = self._service(request.service_name, context)
            return svc.add_container(dict(request.env)).to_protobuf()

    # ---------------------------------------------------------- key-value store

    def _get_range(self, req) -> pb.GetRangeResponse:
        keys = self.a.select(req.start, req.end)
        out = pb.GetRangeResponse(count=len(keys), result_type=req.result_type)
        if req.result_type == pb.GetRangeRequest.ITEMS:
            out.result.extend(self.a.kv[k] for k in keys)
        elif req.result_type == pb.GetRangeRequest.KEYS:
            out.result.extend(pb.KeyValue(key=k) for k in keys)
        return out

    def _delete_range(self, req) -> pb.DeleteRangeResponse:
        a = self.a
        keys = a.select(req.start, req.end)
        out = pb.DeleteRangeResponse(count=len(keys), result_type=req.result_type)
        if req.result_type == pb.DeleteRangeRequest.ITEMS:
            out.result.extend(a.kv[k] for k in keys)
        elif req.result_type == pb.DeleteRangeRequest.KEYS:
            out.result.extend(pb.KeyValue(key=k) for k in keys)
        for k in keys:
            kv = a.kv.pop(k)
            if kv.HasField("owner"):
                owner = a.owner_container(kv.owner)
                if owner is not None:
                    owner.owned_keys.discard(k)
            a.notify(k, pb.WatchResponse.DELETE, pb.KeyValue(key=k))
        return out

    def _precheck_put(self, req, context) -> None:
        if req.ignore_value and req.ignore_owner:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "ignore_value & ignore_owner can't both be true")
        if req.ignore_value and req.key not in self.a.kv:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "ignore_value=True & key isn't already set")
        if not req.ignore_owner and req.HasField("owner"):
            self._instance(req.owner.service_name, req.owner.instance, True, context)

    def _put_key(self, req) -> pb.PutKeyResponse:
        a = self.a
        prev = a.kv.get(req.key)
        kv = pb.KeyValue(key=req.key, value=prev.value if req.ignore_value else req.value)
        if req.ignore_owner:
            if prev is not None and prev.HasField("owner"):
                kv.owner.CopyFrom(prev.owner)
        else:
            if prev is not None and prev.HasField("owner"):
                old = a.owner_container(prev.owner)
                if old is not None:
                    old.owned_keys.discard(req.key)
            if req.HasField("owner"):
                a.owner_container(req.owner).owned_keys.add(req.key)
                kv.owner.CopyFrom(req.owner)
        a.kv[req.key] = kv
        a.notify(req.key, pb.WatchResponse.PUT, kv)
        out = pb.PutKeyResponse(return_previous=req.return_previous)
        if req.return_previous and prev is not None:
            out.previous.CopyFrom(prev)
        return out

    def _condition(self, cond: pb.Condition) -> bool:
        kv = self.a.kv.get(cond.key)
        rhs_kind = cond.WhichOneof("rhs")
        if cond.field == pb.Condition.VALUE:
            lhs = None if kv is None else kv.value
            rhs = cond.value if rhs_kind == "value" else None
        else:
            lhs = (kv.owner.service_name, kv.owner.instance) if kv is not None and kv.HasField("owner") else None
            rhs = (cond.owner.service_name, cond.owner.instance) if rhs_kind == "owner" else None
        op = cond.operator
        if lhs is None or rhs is None:
            if op == pb.Condition.EQUAL:
                return lhs is None and rhs is None
            if op == pb.Condition.NOT_EQUAL:
                return not (lhs is None and rhs is None)
            return False
        return {pb.Condition.EQUAL: lhs == rhs, pb.Condition.NOT_EQUAL: lhs != rhs,
                pb.Condition.LESS: lhs < rhs, pb.Condition.LESS_EQUAL: lhs <= rhs,
                pb.Condition.GREATER: lhs > rhs, pb.Condition.GREATER_EQUAL: lhs >= rhs}[op]

    def GetRange(self, request, context):
        with self.a.lock:
            return self._get_range(request)

    def DeleteRange(self, request, context):
        with self.a.lock:
            return self._delete_range(request)

    def PutKey(self, request, context):
        with self.a.lock:
            self._precheck_put(request, context)
            return self._put_key(request)

    def Transaction(self, request, context):
        with self.a.lock:
            ok = all(self._condition(c) for c in request.condition)
            ops = request.on_success if ok else request.on_failure
            for op in ops:
                if op.WhichOneof("request") == "put_key":
                    self._precheck_put(op.put_key, context)
            out = pb.TransactionResponse(succeeded=ok)
            for op in ops:
                kind = op.WhichOneof("request")
                if kind == "put_key":
                    out.result.add(put_key=self._put_key(op.put_key))
                elif kind == "get_range":
                    out.result.add(get_range=self._get_range(op.get_range))
                elif kind == "delete_range":
                    out.result.add(delete_range=self._delete_range(op.delete_range))
            return out

    def Watch(self, request_iterator, context):
        a = self.a
        out: "queue.Queue" = queue.Queue()
        stream = object()

        def read_requests():
            try:
                for req in request_iterator:
                    kind = req.WhichOneof("request")
                    with a.lock:
                        if kind == "create":
                            c = req.create
                            wid = next(a.watch_ids)
                            etype = pb.WatchCreateRequest.Type.Name(c.event_type)
                            a.watchers[wid] = (c.start, c.end, etype in ("ALL", "PUT"),
                                               etype in ("ALL", "DELETE"), out, stream)
                            out.put(pb.WatchResponse(type=pb.WatchResponse.CREATE, watch_id=wid))
                        elif kind == "cancel":
                            wid = req.cancel.watch_id
                            if wid in a.watchers and a.watchers[wid][5] is stream:
                                del a.watchers[wid]
                            out.put(pb.WatchResponse(type=pb.WatchResponse.CANCEL, watch_id=wid))
            except Exception:  # stream cancelled or server stopping
                pass
            finally:
                out.put(None)

        if not context.add_callback(lambda: out.put(None)):
            return
        threading.Thread(target=read_requests, daemon=True, name="fakeyarn-watch").start()
        try:
            while True:
                item = out.get()
                if item is None:
                    return
                yield item
        finally:
            with a.lock:
                for wid in [w for w, v in a.watchers.items() if v[5] is stream]:
                    del a.watchers[wid]

    AddProxy = _abort_unimplemented("AddProxy")
    RemoveProxy = _abort_unimplemented("RemoveProxy")
    UiInfo = _abort_unimplemented("UiInfo")
    GetProxies = _abort_unimplemented("GetProxies")


class FakeYarn:
    """A one-machine YARN with skein's driver: see the module docstring for the semantics.

    Parameters
    ----------
    workdir : path, optional
        Root of the node's directories (``nm-local-dir/``, ``userlogs/``). Default: a
        new temporary directory, removed by :meth:`stop` unless ``keep_workdir``.
    security : skein.Security, optional
        Credentials of the driver and of applications that bring none in
        ``spec.master.security``. Default: freshly minted.
    host : str
        Loopback address the servers listen on; also ``NM_HOST`` and the reports' host.
    user : str, optional
        The user applications run as when the spec names none. Default: the current user.
    am_max_attempts : int
        YARN's cap on application attempts (``yarn.resourcemanager.am.max-attempts``).
    resolve_file : callable(source, dest), optional
        Called at submit for every file whose source is not a local path
        (``hdfs://...``); must write the file (or archive) at ``dest``.
    accept_delay : float
        Seconds an application stays ACCEPTED before its AM starts.
    kill_grace : float
        Seconds between SIGTERM and SIGKILL when a container is stopped.
    base_env : mapping, optional
        Environment every container inherits (the node manager's). Default: this
        process's environment, less variables that identify a YARN container.
    logs_while_running : bool
        Let ``getLogs`` answer before the application completes (skein refuses).
    keep_workdir : bool, optional
        Keep the working directory on :meth:`stop` (default: keep only a given one).

    Attributes
    ----------
    address : str
        ``host:port`` of the Driver service (after :meth:`start`).
    security, workdir (Path), host, user, cluster_timestamp, am_max_attempts,
    resolve_file, accept_delay, kill_grace, base_env, logs_while_running.
    """

    def __init__(self, workdir=None, *, security: Optional[skein.Security] = None,
                 host: str = "127.0.0.1", user: Optional[str] = None, am_max_attempts: int = 2,
                 resolve_file: Optional[Callable[[str, str], None]] = None,
                 accept_delay: float = 0.0, kill_grace: float = 0.25,
                 base_env: Optional[Mapping[str, str]] = None, logs_while_running: bool = False,
                 keep_workdir: Optional[bool] = None):
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.keep_workdir = (not self._own_workdir) if keep_workdir is None else keep_workdir
        self.security = security or skein.Security.new_credentials()
        self.host = host
        self.user = user or getpass.getuser()
        self.am_max_attempts = am_max_attempts
        self.resolve_file = resolve_file
        self.accept_delay = accept_delay
        self.kill_grace = kill_grace
        if base_env is None:
            base_env = {k: v for k, v in os.environ.items()
                        if not k.startswith("SKEIN_") and k not in _SCRUBBED}
        self.base_env = dict(base_env)
        self.logs_while_running = logs_while_running
        self.cluster_timestamp = _now_ms()
        self.address: Optional[str] = None
        self._server: Optional[grpc.Server] = None
        self._apps: dict = {}
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    # -------------------------------------------------------------- lifecycle

    def start(self) -> "FakeYarn":
        """Start the Driver service; returns self."""
        if self._server is not None:
            return self
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="fakeyarn-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        cert, key = self.security._get_bytes("cert"), self.security._get_bytes("key")
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="fakeyarn-driver"))
        pbg.add_DriverServicer_to_server(_DriverServicer(self), server)
        creds = grpc.ssl_server_credentials([(key, cert)], root_certificates=cert, require_client_auth=True)
        port = server.add_secure_port("%s:0" % self.host, creds)
        server.start()
        self._server = server
        self.address = "%s:%d" % (self.host, port)
        return self

    def stop(self) -> None:
        """Kill every application still running, stop all servers, clean up the workdir."""
        for app in self._app_list():
            app.kill("Application %s was killed: FakeYarn stopped" % app.id)
        if self._server is not None:
            self._server.stop(None).wait(5)
            self._server = None
        if self._own_workdir and not self.keep_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "FakeYarn":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def client(self) -> skein.Client:
        """A real ``skein.Client`` connected to this fake."""
        return skein.Client(address=self.address, security=self.security)

    # -------------------------------------------------------------- inspection

    def _new_application(self, spec: pb.ApplicationSpec) -> _Application:
        with self._lock:
            app = _Application(self, next(self._seq), spec)
            self._apps[app.id] = app
        return app

    def _app_list(self) -> list:
        with self._lock:
            return list(self._apps.values())

    def _get(self, app_id: str) -> _Application:
        try:
            return self._apps[app_id]
        except KeyError:
            raise KeyError("unknown application %r" % app_id) from None

    def applications(self) -> list:
        """Ids of all applications submitted, oldest first."""
        return [a.id for a in self._app_list()]

    def report(self, app_id: str) -> skein.model.ApplicationReport:
        """The application's report, as ``Client.application_report`` returns it."""
        return skein.model.ApplicationReport.from_protobuf(self._get(app_id).report())

    def wait(self, app_id: str, states: Iterable[str] = _TERMINAL, timeout: float = 30.0,
             attempt: Optional[int] = None) -> skein.model.ApplicationReport:
        """Block until the application is in one of ``states`` (default: completed),
        and, with ``attempt``, running that attempt number or a later one; returns its
        report. ``TimeoutError`` after ``timeout`` seconds."""
        app = self._get(app_id)
        states = {str(s) for s in states}
        deadline = time.monotonic() + timeout
        with app.lock:
            while not (app.state in states and (attempt is None or len(app.attempts) >= attempt)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("%s still %s after %.0f s (attempt %d)"
                                       % (app_id, app.state, timeout, len(app.attempts)))
                app.changed.wait(min(left, 0.5))
        return self.report(app_id)

    def attempt(self, app_id: str) -> int:
        """The number of the application's current attempt (0 before the first)."""
        return len(self._get(app_id).attempts)

    def containers(self, app_id: str, service: Optional[str] = None,
                   all: bool = False) -> list:
        """The running containers of the application's current attempt (those with a
        live process, master included), or with ``all=True`` every container of every
        attempt. ``service`` keeps one service's (``"master"`` for the AM's)."""
        app = self._get(app_id)
        with app.lock:
            attempts = app.attempts if all else app.attempts[-1:]
            out = [c for a in attempts for c in a.all_containers()]
        if not all:
            out = [c for c in out if c.alive]
        if service is not None:
            out = [c for c in out if (c.service or "master") == service]
        return out

    def container(self, app_id: str, which: str) -> FakeContainer:
        """A container of the current attempt by skein id (``"worker_0"``), ``"master"``,
        or YARN container id (any attempt)."""
        app = self._get(app_id)
        with app.lock:
            if which.startswith("container_"):
                cands = [c for a in app.attempts for c in a.all_containers() if c.yarn_id == which]
            elif which == "master":
                cands = [app.current.master] if app.current else []
            else:
                cands = [c for c in (app.current.all_containers() if app.current else [])
                         if c.id == which]
        if not cands:
            raise KeyError("no container %r in %s" % (which, app_id))
        return cands[0]

    def kill_container(self, app_id: str, which: str, sig: int = signal.SIGKILL,
                       wait: bool = True) -> FakeContainer:
        """Kill a container's process group with ``sig`` from outside YARN (a crash, the
        OOM killer): the container FAILS, and is restarted if its service has restarts
        left; killing ``"master"`` fails the attempt. With ``wait``, returns once the
        process has exited. ``which`` is as for :meth:`container`."""
        c = self.container(app_id, which)
        c.kill(sig)
        if wait:
            c.exited.wait(10)
        return c

    def fail_attempt(self, app_id: str, exit_code: int = 137) -> None:
        """Simulate the AM container itself dying (never unregistering, e.g. the node is
        lost): all its containers stop; a new attempt starts if any are left, else the
        application ends in state FAILED. Returns once the attempt is torn down."""
        app = self._get(app_id)
        a = app.current
        if a is None:
            return
        a.shutdown("FAILED", "exitCode: %d." % exit_code, crashed=True)
        a.torn_down.wait(30)

    def kv(self, app_id: str) -> dict:
        """A snapshot of the current attempt's key-value store: key -> value (bytes)."""
        app = self._get(app_id)
        with app.lock:
            return {} if app.current is None else {k: v.value for k, v in app.current.kv.items()}

    def logs(self, app_id: str) -> dict:
        """YARN container id -> log text, available at any time."""
        return self._get(app_id).logs()

    def spec(self, app_id: str) -> skein.ApplicationSpec:
        return skein.ApplicationSpec.from_protobuf(self._get(app_id).spec)

    def app_dir(self, app_id: str) -> Path:
        """The application's ``LOCAL_DIRS`` (container working dirs live under it)."""
        return self._get(app_id).appcache

    def remote_files(self, app_id: str) -> list:
        """(source, target) of the non-local files recorded because no ``resolve_file``."""
        return list(self._get(app_id).remote_files)
