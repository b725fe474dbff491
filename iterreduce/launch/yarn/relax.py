"""A worker's node asked for strictly, for a bounded time, then any node.

YARN's own locality delay gives a node up after a number of missed scheduling opportunities
that the CapacityScheduler caps at the cluster's node count: on a small cluster a few
heartbeats. So a worker slot whose data's
node is known asks for that node strictly (``relax_locality=False``, see
:func:`iterreduce.launch.yarn.appspec.build_spec`), and the application master watches (:class:`Relaxer`):
a worker container still unplaced after ``wait`` seconds (its node full, lost or gone) is
withdrawn and replaced by a container of the spare service, which any node may run and which
takes the free slot with the most of its data on its node
(:func:`iterreduce.launch.yarn.container.slot_order`).
"""

from __future__ import annotations

import logging
import os
import time

from .watcher import Watcher

log = logging.getLogger("iterreduce.yarn")

#: The application master's variable giving the wait in seconds (set by ``build_spec``).
WAIT_VAR = "ITERREDUCE_LOCALITY_WAIT"
#: The service of containers that replace strict ones: no node asked, no instances at the start.
SPARE_SERVICE = "worker-any"


def strict_services(spec) -> list[str]:
    """The services of a skein application spec that ask for their nodes strictly."""
    return sorted(name for name, service in spec.services.items() if service.nodes and not service.relax_locality)


class Relaxer(Watcher):
    """Withdraws strict worker containers that waited ``wait`` seconds for their node, and asks
    the spare service for one in the place of each.

    ``app``: the application's skein client; ``services``: the strict ones (:func:`strict_services`).
    :meth:`check` is one look; :meth:`start` looks every ``poll`` seconds in a daemon thread.
    """

    name, what = "relax-locality", "check where the workers wait"

    def __init__(self, app, services: list[str], wait: float, poll: float = 1.0, clock=time.monotonic):
        super().__init__(poll)
        self.app, self.services, self.wait, self.clock = app, services, wait, clock
        self.withdrawn: list[str] = []
        self._since: dict[str, float] = {}

    @classmethod
    def from_container(cls, app) -> Relaxer | None:
        """The relaxer of this application master, from its environment and the application's spec
        (None where no service asks for its node strictly, or no wait is set)."""
        try:
            wait = float(os.environ.get(WAIT_VAR) or 0)
        except ValueError:
            log.warning("%s=%r is not a number of seconds: workers wait for their nodes as YARN decides",
                        WAIT_VAR, os.environ.get(WAIT_VAR))
            return None
        services = strict_services(app.get_specification()) if wait > 0 else []
        return cls(app, services, wait) if services else None

    def check(self) -> list[str]:
        """Withdraw each strict container that has been waiting for ``wait`` seconds or more and ask
        for a spare one instead; returns the ids withdrawn."""
        now = self.clock()
        waiting = self.app.get_containers(services=self.services, states=["waiting", "requested"])
        self._since = {c.id: self._since.get(c.id, now) for c in waiting}
        withdrawn = []
        for container in waiting:
            if now - self._since[container.id] < self.wait:
                continue
            # Should YARN place it between the look and the kill, a just-started worker is stopped:
            # the spare container then takes its slot, so nothing is lost but the start.
            self.app.kill_container(container.id)
            self.app.add_container(SPARE_SERVICE)
            del self._since[container.id]
            withdrawn.append(container.id)
            log.info("%s: no container on its data's node after %.0f s; asked for one on any node instead",
                     container.id, self.wait)
        self.withdrawn += withdrawn
        return withdrawn
