"""Accuracy bar: a single-process DBN 784-500-500-2000-10 on all of MNIST, tested once.

    python benchmarks/mnist_accuracy.py --out runs/accuracy [--device cpu|gpu] [--seed S]

The paper's job (the PAPER preset, as examples/mnist.toml) through the same run path
as ``dbn train``: progress records in OUT/log.jsonl (and as JSON lines on stdout), the
model in OUT/model.npz, the figures in OUT/result.json.
"""

import argparse
import sys

from dbn.jobs.progress import ProgressPrinter, summary_line
from dbn.jobs.run import InProcess, run
from dbn.jobs.spec import load_spec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/accuracy")
    ap.add_argument("--data", default=None, help="directory of the MNIST IDX files")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", default="500,500,2000")
    ap.add_argument("--pretrain-epochs", type=int, default=None, help="default: the PAPER preset's")
    ap.add_argument("--finetune-epochs", type=int, default=None, help="default: the PAPER preset's")
    args = ap.parse_args(argv)

    overrides = {"output.dir": args.out, "job.device": args.device, "job.seed": args.seed,
                 "model.hidden_layers": args.layers, "data.mnist_dir": args.data,
                 "model.pretrain_epochs": args.pretrain_epochs, "model.finetune_epochs": args.finetune_epochs}
    spec = load_spec(None, {key: value for key, value in overrides.items() if value is not None})
    result = run(spec, InProcess(), on_record=ProgressPrinter(spec, json_lines=True))
    print(summary_line(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
