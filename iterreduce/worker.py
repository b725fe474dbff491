"""The IterativeReduce worker: fetch a superstep, compute per shard, push the update."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import grpc
import numpy as np

from . import wire
from .lifeline import follow_launcher
from .program import Update, WorkerProgram, load_class, shard_seed, step_from_json
from .proto import iterreduce_pb2 as pb
from .proto import iterreduce_pb2_grpc as pb_grpc
from .exceptions import DataError
from .security import TlsCredentials, channel_credentials, channel_options, metadata
from .shards import ShardData

log = logging.getLogger("iterreduce.worker")

#: A worker's exit status when its master cannot be reached (it ended, or is unreachable).
EXIT_MASTER_GONE = 3


class Worker:
    """One worker process's loop. ``name`` is its stable identity across restarts; with ``tls``
    it connects over mutual TLS (on YARN), without it in plaintext (the local loopback cluster)."""

    def __init__(self, address: str, token: str, name: str, device: str = "cpu", resources: dict | None = None,
                 tls: TlsCredentials | None = None):
        options = [("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES)]
        if tls is None:
            self.channel = grpc.insecure_channel(address, options=options)
        else:  # mutual TLS: the master must present ``tls.cert``, and so does this worker
            self.channel = grpc.secure_channel(address, channel_credentials(tls), options=options + channel_options(tls))
        self.stub = pb_grpc.MasterStub(self.channel)
        self.metadata = metadata(token)
        self.name = name
        self.device = device
        self.resources = resources or {}
        self.parameters: dict[str, np.ndarray] = {}
        self.versions: dict[str, int] = {}
        self.shards: dict[int, ShardData] = {}
        self.status: dict = {"state": "starting"}
        self._stop = threading.Event()

    def register(self) -> None:
        reply = self.stub.Register(pb.RegisterRequest(
            worker_name=self.name, host=socket.gethostname(), pid=os.getpid(),
            resources_json=json.dumps(self.resources)), metadata=self.metadata, wait_for_ready=True, timeout=120)
        self.worker_id = reply.worker_id
        self.heartbeat_interval = reply.heartbeat_interval_s
        self.float16 = reply.float16_wire
        program_cls = load_class(reply.program)
        worker_cls = load_class(program_cls.worker_class)
        self.program: WorkerProgram = worker_cls(json.loads(reply.program_config_json), device=self.device)
        log.info("registered as %s", self.worker_id)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                reply = self.stub.Heartbeat(pb.HeartbeatRequest(
                    worker_id=self.worker_id, status_json=json.dumps(self.status)), metadata=self.metadata, timeout=10)
                if not reply.known:
                    log.warning("master no longer knows %s", self.worker_id)
            except grpc.RpcError as exc:
                log.warning("heartbeat failed: %s", exc.code())

    def run(self) -> int:
        """Work until the master says the job is done; returns the exit code."""
        self.register()
        threading.Thread(target=self._heartbeat, daemon=True).start()
        try:
            while True:
                try:
                    header, arrays = self._fetch()
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    # Dropped by the master (e.g. it presumed us lost): rejoin as a new incarnation.
                    log.warning("master dropped this worker; registering again")
                    self.parameters.clear()
                    self.versions.clear()
                    self.register()
                    continue
                if header.kind == pb.TaskHeader.DONE:
                    log.info("job done; peak resident memory %.0f MiB", peak_rss_bytes() / 2**20)
                    return 0
                if header.kind == pb.TaskHeader.WAIT:
                    continue
                self.parameters.update(arrays)
                self.versions.update(header.versions)
                try:
                    updates = self._compute(header)
                except DataError as exc:
                    # Another process would read the same bytes: report it, and the master
                    # ends the job (the next fetch says DONE) instead of retrying it.
                    log.error("bad data: %s", exc)
                    self.stub.ReportDataError(pb.DataErrorReport(
                        worker_id=self.worker_id, step=header.step, shard=self.status.get("shard", -1),
                        message=str(exc)), metadata=self.metadata, timeout=30)
                    continue
                self._push(header, updates)
        finally:
            self._stop.set()

    def _fetch(self):
        header, decoder = None, wire.Decoder()
        for chunk in self.stub.FetchTask(pb.TaskRequest(worker_id=self.worker_id, versions=self.versions),
                                         metadata=self.metadata):
            if chunk.WhichOneof("part") == "header":
                header = chunk.header
            else:
                decoder.add(chunk.tensor)
        return header, decoder.finish()

    def _compute(self, header) -> list[Update]:
        step = step_from_json(header.info_json)
        started = time.perf_counter()
        updates = []
        for shard in header.shards:
            self.status = {"state": "computing", "step": header.step, "phase": step.phase, "shard": shard.index}
            if shard.index not in self.shards:
                self.shards[shard.index] = self.program.load_shard(shard.uri, shard.index)
            seed = shard_seed(header.seed, header.step, shard.index)
            updates.append(self.program.run(step, self.parameters, self.shards[shard.index], seed))
        self.status = {"state": "pushing", "step": header.step}
        self.compute_s = time.perf_counter() - started
        return updates

    def _push(self, header, updates: list[Update]) -> None:
        results = [pb.ShardResult(index=u.shard, samples=u.samples, metrics_json=json.dumps(u.metrics)) for u in updates]
        arrays = {f"{u.shard}/{k}": v for u in updates for k, v in u.arrays.items()}

        def stream():
            yield pb.UpdateChunk(header=pb.UpdateHeader(worker_id=self.worker_id, step=header.step,
                                                        results=results, compute_s=self.compute_s))
            for chunk in wire.encode(arrays, float16=self.float16):
                yield pb.UpdateChunk(tensor=chunk)

        reply = self.stub.PushUpdate(stream(), metadata=self.metadata)
        if not reply.accepted:
            log.warning("update for step %d not accepted: %s", header.step, reply.reason)


def peak_rss_bytes() -> int:
    """The most resident memory this process has held (what YARN's container limit measures)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def main(argv=None) -> int:
    """``python -m iterreduce.worker --master HOST:PORT --name NAME`` (token in $ITERREDUCE_TOKEN)."""
    import argparse

    ap = argparse.ArgumentParser(prog="iterreduce.worker")
    ap.add_argument("--master", required=True, help="host:port of the master")
    ap.add_argument("--name", required=True, help="stable worker name (kept across restarts)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.name} %(levelname)s %(message)s")
    follow_launcher()
    token = os.environ.get("ITERREDUCE_TOKEN", "")
    try:
        return Worker(args.master, token, args.name, args.device).run()
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            log.error("master at %s is gone: %s", args.master, exc.details())
            return EXIT_MASTER_GONE
        log.error("RPC failed: %s %s", exc.code(), exc.details())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
