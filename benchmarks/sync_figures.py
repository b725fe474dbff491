"""The figures ``benchmarks/sync_scaling.py`` sets beside its syncs: a CD-1 epoch's compute
(:func:`measure_compute`), the CPU a worker spends per message and per byte sent to a peer
(:func:`measure_peer_costs`, two processes on loopback), the tables, and the projection of the
measured syncs to clusters of 100 and 1000 workers on 10 GbE (:func:`project`). Imported by
``sync_scaling.py``, which puts the ``iterreduce`` it measures first on ``sys.path``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# --------------------------------------------------------------- peer messages


#: the token of measure_peer_costs's two processes (loopback only; a service takes none shorter than 16 characters)
PEER_BENCH_TOKEN = "bench-peer-costs-token"


def peer_receiver() -> None:
    """A Peer service alone (the receiving half of :func:`measure_peer_costs`): prints its
    address, then its CPU time at each line read from stdin."""
    from iterreduce.transport import exchange
    from iterreduce.process.memory import keep_freed_memory

    keep_freed_memory()
    inbox = exchange.Inbox()
    server, address = exchange.serve(inbox, PEER_BENCH_TOKEN, "127.0.0.1", "127.0.0.1")
    print(address, flush=True)
    for _ in sys.stdin:
        inbox.drop_before(1 << 62)
        print(time.process_time(), flush=True)
    server.stop(0)


def measure_peer_costs(batch: int = 10) -> dict:
    """CPU seconds a worker spends per message and per byte to send a part to a peer, and the
    peer to receive it (two processes on loopback, nothing else running: what one worker of a
    cluster pays), from parts of 8 KB and 8 MB sent ``batch`` at a time."""
    from iterreduce.transport import exchange
    from iterreduce.process.memory import keep_freed_memory

    keep_freed_memory()
    receiver = subprocess.Popen([sys.executable, str(Path(__file__).with_name("sync_scaling.py")), "--role",
                                 "peer-receiver"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    address = receiver.stdout.readline().strip()
    peers = exchange.Peers("bench", PEER_BENCH_TOKEN)
    wait = getattr(peers, "wait", None) or peers._wait  # a --root tree's may be private

    def receiver_cpu() -> float:
        receiver.stdin.write("\n")
        receiver.stdin.flush()
        return float(receiver.stdout.readline())

    measured = {}
    try:
        for size, count in ((8_000, 2000), (8_000_000, 40)):
            part = {"w": np.ones(size // 4, np.float32)}
            wait({peers.send(address, peers.encode(0, 0, 0, part, False)): ("peer", address)})  # connect
            received, sent = receiver_cpu(), time.process_time()
            for _ in range(count // batch):
                wait({peers.send(address, peers.encode(0, 0, j, part, False)): ("peer", address)
                             for j in range(batch)})
            measured[size] = ((time.process_time() - sent) / count, (receiver_cpu() - received) / count)
    finally:
        peers.close()
        receiver.kill()
    (s_small, r_small), (s_big, r_big) = measured[8_000], measured[8_000_000]
    per_byte = lambda small, big: (big - small) / (8_000_000 - 8_000)  # noqa: E731
    return {"send_s_per_message": s_small - 8_000 * per_byte(s_small, s_big), "send_s_per_byte": per_byte(s_small, s_big),
            "receive_s_per_message": r_small - 8_000 * per_byte(r_small, r_big),
            "receive_s_per_byte": per_byte(r_small, r_big), "raw": {str(k): v for k, v in measured.items()}}


def measure_reduce_costs(update: dict, parts: int, shards: int) -> float:
    """CPU seconds of a reducer's local work per sync: its rows of ``shards`` updates like
    ``update`` averaged (in shard order, float64), and the parts of the new parameters joined back."""
    from iterreduce.program import Update, weighted_average
    from iterreduce.transport import exchange

    rows = exchange.rows_of(update, parts, 0)
    updates = [Update(s, 6000, rows) for s in range(shards)]
    started = time.process_time()
    reduced = weighted_average(updates, list(rows))
    exchange.join_rows([reduced] * parts)
    return time.process_time() - started


def project(rows: list[dict], costs: dict | None = None, link_bytes_s: float = 1.25e9) -> list[dict]:
    """Sync time and share of a star (the master receives N updates and sends N copies) on a
    cluster whose master has one full-duplex link of ``link_bytes_s`` each way: the larger of the
    link time of the busier direction and the master's CPU at its measured CPU seconds per byte."""
    if not rows:
        return []
    if rows[0]["reduce"] == "workers":
        return project_workers(rows, costs, link_bytes_s)
    ref = max(rows, key=lambda r: r["workers"])
    cpu_per_byte = ref["master_cpu_s"] / ref["bytes_per_sync"]
    per_worker_in, per_worker_out = ref["bytes_in"] / ref["workers"], ref["bytes_out"] / ref["workers"]
    out = []
    for n in (100, 1000):
        link = n * max(per_worker_in, per_worker_out) / link_bytes_s
        cpu = n * (per_worker_in + per_worker_out) * cpu_per_byte
        sync = max(link, cpu)
        out.append({"workers": n, "link_s": link, "master_cpu_s": cpu, "sync_s": sync,
                    "share": sync / (ref["compute_s"] + sync), "bound": "link" if link >= cpu else "master CPU"})
    return out


def grid_messages(n: int, columns: int) -> tuple[int, int]:
    """The messages the busiest of ``n`` workers sends and receives in a sync through the grid
    (both phases: a message to each of its relays, one down its column to each other reducer;
    one from each sender it relays, one from each other relay of its column)."""
    from iterreduce.transport import exchange

    relayed = {}
    for s in range(n):
        for c in range(columns):
            relayed.setdefault(exchange.grid_relay(n, columns, s, c), []).append(s)
    worst = (0, 0)
    for w in range(n):
        relays = {exchange.grid_relay(n, columns, w, c) for c in range(columns)} - {w}
        down = len(exchange.grid_column(n, columns, w % columns)) - 1
        sends, receives = 2 * (len(relays) + down), 2 * (len(relayed[w]) - 1 + down)
        worst = max(worst, (sends, receives), key=sum)
    return worst


def project_workers(rows: list[dict], costs: dict, link_bytes_s: float = 1.25e9) -> list[dict]:
    """The same for the reduce on the workers, one after the other (they overlap in part: the
    pessimistic sum): a worker's exchange, the larger of its link time and its CPU, and the
    master's, the larger of its link time and its CPU.

    A worker's CPU among N reducers, from the measured costs of one message (``costs``,
    :func:`measure_peer_costs`), in the layout the runtime picks (``exchange.grid_columns``).
    Straight: it sends N-1 parts of its update and receives N-1 parts of the others' (scatter),
    then sends its reduced part to N-1 peers and receives theirs (all-gather): 2 (N-1) sends and
    receives of (N-1)/N of a model each way. Through the grid: the messages of its busiest
    worker (:func:`grid_messages`), each update's rows travelling twice: 3 (N-1)/N of a model
    each way. Plus its local reduce. The master's CPU per sync is what the bare clients
    measured (it grows with N: an RPC per worker), fitted as a + b N and extrapolated."""
    from iterreduce.transport import exchange

    ns = [r["workers"] for r in rows]
    master_b, master_a = np.polyfit(ns, [r["master_cpu_s"] for r in rows], 1) if len(rows) > 1 else (0.0, rows[0]["master_cpu_s"])
    ref = max(rows, key=lambda r: r["workers"])
    model = ref["model_bytes"]
    out = []
    for n in (100, 1000):
        columns = exchange.grid_columns(n, model) if hasattr(exchange, "grid_columns") else 0
        if columns:
            sends, receives = grid_messages(n, columns)
            moved = 3 * model * (n - 1) / n  # each way
        else:
            sends = receives = 2 * (n - 1)
            moved = 2 * model * (n - 1) / n
        messages = sends + receives
        worker_cpu = (sends * costs["send_s_per_message"] + receives * costs["receive_s_per_message"]
                      + moved * (costs["send_s_per_byte"] + costs["receive_s_per_byte"]) + ref["reduce_local_s"])
        worker_link = moved / link_bytes_s
        master_cpu = master_a + master_b * n
        master_link = max(ref["bytes_in"], ref["bytes_out"]) / link_bytes_s
        sync = max(worker_link, worker_cpu) + max(master_link, master_cpu)
        # Running ahead (Program.runs_ahead) the master's part overlaps the next step's compute: it
        # adds only what it takes beyond that compute.
        ahead = max(worker_link, worker_cpu) + max(0.0, max(master_link, master_cpu) - ref["compute_s"])
        out.append({"workers": n, "link_s": worker_link + master_link, "master_cpu_s": master_cpu,
                    "worker_cpu_s": worker_cpu, "worker_messages": messages, "sync_s": sync,
                    "share": sync / (ref["compute_s"] + sync), "share_ahead": ahead / (ref["compute_s"] + ahead),
                    "bound": "worker CPU" if worker_cpu >= master_cpu else "master CPU"})
    return out


def format_projection(proj: list[dict]) -> str:
    lines = ["| workers (10 GbE) | link s | master CPU s | a worker's messages | worker CPU s | sync s | share "
             "| share, running ahead | bound |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for p in proj:
        worker = f"{p['worker_cpu_s']:.3f}" if "worker_cpu_s" in p else "-"
        messages = f"{p['worker_messages']:,}" if "worker_messages" in p else "-"
        ahead = f"{100 * p['share_ahead']:.1f} %" if "share_ahead" in p else "-"
        lines.append(f"| {p['workers']} | {p['link_s']:.3f} | {p['master_cpu_s']:.3f} | {messages} | {worker} "
                     f"| {p['sync_s']:.3f} | {100 * p['share']:.1f} % | {ahead} | {p['bound']} |")
    return "\n".join(lines)


def measure_compute(visible: int, hidden: int, rows: int, repeats: int = 3) -> float:
    """Seconds of one single-threaded CD-1 epoch of a ``visible`` x ``hidden`` RBM on ``rows`` rows
    (median), in a child process whose BLAS has one thread."""
    from iterreduce import THREAD_VARS

    code = (
        "import statistics, sys, time, numpy as np\n"
        "from dbn.model.rbm import RBM\n"
        f"v, h, rows, repeats = {visible}, {hidden}, {rows}, {repeats}\n"
        "X = np.random.default_rng(0).random((rows, v), dtype=np.float32)\n"
        "rbm = RBM(h, device='cpu', batch_size=100, cd_k=1, seed=0)\n"
        "rbm.initialize(n_visible=v)\n"
        "rbm.train_epoch(X, 0)\n"  # warm-up: buffers and compiled kernels
        "times = []\n"
        "for e in range(repeats):\n"
        "    t = time.perf_counter(); rbm.train_epoch(X, e + 1); times.append(time.perf_counter() - t)\n"
        "print(statistics.median(times))\n"
    )
    env = {**os.environ, **{var: "1" for var in THREAD_VARS}, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def format_table(rows: list[dict]) -> str:
    lines = ["| workers | layer | wire | bytes per sync | sync s | reduce s | master CPU s | master MB/s "
             "| compute s per epoch | share | share here |",
             "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        here = "-" if r["share_here"] is None else f"{100 * r['share_here']:.1f} %"
        lines.append(f"| {r['workers']} | {r['layer']} | {'float16' if r['float16'] else 'float32'} "
                     f"| {r['bytes_per_sync'] / 1e6:,.0f} MB | {r['sync_s']:.3f} | {r['reduce_s']:.3f} "
                     f"| {r['master_cpu_s']:.3f} | {r['master_mb_s']:,.0f} | {r['compute_s']:.3f} "
                     f"| {100 * r['share']:.1f} % | {here} |")
    return "\n".join(lines)
