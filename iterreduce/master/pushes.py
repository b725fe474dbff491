"""A worker's push as the master reads it: a header, then tensor chunks; or why it is refused."""

from __future__ import annotations

import itertools
import json

from ..program import Update
from ..proto import iterreduce_pb2 as pb
from ..transport import wire
from ..transport.sharedmem import SharedFolder


class Refused(Exception):
    """A push the master does not take, and why. ``abort``: the call fails (a malformed push);
    else it is answered ``accepted=False`` (e.g. a push for a step or round that is over)."""

    def __init__(self, reason: str, abort: bool = True):
        super().__init__(reason)
        self.abort = abort


def read_push(request_iterator, shared: SharedFolder | None = None) -> tuple[pb.UpdateHeader, dict, dict[int, Update]]:
    """A push's header, its arrays (named ``<shard>/<array>``, or a reducer's block) and its
    updates by shard; raises :class:`Refused` on a malformed stream. ``shared``: the run's
    shared-memory folder, whose files a worker on this host may push its arrays in."""
    try:
        first = next(request_iterator)
    except StopIteration:
        raise Refused("empty update stream") from None
    if not first.HasField("header"):
        raise Refused("update stream must start with a header")
    header = first.header
    decoder = wire.Decoder(shared)
    try:
        for message in itertools.chain([first], request_iterator):
            if message is not first and message.HasField("header"):
                raise Refused(f"{header.worker_id}: second header in update stream")
            for chunk in message.tensors:
                if len(chunk.data) > 2 * wire.CHUNK_BYTES:
                    raise Refused(f"{header.worker_id}: oversized tensor chunk ({len(chunk.data)} bytes)")
                decoder.add(chunk)
        arrays = decoder.finish()
    except (wire.WireError, ValueError) as exc:
        raise Refused(f"{header.worker_id}: malformed update: {exc}") from None
    updates = {}
    for result in header.results:
        prefix = f"{result.index}/"
        updates[result.index] = Update(
            shard=result.index, samples=result.samples,
            arrays={k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)},
            metrics=json.loads(result.metrics_json or "{}"),
        )
    if header.combined and header.results:  # one update for all (UpdateHeader.combined), the first's
        first = header.results[0].index
        updates[first].combined = tuple(r.index for r in header.results[1:])
    return header, arrays, updates
