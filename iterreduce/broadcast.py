"""The master's tasks as they go on the wire: serialized :class:`TaskChunk` messages, the
parameters among them encoded once per value and shared by every worker's fetch."""

from __future__ import annotations

import threading

import numpy as np

from . import wire
from .proto import iterreduce_pb2 as pb


class Broadcast:
    """The tasks' messages, with the parameters' encodings: ``cache`` maps a name to (version,
    array, its TaskChunk messages serialized), one entry a name; the broadcast is encoded once
    per new parameter value and the same bytes are sent to every worker."""

    def __init__(self, float16: bool):
        self.float16 = float16
        self.cache: dict[str, tuple[int, np.ndarray, list[bytes]]] = {}
        self._lock = threading.Lock()

    def encoded(self, name: str, array: np.ndarray, version: int) -> list[bytes]:
        """Parameter ``name`` at ``version`` as serialized :class:`TaskChunk` messages (what
        :func:`wire.encode` makes of it), encoded by the first fetch that needs it and shared by
        every other: N workers cost one encoding, not N. An entry holds for the very array
        object it was made from: a new value (a reduce, ``before_step``, a resume) is encoded
        again even at the same version. Parameters are replaced, never changed in place."""
        with self._lock:
            cached = self.cache.get(name)
            if cached is not None and cached[0] == version and cached[1] is array:
                return cached[2]
            chunks = [pb.TaskChunk(tensors=[c]).SerializeToString()
                      for c in wire.encode({name: array}, float16=self.float16)]
            self.cache[name] = (version, array, chunks)  # the one entry of this name: older ones go
            return chunks

    def messages(self, header: pb.TaskHeader, send: dict[str, np.ndarray], versions: dict[str, int],
                 one_message: bool) -> list[bytes]:
        """A task as serialized TaskChunks: ``header``, then the arrays of ``send``, those at one
        of ``versions`` shared (:meth:`encoded`), the others (a reducer's rows: its own) encoded
        for it alone. ``one_message``: in one message, whatever the header adds (as a Sync's
        reply holds it); else packed into messages of up to :data:`wire.CHUNK_BYTES`."""

        def pieces():  # serialized TaskChunks: joined, they are one message with all their fields
            yield pb.TaskChunk(header=header).SerializeToString()
            for name, array in send.items():
                if name in versions:
                    yield from self.encoded(name, array, versions[name])
                else:  # a reducer's rows: its own, never shared
                    for chunk in wire.encode({name: array}):
                        yield pb.TaskChunk(tensors=[chunk]).SerializeToString()

        if one_message:  # one message (serialized TaskChunks joined are one), whatever the header adds
            return [b"".join(pieces())]
        # A group of one is sent as it is, not copied; the broadcast's pieces are shared, so the
        # list holds no copy of the parameters.
        return [b"".join(group) for group in wire.packed(pieces(), len)]


def task_chunk_bytes(message) -> bytes:
    """FetchTask's response serializer: a :class:`TaskChunk`, or one already serialized (see
    :meth:`Broadcast.messages`), sent as it is."""
    return message if isinstance(message, bytes) else message.SerializeToString()
