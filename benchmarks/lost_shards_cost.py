"""What ``[cluster] lost_shards = "redo"`` costs against "skip" (issue 52): the same job, the same kills.

    python benchmarks/lost_shards_cost.py --out runs/lost-shards [--kills 3] [--seeds 1 2] -- [dbn train arguments]

For each seed, runs ``dbn train ... --local N`` three times: undisturbed, and with a worker SIGKILLed
after each of ``--kills`` supersteps spread over pre-training under "skip" then under "redo" (the
launcher restarts it). Prints one row a run: the job's wall seconds, the steps of pre-training in
which a worker was lost and their mean seconds against the undisturbed run's, the test error, and
whether the model is bit-identical to the undisturbed one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fault_drill import job_workers, last_step  # noqa: E402


def records(out: Path) -> list[dict]:
    lines = (out / "log.jsonl").read_text().splitlines() if (out / "log.jsonl").exists() else []
    return [json.loads(line) for line in lines]


def run(train_args: list[str], out: Path, policy: str, kill_at: list[int]) -> dict:
    """One job; SIGKILLs a worker once each step of ``kill_at`` is logged. Its figures."""
    cmd = [sys.executable, "-m", "dbn.cli", "train", *train_args, "--set", f"cluster.lost_shards={policy}",
           "--out", str(out), "--quiet", "--no-ui", "--overwrite"]
    proc = subprocess.Popen(cmd)
    pending, killed = list(kill_at), 0
    while proc.poll() is None:
        step, _ = last_step(out / "log.jsonl")
        if pending and step >= pending[0]:
            master = json.loads((out / "master.json").read_text()) if (out / "master.json").exists() else {}
            pids = job_workers(master.get("address", "")) if master else []
            if pids:
                os.kill(pids[killed % len(pids)], signal.SIGKILL)
                killed += 1
                pending.pop(0)
        time.sleep(0.05)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}")
    steps = [r for r in records(out) if "step" in r and "event" not in r]
    result = json.loads((out / "result.json").read_text())
    return {"policy": policy, "killed": killed, "wall_s": result["wall_seconds"], "test_error": result["test_error"],
            "steps": {r["step"]: r["seconds"] for r in steps}}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    args = ap.parse_args(own)
    rows = []
    for seed in args.seeds:
        seeded = [*train_args, "--set", f"job.seed={seed}"]
        base = run(seeded, args.out / f"seed{seed}-undisturbed", "skip", [])
        pretrain = max(s for s in base["steps"]) + 1  # all steps; kills land in the first half (pre-training)
        kill_at = [int(pretrain * (k + 1) / (2 * (args.kills + 1))) for k in range(args.kills)]
        with np.load(args.out / f"seed{seed}-undisturbed" / "model.npz") as m:
            undisturbed = {k: m[k].tobytes() for k in m.files if k != "__header__"}
        for policy in ("skip", "redo"):
            out = args.out / f"seed{seed}-{policy}"
            row = run(seeded, out, policy, kill_at)
            with np.load(out / "model.npz") as m:
                row["identical"] = all(m[k].tobytes() == v for k, v in undisturbed.items())
            # The step under way when a worker was killed: the one after the step logged.
            row["hit_s"] = float(np.mean([row["steps"].get(s + 1, 0.0) for s in kill_at]))
            row["hit_undisturbed_s"] = float(np.mean([base["steps"].get(s + 1, 0.0) for s in kill_at]))
            rows.append((seed, base, row))
    print("| seed | policy | workers killed | wall s (undisturbed) | step after a kill, s (undisturbed) | "
          "test error (undisturbed) | bit-identical |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for seed, base, row in rows:
        print(f"| {seed} | {row['policy']} | {row['killed']} | {row['wall_s']:.1f} ({base['wall_s']:.1f}) | "
              f"{row['hit_s']:.2f} ({row['hit_undisturbed_s']:.2f}) | {100 * row['test_error']:.2f} % "
              f"({100 * base['test_error']:.2f} %) | {'yes' if row['identical'] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
