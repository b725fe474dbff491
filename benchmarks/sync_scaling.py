"""Synchronisation cost as the worker count grows (issue 13): one master, N lightweight workers.

    python benchmarks/sync_scaling.py                       # 10, 50 and 100 workers, layer 500x2000
    python benchmarks/sync_scaling.py --workers 100 --layer 0 --float16 --json
    python benchmarks/sync_scaling.py --reduce workers      # the workers reduce, each its rows

The master runs in its own process, as in a real job, serving a small program
(:class:`SyncProgram`) whose parameters are the MNIST network's RBM state (``rbm.{l}.*``
of 784-500-500-2000, as :mod:`dbn.model.state` names it): in each pre-training superstep
of layer ``l`` every worker fetches the six arrays of that RBM (weights, biases, and their
momentum increments) and pushes six of the same shapes back. The workers are
lightweight: gRPC clients, many threads in a few processes, each with its own TCP
connection, that register, fetch the task and push a real-size update at once, without
computing (the bytes of the update are encoded once). So a superstep's wall time is the
synchronisation alone: the broadcast of the parameters, the N pushes, and the reduce.

Figures, per superstep after a warm-up step (medians over ``--steps`` steps):

- ``sync s``: wall time of the superstep in the master (from its start to the updates
  reduced; it contains the fetches, so the broadcast of the new parameters), less ``--sleep``.
- ``master CPU s``: the master process's CPU time (all its threads) over the superstep.
- ``MB/s``: the payload bytes the master received plus sent, over the sync time.
- ``compute s``: one real single-threaded CD-1 epoch of :class:`dbn.model.rbm.RBM` of this
  layer's shape on a ``--rows``-row shard (6,000: MNIST's shard with 10 workers), measured
  in the same run before the master starts (random [0, 1] data, batch 100).
- ``share``: sync / (compute + sync): the sync share of a pre-training epoch in weak
  scaling, each worker holding its own shard of ``--rows`` rows and syncing once an epoch,
  each with its own core (the cluster's view).
- ``share here``: the same epoch run by all N workers on this machine's cores: compute
  = N * compute / cores. This is what a job of N loopback workers on this machine would see.

On a machine with few cores the clients share them with the master, so the loopback
figures are pessimistic for the workers' side; the master's CPU per byte is what
projects to a cluster (see ``--project``).

With ``--reduce workers`` the master has the workers reduce among themselves
(:mod:`iterreduce.transport.exchange`), so the workers can no longer be bare clients: each is a real
:class:`iterreduce.worker.Worker` (its Peer service, the scatter, its part of the reduce, the
all-gather), threads in a few processes, whose program returns a fixed real-size update
without computing (or after ``--sleep`` seconds). Added figures: ``worker CPU s`` (a worker's CPU per sync: its processes'
CPU over the measured steps, divided by the workers) and ``worker MB`` (the bytes a worker
sends its peers per sync); the projection then adds a worker's time to the master's.

With ``--sleep S`` every worker's step waits S seconds, a compute of that wall time (the bare
clients before each push, the real workers in their program's run), and ``share measured`` is
what a step takes beyond it (``sync s``), over the step. The program lets the workers compute the
next step while the master ends one (:meth:`iterreduce.program.Program.runs_ahead`, as DBN
pre-training does; ``--no-ahead``: they wait for each task), so with the reduce on the workers
the master's part of a sync hides behind that compute; the projection's ``share, running
ahead`` counts only what the master takes beyond it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
#: where the master and the clients import ``iterreduce`` from (``--root``: e.g. a copy of an older commit)
ROOT = os.environ.get("SYNC_SCALING_ROOT") or str(REPO)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

from iterreduce.program import Program, Step, Update, WorkerProgram  # noqa: E402
from sync_figures import (format_projection, format_table, measure_compute, measure_peer_costs,  # noqa: E402
                          measure_reduce_costs, peer_receiver, project)

LAYERS = (784, 500, 500, 2000)  # the MNIST network's RBMs (the softmax layer is not pre-trained)
RBM_KEYS = ("weights", "visible_bias", "hidden_bias", "weights_inc", "visible_bias_inc", "hidden_bias_inc")
PROGRAM = "sync_scaling:SyncProgram"


def rbm_arrays(layer: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The state of RBM ``layer`` of the MNIST network, named as :mod:`dbn.model.state` names it."""
    v, h = LAYERS[layer], LAYERS[layer + 1]
    rng = np.random.default_rng([seed, layer])
    shapes = {"weights": (v, h), "visible_bias": (v,), "hidden_bias": (h,)}
    out = {}
    for key in RBM_KEYS:
        shape = shapes[key.removesuffix("_inc")]
        out[f"rbm.{layer}.{key}"] = (0.01 * rng.standard_normal(shape)).astype(np.float32)
    return out


class SyncProgram(Program):
    """The runtime's view of DBN pre-training of one layer: every RBM's state is a parameter,
    and each superstep trains (fetches, pushes and reduces) the arrays of ``config["layer"]``."""

    worker_class = "sync_scaling:FixedUpdateWorker"  # for --reduce workers; the bare clients need none
    reader = "shardio.readers:ShardFiles"

    def initial_parameters(self, seed, shards):
        params = {}
        for layer in range(len(LAYERS) - 1):
            params.update(rbm_arrays(layer, seed))
        return params

    def schedule(self, shards):
        layer = int(self.config["layer"])
        names = tuple(f"rbm.{layer}.{key}" for key in RBM_KEYS)
        for epoch in range(int(self.config["steps"])):
            yield Step("pretrain", {"layer": layer, "epoch": epoch}, names)

    def finalize(self, parameters, output_dir):
        pass

    def runs_ahead(self, step, following):  # as DBN pre-training does, unless --no-ahead
        return bool(self.config.get("ahead", True))


class FixedUpdateWorker(WorkerProgram):
    """A real worker's side of a sync without the compute: reads no data, and its update for
    any shard is the same real-size one."""

    _update: dict = {}

    def load_shard(self, uri, index):
        return index

    def run(self, step, parameters, shard, seed):
        time.sleep(float(self.config.get("sleep", 0.0)))  # --sleep: a compute of that wall time
        layer = int(self.config["layer"])
        if layer not in self._update:
            self._update[layer] = rbm_arrays(layer, seed=1)
        return Update(shard, int(self.config["rows"]), dict(self._update[layer]))


# ------------------------------------------------------------------------ master


def serve_master(args) -> None:
    """The master process: serve one job, report per-step timings as JSON on stdout."""
    from iterreduce.master import Master, MasterConfig
    from shardio.shards import write_shards

    out = Path(args.out)
    if args.layout != "auto":  # the master picks the layout: force it here
        from iterreduce.transport import exchange
        exchange.MESSAGE_COST_BYTES = 0 if args.layout == "straight" else 1 << 40
    X = np.random.default_rng(0).random((max(args.n, 1) * 2, 4), dtype=np.float32)
    uris = write_shards(X, None, str(out / "shards"), args.n)
    reduce = {"reduce": args.reduce} if args.reduce != "master" else {}  # (a --root master may predate it)
    config = MasterConfig(program=PROGRAM, program_config={"layer": args.layer, "steps": args.steps + 1,
                                                           "rows": args.rows, "sleep": args.sleep,
                                                           "ahead": not args.no_ahead},
                          shards=uris, workers=args.n, token=args.token, output=str(out / "job"),
                          heartbeat_interval=args.heartbeat or 60.0, heartbeat_timeout=3600.0, start_timeout=300.0,
                          float16_wire=args.float16, ui=False, **reduce)  # no page: the master alone
    stats: list[dict] = []

    moved = {"in": 0, "out": 0}  # payload bytes the master received and sent
    moved_lock = threading.Lock()

    def counting(rpcs):
        """``rpcs`` (the class whose methods answer the workers) counting payload bytes in and out."""

        class Counted(rpcs):
            def FetchTask(self, request, context):
                sent = 0
                for message in super().FetchTask(request, context):
                    sent += len(message) if isinstance(message, (bytes, bytearray, memoryview)) else message.ByteSize()
                    yield message
                with moved_lock:
                    moved["out"] += sent

            def PushUpdate(self, request_iterator, context):
                got = [0]

                def counted():
                    for message in request_iterator:
                        got[0] += message.ByteSize()
                        yield message

                try:
                    return super().PushUpdate(counted(), context)
                finally:
                    with moved_lock:
                        moved["in"] += got[0]

            def Sync(self, request, context):  # a push and the next task in one call (a --root master may lack it)
                reply = super().Sync(request, context)
                with moved_lock:
                    moved["in"] += request.update.ByteSize()
                    moved["out"] += reply.task.ByteSize()
                return reply

        return Counted

    try:  # the RPCs are the master's service's; a --root tree's Master may answer them itself
        from iterreduce.master.service import MasterService
    except ImportError:
        MasterService = None

    class Measured(Master if MasterService is not None else counting(Master)):
        """Times each superstep's wall and CPU, and counts its payload bytes."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            if MasterService is not None:
                self.service = counting(MasterService)(self)

        def _run_step(self, index):
            with moved_lock:
                in0, out0 = moved["in"], moved["out"]
            wall, cpu = time.perf_counter(), time.process_time()
            super()._run_step(index)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            with moved_lock:
                received, sent = moved["in"] - in0, moved["out"] - out0
            stats.append({"step": index, "wall_s": wall, "cpu_s": cpu, "bytes_in": received, "bytes_out": sent})

    master = Measured(config)
    server, address = master.serve()
    import iterreduce

    print(json.dumps({"address": address, "iterreduce": iterreduce.__file__}), flush=True)
    try:
        master.run()
        with master.lock:
            master.done = True
            master.lock.notify_all()
        time.sleep(1.0)  # let the clients fetch DONE
    finally:
        server.stop(grace=1.0)
    reduce_s = [r.get("reduce_seconds") for r in _records(out / "job")]
    for s, r in zip(stats, reduce_s):
        s["reduce_s"] = r
    print(json.dumps({"steps": stats}), flush=True)


def _records(output: Path) -> list[dict]:
    path = output / "log.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, lines) if "step" in r and "event" not in r]


# ----------------------------------------------------------------------- clients


def run_peer_workers(args) -> None:
    """One process of real workers (``--reduce workers``): a :class:`Worker` per thread, with its
    Peer service. Reports the process's CPU and the bytes sent to peers over the measured steps
    (from the first task of step 1 on)."""
    from iterreduce.transport import exchange
    from iterreduce.worker import Worker

    lock = threading.Lock()
    mark: dict = {}
    sent = [0]
    original_send = exchange.Peers.send

    def counted_send(self, address, message):
        if mark:
            with lock:
                sent[0] += len(message)
        return original_send(self, address, message)

    exchange.Peers.send = counted_send

    class Measured(Worker):
        def _compute(self, header, *args):
            if header.step >= 1 and not mark:
                with lock:
                    mark.setdefault("cpu", time.process_time())
            return super()._compute(header, *args)

    errors: list[str] = []
    workers = [Measured(args.address, args.token, f"bench-{k}", peer_host="127.0.0.1") for k in args.ids]

    def guarded(worker):
        try:
            if worker.run() != 0:
                errors.append(f"{worker.name} ended with an error")
        except Exception as exc:  # noqa: BLE001 - reported by the parent
            errors.append(f"{worker.name}: {exc!r}")

    threads = [threading.Thread(target=guarded, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"cpu_s": time.process_time(), "measured_cpu_s": time.process_time() - mark.get("cpu", 0.0),
                      "peer_bytes": sent[0], "errors": errors[:5]}), flush=True)


def _worker_class():
    """The Worker of the tree under test (its heartbeat rule is mirrored by the bare clients)."""
    from iterreduce.worker import Worker

    return Worker


def run_clients(args) -> None:
    """One process of lightweight workers: a thread (and a TCP connection) per worker. With
    ``--reduce workers`` they play the master's side of the exchange only: for each task a push
    of the results (no update tensors) with, from a reducer, a pre-encoded block of the right
    rows; they exchange nothing with each other (``--real-workers`` runs real ones)."""
    if args.reduce == "workers" and args.real_workers:
        return run_peer_workers(args)
    import grpc

    from iterreduce.transport import wire
    from iterreduce.proto import iterreduce_pb2 as pb
    from iterreduce.proto import iterreduce_pb2_grpc as pb_grpc
    if args.reduce == "workers":
        from iterreduce.transport import exchange
    from iterreduce.transport.security import metadata

    md = metadata(args.token)
    try:  # as the master does (not in a --root copy that lacks it)
        from iterreduce.process.memory import keep_freed_memory
    except ImportError:
        pass
    else:
        keep_freed_memory()
    options = [("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", wire.MAX_MESSAGE_BYTES),
               ("grpc.use_local_subchannel_pool", 1)]  # one connection per worker, as separate hosts have
    update = rbm_arrays(args.layer, seed=1)
    errors: list[str] = []

    def as_message(chunk) -> bytes:  # a --root tree's proto may predate packed messages
        if "tensors" in pb.UpdateChunk.DESCRIPTOR.fields_by_name:
            return pb.UpdateChunk(tensors=[chunk]).SerializeToString()
        return pb.UpdateChunk(tensor=chunk).SerializeToString()

    def packed(pieces: list[bytes]):
        """Serialized UpdateChunks, joined into messages as a worker packs them (a --root tree's
        wire may predate packing: then one a message)."""
        if not hasattr(wire, "packed"):
            return iter(pieces)
        return (b"".join(group) for group in wire.packed(pieces, len))

    def worker(k: int) -> None:
        channel = grpc.insecure_channel(args.address, options=options)
        stub = pb_grpc.MasterStub(channel)
        # The tensors travel as raw bytes on the clients' side (no parsing of what they fetch,
        # an update serialized once): the clients load the master, not themselves.
        fetch = channel.unary_stream("/iterreduce.Master/FetchTask", request_serializer=pb.TaskRequest.SerializeToString,
                                     response_deserializer=None, _registered_method=True)
        push_raw = channel.stream_unary("/iterreduce.Master/PushUpdate", request_serializer=None,
                                        response_deserializer=pb.PushReply.FromString, _registered_method=True)
        reply = stub.Register(pb.RegisterRequest(worker_name=f"bench-{k}", host="loopback", pid=os.getpid(),
                                                 peer_address="127.0.0.1:1" if args.reduce == "workers" else ""),
                              metadata=md, wait_for_ready=True, timeout=120)
        worker_id, float16 = reply.worker_id, reply.float16_wire
        done = threading.Event()
        heard = [0.0]  # when the last call to the master ended
        if args.heartbeat:  # as a worker does, at the interval the master hands out, unless a call was heard
            skips = "_heard" in _worker_class()._heartbeat.__code__.co_names  # a --root tree's may beat always

            def beat():
                while not done.wait(reply.heartbeat_interval_s):
                    if skips and time.monotonic() - heard[0] < reply.heartbeat_interval_s:
                        continue
                    stub.Heartbeat(pb.HeartbeatRequest(worker_id=worker_id, status_json='{"state": "computing"}'),
                                   metadata=md, timeout=30)
            threading.Thread(target=beat, daemon=True).start()
        versions: dict[str, int] = {}
        encoded: dict[tuple, list] = {}  # shard indices -> the update's tensor chunks, encoded once
        held = (0, [])  # the layout's reducers, as a worker keeps them (a --root proto may predate it)
        listed = "layout_version" in pb.TaskRequest.DESCRIPTOR.fields_by_name
        methods = pb.DESCRIPTOR.services_by_name["Master"].methods_by_name
        can_sync = "Sync" in methods
        steps = None  # the open Steps stream, as a worker keeps one (a --root tree may lack it)
        if "Steps" in methods:
            import queue

            requests = queue.SimpleQueue()
            steps = (requests, stub.Steps(iter(requests.get, None), metadata=md))
        task = None  # the next task's header, when a push brought it (Sync)
        ahead = [False]  # the next task's compute was done while its push was on its way (run ahead)

        def request():
            return pb.TaskRequest(worker_id=worker_id, versions=versions, **({"layout_version": held[0]} if listed else {}))

        def send(pieces: list[bytes], header) -> None:
            """Push as a worker does: one message goes with a request for the next task (Sync). When
            the task says the workers may run ahead, the next step's compute (--sleep) goes on while
            the push is on its way."""
            if args.sleep and getattr(header, "ahead_info_json", ""):
                pushing = threading.Thread(target=push, args=(pieces,))
                pushing.start()
                time.sleep(args.sleep)
                pushing.join()
                ahead[0] = True
            else:
                push(pieces)

        def push(pieces: list[bytes]) -> None:
            nonlocal task
            messages = list(packed(pieces))
            if can_sync and len(messages) == 1:
                sync = pb.SyncRequest(update=pb.UpdateChunk.FromString(messages[0]), next=request())
                if steps is not None:
                    steps[0].put(sync)
                    reply = next(steps[1])
                else:
                    reply = stub.Sync(sync, metadata=md, timeout=600)
                pushed = reply.pushed
                if not reply.fetch:
                    task = reply.task.header
            else:
                pushed = push_raw(iter(messages), metadata=md, timeout=600)
            heard[0] = time.monotonic()
            if not pushed.accepted:
                errors.append(pushed.reason)

        while True:
            header, task = task, None
            if header is None:
                for raw in fetch(request(), metadata=md):
                    if header is None:  # the first message is the header; the rest are tensor chunks
                        header = pb.TaskChunk.FromString(raw).header
                heard[0] = time.monotonic()
            if listed and header.layout_version:
                if header.reducers:
                    held = (header.layout_version, list(header.reducers))
                else:
                    header.reducers.extend(held[1])
            if header.kind == pb.TaskHeader.DONE:
                done.set()
                if steps is not None:
                    steps[0].put(None)
                channel.close()
                return
            if args.sleep and header.kind == pb.TaskHeader.RUN and not ahead[0]:
                time.sleep(args.sleep)  # the compute, as wall time: the master's heartbeats meanwhile count
            ahead[0] = ahead[0] and header.kind != pb.TaskHeader.RUN
            if header.kind == pb.TaskHeader.WAIT:
                continue
            versions.update(header.versions)
            versions.update(header.gathered)
            shards = tuple(s.index for s in header.shards)
            if header.reducers:  # the rows went to the reducers: the results go to the master, and a block
                results = [pb.ShardResult(index=s, samples=args.rows) for s in shards]
                block = []
                if header.part >= 0:  # a reducer's block of the new parameters, pre-encoded
                    key = (len(header.reducers), header.part)
                    if key not in encoded:
                        encoded[key] = [as_message(c)
                                        for c in wire.encode(exchange.rows_of(update, *key))]
                    block = encoded[key]
                first = pb.UpdateChunk(header=pb.UpdateHeader(
                    worker_id=worker_id, step=header.step, round=header.round, results=results, scattered=True,
                    reduced=header.part >= 0, part=header.part))
                send([first.SerializeToString(), *block], header)
                continue
            if shards not in encoded:
                arrays = {f"{s}/{name}": a for s in shards for name, a in update.items()}
                encoded[shards] = [as_message(c)
                                   for c in wire.encode(arrays, float16=float16)]
            results = [pb.ShardResult(index=s, samples=args.rows) for s in shards]
            first = pb.UpdateChunk(header=pb.UpdateHeader(worker_id=worker_id, step=header.step, results=results))
            send([first.SerializeToString(), *encoded[shards]], header)

    def guarded(k):
        try:
            worker(k)
        except Exception as exc:  # noqa: BLE001 - reported by the parent
            errors.append(f"bench-{k}: {exc!r}")

    threads = [threading.Thread(target=guarded, args=(k,), daemon=True) for k in args.ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"cpu_s": time.process_time(), "errors": errors[:5]}), flush=True)


# ------------------------------------------------------------------------- driver


def run_one(n: int, args, compute_s: float) -> dict:
    """One job of ``n`` lightweight workers; returns the row of the table."""
    from iterreduce.transport.security import new_token

    token = new_token()
    with tempfile.TemporaryDirectory(prefix="sync-scaling-") as tmp:
        cmd = [sys.executable, __file__, "--role", "master", "--n", str(n), "--layer", str(args.layer),
               "--steps", str(args.steps), f"--token={token}", "--out", tmp]
        if args.float16:
            cmd.append("--float16")
        cmd += ["--reduce", args.reduce, "--rows", str(args.rows), "--heartbeat", str(args.heartbeat),
                "--layout", args.layout, "--sleep", str(args.sleep), *(["--no-ahead"] if args.no_ahead else [])]
        env = {**os.environ, "SYNC_SCALING_ROOT": args.root} if args.root else None
        master = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        try:
            hello = json.loads(master.stdout.readline())
            address = hello["address"]
            procs = max(1, min(args.client_processes, n))
            clients = []
            for p in range(procs):
                ids = [k for k in range(n) if k % procs == p]
                clients.append(subprocess.Popen(
                    [sys.executable, __file__, "--role", "clients", "--address", address, f"--token={token}",
                     "--layer", str(args.layer), "--rows", str(args.rows), "--reduce", args.reduce,
                     "--heartbeat", str(args.heartbeat), "--sleep", str(args.sleep),
                     *(["--real-workers"] if args.real_workers else []), "--ids", *map(str, ids)],
                    stdout=subprocess.PIPE, text=True, env=env))
            client_reports = [json.loads(c.communicate(timeout=1800)[0].strip().splitlines()[-1]) for c in clients]
            errors = [e for r in client_reports for e in r["errors"]]
            if errors:  # the master would wait for them
                raise SystemExit(f"{n} workers: client errors: {errors[:3]}")
            report = json.loads(master.communicate(timeout=120)[0].strip().splitlines()[-1])
        finally:
            if master.poll() is None:
                master.kill()
    steps = report["steps"][1:]  # step 0 sends every layer's initial state: the warm-up
    med = lambda key: statistics.median(s[key] for s in steps)  # noqa: E731
    wall, cpu = med("wall_s"), med("cpu_s")
    sync = wall - args.sleep  # --sleep: a step's compute, as wall time, is not the sync's
    moved = med("bytes_in") + med("bytes_out")
    cores = os.cpu_count() or 1
    return {
        "workers": n, "layer": f"{LAYERS[args.layer]}x{LAYERS[args.layer + 1]}", "float16": args.float16,
        "bytes_per_sync": moved, "bytes_in": med("bytes_in"), "bytes_out": med("bytes_out"),
        "sync_s": sync, "sync_s_all": [round(s["wall_s"] - args.sleep, 4) for s in steps],
        "reduce_s": med("reduce_s"), "master_cpu_s": cpu, "master_cpu_per_gb": cpu / (moved / 1e9),
        # (with --sleep: the bytes over the whole step)
        "master_mb_s": moved / (wall if args.sleep else sync) / 1e6, "compute_s": compute_s,
        "share": sync / (compute_s + sync),
        # --sleep S: each step waits for a compute of S s, so what a step takes beyond S is the sync's,
        # measured (with the workers running ahead, the master's end of a step hides behind the compute)
        "sleep_s": args.sleep, "ahead": not args.no_ahead,
        "share_measured": sync / wall if args.sleep else None,
        # (bare clients with --reduce workers leave the workers' exchange out: no figure for this machine)
        "share_here": None if args.reduce == "workers" and not args.real_workers else sync / (n * compute_s / cores + sync),
        "client_cpu_s_total": sum(r["cpu_s"] for r in client_reports),
        "cores": cores, "master_iterreduce": hello["iterreduce"], "reduce": args.reduce,
        # --reduce workers: one worker's CPU and bytes sent to peers per sync, over the measured steps
        "worker_cpu_s": sum(r.get("measured_cpu_s", 0.0) for r in client_reports) / (n * args.steps),
        "worker_peer_bytes": sum(r.get("peer_bytes", 0) for r in client_reports) / (n * args.steps),
        "model_bytes": sum(a.nbytes for a in rbm_arrays(args.layer).values()),
        "reduce_local_s": measure_reduce_costs(rbm_arrays(args.layer, seed=1), n, 1) if args.reduce == "workers" else 0.0,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[10, 50, 100])
    ap.add_argument("--layer", type=int, default=2, choices=range(len(LAYERS) - 1),
                    help="RBM whose state is synchronised: 0 = 784x500, 1 = 500x500, 2 = 500x2000 (default)")
    ap.add_argument("--steps", type=int, default=4, help="measured supersteps per worker count (after a warm-up)")
    ap.add_argument("--rows", type=int, default=6000, help="rows of each worker's shard (MNIST with 10 workers: 6,000)")
    ap.add_argument("--float16", action="store_true", help="float16 on the wire")
    ap.add_argument("--client-processes", type=int, default=4, help="processes the lightweight workers run in")
    ap.add_argument("--compute-s", type=float, help="skip the RBM epoch measurement and use this many seconds")
    ap.add_argument("--root", help="run the master and the clients on the iterreduce package under this "
                                   "directory (a copy of another commit, to compare: its wire format too)")
    ap.add_argument("--reduce", choices=("master", "workers"), default="master",
                    help="who reduces: the master, or the workers, each its rows")
    ap.add_argument("--layout", choices=("auto", "straight", "grid"), default="auto",
                    help="how the workers' messages go (--reduce workers): as the runtime picks, straight "
                         "to every reducer, or through the grid (iterreduce.transport.exchange)")
    ap.add_argument("--real-workers", action="store_true",
                    help="with --reduce workers: real workers that exchange their rows (on this machine's cores), "
                         "instead of bare clients that play only the master's side")
    ap.add_argument("--heartbeat", type=float, default=0.0,
                    help="the lightweight workers send heartbeats this often (seconds; the runtime's default is 1); "
                         "0: none, the sync alone")
    ap.add_argument("--sleep", type=float, default=0.0,
                    help="the lightweight workers wait this long before each push (a compute of that wall time): "
                         "with --heartbeat, the master's CPU a step then counts the heartbeats of a real step")
    ap.add_argument("--no-ahead", action="store_true",
                    help="the workers wait for each task (the program does not let them run ahead: "
                         "Program.runs_ahead); default: they compute the next step while the master ends one")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    # internal roles
    ap.add_argument("--role", choices=("driver", "master", "clients", "peer-receiver"), default="driver",
                    help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--token", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--ids", type=int, nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.root and os.environ.get("SYNC_SCALING_ROOT") != args.root:
        # The driver too: its peer costs and projection are then those of the root's exchange.
        os.environ["SYNC_SCALING_ROOT"] = args.root
        os.execv(sys.executable, [sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)])
    if args.role == "master":
        serve_master(args)
        return 0
    if args.role == "clients":
        run_clients(args)
        return 0
    if args.role == "peer-receiver":
        peer_receiver()
        return 0

    compute_s = args.compute_s if args.compute_s is not None else measure_compute(LAYERS[args.layer], LAYERS[args.layer + 1], args.rows)
    print(f"compute: one CD-1 epoch of {LAYERS[args.layer]}x{LAYERS[args.layer + 1]} on {args.rows} rows, "
          f"single-threaded: {compute_s:.3f} s", flush=True)
    rows = []
    for n in args.workers:
        rows.append(run_one(n, args, compute_s))
        r = rows[-1]
        print(f"{n} workers (master's iterreduce: {r['master_iterreduce']}): sync {r['sync_s']:.3f} s (steps {r['sync_s_all']}), master CPU {r['master_cpu_s']:.3f} s, "
              f"clients' CPU {r['client_cpu_s_total']:.1f} s in all", flush=True)
        if args.sleep:
            print(f"  a step of {args.sleep:.2f} s of compute took {args.sleep + r['sync_s']:.3f} s, running ahead "
                  f"{'on' if r['ahead'] else 'off'}: sync share {100 * r['share_measured']:.1f} %", flush=True)
        if args.real_workers:
            print(f"  a worker per sync: CPU {r['worker_cpu_s']:.3f} s, sends its peers "
                  f"{r['worker_peer_bytes'] / 1e6:.1f} MB", flush=True)
    print()
    print(format_table(rows))
    print()
    costs = None
    if args.reduce == "workers":
        costs = measure_peer_costs()
        print(f"A part sent to a peer, CPU (two processes on loopback): send {1e3 * costs['send_s_per_message']:.3f} ms "
              f"+ {1e3 * 1e6 * costs['send_s_per_byte']:.2f} ms/MB, receive {1e3 * costs['receive_s_per_message']:.3f} ms "
              f"+ {1e3 * 1e6 * costs['receive_s_per_byte']:.2f} ms/MB; a reducer's local work "
              f"{1e3 * rows[-1]['reduce_local_s']:.1f} ms")
        print()
    proj = project(rows, costs)
    print(f"Projection to a 10 GbE {'star' if args.reduce == 'master' else 'cluster, the workers reducing'} "
          f"(1.25 GB/s each way), from the figures measured with {max(r['workers'] for r in rows)} workers:")
    print(format_projection(proj))
    if args.json:
        print(json.dumps({"rows": rows, "projection": proj, "peer_costs": costs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
