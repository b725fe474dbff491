"""A process of a local job ends when its launcher does, however the launcher died.

A launcher that is stopped politely (Ctrl-C, SIGTERM, SIGHUP) stops its master and
workers itself; one killed with SIGKILL cannot. So each child started by the local
launcher watches it: the launcher's pid travels in ``$ITERREDUCE_LAUNCHER_PID``,
and when the child's parent is no longer that process (it was re-parented, so the
launcher is gone) the child exits. In YARN containers the variable is not set and
the NodeManager owns the processes' lives.
"""

from __future__ import annotations

import logging
import os
import threading
import time

LAUNCHER_PID = "ITERREDUCE_LAUNCHER_PID"
EXIT_ORPHANED = 143  # as if terminated by SIGTERM

log = logging.getLogger("iterreduce.lifeline")


def follow_launcher(poll: float = 0.5) -> None:
    """If a local launcher started this process, exit as soon as that launcher is gone."""
    launcher = int(os.environ.get(LAUNCHER_PID) or 0)
    if not launcher:
        return

    def watch() -> None:
        while os.getppid() == launcher:
            time.sleep(poll)
        log.error("the launcher (pid %d) is gone: stopping", launcher)
        logging.shutdown()
        os._exit(EXIT_ORPHANED)  # no cleanup to wait for: checkpoints and outputs are written atomically

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()
