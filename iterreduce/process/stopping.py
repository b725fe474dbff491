"""How the processes the project starts end on SIGINT and SIGTERM: quietly, after their own cleanup.

A terminal's Ctrl-C sends SIGINT to every process of its foreground process group (the footer
reader a launcher started, a benchmark's per-core processes), and a scheduler, a NodeManager or
``kill`` sends SIGTERM. Left to Python, SIGINT prints a ``KeyboardInterrupt`` traceback on the
terminal or in the job's log, and SIGTERM ends the process without running its ``finally`` blocks,
so files it would remove stay. :func:`run` runs an entry point so that either signal unwinds it
like an exception (``finally`` blocks and context managers run, objects that remove their files
when collected are collected, :mod:`atexit` functions run, e.g. a worker's removal of its row
files), and then the process ends by that same signal, silently: its parent sees it killed by the
signal (exit status -2 or -15 in Python, 130 or 143 in a shell), as it would have without the
cleanup (the local launcher reads a master killed by a signal as one a ``--resume`` continues).
A second stop signal during the cleanup is ignored; SIGKILL still ends a cleanup that hangs.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import signal
import sys
from typing import Callable, NoReturn

#: The signals that stop a process politely.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """Raised in the main thread by a stop signal. Not an ``Exception``: no ``except Exception``
    takes it for an error to report or retry."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def run(main: Callable[[], int]) -> int:
    """``main()``'s exit status; a stop signal meanwhile unwinds ``main`` and then ends this
    process by that signal, with no traceback. Call from the main thread of a process's entry point."""
    try:
        for signum in STOP_SIGNALS:
            signal.signal(signum, _stop)
        return main()
    except Stopped as stop:
        signum = stop.signum
    # Out of the handler, the exception and the frames it unwound are gone: collect what they held.
    gc.collect()
    end_by(signum)


def _stop(signum: int, frame) -> None:
    for each in STOP_SIGNALS:  # one stop is enough: the cleanup it starts is not cut short by another
        signal.signal(each, signal.SIG_IGN)
    raise Stopped(signum)


def end_by(signum: int) -> NoReturn:
    """End this process by ``signum``'s default action, after its :mod:`atexit` functions (which
    the signal's end would skip) and flushing its logs and streams."""
    atexit._run_exitfuncs()  # each one's error is printed and the next runs, as at a normal exit
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken stream has nothing more to say
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached: the signal ends the process
