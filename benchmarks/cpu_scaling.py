"""CPU scaling of the local mini-cluster: the same job on 1, 2, 4, 8 ... worker processes.

Each worker is one process with ``--threads`` BLAS threads (1 by default, as a YARN container
of one vcore), so the figure is the runtime's scaling, not BLAS's. Every run trains the main
job's network (784-500-500-2000-10) on all 60,000 MNIST training images for ``--epochs`` RBM
epochs a layer and ``--finetune-epochs`` fine-tuning epochs with ``dbn mnist --local N``, and
the speed is samples trained per second of pre-training and of fine-tuning (from
``result.json``: start-up, sharding and testing are left out). Prints the speed-up of each
worker count over the first, measured in the same run.

    python benchmarks/cpu_scaling.py [--workers 1,2,4,8] [--epochs 2] [--finetune-epochs 2]
                                     [--threads 1] [--set SECTION.KEY=VALUE ...] [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(workers: int, args, out: Path) -> dict:
    """One ``dbn mnist`` run on ``workers`` single-process workers; its result.json."""
    cmd = [sys.executable, "-c", "import sys; from dbn.cli import main; sys.exit(main())", "mnist",
           "--local", str(workers), "--epochs", str(args.epochs), "--finetune-epochs", str(args.finetune_epochs),
           "--validation", "0", "--no-ui", "--quiet", "--json", "--out", str(out / f"w{workers}"), "--overwrite",
           "--set", f"cluster.processes={workers}", "--set", f"cluster.threads_per_process={args.threads}",
           "--device", "cpu"]
    for setting in args.set:
        cmd += ["--set", setting]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"dbn mnist --local {workers} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts, comma-separated (the first is the base)")
    parser.add_argument("--epochs", type=int, default=2, help="RBM epochs a layer")
    parser.add_argument("--finetune-epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per worker process")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting for every run, e.g. cluster.reduce=workers (repeatable)")
    parser.add_argument("--out", help="keep the runs here (default: a temporary directory)")
    parser.add_argument("--json", action="store_true", help="JSON on stdout")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        rows = []
        for n in counts:
            r = run(n, args, out)
            layers = len(r["layers"]) - 2 if "layers" in r else 3
            pretrain = r["n_train"] * args.epochs * layers / r["pretrain_seconds"]
            finetune = r["n_train"] * args.finetune_epochs / r["finetune_seconds"]
            rows.append({"workers": n, "pretrain_samples_per_s": pretrain, "finetune_samples_per_s": finetune,
                         "train_seconds": r["pretrain_seconds"] + r["finetune_seconds"],
                         "sync_fraction": r.get("sync_fraction"), "test_error": r["test_error"]})
            print(f"{n} workers: {r['pretrain_seconds'] + r['finetune_seconds']:.1f} s of training", file=sys.stderr)
    base = rows[0]
    for row in rows:
        row["speedup"] = base["train_seconds"] / row["train_seconds"]
        row["pretrain_speedup"] = row["pretrain_samples_per_s"] / base["pretrain_samples_per_s"]
        row["finetune_speedup"] = row["finetune_samples_per_s"] / base["finetune_samples_per_s"]
    result = {"cpu_count": os.cpu_count(), "threads_per_process": args.threads, "settings": args.set, "epochs": args.epochs,
              "finetune_epochs": args.finetune_epochs, "rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{os.cpu_count()} cores, {args.threads} BLAS thread(s) per worker; {args.epochs} RBM epochs a layer, "
              f"{args.finetune_epochs} fine-tuning epochs, 60,000 images{''.join(', ' + s for s in args.set)}\n")
        print("| workers | training s | speed-up | pre-training samples/s | x | fine-tuning samples/s | x | sync share |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['workers']} | {r['train_seconds']:.1f} | {r['speedup']:.2f} | {r['pretrain_samples_per_s']:,.0f} "
                  f"| {r['pretrain_speedup']:.2f} | {r['finetune_samples_per_s']:,.0f} | {r['finetune_speedup']:.2f} "
                  f"| {100 * (r['sync_fraction'] or 0):.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
