"""The ``dbn`` command line.

    dbn train [CONFIG.toml] [--set section.key=value ...] [--quick] [--json] [--local N [--resume]] ...
    dbn shard SOURCE OUT --shards N
    dbn evaluate MODEL.npz [--data mnist|FILE.npz] [--json]
    dbn bench rbm [--device cpu|gpu] [--json] ...

Errors in the input (configuration, data, model files, devices) print
``dbn: error: <message>`` and exit with status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path


from iterreduce.exceptions import IterReduceError

from . import __version__
from .data.mnist import load_mnist, scale_images
from .data.sharding import load_source
from .exceptions import ConfigError, DataError, DBNError, ModelFileError, UsageError
from .jobs.spec import QUICK, JobConfig, load_config, parse_override
from .model.backend import DEVICES
from .model.estimator import DBN
from .model.persist import atomic_write

#: What the command line reports as ``dbn: error: <message>`` (exit 2) rather than a traceback.
USER_ERRORS = (DBNError, IterReduceError, OSError)
EXIT_ERROR, EXIT_INTERRUPTED = 2, 130


def _json(record) -> str:
    return json.dumps(record, default=lambda o: o.item() if hasattr(o, "item") else str(o))


def _write_json(path: Path, obj) -> None:
    text = json.dumps(obj, indent=2, default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))


# ---------------------------------------------------------------------- data


def load_dataset(spec: str, split: str, mnist_dir=None, cache: dict | None = None):
    """``"mnist"`` (its ``split``: "train" or "test", scaled to [0, 1]), or a .npz / .csv with labels."""
    if spec == "mnist":
        cache = {} if cache is None else cache
        if "mnist" not in cache:
            cache["mnist"] = load_mnist(mnist_dir)
        data = cache["mnist"]
        x, y = (data.x_train, data.y_train) if split == "train" else (data.x_test, data.y_test)
        return scale_images(x), y
    X, y = load_source(spec)
    if y is None:
        raise DataError(f"{spec}: no array y (labels): training and evaluation need them")
    return X, y


def _load_job_data(cfg: JobConfig):
    cache: dict = {}
    X, y = load_dataset(cfg.data.train, "train", cfg.data.mnist_dir, cache)
    if cfg.data.limit is not None:
        X, y = X[: cfg.data.limit], y[: cfg.data.limit]
    X_test = y_test = None
    if cfg.data.test is not None:
        X_test, y_test = load_dataset(cfg.data.test, "test", cfg.data.mnist_dir, cache)
    return X, y, X_test, y_test


# ---------------------------------------------------------------- progress


def _rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


class Progress:
    """DBN callback: log.jsonl always, a human line on stderr, a JSON line on stdout with --json."""

    def __init__(self, log, cfg: JobConfig, *, quiet: bool, json_lines: bool):
        self.log, self.cfg, self.quiet, self.json_lines = log, cfg, quiet, json_lines
        self.start = time.perf_counter()
        self.last = None  # (phase, layer, seconds) of the previous record
        self.where = "start-up"  # the last completed step, for the Ctrl-C message

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def write(self, record: dict, stdout: bool = False) -> None:
        line = _json(record)
        self.log.write(line + "\n")
        self.log.flush()
        if stdout and self.json_lines:
            print(line, flush=True)

    def __call__(self, rec: dict) -> None:
        key = (rec["phase"], rec.get("layer"))
        previous = self.last[1] if self.last and self.last[0] == key else 0.0
        self.last = (key, rec["seconds"])
        epoch_seconds = rec["seconds"] - previous
        record = {
            "event": "epoch", **rec, "epoch_seconds": epoch_seconds,
            "samples_per_s": rec["samples"] / epoch_seconds if epoch_seconds > 0 else None,
            "elapsed": self.elapsed(),
        }
        self.write(record, stdout=True)
        m = self.cfg.model
        if rec["phase"] == "pretrain":
            self.where = f"pretrain layer {rec['layer'] + 1}/{len(m.hidden_layers)} epoch {rec['epoch'] + 1}/{m.pretrain_epochs}"
            detail = f"recon {rec['reconstruction_error']:.2f}"
        else:
            self.where = f"finetune epoch {rec['epoch'] + 1}/{m.finetune_epochs}"
            detail = f"loss {rec['loss']:.4f}  train err {100 * rec['train_error']:.2f}%"
            if "valid_error" in rec:
                detail += f"  valid err {100 * rec['valid_error']:.2f}%"
        if not self.quiet:
            rate = f"{_rate(record['samples_per_s'])} samples/s" if record["samples_per_s"] else "- samples/s"
            print(f"{self.where}  {detail}  {rate}  {record['elapsed']:.0f} s", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ commands


class ClusterProgress:
    """Progress of a distributed job: the master's per-superstep records and the launcher's events."""

    def __init__(self, cfg: JobConfig, *, quiet: bool, json_lines: bool):
        self.cfg, self.quiet, self.json_lines = cfg, quiet, json_lines
        self.start = time.perf_counter()

    def __call__(self, rec: dict) -> None:
        if self.json_lines:
            print(_json(rec), flush=True)
        if self.quiet:
            return
        elapsed = time.perf_counter() - self.start
        if "event" in rec:
            detail = {k: v for k, v in rec.items() if k not in ("event", "time")}
            print(f"[{rec['event']}] {_json(detail)}", file=sys.stderr, flush=True)
            return
        m = self.cfg.model
        where = f"step {rec['step'] + 1}/{rec['of']}  {rec['phase']}"
        if rec["phase"] in ("pretrain", "transform"):
            where += f" layer {rec['layer'] + 1}/{len(m.hidden_layers)}"
        if "epoch" in rec:
            total = m.pretrain_epochs if rec["phase"] == "pretrain" else m.finetune_epochs
            where += f" epoch {rec['epoch'] + 1}/{total}"
        if "reconstruction_error" in rec:
            where += f"  recon {rec['reconstruction_error']:.2f}"
        if "loss" in rec:
            where += f"  loss {rec['loss']:.4f}  train err {100 * rec['train_error']:.2f}%"
        rate = rec["samples"] / rec["seconds"] if rec["seconds"] > 0 else 0
        share = rec["sync_seconds"] / rec["seconds"] if rec["seconds"] > 0 else 0
        print(f"{where}  {_rate(rate)} samples/s  sync {rec['sync_seconds']:.2f} s ({100 * share:.0f}%)  "
              f"shards {rec['shards']}/{rec['shards_total']}  {elapsed:.0f} s", file=sys.stderr, flush=True)


def _train_distributed(cfg: JobConfig, args) -> int:
    from .jobs.distributed import train_local

    out = Path(cfg.output.dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", cfg.to_dict())
    workers = cfg.cluster.workers
    if not args.quiet:
        print(f"dbn train: local mini-cluster of {workers} workers, writing to {out}", file=sys.stderr, flush=True)
    try:
        result = train_local(cfg, workers=workers, resume=args.resume,
                             on_record=ClusterProgress(cfg, quiet=args.quiet, json_lines=args.json))
    except KeyboardInterrupt:
        print(f"dbn: interrupted (Ctrl-C); checkpoints are in {out / 'checkpoints'}: "
              f"continue with the same command and --resume", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    model = DBN.load(out / "model.npz", device="cpu")
    test_error = None
    if cfg.data.test is not None and model.network_ is not None:  # pre-training only: nothing to test
        X_test, y_test = load_dataset(cfg.data.test, "test", cfg.data.mnist_dir)
        test_error = 1.0 - model.score(X_test, y_test)
    result = {
        "test_error": test_error, "block_momentum": cfg.cluster.block_momentum,
        "layers": [model.n_features_in_, *model.hidden_layers, getattr(model, "n_classes_", None)],
        "epochs": {"pretrain": cfg.model.pretrain_epochs, "finetune": cfg.model.finetune_epochs},
        "seed": cfg.job.seed, "device": cfg.job.device, "name": cfg.job.name, **result,
        "params": cfg.dbn_params(),
    }
    _write_json(out / "result.json", result)
    if args.json:
        print(_json({"event": "summary", **result}), flush=True)
    else:
        if test_error is not None:
            err = f"test error {100 * test_error:.2f} %"
        else:
            err = "no test set" if cfg.data.test is None else "pre-trained only: no classifier to test"
        sync = "" if result["sync_fraction"] is None else f", {100 * result['sync_fraction']:.1f} % of pre-training in sync"
        print(f"{err}  ({result['wall_seconds']:.0f} s{sync})  model: {out / 'model.npz'}")
    return 0


def cmd_shard(args) -> int:
    from .data.sharding import shard_dataset

    written = shard_dataset(args.source, args.out, args.shards, split=args.split,
                            mnist_dir=args.mnist_dir, limit=args.limit)
    for uri in written:
        print(uri)
    return 0


def _overrides(args, flags: tuple) -> dict:
    """Config overrides from --quick, --set and the flags that map to config keys."""
    overrides: dict = dict(QUICK) if getattr(args, "quick", False) else {}
    for item in args.set:
        key, value = parse_override(item)
        overrides[key] = value
    for key, value in flags:
        if value is not None:
            overrides[key] = value
    return overrides


def _job_flags(args) -> tuple:
    return (("model.pretrain_epochs", args.epochs), ("model.finetune_epochs", args.finetune_epochs),
            ("model.hidden_layers", args.layers), ("job.device", args.device), ("output.dir", args.out),
            ("cluster.sync_every", args.sync_every), ("cluster.max_restarts", args.max_restarts))


def cmd_train(args) -> int:
    overrides = _overrides(args, (*_job_flags(args), ("cluster.workers", args.local)))
    cfg = load_config(args.config, overrides)
    if args.quick and cfg.output.dir == str(Path("runs") / cfg.job.name):  # keep apart from full runs
        cfg = load_config(args.config, {**overrides, "output.dir": str(Path("runs") / f"{cfg.job.name}-quick")})
    if cfg.cluster.workers > 0:
        return _train_distributed(cfg, args)
    if args.resume:
        raise UsageError("--resume continues a distributed job: add --local N (or [cluster] workers)")
    X, y, X_test, y_test = _load_job_data(cfg)
    try:
        model = DBN(**cfg.dbn_params())
    except ValueError as exc:
        raise ConfigError(f"{cfg.source or 'default config'}: [model] {exc}") from None

    out = Path(cfg.output.dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", cfg.to_dict())
    with open(out / "log.jsonl", "a") as log:
        progress = Progress(log, cfg, quiet=args.quiet, json_lines=args.json)
        model.callback = progress
        progress.write({
            "event": "start", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "version": __version__,
            "device": model.backend.device, "n_train": int(X.shape[0]), "n_features": int(X.shape[1]),
            "n_test": None if X_test is None else int(X_test.shape[0]), "config": cfg.to_dict(),
        })
        if not args.quiet:
            print(
                f"dbn train: {X.shape[0]} x {X.shape[1]} -> {'-'.join(map(str, cfg.model.hidden_layers))} "
                f"on {model.backend.device}, writing to {out}",
                file=sys.stderr, flush=True,
            )
        saved = False
        try:
            t0 = time.perf_counter()
            model.pretrain(X)
            pretrain_seconds = time.perf_counter() - t0
            t1 = time.perf_counter()
            model.finetune(X, y)
            finetune_seconds = time.perf_counter() - t1
            model.save(out / "model.npz")
            saved, progress.where = True, "training"
            test_error = None
            if X_test is not None:
                test_error = 1.0 - model.score(X_test, y_test)
        except KeyboardInterrupt:
            progress.write({"event": "interrupted", "after": progress.where, "elapsed": progress.elapsed()})
            model_note = f"model saved to {out / 'model.npz'}" if saved else "no model written"
            print(f"dbn: interrupted (Ctrl-C) after {progress.where}; {model_note}; "
                  f"progress so far is in {out / 'log.jsonl'}", file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
        result = {
            "test_error": test_error,
            "n_test": None if X_test is None else int(X_test.shape[0]),
            "layers": [int(X.shape[1]), *cfg.model.hidden_layers, int(model.n_classes_)],
            "epochs": {"pretrain": cfg.model.pretrain_epochs, "finetune": cfg.model.finetune_epochs,
                       "finetune_run": sum(1 for r in model.history_ if r["phase"] == "finetune")},
            "wall_seconds": progress.elapsed(),
            "pretrain_seconds": pretrain_seconds,
            "finetune_seconds": finetune_seconds,
            "device": model.backend.device,
            "seed": cfg.job.seed,
            "n_train": int(X.shape[0]),
            "name": cfg.job.name,
            "model": str(out / "model.npz"),
            "params": model.get_params(),
        }
        _write_json(out / "result.json", result)
        progress.write({"event": "summary", **result}, stdout=True)
    if not args.json:
        err = "no test set" if test_error is None else f"test error {100 * test_error:.2f} %"
        print(f"{err}  ({result['wall_seconds']:.0f} s)  model: {out / 'model.npz'}")
    return 0


def cmd_evaluate(args) -> int:
    model = DBN.load(args.model, device=args.device)
    if model.network_ is None:
        raise ModelFileError(f"{args.model}: a pre-trained stack without a classifier: nothing to evaluate")
    X, y = load_dataset(args.data, "test", args.mnist_dir)
    error = 1.0 - model.score(X, y)
    record = {
        "model": str(args.model), "data": args.data, "test_error": error, "n_samples": int(X.shape[0]),
        "errors": int(round(error * X.shape[0])), "device": model.backend.device,
    }
    if args.json:
        print(_json(record))
    else:
        print(f"test error {100 * error:.2f} %  ({record['errors']} of {record['n_samples']})  {args.model} on {args.data}")
    return 0


def cmd_bench_rbm(args) -> int:
    from .jobs.bench import bench_rbm, format_table, sklearn_available

    if args.sklearn and not sklearn_available():
        raise UsageError("--sklearn: scikit-learn is not installed (pip install 'dbn-yarn[bench]'), or use --no-sklearn")
    try:
        result = bench_rbm(
            device=args.device, batch=args.batch, n_visible=args.visible, n_hidden=args.hidden,
            seconds=args.seconds, sklearn=args.sklearn, rounds=args.rounds, sgemm_size=args.sgemm_size,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(_json(result) if args.json else format_table(result))
    return 0


def cmd_submit(args) -> int:
    from iterreduce.yarn import client as yarn
    from .jobs.yarn import prepare

    yarn_flags = ("worker_memory", "worker_vcores", "worker_gpus", "queue", "node_label", "env", "python",
                  "max_attempts", "principal", "keytab")
    cfg = load_config(args.config, _overrides(args, (
        *_job_flags(args), ("cluster.workers", args.workers),
        *((f"yarn.{name}", getattr(args, name)) for name in yarn_flags))))
    say = (lambda *a: None) if args.quiet else (lambda msg: print(f"dbn submit: {msg}", file=sys.stderr, flush=True))
    yarn.check_kerberos(cfg.yarn.principal, cfg.yarn.keytab)  # before any staging work
    try:
        submission = prepare(cfg, dry_run=args.dry_run, log=say)
    except ValueError as exc:
        if isinstance(exc, USER_ERRORS):
            raise
        raise ConfigError(str(exc)) from exc
    if args.dry_run:
        print(submission.spec.to_yaml(), end="")
        return 0
    client = yarn.connect(cfg.yarn.principal, cfg.yarn.keytab)
    app_id, url = yarn.submit(client, submission.spec)
    print(app_id)
    say(f"submitted {app_id}; tracking URL: {url or '(none yet)'}; outputs in {submission.job['output']}")
    say(f"watch it with `dbn status {app_id}`, read its logs with `dbn logs {app_id}`")
    if args.wait:
        return _follow(client, app_id, quiet=args.quiet)
    return 0


def _follow(client, app_id: str, *, quiet: bool) -> int:
    """Print progress until the application ends; 0 if it succeeded."""
    from iterreduce.yarn import client as yarn

    shown = []

    def show(st):
        lines = st.describe().splitlines()
        line = lines[0] + (f" | {lines[1].strip()}" if st.record else "")
        if not quiet and line not in shown[-1:]:
            print(line, file=sys.stderr, flush=True)
            shown.append(line)

    st = yarn.wait(client, app_id, on_status=show)
    if st.final_status != "SUCCEEDED":
        print(f"dbn: error: {app_id} ended {st.final_status}: {st.diagnostics or 'no diagnostics'}; "
              f"`dbn logs {app_id}` shows why", file=sys.stderr)
        return 1
    return 0


def cmd_mnist(args) -> int:
    from .jobs import mnist_eval

    overrides = dict(parse_override(item) for item in args.set)
    if args.sync_every is not None:
        overrides["cluster.sync_every"] = args.sync_every
    layers = tuple(int(v) for v in args.layers.split(",")) if args.layers else None
    quick_tag = "-quick" if args.quick else ""
    out = args.out or str(Path("runs") / (f"mnist-sweep{quick_tag}" if args.sweep else f"mnist{quick_tag}"))
    validation = args.validation if args.validation is not None else (5000 if args.quick else 0)
    say = (lambda msg: None) if args.quiet else (lambda msg: print(f"dbn mnist: {msg}", file=sys.stderr, flush=True))
    if args.yarn and not args.hdfs_out:
        raise UsageError("--yarn needs --hdfs-out URI: where the job writes its model and checkpoints on HDFS")
    if args.sweep:
        if args.yarn:
            raise UsageError("--sweep runs on the local mini-cluster; drop --yarn")
        table = mnist_eval.sweep(out=out, quick=args.quick, seed=args.seed, data_dir=args.data,
                                 overrides=overrides, validation=validation, log=say)
        print(table, end="")
        return 0
    workers = args.local or (mnist_eval.QUICK_WORKERS if args.quick else 10)
    cfg = mnist_eval.mnist_config(out=args.hdfs_out if args.yarn else out, workers=workers, quick=args.quick,
                                  seed=args.seed, data_dir=args.data, layers=layers, overrides=overrides)
    say(f"{'-'.join(map(str, cfg.model.hidden_layers))} on {'YARN' if args.yarn else 'the local mini-cluster'}, "
        f"{cfg.cluster.workers} workers, {cfg.model.pretrain_epochs} + {cfg.model.finetune_epochs} epochs; "
        f"report in {out}")
    progress = ClusterProgress(cfg, quiet=args.quiet, json_lines=False)
    result = mnist_eval.run(cfg, validation=validation, yarn_report_dir=out if args.yarn else None,
                            on_record=progress, log=say)
    if args.json:
        print(_json(result))
    else:
        print(f"test error {100 * result['test_error']:.2f} % on the 10,000 MNIST test images "
              f"({result['wall_seconds']:.0f} s); report: {Path(out).resolve()}/result.json and "
              f"{', '.join(Path(p).name for p in result['plots'])}")
    return 0


def cmd_status(args) -> int:
    from iterreduce.yarn import client as yarn

    st = yarn.status(yarn.connect(args.principal, args.keytab), args.app_id)
    if args.json:
        print(_json({k: v for k, v in vars(st).items()}))
    else:
        print(st.describe())
    return 0


def cmd_logs(args) -> int:
    from iterreduce.yarn import client as yarn

    print(yarn.logs(yarn.connect(args.principal, args.keytab), args.app_id))
    return 0


def cmd_kill(args) -> int:
    from iterreduce.yarn import client as yarn

    yarn.kill(yarn.connect(args.principal, args.keytab), args.app_id)
    print(f"killed {args.app_id}")
    return 0


# ------------------------------------------------------------------- parsing


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback on errors")
    parser = argparse.ArgumentParser(
        prog="dbn", parents=[common],
        description="Deep Belief Networks: train, evaluate and benchmark.",
    )
    parser.add_argument("--version", action="version", version=f"dbn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    kerberos = argparse.ArgumentParser(add_help=False)
    kerberos.add_argument("--principal", help="Kerberos principal (with --keytab; default: the ticket cache)")
    kerberos.add_argument("--keytab", help="Kerberos keytab file")

    p = sub.add_parser("train", parents=[common], help="train a DBN (one process, or --local N workers)",
                       description="Train a DBN as a TOML job file says (default: the paper's MNIST run), "
                                   "in this process or on a local mini-cluster (--local N).")
    p.add_argument("config", nargs="?", type=Path, help="job file (.toml); default: MNIST, 784-500-500-2000-10")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a setting, e.g. --set model.dropout=0.3 (repeatable)")
    p.add_argument("--epochs", type=int, metavar="N", help="pre-training epochs per layer (model.pretrain_epochs)")
    p.add_argument("--finetune-epochs", type=int, metavar="N", help="fine-tuning epochs (model.finetune_epochs)")
    p.add_argument("--layers", metavar="N,N,...", help="hidden layer sizes, e.g. 500,500,2000")
    p.add_argument("--device", choices=DEVICES, help="job.device")
    p.add_argument("--out", metavar="DIR", help="output directory (output.dir; default runs/<job name>)")
    p.add_argument("--quick", action="store_true",
                   help="a reduced run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", action="store_true", help="JSON lines on stdout: one per epoch, then a summary")
    p.add_argument("--local", type=int, metavar="N",
                   help="train on a local mini-cluster of N worker processes (cluster.workers)")
    p.add_argument("--sync-every", type=int, metavar="K",
                   help="average parameters every K minibatches; 0 = once per epoch (cluster.sync_every)")
    p.add_argument("--max-restarts", type=int, metavar="N", help="restarts allowed per worker (cluster.max_restarts)")
    p.add_argument("--resume", action="store_true", help="continue a killed distributed job from its last checkpoint")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("submit", parents=[common, kerberos], help="run a training job on Hadoop YARN",
                       description="Submit the job a TOML file describes (as for dbn train) to YARN through "
                                   "skein. [output] dir must be an hdfs:// URI; the data is [cluster] shards, or "
                                   "[data] train sharded into OUTPUT/shards. Prints the application id.")
    p.add_argument("config", nargs="?", type=Path, help="job file (.toml); default: MNIST, 784-500-500-2000-10")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a setting (repeatable)")
    p.add_argument("--workers", type=int, metavar="N", help="worker containers (cluster.workers)")
    p.add_argument("--worker-memory", metavar="SIZE", help="memory per worker container, e.g. '4 GiB'")
    p.add_argument("--worker-vcores", type=int, metavar="N", help="virtual cores per worker container")
    p.add_argument("--worker-gpus", type=int, metavar="N", help="GPUs (yarn.io/gpu) per worker container")
    p.add_argument("--queue", help="YARN queue (yarn.queue)")
    p.add_argument("--node-label", help="YARN node label (yarn.node_label)")
    p.add_argument("--env", metavar="ARCHIVE", help="packed environment to ship (default: pack this one)")
    p.add_argument("--python", metavar="PATH", help="a Python installed on every node (ships no environment)")
    p.add_argument("--max-attempts", type=int, metavar="N", help="application master attempts (yarn.max_attempts)")
    p.add_argument("--max-restarts", type=int, metavar="N", help="restarts per worker container")
    p.add_argument("--epochs", type=int, metavar="N", help="pre-training epochs per layer")
    p.add_argument("--finetune-epochs", type=int, metavar="N", help="fine-tuning epochs")
    p.add_argument("--layers", metavar="N,N,...", help="hidden layer sizes")
    p.add_argument("--device", choices=DEVICES, help="job.device")
    p.add_argument("--sync-every", type=int, metavar="K", help="minibatches between averages (0: once per epoch)")
    p.add_argument("--out", metavar="URI", help="output URI on HDFS (output.dir)")
    p.add_argument("--dry-run", action="store_true", help="print the skein application spec (YAML) and stop")
    p.add_argument("--wait", action="store_true", help="follow the job's progress until it ends")
    p.add_argument("--quiet", action="store_true", help="only the application id on stdout")
    p.set_defaults(func=cmd_submit)

    for name, func, help_ in (("status", cmd_status, "state and progress of a YARN application"),
                              ("logs", cmd_logs, "the aggregated container logs of a YARN application"),
                              ("kill", cmd_kill, "kill a YARN application")):
        p = sub.add_parser(name, parents=[common, kerberos], help=help_, description=help_[0].upper() + help_[1:] + ".")
        p.add_argument("app_id", help="application id, e.g. application_1526134340424_0012")
        if name == "status":
            p.add_argument("--json", action="store_true", help="print one JSON object")
        p.set_defaults(func=func)

    p = sub.add_parser("mnist", parents=[common], help="the MNIST evaluation: train, test once, report",
                       description="Shard MNIST, train the paper's DBN on the local mini-cluster (or YARN), "
                                   "test it once on the 10,000 test images and write result.json, log.jsonl "
                                   "and PNG plots to --out. --sweep fills the paper's table.")
    p.add_argument("--data", metavar="DIR", help="directory of the four MNIST .gz files (default: found "
                                                "automatically, or downloaded)")
    p.add_argument("--out", metavar="DIR", help="report directory (default runs/mnist, runs/mnist-quick, ...)")
    p.add_argument("--local", type=int, metavar="N", help="worker processes (default 10; 2 with --quick)")
    p.add_argument("--yarn", action="store_true", help="train on YARN through dbn submit (needs --hdfs-out)")
    p.add_argument("--hdfs-out", metavar="URI", help="with --yarn: the job's output on HDFS")
    p.add_argument("--quick", action="store_true",
                   help="a reduced run for a few minutes on 2 cores: 2 workers, 20,000 training images, "
                        "20 + 30 epochs")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--layers", metavar="N,N,...", help="hidden layer sizes (default 500,500,2000)")
    p.add_argument("--sync-every", type=int, metavar="K", help="minibatches between averages (0: once per epoch)")
    p.add_argument("--validation", type=int, metavar="N",
                   help="hold out the last N training images for a validation curve (default: 5000 with "
                        "--quick, else 0: train on all 60,000 as the paper did)")
    p.add_argument("--sweep", action="store_true", help="layers 300-300-1000, 500-500-2000, 1000-1000-2000 "
                                                        "on 1 and 10 workers; writes OUT/sweep.md")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a setting (repeatable), e.g. --set yarn.python=/opt/py/bin/python")
    p.add_argument("--json", action="store_true", help="print result.json's content")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(func=cmd_mnist)

    p = sub.add_parser("shard", parents=[common], help="cut a dataset into Parquet shards",
                       description="Write SOURCE ('mnist', a .npz with X [and y], or a .csv with an optional "
                                   "'label' column) as N Parquet shards under OUT (a path or URI).")
    p.add_argument("source", help="'mnist', FILE.npz or FILE.csv")
    p.add_argument("out", help="output directory or URI (file://, hdfs://, s3://)")
    p.add_argument("--shards", type=int, required=True, metavar="N", help="number of shards")
    p.add_argument("--split", choices=("train", "test"), default="train", help="MNIST split (default train)")
    p.add_argument("--mnist-dir", help="directory of the MNIST files (default: found automatically)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N rows")
    p.set_defaults(func=cmd_shard)

    p = sub.add_parser("evaluate", parents=[common], help="test error of a saved model")
    p.add_argument("model", type=Path, help="model file written by dbn train (model.npz)")
    p.add_argument("--data", default="mnist", help="'mnist' (its 10,000 test images) or a .npz with X and y")
    p.add_argument("--mnist-dir", help="directory of the MNIST files (default: found automatically)")
    p.add_argument("--device", choices=DEVICES, default="auto")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("bench", parents=[common], help="speed benchmarks")
    bench = p.add_subparsers(dest="bench", metavar="WHAT", required=True)
    b = bench.add_parser("rbm", parents=[common], help="CD-1 samples/s vs this machine's sgemm and scikit-learn",
                         description="CD-1 training speed next to the machine's sgemm rate and sklearn's BernoulliRBM.")
    b.add_argument("--device", choices=DEVICES, default="cpu")
    b.add_argument("--batch", type=int, default=100, help="minibatch size (default 100)")
    b.add_argument("--visible", type=int, default=784, help="visible units (default 784)")
    b.add_argument("--hidden", type=int, default=500, help="hidden units (default 500)")
    b.add_argument("--seconds", type=float, default=10.0, help="timed training per contender, in all (default 10)")
    b.add_argument("--rounds", type=int, default=3, help="interleaved measurement rounds (default 3)")
    b.add_argument("--sgemm-size", type=int, default=2048, help="n of the n x n x n sgemm (default 2048)")
    b.add_argument("--sklearn", action=argparse.BooleanOptionalAction, default=None,
                   help="compare with sklearn's BernoulliRBM (default: when installed)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.set_defaults(func=cmd_bench_rbm)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: return the code, for in-process callers
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    debug = getattr(args, "debug", False)
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `dbn train --json | head`: stop quietly
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except USER_ERRORS as exc:
        if debug:
            raise
        message = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename and exc.strerror else str(exc)
        print(f"dbn: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        if debug:
            raise
        print("dbn: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
