"""Train on data larger than the workers' memory, and compare with data that fits (issue 13).

Generates a data set of uint8 features (``--gigabytes`` of them, 3 by default) in Parquet
shards on local disk, then trains a DBN on it with ``dbn train`` on the local mini-cluster:
2 workers in 2 processes, streaming (``[cluster] stream = "always"``), each limited to
``--limit-mib`` of resident memory the way YARN limits a container: a watchdog reads every
worker's resident memory ten times a second and kills one that goes over (the job then
fails, and this script says so). Then it trains the same model on a slice that fits, held
in memory, and prints the samples/s of each phase in both runs, their ratio, and each
worker's peak resident memory (VmHWM, as the workers also log at exit).

    python benchmarks/larger_than_memory.py [--gigabytes 3] [--limit-mib 1024] [--work DIR]

The data is generated once into ``--work`` (default /tmp/dbn-ltm) and reused.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FEATURES, CLASSES, WORKERS = 784, 10, 2
ROW_GROUP = 65536
MODEL = ["--layers", "500,500", "--epochs", "1", "--finetune-epochs", "1",
         "--set", "model.top_layer_epochs=1", "--set", "data.test=none", "--device", "cpu"]


def generate(directory: Path, rows: int, seed: int = 0) -> list[Path]:
    """``rows`` rows of ``FEATURES`` uint8 intensities in ``WORKERS`` shards: each class scales
    uniform random intensities by its own pixel profile (a learnable task whose bytes barely
    compress, so the Parquet files are about as large as the data)."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = directory / "rows.json"
    if marker.exists() and json.loads(marker.read_text()) == {"rows": rows, "seed": seed}:
        return sorted(directory.glob("*.parquet"))
    rng = np.random.default_rng(seed)
    profiles = rng.random((CLASSES, FEATURES), dtype=np.float32)
    paths = []
    for shard, part in enumerate(np.array_split(np.arange(rows), WORKERS)):
        path = directory / f"part-{shard:05d}.parquet"
        schema = pa.schema([("features", pa.list_(pa.uint8(), FEATURES)), ("label", pa.int64())])
        with pq.ParquetWriter(path, schema, write_page_checksum=True) as writer:
            for start in range(0, len(part), ROW_GROUP):
                n = min(ROW_GROUP, len(part) - start)
                labels = rng.integers(0, CLASSES, n)
                pixels = (rng.integers(0, 256, (n, FEATURES), dtype=np.uint8) * profiles[labels]).astype(np.uint8)
                column = pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), FEATURES)
                writer.write_table(pa.table({"features": column, "label": pa.array(labels)}, schema=schema))
        paths.append(path)
        print(f"  wrote {path} ({path.stat().st_size / 1e9:.2f} GB on disk)", flush=True)
    marker.write_text(json.dumps({"rows": rows, "seed": seed}))
    return paths


def worker_pids(launcher: int) -> list[int]:
    """The worker processes the launcher ``launcher`` (``dbn train``) started."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and status_kib(int(proc.name), "PPid") == launcher:
            try:
                if b"iterreduce.worker" in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Watchdog(threading.Thread):
    """Polls the job's workers: records each one's peak resident memory and kills one over the limit."""

    def __init__(self, launcher: int, limit_bytes: int):
        super().__init__(daemon=True)
        self.launcher, self.limit, self.peaks, self.killed = launcher, limit_bytes, {}, []
        self.done = threading.Event()

    def run(self):
        while not self.done.wait(0.1):
            for pid in worker_pids(self.launcher):
                rss, peak = status_kib(pid, "VmRSS") * 1024, status_kib(pid, "VmHWM") * 1024
                self.peaks[pid] = max(self.peaks.get(pid, 0), peak)
                if rss > self.limit:
                    self.killed.append((pid, rss))
                    subprocess.run(["kill", "-9", str(pid)], check=False)


def train(shards: Path, out: Path, stream: str, limit_bytes: int) -> dict:
    """Run ``dbn train`` on ``shards``; returns its figures per phase and the workers' peaks."""
    cmd = [sys.executable, "-m", "dbn.cli", "train", "--local", str(WORKERS), "--out", str(out), "--overwrite", "--quiet",
           "--set", f"cluster.shards={shards}", "--set", f"cluster.stream={stream}",
           "--set", f"cluster.processes={WORKERS}", "--set", "cluster.max_restarts=0", *MODEL]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = Watchdog(proc.pid, limit_bytes)
    watchdog.start()
    _, stderr = proc.communicate()
    wall = time.perf_counter() - started
    watchdog.done.set()
    watchdog.join()
    if proc.returncode != 0 or watchdog.killed:
        raise SystemExit(f"training failed (exit {proc.returncode}; killed over the limit: {watchdog.killed}):\n"
                         f"{stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    phases: dict[str, dict] = {}
    for rec in records:
        if "phase" not in rec:
            continue
        key = rec["phase"] + (f"/{rec['layer']}" if "layer" in rec else "")
        agg = phases.setdefault(key, {"samples": 0, "seconds": 0.0, "compute_seconds": 0.0})
        agg["samples"] += rec.get("samples", 0)
        agg["seconds"] += rec["seconds"]
        agg["compute_seconds"] += rec["compute_seconds"]
    logged = []
    for log in sorted((out / "logs").glob("worker-*.log")):
        for line in log.read_text().splitlines():
            if "peak resident memory" in line:
                logged.append(float(line.rsplit("memory", 1)[1].split()[0]))
    return {"wall_seconds": wall, "phases": phases, "peak_rss_mib": sorted(p / 2**20 for p in watchdog.peaks.values()),
            "logged_peak_mib": logged, "stream": stream}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gigabytes", type=float, default=3.0, help="uint8 feature bytes to generate (default 3)")
    ap.add_argument("--limit-mib", type=int, default=1024, help="resident memory per worker (default 1024)")
    ap.add_argument("--fit-fraction", type=float, default=0.08, help="share of the rows the in-memory run trains on")
    ap.add_argument("--work", default="/tmp/dbn-ltm", help="where the data and runs go")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    work = Path(args.work)
    rows = int(args.gigabytes * 1e9 / FEATURES)
    small_rows = int(rows * args.fit_fraction)
    print(f"generating {rows:,} rows x {FEATURES} uint8 ({rows * FEATURES / 1e9:.2f} GB of features, "
          f"{rows * FEATURES * 4 / 1e9:.1f} GB as float32) and {small_rows:,} rows that fit", flush=True)
    generate(work / "big", rows)
    generate(work / "small", small_rows, seed=1)
    limit = args.limit_mib * 2**20
    print(f"training on the big data set, streamed, {WORKERS} workers each limited to {args.limit_mib} MiB", flush=True)
    streamed = train(work / "big", work / "run-streamed", "always", limit)
    print("training on the slice that fits, in memory", flush=True)
    in_memory = train(work / "small", work / "run-in-memory", "never", 8 * 2**30)
    result = {"rows": rows, "rows_in_memory_run": small_rows, "feature_gb": rows * FEATURES / 1e9,
              "limit_mib": args.limit_mib, "streamed": streamed, "in_memory": in_memory, "ratios": {}}
    print(f"\n{'phase':16} {'streamed samples/s':>19} {'in-memory samples/s':>20} {'ratio':>6}")
    for phase in streamed["phases"]:
        if phase.startswith("transform"):
            continue
        a, b = streamed["phases"][phase], in_memory["phases"].get(phase)
        rate_a = a["samples"] / a["seconds"]
        rate_b = b["samples"] / b["seconds"] if b else float("nan")
        result["ratios"][phase] = rate_a / rate_b
        print(f"{phase:16} {rate_a:19,.0f} {rate_b:20,.0f} {rate_a / rate_b:6.2f}")
    train_a = [p for k, p in streamed["phases"].items() if not k.startswith("transform")]
    train_b = [p for k, p in in_memory["phases"].items() if not k.startswith("transform")]
    overall = (sum(p["samples"] for p in train_a) / sum(p["seconds"] for p in train_a)) / \
              (sum(p["samples"] for p in train_b) / sum(p["seconds"] for p in train_b))
    result["ratios"]["training"] = overall
    print(f"{'all training':16} {'':>19} {'':>20} {overall:6.2f}")
    for name, run in (("streamed", streamed), ("in memory", in_memory)):
        spill = sum(p["seconds"] for k, p in run["phases"].items() if k.startswith("transform"))
        print(f"{name}: peak resident memory per worker {', '.join(f'{m:.0f}' for m in run['peak_rss_mib'])} MiB "
              f"(logged by the workers: {', '.join(f'{m:.0f}' for m in run['logged_peak_mib'])}); "
              f"transform steps (read/spill and layer passes) {spill:.0f} s; wall {run['wall_seconds']:.0f} s")
    if args.json:
        print(json.dumps(result, indent=2))
    (work / "result.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
