"""A process of a local job ends when its launcher does, however the launcher died.

A launcher that is stopped politely (Ctrl-C, SIGTERM, SIGHUP) stops its master and
workers itself; one killed with SIGKILL cannot. So each child started by the local
launcher watches it: the launcher's pid travels in ``$ITERREDUCE_LAUNCHER_PID``,
and when the child's parent is no longer that process (it was re-parented, so the
launcher is gone) the child exits. In YARN containers the variable is not set and
the NodeManager owns the processes' lives. The master then also removes the folders the
launcher made for the job and could not remove (:func:`iterreduce.process.jobfolders.remove_orphaned`),
and so do the workers (:func:`launcher_gone`): where the launcher and the master die together,
they are the job's last processes.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

LAUNCHER_PID = "ITERREDUCE_LAUNCHER_PID"
EXIT_ORPHANED = 143  # as if terminated by SIGTERM

log = logging.getLogger("iterreduce.lifeline")


def follow_launcher(poll: float = 0.5, on_orphaned: Callable[[], None] | None = None) -> None:
    """If a local launcher started this process, exit as soon as that launcher is gone, after
    ``on_orphaned`` (the launcher's cleanup it could not do)."""
    launcher = int(os.environ.get(LAUNCHER_PID) or 0)
    if launcher:
        _exit_when_orphaned(launcher, f"the launcher (pid {launcher})", poll, on_orphaned)


def launcher_gone(wait_s: float = 0.0, poll: float = 0.05) -> bool:
    """Whether a local launcher started this process and is gone (this process was re-parented),
    waiting up to ``wait_s`` seconds for its end to show. False on YARN (no launcher to follow)."""
    launcher = int(os.environ.get(LAUNCHER_PID) or 0)
    deadline = time.monotonic() + wait_s
    while launcher and os.getppid() == launcher and time.monotonic() < deadline:
        time.sleep(poll)
    return bool(launcher) and os.getppid() != launcher


def follow_parent(poll: float = 0.5) -> None:
    """Exit as soon as this process's parent is gone (for helper processes, e.g. the
    master's footer reader, whose parent may be killed with SIGKILL). Silently: the helper
    writes to its parent's log, which the launcher has taken stock of once the parent died
    (a line added then would make the run's own log unprovable, and refuse its --resume)."""
    _exit_when_orphaned(os.getppid(), "", poll)


def _exit_when_orphaned(parent: int, who: str, poll: float, on_orphaned: Callable[[], None] | None = None) -> None:
    def watch() -> None:
        while os.getppid() == parent:  # re-parented: that process is gone
            time.sleep(poll)
        if who:
            log.error("%s is gone: stopping", who)
        if on_orphaned is not None:
            try:
                on_orphaned()
            except Exception:  # noqa: BLE001 - exit whatever the cleanup met
                log.exception("cleaning up after the launcher failed")
        logging.shutdown()
        os._exit(EXIT_ORPHANED)  # no cleanup to wait for: checkpoints and outputs are written atomically

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
