"""One run path: ``run(spec, launcher)`` trains a job, tests it once and writes ``result.json``.

The launcher decides where the training happens; everything around it (the
output folder, ``config.json``, loading the model, the test error, the result)
is the same for all three:

- :class:`InProcess`: a :class:`dbn.DBN` in this process (``dbn train``);
- :class:`MiniCluster`: the IterativeReduce master and N worker processes on this
  machine (``dbn train --local N``, ``dbn mnist``);
- :class:`Yarn`: the same master and workers in YARN containers, followed to the end,
  with the model and log fetched into the local output folder (``dbn mnist --yarn``).

Each launcher's ``train(spec, out, on_record)`` leaves ``model.npz`` and ``log.jsonl``
in ``out`` and returns its figures (timings, sizes); ``on_record`` sees a ``start``
event (``where`` the job runs, its ``output``), then every record of the log as it is
written.

An output folder is one job's (:func:`claim_output`): a run refuses a folder that holds a
run of another job unless asked to overwrite it, and a new run never destroys the earlier
run's files before it has its own: they are kept in ``OUT/previous/N/``. Only files a run
wrote (its run record proves it, :mod:`iterreduce.storage.ownership`) are ever moved or deleted, and
a run holds the folder's lock from start to end: a second run into it is refused at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from iterreduce.exceptions import MasterKilled
from iterreduce.launch.local import StopSignal, gpu_count, local_processes, run_local
from iterreduce.process.memory import available_memory
from iterreduce.storage import ownership, runlog
from iterreduce.storage.filesystems import filesystem, join
from iterreduce.storage.ownership import PREVIOUS, RUN_FILES, prune_previous, set_aside
from shardio.readers import list_shards, shard_info
from shardio.shards import set_shard_note, shard_note

from .. import __version__
from ..data.sharding import load_dataset, load_validation
from ..data.table_data import attach_inputs
from ..data.training import ScoredRows, scored_rows
from ..data.validation import class_warnings, counted, minibatch_warnings
from ..errors import ConfigError, DataError, ModelFileError, UsageError
from ..model.backend import check_environment, resolve_device
from ..model.estimator import DBN
from ..model.persist import atomic_write
from .memory_plan import check_one_process, plan as plan_memory
from .figures import commit, device_name, flop_figures, phase_timings
from .spec import SHARDS_FOLDER, JobSpec
from .tracking import Tracker, tracker_for

MODEL_FILE, RESULT_FILE, CONFIG_FILE = "model.npz", "result.json", "config.json"
#: Every name a run writes in its output folder: none may be a file the project cannot prove its own.
RUN_NAMES = (CONFIG_FILE, MODEL_FILE, RESULT_FILE, *RUN_FILES)
#: What a run may delete, move or overwrite in its output folder: its names, and earlier runs kept aside.
REWRITTEN = (*RUN_NAMES, PREVIOUS)

OnRecord = Callable[[dict], None]


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or a stop signal, ``signum``) during training; ``hint`` says what was kept and how to go on."""

    def __init__(self, hint: str, signum: int = signal.SIGINT):
        super().__init__(hint)
        self.hint, self.signum = hint, signum

    @property
    def how(self) -> str:
        """What stopped the run, in a few words: ``Ctrl-C``, ``SIGTERM``, ``SIGHUP``."""
        return "Ctrl-C" if self.signum == signal.SIGINT else signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process a signal ended."""
        return 128 + self.signum


class Launcher(Protocol):
    """Where a job trains (see the module docstring)."""

    #: a few words for the result's ``on``
    where: str
    #: True when this process writes the log (the run's summary then ends it); a master's
    #: log is the master's own and ends with its ``done`` event
    writes_log: bool
    #: True when the run continues a killed run from its newest checkpoint (``--resume``)
    resume: bool
    #: True when training runs on this machine, so that its sgemm rate bounds the training time
    trains_here: bool
    #: True when the job's master records the run in MLflow itself (it runs on when nobody waits for
    #: it: a YARN application master); this side then learns only the run's link
    tracks_in_master: bool

    def output_dir(self, spec: JobSpec) -> str:
        """The local folder that gets model.npz, log.jsonl, config.json and result.json."""

    def describe(self, spec: JobSpec) -> str:
        """Where ``spec`` trains, in a few words for a person."""

    def train(self, spec: JobSpec, out: Path, on_record: OnRecord) -> dict:
        """Train ``spec``; leave model.npz and log.jsonl in ``out``; return the run's figures."""


# ------------------------------------------------------------------ the run


def run(spec: JobSpec, launcher: Launcher, *, on_record: OnRecord | None = None,
        extra: dict | None = None, overwrite: bool = False) -> dict:
    """Train ``spec`` with ``launcher``, test the model once on ``[data] test``, write
    ``result.json`` (and ``config.json``) to ``[output] dir``; returns the result.

    ``extra`` adds keys to the result (e.g. the MNIST evaluation's validation size).
    ``overwrite`` lets the run replace another job's run in the output folder (see
    :func:`claim_output`). The run holds the folder's lock (:func:`iterreduce.storage.ownership.hold`)
    throughout: a second run into it is refused at once, naming the folder and the holder.
    """
    check_environment()
    tracker = tracker_for(spec, in_master=launcher.tracks_in_master)  # before anything is written
    out = local_folder(launcher.output_dir(spec))
    spec.check_inputs_outside(str(out), REWRITTEN)  # before anything is written
    made = _first_missing(out)
    check_folder(out)
    new_lock = not os.path.lexists(out / ownership.LOCK_NAME)
    with ownership.hold(out):  # first: a second run is refused before it reads any data
        try:
            check_test_data(spec)
        except Exception:
            if made is not None:  # made for the lock alone: leave no trace, and nothing that is not ours
                (out / ownership.LOCK_NAME).unlink(missing_ok=True)
                with contextlib.suppress(OSError):
                    out.rmdir()
                _unmake_parents(out, made)
            raise
        try:
            result = _run(spec, launcher, out, made, on_record=on_record, extra=extra, overwrite=overwrite,
                          tracker=tracker, new_lock=new_lock)
        except BaseException as exc:
            tracker.finish(None, out, error=exc)
            raise
        finally:
            ownership.settle(out, RUN_NAMES)
        tracker.finish(result, out)
        # where the run is shown (known once the tracking server answered): said, not kept in result.json
        return {**result, "mlflow_run": tracker.link} if tracker.link else result


def _first_missing(path: Path) -> Path | None:
    """The topmost of ``path`` and its parents that does not exist yet: what a run there makes
    (``runs/`` too, for ``runs/<name>``); None when ``path`` exists."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


def _unmake_parents(out: Path, made: Path) -> None:
    """Remove the folders above ``out`` this run made, up to ``made``, each only while empty."""
    for folder in out.parents:
        if not folder.is_relative_to(made):
            break
        with contextlib.suppress(OSError):
            folder.rmdir()


def _run(spec: JobSpec, launcher: Launcher, out: Path, made: Path | None, *, on_record: OnRecord | None,
         extra: dict | None, overwrite: bool, tracker: Tracker, new_lock: bool = False) -> dict:
    """:func:`run` in the output folder ``out`` (``made``: the topmost folder this run made for it,
    None when it was there), its lock held (``new_lock``: made by this run), recorded by ``tracker``
    as it goes."""
    try:
        claim_output(out, spec, resume=launcher.resume, overwrite=overwrite)
    except Exception:  # refused: a folder of someone else's keeps no lock of this run's
        if new_lock:
            (out / ownership.LOCK_NAME).unlink(missing_ok=True)
        raise
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / CONFIG_FILE, spec.public_dict())
    tracker.start(spec, out)
    told = on_record or (lambda record: None)

    def on_record(record: dict) -> None:  # the tracker sees each record, then the caller
        tracker.record(record)
        told(record)

    code = commit()  # the code that trains: the checkout may move on during a long run
    start = time.perf_counter()
    try:
        # What the job reads, fixed for the run (a table's version): config.json keeps the job as asked.
        earlier = shard_note(str(out / "shards"), SHARDS_SOURCE) if launcher.resume and (out / "shards").is_dir() \
            else None
        spec = spec.training_data.spec_for_run(earlier)
        figures = launcher.train(spec, out, on_record)
    except Exception:
        if made is not None and _nothing_but_config(out):
            shutil.rmtree(out)  # bad input, found before anything was written: leave no trace
            _unmake_parents(out, made)
        raise
    train_seconds = time.perf_counter() - start
    model = DBN.load(out / MODEL_FILE, device="cpu")
    # Where other machines train (YARN), this one's sgemm rate says nothing of their limit.
    flop_result = flop_figures(out, model, spec, train_seconds, measure=launcher.trains_here)
    n_test, test_error = None, None
    if spec.data.test is not None and model.network_ is not None:  # pre-training only: nothing to test
        tested = evaluate_model(model, spec.data.test, rows=scored_rows(spec.data))
        n_test, test_error = tested["n_samples"], tested["test_error"]
    result = {
        "name": spec.job.name, "on": launcher.where, "test_error": test_error, "n_test": n_test,
        "layers": [model.n_features_in_, *model.hidden_layers, model.learned("n_classes_")],
        "epochs": {"pretrain": spec.model.pretrain_epochs, "finetune": spec.model.finetune_epochs},
        "wall_seconds": time.perf_counter() - start, **figures,
        "seed": spec.job.seed, "device": resolve_device(spec.job.device), "device_name": device_name(spec.job.device),
        "workers": spec.cluster.workers, "sync_every": spec.cluster.sync_every,
        "block_momentum": spec.cluster.block_settings(figures.get("shards"))["block_momentum"],
        "model": str(out / MODEL_FILE),
        **flop_result,
        "params": spec.dbn_params(), "version": __version__, "commit": code, "date": time.strftime("%Y-%m-%d"),
        **(extra or {}),
    }
    write_json(out / RESULT_FILE, result)
    if launcher.writes_log:
        with runlog.RunLog(out / runlog.LOG_NAME) as log:
            log.write({"event": "summary", **result})
    prune_previous(out)  # only now: this run has its own model, result and log
    return result


def check_test_data(spec: JobSpec) -> None:
    """Refuse ``[data] test`` before training rather than after it, where a missing file, a
    file without labels, a test filter that keeps no row or rows of another width than the
    training data's used to end a finished training without a result. A table is checked
    without reading its features (:func:`open_test_table`), a data file is read (and let go);
    so is the training data for its width when only that tells it (a table's first piece,
    shards' footers). Nothing to check for a job that pre-trains only."""
    data = spec.data
    if data.test is None or not spec.fine_tunes:
        return
    train = spec.training_data
    # The test data read as the model will read it: the training data's columns, by name, where they have names.
    columns = train.columns()
    width = scored_rows(data).test_width(columns)
    trained, labelled = train.width()
    if not labelled:
        return  # training shards without labels: the launcher refuses them first, naming them
    if width != trained:
        raise DataError(f"{data.test}: {width} features a row, but the training data {train.uri} has {trained}: "
                        f"the model could not test it ([data] test)")


def _nothing_but_config(out: Path) -> bool:
    """Whether ``out`` holds only its config.json, folders and empty files (a log opened
    before training failed, say), besides the lock and run record."""
    return all(path in (out / CONFIG_FILE, *(out / name for name in ownership.BOOKKEEPING))
               or path.stat().st_size == 0 for path in out.rglob("*") if path.is_file())


def local_folder(where: str) -> Path:
    """The folder on this machine that a run writes, ``where`` made absolute (``~`` expanded). The
    root folder is refused, a path through a symbolic link, and a URI (``hdfs://``,
    ``s3://``, ``file://``) is refused (:class:`UsageError`), before anything is written: a run on
    this machine writes a local folder, where a URI taken as a path would be a folder named
    ``hdfs:``; ``dbn submit`` writes a job's output to HDFS."""
    if "://" in where:
        raise UsageError(f"[output] dir = {where!r}: a run on this machine (in process or --local) writes a "
                         f"folder here; give a path (or --out), or run the job on YARN (dbn submit) to write "
                         f"its output to {where.split('://', 1)[0]}://")
    given = Path(where).expanduser()  # "~" is the home folder, not a folder named ~
    written = given if given.is_absolute() else Path.cwd() / given  # as the user wrote it: links kept
    # No write goes through a link: none among the folders the path names below the current or the
    # home folder (where a person makes links; a system's own, such as /home on some, are above them).
    base = next((b for b in (Path.cwd(), Path.home()) if written.is_relative_to(b)), written.parent)
    part = base
    for name in written.relative_to(base).parts:
        part = part / name
        if part.is_symlink():
            raise UsageError(f"[output] dir = {where!r}: {part} is a symbolic link, and a run writes through "
                             f"none; give the folder it points to ({part.resolve()}), or another")
    folder = written.resolve()
    if folder == Path(folder.anchor):
        raise UsageError(f"[output] dir = {where!r}: the file system's root; name a folder for the run's files")
    return folder


def check_folder(out: Path) -> None:
    """Refuse an output ``out`` that is a file (:class:`UsageError`), before anything is written."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: a file, not a directory: the output ([output] dir or --out) is a directory")


def claim_output(out: Path, spec: JobSpec, *, resume: bool = False, overwrite: bool = False) -> Path | None:
    """Make the output folder ``out`` ready for a run of ``spec``, or refuse it.

    - A folder that holds a run of another job (see :func:`why_another_job`) is refused with a
      :class:`UsageError`, unless ``overwrite``.
    - A folder holding, under a name the run writes (:data:`RUN_NAMES`), a file no run of the
      project wrote (its run record does not prove it, :mod:`iterreduce.storage.ownership`) is
      refused (:class:`~iterreduce.exceptions.ForeignFileError`, naming the file), even with
      ``overwrite``: the project never moves, overwrites or deletes what is not its own.
    - ``resume`` of the same job continues its run: nothing changes.
    - Any other run (a rerun of the same job, or ``overwrite``) keeps the earlier run in
      ``out/previous/N``: its config, log, checkpoints and process logs move there (so a
      later ``--resume`` only sees this run's checkpoints), while model.npz and result.json
      stay in place, linked there, until this run writes its own (atomically): a run that
      fails leaves them byte-identical. Once a run succeeds, the newest few earlier runs stay.

    Call it holding the folder's lock. Returns the folder the earlier run went to, or None.
    """
    check_folder(out)
    ownership.check_owned(out, RUN_NAMES)
    why = why_another_job(out, spec)
    if why and not overwrite:
        raise UsageError(f"{out}: holds a run of another job ({why}); pass --overwrite to replace it (the earlier "
                         f"run is kept in {out / PREVIOUS}), or choose another output directory ([output] dir "
                         f"or --out)")
    aside = None if resume and not why else set_aside(out, move=(CONFIG_FILE, *RUN_FILES),
                                                       keep_in_place=(MODEL_FILE, RESULT_FILE))
    if out.is_dir():
        ownership.claim(out, RUN_NAMES)
    return aside


def why_another_job(out: Path, spec: JobSpec) -> str | None:
    """Why ``out`` holds a run of another job than ``spec``, or None when it holds none (no
    model, result or checkpoint: e.g. a failed attempt) or one of the same job.

    A run's job is its config.json (:meth:`JobSpec.differs_from`).
    """
    if not out.is_dir():
        return None
    held = [name for name in (MODEL_FILE, RESULT_FILE) if (out / name).exists()]
    if any((out / "checkpoints").glob("ckpt-*.npz")):
        held.append("checkpoints")
    if not held:
        return None
    try:
        earlier = json.loads((out / CONFIG_FILE).read_text())
    except FileNotFoundError:
        return f"{', '.join(held)} but no {CONFIG_FILE} saying of which job"
    except (OSError, ValueError) as exc:
        return f"{out / CONFIG_FILE}: unreadable: {exc}"
    return spec.differs_from(earlier)


def load_classifier(path: str | Path, *, device: str = "cpu", use: str = "predict") -> DBN:
    """The model file at ``path``, refused when it is a pre-trained stack without a classifier
    (a job with ``finetune_epochs = 0``), which has nothing to ``use`` ("evaluate", "predict")."""
    model = DBN.load(path, device=device)
    if model.network_ is None:
        raise ModelFileError(f"{path}: a pre-trained stack without a classifier (finetune_epochs = 0): nothing to "
                             f"{use}; `dbn transform` (or DBN.load(...).transform(rows)) gives its features")
    return model


def evaluate_model(model: DBN | str | Path, data: str, *, mnist_dir: str | None = None, device: str = "cpu",
                   label: str | None = None, rows: ScoredRows | None = None) -> dict:
    """Test error of ``model`` (a DBN, or a model file loaded onto ``device``) on ``data``
    ("mnist" for its 10,000 test images, a .npz or a .csv with labels), or on a job's test set
    ``rows`` (:func:`dbn.data.training.scored_rows`: a table's raw rows and labels go to the
    model, which scales and maps them as it was trained), read by the model's columns."""
    path = None if isinstance(model, DBN) else str(model)
    if path is not None:
        model = load_classifier(path, device=device, use="evaluate")
    columns = model.learned("input_columns_")  # by name, where the model names them
    if rows is not None:
        X, y = rows.test_rows(columns)
    else:
        X, y = load_dataset(data, split="test", mnist_dir=mnist_dir, labels=True, label=label, columns=columns)
    try:
        error = 1.0 - model.score(X, y)
    except DataError as exc:  # the model says "X" and "y": name the data
        raise DataError(f"{data} against {path or 'the model'}: {exc}") from None
    return {"model": path, "data": data, "test_error": error, "n_samples": int(X.shape[0]),
            "errors": int(round(error * X.shape[0])), "device": model.backend.device}


def write_json(path: Path, obj) -> None:
    """``obj`` as indented JSON at ``path``, atomically (NumPy scalars as numbers)."""
    text = json.dumps(obj, indent=2, default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))


# ---------------------------------------------------------------- launchers


class InProcess:
    """Train a :class:`dbn.DBN` in this process, on ``[cluster] shards`` when the job names
    shards, else on ``[data] train``; the log gets a ``start`` event and one ``epoch`` record
    per epoch of every phase."""

    where, writes_log, resume, trains_here, tracks_in_master = "in-process", True, False, True, False

    def output_dir(self, spec: JobSpec) -> str:
        return spec.output.dir

    def describe(self, spec: JobSpec) -> str:
        return f"{'-'.join(map(str, spec.model.hidden_layers))} in this process on {spec.job.device}"

    def train(self, spec: JobSpec, out: Path, on_record: OnRecord) -> dict:
        data = spec.training_data
        rows = data.read()
        X, y, classes, scaler, source = rows.X, rows.y, rows.classes, rows.scaler, data.uri
        n_classes = spec.model.n_classes or (len(classes) if classes is not None else None)
        if resolve_device(spec.job.device) == "cpu":
            check_one_process(X.shape[0], X.shape[1], spec.model.hidden_layers, available_bytes=available_memory())
        validation = None
        if spec.cluster.validation:  # scored after each fine-tuning epoch, as on workers
            if spec.model.validation_fraction:
                raise ConfigError(f"{spec.source or 'the job'}: [cluster] validation and [model] "
                                  f"validation_fraction both set: choose one validation set")
            validation = load_validation(spec.cluster.validation, n_features=X.shape[1], classes=classes,
                                         scaler=scaler)  # rows as the network sees them, class indices
        y = y if spec.fine_tunes else None  # pre-training only: labels play no part, as on workers
        model = DBN(**spec.dbn_params())
        # The columns the features come from (a table's resolved glob, a CSV's header, the shards'
        # record of it): the model reads them by name from later tables and files.
        if any(x is not None for x in (scaler, classes, rows.columns)):  # before training: every class gets an output
            attach_inputs(model, classes, scaler, rows.columns, rows.widths)
        with runlog.RunLog(out / runlog.LOG_NAME) as log:
            def write(record: dict) -> None:
                log.write(record)
                on_record(record)

            write({"event": "start", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "version": __version__,
                   "where": f"{X.shape[0]} x {X.shape[1]} -> {self.describe(spec)}", "output": str(out),
                   "device": model.backend.device, "n_train": int(X.shape[0]), "n_features": int(X.shape[1]),
                   "config": spec.public_dict()})
            batches = minibatch_warnings(int(X.shape[0]), model, name=str(source), fine_tunes=y is not None)
            if y is None:
                write({"event": "data", "rows": int(X.shape[0]), "warnings": batches})
            else:
                counts = np.bincount(y, minlength=n_classes or 0)
                write({"event": "data", "rows": int(X.shape[0]), "classes": counts.tolist(),
                       "warnings": class_warnings(counts, name=f"the labels of {source}") + batches})
            model.callback = epochs = _EpochRecords(write)
            try:
                model.pretrain(X)
                pretrain_seconds = epochs.elapsed()
                if spec.fine_tunes:
                    model.finetune(X, y, validation_data=validation)
            except KeyboardInterrupt:
                write({"event": "interrupted", "after": epochs.where, "elapsed": epochs.elapsed()})
                raise Interrupted(f"after {epochs.where}; no model written; progress so far is in "
                                  f"{out / runlog.LOG_NAME}") from None
            log.event("done", steps=epochs.count, seconds=epochs.elapsed())  # as a master's log ends (not printed)
        model.save(out / MODEL_FILE)
        return {"n_train": int(X.shape[0]), "pretrain_seconds": pretrain_seconds,
                "finetune_seconds": epochs.elapsed() - pretrain_seconds, "sync_fraction": None,
                "finetune_epochs_run": sum(1 for r in model.history_ if r["phase"] == "finetune")}


class _EpochRecords:
    """DBN callback: turns its progress records into the log's ``epoch`` records."""

    def __init__(self, write: OnRecord):
        self.write, self.start, self.last, self.where = write, time.perf_counter(), None, "start-up"
        self.count = 0  # epoch records written

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def __call__(self, rec: dict) -> None:
        key = (rec["phase"], rec.get("layer"))
        previous = self.last[1] if self.last and self.last[0] == key else 0.0
        self.last = (key, rec["seconds"])
        seconds = rec["seconds"] - previous
        self.where = (f"pretrain layer {rec['layer'] + 1} epoch {rec['epoch'] + 1}" if rec["phase"] == "pretrain"
                      else f"finetune epoch {rec['epoch'] + 1}")
        self.count += 1
        self.write({"event": "epoch", **rec, "epoch_seconds": seconds,
                    "samples_per_s": rec["samples"] / seconds if seconds > 0 else None, "elapsed": self.elapsed()})


class MiniCluster:
    """The master and worker processes on this machine for ``[cluster] workers`` shards (one
    per data-parallel worker; ``[data] train`` is cut into OUT/shards unless ``[cluster] shards``
    names shards already written), run in ``[cluster] processes`` processes (0: chosen by
    :func:`iterreduce.launch.local.local_processes` for this machine's cores)."""

    where, writes_log, trains_here, tracks_in_master = "local mini-cluster", False, True, False

    def __init__(self, resume: bool = False):
        self.resume = resume

    def output_dir(self, spec: JobSpec) -> str:
        return spec.output.dir

    @staticmethod
    def processes(spec: JobSpec, shards: int) -> int:
        """The worker processes for ``shards`` shards: ``[cluster] processes``, or as many as pay,
        never more than ``[cluster] workers``."""
        gpus = gpu_count() if resolve_device(spec.job.device) == "gpu" else 0  # then one process per GPU
        return min(spec.cluster.processes or local_processes(shards, gpus or None), spec.cluster.workers, shards)

    def describe(self, spec: JobSpec, shards: int | None = None) -> str:
        """Where the job trains, e.g. "local mini-cluster of 10 workers in 2 processes"; with
        fewer ``shards`` than workers asked, one worker a shard, and why."""
        workers = spec.cluster.workers if shards is None else min(spec.cluster.workers, shards)
        processes = self.processes(spec, workers)
        text = f"local mini-cluster of {counted(workers, 'worker')}" + (
            f" in {counted(processes, 'process', 'processes')}" if processes != workers else "")
        fewer = shards is not None and spec.why_fewer_shards(shards)
        return f"{text}: {fewer}" if fewer else text

    def train(self, spec: JobSpec, out: Path, on_record: OnRecord) -> dict:
        workers = spec.cluster.workers
        if workers < 1:
            raise ConfigError("a local mini-cluster needs workers: set [cluster] workers or pass --local N")
        spec.check_distributed()  # before any shard is written
        uris = list_shards(local_shards(spec, out, workers))
        processes = self.processes(spec, len(uris))
        budget = available_memory() // processes
        stream, memory = plan_memory(shard_info(uris), processes, spec.model.hidden_layers, choice=spec.cluster.stream,
                                     budget_bytes=budget, budget_name=f"this machine's available memory over "
                                                                      f"{processes} worker processes",
                                     exchange=spec.reduce_on(False) == "workers")
        where = self.describe(spec, len(uris)) + (", streaming the data from local disk" if stream else "")
        on_record({"event": "start", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   "where": where, "output": str(out)})  # not logged: the master's log is the master's
        try:
            config = dataclasses.replace(spec.master_config(shards=uris, output=str(out), stream=stream),
                                         workers=processes, resume=self.resume)
            run_local(config, max_restarts=spec.cluster.max_restarts, device=spec.job.device,
                      threads_per_worker=spec.cluster.threads_per_process or None, on_record=on_record,
                      earlier_runs=False, shared_memory=spec.cluster.shared_memory)  # run() keeps them: claim_output set them aside, _run prunes
        except MasterKilled as killed:
            if killed.checkpoint is None:
                raise
            raise MasterKilled(f"{killed}: continue the job with the same command and --resume",
                               killed.checkpoint) from None
        except (KeyboardInterrupt, StopSignal) as stop:
            if any((out / "checkpoints").glob("ckpt-*.npz")):
                hint = f"checkpoints are in {out / 'checkpoints'}: continue with the same command and --resume"
            else:  # stopped before the first: there is nothing to resume from
                hint = "before its first checkpoint, so nothing to resume: run the same command again"
            raise Interrupted(hint, getattr(stop, "signum", signal.SIGINT)) from None
        return {**cluster_figures(out), "shards": len(uris), "processes": config.workers, "memory": memory}


def local_shards(spec: JobSpec, out: Path, n_shards: int) -> str:
    """The job's shard directory: ``[cluster] shards``, or ``[data] train`` cut into OUT/shards.

    Shards written here are reused by a later run (e.g. ``--resume``) of the same data: their
    manifest's note :data:`SHARDS_SOURCE` says what they were cut from.
    """
    data = spec.training_data
    source = data.source_note(n_shards)
    if source is None:  # shards already
        return data.uri
    shards = out / SHARDS_FOLDER
    ownership.check_not_link(shards)  # a link there: its target is not this run's to rewrite
    if shards.is_dir() and shard_note(str(shards), SHARDS_SOURCE) == source:
        return str(shards)
    # Another source's shards (written here: listed in their manifest) are replaced; a folder
    # holding anything else is refused untouched (shardio.shards.shard_set).
    data.shards(str(shards), n_shards)
    set_shard_note(str(shards), SHARDS_SOURCE, source)
    return str(shards)


#: The note of OUT/shards' manifest saying what they were cut from (:func:`local_shards`).
SHARDS_SOURCE = "source"


def cluster_figures(out: Path) -> dict:
    """A master's figures from its log in ``out``: the timings of :func:`phase_timings`, the
    training rows (``n_train``: what the first step, a transform of every shard, saw), and
    ``resumed_at_step``: the step this run resumed at (None: it ran from the start). A
    resumed run's phase seconds count every step's last run, the run before's too, while its
    wall time is this run's."""
    everything = runlog.read_records(out / runlog.LOG_NAME)
    records = runlog.progress(everything)
    first = next((r for r in records if r.get("phase") == "transform"), None)
    resumed = [r for r in everything if r.get("event") == "resumed"]
    return {**phase_timings(records), "n_train": int(first["samples"]) if first else None,
            "resumed_at_step": int(resumed[-1]["step"]) if resumed else None}


class Yarn:
    """The job on YARN (as ``dbn submit`` stages it), followed to its end; the model and
    the log are fetched from ``[output] dir`` (on HDFS) into ``report_dir``."""

    where, writes_log, resume, trains_here, tracks_in_master = "yarn", False, False, False, True

    def __init__(self, report_dir: str, log: Callable[[str], None] = print, poll: float = 5.0,
                 overwrite: bool = False):
        self.report_dir, self.log, self.poll = report_dir, log, poll
        self.overwrite = overwrite  # replace another job's run in the HDFS output folder (dbn.jobs.yarn.submit)

    def output_dir(self, spec: JobSpec) -> str:
        return self.report_dir

    def describe(self, spec: JobSpec) -> str:
        return f"YARN, {spec.cluster.workers} worker containers"

    def train(self, spec: JobSpec, out: Path, on_record: OnRecord) -> dict:
        from iterreduce.launch.yarn import client as yarn

        from .yarn import submit

        _, app_id, url, client = submit(spec, log=self.log, overwrite=self.overwrite)
        self.where = f"yarn ({app_id})"
        on_record({"event": "start", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "output": spec.output.dir,
                   "where": f"{self.describe(spec)}, application {app_id} (tracking URL: {url or 'none yet'})"})
        last: list[dict] = [{}]

        links: list[dict] = [{}]

        def forward(st) -> None:  # the master's newest step record, once each, and its links when new
            if st.record and st.record.get("step") != last[0].get("step"):
                last[0] = st.record
                on_record(st.record)
            if st.links and st.links != links[0]:
                links[0] = st.links
                on_record({"event": "links", "links": st.links})

        st = yarn.wait(client, app_id, poll=self.poll, on_status=forward)
        if st.final_status != "SUCCEEDED":
            raise yarn.YarnError(yarn.ended_badly(st))
        fs, base = filesystem(spec.output.dir)
        for name in (MODEL_FILE, runlog.LOG_NAME):
            with fs.open_input_stream(join(base, name), compression=None) as src:
                data = src.read()
            atomic_write(out / name, lambda f, data=data: f.write(data))  # never half a model in place of the last
        return {**cluster_figures(out), "shards": spec.cluster.workers, "app_id": app_id}


def launcher_for(spec: JobSpec, *, resume: bool = False) -> Launcher:
    """In this process when ``[cluster] workers`` is 0, else on a local mini-cluster."""
    if spec.cluster.workers > 0:
        return MiniCluster(resume=resume)
    if resume:
        raise UsageError("--resume continues a distributed job: add --local N (or [cluster] workers)")
    return InProcess()
