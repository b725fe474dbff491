"""A run tracked in MLflow, where a team compares its runs: the job's settings as parameters, every
step's figures as metrics, the run's files as artifacts, and at the end the model as an MLflow model
(:mod:`dbn.model.mlflow_flavor`), registered under ``[output] model_name`` when set.

Tracking is on when ``[output] mlflow`` names a tracking server, or ``MLFLOW_TRACKING_URI`` does
(:func:`tracker_for`). A server that is down or slow never slows or fails the training: the run
only puts what it records in a bounded queue, which one thread sends on (metrics in batches); a
failed call is said once, as a warning, and what comes later is still tried; what does not fit the
queue is dropped and counted; at the end the thread gets :data:`FINISH_WAIT_S` to send the rest.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import queue
import tempfile
import threading
import time
import warnings
from pathlib import Path

from iterreduce.redact import redact

from ..errors import ConfigError, ModelFileError
from .spec import dotted

#: what the queue holds between the run and the thread that sends (a few hundred a job, usually)
QUEUE_ITEMS = 10_000
#: metrics sent in one call
BATCH_METRICS = 500
#: seconds the end of a run waits for what is left to be sent
FINISH_WAIT_S = 60.0
#: MLflow's client settings for the tracking thread, unless the user set them: a down server is
#: said after one try, not after minutes of retries, and the client prints nothing
# No retries, and a timeout the sending thread can afford (the run never waits on it): a busy server
# answered the run's creation in over 10 s on a loaded 2-core machine (2026-12-07), and a run whose
# creation fails records nothing.
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
              "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}  # the run's output is the run's
#: a step record's figures that become metrics (the rest of a record says where it is)
METRICS = ("reconstruction_error", "train_error", "valid_error", "loss", "seconds", "sync_seconds",
           "compute_seconds")
#: MLflow's limit on a parameter's value
PARAM_CHARS = 6000
#: the name of the run's link (Program.links, the ``links`` event, ``dbn status``)
LINK_NAME = "mlflow_run"
#: the last item of the queue
_END = object()


class Tracker:
    """No tracking: what a run calls, each doing nothing (the base of :class:`MlflowTracker`)."""

    link: str | None = None  # where the run is shown (a tracking server's page), once known

    def start(self, spec, out: Path) -> None:
        """The run begins (``spec``: its :class:`~dbn.jobs.spec.JobSpec`, writing to ``out``)."""

    def record(self, record: dict) -> None:
        """A record of the run's log as it is written."""

    def finish(self, result: dict | None, out: Path, error: BaseException | None = None) -> None:
        """The run ended, with ``result`` (``result.json``'s) or ``error``; ``out`` holds its files."""


class RecordedByMaster(Tracker):
    """The tracker of a run whose master records it (on YARN: :func:`master_settings`): this side
    only learns where the run is shown, from the master's ``links`` event."""

    def record(self, record: dict) -> None:
        if record.get("event") == "links" and isinstance(record.get("links"), dict):
            self.link = record["links"].get(LINK_NAME) or self.link


def tracking_uri(spec) -> str | None:
    """The tracking server of ``spec``'s run (``[output] mlflow``, else ``MLFLOW_TRACKING_URI``), None
    without one; refuses a model name without a server, and a server without mlflow to reach it."""
    uri = spec.output.mlflow or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        if spec.output.model_name:
            raise ConfigError(f"{spec.source or 'the job'}: [output] model_name = {spec.output.model_name!r} "
                              f"registers the model in MLflow: name its tracking server ([output] mlflow, or "
                              f"$MLFLOW_TRACKING_URI)")
        return None
    if importlib.util.find_spec("mlflow") is None:  # said before the run starts, not at its end
        raise ConfigError(f"tracking runs in MLflow ({redact(uri)}) needs mlflow (or mlflow-skinny): "
                          f"pip install 'dbn-yarn[mlflow]'")
    return uri


def tracker_for(spec, in_master: bool = False) -> Tracker:
    """The tracker of ``spec``'s run: MLflow's where :func:`tracking_uri` names a server, else none;
    with ``in_master`` (a job whose master records itself: :func:`master_settings`), the link alone."""
    uri = tracking_uri(spec)
    if uri is None:
        return Tracker()
    if in_master:
        return RecordedByMaster()
    return MlflowTracker(uri, experiment=spec.job.name or "dbn", model_name=spec.output.model_name)


def master_settings(spec) -> dict | None:
    """What a job's master needs to record the run itself (the program's ``mlflow`` setting: a YARN
    application master, which runs on when nobody waits for it): None without tracking."""
    uri = tracking_uri(spec)
    if uri is None:
        return None
    return {"uri": uri, "experiment": spec.job.name or "dbn", "model_name": spec.output.model_name,
            "name": spec.job.name or "dbn", "params": params_of(spec.public_dict())}


def begin_master_run(settings: dict, log=print) -> dict:
    """``settings`` (:func:`master_settings`) with their run made on the tracking server now, by the
    submitting process (``run_id`` and ``link``): the master then records into it, and its link is
    known from the job's first record (the master's own client may take longer to start than a short
    job runs, on a busy machine). Where the server cannot be reached now: ``settings`` as given, said
    in ``log``, and the master makes the run."""
    from mlflow.tracking import MlflowClient

    for key, value in CLIENT_ENV.items():
        os.environ.setdefault(key, value)
    try:
        client = MlflowClient(tracking_uri=settings["uri"])
        run_id, link = _new_run(client, settings["uri"], settings["experiment"], settings["name"])
    except Exception as exc:  # noqa: BLE001 - the master tries again; the submission goes on
        log(f"MLflow tracking: the run could not be made before the job starts ({type(exc).__name__}); "
            f"its application master makes it")
        return settings
    log(f"MLflow run: {link}")
    return {**settings, "run_id": run_id, "link": link}


def abandon_master_run(settings: dict | None) -> None:
    """Mark the run :func:`begin_master_run` made FAILED: its job was never submitted."""
    if not (settings and settings.get("run_id")):
        return
    from mlflow.tracking import MlflowClient

    with contextlib.suppress(Exception):  # the submission's own error is the one to say
        MlflowClient(tracking_uri=settings["uri"]).set_terminated(settings["run_id"], "FAILED")


def _new_run(client, uri: str, experiment: str, name: str) -> tuple[str, str]:
    """A new run named ``name`` in ``experiment`` (made when missing): its id and its page's link."""
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)
    run = client.create_run(experiment_id, run_name=name, tags={"dbn-yarn.job": name})
    return run.info.run_id, f"{redact(uri).rstrip('/')}/#/experiments/{experiment_id}/runs/{run.info.run_id}"


def _made_run(settings: dict) -> tuple[str, str] | None:
    """The (run id, link) of a run :func:`begin_master_run` made, from the job file; None for none."""
    run_id, link = settings.get("run_id"), settings.get("link")
    if run_id is None:
        return None
    if not (isinstance(run_id, str) and run_id.isalnum() and isinstance(link, str)
            and link.startswith(("http://", "https://"))):
        warnings.warn(f"MLflow tracking: the job file's run_id {str(run_id)[:40]!r} or its link is not one dbn "
                      f"submit writes; the master makes a run of its own", stacklevel=2)
        return None
    return run_id, link


def master_tracker(settings: dict | None) -> Tracker:
    """The tracker a master builds from :func:`master_settings` (none without them, or where mlflow
    cannot be imported: said once, as a warning; the job goes on), its run begun (or taken up, where
    the submission made it: :func:`begin_master_run`)."""
    if not settings:
        return Tracker()
    if importlib.util.find_spec("mlflow") is None:
        warnings.warn(f"MLflow tracking ({redact(settings['uri'])}): mlflow is not installed where the master runs; the run "
                      f"goes on untracked", stacklevel=2)
        return Tracker()
    tracker = MlflowTracker(settings["uri"], experiment=settings["experiment"], model_name=settings.get("model_name"))
    tracker.begin(settings["name"], settings["params"], made=_made_run(settings))
    return tracker


def metrics_of(record: dict) -> list[tuple[str, float, int]]:
    """``(key, value, step)`` of each figure of a step record: keyed by phase (and layer, for an
    RBM's), stepped by epoch where the record has one, else by the job's step; the share of the
    step spent synchronising as ``sync_share``."""
    if "step" not in record or "phase" not in record:
        return []
    phase = record["phase"] if record.get("layer") is None else f"{record['phase']}.layer{record['layer']}"
    step = int(record["epoch"]) if isinstance(record.get("epoch"), int) else int(record["step"])
    found = [(f"{phase}.{key}", float(record[key]), step) for key in METRICS
             if isinstance(record.get(key), (int, float)) and not isinstance(record.get(key), bool)]
    seconds, sync = record.get("seconds"), record.get("sync_seconds")
    if isinstance(seconds, (int, float)) and isinstance(sync, (int, float)) and seconds > 0:
        found.append((f"{phase}.sync_share", float(sync) / float(seconds), step))
    return found


def params_of(settings: dict) -> dict[str, str]:
    """A job's settings (``JobSpec.to_dict()``) as flat ``section.key`` parameters, unset ones left out."""
    return {name: redact(str(value))[:PARAM_CHARS] for name, value in dotted(settings).items() if value is not None}


class MlflowTracker(Tracker):
    """Records a run in the MLflow tracking server at ``uri``, in experiment ``experiment``;
    registers the model as ``model_name`` (None: not registered). See the module docstring."""

    def __init__(self, uri: str, experiment: str, model_name: str | None = None):
        self.uri = uri
        self.experiment = experiment
        self.model_name = model_name
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_ITEMS)
        self._thread: threading.Thread | None = None
        self._warned = False
        self._dropped = 0
        self._run_id: str | None = None

    # ------------------------------------------------------------ the run's side: never waits

    def start(self, spec, out: Path) -> None:
        self.begin(spec.job.name or "dbn", params_of(spec.public_dict()))

    def begin(self, name: str, params: dict[str, str], made: tuple[str, str] | None = None) -> None:
        """The run begins, named ``name``, with the job's settings as ``params``; ``made``: the
        (run id, link) of a run made already, recorded into (its link known at once)."""
        for key, value in CLIENT_ENV.items():
            os.environ.setdefault(key, value)
        mlflow_log = logging.getLogger("mlflow")  # its client's notes ("View run at ...") are not the run's
        mlflow_log.setLevel(max(mlflow_log.getEffectiveLevel(), logging.WARNING))
        if made is None:
            self._put(("start", name, params))
        else:
            self._run_id, self.link = made
            self._put(("params", params))
        self._thread = threading.Thread(target=self._send_all, name="mlflow-tracking", daemon=True)
        self._thread.start()

    def record(self, record: dict) -> None:
        found = metrics_of(record)
        if found:
            self._put(("metrics", found, int(time.time() * 1000)))

    def finish(self, result: dict | None, out: Path, error: BaseException | None = None) -> None:
        if self._thread is None:
            return
        self._put(("finish", result, Path(out), error is None))
        self._queue.put(_END)  # the end, even when the queue was full: waits for room
        self._thread.join(FINISH_WAIT_S)
        if self._thread.is_alive():
            self._warn(f"gave up sending the rest after {FINISH_WAIT_S:g} s")
        if self._dropped:
            self._warn(f"{self._dropped} records did not fit the queue to the tracking server and were dropped")

    def _put(self, item) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._dropped += 1

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(f"MLflow tracking ({redact(self.uri)}): {redact(str(what))}; the run goes on, and records what it can",
                          stacklevel=2)

    # ------------------------------------------------------------ the sending thread

    def _send_all(self) -> None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        waiting = None  # an item taken from the queue while gathering metrics, sent next
        while True:
            item, waiting = (waiting if waiting is not None else self._queue.get()), None
            if item is _END:
                return
            kind, *args = item
            if kind == "metrics":  # the metrics waiting behind it go in the same call
                found = list(args[0])
                while len(found) < BATCH_METRICS:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is _END or more[0] != "metrics":
                        waiting = more
                        break
                    found.extend(more[1])
                args[0] = found
            try:
                getattr(self, f"_send_{kind}")(client, *args)
            except Exception as exc:  # noqa: BLE001 - a tracking server's fault never stops the run
                self._warn(f"{type(exc).__name__}: {str(exc)[:300]}")

    def _send_start(self, client, name: str, params: dict) -> None:
        self._run_id, self.link = _new_run(client, self.uri, self.experiment, name)
        self._send_params(client, params)

    def _send_params(self, client, params: dict) -> None:
        from mlflow.entities import Param

        items = [Param(key, value) for key, value in sorted(params.items())]
        for first in range(0, len(items), 100):  # MLflow takes 100 parameters a call
            client.log_batch(self._run_id, params=items[first:first + 100])

    def _send_metrics(self, client, found: list, timestamp: int) -> None:
        from mlflow.entities import Metric

        if self._run_id is None:
            return  # the run could not be made: nothing to add figures to
        for first in range(0, len(found), BATCH_METRICS):
            client.log_batch(self._run_id, metrics=[Metric(key, value, timestamp, step)
                                                    for key, value, step in found[first:first + BATCH_METRICS]])

    def _send_finish(self, client, result: dict | None, out: Path, succeeded: bool) -> None:
        if self._run_id is None:
            return
        try:
            if result is not None and isinstance(result.get("test_error"), (int, float)):
                client.log_metric(self._run_id, "test_error", float(result["test_error"]))
            for name in ("result.json", "config.json", "log.jsonl"):
                if (out / name).is_file():
                    client.log_artifact(self._run_id, str(out / name))
            if succeeded and (out / "model.npz").is_file():
                self._log_model(client, out / "model.npz")
        finally:
            client.set_terminated(self._run_id, "FINISHED" if succeeded else "FAILED")

    def _log_model(self, client, model_file: Path) -> None:
        """The model as an MLflow model under the run's ``model`` artifacts, registered when named."""
        from ..model.mlflow_flavor import export_mlflow

        with tempfile.TemporaryDirectory(prefix="dbn-mlflow-") as scratch:
            folder = Path(scratch) / "model"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # MLflow's notes on the environment it infers
                    export_mlflow(str(model_file), str(folder))
            except ModelFileError:  # pre-trained only: no classifier to export
                return
            client.log_artifacts(self._run_id, str(folder), "model")
        if self.model_name:
            with contextlib.suppress(Exception):  # it may exist: a new version of it
                client.create_registered_model(self.model_name)
            source = f"{client.get_run(self._run_id).info.artifact_uri.rstrip('/')}/model"
            client.create_model_version(self.model_name, source, run_id=self._run_id)
