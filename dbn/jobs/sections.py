"""The job file's sections: each a :class:`~iterreduce.specification.Specification` whose fields are
its settings, each setting's meaning written once, beside it (:func:`~iterreduce.specification.setting`:
``docs/settings.md`` is generated from them by :mod:`dbn.jobs.reference`), and :func:`check_setting`,
which checks one value on its way in. :class:`dbn.jobs.spec.JobSpec` holds one of each."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import typing
from dataclasses import dataclass
from typing import Any

from iterreduce.master.config import LOST_SHARDS_CHOICES, REDUCE_CHOICES
from iterreduce.specification import Specification, setting
from shardio.tables import FORMATS

from ..data.scaling import SCALINGS
from ..errors import ConfigError
from ..model.backend import DEVICES
from ..model.estimator import DBN
from ..model.rbm import VISIBLE_UNITS
from .hints import accepts, convert, describe_value, parse_literal, quoted
from .memory_plan import STREAM_CHOICES


class Section(Specification):
    """A section of the job file: an unknown key is a :class:`ConfigError` that names the section it
    belongs in, where it belongs in another, else the key it may be a typo of."""

    error = ConfigError

    @classmethod
    def close_key(cls, key: str) -> str:
        owner = [name for name, section in SECTIONS.items() if section is not cls and key in section.names()]
        return f" (it belongs in [{owner[0]}])" if owner else super().close_key(key)


@dataclass(frozen=True)
class DataSection(Section):
    train: str = setting("mnist", help=(
        "Training data: `\"mnist\"`, a `.npz` with arrays `X` (and `y`), a `.csv` (features and a `label` column), "
        "or, with `data.features`, a table's directory or file URI."))
    test: str | None = setting(None, help=(
        "Test data, evaluated once at the end (the same forms; `\"mnist\"`: its 10,000 test images). Checked before "
        "training starts. none: no test."))
    mnist_dir: str | None = setting(None, help=(
        "Directory of the four MNIST `.gz` files. none: `$DBN_MNIST_DIR`, then a `shared/data/mnist` folder in or "
        "above the current directory, then `~/.cache/dbn/mnist` (`dbn mnist` downloads them there)."))
    limit: int | None = setting(None, help=(
        "Train on the first N rows only (not for tables: use `data.filter`). none: all rows."))
    features: str | tuple[str, ...] | None = setting(None, help=(
        "Set: `data.train` is a table read in place. Its feature columns: a name, a glob such as `\"pixel_*\"` "
        "(expanded in the table's order of columns, never the label), or a list of both (`[\"m_*\", \"age\"]`); a "
        "column is a number, an array or a Spark ML vector. The model keeps the columns it was trained on and reads "
        "them by name from later tables."))
    label: str | None = setting(None, help=(
        "The label column of a table or a `.csv` (a `.csv`'s default: `label`), or the label array of a `.npz` "
        "(default: `y`). Integers, strings or booleans; the classes are saved with the model."))
    filter: str | None = setting(None, help=(
        "A table's rows to train on: columns compared with literals, `in` a list, `is None` / `is not None` (null or "
        "NaN), joined by `and`, `or`, `not`, e.g. `\"year >= 2020 and country == 'NL'\"`; a column name that is not "
        "a Python name goes in backticks: `` \"`unit price` > 0\" ``."))
    test_filter: str | None = setting(None, help=(
        "The test table's rows, in the same form (`data.test` may name the training table)."))
    format: str = setting("parquet", help=(
        "A table's format: Parquet or ORC files (a folder as Spark or Hive writes it), a Delta Lake table "
        "(`\"delta\"`: the files its log lists at one version; the `delta` extra) or an Apache Iceberg table "
        "(`\"iceberg\"`: the files a snapshot lists, the table named by its folder, a metadata file or, with "
        "`data.catalog`, its name; the `iceberg` extra)."))
    version: int | str | None = setting(None, help=(
        "A Delta Lake table's version or an Iceberg table's snapshot id to train on, or a time as a string "
        "(`\"2026-11-27T10:00:00Z\"`, UTC unless it names its zone). Fixed when the job starts; also the test "
        "table's when `data.test` names the same table. none: the newest."))
    catalog: str | None = setting(None, help=(
        "With `data.format = \"iceberg\"`: the catalog whose tables `data.train` and `data.test` name "
        "(`\"db.table\"`), as pyiceberg's configuration describes it (`~/.pyiceberg.yaml` or "
        "`PYICEBERG_CATALOG__<NAME>__URI`: a Hive metastore, a REST or an SQL catalog). none: they are URIs."))
    metastore: str | None = setting(None, help=(
        "The Hive metastore (`\"thrift://HOST:9083\"`) in which `data.train` and `data.test` name tables as "
        "`\"db.table\"`: it gives their location, format (Parquet, ORC, Delta Lake, Apache Iceberg) and partitions "
        "(exactly the registered ones, wherever they are; the `hive` extra). none: `hive.metastore.uris` of the "
        "`hive-site.xml` in `HIVE_CONF_DIR` or `HADOOP_CONF_DIR`, used where a name has the form `db.table` and no "
        "file of that name is here."))
    allow_outside_files: bool = setting(False, help=(
        "Whether a Delta Lake log or an Apache Iceberg manifest may name data files outside the table's folder by an "
        "absolute path or URI (a Delta shallow clone's files, files an Iceberg table adopted with `add_files`). "
        "false: such a table is refused, naming the log or manifest file and the entry, before anything is read. A "
        "relative path that leads out of the folder is refused either way."))
    scale: str = setting("auto", help=(
        "Feature scaling by statistics of all training rows (the workers gather them), saved with the model so that "
        "it predicts from raw rows: `\"min_max\"` (to [0, 1]; later rows beyond the training range are clipped), "
        "`\"standard\"`, `\"none\"`. `\"auto\"`: standard for Gaussian visible units (any data); for Bernoulli units "
        "min-max for a table, none for other data (MNIST, `.npz`, `.csv`, shards: values outside [0, 1] are then an "
        "error)."))


_JOB_KEYS = ("seed", "device")  # DBN parameters that belong to [job], not [model]
_DBN_SIG = inspect.signature(DBN.__init__)
try:
    _DBN_HINTS = typing.get_type_hints(DBN.__init__)
except Exception:  # an annotation that cannot be evaluated here: fall back to the defaults' types
    _DBN_HINTS = {}


#: What each [model] setting means (the section is generated from DBN.__init__: its fields take these).
MODEL_HELP = {
    "hidden_layers": (
        "Hidden layer sizes; a softmax output layer is added."),
    "visible": (
        "The first layer's visible units: `\"bernoulli\"` (data in [0, 1]) or `\"gaussian\"` (standardised real "
        "values)."),
    "cd_k": (
        "Gibbs steps of contrastive divergence."),
    "persistent": (
        "Persistent CD: the chains carry over between minibatches."),
    "pretrain_epochs": (
        "RBM epochs per layer."),
    "pretrain_learning_rate": (
        "RBM learning rate, or a list of one per layer. none: 0.1, but 0.001 for a first layer of Gaussian visible "
        "units. Training that goes to NaN or infinity stops at that epoch, naming the layer and this setting."),
    "momentum": (
        "RBM momentum until epoch `momentum_epoch`."),
    "final_momentum": (
        "RBM momentum from epoch `momentum_epoch` on."),
    "momentum_epoch": (
        "The RBM epoch at which the momentum becomes `final_momentum`."),
    "weight_cost": (
        "L2 penalty on the RBM weights."),
    "pretrain_batch_size": (
        "RBM minibatch size. A job whose smallest shard makes fewer than 10 minibatches an epoch warns and suggests "
        "a smaller one."),
    "finetune_epochs": (
        "Backprop epochs. 0: pre-training only, an unsupervised feature extractor that needs no labels (`dbn "
        "transform`, `DBN.load(...).transform(rows)`), the same in one process, on the local mini-cluster and on "
        "YARN."),
    "finetune_learning_rate": (
        "Backprop learning rate."),
    "finetune_lr_decay": (
        "Multiplies the backprop learning rate after each epoch."),
    "finetune_momentum": (
        "Backprop momentum."),
    "finetune_final_momentum": (
        "The backprop momentum rises linearly from `finetune_momentum` to this over `finetune_momentum_epochs` "
        "epochs, then stays (Srivastava et al. 2014: 0.5 to 0.99). none: constant."),
    "finetune_momentum_epochs": (
        "The epochs over which the backprop momentum rises to `finetune_final_momentum`."),
    "finetune_weight_cost": (
        "L2 penalty during fine-tuning."),
    "max_norm": (
        "Fine-tuning keeps each unit's incoming weight vector at most this long (max-norm, used with dropout). 0: no "
        "bound."),
    "finetune_batch_size": (
        "Backprop minibatch size."),
    "top_layer_epochs": (
        "The first fine-tuning epochs, which train only the softmax layer (Hinton's backprop.m: 5)."),
    "n_classes": (
        "Classes of the softmax layer; a label outside 0..n_classes-1 is then an error naming its shard and row. "
        "none: from the labels."),
    "dropout": (
        "Drop probability of hidden units while fine-tuning."),
    "input_dropout": (
        "Drop probability of input units while fine-tuning."),
    "validation_fraction": (
        "Share of the training data held out to report the validation error each fine-tuning epoch. One process only "
        "(refused on workers): `cluster.validation` works anywhere."),
    "early_stopping_patience": (
        "Stop after this many fine-tuning epochs without a better validation error, keeping the best network (scored "
        "on `model.validation_fraction` in one process, or on `cluster.validation` anywhere). none: no early "
        "stopping."),
}


def _model_fields():
    fields = []
    for name, p in _DBN_SIG.parameters.items():
        if name in ("self", "callback", *_JOB_KEYS) or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        default = tuple(p.default) if isinstance(p.default, list) else p.default
        hint = _DBN_HINTS.get(name, type(default) if default is not None else Any)
        fields.append((name, hint, setting(default, help=MODEL_HELP.get(name, ""))))  # none: undescribed()
    return fields


ModelSection = dataclasses.make_dataclass("ModelSection", _model_fields(), bases=(Section,), frozen=True)
ModelSection.__module__ = __name__
ModelSection.__doc__ = "DBN hyperparameters (generated from DBN.__init__: same names and defaults)."


@dataclass(frozen=True)
class OutputSection(Section):
    dir: str | None = setting(None, help=(
        "Where everything is written. none: `runs/<job name>`."))
    mlflow: str | None = setting(None, help=(
        "An MLflow tracking server (`http://host:5000`) the run is recorded in: its settings as parameters, "
        "every step's figures as metrics, its files and the model as artifacts ([serving.md](serving.md)). A "
        "server that is down or slow never slows or fails the training. none: `$MLFLOW_TRACKING_URI`, else no "
        "tracking."))
    model_name: str | None = setting(None, help=(
        "Register the run's model in MLflow's model registry under this name (a new version each run), "
        "loadable as `models:/<name>/<version>`. none: not registered."))


@dataclass(frozen=True)
class ClusterSection(Section):
    workers: int = setting(0, help=(
        "0: one process. N: N data-parallel workers, one shard each, on a local mini-cluster (`--local N`) or in "
        "YARN containers."))
    processes: int = setting(0, help=(
        "Local mini-cluster: the OS processes that run the workers, each computing its shards in turn. 0: as many as "
        "pay on this machine's cores (10 workers run in 2 processes on 2 cores, in 10 on 8 or more; the model is the "
        "same bit for bit)."))
    threads_per_process: int = setting(0, help=(
        "Local mini-cluster: the BLAS threads of each worker process. 0: this machine's cores shared out over the "
        "processes. Set it to cap a job's cores on a shared machine."))
    shards: str | None = setting(None, help=(
        "A directory (or `hdfs://`, `s3://` URI) of Parquet shards to train on. none: `data.train` is cut into "
        "`OUT/shards`."))
    sync_every: int = setting(0, help=(
        "Minibatches between parameter averages. 0: once per epoch (the paper's setting)."))
    max_restarts: int = setting(3, help=(
        "Restarts allowed per worker before it is given up."))
    heartbeat_timeout: float = setting(10.0, help=(
        "Seconds of silence after which a worker is presumed lost. Past 100 workers the heartbeats slow down to 100 "
        "a second in all, and the timeout grows to at least 3 of their intervals (the progress says so)."))
    float16_wire: bool = setting(False, help=(
        "Send parameters as float16: half the bytes, not bit-exact."))
    shared_memory: bool = setting(True, help=(
        "Local mini-cluster: the master and the workers pass parameters and updates through files of a folder in "
        "`/dev/shm` the launcher makes and removes, not through gRPC's bytes. The same bits either way; false: gRPC. "
        "On YARN, gRPC."))
    block_momentum: float | None = setting(None, help=(
        "Fine-tuning: momentum over the averaged per-sync deltas (BMUF, Chen & Huo 2016). With one sync per epoch "
        "about 1 - 1/N restores one process's pace; with more frequent syncs it must be smaller. none: 1 - 1/N for N "
        "shards, at most 0.9 (0 with one). 0: plain averaging."))
    pretrain_block_momentum: float | None = setting(None, help=(
        "The same for RBM pre-training. none: 1 - 1/N, at most 0.7 (above 0.7 it compounds with the RBMs' own "
        "momentum)."))
    block_learning_rate: float = setting(1.0, help=(
        "Fine-tuning: each sync moves the parameters this many times the averaged delta (BMUF's block learning "
        "rate). 1: the average. Above 1 diverged in every measured setting."))
    pretrain_block_learning_rate: float = setting(1.0, help=(
        "The same for RBM pre-training."))
    block_nesterov: bool | None = setting(None, help=(
        "Both phases: the workers start from the block momentum's look-ahead point (BMUF's Nesterov variant). none: "
        "on wherever a block momentum is."))
    validation: str | None = setting(None, help=(
        "A labelled Parquet shard scored after each fine-tuning epoch, by the master or in one process "
        "(`valid_error` in the log; never trained on; its classes must be the training data's)."))
    stream: str = setting("auto", help=(
        "The workers' data: `\"auto\"` streams it from local disk when holding it would not fit the worker's memory "
        "(`yarn.worker_memory` on YARN, the machine's available memory locally); `\"always\"`; `\"never\"` "
        "([data.md](data.md), \"Data larger than memory\")."))
    reduce: str = setting("auto", help=(
        "Who averages the workers' updates: `\"master\"`; `\"workers\"`, each its own rows, so no machine moves more "
        "than a few copies of the model whatever the worker count; `\"auto\"`: the workers on YARN from 8 workers, "
        "else the master."))
    lost_shards: str = setting("redo", help=(
        "What a step does with the unfinished shards of a worker it lost (a crash, a container YARN preempted): "
        "`\"redo\"` has the live workers do them within the step, so that the model is bit-identical to an "
        "undisturbed run whatever comes and goes (a loss costs about one step's compute more; with `combine` on and "
        "several processes, to its last bits, which depend on where the shards are); `\"skip\"` goes on "
        "without them ([yarn.md](yarn.md), \"Shared queues\")."))
    combine: bool | None = setting(None, help=(
        "A worker process holding several shards sends the master one update for them, their sample-weighted mean, "
        "made where they were trained (on a GPU, on the device): one update's copy to the host and through the "
        "master instead of one a shard. One process holding every shard (one GPU): the same bits as one update a "
        "shard. Several: a group's mean rounds once more, so the model's last bits depend on which shards each "
        "process held (a sync's average within a few float32 ulps of the separate updates'); false: one update a "
        "shard, the same bits however the shards are spread. none: on where the workers train on a GPU "
        "(`job.device`, `yarn.worker_gpus`). Only where the master averages (`reduce`)."))
    ui: bool = setting(True, help=(
        "The live page while a distributed job runs: on 127.0.0.1 locally (its address is printed at the start), "
        "behind the tracking URL on YARN."))

    def block_settings(self, shards: int | None = None) -> dict:
        """The block momentum a job trains with. Unset settings follow N, the shards averaged
        (``shards``; unknown: the workers asked, one shard each):
        1 - 1/N (at most 0.9) for fine-tuning and 1 - 1/N (at most 0.7) for pre-training,
        Nesterov's variant wherever a block momentum is on. Plain averaging of N shards once
        per epoch makes N times fewer effective updates; these values gave one process's
        accuracy on MNIST (benchmarks/RESULTS.md, issue 14) and on scikit-learn's digits. One
        worker (or none): plain averaging."""
        n = max(self.workers if shards is None else shards, 1)
        momentum = self.block_momentum if self.block_momentum is not None else min(0.9, 1 - 1 / n)
        pretrain = self.pretrain_block_momentum if self.pretrain_block_momentum is not None else min(0.7, 1 - 1 / n)
        nesterov = self.block_nesterov if self.block_nesterov is not None else bool(momentum or pretrain)
        return {"block_momentum": momentum, "pretrain_block_momentum": pretrain, "block_nesterov": nesterov}


@dataclass(frozen=True)
class YarnSection(Section):
    """Resources and placement on YARN (``dbn submit``); the worker count is [cluster] workers."""

    queue: str = setting("default", help=(
        "YARN queue."))
    priority: int = setting(0, help=(
        "The application's priority in its queue: YARN schedules higher ones first (up to the cluster's "
        "`yarn.cluster.max-application-priority`, 0 by default: then only 0). Set after submitting with Hadoop's "
        "`yarn application -updatePriority`; `0` leaves the queue's default."))
    node_label: str = setting("", help=(
        "Run only on nodes with this label."))
    worker_memory: str = setting("4 GiB", help=(
        "Memory per worker container; YARN kills a container that exceeds it."))
    worker_vcores: int = setting(2, help=(
        "Virtual cores per worker container, also its BLAS threads."))
    worker_gpus: int = setting(0, help=(
        "`yarn.io/gpu` per worker container (Hadoop 3.1+ with GPU scheduling); > 0 trains with CuPy."))
    master_memory: str = setting("2 GiB", help=(
        "The application master's container."))
    max_attempts: int = setting(2, help=(
        "Application master attempts; a new attempt resumes from its submission's newest checkpoint."))
    locality_wait: float = setting(15.0, help=(
        "Seconds a worker container waits for a node holding its data (asked for strictly), then runs on any node. "
        "0: YARN's own locality delay decides, which on a small cluster gives a node up within a few heartbeats. GPU "
        "workers always leave it to YARN."))
    decommission_check: float = setting(30.0, help=(
        "Seconds between the application master's looks for nodes being decommissioned (`yarn rmadmin -refreshNodes "
        "-g`): a worker on such a node hands its shards to the others, leaves, and a container on another node takes "
        "its place, nothing counted, the model the same. Each look runs Hadoop's `yarn node -list` (a JVM start); "
        "`0`: never look (YARN ends those workers at the timeout, also nothing counted)."))
    min_workers: int = setting(0, help=(
        "Start the job once this many workers run, the others joining as YARN gives their containers (a busy queue); "
        "`0`: wait for all of `[cluster] workers`. `dbn scale` changes the count while the job runs "
        "([yarn.md](yarn.md), \"Shared queues\")."))
    start_timeout: float = setting(300.0, help=(
        "Seconds the job waits for `min_workers` (or, with `0`, one) worker to run; then it fails, saying what it "
        "waited for."))
    env: str | None = setting(None, help=(
        "A packed environment (`.tar.gz`, local or `hdfs://`) to ship. none: pack the current one."))
    python: str | None = setting(None, help=(
        "A Python installed on every node, used instead of shipping an environment."))
    file_systems: tuple[str, ...] = setting((), help=(
        "Extra HDFS name services the job touches (they get delegation tokens); those of the shards, tables and "
        "output are added."))
    principal: str | None = setting(None, help=(
        "Kerberos principal, with `yarn.keytab`. none: the ticket cache."))
    keytab: str | None = setting(None, help=(
        "Kerberos keytab file, with `yarn.principal`; it goes to the application master alone, which renews the "
        "job's delegation tokens."))


#: what a job's name may be: it names files and folders (runs/<name>, the YARN submission's
#: folder, the application), so one safe path component: letters, digits, _ . - + = , @ and
#: spaces, starting with a letter, digit or _ (never "/", "\\", ":", "..", a control character)
JOB_NAME = re.compile(r"[^\W][\w .+=,@-]{0,99}")


def name_problem(name) -> str | None:
    """Why ``name`` cannot be a job's name (None when it can)."""
    if not isinstance(name, str) or not JOB_NAME.fullmatch(name) or ".." in name or name != name.strip():
        return (f"{name!r} cannot name a job's files: use up to 100 letters, digits, spaces and _ . - + = , @ "
                f"(starting with a letter, digit or _; no '/', '\\', ':' or '..')")
    return None


@dataclass(frozen=True)
class JobSection(Section):
    name: str | None = setting(None, help=(
        "The run's name: up to 100 letters, digits, spaces and `_ . - + = , @`. none: the job file's name without "
        "`.toml` (`mnist` without a file)."))
    seed: int = setting(_DBN_SIG.parameters["seed"].default, help=(
        "Seed of initialisation, shuffling and sampling. A shard's seeds derive from (seed, step, shard), so the "
        "model does not depend on which process ran which shard."))
    device: str = setting(_DBN_SIG.parameters["device"].default, help=(
        "Where the workers train; `\"auto\"`: the GPU when CuPy sees one."))

    def __post_init__(self):
        problem = None if self.name is None else name_problem(self.name)
        if problem:  # the last guard: load_spec names the file or option at fault before this
            raise ConfigError(f"[job] name {problem}")


SECTIONS = {"data": DataSection, "model": ModelSection, "output": OutputSection, "job": JobSection,
            "cluster": ClusterSection, "yarn": YarnSection}
#: the values a setting may take, where they are few
CHOICES = {("data", "format"): FORMATS, ("data", "scale"): SCALINGS, ("model", "visible"): VISIBLE_UNITS,
           ("job", "device"): DEVICES, ("cluster", "stream"): STREAM_CHOICES,
           ("cluster", "reduce"): ("auto", *REDUCE_CHOICES), ("cluster", "lost_shards"): LOST_SHARDS_CHOICES}

_AT_LEAST_ONE = {"cd_k", "pretrain_batch_size", "finetune_batch_size"}
#: The most epochs of a phase (the paper's runs take 50-200): a run's schedule of steps is held in memory.
MAX_EPOCHS = 100_000


def check_setting(origin: str, section: str, key: str, value, parse_strings: bool = False):
    """Check one setting of the job file (``origin``: the file, or "command line") against its
    section's field type; return the value to store. With ``parse_strings``, a string is read as
    the command line writes values (``"5"``, ``"[500, 500]"``, ``"none"``)."""
    cls = SECTIONS[section]
    where = f"{origin}: [{section}]"
    cls.check_keys({key: value}, where, required=False)
    hint = typing.get_type_hints(cls)[key]
    if parse_strings and isinstance(value, str) and value.lower() in ("none", "null") and accepts(hint, type(None)):
        value = None  # --set data.test=none unsets an optional key, string settings included
    elif parse_strings and isinstance(value, str) and not accepts(hint, str):
        value = parse_literal(value, accepts(hint, type(None)))
        if hint is tuple and isinstance(value, int):  # --layers 500: one hidden layer
            value = [value]
    elif parse_strings and isinstance(value, str) and value[:1] in ("'", '"'):
        value = quoted(value)
    try:
        value = convert(value, hint)
    except TypeError as exc:
        raise ConfigError(f"{where} {key}: expected {exc}, got {describe_value(value)}") from None
    if any(isinstance(v, float) and not math.isfinite(v) for v in (value if isinstance(value, (list, tuple)) else [value])):
        raise ConfigError(f"{where} {key}: must be a finite number, got {describe_value(value)}")
    if section == "model" and key.endswith("_epochs") and type(value) is int and value > MAX_EPOCHS:
        raise ConfigError(f"{where} {key}: at most {MAX_EPOCHS:,} epochs (the run's schedule is held in memory), "
                          f"got {value:,}")
    if (section, key) == ("job", "name") and value is not None and name_problem(value):
        raise ConfigError(f"{where} name: {name_problem(value)}")
    choices = CHOICES.get((section, key))
    if choices is not None and value not in choices:
        raise ConfigError(f"{where} {key}: must be one of {', '.join(map(repr, choices))}, got {value!r}")
    if key in ("workers", "processes", "threads_per_process", "sync_every", "max_restarts", "worker_gpus") and value < 0:
        raise ConfigError(f"{where} {key}: must be >= 0, got {value!r}")
    if key in ("worker_vcores", "max_attempts") and value < 1:
        raise ConfigError(f"{where} {key}: must be >= 1, got {value!r}")
    if key in ("block_momentum", "pretrain_block_momentum") and value is not None and not 0 <= value < 1:
        raise ConfigError(f"{where} {key}: must be in [0, 1), got {value!r}")
    if key in ("block_learning_rate", "pretrain_block_learning_rate") and not value > 0:
        raise ConfigError(f"{where} {key}: must be > 0 (1: the plain average's step), got {value!r}")
    if key == "decommission_check" and value < 0:
        raise ConfigError(f"{where} {key}: must be >= 0 seconds (0: never look), got {value!r}")
    if key == "locality_wait" and value < 0:
        raise ConfigError(f"{where} {key}: must be >= 0 seconds (0: YARN's own locality delay), got {value!r}")
    if key == "heartbeat_timeout" and value <= 0:
        raise ConfigError(f"{where} {key}: must be a positive number of seconds, got {value!r}")
    if key == "limit" and value is not None and value < 1:
        raise ConfigError(f"{where} {key}: must be a positive number of rows, got {value!r}")
    if section == "model" and type(value) is int:  # counts and sizes (DBN checks rates itself)
        low = 1 if key in _AT_LEAST_ONE else 0
        if value < low:
            raise ConfigError(f"{where} {key}: must be >= {low}, got {value!r}")
    return value
