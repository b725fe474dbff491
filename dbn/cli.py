"""The ``dbn`` command line: it parses arguments, calls :mod:`dbn.jobs` and prints.

    dbn train [JOB.toml] [--local N [--resume]] [--overwrite] [--quick] [--json] [--set section.key=value ...]
    dbn submit [JOB.toml] [--workers N] [--dry-run] [--wait]; dbn status|logs|kill APP_ID;
    dbn scale APP_ID --workers N
    dbn mnist [--quick] [--local N] [--yarn --hdfs-out URI] [--sweep] [--overwrite];  dbn shard SOURCE OUT --shards N
    dbn evaluate MODEL.npz;  dbn predict|transform MODEL.npz JOB.toml --out OUT.parquet [--overwrite]
    dbn bench rbm|all [--device gpu]

Errors in the input (configuration, data, model files, devices, the cluster) print
``dbn: error: <message>`` and exit with status 2; ``--debug`` shows the traceback.

An output directory belongs to one job: ``dbn train``, ``dbn mnist`` and ``dbn submit``
refuse one that holds another job's run unless given ``--overwrite`` (see
:data:`OVERWRITE_HELP`), and one that another run is writing into (exit 2, naming the holder).
No command moves, overwrites or deletes a file it did not write: ``dbn shard`` refuses a
folder holding files other than shards it wrote, and ``dbn predict``/``dbn transform`` refuse
a file already at ``--out`` unless given ``--overwrite`` (as Spark's ErrorIfExists, or
``hdfs dfs -put`` without ``-f``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path

from iterreduce.exceptions import IterReduceError
from iterreduce.redact import redact

from . import __version__
from .errors import DBNError, UsageError
from .jobs.progress import ProgressPrinter, summary_line, to_json
from .jobs.spec import load_recipe, load_spec, parse_override
from .model.backend import DEVICES

# Each command imports the modules it runs itself: `dbn --help`, `dbn status` and the others start
# without skein, pyarrow's datasets and pandas (0.7 s of CPU of 2.2 s, measured with -X importtime).

#: What the command line reports as ``dbn: error: <message>`` (exit 2) rather than a traceback.
USER_ERRORS = (DBNError, IterReduceError, OSError)
LABEL_HELP = "where the labels are: a .npz's array (default y), a .csv's column (default label)"
EXIT_ERROR, EXIT_INTERRUPTED = 2, 130

OVERWRITE_HELP = ("replace the run of another job in the output directory (refused without this flag); the "
                  "earlier run is kept in OUT/previous/N, and its model.npz and result.json stay in place until "
                  "this run writes its own. Rerunning the same job needs no --overwrite: it keeps the earlier "
                  "run the same way")

#: Flags that set a job-spec key: (flag, key, type, metavar, help). The key is the argparse dest.
JOB_FLAGS = (
    ("--epochs", "model.pretrain_epochs", int, "N", "pre-training epochs per layer"),
    ("--finetune-epochs", "model.finetune_epochs", int, "N", "fine-tuning epochs"),
    ("--layers", "model.hidden_layers", str, "N,N,...", "hidden layer sizes, e.g. 500,500,2000"),
    ("--device", "job.device", str, None, "cpu, gpu or auto"),
    ("--sync-every", "cluster.sync_every", int, "K", "average parameters every K minibatches; 0 = once per epoch"),
    ("--max-restarts", "cluster.max_restarts", int, "N", "restarts allowed per worker"),
)
SUBMIT_FLAGS = (
    ("--workers", "cluster.workers", int, "N", "worker containers"),
    ("--worker-memory", "yarn.worker_memory", str, "SIZE", "memory per worker container, e.g. '4 GiB'"),
    ("--worker-vcores", "yarn.worker_vcores", int, "N", "virtual cores per worker container"),
    ("--worker-gpus", "yarn.worker_gpus", int, "N", "GPUs (yarn.io/gpu) per worker container"),
    ("--queue", "yarn.queue", str, "NAME", "YARN queue"),
    ("--priority", "yarn.priority", int, "N", "the application's priority in its queue (higher first)"),
    ("--node-label", "yarn.node_label", str, "LABEL", "YARN node label"),
    ("--env", "yarn.env", str, "ARCHIVE", "packed environment to ship (default: pack this one)"),
    ("--python", "yarn.python", str, "PATH", "a Python installed on every node (ships no environment)"),
    ("--max-attempts", "yarn.max_attempts", int, "N", "application master attempts"),
    ("--principal", "yarn.principal", str, "NAME", "Kerberos principal (with --keytab; default: the ticket cache)"),
    ("--keytab", "yarn.keytab", str, "FILE", "Kerberos keytab file"),
)


def _say(args, command: str):
    """A function printing ``dbn COMMAND: message`` on stderr, silent with --quiet."""
    return (lambda msg: None) if args.quiet else (lambda msg: print(f"dbn {command}: {msg}", file=sys.stderr, flush=True))


def _overrides(args, *flag_tables, extra: dict | None = None) -> dict:
    """Spec keys set on the command line: ``extra``, the flags of ``flag_tables``, then --set."""
    given = {**(extra or {}), **{key: getattr(args, key) for table in flag_tables for _, key, *_ in table}}
    if getattr(args, "no_ui", False):
        given["cluster.ui"] = False
    return {**{k: v for k, v in given.items() if v is not None}, **dict(map(parse_override, args.set))}


def _spec(args, *flag_tables, extra: dict | None = None):
    """The job spec: the file (or the default), --quick, then the command line's keys."""
    return load_spec(args.config, _overrides(args, *flag_tables, extra=extra), quick=getattr(args, "quick", False))


def _print_result(result: dict, args) -> None:
    print(to_json({"event": "summary", **result}) if args.json else summary_line(result), flush=True)


def cmd_train(args) -> int:
    from .jobs.run import Interrupted, launcher_for, run

    spec = _spec(args, JOB_FLAGS, extra={"cluster.workers": args.local, "output.dir": args.out})
    try:
        result = run(spec, launcher_for(spec, resume=args.resume), overwrite=args.overwrite,
                     on_record=ProgressPrinter(spec, quiet=args.quiet, json_lines=args.json))
    except Interrupted as stop:
        print(f"dbn: interrupted ({stop.how}) {stop.hint}", file=sys.stderr, flush=True)
        return stop.exit_status
    _print_result(result, args)
    return 0


def cmd_submit(args) -> int:
    from iterreduce.launch.yarn.appspec import spec_yaml

    from .jobs.yarn import prepare, submit

    spec = _spec(args, JOB_FLAGS, SUBMIT_FLAGS, extra={"output.dir": args.out})
    say = _say(args, "submit")
    if args.dry_run:
        print(spec_yaml(prepare(spec, dry_run=True, log=say).spec), end="")
        return 0
    submission, app_id, url, client = submit(spec, log=say, overwrite=args.overwrite)
    return _submitted(args, say, client, app_id, url, f"outputs in {submission.job['master']['output']}",
                      start_timeout=spec.yarn.start_timeout)


def _submitted(args, say, client, app_id: str, url: str, where: str, start_timeout: float | None = None) -> int:
    """Print a submitted application's id and how to watch it; with ``--wait``, follow it to its
    end (killed when YARN has not started it within ``start_timeout`` seconds). Returns the exit
    code (an application that failed on bad data ends as bad input does on one machine)."""
    from iterreduce.launch.yarn import client as yarn

    print(app_id)
    say(f"submitted {app_id}; tracking URL: {url or '(none yet)'}; {where}")
    say(f"watch it with `dbn status {app_id}`, read its logs with `dbn logs {app_id}`")
    if args.wait:
        st = yarn.follow(client, app_id, show=say, start_timeout=start_timeout)
        if st.final_status != "SUCCEEDED":
            print(f"dbn: error: {yarn.ended_badly(st)}", file=sys.stderr)
            return EXIT_ERROR if yarn.stopped_on_bad_data(st) else 1
    return 0


def cmd_mnist(args) -> int:
    from .jobs import mnist_eval

    if args.yarn and not args.hdfs_out:
        raise UsageError("--yarn needs --hdfs-out URI: where the job writes its model and checkpoints on HDFS")
    # The recipe's [model] settings first: the command line's own keys win over them.
    overrides = {**(load_recipe(args.recipe) if args.recipe else {}), **_overrides(args, JOB_FLAGS)}
    out, result = mnist_eval.command(
        out=args.out, quick=args.quick, sweep_instead=args.sweep, local=args.local,
        yarn_out=args.hdfs_out if args.yarn else None, validation=args.validation, seed=args.seed,
        data_dir=args.data, overrides=overrides, log=_say(args, "mnist"), overwrite=args.overwrite, resume=args.resume,
        progress_for=lambda spec: ProgressPrinter(spec, quiet=args.quiet))
    print(result if args.sweep else to_json(result) if args.json else mnist_eval.report_line(out, result),
          end="" if args.sweep else "\n")
    return 0


def cmd_view(args) -> int:
    import time

    from .jobs.view import serve_run

    servers = []
    try:
        for i, out in enumerate(args.out):  # several runs: a page each, side by side in the browser
            servers.append(serve_run(out, host=args.host, port=args.port + i if args.port else 0))
            print(f"the page of {out}: {servers[-1].url}", flush=True)
        print("Ctrl-C to stop", flush=True)
        while True:
            time.sleep(3600)
    finally:
        for server in servers:
            server.stop()


def cmd_shard(args) -> int:
    from .data.sharding import shard_dataset

    for uri in shard_dataset(args.source, args.out, args.shards, split=args.split, mnist_dir=args.mnist_dir,
                             limit=args.limit, label=args.label):
        print(uri)
    return 0


def cmd_evaluate(args) -> int:
    from .jobs.run import evaluate_model

    record = evaluate_model(args.model, args.data, mnist_dir=args.mnist_dir, device=args.device, label=args.label)
    error = record["test_error"]
    print(to_json(record) if args.json else f"test error {100 * error:.2f} %  ({record['errors']} of "
          f"{record['n_samples']})  {args.model} on {args.data}")
    return 0


def cmd_predict(args) -> int:
    from iterreduce.storage.ownership import check_not_within

    from .data.training import scored_rows
    from .jobs.run import load_classifier
    from .jobs.spec import load_spec
    from .model.estimator import DBN

    spec = load_spec(args.job)
    for setting, given in {**spec.inputs(), "the model": str(args.model), "--table": args.table}.items():
        check_not_within(setting, given, args.out, "where the rows scored are written (replaced with --overwrite)")
    keep = tuple(name for name in (args.keep or "").split(",") if name)
    rows = scored_rows(spec.data)
    rows.check_options(keep, args.filter, args.job)
    features = args.command == "transform"  # the rows' features, from any model; else predictions, from a classifier
    if args.yarn or args.local:
        return _score_distributed(args, spec, rows, keep, features)
    for name, value in (("--part-rows", args.part_rows), ("--workers", args.workers), ("--wait", args.wait or None)):
        if value is not None:
            raise UsageError(f"{name} goes with --yarn (or --local N): one process writes one file")
    model = DBN.load(args.model, device=args.device) if features else load_classifier(args.model, device=args.device)
    record = rows.predict(model, args.out, table=args.table, filter=args.filter, keep=keep, features=features,
                          overwrite=args.overwrite)
    error = "" if record["error"] is None else f"  (error {100 * record['error']:.2f} % against '{record['label']}')"
    done = "transformed" if features else "predicted"
    print(to_json(record) if args.json else f"{record['rows']} rows of {record['table']} {done} -> {args.out}{error}")
    return 0


def _score_distributed(args, spec, rows, keep: tuple[str, ...], features: bool) -> int:
    """``dbn predict|transform --local N`` or ``--yarn``: a scoring job (:mod:`dbn.jobs.scoring`)
    writing a folder of Parquet part files, committed whole."""
    from .data.training import TableRows
    from .jobs import scoring

    if args.yarn and args.local:
        raise UsageError("--yarn and --local: choose one")
    if args.local and (args.workers or args.wait):
        raise UsageError("--workers and --wait go with --yarn; --local N names its worker processes")
    if not isinstance(rows, TableRows):
        raise UsageError(f"{args.job}: --yarn and --local score a table read in place ([data] features names its "
                         f"columns); a data file is scored by one process (without them)")
    if Path(args.out).suffix.lower() in (".csv", ".parquet"):
        raise UsageError(f"--out {args.out}: a scoring job writes a folder of Parquet part files: name the folder")
    say = _say(args, args.command)
    options = dict(table=args.table, filter=args.filter, keep=keep, features=features, overwrite=args.overwrite,
                   part_rows=scoring.PART_ROWS if args.part_rows is None else args.part_rows)
    if args.local:
        record = scoring.run_local(str(args.model), spec.data, args.out, workers=args.local, device=args.device,
                                   on_record=scoring.progress_printer(say), **options)
        print(to_json(record) if args.json else scoring.describe(record))
        return 0
    if args.workers is not None:
        spec.cluster.workers = args.workers
    app_id, url, client = scoring.submit(spec, str(args.model), args.out, log=say, **options)
    return _submitted(args, say, client, app_id, url, f"the output appears whole at {args.out}")


def cmd_export(args) -> int:
    from iterreduce.storage.filesystems import check_output_file

    from .model.estimator import DBN

    if args.format == "mlflow":
        from .model.mlflow_flavor import export_mlflow

        if Path(args.out).exists():  # MLflow writes a new folder: one there is never replaced
            raise UsageError(f"--out {args.out}: already exists; an MLflow model is written to a new folder")
        record = export_mlflow(args.model, args.out)
        print(to_json(record) if args.json else f"{args.model} -> {args.out} (MLflow python_function; "
              f"mlflow.pyfunc.load_model({args.out!r}).predict(frame))")
        return 0
    from .model.onnx_export import export_onnx

    check_output_file(args.out, overwrite=args.overwrite)  # before the model is read
    record = export_onnx(DBN.load(args.model, device="cpu"), args.out, overwrite=args.overwrite)
    print(to_json(record) if args.json else f"{args.model} -> {args.out} (ONNX opset {record['opset']}; inputs "
          f"{', '.join(record['inputs'])}; outputs {', '.join(record['outputs'])})")
    return 0


def cmd_bench_rbm(args) -> int:
    from .jobs.bench import bench_rbm, format_table, sklearn_available

    if args.sklearn and not sklearn_available():
        raise UsageError("--sklearn: scikit-learn is not installed (pip install 'dbn-yarn[bench]'), or use --no-sklearn")
    try:
        result = bench_rbm(device=args.device, batch=args.batch, n_visible=args.visible, n_hidden=args.hidden,
                           seconds=args.seconds, sklearn=args.sklearn, rounds=args.rounds, sgemm_size=args.sgemm_size,
                           mapping=args.mapping)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(to_json(result) if args.json else format_table(result))
    return 0


def cmd_bench_all(args) -> int:
    from .jobs.bench import MAPPINGS, bench_all, format_table

    try:
        result = bench_all(device=args.device, batch=args.batch, seconds=args.seconds, rounds=args.rounds,
                           mappings=MAPPINGS if args.mapping == "both" else (args.mapping,), sgemm_size=args.sgemm_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(to_json(result) if args.json else format_table(result))
    return 0


def cmd_yarn(args) -> int:
    """``dbn status``, ``dbn logs``, ``dbn scale`` and ``dbn kill``."""
    from iterreduce.launch.yarn import client as yarn

    if not re.fullmatch(r"application_\d+_\d+", args.app_id):  # before reaching for a cluster
        raise UsageError(f"{args.app_id!r} is not a YARN application id (application_<cluster start>_<number>, "
                         f"as `dbn submit` prints it)")
    client = yarn.connect(getattr(args, "yarn.principal"), getattr(args, "yarn.keytab"))
    if args.command == "status":
        st = yarn.status(client, args.app_id)
        print(to_json(vars(st)) if args.json else st.describe())
    elif args.command == "logs":
        print(yarn.logs(client, args.app_id, show=lambda line: print(line, file=sys.stderr)))
    elif args.command == "scale":
        was = yarn.scale(client, args.app_id, args.workers)
        print(f"{args.app_id}: {args.workers} workers from its next step (it had {was})")
    else:
        yarn.kill(client, args.app_id)
        print(f"killed {args.app_id}")
    return 0


def _flags(parser, table) -> None:
    for flag, key, kind, metavar, help_ in table:
        choices = DEVICES if key == "job.device" else None
        parser.add_argument(flag, dest=key, type=kind, metavar=None if choices else metavar, choices=choices,
                            help=f"{help_} ({key})")


def _command(sub, name: str, parents, help_: str, func, *args) -> argparse.ArgumentParser:
    """A subcommand; ``args`` are (flags, keywords) pairs for add_argument."""
    p = sub.add_parser(name, parents=parents, help=help_, description=help_[0].upper() + help_[1:] + ".")
    for flags, options in args:
        p.add_argument(*flags.split(), **options)
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback on errors, and the log of the skein driver a command starts")
    job = argparse.ArgumentParser(add_help=False, parents=[common])
    job.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                     help="override a setting, e.g. --set model.dropout=0.3 (repeatable)")
    job.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    job.add_argument("--no-ui", action="store_true", help="no live page while a distributed job runs (cluster.ui)")
    parser = argparse.ArgumentParser(prog="dbn", parents=[common], description="Deep Belief Networks on YARN: "
                                     "train, submit, evaluate and benchmark.")
    parser.add_argument("--version", action="version", version=f"dbn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help="run `dbn COMMAND --help` for its options")
    config = ("config", {"nargs": "?", "type": Path, "help": "job file (.toml); default: MNIST, 784-500-500-2000-10"})
    json_ = ("--json", {"action": "store_true", "help": "JSON on stdout"})
    flag = {"action": "store_true"}
    overwrite = ("--overwrite", {**flag, "help": OVERWRITE_HELP})

    p = _command(sub, "train", [job], "train a DBN as a job file says, in this process or on --local N workers",
                 cmd_train, config, ("--out", {"metavar": "DIR", "help": "output.dir (default runs/<job name>)"}),
                 ("--local", {"type": int, "metavar": "N", "help": "a local mini-cluster of N workers (cluster.workers)"}),
                 ("--resume", {**flag, "help": "continue a killed distributed job from its last checkpoint"}),
                 overwrite,
                 ("--quick", {**flag, "help": "a reduced run (the QUICK preset, as examples/quick.toml)"}),
                 ("--json", {**flag, "help": "JSON lines on stdout: one per record, then a summary"}))
    _flags(p, JOB_FLAGS)
    p = _command(sub, "submit", [job], "run a job on Hadoop YARN: [output] dir is an hdfs:// URI; prints the "
                 "application id", cmd_submit, config, ("--out", {"metavar": "URI", "help": "output.dir on HDFS"}),
                 ("--dry-run", {**flag, "help": "print the skein application spec (YAML) and stop"}),
                 ("--wait", {**flag, "help": "follow the job's progress until it ends"}),
                 ("--overwrite", {**flag, "help": "replace the run of another job in the HDFS output folder (refused "
                                                  "without this flag); the earlier run's files move to "
                                                  "OUTPUT/previous/N, nothing is deleted"}))
    _flags(p, JOB_FLAGS + SUBMIT_FLAGS)
    workers = ("--workers", {"type": int, "required": True, "metavar": "N",
                             "help": "the workers from the job's next step on: 1 to its number of shards"})
    for name, help_, extra in (("status", "state and progress of a YARN application", [json_]),
                               ("logs", "the aggregated container logs of a YARN application", []),
                               ("scale", "grow or shrink a running job's workers (the model stays the same with "
                                         "[cluster] lost_shards = \"redo\")", [workers]),
                               ("kill", "kill a YARN application", [])):
        p = _command(sub, name, [common], help_, cmd_yarn, ("app_id", {"help": "e.g. application_1526134340424_0012"}),
                     *extra)
        _flags(p, SUBMIT_FLAGS[-2:])
    p = _command(sub, "mnist", [job], "the MNIST evaluation: shard, train on the local mini-cluster (or YARN), test "
                 "once, write result.json, log.jsonl and plots", cmd_mnist,
                 ("--data", {"metavar": "DIR", "help": "the four MNIST .gz files (default: found automatically)"}),
                 ("--out", {"metavar": "DIR", "help": "report directory (default runs/mnist[-quick])"}),
                 ("--local", {"type": int, "metavar": "N", "help": "worker processes (default 10; 2 with --quick)"}),
                 ("--yarn", {**flag, "help": "train on YARN through dbn submit (needs --hdfs-out)"}),
                 ("--hdfs-out", {"metavar": "URI", "help": "with --yarn: the job's output on HDFS"}),
                 ("--quick", {**flag, "help": "the QUICK preset on 2 workers, with 5,000 validation images"}),
                 ("--seed", {"type": int, "default": 0, "help": "random seed (default 0)"}),
                 ("--validation", {"type": int, "metavar": "N", "help": "hold out the last N training images "
                                   "(default: 5000 with --quick, else 0)"}),
                 ("--recipe", {"metavar": "FILE", "help": "a TOML file's [model] settings over the paper's, e.g. "
                               "examples/mnist-dropout.toml (--set and the flags win over it)"}),
                 ("--sweep", {**flag, "help": "three network sizes on 1 and 10 workers: OUT/sweep.md (run it again "
                              "to go on: finished sizes are kept, an interrupted one resumes; a sweep.md there "
                              "that a sweep did not write is refused unless --overwrite)"}),
                 ("--resume", {**flag, "help": "continue an interrupted run in OUT from its newest checkpoint"}), overwrite,
                 json_)
    _flags(p, JOB_FLAGS)
    _command(sub, "view", [common], "serve the page of a finished run (its curves, filters, workers and events) "
             "from its output directory", cmd_view,
             ("out", {"type": Path, "nargs": "+", "help": "the run's output directory (log.jsonl); several: a page "
                                                        "each, to compare them"}),
             ("--port", {"type": int, "default": 0, "help": "port (the next ones for further runs; default: any free one)"}),
             ("--host", {"default": "127.0.0.1", "help": "address to bind (default 127.0.0.1: this machine only)"}))
    _command(sub, "shard", [common], "cut 'mnist', a .npz (X [, y]) or a .csv ([label]) into Parquet shards",
             cmd_shard, ("source", {"help": "'mnist', FILE.npz or FILE.csv"}),
             ("out", {"help": "output directory or URI (file://, hdfs://, s3://)"}),
             ("--shards", {"type": int, "required": True, "metavar": "N", "help": "number of shards"}),
             ("--split", {"choices": ("train", "test"), "default": "train", "help": "MNIST split"}),
             ("--mnist-dir", {"help": "directory of the MNIST files"}),
             ("--limit", {"type": int, "metavar": "N", "help": "only the first N rows"}),
             ("--label", {"metavar": "NAME", "help": LABEL_HELP}))
    _command(sub, "evaluate", [common], "test error of a saved model on MNIST's test images or a labelled data "
             "file", cmd_evaluate,
             ("model", {"type": Path, "help": "model file written by dbn train (model.npz)"}),
             ("--data", {"default": "mnist", "help": "'mnist' (its 10,000 test images), a .npz with X and y, "
                                               "or a .csv with labels"}),
             ("--mnist-dir", {"help": "directory of the MNIST files"}),
             ("--label", {"metavar": "NAME", "help": LABEL_HELP}),
             ("--device", {"choices": DEVICES, "default": "auto",
                           "help": "where the model runs: cpu, gpu, or auto (gpu when one is usable; the default)"}),
             json_)
    def rows_out(what: str) -> tuple:  # dbn predict's and dbn transform's arguments
        return (("model", {"type": Path, "help": "model file written by dbn train (model.npz)"}),
                ("job", {"help": "the job file the model was trained with (its [data] features)"}),
                ("--out", {"required": True, "help": "file to write: Parquet, or CSV when the name ends in .csv "
                                                     "(a path, or hdfs://, s3:// URI); a file already there is "
                                                     "refused (exit 2, left as it is) unless --overwrite"}),
                ("--overwrite", {**flag, "help": f"replace the file at --out (refused without this flag), "
                                                 f"atomically, once the {what} are all written: a failed run "
                                                 f"leaves the earlier file whole; a folder there is always refused"}),
                ("--table", {"help": "the table or data file (default: [data] test, else [data] train)"}),
                ("--filter", {"help": "its rows (default: the job's filter for that table)"}),
                ("--keep", {"metavar": "COL,...", "help": f"columns copied beside the {what}, e.g. an id"}),
                ("--device", {"choices": DEVICES, "default": "auto",
                              "help": "where the model runs: cpu, gpu, or auto (gpu when one is usable; the default)"}),
                ("--yarn", {**flag, "help": "score the table where it lives, in YARN containers ([cluster] workers or "
                                            "--workers, the job's [yarn] section); --out is then a folder URI of "
                                            "Parquet part files, which appears whole at the end"}),
                ("--local", {"type": int, "metavar": "N", "help": "score with N worker processes on this machine, "
                                                                  "into a folder of part files as with --yarn"}),
                ("--workers", {"type": int, "metavar": "N", "help": "worker containers for --yarn"}),
                ("--wait", {**flag, "help": "with --yarn: follow the job until it ends"}),
                ("--part-rows", {"type": int, "metavar": "N", "help": "with --yarn or --local: rows a part file "
                                                                      "holds at least, where the table allows "
                                                                      "(default 250000)"}),
                ("--quiet", {**flag, "help": "no progress lines on stderr (with --yarn or --local)"}),
                json_)

    _command(sub, "predict", [common], "predict the rows of a table (or a data file) with a saved model, as "
             "the job file names its columns; the predictions go to a Parquet (or .csv) file", cmd_predict,
             *rows_out("predictions"))
    _command(sub, "transform", [common], "the features a saved model (a classifier or a pre-trained stack) gives "
             "the rows of a table (or a data file): its top hidden layer's activations, in a Parquet file's "
             "'features' column (a .csv file's features_0, features_1, ...)", cmd_predict, *rows_out("features"))
    _command(sub, "export", [common], "a saved classifier for serving: an ONNX file (ONNX Runtime, Triton) or an "
             "MLflow model; raw rows in (by column where it has them), the table's labels out (the scaler, "
             "the network and the classes inside)", cmd_export,
             ("model", {"help": "model file written by dbn train (model.npz)"}),
             ("--format", {"choices": ["onnx", "mlflow"], "default": "onnx",
                           "help": "onnx (a file) or mlflow (a new folder: an MLflow python_function model)"}),
             ("--out", {"required": True, "help": "onnx: file to write (a path, or hdfs://, s3:// URI), refused if "
                                                  "there unless --overwrite; mlflow: a new local folder"}),
             ("--overwrite", {"action": "store_true", "help": "replace the file at --out, atomically"}), json_)
    bench = sub.add_parser("bench", parents=[common], help="speed benchmarks",
                           description="Speed benchmarks: `dbn bench rbm --help`, `dbn bench all --help`.")
    what = bench.add_subparsers(dest="bench", metavar="WHAT", required=True, help="what to measure")

    def sizes(*names):
        return tuple((f"--{name}", {"type": int, "default": default, "help": f"{text} (default {default})"})
                     for name, default, text in (("batch", 100, "minibatch size"), ("visible", 784, "visible units"),
                                                 ("hidden", 500, "hidden units"), ("rounds", 3, "measurement rounds"),
                                                 ("sgemm-size", 2048, "n of the n x n x n sgemm")) if name in names)

    device = ("--device", {"choices": DEVICES, "default": "cpu", "help": "cpu, gpu or auto (default cpu)"})
    seconds = ("--seconds", {"type": float, "default": 10.0,
                             "help": "timed training per contender and mapping (default 10)"})
    mapping = ("per-core: one single-threaded model per core, each in its own process, as the local "
               "mini-cluster runs; one-process: one model on all BLAS threads, as dbn train")
    _command(what, "rbm", [common],
             "CD-1 samples/s beside this machine's sgemm rate and scikit-learn's BernoulliRBM", cmd_bench_rbm,
             device, *sizes("batch", "visible", "hidden", "rounds", "sgemm-size"), seconds,
             ("--mapping", {"choices": ("per-core", "one-process"), "default": "per-core",
                            "help": mapping + " (default per-core)"}),
             ("--sklearn", {"action": argparse.BooleanOptionalAction, "default": None,
                            "help": "compare with scikit-learn (default: when installed)"}), json_)
    _command(what, "all", [common],
             "the main job's work (CD-1 on 784x500, 500x500 and 500x2000, and fine-tuning of "
             "784-500-500-2000-10 with dropout) beside this machine's sgemm rate", cmd_bench_all,
             device, *sizes("batch", "rounds", "sgemm-size"), seconds,
             ("--mapping", {"choices": ("both", "per-core", "one-process"), "default": "both",
                            "help": mapping + " (default both)"}), json_)
    return parser


def _show_driver_log() -> None:
    """``--debug``: the Java log of a skein driver this command starts, on stderr (without it, kept
    in memory for an error's message only)."""
    import logging

    from iterreduce.launch.yarn.client import DRIVER_LOGGER

    log = logging.getLogger(DRIVER_LOGGER)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("skein driver: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False


def main(argv=None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 job failed, 2 bad input, 130 Ctrl-C)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: return the code, for in-process callers
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    debug = getattr(args, "debug", False)
    if debug:
        _show_driver_log()
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
        print(f"dbn: error: {redact(message)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        if debug:
            raise
        print("dbn: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
