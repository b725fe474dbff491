"""A worker's calls to its master: registration, heartbeats, tasks and pushes, reports."""

from __future__ import annotations

import itertools
import json
import logging
import queue
import time
from collections.abc import Iterator

import grpc

from ..proto import iterreduce_pb2 as pb
from ..proto import iterreduce_pb2_grpc as pb_grpc
from ..transport import wire
from ..transport.security import metadata
from ..transport.sharedmem import SharedFolder

log = logging.getLogger("iterreduce.worker")  # a part of the worker: its records are the worker's


class MasterLink:
    """A worker's calls to its master over ``channel``, each with ``token``. It holds what the
    calls share: the exchange's layout as the last task that carried one said it (the master
    sends a layout only to a worker that does not hold it), the Steps stream (opened at the first
    push of one message, kept open for the job, since a message on it costs the master less than
    a call) and ``heard``, when the last fetch or push ended (the master counts it as a heartbeat).
    ``shared``: the run's shared-memory folder, where the master uses it with this worker (see
    :meth:`register`): tensors travel both ways in its files, not in the messages."""

    def __init__(self, channel: grpc.Channel, token: str, shared: SharedFolder | None = None):
        self.stub = pb_grpc.MasterStub(channel)
        self.metadata = metadata(token)
        self.offered = shared  # the folder the launcher gave this worker (None: none)
        self.shared: SharedFolder | None = None  # that folder, once the master said it uses it too
        self.heard = 0.0
        self.layout: tuple[int, pb.TaskHeader] = (0, pb.TaskHeader())  # (version, its fields)
        self._steps: tuple[queue.SimpleQueue, object] | None = None  # the open Steps stream: (requests, replies)

    def register(self, request: pb.RegisterRequest) -> pb.RegisterReply:
        """Register, waiting for the master to be up. The master may be a new one (or have dropped
        this worker): the layout and the stream held are not its own, and go. The request names
        the shared folder this worker was given; the reply says whether the master uses it."""
        if self.offered is not None:
            request.shared_dir = self.offered.path
        reply = self.stub.Register(request, metadata=self.metadata, wait_for_ready=True, timeout=120)
        self.close()
        self.layout = (0, pb.TaskHeader())
        self.shared = self.offered if reply.shared else None
        return reply

    def heartbeat(self, worker_id: str, status: dict) -> pb.HeartbeatReply:
        """Tell the master ``worker_id`` lives, in ``status``."""
        return self.stub.Heartbeat(pb.HeartbeatRequest(worker_id=worker_id, status_json=json.dumps(status)),
                                   metadata=self.metadata, timeout=10)

    def report_data_error(self, report: pb.DataErrorReport) -> None:
        """Tell the master a shard's data cannot be used (the master then ends the job)."""
        self.stub.ReportDataError(report, metadata=self.metadata, timeout=30)

    def task_request(self, worker_id: str, versions: dict[str, int]) -> pb.TaskRequest:
        """What worker ``worker_id`` holds (its parameters' ``versions`` and the layout), for the
        master to send only what it lacks."""
        return pb.TaskRequest(worker_id=worker_id, versions=versions, layout_version=self.layout[0])

    def fetch(self, worker_id: str, versions: dict[str, int]):
        """The next task's header and arrays (see :meth:`task_request`)."""
        task = self.read_task(self.stub.FetchTask(self.task_request(worker_id, versions), metadata=self.metadata))
        self.heard = time.monotonic()
        return task

    def read_task(self, messages):
        """The task's header and its arrays, from its messages."""
        header, decoder = None, wire.Decoder(self.shared)
        for chunk in messages:
            if chunk.HasField("header"):
                header = chunk.header
            for tensor in chunk.tensors:
                decoder.add(tensor)
        held, layout = self.layout
        if header.layout_version and header.reducers:  # a new layout: keep it
            self.layout = (header.layout_version, pb.TaskHeader(
                reducers=header.reducers, reduce_shards=header.reduce_shards, columns=header.columns,
                shard_reducers=header.shard_reducers))
        elif header.layout_version:  # the layout this worker holds: the master sent no copy
            if header.layout_version != held:  # never guess whom to send rows to
                raise RuntimeError(f"task of round {header.round}: layout {header.layout_version} was not "
                                   f"sent, and this worker holds layout {held}")
            header.MergeFrom(layout)
        return header, decoder.finish()

    def push(self, first: pb.UpdateHeader, arrays: dict, float16: bool, versions: dict[str, int]):
        """Push the update of header ``first`` and ``arrays`` (as float16 where ``float16``; in the
        shared folder's files where the master uses it, removed once it answered). A push of one
        message asks for the next task in the same call (Sync, see :meth:`task_request`); returns
        that task's header and arrays when it came, else None (fetch it)."""
        written: list[str] = []

        def chunks():
            for chunk in wire.encode(arrays, float16=float16, shared=self.shared):
                if chunk.shared_file:
                    written.append(chunk.shared_file)
                yield chunk

        shared = self.shared
        try:
            return self._push(first, chunks(), versions)
        finally:  # the master read them before it answered (or never will)
            if written:
                shared.remove(written)

    def _push(self, first: pb.UpdateHeader, chunks: Iterator[pb.TensorChunk], versions: dict[str, int]):
        """:meth:`push` of tensor ``chunks``."""

        def stream():  # the header and as many chunks as fit share a message (wire.packed)
            for group in wire.packed(itertools.chain([first], chunks), size=lambda message: message.ByteSize()):
                if group[0] is first:
                    yield pb.UpdateChunk(header=first, tensors=group[1:])
                else:
                    yield pb.UpdateChunk(tensors=group)

        messages = stream()
        head = next(messages)
        second = next(messages, None)
        task = None
        if second is None:
            try:
                reply = self._sync(pb.SyncRequest(update=head, next=self.task_request(first.worker_id, versions)))
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return None  # the master dropped this worker: the next fetch says so, and it registers again
            pushed = reply.pushed
            if not reply.fetch:
                task = self.read_task([reply.task])
        else:
            pushed = self.stub.PushUpdate(itertools.chain([head, second], messages), metadata=self.metadata)
        self.heard = time.monotonic()
        if not pushed.accepted:
            log.warning("update for step %d not accepted: %s", first.step, pushed.reason)
        return task

    def _sync(self, request: pb.SyncRequest) -> pb.SyncReply:
        """A Sync on the Steps stream, opened at the first."""
        if self._steps is None:
            requests = queue.SimpleQueue()
            self._steps = requests, self.stub.Steps(iter(requests.get, None), metadata=self.metadata)
        requests, replies = self._steps
        requests.put(request)
        try:
            return next(replies)
        except grpc.RpcError:
            self.close()
            raise
        except StopIteration:  # the master answers every request until it ends the stream with an error
            self.close()
            raise RuntimeError("the master closed this worker's stream without an error") from None

    def close(self) -> None:
        """End the Steps stream, if one is open."""
        if self._steps is not None:
            requests, replies = self._steps
            self._steps = None
            requests.put(None)
            replies.cancel()
