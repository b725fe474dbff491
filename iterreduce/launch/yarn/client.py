"""Submit, watch, read the logs of and kill applications: the client side of YARN jobs.

A :class:`skein.Client` talks to YARN through skein's driver: the one at
``$ITERREDUCE_SKEIN_DRIVER`` (``host:port``) when set, else skein's global driver
(``skein driver start``) when one runs, else a new driver (which needs ``java``
and ``yarn`` on PATH), logged in with a Kerberos keytab when one is given.

Nothing is written before YARN answers: without ``yarn`` on PATH no driver is started,
and skein's TLS credentials, when ``~/.skein`` has none, are made in memory and saved
there only once a driver has answered (skein itself would write them first).

Every application gets credentials of its own (:func:`submit`): its application master and
containers accept only them, so the user's skein certificate, which every other application
of the user and skein's driver hold, opens neither the application's key-value store (its
job token) nor the master-worker connections. They are kept for this user alone in
``~/.skein/applications/APP_ID/`` (:func:`application_dir`, files 0600 in folders 0700)
where ``status`` finds them, and removed once ``status`` sees the application ended.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


from ...exceptions import STOPPED_ON_BAD_DATA, HadoopConfigError
from ...storage import hadoopconf, kerberos
from ...storage.filesystems import kerberos_login, keytab_login
from . import KV_LINKS, KV_PROGRESS, KV_SLOT, KV_UI, KV_WORKERS, KV_WORKERS_ASKED, YarnError
from .skein_import import skein


def _config_dir() -> str:
    """skein's configuration folder: ``$SKEIN_CONFIG`` (read now, not at import) or ``~/.skein``."""
    return os.environ.get("SKEIN_CONFIG") or str(Path.home() / ".skein")


def security() -> skein.Security:
    """skein's TLS credentials from :func:`_config_dir`, or new ones held in memory when it
    has none (:func:`connect` saves them there once a driver has answered)."""
    try:
        return skein.Security.from_directory(_config_dir())
    except FileNotFoundError:
        return skein.Security.new_credentials()


def _keep(credentials: skein.Security) -> None:
    """Save credentials made in memory to skein's folder, as skein would, so that later
    clients (``dbn status``) talk to this client's applications with the same ones."""
    if credentials.cert_bytes is None:  # read from files: already there
        return
    try:
        credentials.to_directory(_config_dir())
    except FileExistsError:
        pass  # another client saved its own meanwhile; this one's still serve this client
    except OSError as exc:
        logging.getLogger(__name__).warning("cannot save skein's credentials in %s: %s", _config_dir(), exc)


#: The logger of a driver started here: its Java log, a line a record at DEBUG (``dbn --debug`` shows
#: them); a terminal shows the project's own words only.
DRIVER_LOGGER = "iterreduce.launch.yarn.driver"


class DriverLog:
    """The Java log of a skein driver this process starts, read from a pipe (no file is written):
    each line goes to :data:`DRIVER_LOGGER` at DEBUG, and the last ones are kept for the message
    of an error. Give :attr:`path` as skein's ``log``, then call :meth:`started`."""

    LINES_KEPT = 30
    LINE_BYTES = 8192  # longer lines are cut: the memory kept stays bounded

    def __init__(self):
        read, self._write = os.pipe()
        self.path = f"/dev/fd/{self._write}"  # skein opens its log by path
        self.lines: collections.deque[str] = collections.deque(maxlen=self.LINES_KEPT)
        self.ended = threading.Event()  # the driver's end of the pipe closed: all its lines are read
        threading.Thread(target=self._read, args=(read,), name="skein-driver-log", daemon=True).start()

    def started(self) -> None:
        """Close this process's end: the driver holds its own, and the reader ends with the driver."""
        if self._write is not None:
            os.close(self._write)
            self._write = None

    def _read(self, fd: int) -> None:
        log = logging.getLogger(DRIVER_LOGGER)
        try:
            with open(fd, "rb") as pipe:
                for raw in iter(lambda: pipe.readline(self.LINE_BYTES), b""):
                    line = raw.decode(errors="replace").rstrip()
                    self.lines.append(line)
                    log.debug("%s", line)
        finally:
            self.ended.set()

    def tail(self) -> str:
        """The last lines the driver logged (joined), or "" when it logged none."""
        return "\n".join(self.lines)


class _Client(skein.Client):
    """skein's client, except that one whose driver never started does not print an
    "Exception ignored in __del__" traceback (skein's ``close`` reads ``_proc``, which its
    ``__init__`` sets only once a driver runs)."""

    __slots__ = ()

    def close(self):
        if hasattr(self, "_proc"):
            super().close()


def _driver_missing() -> str | None:
    """Why skein cannot start a driver here (no ``yarn`` or no ``java``), or None."""
    java = hadoopconf.java()
    if not shutil.which("yarn"):
        return "no `yarn` command on PATH (Hadoop's client: skein's driver needs its classpath)"
    if not java or not os.path.exists(java):
        return "no `java` (set JAVA_HOME or put java on PATH)"
    return None


def check_kerberos(principal: str | None, keytab: str | None) -> None:
    """Raise :class:`YarnError` unless both or neither are given, and the keytab exists."""
    if bool(principal) != bool(keytab):
        raise YarnError("Kerberos needs both --principal and --keytab (or neither, to use the ticket cache)")
    if keytab and not Path(keytab).expanduser().is_file():
        raise YarnError(f"{keytab}: keytab file not found")


def _java_reads_krb5_config() -> None:
    """Let a driver started here read Kerberos's configuration where MIT's library does: Java reads
    no ``KRB5_CONFIG``, only ``-Djava.security.krb5.conf`` (else /etc/krb5.conf), so a ``KRB5_CONFIG``
    naming one file is added to ``SKEIN_DRIVER_JAVA_OPTIONS`` unless that names one already."""
    config = os.environ.get("KRB5_CONFIG", "")
    options = os.environ.get("SKEIN_DRIVER_JAVA_OPTIONS", "")
    if config and ":" not in config and "java.security.krb5.conf" not in options:
        os.environ["SKEIN_DRIVER_JAVA_OPTIONS"] = f"{options} -Djava.security.krb5.conf={config}".strip()


def connect(principal: str | None = None, keytab: str | None = None) -> skein.Client:
    """A client of skein's driver (see the module docstring), refused with a clear error when the
    ResourceManager refuses it (:func:`_check_allowed`). Where the cluster's client configuration
    asks for Kerberos, the credentials are checked first (:func:`iterreduce.storage.kerberos.check_client`)."""
    return _check_allowed(_connect(principal, keytab))


def _connect(principal: str | None, keytab: str | None) -> skein.Client:
    check_kerberos(principal, keytab)
    kerberos.check_client(principal, keytab)
    kerberos_login(principal, keytab)  # HDFS as YARN: with the keytab where one is given
    _java_reads_krb5_config()
    address = os.environ.get("ITERREDUCE_SKEIN_DRIVER")
    driver_log = None
    hint = "Check that `java` and `yarn` are on PATH and HADOOP_CONF_DIR points at the cluster's configuration"
    try:
        if address:
            return skein.Client(address=address, security=security())
        if not keytab:
            try:
                return skein.Client.from_global_driver()
            except skein.exceptions.DriverNotRunningError:
                pass
        missing = _driver_missing()
        if missing:  # before skein starts anything, or writes anything
            raise YarnError(f"cannot reach YARN: {missing}. {hint}, or set ITERREDUCE_SKEIN_DRIVER to a running "
                            f"skein driver's host:port")
        credentials = security()
        driver_log = DriverLog()
        try:
            client = _Client(security=credentials, principal=principal,
                             keytab=keytab and str(Path(keytab).expanduser()), log=driver_log.path)
        finally:
            driver_log.started()
        _keep(credentials)
        return client
    except (skein.exceptions.DriverError, ConnectionError, subprocess.CalledProcessError, OSError) as exc:
        said = _driver_said(driver_log)
        why = kerberos.explain(f"{exc}\n{said}")
        if why:
            raise YarnError(f"YARN refused skein's driver: {why}") from exc
        raise YarnError(f"cannot reach YARN through skein's driver: {str(exc).rstrip('.')}. {hint}"
                        + (f". The driver's last words:\n{said}" if said else "")) from exc


def _driver_said(driver_log: DriverLog | None, wait: float = 5.0) -> str:
    """The tail of a failed driver's log, once its reader has read to the end (at most ``wait`` s)."""
    if driver_log is None:
        return ""
    driver_log.ended.wait(wait)
    return driver_log.tail()


def _check_allowed(client: skein.Client) -> skein.Client:
    """``client``, once a small question to the ResourceManager shows it is let in: skein's driver
    starts without asking anything, and later answers some refusals (a client configured without
    Kerberos for a cluster that wants it) as "Unknown ApplicationId". A refusal for Kerberos raises
    :class:`YarnError` saying what to do; any other answer, "no such queue" included, lets it be."""
    try:
        client.get_queue("default")
    except Exception as exc:  # noqa: BLE001 - only a Kerberos refusal is decided here
        why = kerberos.explain(exc)
        if why:
            client.close()
            raise YarnError(f"the ResourceManager refused this client: {why}") from None
    return client


_RESOURCES = (("memory", "MiB of memory"), ("vcores", "vcores"), ("gpus", "GPUs (yarn.io/gpu)"))


def check_fits(client: skein.Client, spec: skein.ApplicationSpec) -> None:
    """Raise :class:`YarnError` if the cluster can never run ``spec``: a container larger than
    every node, or more of a resource in all containers together than all nodes have.

    YARN itself would leave such an application waiting (or fail it deep inside the
    application master), so ask the ResourceManager's node reports first.
    """
    try:
        nodes = [n for n in client.get_nodes() if str(n.state) == "RUNNING"]
    except (skein.exceptions.DriverError, ValueError, ConnectionError):
        return  # no node reports (e.g. no permission): let YARN decide
    if not nodes:
        raise YarnError("the cluster has no running NodeManager: nothing could run the application")
    labels = sorted({spec.node_label, *(s.node_label for s in spec.services.values())} - {""})
    for label in labels:
        if not any(label in (n.labels or ()) for n in nodes):
            known = sorted({label for n in nodes for label in (n.labels or ())})
            raise YarnError(f"no running node has the node label {label!r} (the nodes' labels: "
                            f"{', '.join(known) or 'none'}): YARN would leave the job waiting for ever")
    if not labels:  # a queue's share of a labelled partition is another matter: YARN decides
        _check_queue_room(client, spec, nodes)
    wanted = [("the application master", spec.master.resources, 1)]
    wanted += [("each worker container", s.resources, s.instances) for s in spec.services.values()]
    for attr, unit in _RESOURCES:
        largest = max(getattr(n.total_resources, attr) for n in nodes)
        total = sum(getattr(n.total_resources, attr) for n in nodes)
        for what, res, _ in wanted:
            if getattr(res, attr) > largest:
                raise YarnError(f"{what} asks for {getattr(res, attr)} {unit}, but the largest of the cluster's "
                                f"{len(nodes)} nodes has {largest}: YARN could never place it")
        needed = sum(getattr(res, attr) * count for _, res, count in wanted)
        if needed > total:
            raise YarnError(f"the application needs {needed} {unit} at once (master and all workers), but the "
                            f"cluster's {len(nodes)} nodes have {total} in all: use fewer workers or less per worker")


def java_reason(message: str) -> str:
    """The reason in a Java error skein's driver passes on, in one line: its last line, without the
    "Failed to submit ... to YARN :" preamble and the exception's class name."""
    lines = [line.strip() for line in message.splitlines() if line.strip()] or [message]
    reason = re.sub(r"^Failed to submit \S+ to YARN\s*:\s*", "", lines[-1])
    return re.sub(r"^(?:[\w$]+\.)+[\w$]*(?:Exception|Error)\s*:\s*", "", reason)


def queue_share(client: skein.Client, queue: str) -> float | None:
    """The most of the cluster that ``queue`` may ever use, as a fraction: the product of the
    maximum capacities on its path from ``root`` (the CapacityScheduler's); None when the
    ResourceManager does not show it (another scheduler, no such queue, no permission)."""
    try:
        shares, frontier = {"root": 1.0}, ["root"]
        while frontier and queue not in shares:
            parent = frontier.pop()
            for child in client.get_child_queues(parent):
                shares[child.name] = shares[parent] * float(child.max_capacity) / 100
                frontier.append(child.name)
    except (skein.exceptions.DriverError, ValueError, ConnectionError, KeyError):
        return None
    return shares.get(queue)


def _check_queue_room(client: skein.Client, spec: skein.ApplicationSpec, nodes) -> None:
    """Raise :class:`YarnError` when the queue may never hold one of the application's containers."""
    share = queue_share(client, spec.queue)
    if share is None:
        return
    wanted = [("the application master", spec.master.resources)]
    wanted += [("a worker container", s.resources) for s in spec.services.values()]
    for attr, unit in _RESOURCES[:2]:
        room = share * sum(getattr(n.total_resources, attr) for n in nodes)
        for what, res in wanted:
            if getattr(res, attr) > room:
                raise YarnError(
                    f"queue {spec.queue!r} may hold at most {room:.0f} {unit} (its maximum capacity, "
                    f"{100 * share:.3g} % of the cluster), less than {what} ({getattr(res, attr)} {unit}): "
                    f"YARN would leave the job waiting for ever; choose another queue (--queue) or smaller containers")


def submit(client: skein.Client, spec: skein.ApplicationSpec) -> tuple[str, str]:
    """Check that the cluster can run ``spec`` (:func:`check_fits`), submit it with credentials
    of its own (``spec.master.security``: new ones unless the spec brings its own) and keep
    them for this user (:func:`keep_application_security`); returns the application id and
    its tracking URL."""
    check_fits(client, spec)
    if spec.master.security is None:
        spec.master.security = skein.Security.new_credentials()
    try:
        app_id = client.submit(spec)
    except (skein.exceptions.DriverError, ValueError, ConnectionError) as exc:
        raise YarnError(f"YARN refused the application: {java_reason(str(exc))}") from exc
    keep_application_security(app_id, spec.master.security)
    try:
        report = client.application_report(app_id)
    except (skein.exceptions.DriverError, ValueError, ConnectionError) as exc:
        raise YarnError(f"{app_id}: submitted, but YARN gave no report of it: {exc}") from exc
    return app_id, report.tracking_url or ""


def application_dir(app_id: str) -> Path:
    """Where an application's own credentials are kept: ``<skein's folder>/applications/APP_ID``."""
    if not app_id or "/" in app_id or app_id.startswith("."):
        raise YarnError(f"{app_id!r}: not an application id")
    return Path(_config_dir()) / "applications" / app_id


def keep_application_security(app_id: str, credentials: skein.Security) -> Path:
    """Save an application's credentials for this user alone (folders 0700, files 0600); returns
    the folder. Failing to save them fails the submission's follow-up, not the application: the
    error says where."""
    folder = application_dir(app_id)
    try:
        for path in (folder.parent.parent, folder.parent, folder):
            path.mkdir(mode=0o700, exist_ok=True)
        folder.parent.chmod(0o700)
        folder.chmod(0o700)
        credentials.to_directory(str(folder), force=True)  # skein writes them 0600
    except OSError as exc:
        raise YarnError(f"{app_id} was submitted, but its credentials could not be saved in {folder}: {exc}; "
                        f"`dbn status` cannot read its progress from this machine") from exc
    return folder


def application_security(app_id: str) -> skein.Security | None:
    """The application's own credentials as :func:`submit` kept them, or None when this user
    and machine have none (an application submitted elsewhere, or before applications had
    their own: skein's user credentials are tried then)."""
    folder = application_dir(app_id)
    if not (folder / "skein.crt").is_file():
        return None
    try:
        return skein.Security.from_directory(str(folder))
    except (OSError, ValueError) as exc:
        raise YarnError(f"{folder}: unreadable credentials of {app_id}: {exc}") from exc


def forget_application_security(app_id: str) -> None:
    """Remove an ended application's credentials (nothing answers them any more)."""
    shutil.rmtree(application_dir(app_id), ignore_errors=True)


def application(client: skein.Client, app_id: str, wait: bool = False) -> skein.ApplicationClient:
    """A client of the application's master, with the application's own credentials
    (:func:`application_security`)."""
    return client.connect(app_id, wait=wait, security=application_security(app_id))


@dataclass
class Status:
    """An application's state, with the job's newest progress record when it runs."""

    app_id: str
    state: str
    final_status: str
    progress: float
    diagnostics: str
    tracking_url: str
    record: dict | None = None
    live_view: str = ""  # the job's live page through YARN's proxy, while it runs
    workers: list[dict] = field(default_factory=list)  # where each running worker is (container.placement)
    queue: str = ""
    containers: dict | None = None  # the keeper's count: wanted, running, pending (KV_WORKERS)
    links: dict[str, str] = field(default_factory=dict)  # where the job is shown beyond its page (KV_LINKS)

    def waiting(self) -> str:
        """What the job waits for, in a line ("" when it waits for nothing): its application
        master's container (ACCEPTED), or worker containers YARN has no room for yet."""
        if self.state in ("NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED"):
            return f"waiting for YARN to start its application master in queue {self.queue!r}"
        c = self.containers or {}
        if self.state == "RUNNING" and c.get("pending"):
            return (f"{c.get('running', 0)} of {c.get('wanted', '?')} workers running; {c['pending']} containers "
                    f"pending in queue {c.get('queue') or self.queue!r}" + (
                        f" (node label {c['label']!r})" if c.get("label") else "") + ": YARN has no room for them yet")
        return ""

    def step_line(self) -> str:
        """The newest superstep, in a line ("" before the first)."""
        r = self.record
        if not r:
            return ""
        where = " ".join(f"{k} {r[k]}" for k in ("layer", "epoch") if k in r)
        return f"superstep {r['step'] + 1} of {r['of']}: {r['phase']} {where}".rstrip()

    def describe(self) -> str:
        """A few human lines."""
        lines = [f"{self.app_id}: {self.state} ({self.final_status}), progress {100 * self.progress:.0f} %"]
        if waiting := self.waiting():
            lines.append(f"  {waiting}")
        if self.record:
            lines.append(f"  {self.step_line()}")
        if self.workers:
            lines.append("  workers: " + ", ".join(
                f"{w['name']} on {w['host']}" + ("" if w.get("local") is None else f" ({100 * w['local']:.0f} % "
                                                                                   f"of its data there)")
                for w in self.workers))
        if self.tracking_url:
            lines.append(f"  tracking URL: {self.tracking_url}")
        if self.live_view:
            lines.append(f"  live view: {self.live_view}")
        for name, url in self.links.items():
            lines.append(f"  {name.replace('_', ' ')}: {url}")
        if self.diagnostics:
            lines.append(f"  diagnostics: {self.diagnostics}")
        return "\n".join(lines)


def status(client: skein.Client, app_id: str) -> Status:
    """The application's report, plus the master's newest progress record while it runs."""
    try:
        report = client.application_report(app_id)
    except (skein.exceptions.DriverError, ValueError, KeyError) as exc:
        raise YarnError(f"{app_id}: no such application ({exc})") from exc
    result = Status(app_id, str(report.state), str(report.final_status), float(report.progress),
                    report.diagnostics or "", report.tracking_url or "", queue=str(report.queue or ""))
    if str(report.state) in TERMINAL_STATES:
        forget_application_security(app_id)
    elif str(report.state) == "RUNNING":
        try:
            kv = application(client, app_id).kv
            value = kv.get(KV_PROGRESS)
            result.record = json.loads(value) if value else None
            result.live_view = (kv.get(KV_UI) or b"").decode()
            result.links = _links(kv.get(KV_LINKS))
            result.workers = _placements(kv.get_prefix(KV_SLOT))
            result.containers = json.loads(kv.get(KV_WORKERS) or b"null")
        except Exception:  # noqa: BLE001 - the report alone is still an answer
            pass
    return result


TERMINAL_STATES = ("FINISHED", "FAILED", "KILLED")


def _links(value: bytes | None) -> dict[str, str]:
    """The job's links as its master put them (``{name: URL}``), web addresses only; {} for anything else."""
    try:
        found = json.loads(value or b"{}")
    except ValueError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(name): url for name, url in found.items()
            if isinstance(url, str) and url.startswith(("http://", "https://"))}


def _placements(slots: dict[str, bytes]) -> list[dict]:
    """The running workers' places, from their slot keys (``{"name", "host", "local"}``, by slot)."""
    found = []
    for key, value in slots.items():
        slot = key.removeprefix(KV_SLOT)
        try:
            where = json.loads(value)
        except ValueError:
            continue
        if slot.isdigit() and isinstance(where, dict):
            local = where.get("local")
            found.append({"name": f"worker-{slot}", "host": str(where.get("host", "")),
                          "local": local if isinstance(local, (int, float)) else None})
    return sorted(found, key=lambda w: int(w["name"].rsplit("-", 1)[1]))


def wait(client: skein.Client, app_id: str, poll: float = 2.0, on_status=None) -> Status:
    """Poll the application until it ends; returns its last status. ``on_status`` sees each one."""
    while True:
        st = status(client, app_id)
        if on_status:
            on_status(st)
        if st.state in TERMINAL_STATES:
            return st
        time.sleep(poll)


def follow(client: skein.Client, app_id: str, show, start_timeout: float | None = None) -> Status:
    """Wait for the application to end, calling ``show(line)`` with each new one-line status
    (state, what it waits for, and the newest superstep while it runs); returns the last status.
    An application YARN has not started within ``start_timeout`` seconds (its queue full) is
    killed: :class:`YarnError` says what it waited for."""
    shown: list[str] = []
    pages: set[str] = set()
    since = time.monotonic()

    def on_status(st: Status) -> None:
        if st.live_view and st.live_view not in pages:  # once per application master attempt
            pages.add(st.live_view)
            show(f"live view: {st.live_view}")
        line = " | ".join(part for part in (st.describe().splitlines()[0], st.waiting(), st.step_line()) if part)
        if line not in shown[-1:]:
            shown.append(line)
            show(line)
        if start_timeout is not None and st.state not in ("RUNNING", *TERMINAL_STATES) and \
                time.monotonic() - since > start_timeout:
            kill(client, app_id)
            raise YarnError(f"{app_id} was not started within {start_timeout:g} s, {st.waiting()}"
                            + (f" (YARN: {st.diagnostics})" if st.diagnostics else "") + ": killed")

    return wait(client, app_id, on_status=on_status)


def stopped_on_bad_data(st: Status) -> bool:
    """Whether the application ended because its data cannot be used (the user's to fix),
    not because it crashed."""
    return st.final_status == "FAILED" and STOPPED_ON_BAD_DATA in (st.diagnostics or "")


def ended_badly(st: Status) -> str:
    """Why an application that did not succeed ended, and where to look."""
    return f"{st.app_id} ended {st.final_status}: {st.diagnostics or 'no diagnostics'}; its logs (`yarn logs -applicationId {st.app_id}`) say why"


#: How long after an application's end :func:`logs` waits for YARN to aggregate its logs
#: (the NodeManagers upload them once the containers are gone: seconds, on a busy cluster more).
AGGREGATION_WAIT = 120.0


def logs(client: skein.Client, app_id: str, show=None, poll: float = 3.0) -> str:
    """The application's container logs, one section per container.

    skein reads aggregated logs where Hadoop up to 3.2 writes them; Hadoop 3.3+ writes them
    into ``bucket-*`` folders that skein 0.8 does not know, and only the cluster's own
    ``yarn logs`` reads both (and running containers' logs too), so that is the fallback.
    An application that ended less than :data:`AGGREGATION_WAIT` seconds ago may not have
    its logs aggregated yet: then this waits for them, telling ``show(line)`` once.
    """
    told = False
    while True:
        text, why = _logs_once(client, app_id)
        if text is not None:
            return text
        ended = _seconds_since_end(client, app_id)
        if ended is None or ended > AGGREGATION_WAIT:
            raise YarnError(f"{app_id}: no logs ({why}); log aggregation may still be running: try again in a "
                            f"minute")
        if show is not None and not told:
            show(f"{app_id} ended {ended:.0f} s ago: waiting up to {AGGREGATION_WAIT:.0f} s for YARN to "
                 f"aggregate its logs")
            told = True
        time.sleep(poll)


def _logs_once(client: skein.Client, app_id: str) -> tuple[str | None, str]:
    """The logs through skein, else through ``yarn logs``; or None and why neither had them."""
    try:
        parts = client.application_logs(app_id)
        return "\n".join(f"===== {container} =====\n{text}" for container, text in sorted(parts.items())), ""
    except (skein.exceptions.DriverError, ValueError, KeyError) as exc:
        reason = str(exc)
    text, why = _yarn_logs(app_id)
    return text, f"skein: {reason}; yarn logs: {why}"


def _seconds_since_end(client: skein.Client, app_id: str) -> float | None:
    """Seconds since the application ended; None while it runs, or when YARN does not know it."""
    try:
        report = client.application_report(app_id)
    except (skein.exceptions.DriverError, ValueError, KeyError):
        return None
    if str(report.state) not in TERMINAL_STATES or report.finish_time is None:
        return None
    return max(0.0, time.time() - report.finish_time.timestamp())  # skein's naive local time


def _yarn_logs(app_id: str, timeout: float = 300) -> tuple[str | None, str]:
    """``yarn logs -applicationId APP``'s output, or None and why not. Hadoop's tool takes no keytab:
    a client logged in with one (:func:`~iterreduce.storage.filesystems.kerberos_login`) lends it a ticket from it,
    in a ticket cache of its own (:func:`iterreduce.storage.kerberos.keytab_ticket`)."""
    yarn = shutil.which("yarn")
    if yarn is None:
        return None, "no `yarn` command on PATH"
    try:
        with kerberos.keytab_ticket(*keytab_login()) as env:
            # A few tries at a NodeManager that cannot serve a container's log, not Hadoop's 30 (minutes in all).
            proc = subprocess.run([yarn, "logs", "-applicationId", app_id, "-client_max_retries", "2",
                                   "-client_retry_interval_ms", "1000"], capture_output=True, text=True,
                                  timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired, HadoopConfigError) as exc:
        return None, str(exc)
    if proc.returncode != 0 or "LogType:" not in proc.stdout:
        lines = [line for line in proc.stderr.splitlines() if " INFO " not in line and " WARN " not in line]
        return None, (lines[-1] if lines else f"exit {proc.returncode}, no logs")
    return proc.stdout, ""


def set_priority(app_id: str, priority: int, timeout: float = 120) -> int:
    """Give application ``app_id`` ``priority`` in its queue through Hadoop's ``yarn application
    -updatePriority`` (skein's spec has no priority); returns the priority YARN then reports
    (``-status``: never above the cluster's ``yarn.cluster.max-application-priority``). Raises
    :class:`YarnError` saying why not."""
    update = _yarn_application(["-appId", app_id, "-updatePriority", str(priority)], timeout)
    status = _yarn_application(["-status", app_id], timeout)
    granted = re.search(r"^\s*(?:Application )?Priority\s*:\s*(-?\d+)\s*$", status, re.MULTILINE)
    if granted is None:
        raise YarnError(f"`yarn application -status {app_id}` shows no priority (the update said: "
                        f"{update.strip().splitlines()[-1] if update.strip() else 'nothing'})")
    return int(granted.group(1))


def _yarn_application(args: list[str], timeout: float) -> str:
    """The output of Hadoop's ``yarn application ARGS`` (with the keytab's ticket where the client
    logged in with one); raises :class:`YarnError` with its last words when it fails."""
    yarn = shutil.which("yarn")
    if yarn is None:
        raise YarnError("no `yarn` command on PATH")
    try:
        with kerberos.keytab_ticket(*keytab_login()) as env:
            proc = subprocess.run([yarn, "application", *args], capture_output=True, text=True, timeout=timeout,
                                  env=env)
    except (OSError, subprocess.TimeoutExpired, HadoopConfigError) as exc:
        raise YarnError(str(exc)) from exc
    if proc.returncode != 0:
        said = [line for line in (proc.stderr + proc.stdout).splitlines()
                if line.strip() and " INFO " not in line and " WARN " not in line]
        raise YarnError(said[-1] if said else f"`yarn application {args[0]}` exit {proc.returncode}")
    return proc.stdout


def workers_of(app: skein.ApplicationClient) -> dict | None:
    """What a running job's master wants (``{"wanted": N, "most": shards}``), None before it said."""
    try:
        state = json.loads(app.kv.get(KV_WORKERS) or b"null")
        return state if isinstance(state, dict) and {"wanted", "most"} <= set(state) else None
    except ValueError:
        return None


def scale(client: skein.Client, app_id: str, workers: int, timeout: float = 60.0) -> int:
    """Have running application ``app_id`` work with ``workers`` workers from its next step on
    (``dbn scale``): its master retires those no longer wanted, or asks YARN for more containers.
    Waits until the master took the number; returns the number it had."""
    try:
        app = application(client, app_id)
        state = workers_of(app)
    except (skein.exceptions.SkeinError, ValueError, KeyError, ConnectionError) as exc:
        raise YarnError(f"{app_id}: cannot reach the running job ({exc})") from exc
    if state is None:
        raise YarnError(f"{app_id}: its master has not said how many workers it has (still starting, or not a job "
                        f"of this project): try again in a few seconds")
    if not 1 <= workers <= int(state["most"]):
        raise YarnError(f"--workers {workers}: {app_id} can have 1 to {state['most']} workers (one shard each at most)")
    app.kv[KV_WORKERS_ASKED] = str(workers).encode()
    deadline = time.monotonic() + timeout
    while (now := workers_of(app)) is None or now["wanted"] != workers:
        if time.monotonic() > deadline:
            raise YarnError(f"{app_id}: its master did not take {workers} workers within {timeout:.0f} s")
        time.sleep(0.5)
    return int(state["wanted"])


def kill(client: skein.Client, app_id: str) -> None:
    """Kill the application."""
    try:
        client.kill_application(app_id)
    except (skein.exceptions.DriverError, ValueError, KeyError) as exc:
        raise YarnError(f"{app_id}: cannot kill: {exc}") from exc
