"""The reduce on the workers: each of K workers reduces its own rows of every array.

A star sync moves N whole updates into the master and N copies of the new parameters
out of it, so the master's link and CPU grow with N (``benchmarks/RESULTS.md``,
"synchronisation cost as workers grow"). With ``MasterConfig.reduce = "workers"`` the
K workers of a round (the *reducers*) split every array by rows (axis 0) into K parts:

1. scatter: each worker sends part j of its shards' updates to reducer j;
2. reduce: when every shard has reported, the master sends reducer j part j of the
   parameters (its own full-precision copy) and the list of shards; reducer j runs the
   program's reduce on part j of each shard's update, in shard order. A reduce that is
   elementwise (:attr:`iterreduce.program.Program.elementwise_reduce`) gives exactly
   rows j of what the master's own reduce gives: the same floats, summed in the same order;
3. all-gather: reducer j sends its rows of the new parameters to every reducer, and to
   the master, which keeps the whole model (checkpoints, evaluation, late joiners).

A worker then moves about four model-sized messages a sync whatever N, and the master
two. Messages are tagged with the *round* (one attempt at one step): a failed exchange
makes the master run the step again as a star (see :class:`iterreduce.master.Master`),
and slices of the failed round are ignored.
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from typing import Callable, Mapping

import grpc
import numpy as np

from . import wire
from .proto import iterreduce_pb2 as pb
from .proto import iterreduce_pb2_grpc as pb_grpc
from .security import TlsCredentials, TokenInterceptor, metadata, open_channel, server_credentials

log = logging.getLogger("iterreduce.exchange")

Arrays = dict[str, np.ndarray]
UPDATE, REDUCED = pb.SliceHeader.UPDATE, pb.SliceHeader.REDUCED
#: seconds one peer call may take (a part of a 100 MB model is a few MB)
SEND_TIMEOUT_S = 120.0
#: concurrent sends of one worker: enough to keep a 10 GbE link busy with small parts
SEND_THREADS = 16


def bounds(rows: int, parts: int, part: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of part ``part`` when ``rows`` rows are cut into ``parts`` parts
    (sizes differ by one at most; with more parts than rows some are empty)."""
    return rows * part // parts, rows * (part + 1) // parts


def rows_of(arrays: Mapping[str, np.ndarray], parts: int, part: int) -> Arrays:
    """Part ``part`` of every array, cut along axis 0 (views, no copy)."""
    out = {}
    for name, array in arrays.items():
        start, stop = bounds(array.shape[0], parts, part)
        out[name] = array[start:stop]
    return out


def join_rows(pieces: list[Mapping[str, np.ndarray]]) -> Arrays:
    """The arrays whose parts, in order, are ``pieces`` (what :func:`rows_of` cut);
    raises ``ValueError`` when the parts do not name the same arrays."""
    names = set(pieces[0])
    for index, piece in enumerate(pieces):
        if set(piece) != names:
            raise ValueError(f"part {index} holds {sorted(piece)}, part 0 holds {sorted(names)}")
    return {name: np.concatenate([piece[name] for piece in pieces], axis=0) for name in pieces[0]}


def can_cut(arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether every array has rows to cut (a 0-d array has none: its step stays a star)."""
    return all(np.ndim(a) >= 1 for a in arrays.values())


def as_received(arrays: Mapping[str, np.ndarray], float16: bool) -> Arrays:
    """What a peer receives when ``arrays`` are sent: the same values, or with ``float16``
    float32 narrowed as on the wire. A worker's own part takes this path, so it holds the
    same bits as the parts that travelled."""
    if float16:
        return wire.decode(wire.encode(arrays, float16=True))
    return {name: np.array(array) for name, array in arrays.items()}


class Inbox:
    """The parts peers sent this worker, by (round, kind, part), merged by tensor name."""

    def __init__(self):
        self._changed = threading.Condition()
        self._boxes: dict[tuple[int, int, int], Arrays] = {}

    def put(self, round_: int, kind: int, part: int, arrays: Mapping[str, np.ndarray]) -> None:
        with self._changed:
            self._boxes.setdefault((round_, kind, part), {}).update(arrays)
            self._changed.notify_all()

    def wait(self, round_: int, kind: int, part: int, names, timeout: float) -> Arrays | None:
        """The arrays ``names`` of one box once they are all in; None after ``timeout`` seconds."""
        names = list(names)
        with self._changed:
            box = self._boxes.setdefault((round_, kind, part), {})
            if not self._changed.wait_for(lambda: all(n in box for n in names), timeout):
                return None
            return {n: box[n] for n in names}

    def drop_before(self, round_: int) -> None:
        """Forget every round before ``round_`` (a finished or failed round's parts)."""
        with self._changed:
            for key in [k for k in self._boxes if k[0] < round_]:
                del self._boxes[key]


class PeerService(pb_grpc.PeerServicer):
    """A worker's Peer service: puts the parts it is sent into its :class:`Inbox`."""

    def __init__(self, inbox: Inbox):
        self.inbox = inbox

    def PushSlices(self, request_iterator, context):
        first = next(request_iterator, None)
        if first is None or first.WhichOneof("part") != "header":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a slice stream must start with a header")
        header = first.header
        decoder = wire.Decoder()
        try:
            for chunk in request_iterator:
                if chunk.WhichOneof("part") != "tensor" or len(chunk.tensor.data) > 2 * wire.CHUNK_BYTES:
                    raise wire.WireError("a second header or an oversized chunk")
                decoder.add(chunk.tensor)
            arrays = decoder.finish()
        except (wire.WireError, ValueError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed slices from {header.sender}: {exc}")
        self.inbox.put(header.round, header.kind, header.part, arrays)
        return pb.SliceReply()


def serve(inbox: Inbox, token: str, bind_host: str, advertise_host: str,
          tls: TlsCredentials | None = None) -> tuple[grpc.Server, str]:
    """Start a worker's Peer service on ``bind_host`` (any free port); returns the server and
    the ``host:port`` its peers dial. Peers need the job token, and with ``tls`` the job's
    certificate, as the master does."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=SEND_THREADS),
                         interceptors=[TokenInterceptor(token)],
                         options=[("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES)])
    pb_grpc.add_PeerServicer_to_server(PeerService(inbox), server)
    bind = f"{bind_host}:0"
    port = server.add_insecure_port(bind) if tls is None else server.add_secure_port(bind, server_credentials(tls))
    server.start()
    return server, f"{advertise_host}:{port}"


class Peers:
    """Sends parts to other workers' Peer services (one channel per peer, kept)."""

    def __init__(self, sender: str, token: str, tls: TlsCredentials | None = None):
        self.sender = sender
        self.metadata = metadata(token)
        self.tls = tls
        self._stubs: dict[str, pb_grpc.PeerStub] = {}
        self._channels: list[grpc.Channel] = []
        self._pool = futures.ThreadPoolExecutor(max_workers=SEND_THREADS, thread_name_prefix="peer-send")

    def _stub(self, address: str) -> pb_grpc.PeerStub:
        if address not in self._stubs:
            channel = open_channel(address, self.tls, wire.MAX_MESSAGE_BYTES)
            self._channels.append(channel)
            self._stubs[address] = pb_grpc.PeerStub(channel)
        return self._stubs[address]

    def send(self, address: str, kind: int, round_: int, part: int, arrays: Mapping[str, np.ndarray],
             float16: bool) -> None:
        """Send ``arrays`` to the peer at ``address`` as part ``part`` of ``round_``."""
        def stream():
            yield pb.SliceChunk(header=pb.SliceHeader(kind=kind, round=round_, part=part, sender=self.sender))
            for chunk in wire.encode(arrays, float16=float16):
                yield pb.SliceChunk(tensor=chunk)

        self._stub(address).PushSlices(stream(), metadata=self.metadata, timeout=SEND_TIMEOUT_S)

    def send_each(self, targets: list[tuple[int, str, str]], make: Callable[[int], Mapping[str, np.ndarray]],
                  kind: int, round_: int, float16: bool) -> dict[str, str]:
        """Send ``make(j)`` to each ``(j, worker_id, address)`` of ``targets`` at once, as part
        ``j`` of ``round_``; returns the peers that failed, each with why."""
        pending = {self._pool.submit(self.send, address, kind, round_, j, make(j), float16): (worker_id, address)
                   for j, worker_id, address in targets}
        failed = {}
        for future in futures.as_completed(pending):
            worker_id, address = pending[future]
            try:
                future.result()
            except grpc.RpcError as exc:
                failed[worker_id] = f"{worker_id} at {address}: {exc.code().name} {exc.details()}"
        return failed

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for channel in self._channels:
            channel.close()
