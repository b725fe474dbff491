"""Credentials never shown: a password in a URI's user info (``http://bob:PASS@host``,
``thrift://meta:PASS@host:9083``) is replaced by ``***`` wherever the project shows, logs, keeps or
sends a value: messages on the terminal, ``log.jsonl``, ``config.json``, a tracking server's
parameters and links. The values themselves stay as given where they are used (a client connects
with them; a YARN job's own job file, private to it, carries them)."""

from __future__ import annotations

import re

#: ``scheme://user:password@``: the user stays (it says who), the password goes.
_USER_INFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/?#@:\s]*):(?P<password>[^/?#@\s]*)@")
HIDDEN = "***"


def redact(text: str) -> str:
    """``text`` with the password of every URI in it replaced by :data:`HIDDEN`."""
    return _USER_INFO.sub(lambda m: f"{m['scheme']}{m['user']}:{HIDDEN}@", text)


def redact_all(value):
    """``value`` (JSON-like: dicts, lists, strings, numbers) with every string :func:`redact`-ed."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_all(k) if isinstance(k, str) else k: redact_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_all(v) for v in value)
    return value
