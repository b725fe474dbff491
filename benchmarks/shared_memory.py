"""The local mini-cluster's synchronisation through shared memory against gRPC's bytes (issue 42).

Runs ``dbn mnist --quick --local N`` with ``cluster.shared_memory`` on and off, alternating
(``--pairs`` of each, the same seed), and prints for each run the wall time, the test error and
the sync share from its ``log.jsonl`` (``sync_seconds`` over ``seconds``, all steps, and per
phase), then the means and their ratio. The two settings must give the same model bit for bit:
the script compares the ``model.npz`` files and fails where they differ.

    .venv/bin/python benchmarks/shared_memory.py [--workers 4] [--pairs 2] [--work /tmp/dbn-shm]
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


def sync_shares(log: Path) -> dict:
    """The sync share of all steps and of each phase, from a run's log (its latest record a step)."""
    steps = {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if "step" in record and "seconds" in record:
            steps[record["step"]] = record
    shares = {}
    for phase in (None, "pretrain", "finetune"):
        chosen = [r for r in steps.values() if phase is None or r["phase"] == phase]
        seconds = sum(r["seconds"] for r in chosen)
        shares[phase or "all"] = sum(r["sync_seconds"] for r in chosen) / seconds if seconds else 0.0
    return shares


def run(work: Path, workers: int, shared: bool, index: int) -> dict:
    out = work / f"{'shm' if shared else 'grpc'}-{index}"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from dbn.cli import main; raise SystemExit(main())", "mnist", "--quick", "--local", str(workers), "--out", str(out),
                    "--overwrite", "--quiet", "--no-ui", "--set", f"cluster.shared_memory={str(shared).lower()}"],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    result = json.loads((out / "result.json").read_text())
    digest = hashlib.sha256()
    with np.load(out / "model.npz", allow_pickle=False) as model:  # the arrays: the file holds a date too
        for name in sorted(n for n in model.files if not n.startswith("__")):
            digest.update(name.encode() + model[name].tobytes())
    digest = digest.hexdigest()[:16]
    return {"shared": shared, "seconds": seconds, "test_error": result.get("test_error"),
            "sync": sync_shares(out / "log.jsonl"), "model": digest}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("/tmp/dbn-shm"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    runs = []
    for i in range(args.pairs):
        for shared in ((False, True) if i % 2 == 0 else (True, False)):
            runs.append(run(args.work, args.workers, shared, i))
            r = runs[-1]
            print(f"{'shared memory' if shared else 'gRPC         '}  {r['seconds']:6.1f} s  test error "
                  f"{r['test_error']}  sync {100 * r['sync']['all']:.2f} % (pretrain {100 * r['sync']['pretrain']:.2f} "
                  f"%, finetune {100 * r['sync']['finetune']:.2f} %)  model {r['model']}", flush=True)
    mean = {s: {k: sum(r["sync"][k] for r in runs if r["shared"] == s) / args.pairs for k in ("all", "pretrain", "finetune")}
            for s in (False, True)}
    seconds = {s: sum(r["seconds"] for r in runs if r["shared"] == s) / args.pairs for s in (False, True)}
    print(f"mean sync share: gRPC {100 * mean[False]['all']:.2f} %, shared memory {100 * mean[True]['all']:.2f} % "
          f"(ratio {mean[True]['all'] / mean[False]['all']:.2f}); pretrain {100 * mean[False]['pretrain']:.2f} -> "
          f"{100 * mean[True]['pretrain']:.2f} %, finetune {100 * mean[False]['finetune']:.2f} -> "
          f"{100 * mean[True]['finetune']:.2f} %; wall {seconds[False]:.1f} -> {seconds[True]:.1f} s")
    models = {r["model"] for r in runs}
    if len(models) != 1:
        raise SystemExit(f"the models differ: {sorted(models)}")
    print("the same model bit for bit in every run:", models.pop())


if __name__ == "__main__":
    main()
