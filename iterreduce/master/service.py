"""The master's gRPC service: the RPCs workers call (register, heartbeat, fetch a task, push an
update, report bad data), each a short look at the job's state under the master's lock, and the
server that carries them behind the token check, with the shared broadcast's bytes sent as they are."""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent import futures

import grpc

from ..exceptions import DataError
from ..program import master_side, step_to_json
from ..proto import iterreduce_pb2 as pb
from ..proto import iterreduce_pb2_grpc as pb_grpc
from ..transport import wire
from ..transport.security import TokenInterceptor
from .broadcast import task_chunk_bytes
from .pushes import Refused, read_push

log = logging.getLogger("iterreduce.master")

#: the longest a worker's request for a task waits for work before the answer is WAIT (ask again)
LONG_POLL_S = 5.0


#: The most of a worker's resources description the master reads (it is logged).
MAX_RESOURCES_JSON = 4096


#: A worker's name: a letter, then letters, digits, ``_.-`` (its slot's number, ``worker-7``, stays short).
WORKER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
#: The longest host or peer address a worker may give (a DNS name is at most 253 characters).
MAX_ADDRESS_CHARS = 300
#: The largest status a heartbeat may carry.
MAX_STATUS_JSON = 65536


def _unfit_registration(request) -> str | None:
    """Why a Register request is not one a worker of this runtime sends (None: it is)."""
    if request.worker_name and not WORKER_NAME.fullmatch(request.worker_name):
        return f"worker_name {request.worker_name[:40]!r}: a letter, then at most 63 letters, digits or _.-"
    for field in ("host", "peer_address"):
        if len(getattr(request, field)) > MAX_ADDRESS_CHARS:
            return f"{field}: longer than {MAX_ADDRESS_CHARS} characters"
    return None


def _a_status(status_json: str) -> bool:
    """Whether a heartbeat's status is what a worker sends: a JSON object, not too large."""
    if len(status_json) > MAX_STATUS_JSON:
        return False
    try:
        return isinstance(json.loads(status_json), dict)
    except (ValueError, RecursionError):
        return False


def _local_share(resources_json: str) -> dict:
    """``{"local": f}`` where a worker says which share (0 to 1) of its data's bytes are stored on its
    own host (a launcher that knows the blocks' places, such as YARN's, tells it), else ``{}``."""
    if not resources_json or len(resources_json) > MAX_RESOURCES_JSON:
        return {}
    try:
        local = json.loads(resources_json).get("local")
    except (ValueError, AttributeError):
        return {}
    ok = isinstance(local, (int, float)) and not isinstance(local, bool) and 0 <= local <= 1
    return {"local": float(local)} if ok else {}


class MasterService(pb_grpc.MasterServicer):
    """The RPCs of :class:`~iterreduce.master.master.Master`'s job: what a worker asks, answered from
    the master's state (``master``), which each call reads and changes with the master's lock held."""

    def __init__(self, master):
        self.master = master  # the Master (which makes its service: this module imports none of it)

    def Register(self, request, context):
        master = self.master
        why = _unfit_registration(request)
        if why:  # checked before anything of the job changes
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, why)
        with master.lock:
            name = request.worker_name or f"anonymous-{len(master.members.names)}"
            for w in master.members.workers.values():
                if w.name == name and w.alive:  # a restarted process replaces its predecessor
                    master.drop(w, "replaced by a new process of the same name")
            share = _local_share(request.resources_json)
            worker = master.members.register(name, request.host, request.peer_address, master.rounds.in_flight,
                                             local=share.get("local"))
            worker.shared = master.shared is not None and request.shared_dir == master.shared.path
            log.info("registered %s from %s (pid %d) with shards %s", worker.worker_id, request.host,
                     request.pid, sorted(worker.shards))
            master.event("worker_registered", worker=worker.worker_id, host=request.host, shards=sorted(worker.shards),
                         shared_memory=worker.shared, **share)
            master.wake_all()
        return pb.RegisterReply(
            worker_id=worker.worker_id, program=master.config.program,
            program_config_json=json.dumps(master.config.program_config),
            heartbeat_interval_s=master.heartbeat_interval, float16_wire=master.config.float16_wire,
            shared=worker.shared,
        )

    def Heartbeat(self, request, context):
        master = self.master
        if request.status_json and not _a_status(request.status_json):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"status_json: not a JSON object of at most "
                                                            f"{MAX_STATUS_JSON} characters")
        with master.lock:
            if master.members.heard(request.worker_id, request.status_json) is None:
                return pb.HeartbeatReply(known=False)
            return pb.HeartbeatReply(known=True, round=master.rounds.round)

    def FetchTask(self, request, context):
        yield from self._task(request, context)

    def Sync(self, request, context):
        """A push and the next task in one call (see the proto): the task comes back only when it
        fits one message; else ``fetch`` says to ask FetchTask, and nothing was given out."""
        pushed = self._accept(iter([request.update]), context)
        messages = self._task(request.next, context, limit=wire.CHUNK_BYTES)
        if messages is None:
            return pb.SyncReply(pushed=pushed, fetch=True)
        (message,) = messages
        task = message if isinstance(message, pb.TaskChunk) else pb.TaskChunk.FromString(message)
        return pb.SyncReply(pushed=pushed, task=task)

    def Steps(self, request_iterator, context):
        """Sync on a worker's open stream: each request answered in turn (see the proto)."""
        for request in request_iterator:
            yield self.Sync(request, context)

    def _task(self, request, context, limit: int | None = None) -> list:
        """The task for ``request``'s worker, as the messages to send (serialized TaskChunks, or a
        DONE or WAIT one): waits up to :data:`LONG_POLL_S` for work. With ``limit``, one message, or None when the
        task's tensors would take more than ``limit`` bytes (nothing is given out then: the worker
        fetches it)."""
        master = self.master
        deadline = time.monotonic() + LONG_POLL_S
        with master.lock:
            while True:
                worker = master.members.live_worker(request.worker_id)
                if worker is None:
                    context.abort(grpc.StatusCode.NOT_FOUND, f"unknown worker {request.worker_id}: register again")
                worker.last_seen = time.monotonic()
                if master.done or master.failure:
                    return [pb.TaskChunk(header=pb.TaskHeader(kind=pb.TaskHeader.DONE))]
                if not worker.shards and not master.members.wanted(worker):
                    master.retire(worker)
                    return [pb.TaskChunk(header=pb.TaskHeader(kind=pb.TaskHeader.DONE))]
                todo = master.rounds.todo(worker)
                if todo:
                    break
                if time.monotonic() > deadline or not context.is_active():
                    return [pb.TaskChunk(header=pb.TaskHeader(kind=pb.TaskHeader.WAIT))]
                # Woken when there may be work (see ``_work``), else at the deadline: a thousand idle
                # workers' fetches must not wake the master thousands of times a second.
                master.work.wait(timeout=max(0.01, deadline - time.monotonic()))
            step_index, step = master.current, master.steps[master.current]
            stale = {k: master.versions[k] for k in master.parameters
                     if not master_side(k) and request.versions.get(k, -1) < master.versions[k]}
            fields, rows = master.rounds.task_fields(worker.worker_id, stale, master.versions, request.layout_version)
            send = {k: master.parameters[k] for k in stale if k not in fields["gathered"]}
            versions = {k: master.versions[k] for k in send}
            send.update(rows)
            if limit is not None and master.broadcast.wire_bytes(send, versions, worker.shared) > limit:
                return None
            master.rounds.give(todo, worker.worker_id)
        header = pb.TaskHeader(
            kind=pb.TaskHeader.RUN, step=step_index, phase=step.phase, info_json=step_to_json(step),
            shards=[pb.Shard(index=s, uri=master.shards[s]["uri"]) for s in todo],
            seed=master.config.seed, versions=versions, **fields,
        )
        return master.broadcast.messages(header, send, versions, one_message=limit is not None, shared=worker.shared)

    def PushUpdate(self, request_iterator, context):
        return self._accept(request_iterator, context)

    def _accept(self, request_iterator, context) -> pb.PushReply:
        """Take a push (its messages: a header, then tensor chunks), or say why not."""
        master = self.master
        try:
            header, arrays, updates = read_push(request_iterator, master.shared)
            with master.lock:
                worker = master.members.live_worker(header.worker_id)
                if worker is None:
                    raise Refused(f"update from unknown or dropped worker {header.worker_id}", abort=False)
                if header.step != master.current:
                    raise Refused(f"{header.worker_id}: update for step {header.step}, current is {master.current}",
                                  abort=False)
                master.rounds.check_push(header, worker.worker_id, updates, master.steps[master.current].arrays,
                                         master.parameters)
                master.rounds.take_push(header, worker.worker_id, updates, arrays)
                if header.compute_s > 0:
                    worker.samples_per_s = sum(r.samples for r in header.results) / header.compute_s
                worker.last_seen = time.monotonic()
                master.lock.notify_all()  # the step's driver: no fetcher has new work after a push
        except Refused as refused:
            return self._reject(context, str(refused), abort=refused.abort)
        return pb.PushReply(accepted=True)

    def ReportDataError(self, request, context):
        master = self.master
        with master.lock:
            if master.failure is None:
                log.error("%s reports bad data in shard %d: %s", request.worker_id, request.shard, request.message)
                master.event("data_error", worker=request.worker_id, step=request.step, shard=request.shard,
                             message=request.message)
                master.failure = DataError(request.message)
            master.wake_all()
        return pb.DataErrorReply()

    def _reject(self, context, reason: str, abort: bool = True):
        log.warning("rejected update: %s", reason)
        if abort:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)
        return pb.PushReply(accepted=False, reason=reason)


def master_server(servicer: pb_grpc.MasterServicer, workers: int, token: str) -> grpc.Server:
    """A gRPC server (not started, bound to no port) of ``servicer``'s RPCs, for ``workers``
    workers, each call checked for ``token``."""
    options = [("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4 * workers + 8),
                         interceptors=[TokenInterceptor(token)], options=options)
    add_servicer(servicer, server)
    return server


def add_servicer(servicer: pb_grpc.MasterServicer, server: grpc.Server) -> None:
    """``pb_grpc.add_MasterServicer_to_server``, built from the same service descriptor, except
    that FetchTask may yield serialized chunks (the same messages on the wire, for the same
    clients)."""
    kinds = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
             (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    service = pb.DESCRIPTOR.services_by_name["Master"]
    handlers = {}
    for method in service.methods:
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        handlers[method.name] = kinds[method.client_streaming, method.server_streaming](
            getattr(servicer, method.name),
            request_deserializer=request.FromString,
            response_serializer=task_chunk_bytes if method.name == "FetchTask" else response.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    if hasattr(server, "add_registered_method_handlers"):  # grpcio >= 1.63, as the generated code does
        server.add_registered_method_handlers(service.full_name, handlers)
