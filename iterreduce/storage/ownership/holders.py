"""Who holds a folder's lock, and how a folder held by another is refused: said the same way by
the local ``flock`` lock (:mod:`.locks`) and the create-if-absent lock on HDFS
(:mod:`.remote_locks`)."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import NamedTuple

from ...exceptions import OutputBusy

#: The most bytes of a lock file read (a holder's line and a folder's path; a remote holder's JSON).
LOCK_MAX_BYTES = 16384


class Writer(NamedTuple):
    """Whom a lock keeps out, as its refusal (:func:`busy`) says it: "another ``what``", then ``advice``."""

    what: str
    advice: str


#: A local run's output folder (:func:`~.locks.hold`).
RUN = Writer("run is writing into this output folder", "wait for it to end, or choose another output folder (--out)")
#: A YARN job's output folder on HDFS (:func:`~.remote_locks.acquire_remote`).
JOB = Writer("job is writing into this output folder",
             "wait for it to end, or choose another output folder ([output] dir or --out)")
#: A shard folder (:func:`~.locks.shard_folder`).
SHARDS = Writer("writer is writing shards into this folder", "wait for it to end, or choose another folder")


def this_process() -> dict:
    """This process as a lock names its holder: ``pid``, ``host`` and ``since`` (now)."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def _who(pid, host, since) -> str:
    return f"pid {pid} on {host} since {since}"


def holder_text() -> str:
    """Who holds a lock: this process's pid, host, start time and command line, one line."""
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300] if sys.argv and sys.argv[0] else "python"
    command = command.replace("\n", " ").replace("\r", " ")  # one line: a lock file's next line names its folder
    return f"{_who(**this_process())} ({command})"


def describe_holder(held: dict) -> str:
    """A remote lock's holder in a few words."""
    if not held:
        return "an unreadable lock"
    def field(key):  # as the lock says it, cut short: a lock file is read, not trusted
        return str(held.get(key))[:100]

    where = _who(field("pid"), field("host"), field("since"))
    return f"application {field('app_id')}, submitted by {where}" if held.get("app_id") else f"a submission by {where}"


def ended_here(held: dict) -> bool:
    """Whether the lock's holder ``held`` is a process of this host that has ended (any other
    holder may still run: this process cannot see another host's processes)."""
    pid = held.get("pid")
    if held.get("host") != socket.gethostname() or type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process: it runs
        pass
    return False


def busy(where: str, writer: Writer, holder: str) -> OutputBusy:
    """The refusal of the folder ``where`` to another ``writer`` (:data:`RUN`, :data:`JOB`,
    :data:`SHARDS`) while ``holder`` holds it."""
    return OutputBusy(f"{where}: another {writer.what} ({holder}); {writer.advice}")
