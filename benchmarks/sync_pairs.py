"""A setting of the local mini-cluster's synchronisation on and off, in pairs (issues 42 and 54).

Runs ``dbn mnist --quick --local N`` with a boolean setting (``--setting``, by default
``cluster.shared_memory``: shared memory against gRPC's bytes; ``cluster.combine``: one update a
process against one a shard) false and true, alternating (``--pairs`` of each, the same seed), and
prints for each run the wall time, the test error, the updates the master got a step and the sync
share from its ``log.jsonl`` (``sync_seconds`` over ``seconds``, all steps, and per phase), then the
means and their ratio. With ``--same-model`` the two values must give the same model bit for bit:
the script compares the ``model.npz`` files and fails where they differ.

    .venv/bin/python benchmarks/sync_pairs.py [--workers 4] [--pairs 2] [--work /tmp/dbn-sync] [--same-model]
    .venv/bin/python benchmarks/sync_pairs.py --setting cluster.combine --workers 10 --processes 1 --same-model
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def steps_of(log: Path) -> list[dict]:
    """A run's step records (the latest of each step)."""
    steps = {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "step" in record and "seconds" in record:
            steps[record["step"]] = record
    return list(steps.values())


def sync_shares(steps: list[dict]) -> dict:
    """The sync share of all steps and of each phase."""
    shares = {}
    for phase in (None, "pretrain", "finetune"):
        chosen = [r for r in steps if phase is None or r["phase"] == phase]
        seconds = sum(r["seconds"] for r in chosen)
        shares[phase or "all"] = sum(r["sync_seconds"] for r in chosen) / seconds if seconds else 0.0
    return shares


def run(args, value: bool, index: int) -> dict:
    out = args.work / f"{args.setting}-{str(value).lower()}-{index}"
    extra = ["--set", f"cluster.processes={args.processes}"] if args.processes else []
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from dbn.cli import main; raise SystemExit(main())", "mnist", "--quick",
                    "--local", str(args.workers), "--out", str(out), "--overwrite", "--quiet", "--no-ui",
                    "--set", f"{args.setting}={str(value).lower()}", *extra],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    result = json.loads((out / "result.json").read_text())
    digest = hashlib.sha256()
    with np.load(out / "model.npz", allow_pickle=False) as model:  # the arrays: the file holds a date too
        for name in sorted(n for n in model.files if not n.startswith("__")):
            digest.update(name.encode() + model[name].tobytes())
    steps = steps_of(out / "log.jsonl")
    updates = sum(r.get("updates", r["shards"]) for r in steps) / max(len(steps), 1)
    return {"value": value, "seconds": seconds, "test_error": result.get("test_error"), "updates": updates,
            "sync": sync_shares(steps), "model": digest.hexdigest()[:16]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", default="cluster.shared_memory", help="a boolean setting of the job")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--processes", type=int, default=0, help="cluster.processes (0: as many as pay)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/dbn-sync"))
    ap.add_argument("--same-model", action="store_true", help="fail unless every run gives the same model")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(args.pairs):
        for value in ((False, True) if i % 2 == 0 else (True, False)):
            runs.append(run(args, value, i))
            r = runs[-1]
            print(f"{args.setting}={str(value).lower():5}  {r['seconds']:6.1f} s  test error {r['test_error']}  "
                  f"{r['updates']:.2f} updates a step  sync {100 * r['sync']['all']:.2f} % (pretrain "
                  f"{100 * r['sync']['pretrain']:.2f} %, finetune {100 * r['sync']['finetune']:.2f} %)  model {r['model']}",
                  flush=True)
    mean = {v: {k: sum(r["sync"][k] for r in runs if r["value"] == v) / args.pairs for k in ("all", "pretrain", "finetune")}
            for v in (False, True)}
    seconds = {v: sum(r["seconds"] for r in runs if r["value"] == v) / args.pairs for v in (False, True)}
    print(f"mean sync share: false {100 * mean[False]['all']:.2f} %, true {100 * mean[True]['all']:.2f} % "
          f"(ratio {mean[True]['all'] / mean[False]['all']:.2f}); pretrain {100 * mean[False]['pretrain']:.2f} -> "
          f"{100 * mean[True]['pretrain']:.2f} %, finetune {100 * mean[False]['finetune']:.2f} -> "
          f"{100 * mean[True]['finetune']:.2f} %; wall {seconds[False]:.1f} -> {seconds[True]:.1f} s")
    models = {r["model"] for r in runs}
    if args.same_model and len(models) != 1:
        raise SystemExit(f"the models differ: {sorted(models)}")
    print("models:", ", ".join(sorted(models)))


if __name__ == "__main__":
    main()
