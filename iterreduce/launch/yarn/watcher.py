"""A look at the application, taken again every few seconds in a thread of the application master."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod

log = logging.getLogger("iterreduce.yarn")


class Watcher(ABC):
    """Calls :meth:`check` every ``poll`` seconds from :meth:`start` until :meth:`stop`, in a daemon
    thread named ``name``; a look that fails is logged (as ``what``) and the next one is taken."""

    name = "watch"
    what = "look at the application"

    def __init__(self, poll: float = 1.0):
        self.poll = poll
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @abstractmethod
    def check(self):
        """One look (each watcher's own: :class:`~iterreduce.launch.yarn.relax.Relaxer`,
        :class:`~iterreduce.launch.yarn.keeper.Keeper`)."""

    def start(self):
        """Look every ``poll`` seconds until :meth:`stop`, in a daemon thread; returns ``self``."""
        def loop():
            while not self._stop.wait(self.poll):
                try:
                    self.check()
                except Exception as exc:  # noqa: BLE001 - a missed look is made up by the next one
                    log.warning("could not %s: %s", self.what, exc)
        self._thread = threading.Thread(target=loop, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the looking thread (waits for it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
