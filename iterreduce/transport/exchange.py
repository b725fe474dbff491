"""The reduce on the workers: each of K workers reduces its own rows of every array.

A star sync moves N whole updates into the master and N copies of the new parameters
out of it, so the master's link and CPU grow with N (``benchmarks/RESULTS.md``,
"synchronisation cost as workers grow"). With ``MasterConfig.reduce = "workers"`` the
K workers of a round (the *reducers*) split every array by rows (axis 0) into K blocks:

1. scatter: each worker sends block j of its shards' updates, with their sample counts,
   to reducer j;
2. reduce: reducer j's task named the round's shards and brought block j of the
   parameters the reduce reads (the master's full-precision copy); once every shard's
   rows are in, it runs the program's reduce on them, in shard order. A reduce that is
   elementwise (:attr:`iterreduce.program.Program.elementwise_reduce`) gives exactly
   rows j of what the master's own reduce gives: the same floats, summed in the same order;
3. all-gather: reducer j sends its block of the new parameters to every other reducer, and
   to the master with its shards' results (one push), which keeps the whole model
   (checkpoints, evaluation, late joiners).

A worker then moves about four model-sized messages a sync whatever K, the master two, and
each worker calls the master once (its push, which brings back its next task). Messages carry
the *round* (one attempt at one step): a failed exchange makes the master run the step again
as a star (see :class:`iterreduce.master.Master`); blocks of the failed round are ignored, and
a reducer still waiting for them gives up at its next heartbeat.

Sent straight, a worker sends and receives 2 (K-1) messages a sync, and at a hundred workers
their count, not their bytes, is its cost. With many workers the messages go through a *grid*
(:func:`grid_columns`): reducer j sits at row j // C, column j % C of C columns. A sender's
rows for the reducers of column c go in one message to the *relay* of that column in the
sender's own row, which forwards every sender of its row's rows to each reducer of its column,
in one message each; the all-gather goes the same way, along the row, then down the column.
Where the last, short row has no reducer in a column, the first row's relays it (:func:`grid_relay`).
About 4 (C-1) messages a worker instead of 4 (K-1), each update's rows travelling twice; rows
are forwarded, never summed on the way, so every reducer still sums every shard's rows in
shard order: the same bits. Any message that fails fails the round.
"""

from __future__ import annotations

import logging
import math
import threading
from concurrent import futures
from typing import Callable, Mapping

import grpc
import numpy as np

from ..proto import iterreduce_pb2 as pb
from . import wire
from .security import TlsCredentials, TokenInterceptor, metadata, open_channel, server_credentials

log = logging.getLogger("iterreduce.exchange")

Arrays = dict[str, np.ndarray]
UPDATE, REDUCED = pb.SliceHeader.UPDATE, pb.SliceHeader.REDUCED
#: seconds one peer call may take, connecting included (a block of a 100 MB model is a few MB;
#: a peer behind a firewall that drops packets fails only at this deadline)
SEND_TIMEOUT_S = 30.0
#: threads of a worker's Peer service (each receives one part at a time)
SERVE_THREADS = 16
#: a part travels as one message: up to gRPC's largest (a part is 1/K of the model, K >= 2)
PEER_MESSAGE_BYTES = (1 << 31) - 1
#: the Peer service's one method (its request is a framed part: see :func:`pack`)
SERVICE, METHOD = "iterreduce.Peer", "PushSlices"
#: a reducer's rows of the parameters its reduce reads come in its task under this prefix
ROWS_PREFIX = "rows:"


#: a message sent or received costs a worker about as much CPU as this many bytes of one (on
#: loopback, 0.16 + 0.23 ms a message against 0.40 + 0.48 ms a MB: benchmarks/RESULTS.md)
MESSAGE_COST_BYTES = 440_000


def grid_columns(reducers: int, model_bytes: int) -> int:
    """The columns of the grid the exchange of ``reducers`` reducers goes through, or 0 to send
    straight: the grid when the messages it saves a worker, 4 (K - C), cost more than the bytes
    it adds (``model_bytes`` more sent and received: the update's rows travel twice)."""
    if reducers < 3:
        return 0
    columns = math.isqrt(reducers - 1) + 1  # the ceiling of the square root: rows <= columns
    return columns if 4 * (reducers - columns) * MESSAGE_COST_BYTES > 2 * model_bytes else 0


def grid_column(reducers: int, columns: int, column: int) -> list[int]:
    """The reducers in column ``column`` of the grid."""
    return list(range(column, reducers, columns))


def grid_relay(reducers: int, columns: int, sender: int, column: int) -> int:
    """The reducer that relays ``sender``'s parts for the reducers of ``column``: the one of that
    column in the sender's row, or, where the sender's (short, last) row has none, the one in the
    first row. A sender relays its own row's parts of its own column."""
    relay = sender // columns * columns + column
    return relay if relay < reducers else column


def grid_relayed(reducers: int, columns: int, relay: int) -> list[int]:
    """The senders whose parts ``relay`` forwards down its column: its row, and for the first row
    also the short last row's senders that have no reducer of its column."""
    column = relay % columns
    return [s for s in range(reducers) if grid_relay(reducers, columns, s, column) == relay]


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
        return unpack(pack(pb.SliceHeader(), arrays, float16=True))[1]
    return {name: np.array(array) for name, array in arrays.items()}


class Inbox:
    """The blocks peers sent this worker, by (round, kind, part), merged by tensor name, with
    the sample counts of the shards they come from."""

    def __init__(self):
        self._changed = threading.Condition()
        self._boxes: dict[tuple[int, int, int], Arrays] = {}
        self._samples: dict[tuple[int, int, int], dict[int, int]] = {}
        self._abandoned = 0  # rounds before this one will not complete: nobody waits for them

    def put(self, round_: int, kind: int, part: int, arrays: Mapping[str, np.ndarray],
            samples: Mapping[int, int] | None = None) -> None:
        with self._changed:
            self._boxes.setdefault((round_, kind, part), {}).update(arrays)
            self._samples.setdefault((round_, kind, part), {}).update(samples or {})
            self._changed.notify_all()

    def wait(self, round_: int, kind: int, part: int, names, timeout: float | None) -> Arrays | None:
        """The arrays ``names`` of one box once they are all in; None after ``timeout`` seconds
        (None: no limit), or once the round is abandoned (:meth:`abandon_before`) without them."""
        names = list(names)
        with self._changed:
            box = self._boxes.setdefault((round_, kind, part), {})
            complete = lambda: all(n in box for n in names)  # noqa: E731
            self._changed.wait_for(lambda: complete() or round_ < self._abandoned, timeout)
            return {n: box[n] for n in names} if complete() else None

    def samples(self, round_: int, kind: int, part: int) -> dict[int, int]:
        """Shard -> sample count, as the senders of one box declared them."""
        with self._changed:
            return dict(self._samples.get((round_, kind, part), {}))

    def abandoned(self, round_: int) -> bool:
        """Whether round ``round_`` was abandoned (:meth:`abandon_before`): it will not complete."""
        with self._changed:
            return round_ < self._abandoned

    def abandon_before(self, round_: int) -> None:
        """Rounds before ``round_`` failed or ended: wake whoever waits for one of them."""
        with self._changed:
            if round_ > self._abandoned:
                self._abandoned = round_
                self._changed.notify_all()

    def drop_before(self, round_: int) -> None:
        """Forget every round before ``round_`` (a finished or failed round's blocks)."""
        with self._changed:
            for key in [k for k in self._boxes if k[0] < round_]:
                del self._boxes[key]
                self._samples.pop(key, None)


def pack(header: pb.SliceHeader, arrays: Mapping[str, np.ndarray], float16: bool = False) -> bytes:
    """One part as the Peer service's request: the :class:`SliceBatch`'s length (4 bytes,
    little-endian), the SliceBatch, then every tensor's bytes in its order (each byte copied
    once). With ``float16``, float32 travels as float16."""
    batch = pb.SliceBatch(header=header)
    data = []
    for name, array in arrays.items():
        narrowed = float16 and array.dtype == np.float32
        array = np.ascontiguousarray(array.astype(np.float16) if narrowed else array)
        batch.tensors.append(pb.TensorMeta(name=name, dtype=array.dtype.name, shape=array.shape, narrowed=narrowed))
        data.append(array.reshape(-1).view(np.uint8))
    head = batch.SerializeToString()
    return b"".join([len(head).to_bytes(4, "little"), head, *data])


def unpack(message: bytes) -> tuple[pb.SliceHeader, Arrays]:
    """The header and arrays of a part that :func:`pack` made. The arrays are read-only views of
    ``message`` (narrowed ones are widened copies); raises :class:`~iterreduce.transport.wire.WireError`
    for a malformed part."""
    header, arrays, end = _unpack_at(message, 0)
    if end != len(message):
        raise wire.WireError(f"{len(message) - end} bytes after the last tensor of the part")
    return header, arrays


def unpack_all(message: bytes) -> list[tuple[pb.SliceHeader, Arrays]]:
    """Every part of a message of several (:func:`pack`'s parts joined: what a relay sends)."""
    parts, offset = [], 0
    while offset < len(message) or not parts:
        header, arrays, offset = _unpack_at(message, offset)
        parts.append((header, arrays))
    return parts


def _unpack_at(message: bytes, start: int) -> tuple[pb.SliceHeader, Arrays, int]:
    """The part at ``start`` of ``message``, and where it ends."""
    if len(message) - start < 4:
        raise wire.WireError(f"a part of {len(message) - start} bytes")
    length = int.from_bytes(message[start:start + 4], "little")
    if start + 4 + length > len(message):
        raise wire.WireError(f"a part header of {length} bytes, {len(message) - start - 4} left in the message")
    try:
        batch = pb.SliceBatch.FromString(message[start + 4:start + 4 + length])
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, or a short message
        raise wire.WireError(f"unreadable part header: {exc}") from exc
    arrays, offset = {}, start + 4 + length
    for meta in batch.tensors:
        dtype, shape = wire.check_tensor(meta.name, meta.dtype, meta.shape, meta.narrowed)
        if meta.name in arrays:
            raise wire.WireError(f"tensor {meta.name!r} sent twice")
        count = int(np.prod(shape, dtype=np.int64))
        if offset + count * dtype.itemsize > len(message):
            raise wire.WireError(f"tensor {meta.name!r}: {count * dtype.itemsize} bytes announced, "
                                 f"{len(message) - offset} left in the part")
        array = np.frombuffer(message, dtype, count, offset).reshape(shape)
        arrays[meta.name] = array.astype(np.float32) if meta.narrowed else array
        offset += count * dtype.itemsize
    return batch.header, arrays, offset


def serve(inbox: Inbox, token: str, bind_host: str, advertise_host: str,
          tls: TlsCredentials | None = None) -> tuple[grpc.Server, str]:
    """Start a worker's Peer service on ``bind_host`` (any free port): every part it is sent
    goes into ``inbox``. Returns the server and the ``host:port`` its peers dial. Peers need the
    job token, and with ``tls`` the job's certificate, as the master does."""

    def push_slices(message: bytes, context):
        try:
            parts = unpack_all(message)
        except wire.WireError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed part: {exc}")
        for header, arrays in parts:
            inbox.put(header.round, header.kind, header.part, arrays, {r.index: r.samples for r in header.results})
        return pb.SliceReply()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=SERVE_THREADS),
                         interceptors=[TokenInterceptor(token)],
                         options=[("grpc.max_receive_message_length", PEER_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", PEER_MESSAGE_BYTES)])
    handler = grpc.unary_unary_rpc_method_handler(push_slices, request_deserializer=None,  # the bytes as they came
                                                  response_serializer=pb.SliceReply.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler}),))
    bind = f"{bind_host}:0"
    port = server.add_insecure_port(bind) if tls is None else server.add_secure_port(bind, server_credentials(tls))
    server.start()
    return server, f"{advertise_host}:{port}"


class Peers:
    """Sends parts to other workers' Peer services (one channel per peer, kept). Messages are
    serialized here, once: the all-gather sends the same bytes to every peer."""

    def __init__(self, sender: str, token: str, tls: TlsCredentials | None = None):
        self.sender = sender
        self.metadata = metadata(token)
        self.tls = tls
        self._calls: dict[str, Callable] = {}
        self._channels: list[grpc.Channel] = []

    def encode(self, kind: int, round_: int, part: int, arrays: Mapping[str, np.ndarray], float16: bool,
               samples: Mapping[int, int] | None = None) -> bytes:
        """Block ``part`` of ``round_``, framed as the Peer service takes it (:func:`pack`), with
        the sample counts of the shards it comes from."""
        results = [pb.ShardResult(index=shard, samples=n) for shard, n in (samples or {}).items()]
        return pack(pb.SliceHeader(kind=kind, round=round_, part=part, sender=self.sender, results=results),
                    arrays, float16)

    def _call(self, address: str):
        if address not in self._calls:
            channel = open_channel(address, self.tls, PEER_MESSAGE_BYTES)
            self._channels.append(channel)
            self._calls[address] = channel.unary_unary(
                f"/{SERVICE}/{METHOD}", request_serializer=None,  # the framed part as it is
                response_deserializer=pb.SliceReply.FromString, _registered_method=True)
        return self._calls[address]

    def send(self, address: str, message: bytes) -> grpc.Future:
        """Start sending a serialized part (:meth:`encode`) to the peer at ``address``."""
        return self._call(address).future(message, metadata=self.metadata, timeout=SEND_TIMEOUT_S)

    @staticmethod
    def wait(pending: dict) -> dict[str, str]:
        """Wait for sends ``{future: (worker_id, address)}``; returns the peers that failed, with why."""
        failed = {}
        for future, (worker_id, address) in pending.items():
            try:
                future.result()
            except grpc.RpcError as exc:
                failed[worker_id] = f"{worker_id} at {address}: {exc.code().name} {exc.details()}"
        return failed

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
