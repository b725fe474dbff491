"""What a refusal by a Kerberos-secured Hadoop means, said so that the user can act on it.

hdfs-native, MIT's GSSAPI and Hadoop's servers say why they refuse in their own words
(``GSS_S_NO_CRED``, ``SecretManager$InvalidToken``, ``Client cannot authenticate via``);
:func:`explain` turns the ones users meet into a sentence that names what to do: ``kinit``,
``--principal/--keytab``, or the setting at fault.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

from ..exceptions import HadoopConfigError, HdfsAccessError
from . import hadoopconf

#: Where each hint applies: a pattern of the library's or server's message, and what it means.
_HINTS: tuple[tuple[str, str], ...] = (
    (r"Ticket expired|KRB5KRB_AP_ERR_TKT_EXPIRED|TGT has expired",
     "your Kerberos ticket has expired: run `kinit` again (or submit with --principal/--keytab)"),
    (r"GSS_S_NO_CRED|No Kerberos credentials available|Kerberos ticket not found|Failed to find any Kerberos tgt",
     "no Kerberos ticket: run `kinit` (see `klist`), or give --principal/--keytab"),
    (r"Key table entry not found|No key table entry found|keytab.*(not found|No such file)|Bad keytab|"
     r"Preauthentication failed|Pre-authentication information was invalid|Client not found in Kerberos database",
     "the keytab does not hold the principal's key (check --principal against `klist -kt KEYTAB`)"),
    (r"Cannot find KDC for realm|Cannot locate default realm|Can't get Kerberos realm|krb5\.conf|"
     r"Configuration file does not specify default realm|Cannot contact any KDC",
     "Kerberos is not configured on this machine: no krb5.conf naming the cluster's realm and KDC (/etc/krb5.conf, "
     "or KRB5_CONFIG and java.security.krb5.conf)"),
    (r"InvalidToken.*(has expired|can't be found in cache|is expired)|token .*expired",
     "HDFS refused the delegation token: it has expired. A job's tokens live as long as the cluster's "
     "dfs.namenode.delegation.token.max-lifetime (a week by default): submit jobs that run longer with "
     "--principal/--keytab, which renews them"),
    (r"Client cannot authenticate via:\[TOKEN, KERBEROS\]|SIMPLE authentication is not enabled|NoSASLMechanism",
     "the cluster wants Kerberos, but this client's Hadoop configuration does not: set "
     "hadoop.security.authentication=kerberos in core-site.xml of HADOOP_CONF_DIR (the cluster's client "
     "configuration)"),
    (r"Server asks us to fall back to SIMPLE auth|Kerberos is not enabled on the server",
     "this client's Hadoop configuration asks for Kerberos (hadoop.security.authentication), but the cluster does "
     "not use it: point HADOOP_CONF_DIR at the cluster's own client configuration"),
)


def explain(error: BaseException | str) -> str | None:
    """The hint for a Kerberos or delegation-token failure, or None when ``error`` is not one."""
    text = str(error)
    for pattern, hint in _HINTS:
        if re.search(pattern, text, re.IGNORECASE):
            return hint
    return None


#: In a YARN container (it holds tokens, never a ticket), "no ticket" means no usable token.
_NO_TOKEN = ("no usable HDFS delegation token: those of this container (HADOOP_TOKEN_FILE_LOCATION) have expired or "
             "are for another NameNode. A job's tokens live as long as the cluster's "
             "dfs.namenode.delegation.token.max-lifetime (a week by default): submit jobs that run longer with "
             "--principal/--keytab, which renews them")


def _server_words(text: str) -> str | None:
    """``Class: message`` of a Hadoop server's exception as hdfs-native words it
    (``RPCError("org.apache...AccessControlException", "Permission denied: ...\\n\\tat ...")``),
    without the Java stack; None for other errors."""
    match = re.match(r'(?:Fatal)?RPCError\("(?:[\w$]+\.)*([\w$]+)", "(.*?)(?:\\n|"\)$)', text.strip(), re.DOTALL)
    return f"{match.group(1)}: {match.group(2).replace(chr(92) + chr(34), chr(34))[:300]}" if match else None


def hdfs_error(uri: str, error: BaseException) -> HdfsAccessError:
    """An :class:`~iterreduce.exceptions.HdfsAccessError` for ``error`` met at ``uri``: the hint of
    :func:`explain` where there is one, the HDFS client's own words otherwise."""
    hint = explain(error)
    if hint and hint.startswith("no Kerberos ticket") and os.environ.get("HADOOP_TOKEN_FILE_LOCATION"):
        hint = _NO_TOKEN
    if hint is None and "RPC listener disconnected" in str(error) and not client_wants_kerberos():
        # A secured NameNode hangs up on a client that does not start with SASL: hdfs-native says only this.
        hint = ("the NameNode hung up: if the cluster uses Kerberos, this client's Hadoop configuration must say so "
                "(hadoop.security.authentication=kerberos in the site files of HADOOP_CONF_DIR)")
    first_line = _server_words(str(error)) or (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    return HdfsAccessError(f"{uri}: {hint} ({first_line})" if hint else f"{uri}: HDFS refused: {first_line}")


def ticket_cache() -> str:
    """The ticket cache MIT's library and hdfs-native read (``KRB5CCNAME``, else the default file)."""
    return os.environ.get("KRB5CCNAME") or f"FILE:/tmp/krb5cc_{os.getuid()}"


#: A keytab larger than this is refused (a keytab holds a few keys: a few hundred bytes a principal).
MAX_KEYTAB_BYTES = 1 << 20


def keytab_principals(keytab: str | os.PathLike) -> list[str]:
    """The principals whose keys the keytab file holds (MIT's format, version 0x0502 or 0x0501), in
    order, each once. Raises :class:`~iterreduce.exceptions.HadoopConfigError` naming the file when
    it cannot be read or is not a keytab."""
    path = Path(keytab).expanduser()
    try:
        if path.stat().st_size > MAX_KEYTAB_BYTES:
            raise HadoopConfigError(f"{keytab}: {path.stat().st_size} bytes: too large for a keytab file")
        data = path.read_bytes()
    except OSError as exc:
        raise HadoopConfigError(f"{keytab}: cannot read the keytab: {exc.strerror or exc}") from exc
    if data[:2] not in (b"\x05\x02", b"\x05\x01"):
        raise HadoopConfigError(f"{keytab}: not a keytab file (it does not start as MIT's keytabs do; make one "
                                f"with `ktutil` or ask your Kerberos admin)")
    native = "=" if data[1] == 1 else ">"  # version 0x0501 wrote numbers in the writer's byte order
    found, at = [], 2
    try:
        while at + 4 <= len(data):
            (size,) = struct.unpack_from(native + "i", data, at)
            at += 4
            if size <= 0:  # a deleted entry's hole
                at += -size
                continue
            entry, at = data[at:at + size], at + size
            if len(entry) < size:
                raise ValueError("cut short")
            (count,), pos = struct.unpack_from(native + "H", entry, 0), 2
            count -= 1 if data[1] == 1 else 0  # 0x0501 counted the realm among the components
            parts = []
            for _ in range(count + 1):  # the realm, then the name's components
                (length,) = struct.unpack_from(native + "H", entry, pos)
                parts.append(entry[pos + 2:pos + 2 + length].decode("utf-8"))
                pos += 2 + length
            name = "/".join(parts[1:]) + "@" + parts[0]
            if name not in found:
                found.append(name)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise HadoopConfigError(f"{keytab}: a damaged keytab file ({exc})") from exc
    return found


def check_keytab(principal: str, keytab: str) -> None:
    """Refuse a keytab that cannot be read, is not a keytab, or holds no key of ``principal``,
    naming what it does hold; a principal without a realm matches any realm (as kinit's default)."""
    held = keytab_principals(keytab)
    if principal in held or ("@" not in principal and any(h.split("@")[0] == principal for h in held)):
        return
    raise HadoopConfigError(f"{keytab} holds no key of {principal} (it holds: {', '.join(held) or 'none'}); "
                            f"give --principal as one of those, or the keytab of {principal}")


def krb5_conf_paths() -> list[str]:
    """Where MIT's library reads Kerberos's configuration: ``KRB5_CONFIG`` (a ':'-separated list),
    else ``/etc/krb5.conf``."""
    return [p for p in os.environ.get("KRB5_CONFIG", "/etc/krb5.conf").split(":") if p]


def client_wants_kerberos() -> bool:
    """Whether this client's Hadoop configuration says ``hadoop.security.authentication=kerberos``."""
    return (hadoopconf.get("hadoop.security.authentication") or "simple").strip().lower() == "kerberos"


def check_client(principal: str | None = None, keytab: str | None = None) -> None:
    """Before a command talks to a cluster whose client configuration asks for Kerberos
    (``hadoop.security.authentication``): a krb5.conf must exist, and the keytab, when given,
    must hold the principal's key; without one, the ticket cache must hold a valid ticket (where
    MIT's ``klist`` can tell). Raises :class:`~iterreduce.exceptions.HadoopConfigError` saying
    what to do. A container (it holds delegation tokens, no ticket) is not checked."""
    if not client_wants_kerberos() or os.environ.get("HADOOP_TOKEN_FILE_LOCATION"):
        return
    if not any(Path(p).is_file() for p in krb5_conf_paths()):
        raise HadoopConfigError(
            f"the cluster's configuration ({hadoopconf.conf_dir()}) asks for Kerberos, but there is no krb5.conf "
            f"({', '.join(krb5_conf_paths())}): install the cluster's krb5.conf in /etc, or point KRB5_CONFIG at it")
    if keytab:
        check_keytab(principal or "", keytab)
        return
    klist = shutil.which("klist")
    if klist is None:
        return  # no way to look without MIT's tools: the first refusal will say
    cache = ticket_cache()
    try:
        valid = subprocess.run([klist, "-s", "-c", cache], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return
    if not valid:
        path = cache.removeprefix("FILE:")
        what = ("your Kerberos ticket has expired" if cache.startswith(("FILE:", "/")) and Path(path).is_file()
                else "no Kerberos ticket")
        raise HadoopConfigError(f"{what} (ticket cache {cache}): run `kinit`, or give --principal/--keytab")


@contextlib.contextmanager
def keytab_ticket(principal: str | None, keytab: str | None):
    """The environment for a Hadoop tool (Java, which takes no keytab on its command line) run as
    ``principal``: a ticket from ``keytab`` (MIT's ``kinit -kt``) in a ticket cache of its own, removed
    afterwards; without a keytab, this process's environment (its ticket cache). Raises
    :class:`~iterreduce.exceptions.HadoopConfigError` when no ticket can be had."""
    if not (principal and keytab):
        yield os.environ.copy()
        return
    kinit = shutil.which("kinit")
    if kinit is None:
        raise HadoopConfigError("Hadoop's tools need a ticket, and without MIT's kinit none can be had from the keytab "
                                "(Debian: apt-get install krb5-user)")
    with tempfile.TemporaryDirectory(prefix="dbn-ticket-") as folder:
        cache = f"FILE:{folder}/krb5cc"
        done = subprocess.run([kinit, "-k", "-t", keytab, "-c", cache, principal], capture_output=True, text=True,
                              timeout=60)
        if done.returncode != 0:
            why = explain(done.stderr) or done.stderr.strip()[-300:]
            raise HadoopConfigError(f"kinit -kt {keytab} {principal} failed: {why}")
        yield {**os.environ, "KRB5CCNAME": cache}
