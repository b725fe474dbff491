"""The job spec: one TOML file describes a whole training job.

::

    [data]
    train = "mnist"            # "mnist", a .npz (X, y), a .csv or Parquet file; or a table (with features)
    test = "mnist"             # optional, same forms ("mnist" = the 10,000 test images)
    mnist_dir = "~/mnist"      # optional: where the MNIST files are (else found)
    limit = 10000              # optional: train on the first N rows only
    # features = ["pixel_*"]   # a table's feature columns: train is then a table read in place
    # label = "digit"          # its label column; filter = "split == 'train'" its rows

    [model]                    # any DBN hyperparameter except callback, seed, device
    hidden_layers = [500, 500, 2000]
    pretrain_epochs = 50

    [output]
    dir = "runs/mnist"         # default "runs/<job name>"

    [job]
    name = "mnist"             # default: the config file's name without .toml
    seed = 0
    device = "auto"            # "cpu", "gpu" or "auto"

    [cluster]                  # distributed training (see ClusterSection for every key)
    workers = 10               # 10 data-parallel workers on a local mini-cluster (0: one process)
    sync_every = 0             # average every k minibatches; 0: once per epoch

Every key, its type, default and meaning: docs/settings.md (generated from these sections).
The ``[model]`` section is generated from the signature of :class:`dbn.DBN`, so
its keys and defaults are DBN's own. ``seed`` and ``device`` live in ``[job]``.
Relative paths under ``[data]`` are relative to the config file; ``output.dir``
is relative to the current directory. Unknown keys and wrong types raise
:class:`ConfigError` naming the file, the section and the key.
"""

from __future__ import annotations

import dataclasses
import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from iterreduce.master.config import MasterConfig
from iterreduce.redact import redact_all
from iterreduce.specification import Specification, did_you_mean
from shardio.metastore import table_name

from ..data.training import TrainingData, training_data
from ..data.validation import counted
from ..errors import ConfigError
from ..model.backend import gpu_available
from ..model.estimator import DBN
from .hints import describe_value
from .sections import (SECTIONS, ClusterSection, DataSection, JobSection, ModelSection, OutputSection, YarnSection,
                       check_setting, name_problem)

#: The IterativeReduce program that trains a DBN (see dbn/jobs/dbn_program.py).
PROGRAM = "dbn.jobs.dbn_program:DBNProgram"

__all__ = [
    "ConfigError", "DataSection", "ModelSection", "OutputSection", "JobSection", "ClusterSection", "YarnSection", "JobSpec",
    "PAPER", "QUICK", "load_recipe", "load_spec", "parse_override",
]


# ------------------------------------------------------------------ the spec


#: ``[cluster] reduce = "auto"`` has the workers reduce on YARN from this many workers: a star's
#: master moves every worker's update, the workers a fixed share each (benchmarks/RESULTS.md).
#: On the local mini-cluster all processes share one machine's cores, so the master reduces.
REDUCE_ON_WORKERS_FROM = 8
_PATH_KEYS = {("data", "train"), ("data", "test"), ("data", "mnist_dir"), ("yarn", "keytab")}

#: Settings that say where or how a job runs, not what it trains: a run whose config.json
#: differs from the job only in these is still a run of the same job.
NOT_THE_JOB = ("source", "output.dir", "output.mlflow", "output.model_name", "cluster.max_restarts", "cluster.heartbeat_timeout", "cluster.lost_shards", "cluster.shared_memory",
               "yarn")


@dataclass(frozen=True)
class JobSpec(Specification):
    """A whole training job: what to train on, the model, where it runs and where results go.

    Declarative like skein's ``ApplicationSpec``: build it with :func:`load_spec` (a TOML
    file) or :meth:`from_dict`, serialise it with :meth:`to_dict` / :meth:`to_toml`; every
    value is checked once, on the way in, with errors naming the file, section and key.
    """

    data: DataSection
    model: ModelSection
    output: OutputSection
    job: JobSection
    cluster: ClusterSection
    yarn: YarnSection = YarnSection()
    source: str | None = None  # the config file, None for the built-in default

    @classmethod
    def from_dict(cls, doc: dict, *, origin: str = "job spec", base: Path | None = None,
                  overrides: dict[str, Any] | None = None) -> "JobSpec":
        """A spec from sections of keys (``{"model": {"pretrain_epochs": 5}, ...}``, as
        :meth:`to_dict` writes them); ``base`` resolves relative data paths; ``overrides``
        (dotted keys, strings parsed as on the command line) are applied last."""
        values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        doc = dict(doc)
        source = doc.pop("source", None)
        for section, table in doc.items():
            if section not in SECTIONS:
                raise ConfigError(f"{origin}: unknown section [{section}]{did_you_mean(section, SECTIONS)}")
            if not isinstance(table, dict):
                raise ConfigError(f"{origin}: '{section}' must be a [{section}] table, got {describe_value(table)}")
            for key, value in table.items():
                value = check_setting(origin, section, key, value)
                named = key in ("train", "test") and isinstance(value, str) and (  # a table's name in a catalog
                    table.get("catalog") is not None or table_name(value, base) is not None)  # or a metastore
                if (base is not None and (section, key) in _PATH_KEYS and value is not None and value != "mnist"
                        and "://" not in value and not named):  # a URI (hdfs://, s3://, file://) is absolute
                    value = str(base / Path(value).expanduser())
                values[section][key] = value
        for dotted, value in (overrides or {}).items():
            section, _, key = dotted.partition(".")
            if section not in SECTIONS or not key:
                raise ConfigError(
                    f"override {dotted!r}: keys look like section.key with section one of "
                    f"{', '.join(SECTIONS)}{did_you_mean(section, SECTIONS)}"
                )
            values[section][key] = check_setting("command line", section, key, value, parse_strings=True)
        job = values["job"]
        if "name" not in job:
            job["name"] = Path(source).stem if source else "mnist"
            problem = name_problem(job["name"])
            if problem:
                raise ConfigError(f"{origin}: [job] name: the job file's name {problem}; set [job] name")
        values["output"].setdefault("dir", str(Path("runs") / job["name"]))
        spec = cls(**{name: kind(**values[name]) for name, kind in SECTIONS.items()}, source=source)
        try:
            DBN(**spec.dbn_params()).validate_params()
        except ValueError as exc:
            # Whose value is it? The file's when the file alone is already wrong, else the command line's.
            where = origin
            if overrides:
                try:
                    cls.from_dict({**doc, **({"source": source} if source else {})}, origin=origin, base=base)
                    where = "command line"
                except ConfigError:
                    pass
            # DBN's messages start with the parameter's name; seed and device live in [job].
            section = "job" if str(exc).split(" ", 1)[0] in ("seed", "device") else "model"
            raise ConfigError(f"{where}: [{section}] {exc}") from None
        return spec

    def public_dict(self) -> dict:
        """:meth:`to_dict` with any password in a URI hidden (:func:`iterreduce.redact.redact_all`): what
        the project keeps and shows of the job (``config.json``, the log, a tracking server's parameters)."""
        return redact_all(self.to_dict())

    def to_toml(self) -> str:
        """The spec as a job file that :func:`load_spec` reads back (unset values left out)."""
        doc = {section: {k: v for k, v in table.items() if v is not None}
               for section, table in self.to_dict().items() if section != "source"}
        return tomli_w.dumps(doc)

    def replace(self, **changes: dict) -> "JobSpec":
        """A copy with some keys of some sections changed: ``spec.replace(data={"limit": 10})``."""
        doc = self.to_dict()
        for section, table in changes.items():
            doc[section] = {**doc[section], **table}
        return JobSpec.from_dict(doc, origin=self.source or "job spec")

    @property
    def fine_tunes(self) -> bool:
        """Whether the job fine-tunes a classifier, and so needs labels (:attr:`dbn.DBN.fine_tunes`);
        else it pre-trains only."""
        return DBN(**self.dbn_params()).fine_tunes

    def dbn_params(self) -> dict:
        """Keyword arguments for ``DBN(...)`` (without callback)."""
        params = dataclasses.asdict(self.model)
        params["hidden_layers"] = list(params["hidden_layers"])
        if isinstance(params["pretrain_learning_rate"], tuple):
            params["pretrain_learning_rate"] = list(params["pretrain_learning_rate"])
        return {**params, "device": self.job.device, "seed": self.job.seed}

    def inputs(self) -> dict[str, str]:
        """The job's data that lies at a path or URI, by setting (``data.train``, ``data.test``,
        ``cluster.shards``, ``cluster.validation``): not MNIST, nor a table named in a catalog or a
        metastore."""
        found = {"data.train": self.data.train, "data.test": self.data.test, "cluster.shards": self.cluster.shards,
                 "cluster.validation": self.cluster.validation}
        named = self.data.catalog is not None
        return {key: value for key, value in found.items() if value and value != "mnist" and not (
            key.startswith("data.") and (named or table_name(value) is not None))}

    def check_inputs_outside(self, out: str, rewritten: tuple[str, ...]) -> None:
        """Refuse the job (:class:`~iterreduce.exceptions.InputInsideOutput`, naming the setting and
        the entry) when its data lies in what a run into ``out`` rewrites: the entries ``rewritten``
        there, and ``shards`` (where the data is cut into shards), except for ``[cluster] shards``,
        which is read there and never rewritten."""
        from iterreduce.storage import ownership

        inputs = self.inputs()
        shards = {"cluster.shards": inputs.pop("cluster.shards")} if "cluster.shards" in inputs else {}
        ownership.check_inputs_outside(inputs, out, (*rewritten, SHARDS_FOLDER))
        ownership.check_inputs_outside(shards, out, rewritten)

    def master_config(self, *, shards, output: str, token: str = "", stream: bool = False,
                      on_yarn: bool = False, n_shards: int | None = None) -> MasterConfig:
        """The runtime's part of this job: the master's configuration for ``shards`` (a list of
        shard URIs, or a directory URI whose shards number ``n_shards`` when known) writing to
        ``output``, its workers streaming their data from local disk or not
        (:func:`dbn.jobs.memory_plan.plan` decides), on YARN or on the local mini-cluster. The
        token is the launcher's to set (it never goes into a file)."""
        self.check_distributed()
        c = self.cluster
        n_shards = len(shards) if isinstance(shards, (list, tuple)) else n_shards
        return MasterConfig(program=PROGRAM, program_config=self.program_config(stream, n_shards), shards=shards,
                            workers=c.workers, token=token, output=output, seed=self.job.seed,
                            heartbeat_timeout=c.heartbeat_timeout, float16_wire=c.float16_wire,
                            reduce=self.reduce_on(on_yarn), lost_shards=c.lost_shards, combine=self.combines(on_yarn),
                            name=self.job.name or "", ui=c.ui,
                            **({"min_workers": min(self.yarn.min_workers, c.workers),
                                "start_timeout": self.yarn.start_timeout} if on_yarn else {}))

    def combines(self, on_yarn: bool) -> bool:
        """Whether a worker holding several shards sends one update for them (``[cluster] combine``;
        unset: where the workers train on a GPU, whose copies to the host and the master's average of
        one update a shard were half of a one-GPU job's time)."""
        if self.cluster.combine is not None:
            return self.cluster.combine
        if on_yarn:
            return self.yarn.worker_gpus > 0
        return self.job.device != "cpu" and gpu_available()

    def differs_from(self, earlier: dict) -> str | None:
        """Why an earlier run's ``config.json`` (``earlier``, as :meth:`to_dict` wrote it) is of
        another job than this one, e.g. "its config.json differs: model.pretrain_epochs 5 there,
        10 here"; None when it is this job. Settings in :data:`NOT_THE_JOB` do not count."""
        def counts(key: str) -> bool:
            return not any(key == name or key.startswith(f"{name}.") for name in NOT_THE_JOB)

        a, b = dotted(earlier), dotted(self.public_dict())  # config.json holds the public view
        differ = [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if counts(k) and a.get(k) != b.get(k)]
        if not differ:
            return None
        shown = "; ".join(f"{key} {there!r} there, {here!r} here" for key, there, here in differ[:3])
        more = f" and {len(differ) - 3} more" if len(differ) > 3 else ""
        return f"its config.json differs: {shown}{more}"

    def why_fewer_shards(self, shards: int) -> str | None:
        """Why the job trains on fewer workers than ``[cluster] workers``, when its data makes
        only ``shards`` shards (one worker each): e.g. "1 shard for the 3 workers asked (...)"."""
        workers = self.cluster.workers
        if shards >= workers:
            return None
        return f"{counted(shards, 'shard')} for the {workers} workers asked ({self.training_data.why_fewer(shards)})"

    def check_distributed(self) -> None:
        """Refuse the ``[model]`` settings workers cannot honour, rather than ignore them: held-out
        rows (a distributed job scores ``[cluster] validation``, a shard, after each fine-tuning
        epoch), early stopping without that shard, and fine-tuning on a table whose label
        column is not named."""
        m, where = self.model, self.source or "the job"
        if m.validation_fraction:
            raise ConfigError(f"{where}: [model] validation_fraction = {m.validation_fraction} holds out rows in "
                              f"one process only: on workers name a labelled validation shard in [cluster] "
                              f"validation (e.g. cut by `dbn shard`), or train in one process (no --local)")
        if self.training_data.in_place and self.data.label is None \
                and self.fine_tunes:  # known before the table's shares are written
            raise ConfigError(f"{where}: the table {self.data.train} has no label column named ([data] label), "
                              f"but fine-tuning needs labels ([model] finetune_epochs = 0 pre-trains only)")
        y = self.yarn
        if not 0 <= y.min_workers <= max(1, self.cluster.workers):
            raise ConfigError(f"{where}: [yarn] min_workers = {y.min_workers}: expected 0 to [cluster] workers "
                              f"({self.cluster.workers})")
        if y.priority < 0:
            raise ConfigError(f"{where}: [yarn] priority = {y.priority}: expected 0 (the queue's default) or more")
        if y.start_timeout <= 0:
            raise ConfigError(f"{where}: [yarn] start_timeout = {y.start_timeout}: expected seconds > 0")
        if m.early_stopping_patience is not None and not self.cluster.validation:
            raise ConfigError(f"{where}: [model] early_stopping_patience needs a validation set: on workers name a "
                              f"labelled shard in [cluster] validation (scored after each fine-tuning epoch)")

    def reduce_on(self, on_yarn: bool) -> str:
        """Who reduces the updates (``MasterConfig.reduce``): ``[cluster] reduce``, with "auto"
        resolved for YARN or the local mini-cluster (see :data:`REDUCE_ON_WORKERS_FROM`)."""
        if self.cluster.reduce != "auto":
            return self.cluster.reduce
        return "workers" if on_yarn and self.cluster.workers >= REDUCE_ON_WORKERS_FROM else "master"

    def program_config(self, stream: bool = False, n_shards: int | None = None) -> dict:
        """The DBN program's configuration for the runtime on ``n_shards`` shards (unknown: one a
        worker); ``[model] n_classes`` unset: the master counts the classes in the shards'
        labels when the job starts."""
        params = {k: v for k, v in self.dbn_params().items() if k != "device"}
        c = self.cluster
        return {**params, "sync_every": c.sync_every, **c.block_settings(n_shards), "block_learning_rate": c.block_learning_rate,
                "pretrain_block_learning_rate": c.pretrain_block_learning_rate, "validation": c.validation,
                "stream": stream, "scale": self.scaling()}

    def scaling(self) -> str | None:
        """How the features are scaled before training (the workers gather the statistics in a
        distributed job), and the scaler saved with the model: ``[data] scale`` for this job's
        data (:meth:`dbn.data.training.TrainingData.scaling`), None for none."""
        return self.training_data.scaling()

    @functools.cached_property
    def training_data(self) -> TrainingData:
        """The job's :class:`~dbn.data.training.TrainingData` (shards, a table read in place or a data
        file), decided once for this spec: every path of the job asks the same one."""
        return training_data(self)


#: The folder of a run's output in which its data is cut into shards (when it is not shards already).
SHARDS_FOLDER = "shards"


def dotted(settings, prefix: str = "") -> dict:
    """Sections of settings (``JobSpec.to_dict()``'s, or a ``config.json``'s) as one dict of
    ``section.key`` names; what is not a dict has none."""
    items = {}
    for key, value in (settings.items() if isinstance(settings, dict) else ()):
        if isinstance(value, dict):
            items.update(dotted(value, f"{prefix}{key}."))
        else:
            items[f"{prefix}{key}"] = value
    return items


#: The paper's run (784-500-500-2000-10 on MNIST), used when no config file is given;
#: the same as examples/mnist.toml. Fine-tuning as in benchmarks/mnist_accuracy.py.
PAPER: dict[str, Any] = {
    "data.train": "mnist",
    "data.test": "mnist",
    "model.hidden_layers": [500, 500, 2000],
    "model.pretrain_epochs": 50,
    "model.finetune_epochs": 100,
    "model.finetune_learning_rate": 0.1,
    "model.finetune_lr_decay": 0.98,
    "model.dropout": 0.5,
    "model.input_dropout": 0.2,
}

#: ``--quick`` (dbn train and dbn mnist): a reduced run of a few minutes on 2 cores, as examples/quick.toml.
QUICK: dict[str, Any] = {
    "data.limit": 20000,
    "model.pretrain_epochs": 20,
    "model.finetune_epochs": 30,
}


# ------------------------------------------------------------------- loading


def load_spec(path=None, overrides: dict[str, Any] | None = None, *, quick: bool = False) -> JobSpec:
    """Read a TOML job file (or the built-in PAPER job when ``path`` is None) and apply overrides.

    ``quick`` applies the QUICK preset first and, when the output folder is the default
    ``runs/<name>``, writes to ``runs/<name>-quick`` instead, apart from full runs.

    ``overrides`` maps dotted keys to values, e.g. ``{"model.pretrain_epochs": 5}``.
    String values (from the command line) are parsed as TOML literals when the key
    is not a string setting: ``"5"`` -> 5, ``"[500, 500]"`` or ``"500,500"`` -> a list,
    ``"none"`` -> unset for optional keys.
    """
    if quick:
        spec = load_spec(path, {**QUICK, **(overrides or {})})
        if spec.output.dir == str(Path("runs") / spec.job.name):
            spec = spec.replace(output={"dir": str(Path("runs") / f"{spec.job.name}-quick")})
        return spec
    if path is None:
        doc: dict = {}
        for dotted, value in PAPER.items():
            section, key = dotted.split(".", 1)
            doc.setdefault(section, {})[key] = value
        return JobSpec.from_dict(doc, origin="default config", overrides=overrides)
    path = Path(path)
    doc = _read_toml(path)
    if "source" in doc:
        raise ConfigError(f"{path}: unknown section [source]")
    return JobSpec.from_dict({**doc, "source": str(path)}, origin=str(path),
                             base=path.expanduser().resolve().parent, overrides=overrides)


def load_recipe(path) -> dict[str, Any]:
    """The ``[model]`` settings of a TOML file as dotted overrides (``{"model.finetune_epochs": 200}``),
    each checked: a training recipe that ``dbn mnist --recipe`` applies over its own defaults.

    A recipe holds ``[model]`` only: the data, workers and output are the command's. A
    complete job file (``dbn train``'s) is accepted, and its other sections are ignored, so
    one file serves both commands; a file without ``[model]`` is refused.
    """
    path = Path(path)
    doc = _read_toml(path)
    table = doc.get("model")
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{path}: a recipe needs a [model] table of settings (found: "
                          f"{', '.join(f'[{name}]' for name in doc) or 'nothing'})")
    return {f"model.{key}": check_setting(str(path), "model", key, value) for key, value in table.items()}


#: the largest job file read: a job file is a few hundred bytes of settings
MAX_JOB_FILE_BYTES = 1 << 20


def _read_toml(path: Path) -> dict:
    """The TOML document at ``path``; any bytes give a dict or a :class:`ConfigError` naming the file."""
    try:
        with open(path.expanduser(), "rb") as f:
            data = f.read(MAX_JOB_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}") from None
    if len(data) > MAX_JOB_FILE_BYTES:
        raise ConfigError(f"{path}: more than {MAX_JOB_FILE_BYTES} bytes: too large for a job file")
    try:
        return tomllib.loads(data.decode())
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file: {exc.reason}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except (RecursionError, MemoryError, ValueError) as exc:  # arrays nested thousands deep, a 5000-digit integer
        raise ConfigError(f"{path}: invalid TOML: {'nested too deep' if not isinstance(exc, ValueError) else exc}"
                          ) from None


def parse_override(item: str) -> tuple[str, str]:
    """``"model.dropout=0.5"`` -> ``("model.dropout", "0.5")``."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. model.pretrain_epochs=5")
    return key.strip(), value.strip()
