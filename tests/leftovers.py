"""The processes a test cluster started, found by the folder they run from: what a test checks is
gone when its cluster stops (never the whole machine's processes: the suite runs beside other jobs)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def processes_of(directory: Path) -> list[int]:
    """Live processes started from ``directory``: the cluster's JVM, and its containers' processes,
    whose command lines or environments (``PWD``, ``LOCAL_DIRS``, ...) name it."""
    mark, found = str(directory).encode(), []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError):
            if int(proc.name) == os.getpid() or (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (proc / "cmdline").read_bytes()
            if b"multiprocessing.resource_tracker" in cmdline:  # ours: it inherits our environment, naming
                continue                                         # the cluster, and must outlive it
            if mark in cmdline or mark in (proc / "environ").read_bytes():
                found.append(int(proc.name))
    return found


def kill_leftovers(directory: Path) -> None:
    """SIGKILL what still runs from ``directory`` (containers of a JVM that was itself killed)."""
    for pid in processes_of(directory):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
