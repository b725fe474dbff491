"""A worker's sends in the reduce on the workers (:mod:`iterreduce.transport.exchange`): its rows of each
update to the reducers (the scatter) and, from a reducer, its block of the result to the others
(the all-gather), straight or through the grid."""

from __future__ import annotations

import logging

from ..program import step_from_json
from ..transport import exchange

log = logging.getLogger("iterreduce.worker")  # a part of the worker: its records are the worker's


class Collective:
    """Worker ``worker_id``'s sends to its peers (through ``peers``, which it closes), its own
    parts put straight into its ``inbox``; ``float16``: updates travel narrowed."""

    def __init__(self, worker_id: str, peers: exchange.Peers, inbox: exchange.Inbox, float16: bool):
        self.worker_id = worker_id
        self.peers = peers
        self.inbox = inbox
        self.float16 = float16

    def close(self) -> None:
        """Close the channels to the peers."""
        self.peers.close()

    def scatter(self, header, named: dict, samples: dict[int, int]) -> str:
        """Send reducer j rows j of this worker's updates (``named`` ``<shard>/<array>``, from shards
        of ``samples`` samples), straight or through the grid (``header.columns``); returns why
        some could not be delivered, or ""."""
        if header.columns > 0 and header.part >= 0:
            return self._grid_scatter(header, named, samples)
        return self._send_parts(header, exchange.UPDATE, named, samples)

    def all_gather(self, header, shared: dict) -> tuple[list[str], str]:
        """Send this reducer's block of the result (``shared``) to every other reducer, straight or
        through the grid; returns the reducers it could not be sent to straight, and why a
        message through the grid failed ("": none)."""
        if header.columns > 0 and header.part >= 0:
            return [], self._grid_gather(header, shared)
        return self._send_parts_to_all(header, shared), ""

    def _send_parts(self, header, kind: int, arrays: dict, samples: dict[int, int]) -> str:
        """Send block j of ``arrays`` to reducer j (this worker's own block straight to its inbox);
        returns why some could not be delivered, or ""."""
        parts = len(header.reducers)
        for j, reducer in enumerate(header.reducers):
            if reducer.worker_id == self.worker_id:
                own = exchange.as_received(exchange.rows_of(arrays, parts, j), self.float16)
                self.inbox.put(header.round, kind, j, own, samples)
        messages = ((j, self.peers.encode(kind, header.round, j, exchange.rows_of(arrays, parts, j), self.float16, samples))
                    for j, reducer in enumerate(header.reducers) if reducer.worker_id != self.worker_id)
        return "; ".join(self._send_all(header, messages).values())  # each on its way while the next is encoded

    def _send_parts_to_all(self, header, rows: dict) -> list[str]:
        """All-gather: this reducer's rows to every reducer; returns the reducers that did not get them."""
        self.inbox.put(header.round, exchange.REDUCED, header.part, exchange.as_received(rows, self.float16))
        message = self.peers.encode(exchange.REDUCED, header.round, header.part, rows, self.float16)  # encoded once
        return sorted(self._send_all(header, [(j, message) for j, r in enumerate(header.reducers)
                                              if r.worker_id != self.worker_id]))

    def _grid_scatter(self, header, named: dict, samples: dict[int, int]) -> str:
        """The scatter through the grid (see :mod:`iterreduce.transport.exchange`): this worker's rows for the
        reducers of each column to that column's relay (:func:`~iterreduce.transport.exchange.grid_relay`);
        then, as a relay, the rows of the shards it relays to each reducer of its column.
        Returns why a message failed, or ""."""
        k, columns, me, round_ = len(header.reducers), header.columns, header.part, header.round

        def part(target: int, arrays: dict, part_samples: dict) -> bytes:
            return self.peers.encode(exchange.UPDATE, round_, target, arrays, self.float16, part_samples)

        messages = []
        for column in range(columns):
            targets, relay = exchange.grid_column(k, columns, column), exchange.grid_relay(k, columns, me, column)
            if relay == me:  # this worker relays these: they wait in its inbox with the others it relays
                for t in targets:
                    own = exchange.as_received(exchange.rows_of(named, k, t), self.float16)
                    self.inbox.put(round_, exchange.UPDATE, t, own, samples)
            else:
                messages.append((relay, b"".join(part(t, exchange.rows_of(named, k, t), samples) for t in targets)))
        error = "; ".join(self._send_all(header, messages).values())
        if error:
            return error
        # This worker relays its senders' rows (its row's, see grid_relayed) to the reducers of its column.
        step = step_from_json(header.info_json)
        senders = set(exchange.grid_relayed(k, columns, me))
        mine = [s for s, j in zip(header.reduce_shards, header.shard_reducers) if j in senders]
        names = [f"{s}/{name}" for s in mine for name in step.arrays]
        messages = []
        for t in exchange.grid_column(k, columns, me % columns):
            if t == me:
                continue
            rows = self.inbox.wait(round_, exchange.UPDATE, t, names, timeout=None)
            if rows is None:
                return f"rows of shards {mine} for block {t} did not all arrive"
            counts = self.inbox.samples(round_, exchange.UPDATE, t)
            messages.append((t, part(t, rows, {s: counts[s] for s in mine})))
        return "; ".join(self._send_all(header, messages).values())

    def _grid_gather(self, header, shared: dict) -> str:
        """The all-gather through the grid: this reducer's block to its relay of every column, then,
        once the blocks it relays are in, all of them down its column. Returns why a message
        failed, or ""."""
        k, columns, me, round_ = len(header.reducers), header.columns, header.part, header.round
        self.inbox.put(round_, exchange.REDUCED, me, exchange.as_received(shared, self.float16))
        block = self.peers.encode(exchange.REDUCED, round_, me, shared, self.float16)
        relays = {exchange.grid_relay(k, columns, me, column) for column in range(columns)} - {me}
        error = "; ".join(self._send_all(header, [(relay, block) for relay in sorted(relays)]).values())
        if error:
            return error
        parts = []
        for j in exchange.grid_relayed(k, columns, me):
            rows = self.inbox.wait(round_, exchange.REDUCED, j, list(shared), timeout=None)
            if rows is None:
                return f"block {j} of the new parameters did not arrive"
            parts.append(self.peers.encode(exchange.REDUCED, round_, j, rows, self.float16))
        message = b"".join(parts)
        column = [t for t in exchange.grid_column(k, columns, me % columns) if t != me]
        return "; ".join(self._send_all(header, [(t, message) for t in column]).values())

    def _send_all(self, header, messages) -> dict[str, str]:
        """Send each ``(reducer index, message)`` as it comes (each is on its way while the next is
        made), then wait for all; returns the reducers that did not get theirs, each with why."""
        pending = {}
        for j, message in messages:
            reducer = header.reducers[j]
            pending[self.peers.send(reducer.address, message)] = (reducer.worker_id, reducer.address)
        failed = self.peers.wait(pending)
        if failed:
            log.warning("round %d: could not send to %s", header.round, "; ".join(failed.values()))
        return failed
