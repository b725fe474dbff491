"""Accuracy bar: a single-process DBN 784-500-500-2000-10 on all of MNIST, tested once.

    python benchmarks/mnist_accuracy.py --out runs/accuracy [--device cpu|gpu]

Writes progress lines (JSON) to OUT/log.jsonl, the pre-trained stack to
OUT/pretrained.npz, the final model to OUT/model.npz and the figures to
OUT/result.json. With --pretrained FILE it skips pre-training.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from dbn import DBN
from dbn.data.mnist import load_mnist, scale_images


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/accuracy"))
    ap.add_argument("--data", default=None, help="directory of the MNIST IDX files")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", default="500,500,2000")
    ap.add_argument("--pretrain-epochs", type=int, default=50)
    ap.add_argument("--finetune-epochs", type=int, default=100)
    ap.add_argument("--finetune-lr", type=float, default=0.1)
    ap.add_argument("--lr-decay", type=float, default=0.98)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--input-dropout", type=float, default=0.2)
    ap.add_argument("--pretrained", type=Path, default=None)
    args = ap.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    data = load_mnist(args.data)
    X, y = scale_images(data.x_train), data.y_train
    log = open(args.out / "log.jsonl", "a")

    def progress(record):
        log.write(json.dumps(record) + "\n")
        log.flush()
        print(json.dumps(record), flush=True)

    params = dict(
        hidden_layers=[int(n) for n in args.layers.split(",")],
        pretrain_epochs=args.pretrain_epochs, finetune_epochs=args.finetune_epochs,
        finetune_learning_rate=args.finetune_lr, finetune_lr_decay=args.lr_decay,
        dropout=args.dropout, input_dropout=args.input_dropout,
        device=args.device, seed=args.seed, callback=progress,
    )
    start = time.perf_counter()
    if args.pretrained:
        model = DBN.load(args.pretrained, device=args.device)
        for key, value in params.items():
            setattr(model, key, value)
        pretrain_seconds = 0.0
    else:
        model = DBN(**params)
        model.pretrain(X)
        pretrain_seconds = time.perf_counter() - start
        model.save(args.out / "pretrained.npz")
    t = time.perf_counter()
    model.finetune(X, y)
    finetune_seconds = time.perf_counter() - t
    model.save(args.out / "model.npz")
    test_error = 1.0 - model.score(scale_images(data.x_test), data.y_test)
    result = {
        "test_error": test_error, "layers": [784, *model.hidden_layers, 10],
        "pretrain_epochs": args.pretrain_epochs, "finetune_epochs": args.finetune_epochs,
        "pretrain_seconds": pretrain_seconds, "finetune_seconds": finetune_seconds,
        "wall_seconds": time.perf_counter() - start, "device": model.backend.device,
        "params": model.get_params(), "pretrained_from": str(args.pretrained) if args.pretrained else None,
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=2))
    print(f"test error {100 * test_error:.2f} %  ({result['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
