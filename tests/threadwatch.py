"""The threads a test started itself, counted apart from the process's others.

An xdist worker runs many tests in one process: threads of earlier tests (a server's
last handler, a prefetch, a client's timer) may still be ending while a later test
counts, so ``threading.active_count()`` before and after says nothing about the test's
own threads. :class:`NewThreads` counts only those started since it was made.
"""
from __future__ import annotations

import threading
import time


class NewThreads:
    """The threads alive now that were not alive when it was made."""

    def __init__(self) -> None:
        self._before = set(threading.enumerate())

    def alive(self) -> list[threading.Thread]:
        """The threads started since, still running."""
        return [t for t in threading.enumerate() if t not in self._before]

    def count(self) -> int:
        """How many threads started since are still running."""
        return len(self.alive())

    def settle(self, count: int, seconds: float = 10.0) -> int:
        """Wait up to ``seconds`` for at most ``count`` of them to run; how many run then."""
        end = time.monotonic() + seconds
        while self.count() > count and time.monotonic() < end:
            time.sleep(0.05)
        return self.count()
