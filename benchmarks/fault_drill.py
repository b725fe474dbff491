"""Fault drill: kill -9 one random worker of a local job during pre-training.

    python benchmarks/fault_drill.py --out runs/drill [--at-step 40] [--seed 1] -- [dbn train arguments]

Starts ``dbn train ... --local N --out OUT`` (the arguments after ``--``), waits until
the master has logged superstep ``--at-step`` (which must fall in pre-training),
picks one of the job's worker processes at random and sends it SIGKILL, then waits
for the job to finish. Prints what it killed, the job's events, and the job's
result.json. The job must complete on its own: the launcher restarts the worker.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path


def job_workers(address: str) -> list[int]:
    """PIDs of the worker processes that talk to the master at ``address``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"iterreduce.worker" in argv and address.encode() in argv:
            pids.append(int(proc.name))
    return pids


def last_step(log: Path) -> tuple[int, str]:
    step, phase = -1, ""
    if log.exists():
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if "step" in record and "phase" in record:  # a step record, not an event
                step, phase = record["step"], record["phase"]
    return step, phase


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--at-step", type=int, default=40, help="kill after this superstep is logged")
    ap.add_argument("--seed", type=int, default=1, help="picks the worker to kill")
    args = ap.parse_args(own)

    cmd = [sys.executable, "-m", "dbn.cli", "train", *train_args, "--out", str(args.out), "--quiet"]
    print("running:", " ".join(cmd), flush=True)
    job = subprocess.Popen(cmd)
    log = args.out / "log.jsonl"
    killed = None
    while job.poll() is None:
        step, phase = last_step(log)
        if killed is None and step >= args.at_step:
            if phase not in ("pretrain", "transform"):
                print(f"step {step} is in {phase}, not pre-training: choose a smaller --at-step", flush=True)
            address = json.loads((args.out / "master.json").read_text())["address"]
            pids = job_workers(address)
            victim = random.Random(args.seed).choice(sorted(pids))
            os.kill(victim, signal.SIGKILL)
            killed = {"pid": victim, "after_step": step, "phase": phase, "time": time.time(), "workers_seen": len(pids)}
            print(f"killed worker pid {victim} after step {step} ({phase})", flush=True)
        time.sleep(0.5)
    events = [json.loads(line) for line in log.read_text().splitlines() if '"event"' in line]
    print(json.dumps({"killed": killed, "exit": job.returncode,
                      "events": [e for e in events if e["event"] in ("worker_lost", "worker_restarted", "worker_registered")][-6:]},
                     indent=1))
    result = args.out / "result.json"
    if result.exists():
        print(result.read_text())
    return job.returncode


if __name__ == "__main__":
    sys.exit(main())
