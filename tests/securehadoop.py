"""A real, throw-away single-node Hadoop 3 secured with Kerberos, as production clusters are.

:class:`SecureHadoop` is :class:`minihadoop.MiniHadoop` (HDFS + YARN in one JVM) behind a
Kerberos KDC: Hadoop's MiniKdc (``hadoop/Kdc.java``, in a JVM of its own, jars from
``hadoop/minikdc-pom.xml``, about 4 MB, fetched by Maven once). HDFS and YARN then:

- take only Kerberos (``hadoop.security.authentication=kerberos``) or their delegation tokens,
  with service-level authorization on;
- encrypt RPC and the DataNode's block transfers (``hadoop.rpc.protection`` and
  ``dfs.data.transfer.protection`` = ``privacy``, block access tokens on);
- ask for SPNEGO on every web page and REST endpoint;
- hand out delegation tokens that must be renewed every :data:`TOKEN_RENEW_INTERVAL_S`
  seconds and die after :data:`TOKEN_MAX_LIFETIME_S` (production: a day and a week).

Without root: the DataNode runs on ordinary ports (``ignore.secure.ports.for.testing``, as
hdfs-native's and HBase's secured test clusters do), containers run as the NodeManager's user
(DefaultContainerExecutor, as Flink's secured YARN tests do) and get their tokens through
``HADOOP_TOKEN_FILE_LOCATION``. Hadoop's SecureIOUtils, which the NodeManager reads and writes
container logs with under Kerberos, wants libhadoop.so, which Maven's jars lack: a test-only stand-in
(``hadoop/secureio/``, compiled on first use) takes its place in the cluster's JVM. All of HDFS's and YARN's daemons share one service principal
(:data:`SERVICE`): they live in one JVM, where Hadoop keeps a single logged-in user.

The keytab holds :data:`SERVICE`, :data:`HTTP` and the user's own principal (the name of the
user who runs the tests, e.g. ``alice@EXAMPLE.COM``). :meth:`SecureHadoop.kinit` puts that
user's ticket in a private ticket cache (``KRB5CCNAME``), with MIT's ``kinit`` where installed
(Debian's krb5-user) and else from Java. :meth:`SecureHadoop.env` gives what clients need.

By hand::

    .venv/bin/python tests/securehadoop.py        # prints the exports, Ctrl-C stops it
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from minihadoop import HADOOP_VERSION, HERE, HadoopError, MiniHadoop, ToolMissing, cache_dir, fetch_jars  # noqa: F401

KDC_POM = HERE / "minikdc-pom.xml"
#: The test-only stand-in for Hadoop's SecureIOUtils (its comment says why), compiled on first use.
SECURE_IO_SHIM = HERE / "secureio" / "org" / "apache" / "hadoop" / "io" / "SecureIOUtils.java"
KDC_LAUNCHER = HERE / "Kdc.java"
#: The principal of every HDFS and YARN daemon (one JVM: one logged-in user), without the realm.
SERVICE = "hdfs/localhost"
#: The principal of the daemons' web endpoints (SPNEGO wants ``HTTP/<host>``), without the realm.
HTTP = "HTTP/localhost"
#: Delegation tokens (HDFS's and YARN's) expire unless renewed within this many seconds ...
TOKEN_RENEW_INTERVAL_S = 60
#: ... and cannot be renewed past this many seconds after they were issued.
TOKEN_MAX_LIFETIME_S = 300
KDC_STARTUP_TIMEOUT_S = 60


def ensure_kdc_jars() -> Path:
    """The folder of MiniKdc's jars (``hadoop/minikdc-pom.xml``), fetched by Maven on first use."""
    return fetch_jars(KDC_POM, cache_dir() / "minikdc-jars")


def secure_io_shim(java_home: str, jars: Path, version: str = HADOOP_VERSION) -> Path:
    """The folder of the compiled :data:`SECURE_IO_SHIM` (``javac`` once per version of its source and
    of Hadoop: ``jars`` are Hadoop ``version``'s)."""
    import hashlib

    source = SECURE_IO_SHIM.read_bytes()
    out = cache_dir(version) / f"secureio-{hashlib.sha256(source).hexdigest()[:12]}"
    if (out / "org" / "apache" / "hadoop" / "io" / "SecureIOUtils.class").is_file():
        return out
    javac = Path(java_home) / "bin" / "javac"
    if not javac.is_file():
        raise ToolMissing(f"no javac in {java_home} (the secured test Hadoop compiles {SECURE_IO_SHIM.name}: a JDK "
                          "is needed, not a JRE)")
    building = out.with_name(out.name + f".{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    done = subprocess.run([str(javac), "-nowarn", "-cp", f"{jars}/*", "-d", str(building), str(SECURE_IO_SHIM)],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise HadoopError(f"javac {SECURE_IO_SHIM} failed:\n{done.stdout}{done.stderr}"[-3000:])
    try:
        building.rename(out)
    except OSError:  # built meanwhile by another process: theirs serves
        shutil.rmtree(building, ignore_errors=True)
    return out


def os_user() -> str:
    """The name of this process's OS account: the user's principal is that name in the KDC's realm (Java's
    ``user.name``, whose HDFS home the cluster makes; containers run as this account too)."""
    return pwd.getpwuid(os.getuid()).pw_name


def kinit_executable() -> str | None:
    """MIT Kerberos's ``kinit`` if on PATH (else :meth:`SecureHadoop.kinit` gets the ticket from Java)."""
    return shutil.which("kinit")


class SecureHadoop(MiniHadoop):
    """A Kerberos KDC, and HDFS + YARN secured by it, in a fresh directory; as :class:`MiniHadoop`.

    After ``start()``: ``realm``, ``principal`` (the user's, with the realm), ``keytab`` (every
    principal's keys), ``krb5_conf``, ``ccache`` (the user's private ticket cache, empty until
    :meth:`kinit`). ``kinit=True`` (the default) gets the user's ticket once the cluster is up.
    """

    def __init__(self, *, kinit: bool = True, token_renew_interval_s: int = TOKEN_RENEW_INTERVAL_S,
                 token_max_lifetime_s: int = TOKEN_MAX_LIFETIME_S, realm_name: str = "EXAMPLE", **kwargs):
        super().__init__(**kwargs)
        self.realm_name = realm_name  # the realm is REALM_NAME.COM: another for each cluster one process uses
        self.kinit_on_start = kinit
        self.token_renew_interval_s, self.token_max_lifetime_s = token_renew_interval_s, token_max_lifetime_s
        self.realm = self.principal = ""
        self._kdc: subprocess.Popen | None = None

    # -------------------------------------------------------- what clients use

    @property
    def kdc_dir(self) -> Path:
        """The KDC's folder: its data, ``krb5.conf``, the keytab and ``kdc.log``."""
        return self.dir / "kdc"

    @property
    def keytab(self) -> Path:
        """The keytab of every principal: the user's, :data:`SERVICE` and :data:`HTTP`."""
        return self.kdc_dir / "hadoop.keytab"

    @property
    def user_keytab(self) -> Path:
        """The keytab of the user's principal alone (what ``--keytab`` is given, as a user's own)."""
        return self.kdc_dir / "user.keytab"

    @property
    def krb5_conf(self) -> Path:
        """The clients' Kerberos configuration (``KRB5_CONFIG``, Java's ``java.security.krb5.conf``)."""
        return self.kdc_dir / "krb5.conf"

    @property
    def ccache(self) -> Path:
        """The user's private ticket cache (``KRB5CCNAME``), filled by :meth:`kinit`."""
        return self.dir / "krb5cc"

    def fsspec(self):
        """:meth:`MiniHadoop.fsspec`, logged in as the user from :attr:`keytab` (whatever ticket this
        process holds, or none) with this cluster's configuration."""
        from hdfs_native import Client

        fs = super().fsspec()
        fs.client = Client(self.url, config_dir=str(self.conf_dir), kerberos_principal=self.principal,
                           kerberos_keytab=str(self.keytab))
        return fs

    def service_principal(self, name: str = SERVICE) -> str:
        """``name`` (:data:`SERVICE` or :data:`HTTP`) with this KDC's realm."""
        return f"{name}@{self.realm}"

    def env(self) -> dict[str, str]:
        """:meth:`MiniHadoop.env`, plus ``KRB5_CONFIG`` (MIT's library, hdfs-native's GSSAPI), ``KRB5CCNAME``
        (the private ticket cache; Hadoop's Java client reads it too); Java reads no ``KRB5_CONFIG``: skein's
        driver gets ``-Djava.security.krb5.conf`` in ``SKEIN_DRIVER_JAVA_OPTIONS``."""
        return {**super().env(), "KRB5_CONFIG": str(self.krb5_conf), "KRB5CCNAME": f"FILE:{self.ccache}"}

    def kinit(self, principal: str | None = None, ccache: str | os.PathLike | None = None, *,
              java: bool = False) -> None:
        """Get ``principal``'s ticket (default: the user's) with its key from :attr:`keytab` into the
        ticket cache file ``ccache`` (default :attr:`ccache`): with MIT's ``kinit`` where installed and
        ``java`` is false, else from Java (``hadoop/Kdc.java kinit``, Kerby's client).
        Raises :class:`minihadoop.HadoopError` with the tool's output when the KDC says no."""
        principal = principal or self.principal
        ccache = Path(ccache or self.ccache)
        mit = None if java else kinit_executable()
        if mit:
            command = [mit, "-k", "-t", str(self.keytab), "-c", f"FILE:{ccache}", principal]
        else:
            command = [self._java, "-cp", f"{self._kdc_jars}/*", str(KDC_LAUNCHER), "kinit",
                       str(self.krb5_conf), str(self.keytab), principal, str(ccache)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "KRB5_CONFIG": str(self.krb5_conf)})
        if proc.returncode != 0 or not ccache.is_file():
            raise HadoopError(f"kinit of {principal} from {self.keytab} failed ({command[0]}, exit "
                              f"{proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")

    def kdestroy(self) -> None:
        """Drop the user's tickets: empty :attr:`ccache`."""
        with contextlib.suppress(FileNotFoundError):
            self.ccache.unlink()

    def __repr__(self) -> str:
        return f"<SecureHadoop {self.version} {self.url or 'stopped'} RM {self.rm_address or '-'} realm {self.realm or '-'}>"

    # -------------------------------------------------------- internals

    def _java_options(self) -> list[str]:
        return [*super()._java_options(), f"-Djava.security.krb5.conf={self.krb5_conf}"]

    def _container_env(self) -> dict[str, str]:
        # Every node of a real cluster has /etc/krb5.conf; here each container is told where this one is
        # (Java in containers, e.g. skein's application master, fails with "Can't get Kerberos realm").
        return {**super()._container_env(), "KRB5_CONFIG": str(self.krb5_conf)}

    def _settings(self, jars: Path) -> dict[str, object]:
        service, http, keytab = self.service_principal(SERVICE), self.service_principal(HTTP), self.keytab
        secure = {
            "hadoop.security.authentication": "kerberos",
            "hadoop.security.authorization": "true",
            "hadoop.rpc.protection": "privacy",
            # HDFS
            "dfs.namenode.kerberos.principal": service,
            "dfs.namenode.keytab.file": keytab,
            "dfs.datanode.kerberos.principal": service,
            "dfs.datanode.keytab.file": keytab,
            "dfs.block.access.token.enable": "true",
            "dfs.data.transfer.protection": "privacy",
            "ignore.secure.ports.for.testing": "true",  # no root for ports below 1024, nor HTTPS keystores
            "dfs.web.authentication.kerberos.principal": http,
            "dfs.web.authentication.kerberos.keytab": keytab,
            "dfs.namenode.delegation.token.renew-interval": self.token_renew_interval_s * 1000,
            "dfs.namenode.delegation.token.max-lifetime": self.token_max_lifetime_s * 1000,
            # YARN
            "yarn.resourcemanager.principal": service,
            "yarn.resourcemanager.keytab": keytab,
            "yarn.nodemanager.principal": service,
            "yarn.nodemanager.keytab": keytab,
            "yarn.resourcemanager.webapp.spnego-principal": http,
            "yarn.resourcemanager.webapp.spnego-keytab-file": keytab,
            "yarn.nodemanager.webapp.spnego-principal": http,
            "yarn.nodemanager.webapp.spnego-keytab-file": keytab,
            "yarn.resourcemanager.delegation.token.renew-interval": self.token_renew_interval_s * 1000,
            "yarn.resourcemanager.delegation.token.max-lifetime": self.token_max_lifetime_s * 1000,
            # As on clusters that run long jobs: the ResourceManager (its principal's user may act for others)
            # gets an application new HDFS tokens for the NodeManagers, when its own are to expire within
            # the given time, so that containers started late are localized and logs aggregated after the
            # tokens of the submission died (YARN-2704). The containers themselves still get those.
            "yarn.resourcemanager.proxy-user-privileges.enabled": "true",
            f"hadoop.proxyuser.{SERVICE.split('/')[0]}.hosts": "*",
            f"hadoop.proxyuser.{SERVICE.split('/')[0]}.groups": "*",
            "yarn.resourcemanager.system-credentials.valid-time-remaining": self.token_max_lifetime_s * 1000 // 2,
            "yarn.nodemanager.container-executor.class":
                "org.apache.hadoop.yarn.server.nodemanager.DefaultContainerExecutor",
            # SPNEGO on every web endpoint
            "hadoop.http.filter.initializers": "org.apache.hadoop.security.AuthenticationFilterInitializer",
            "hadoop.http.authentication.type": "kerberos",
            "hadoop.http.authentication.simple.anonymous.allowed": "false",
            "hadoop.http.authentication.kerberos.principal": http,
            "hadoop.http.authentication.kerberos.keytab": keytab,
            "hadoop.http.authentication.signature.secret.file": self.kdc_dir / "http-signature-secret",
        }
        return {**super()._settings(jars), **secure, **self.extra_conf}

    def _cluster_classpath(self, jars: Path) -> str:
        # The stand-in SecureIOUtils before Hadoop's own, in the cluster's JVM alone.
        return f"{self.conf_dir}:{secure_io_shim(self._java_home, jars, self.version)}:{jars}/*"

    def _start(self, jars: Path) -> None:
        self._java = str(Path(self._java_home) / "bin" / "java")
        self._kdc_jars = ensure_kdc_jars()
        self._start_kdc()
        super()._start(jars)
        if self.kinit_on_start:
            self.kinit()

    def _start_kdc(self) -> None:
        self.kdc_dir.mkdir()
        self.principal = f"{os_user()}@"  # the realm is the KDC's: completed below
        log = self.kdc_dir / "kdc.log"
        with open(log, "wb") as out:
            # stdin: a pipe nobody writes to, as the cluster's (the KDC stops when this process dies).
            self._kdc = subprocess.Popen(
                [self._java, "-Xmx128m", f"-Dkdc.org.name={self.realm_name}", "-cp", f"{self._kdc_jars}/*",
                 str(KDC_LAUNCHER), "serve",
                 str(self.kdc_dir), str(self.keytab), os_user(), SERVICE, HTTP],
                cwd=self.kdc_dir, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT)
        ready, deadline = self.kdc_dir / "ready", time.monotonic() + KDC_STARTUP_TIMEOUT_S
        while not ready.is_file():
            if self._kdc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-3000:]
                raise HadoopError(f"the KDC ({KDC_LAUNCHER}) did not start in {KDC_STARTUP_TIMEOUT_S} s "
                                  f"(exit {self._kdc.poll()}):\n{tail}")
            time.sleep(0.2)
        self.realm = ready.read_text().split()[0]
        self.principal += self.realm
        # What the web servers sign their SPNEGO cookies with.
        (self.kdc_dir / "http-signature-secret").write_text(os.urandom(32).hex())

    def _after_stop(self) -> None:
        if self._kdc is not None:
            if self._kdc.poll() is None:
                self._kdc.terminate()
            with contextlib.suppress(OSError):
                self._kdc.stdin.close()
            try:
                self._kdc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kdc.kill()
                self._kdc.wait()
            self._kdc = None


def main(argv: list[str] | None = None) -> int:
    """``python tests/securehadoop.py``: start the KDC and the cluster, get a ticket, print the exports,
    run until Ctrl-C."""
    import argparse
    import shlex

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory (data, logs)")
    parser.add_argument("--token-renew-interval", type=int, default=TOKEN_RENEW_INTERVAL_S, metavar="S",
                        help=f"delegation tokens die unless renewed within S seconds (default {TOKEN_RENEW_INTERVAL_S})")
    parser.add_argument("--token-max-lifetime", type=int, default=TOKEN_MAX_LIFETIME_S, metavar="S",
                        help=f"... and S seconds after they were issued (default {TOKEN_MAX_LIFETIME_S})")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        cluster = SecureHadoop(keep=args.keep, token_renew_interval_s=args.token_renew_interval,
                               token_max_lifetime_s=args.token_max_lifetime).start()
    except HadoopError as exc:
        print(f"securehadoop: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        env = cluster.env()
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k != "PATH")
        print(f"Kerberos-secured Hadoop {HADOOP_VERSION} up in {time.monotonic() - started:.0f} s: HDFS "
              f"{cluster.url}, ResourceManager {cluster.rm_address}, realm {cluster.realm}\n"
              f"A ticket for {cluster.principal} is in {cluster.ccache}. In another shell:\n"
              f"  export {exports} PATH={cluster.bin_dir}:$PATH\n"
              f"  hdfs dfs -ls /user      # kinit -kt {cluster.keytab} {cluster.principal}  renews the ticket\n"
              f"Logs: {cluster.log_file}, {cluster.kdc_dir / 'kdc.log'}. Ctrl-C stops it.", flush=True)
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
