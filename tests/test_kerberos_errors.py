"""What users get wrong with Kerberos, said in one line that says what to do (iterreduce.storage.kerberos), before
anything is submitted: checked here without a cluster. tests/test_kerberos.py meets the same mistakes on
the secured Hadoop."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

import pytest

from dbn.cli import main
from iterreduce.exceptions import HadoopConfigError
from iterreduce.storage import kerberos


def counted(value: str | bytes) -> bytes:
    value = value.encode() if isinstance(value, str) else value
    return struct.pack(">H", len(value)) + value


def keytab_bytes(*principals: str, hole: bool = False) -> bytes:
    """A keytab in MIT's format (version 0x0502) with a key for each principal, and a deleted entry's
    hole first when ``hole``."""
    out = b"\x05\x02" + (struct.pack(">i", -12) + bytes(12) if hole else b"")
    for principal in principals:
        name, realm = principal.split("@")
        parts = name.split("/")
        entry = (struct.pack(">H", len(parts)) + counted(realm) + b"".join(counted(p) for p in parts)
                 + struct.pack(">IIB", 1, 1_790_000_000, 3) + struct.pack(">H", 18) + counted(os.urandom(32))
                 + struct.pack(">I", 3))
        out += struct.pack(">i", len(entry)) + entry
    return out


def test_the_principals_of_a_keytab_are_read_holes_and_repeats_aside(tmp_path):
    keytab = tmp_path / "k.keytab"
    keytab.write_bytes(keytab_bytes("alice@EXAMPLE.COM", "HTTP/node1.example.com@EXAMPLE.COM", "alice@EXAMPLE.COM",
                                    hole=True))
    assert kerberos.keytab_principals(keytab) == ["alice@EXAMPLE.COM", "HTTP/node1.example.com@EXAMPLE.COM"]


@pytest.mark.parametrize("content, message", [
    (b"not a keytab at all", r"not a keytab file"),
    (keytab_bytes("alice@EXAMPLE.COM")[:-9], r"a damaged keytab file"),
    (b"\x05\x02" + struct.pack(">i", 1 << 30), r"a damaged keytab file"),  # an entry longer than the file
], ids=["not a keytab", "cut short", "an entry longer than the file"])  # ids of their own: the bytes hold a random key

def test_a_file_that_is_not_a_whole_keytab_is_refused_naming_it(tmp_path, content, message):
    keytab = tmp_path / "k.keytab"
    keytab.write_bytes(content)
    with pytest.raises(HadoopConfigError, match=rf"^{keytab}: {message}"):
        kerberos.keytab_principals(keytab)


def test_a_keytab_that_cannot_be_read_is_refused_naming_it(tmp_path):
    with pytest.raises(HadoopConfigError, match=rf"^{tmp_path / 'none.keytab'}: cannot read the keytab"):
        kerberos.keytab_principals(tmp_path / "none.keytab")
    if os.geteuid() != 0:  # root reads whatever it likes
        unreadable = tmp_path / "locked.keytab"
        unreadable.write_bytes(keytab_bytes("alice@EXAMPLE.COM"))
        unreadable.chmod(0)
        with pytest.raises(HadoopConfigError, match="cannot read the keytab: Permission denied"):
            kerberos.keytab_principals(unreadable)


def test_a_keytab_without_the_principal_is_refused_naming_what_it_holds(tmp_path):
    keytab = tmp_path / "k.keytab"
    keytab.write_bytes(keytab_bytes("alice@EXAMPLE.COM", "bob@EXAMPLE.COM"))
    kerberos.check_keytab("alice@EXAMPLE.COM", str(keytab))
    kerberos.check_keytab("bob", str(keytab))  # no realm: the default realm's
    with pytest.raises(HadoopConfigError, match=r"holds no key of carol@EXAMPLE.COM \(it holds: alice@EXAMPLE.COM, "
                                                r"bob@EXAMPLE.COM\)"):
        kerberos.check_keytab("carol@EXAMPLE.COM", str(keytab))


@pytest.fixture
def kerberos_client(tmp_path, monkeypatch):
    """A client whose Hadoop configuration asks for Kerberos, with a krb5.conf and no cluster."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "core-site.xml").write_text("<configuration><property><name>hadoop.security.authentication</name>"
                                        "<value>kerberos</value></property></configuration>")
    (tmp_path / "krb5.conf").write_text("[libdefaults]\n  default_realm = EXAMPLE.COM\n")
    for var in ("HADOOP_TOKEN_FILE_LOCATION", "ITERREDUCE_SKEIN_DRIVER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HADOOP_CONF_DIR", str(conf))
    monkeypatch.setenv("KRB5_CONFIG", str(tmp_path / "krb5.conf"))
    monkeypatch.setenv("KRB5CCNAME", f"FILE:{tmp_path / 'no-ticket'}")
    return tmp_path


def cli_error(capsys, *argv) -> str:
    """The one line `dbn` prints for ``argv``, which must exit 2."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("dbn: error: ") and err.count("\n") == 1, (code, err)
    return err


def test_status_without_a_krb5_conf_says_where_it_looked(kerberos_client, monkeypatch, capsys):
    monkeypatch.setenv("KRB5_CONFIG", str(kerberos_client / "missing.conf"))
    err = cli_error(capsys, "status", "application_1_0001")
    assert "asks for Kerberos, but there is no krb5.conf" in err and "missing.conf" in err and "KRB5_CONFIG" in err


@pytest.mark.skipif(shutil.which("klist") is None, reason="MIT's klist (Debian's krb5-user) tells a ticket's state")
def test_submit_without_a_ticket_says_run_kinit_before_anything_is_staged(kerberos_client, capsys):
    job = kerberos_client / "job.toml"
    job.write_text('[data]\ntrain = "x.npz"\n[output]\ndir = "hdfs://nn:8020/user/a/run"\n[cluster]\nworkers = 1\n'
                   '[yarn]\npython = "/usr/bin/python3"\n')
    err = cli_error(capsys, "submit", str(job))
    assert "no Kerberos ticket" in err and "run `kinit`, or give --principal/--keytab" in err


@pytest.mark.skipif(shutil.which("klist") is None, reason="MIT's klist (Debian's krb5-user) tells a ticket's state")
def test_an_expired_ticket_is_told_from_no_ticket(kerberos_client, monkeypatch, capsys):
    """A ticket cache file that holds only a ticket that ended (written as MIT's library writes one)."""
    cache = kerberos_client / "expired"
    cache.write_bytes(expired_ticket_cache("alice@EXAMPLE.COM"))
    listed = subprocess.run(["klist", "-c", f"FILE:{cache}"], capture_output=True, text=True)
    assert "alice@EXAMPLE.COM" in listed.stdout, listed.stdout + listed.stderr  # klist reads it ...
    monkeypatch.setenv("KRB5CCNAME", f"FILE:{cache}")
    err = cli_error(capsys, "kill", "application_1_0001")
    assert "your Kerberos ticket has expired" in err and "run `kinit`" in err  # ... and finds it ended


def expired_ticket_cache(principal: str) -> bytes:
    """A version 4 ticket cache whose one credential (a made-up TGT) ended an hour ago."""
    name, realm = principal.split("@")

    def princ(realm_: str, *parts: str) -> bytes:
        return struct.pack(">II", 1, len(parts)) + b"".join(
            struct.pack(">I", len(x)) + x.encode() for x in (realm_, *parts))

    import time

    now = int(time.time())
    creds = (princ(realm, name) + princ(realm, "krbtgt", realm)
             + struct.pack(">HHI", 18, 0, 32) + bytes(32)  # key: type 18, no etype field in v4, 32 bytes
             + struct.pack(">IIII", now - 7200, now - 7200, now - 3600, now - 3600)  # auth, start, end, renew-till
             + b"\x00" + struct.pack(">I", 0x40e00000)  # not a session-key-is-skey; flags
             + struct.pack(">I", 0) + struct.pack(">I", 0)  # no addresses, no authdata
             + struct.pack(">I", 4) + b"tckt" + struct.pack(">I", 0))  # the ticket, no second ticket
    header = struct.pack(">HH", 0x0504, 12) + struct.pack(">HHII", 1, 8, 0, 0)  # a time-offset tag
    return header + princ(realm, name) + creds


def test_explain_names_what_to_do_for_the_refusals_users_meet():
    cases = {
        'GSSAPIError(... "No Kerberos credentials available (default cache: FILE:/tmp/krb5cc_0)")': "run `kinit`",
        "javax.security.auth.login.LoginException: Kerberos ticket not found": "run `kinit`",
        "GSSAPIError(... Ticket expired)": "has expired: run `kinit` again",
        'FatalRPCError("...SecretManager$InvalidToken", "Token  has expired, current time: ...")':
            "dfs.namenode.delegation.token.max-lifetime",
        "Client cannot authenticate via:[TOKEN, KERBEROS]": "hadoop.security.authentication=kerberos",
        "Server asks us to fall back to SIMPLE auth, but this client is configured to only allow secure "
        "connections.": "the cluster does not use it",
        "Can't get Kerberos realm": "no krb5.conf",
        "Pre-authentication information was invalid (24)": "keytab does not hold the principal's key",
    }
    for message, hint in cases.items():
        assert hint in (kerberos.explain(message) or ""), message
    assert kerberos.explain("Connection refused") is None
