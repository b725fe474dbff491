"""The master's tasks as they go on the wire: serialized :class:`TaskChunk` messages, the
parameters among them encoded once per value and shared by every worker's fetch."""

from __future__ import annotations

import threading

import numpy as np

from ..proto import iterreduce_pb2 as pb
from ..transport import wire
from ..transport.sharedmem import SharedFolder

#: Values of a parameter whose shared-memory files are kept: the newest, and the one before for a
#: worker still reading it (one the master dropped, say, and has not yet told).
SHARED_VALUES_KEPT = 2


class Broadcast:
    """The tasks' messages, with the parameters' encodings: ``cache`` maps (a name, whether
    for a worker of the shared folder) to (version, array, its TaskChunk messages serialized),
    one entry each; the broadcast is encoded once per new parameter value and the same bytes
    are sent to every worker. ``shared``: the run's shared-memory folder (None: none), where a
    value is written once for the workers on this host (:mod:`iterreduce.transport.sharedmem`)."""

    def __init__(self, float16: bool, shared: SharedFolder | None = None):
        self.float16 = float16
        self.shared = shared
        self.cache: dict[tuple[str, bool], tuple[int, np.ndarray, list[bytes]]] = {}
        self._files: dict[str, list[str]] = {}  # a name's shared files, oldest first
        self._in_file: dict[str, tuple[int, np.ndarray]] = {}  # a name's (version, value) its newest file holds
        self._lock = threading.Lock()

    def encoded(self, name: str, array: np.ndarray, version: int, shared: bool = False) -> list[bytes]:
        """Parameter ``name`` at ``version`` as serialized :class:`TaskChunk` messages (what
        :func:`wire.encode` makes of it; ``shared``: one chunk naming its file in the shared
        folder), encoded by the first fetch that needs it and shared by every other: N workers
        cost one encoding, not N. An entry holds for the very array object it was made from: a
        new value (a reduce, ``before_step``, a resume) is encoded again even at the same
        version. Parameters are replaced, never changed in place."""
        with self._lock:
            return self._encode(name, array, version, shared)

    def _encode(self, name: str, array: np.ndarray, version: int, shared: bool) -> list[bytes]:
        """:meth:`encoded`, with the lock held."""
        cached = self.cache.get((name, shared))
        if cached is not None and cached[0] == version and cached[1] is array:
            return cached[2]
        folder = self.shared if shared else None
        tensors = list(wire.encode({name: array}, float16=self.float16, shared=folder))
        if folder is not None and tensors[0].shared_file:  # else /dev/shm was full: the bytes
            self._keep_file(name, tensors[0].shared_file)
            self._in_file[name] = (version, array)
        chunks = [pb.TaskChunk(tensors=[c]).SerializeToString() for c in tensors]
        self.cache[(name, shared)] = (version, array, chunks)  # the one entry of this name: older ones go
        return chunks

    def publish(self, values: list[tuple[str, np.ndarray, int]]) -> None:
        """Write ``values`` (name, array, version) into the shared folder, in a thread of their own:
        the writes overlap what the master does next (its evaluation, its bookkeeping), and every
        task's encoding waits for them (the lock is held from here until they are written)."""
        self._lock.acquire()  # released by the writer, whatever happens

        def write() -> None:
            try:
                for name, array, version in values:
                    self._encode(name, array, version, True)
            finally:
                self._lock.release()

        threading.Thread(target=write, name="publish", daemon=True).start()

    def close(self) -> None:
        """Let go of the shared folder once a publication under way is written (its files go)."""
        with self._lock:
            if self.shared is not None:
                self.shared.close()

    def _keep_file(self, name: str, file: str) -> None:
        """Remember ``file`` as ``name``'s newest, and delete the files of its values before the
        last :data:`SHARED_VALUES_KEPT`."""
        files = self._files.setdefault(name, [])
        files.append(file)
        self.shared.remove(files[:-SHARED_VALUES_KEPT])
        del files[:-SHARED_VALUES_KEPT]

    def messages(self, header: pb.TaskHeader, send: dict[str, np.ndarray], versions: dict[str, int],
                 one_message: bool, shared: bool = False) -> list[bytes]:
        """A task as serialized TaskChunks: ``header``, then the arrays of ``send``, those at one
        of ``versions`` shared (:meth:`encoded`; ``shared``: for a worker of the shared folder),
        the others (a reducer's rows: its own) encoded for it alone. ``one_message``: in one
        message, whatever the header adds (as a Sync's reply holds it); else packed into messages
        of up to :data:`wire.CHUNK_BYTES`."""

        def pieces():  # serialized TaskChunks: joined, they are one message with all their fields
            yield pb.TaskChunk(header=header).SerializeToString()
            for name, array in send.items():
                if name in versions:
                    yield from self.encoded(name, array, versions[name], shared)
                else:  # a reducer's rows: its own, never shared
                    for chunk in wire.encode({name: array}):
                        yield pb.TaskChunk(tensors=[chunk]).SerializeToString()

        if one_message:  # one message (serialized TaskChunks joined are one), whatever the header adds
            return [b"".join(pieces())]
        # A group of one is sent as it is, not copied; the broadcast's pieces are shared, so the
        # list holds no copy of the parameters.
        return [b"".join(group) for group in wire.packed(pieces(), len)]

    def wire_bytes(self, send: dict[str, np.ndarray], versions: dict[str, int], shared: bool) -> int:
        """At most the bytes ``send`` takes in a task's messages: none for a parameter a worker of
        the shared folder reads from a file written already (the master writes each new value when
        it makes it); the others' bytes, whether they go in a file or (the folder full) not."""
        with self._lock:
            def in_file(name, array):
                written = self._in_file.get(name)
                return written is not None and written[0] == versions[name] and written[1] is array

            return sum(array.nbytes for name, array in send.items()
                       if not (shared and name in versions and in_file(name, array)))


def task_chunk_bytes(message) -> bytes:
    """FetchTask's response serializer: a :class:`TaskChunk`, or one already serialized (see
    :meth:`Broadcast.messages`), sent as it is."""
    return message if isinstance(message, bytes) else message.SerializeToString()
