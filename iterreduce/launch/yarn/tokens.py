"""Fresh HDFS delegation tokens for an application that outlives its first ones.

On a Kerberos cluster a container holds no ticket, only the delegation tokens the
submission obtained (``HADOOP_TOKEN_FILE_LOCATION``). YARN renews them while the
application runs, but never past their maximum lifetime (``dfs.namenode.delegation.
token.max-lifetime``, a week by default): after that, HDFS refuses the containers.

A job submitted with ``--principal/--keytab`` does as Spark does for long-running
applications: the keytab goes to the application master alone, whose master obtains new
tokens with it (:class:`TokenRefresher`, through Hadoop's own ``dtutil`` tool run on the
container's Hadoop classpath) well before the current ones would expire, uses them itself
and puts them in the application's key-value store, readable only with the application's
own credentials. Every worker follows that key (:func:`follow`) and hands each new set to
its HDFS client. No worker ever holds the keytab.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from pathlib import Path

from ...exceptions import JobFailed
from ...storage import hadoopconf
from ...storage.filesystems import filesystem

log = logging.getLogger("iterreduce.yarn")

#: The key-value store's key of the newest token file (Hadoop's token storage format, bytes).
KV_TOKENS = "iterreduce/hdfs-tokens"
#: The keytab's name in the application master's container (shipped to it alone).
KEYTAB_FILE = "principal.keytab"
#: The application master's environment: the keytab's principal ...
PRINCIPAL_VAR = "ITERREDUCE_PRINCIPAL"
#: ... and the file systems to obtain tokens for (comma-separated ``hdfs://`` URIs).
FILE_SYSTEMS_VAR = "ITERREDUCE_TOKEN_FILE_SYSTEMS"
#: Set in the workers' environment when their master renews the tokens.
FROM_MASTER_VAR = "ITERREDUCE_TOKENS_FROM_MASTER"
#: Where a container keeps the tokens it was handed (its working folder: the container's own).
TOKEN_FILE = ".hdfs-tokens"
#: Hadoop's tool that obtains tokens (``hadoop dtutil``), and how long one run may take.
DTUTIL = "org.apache.hadoop.security.token.DtUtilShell"
FETCH_TIMEOUT_S = 120.0
#: hdfs-native ignores a token this close to its maximum lifetime.
CLIENT_MARGIN_S = 60.0
#: Bounds of the time between two fetches, and after a failed one.
MIN_REFRESH_S, RETRY_S = 5.0, 30.0


def refresh_interval() -> float:
    """Seconds between two fetches: half the shorter of the tokens' renewal interval (a token
    no one renews dies after it) and their maximum lifetime less :data:`CLIENT_MARGIN_S`, as
    the cluster's configuration gives them (Hadoop's defaults, a day and a week, where it is
    silent)."""
    renew = _seconds("dfs.namenode.delegation.token.renew-interval", 86_400.0)
    lifetime = _seconds("dfs.namenode.delegation.token.max-lifetime", 7 * 86_400.0)
    return max(MIN_REFRESH_S, min(renew, lifetime - CLIENT_MARGIN_S) / 2)


def _seconds(name: str, default: float) -> float:
    value = hadoopconf.get(name)
    try:
        return int(value) / 1000 if value else default
    except ValueError:
        return default


def fetch(principal: str, keytab: str, file_systems: list[str], out: Path) -> bytes:
    """New HDFS delegation tokens for each of ``file_systems``, obtained as ``principal`` with
    ``keytab`` by Hadoop's ``dtutil`` on the container's Hadoop classpath (``$CLASSPATH``, else
    :func:`~iterreduce.storage.hadoopconf.application_classpath`),
    written to ``out``; returns the token file's bytes. Raises :class:`JobFailed` saying why."""
    dtutil = hadoopconf.java_tool(DTUTIL)
    if dtutil is None:
        raise JobFailed("cannot obtain HDFS delegation tokens: no java (JAVA_HOME) or no Hadoop classpath "
                        "(yarn.application.classpath) in the application master's container")
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    for uri in file_systems:  # dtutil adds each file system's token to the file
        command = [*dtutil, "-keytab", keytab, "-principal", principal, "get", uri,
                   "-renewer", principal.split("@")[0].split("/")[0], "-format", "protobuf", str(partial)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise JobFailed(f"cannot obtain HDFS delegation tokens for {uri} as {principal}: {exc}") from exc
        if done.returncode != 0 or not partial.is_file():
            raise JobFailed(f"cannot obtain HDFS delegation tokens for {uri} as {principal} with its keytab (dtutil "
                            f"exit {done.returncode}): {hadoopconf.tool_output_tail(done.stdout, done.stderr)}")
    os.chmod(partial, 0o600)
    data = partial.read_bytes()
    os.replace(partial, out)
    return data


def use(data: bytes, path: Path | None = None) -> Path:
    """Make ``data`` (a token file) this process's HDFS tokens: written whole (0600) to ``path``
    (default :data:`TOKEN_FILE` in the working folder), which ``HADOOP_TOKEN_FILE_LOCATION``
    then names; hdfs-native reads it at each new connection. Returns the file's path."""
    path = (path or Path(TOKEN_FILE)).resolve()
    partial = path.with_name(path.name + f".{os.getpid()}.{threading.get_ident()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(partial, path)
    os.environ["HADOOP_TOKEN_FILE_LOCATION"] = str(path)
    return path


class TokenRefresher:
    """In the application master of a job submitted with a keytab: obtains new tokens now and
    every :func:`refresh_interval` seconds, uses them (:func:`use`) and publishes them to the
    workers (``publish(data)``, the key-value store's :data:`KV_TOKENS`).

    :meth:`from_container` builds one from the container (None without a keytab there)."""

    def __init__(self, principal: str, keytab: str, file_systems: list[str], publish, interval: float | None = None):
        self.principal = principal
        self.keytab = keytab
        self.file_systems = file_systems
        self.publish = publish
        self.interval = interval
        self.fetched = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_container(cls, publish) -> "TokenRefresher | None":
        """The refresher this container's keytab and environment describe, or None (no keytab:
        a job submitted with a ticket cache keeps the tokens of its submission)."""
        principal = os.environ.get(PRINCIPAL_VAR, "")
        if not principal or not Path(KEYTAB_FILE).is_file():
            return None
        file_systems = [uri for uri in os.environ.get(FILE_SYSTEMS_VAR, "").split(",") if uri]
        default_fs = hadoopconf.get("fs.defaultFS", "")
        if default_fs.startswith(("hdfs://", "viewfs://")) and default_fs not in file_systems:
            file_systems.append(default_fs)
        if not file_systems:
            return None
        return cls(principal, str(Path(KEYTAB_FILE).resolve()), file_systems, publish)

    def refresh(self) -> None:
        """Obtain, use and publish new tokens once (raises :class:`JobFailed` when they cannot be had)."""
        data = fetch(self.principal, self.keytab, self.file_systems, Path(TOKEN_FILE + ".fetched").resolve())
        use(data)
        self.publish(data)
        self.fetched += 1
        log.info("new HDFS delegation tokens (set %d) for %s, obtained as %s with its keytab; handed to the workers",
                 self.fetched, ", ".join(self.file_systems), self.principal)

    def start(self) -> "TokenRefresher":
        """:meth:`refresh` now (a failure fails the job: it could not outlive its tokens), then in
        the background every :attr:`interval` seconds (a failure is retried sooner, and logged)."""
        self.interval = self.interval or refresh_interval()
        started = time.monotonic()
        self.refresh()
        self._thread = threading.Thread(target=self._run, args=(started + self.interval,), name="token-refresher",
                                        daemon=True)
        self._thread.start()
        log.info("HDFS delegation tokens are renewed every %.0f s", self.interval)
        return self

    def _run(self, next_at: float) -> None:
        # The interval counts from the start of each fetch: one takes a Java start and a Kerberos
        # login, seconds on a busy node, and the tokens' time runs from when the NameNode issued them.
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            started = time.monotonic()
            try:
                self.refresh()
                next_at = started + self.interval
            except Exception as exc:  # noqa: BLE001 - the current tokens still serve a while: try again
                wait = min(self.interval, RETRY_S)
                next_at = time.monotonic() + wait
                log.warning("%s; trying again in %.0f s", exc, wait)

    def stop(self, timeout: float | None = 0.0) -> None:
        """No more fetches; waits up to ``timeout`` seconds (None: for ever) for one under way."""
        self._stop.set()
        if self._thread is not None and timeout != 0.0:
            self._thread.join(timeout)


def remove_staged_keytab(app) -> str | None:
    """Delete the copy of the keytab that skein staged on HDFS for this application (the source of
    the master's :data:`KEYTAB_FILE` in the application's own spec), once the application ends:
    skein's application master deletes its staging folder then, but not when the submission's
    tokens have expired. Returns the copy's URI, or None where there was none; a failure is
    logged, never raised (the job's outcome stands)."""
    try:
        staged = app.get_specification().master.files.get(KEYTAB_FILE)
        if staged is None or not staged.source.startswith("hdfs://"):
            return None
        fs, path = filesystem(staged.source)
        fs.delete_file(path)
        log.info("deleted the keytab's staged copy %s", staged.source)
        return staged.source
    except Exception as exc:  # noqa: BLE001 - the job's outcome matters more; skein may still delete it
        log.warning("could not delete the keytab's staged copy: %s", exc)
        return None


def follow(app, path: Path | None = None) -> threading.Thread | None:
    """In a worker of a job whose master renews the tokens (:data:`FROM_MASTER_VAR` set): use
    the master's newest tokens (waiting for them), then each new set it publishes, in a
    background thread, which is returned. None for other jobs: the worker keeps the tokens
    YARN gave its container."""
    if not os.environ.get(FROM_MASTER_VAR):
        return None
    events = app.kv.events(key=KV_TOKENS, event_type="PUT")  # subscribed before reading: none missed
    use(app.kv.wait(KV_TOKENS), path)
    log.info("using the master's HDFS delegation tokens")

    def run() -> None:
        for event in events:
            try:
                use(event.result.value, path)
                log.info("using the master's new HDFS delegation tokens")
            except Exception as exc:  # noqa: BLE001 - the current tokens serve on; the next set may be usable
                log.warning("could not use the master's new HDFS delegation tokens: %s", exc)

    thread = threading.Thread(target=run, name="token-follower", daemon=True)
    thread.start()
    return thread
