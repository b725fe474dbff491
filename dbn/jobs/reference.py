"""The job file's reference, generated from the spec: ``docs/settings.md``.

    python -m dbn.jobs.reference > docs/settings.md

Every section and key comes from :data:`dbn.jobs.spec.SECTIONS` (``[model]`` from
``DBN.__init__``'s signature), with its type, its allowed values (:data:`dbn.jobs.spec.CHOICES`)
and its default; the command-line flags that set a key come from ``dbn``'s own parser. What a
key means is written here, once, in :data:`DESCRIPTIONS`: :func:`undescribed` and
:func:`stale` name the keys of the spec without a description and the descriptions of keys
that are gone, and :func:`render` refuses to write a reference with either
(``tests/test_readme.py`` checks both, and that ``docs/settings.md`` is this module's output).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import textwrap
import types
import typing
from typing import Any

from .spec import CHOICES, SECTIONS

REGENERATE = "python -m dbn.jobs.reference > docs/settings.md"

#: The page's first paragraphs.
INTRODUCTION = (
    "One TOML file describes a job, for `dbn train` and `dbn submit` alike (see `examples/mnist.toml`, "
    "`examples/quick.toml` and `examples/yarn.toml`). Unknown keys and wrong types are refused with the "
    "file, section and key named. Command-line flags override the file, and `--set section.key=value` "
    "overrides any key (`--set model.hidden_layers=[200,100]`, `--set cluster.reduce=master`).",
    "In Python the job is a `dbn.jobs.spec.JobSpec`: `load_spec(\"job.toml\", {\"model.pretrain_epochs\": 5})`, "
    "`JobSpec.from_dict(d)`, `spec.to_dict()` (what `config.json` and the YARN job file hold) and "
    "`spec.to_toml()`; every value is checked once, on the way in. `dbn.jobs.run.run(spec, launcher)` "
    "trains it with `InProcess()`, `MiniCluster()` or `Yarn(report_dir)` and returns the result that "
    "`result.json` holds, whichever launcher ran it.",
    "A default of `none` means that the key is unset (left out of the file; `--set section.key=none` "
    "on the command line); its meaning says what that does. The flags column names the commands that "
    "take each flag.",
)

#: What each section is for, above its table.
SECTION_NOTES = {
    "data": "What the job trains on, and what it is tested on once at the end. Relative paths are "
            "relative to the job file. A table (a directory of Parquet or ORC files as Spark or Hive "
            "write them, local or `hdfs://`, `s3://`) is read in place when `features` is set; "
            "[data.md](data.md) says how.",
    "model": "The DBN's hyperparameters. This section is generated from the signature of `dbn.DBN`, so "
             "its keys and defaults are the estimator's own (`seed` and `device` are in `[job]`). The "
             "defaults are Hinton's MNIST recipe; `dbn mnist` and the examples set more (see "
             "`examples/mnist.toml`, `examples/mnist-dropout.toml`).",
    "output": "Where a run writes its model, `result.json`, `log.jsonl`, checkpoints and logs. A relative "
              "path is relative to the current directory; a YARN job's must be an `hdfs://` URI.",
    "job": "The run's name, seed and device.",
    "cluster": "Distributed training: the workers, how often and how they average, faults, streaming and "
               "the live page. With `workers = 0` the job trains in this process and most keys here do not "
               "apply. [design.md](design.md) says how the runtime works.",
    "yarn": "Resources and placement on YARN (`dbn submit`); the worker count is `[cluster] workers`. "
            "[yarn.md](yarn.md) and [kerberos.md](kerberos.md) say more.",
}

#: What each key means, by ``section.key``: one entry for every key of :data:`SECTIONS`.
DESCRIPTIONS = {
    # [data]
    "data.train": "Training data: `\"mnist\"`, a `.npz` with arrays `X` (and `y`), a `.csv` (features and a "
                  "`label` column), or, with `data.features`, a table's directory or file URI.",
    "data.test": "Test data, evaluated once at the end (the same forms; `\"mnist\"`: its 10,000 test images). "
                 "Checked before training starts. none: no test.",
    "data.mnist_dir": "Directory of the four MNIST `.gz` files. none: `$DBN_MNIST_DIR`, then a "
                      "`shared/data/mnist` folder in or above the current directory, then "
                      "`~/.cache/dbn/mnist` (`dbn mnist` downloads them there).",
    "data.limit": "Train on the first N rows only (not for tables: use `data.filter`). none: all rows.",
    "data.features": "Set: `data.train` is a table read in place. Its feature columns: a name, a glob such as "
                     "`\"pixel_*\"` (expanded in the table's order of columns, never the label), or a list of "
                     "both (`[\"m_*\", \"age\"]`); a column is a number, an array or a Spark ML vector. The model "
                     "keeps the columns it was trained on and reads them by name from later tables.",
    "data.label": "The label column of a table or a `.csv` (a `.csv`'s default: `label`), or the label array "
                  "of a `.npz` (default: `y`). Integers, strings or booleans; the classes are saved with the "
                  "model.",
    "data.filter": "A table's rows to train on: columns compared with literals, `in` a list, `is None` / "
                   "`is not None` (null or NaN), joined by `and`, `or`, `not`, e.g. "
                   "`\"year >= 2020 and country == 'NL'\"`; a column name that is not a Python name goes in "
                   "backticks: `` \"`unit price` > 0\" ``.",
    "data.test_filter": "The test table's rows, in the same form (`data.test` may name the training table).",
    "data.format": "A table's format: Parquet or ORC files (a folder as Spark or Hive writes it), a Delta Lake "
                   "table (`\"delta\"`: the files its log lists at one version; the `delta` extra) or an Apache "
                   "Iceberg table (`\"iceberg\"`: the files a snapshot lists, the table named by its folder, a "
                   "metadata file or, with `data.catalog`, its name; the `iceberg` extra).",
    "data.version": "A Delta Lake table's version or an Iceberg table's snapshot id to train on, or a time as a "
                    "string (`\"2026-11-27T10:00:00Z\"`, UTC unless it names its zone). Fixed when the job starts; "
                    "also the test table's when `data.test` names the same table. none: the newest.",
    "data.catalog": "With `data.format = \"iceberg\"`: the catalog whose tables `data.train` and `data.test` "
                    "name (`\"db.table\"`), as pyiceberg's configuration describes it (`~/.pyiceberg.yaml` or "
                    "`PYICEBERG_CATALOG__<NAME>__URI`: a Hive metastore, a REST or an SQL catalog). none: they "
                    "are URIs.",
    "data.allow_outside_files": "Whether a Delta Lake log or an Apache Iceberg manifest may name data files "
                                "outside the table's folder by an absolute path or URI (a Delta shallow clone's "
                                "files, files an Iceberg table adopted with `add_files`). false: such a table is "
                                "refused, naming the log or manifest file and the entry, before anything is read. "
                                "A relative path that leads out of the folder is refused either way.",
    "data.scale": "Feature scaling by statistics of all training rows (the workers gather them), saved with "
                  "the model so that it predicts from raw rows: `\"min_max\"` (to [0, 1]; later rows beyond "
                  "the training range are clipped), `\"standard\"`, `\"none\"`. `\"auto\"`: standard for "
                  "Gaussian visible units (any data); for Bernoulli units min-max for a table, none for "
                  "other data (MNIST, `.npz`, `.csv`, shards: values outside [0, 1] are then an error).",
    # [model]
    "model.hidden_layers": "Hidden layer sizes; a softmax output layer is added.",
    "model.visible": "The first layer's visible units: `\"bernoulli\"` (data in [0, 1]) or `\"gaussian\"` "
                     "(standardised real values).",
    "model.cd_k": "Gibbs steps of contrastive divergence.",
    "model.persistent": "Persistent CD: the chains carry over between minibatches.",
    "model.pretrain_epochs": "RBM epochs per layer.",
    "model.pretrain_learning_rate": "RBM learning rate, or a list of one per layer. none: 0.1, but 0.001 for a "
                                    "first layer of Gaussian visible units. Training that goes to NaN or "
                                    "infinity stops at that epoch, naming the layer and this setting.",
    "model.momentum": "RBM momentum until epoch `momentum_epoch`.",
    "model.final_momentum": "RBM momentum from epoch `momentum_epoch` on.",
    "model.momentum_epoch": "The RBM epoch at which the momentum becomes `final_momentum`.",
    "model.weight_cost": "L2 penalty on the RBM weights.",
    "model.pretrain_batch_size": "RBM minibatch size. A job whose smallest shard makes fewer than 10 "
                                 "minibatches an epoch warns and suggests a smaller one.",
    "model.finetune_epochs": "Backprop epochs. 0: pre-training only, an unsupervised feature extractor that "
                             "needs no labels (`dbn transform`, `DBN.load(...).transform(rows)`), the same in "
                             "one process, on the local mini-cluster and on YARN.",
    "model.finetune_learning_rate": "Backprop learning rate.",
    "model.finetune_lr_decay": "Multiplies the backprop learning rate after each epoch.",
    "model.finetune_momentum": "Backprop momentum.",
    "model.finetune_final_momentum": "The backprop momentum rises linearly from `finetune_momentum` to this "
                                     "over `finetune_momentum_epochs` epochs, then stays (Srivastava et al. "
                                     "2014: 0.5 to 0.99). none: constant.",
    "model.finetune_momentum_epochs": "The epochs over which the backprop momentum rises to "
                                      "`finetune_final_momentum`.",
    "model.finetune_weight_cost": "L2 penalty during fine-tuning.",
    "model.max_norm": "Fine-tuning keeps each unit's incoming weight vector at most this long (max-norm, used "
                      "with dropout). 0: no bound.",
    "model.finetune_batch_size": "Backprop minibatch size.",
    "model.top_layer_epochs": "The first fine-tuning epochs, which train only the softmax layer (Hinton's "
                              "backprop.m: 5).",
    "model.n_classes": "Classes of the softmax layer; a label outside 0..n_classes-1 is then an error naming "
                       "its shard and row. none: from the labels.",
    "model.dropout": "Drop probability of hidden units while fine-tuning.",
    "model.input_dropout": "Drop probability of input units while fine-tuning.",
    "model.validation_fraction": "Share of the training data held out to report the validation error each "
                                 "fine-tuning epoch. One process only (refused on workers): "
                                 "`cluster.validation` works anywhere.",
    "model.early_stopping_patience": "Stop after this many fine-tuning epochs without a better validation "
                                     "error, keeping the best network (scored on `model.validation_fraction` "
                                     "in one process, or on `cluster.validation` anywhere). none: no early "
                                     "stopping.",
    # [output]
    "output.dir": "Where everything is written. none: `runs/<job name>`.",
    # [job]
    "job.name": "The run's name: up to 100 letters, digits, spaces and `_ . - + = , @`. none: the job "
                "file's name without `.toml` (`mnist` without a file).",
    "job.seed": "Seed of initialisation, shuffling and sampling. A shard's seeds derive from (seed, step, "
                "shard), so the model does not depend on which process ran which shard.",
    "job.device": "Where the workers train; `\"auto\"`: the GPU when CuPy sees one.",
    # [cluster]
    "cluster.workers": "0: one process. N: N data-parallel workers, one shard each, on a local mini-cluster "
                       "(`--local N`) or in YARN containers.",
    "cluster.processes": "Local mini-cluster: the OS processes that run the workers, each computing its shards "
                         "in turn. 0: as many as pay on this machine's cores (10 workers run in 2 processes on "
                         "2 cores, in 10 on 8 or more; the model is the same bit for bit).",
    "cluster.threads_per_process": "Local mini-cluster: the BLAS threads of each worker process. 0: this "
                                   "machine's cores shared out over the processes. Set it to cap a job's "
                                   "cores on a shared machine.",
    "cluster.shards": "A directory (or `hdfs://`, `s3://` URI) of Parquet shards to train on. none: "
                      "`data.train` is cut into `OUT/shards`.",
    "cluster.sync_every": "Minibatches between parameter averages. 0: once per epoch (the paper's setting).",
    "cluster.max_restarts": "Restarts allowed per worker before it is given up.",
    "cluster.heartbeat_timeout": "Seconds of silence after which a worker is presumed lost. Past 100 workers "
                                 "the heartbeats slow down to 100 a second in all, and the timeout grows to "
                                 "at least 3 of their intervals (the progress says so).",
    "cluster.float16_wire": "Send parameters as float16: half the bytes, not bit-exact.",
    "cluster.shared_memory": "Local mini-cluster: the master and the workers pass parameters and updates "
                             "through files of a folder in `/dev/shm` the launcher makes and removes, not "
                             "through gRPC's bytes. The same bits either way; false: gRPC. On YARN, gRPC.",
    "cluster.block_momentum": "Fine-tuning: momentum over the averaged per-sync deltas (BMUF, Chen & Huo "
                              "2016). With one sync per epoch about 1 - 1/N restores one process's pace; "
                              "with more frequent syncs it must be smaller. none: 1 - 1/N for N shards, at "
                              "most 0.9 (0 with one). 0: plain averaging.",
    "cluster.pretrain_block_momentum": "The same for RBM pre-training. none: 1 - 1/N, at most 0.7 (above 0.7 "
                                       "it compounds with the RBMs' own momentum).",
    "cluster.block_learning_rate": "Fine-tuning: each sync moves the parameters this many times the averaged "
                                   "delta (BMUF's block learning rate). 1: the average. Above 1 diverged in "
                                   "every measured setting.",
    "cluster.pretrain_block_learning_rate": "The same for RBM pre-training.",
    "cluster.block_nesterov": "Both phases: the workers start from the block momentum's look-ahead point "
                              "(BMUF's Nesterov variant). none: on wherever a block momentum is.",
    "cluster.validation": "A labelled Parquet shard scored after each fine-tuning epoch, by the master or in "
                          "one process (`valid_error` in the log; never trained on; its classes must be the "
                          "training data's).",
    "cluster.stream": "The workers' data: `\"auto\"` streams it from local disk when holding it would not fit "
                      "the worker's memory (`yarn.worker_memory` on YARN, the machine's available memory "
                      "locally); `\"always\"`; `\"never\"` ([data.md](data.md), \"Data larger than "
                      "memory\").",
    "cluster.reduce": "Who averages the workers' updates: `\"master\"`; `\"workers\"`, each its own rows, so no "
                      "machine moves more than a few copies of the model whatever the worker count; "
                      "`\"auto\"`: the workers on YARN from 8 workers, else the master.",
    "cluster.lost_shards": "What a step does with the unfinished shards of a worker it lost (a crash, a container "
                           "YARN preempted): `\"redo\"` has the live workers do them within the step, so that "
                           "the model is bit-identical to an undisturbed run whatever comes and goes (a loss costs "
                           "about one step's compute more); `\"skip\"` goes on without them ([yarn.md](yarn.md), "
                           "\"Shared queues\").",
    "cluster.ui": "The live page while a distributed job runs: on 127.0.0.1 locally (its address is printed "
                  "at the start), behind the tracking URL on YARN.",
    # [yarn]
    "yarn.queue": "YARN queue.",
    "yarn.node_label": "Run only on nodes with this label.",
    "yarn.worker_memory": "Memory per worker container; YARN kills a container that exceeds it.",
    "yarn.worker_vcores": "Virtual cores per worker container, also its BLAS threads.",
    "yarn.worker_gpus": "`yarn.io/gpu` per worker container (Hadoop 3.1+ with GPU scheduling); > 0 trains "
                        "with CuPy.",
    "yarn.master_memory": "The application master's container.",
    "yarn.max_attempts": "Application master attempts; a new attempt resumes from its submission's newest "
                         "checkpoint.",
    "yarn.priority": "The application's priority in its queue: YARN schedules higher ones first (up to the "
                      "cluster's `yarn.cluster.max-application-priority`, 0 by default: then only 0). Set after "
                      "submitting with Hadoop's `yarn application -updatePriority`; `0` leaves the queue's default.",
    "yarn.min_workers": "Start the job once this many workers run, the others joining as YARN gives their "
                        "containers (a busy queue); `0`: wait for all of `[cluster] workers`. `dbn scale` changes "
                        "the count while the job runs ([yarn.md](yarn.md), \"Shared queues\").",
    "yarn.start_timeout": "Seconds the job waits for `min_workers` (or, with `0`, one) worker to run; then it "
                          "fails, saying what it waited for.",
    "yarn.locality_wait": "Seconds a worker container waits for a node holding its data (asked for strictly), "
                          "then runs on any node. 0: YARN's own locality delay decides, which on a small "
                          "cluster gives a node up within a few heartbeats. GPU workers always leave it to YARN.",
    "yarn.decommission_check": "Seconds between the application master's looks for nodes being decommissioned "
                               "(`yarn rmadmin -refreshNodes -g`): a worker on such a node hands its shards to "
                               "the others, leaves, and a container on another node takes its place, nothing "
                               "counted, the model the same. Each look runs Hadoop's `yarn node -list` (a JVM "
                               "start); `0`: never look (YARN ends those workers at the timeout, also nothing "
                               "counted).",
    "yarn.env": "A packed environment (`.tar.gz`, local or `hdfs://`) to ship. none: pack the current one.",
    "yarn.python": "A Python installed on every node, used instead of shipping an environment.",
    "yarn.file_systems": "Extra HDFS name services the job touches (they get delegation tokens); those of the "
                         "shards, tables and output are added.",
    "yarn.principal": "Kerberos principal, with `yarn.keytab`. none: the ticket cache.",
    "yarn.keytab": "Kerberos keytab file, with `yarn.principal`; it goes to the application master alone, "
                   "which renews the job's delegation tokens.",
}

_TYPE_NAMES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", tuple: "list"}


def keys() -> list[str]:
    """Every ``section.key`` of the job file, in the spec's order."""
    return [f"{name}.{field.name}" for name, section in SECTIONS.items() for field in dataclasses.fields(section)]


def undescribed() -> list[str]:
    """Keys of the spec that :data:`DESCRIPTIONS` does not describe."""
    return [key for key in keys() if not DESCRIPTIONS.get(key, "").strip()]


def stale() -> list[str]:
    """Keys :data:`DESCRIPTIONS` describes that the spec no longer has."""
    known = set(keys())
    return [key for key in DESCRIPTIONS if key not in known]


def type_name(hint) -> str:
    """A type hint in words: ``str | None`` -> "string", ``tuple[str, ...]`` -> "list of strings"."""
    if isinstance(hint, str):
        return hint
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        names = [type_name(m) for m in typing.get_args(hint) if m is not type(None)]
        return " or ".join(dict.fromkeys(names))
    if origin in (list, tuple):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return f"list of {type_name(args[0])}s" if args else "list"
    if hint is Any:
        return "any"
    return _TYPE_NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def toml_value(value) -> str:
    """A default as a job file writes it; none where unset."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def flags() -> dict[str, list[str]]:
    """The command-line flags that set each key, from ``dbn``'s parser: a flag whose destination is the
    key, or whose help names it in parentheses (``--local N``: "... (cluster.workers)")."""
    from ..cli import build_parser  # the command line sits above the jobs: imported only to read it

    known, found = set(keys()), {}

    def walk(parser, command):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{command} {name}".strip())
                continue
            if not action.option_strings:
                continue
            named = re.findall(r"\(([a-z]+\.[a-z0-9_]+)\)", action.help or "")
            key = action.dest if action.dest in known else next((k for k in named if k in known), None)
            if key is None and action.help and action.help.split(" ")[0] in known:  # "output.dir (default ...)"
                key = action.help.split(" ")[0]
            if key is not None:
                flag = max(action.option_strings, key=len)
                found.setdefault(key, {}).setdefault(flag, []).append(command.split(" ")[0])

    walk(build_parser(), "")
    commands = {key: {flag: sorted(set(cmds)) for flag, cmds in by_flag.items()} for key, by_flag in found.items()}
    return {key: [f"`{flag}` ({', '.join(cmds)})" for flag, cmds in sorted(by_flag.items())]
            for key, by_flag in commands.items()}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _paragraph(text: str) -> list[str]:
    return textwrap.wrap(text, width=100, break_long_words=False, break_on_hyphens=False) + [""]


def _kind(section: str, field: dataclasses.Field, hint) -> str:
    """The key's type in words, or its allowed values."""
    choices = CHOICES.get((section, field.name))
    if choices:
        return " or ".join(f'`"{c}"`' for c in choices)
    kind = type_name(hint)
    if kind == "list" and isinstance(field.default, tuple) and field.default:  # an unannotated list: its default says
        kind = f"list of {type_name(type(field.default[0]))}s"
    return kind


def render() -> str:
    """The markdown of ``docs/settings.md``: every section and key of the job file. Raises ValueError
    when a key of the spec has no description, or a description names a key that is gone."""
    missing, gone = undescribed(), stale()
    if missing or gone:
        raise ValueError(f"dbn/jobs/reference.py's DESCRIPTIONS: describe {missing or 'nothing more'}; "
                         f"drop {gone or 'nothing'}")
    by_key = flags()
    lines = ["# Job file settings", "",
             f"<!-- Generated from dbn/jobs/spec.py by `{REGENERATE}`: edit dbn/jobs/reference.py, "
             "not this file. -->", ""]
    for text in INTRODUCTION:
        lines += _paragraph(text)
    hints_of = {name: typing.get_type_hints(section) for name, section in SECTIONS.items()}
    for name, section in SECTIONS.items():
        lines += [f"## [{name}]", "", *_paragraph(SECTION_NOTES[name]),
                  "| key | type | default | flags | meaning |", "| --- | --- | --- | --- | --- |"]
        for field in dataclasses.fields(section):
            key = f"{name}.{field.name}"
            lines.append(f"| `{key}` | {_kind(name, field, hints_of[name][field.name])} | "
                         f"`{toml_value(field.default)}` | {'<br>'.join(by_key.get(key, []))} | "
                         f"{_cell(DESCRIPTIONS[key])} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
