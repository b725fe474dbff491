"""Scoring a table on YARN against one local process: issue 41's throughput bar.

Starts the tests' real single-node Hadoop (tests/minihadoop.py), writes a table of ``--rows``
rows to HDFS (pyarrow), trains a classifier on a small local table of the same columns, and
scores the HDFS table side by side: one local ``dbn predict`` process (its BLAS held to one
thread, as a one-vcore container's is), then ``dbn predict --yarn`` with ``--workers``
containers of one vcore each. Prints rows per second: the local process's (its wall time), and
per container: its share's rows over the steps' compute seconds (the slowest worker's, step by
step), and over the master's wall time from the first step to the commit. On a machine with
fewer cores than containers plus the master, the containers share the cores: say so with the
figures.

    .venv/bin/python benchmarks/yarn_scoring.py [--rows 1000000] [--workers 3] [--hidden 256,256]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--hidden", default="256,256", help="the classifier's hidden layers")
    args = ap.parse_args()

    from minihadoop import MiniHadoop
    from test_scoring import job_file, write_table
    from test_yarn_scoring import write_big_table

    import test_yarn_scoring
    from iterreduce import THREAD_VARS

    test_yarn_scoring.ROWS = args.rows
    with tempfile.TemporaryDirectory(prefix="yarn-scoring-") as tmp, MiniHadoop(base_dir=tmp) as hadoop:
        tmp = Path(tmp)
        env = {**os.environ, **hadoop.env()}
        write_table(tmp / "small")
        train = job_file(tmp, str(tmp / "small"), str(tmp / "model"))
        layers = ", ".join(args.hidden.split(","))
        train.write_text(train.read_text().replace("hidden_layers = [12]", f"hidden_layers = [{layers}]")
                         .replace("finetune_epochs = 3", "finetune_epochs = 15"))
        dbn = [sys.executable, "-m", "dbn.cli"]
        subprocess.run([*dbn, "train", str(train), "--quiet"], check=True, env=env, cwd=REPO)
        write_big_table(hadoop.fs(), "/warehouse/big")
        job = tmp / "score.toml"
        job.write_text(train.read_text().replace(f'train = "{tmp / "small"}"', f'train = "{hadoop.uri("/warehouse/big")}"')
                       + f'[cluster]\nworkers = {args.workers}\n[yarn]\npython = "{sys.executable}"\n'
                         f'worker_memory = "1 GiB"\nworker_vcores = 1\nmaster_memory = "1 GiB"\n')
        model = str(tmp / "model" / "model.npz")

        one_thread = {**env, **{var: "1" for var in THREAD_VARS}}
        started = time.monotonic()
        subprocess.run([*dbn, "predict", model, str(job), "--out", str(tmp / "local.parquet"), "--keep", "id",
                        "--device", "cpu"], check=True, env=one_thread, cwd=REPO)
        local_s = time.monotonic() - started

        out = hadoop.uri("/user/bench/scores")
        started = time.monotonic()
        subprocess.run([*dbn, "predict", model, str(job), "--out", out, "--yarn", "--keep", "id", "--wait", "--quiet",
                        "--device", "cpu"], check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
        yarn_s = time.monotonic() - started
        with hadoop.fs().open_input_stream("/user/bench/scores/_dbn/log.jsonl") as f:
            log = [json.loads(line) for line in f.read().decode().splitlines()]
        steps = [r for r in log if "compute_seconds" in r]
        compute = sum(r["compute_seconds"] for r in steps)
        done = next(r for r in log if r.get("event") == "done")
        share = args.rows / args.workers
        print(f"rows {args.rows}, model {args.hidden}, {args.workers} containers of 1 vcore, {os.cpu_count()} cores")
        print(f"one local process (1 thread): {local_s:.1f} s, {args.rows / local_s:,.0f} rows/s")
        print(f"per container: {share / compute:,.0f} rows/s over the steps' compute ({compute:.1f} s), "
              f"{share / done['seconds']:,.0f} rows/s over the master's {done['seconds']:.1f} s "
              f"({len(steps)} steps); the submission took {yarn_s:.1f} s in all")
        print(f"ratio per container / local: {share / compute / (args.rows / local_s):.2f} (compute), "
              f"{share / done['seconds'] / (args.rows / local_s):.2f} (master's wall time)")


if __name__ == "__main__":
    main()
