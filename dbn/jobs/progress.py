"""Progress a person can watch: one line on stderr per record of a run's log.

The same printer serves every launcher: the in-process ``epoch`` records, a
master's per-superstep records and the launchers' events (a worker lost or
restarted). With ``json_lines`` each record also goes to stdout as it is.
"""

from __future__ import annotations

import json
import sys
import time

from ..data.validation import counted
from .spec import JobSpec


def to_json(record) -> str:
    """One JSON line (NumPy scalars as numbers, anything else unknown as its text)."""
    return json.dumps(record, default=lambda o: o.item() if hasattr(o, "item") else str(o))


#: How the runtime's events read in the progress (any other event is shown as its JSON).
EVENT_LINES = {
    "worker_registered": "{worker} joined from {host} with shards {shards}",
    "worker_lost": "{worker} lost ({reason}); shards the step goes on without: {shards_skipped}",
    "worker_restarted": "{worker} exited ({exit}; {error}): restart {restart}",
    "worker_gave_up": "{worker} exited ({exit}; {error}) and used up its {restarts} restarts",
    "data_error": "bad data reported by {worker}: {message}",
    "container_lost": "YARN container {container} ended ({cause}); {service} is asked for again",
    "containers_pending": "{pending} worker containers have waited {seconds} s for room in queue {queue}",
    "resized": "{workers} workers wanted from the next step (were {was})",
    "worker_draining": "{worker} leaves at the next step: {reason}",
    "worker_retired": "{worker} retired ({reason})",
    "resumed": "resumed from {checkpoint} at step {step}",
    "exchange_failed": "step {step}: the workers' exchange failed ({reason}); the master reduces it",
    "exchange_off": "the master reduces from step {step} on",
    "stopped": "stopped early after step {step} of {of}",
    "done": "done: {steps} steps in {seconds:.1f} s",
    "ui": "live view: {url}",
    "heartbeat": "heartbeats every {interval:.1f} s for this many workers; a worker is lost after {timeout:.0f} s of silence",
}
#: Events that print nothing: a checkpoint a step, and a failure the command reports as its error.
SILENT_EVENTS = frozenset({"checkpoint", "failed"})


def event_line(rec: dict) -> str:
    """An event's sentence (:data:`EVENT_LINES`); an unknown event, or one without a field its
    sentence needs (a log an older version wrote), as its fields."""
    template = EVENT_LINES.get(rec.get("event"))
    if template is not None:
        try:
            return template.format_map(rec)
        except (KeyError, IndexError, ValueError):
            pass
    detail = {k: v for k, v in rec.items() if k not in ("event", "time")}
    return f"[{rec.get('event')}] {to_json(detail)}"


def _rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


class ProgressPrinter:
    """``on_record`` callback of :func:`dbn.jobs.run.run` for the command line."""

    def __init__(self, spec: JobSpec, *, quiet: bool = False, json_lines: bool = False, stream=None):
        self.spec, self.quiet, self.json_lines = spec, quiet, json_lines
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()

    def __call__(self, rec: dict) -> None:
        start = rec.get("event") == "start"
        if self.json_lines and not start:  # the start record carries the whole spec: it stays in the log
            print(to_json(rec), flush=True)
        if self.quiet:
            return
        if start:
            line = f"{rec['where']}, writing to {rec['output']}"
        elif rec.get("event") == "epoch":
            line = self._epoch(rec)
        elif rec.get("event") == "data":
            line = data_lines(rec)
        elif "step" in rec and "phase" in rec:
            line = self._step(rec)
        elif rec.get("event") in SILENT_EVENTS:
            return
        else:
            line = event_line(rec)
        print(line, file=self.stream, flush=True)

    def _where(self, rec: dict) -> str:
        m = self.spec.model
        where = rec["phase"]
        if rec["phase"] in ("pretrain", "transform"):
            where += f" layer {rec['layer'] + 1}/{len(m.hidden_layers)}"
        if "epoch" in rec:
            total = m.pretrain_epochs if rec["phase"] == "pretrain" else m.finetune_epochs
            where += f" epoch {rec['epoch'] + 1}/{total}"
        return where

    @staticmethod
    def _metrics(rec: dict) -> str:
        text = ""
        if "reconstruction_error" in rec:
            text += f"  recon {rec['reconstruction_error']:.2f}"
        if "loss" in rec:
            text += f"  loss {rec['loss']:.4f}  train err {100 * rec['train_error']:.2f}%"
        if "valid_error" in rec:
            text += f"  valid err {100 * rec['valid_error']:.2f}%"
        return text

    def _epoch(self, rec: dict) -> str:
        """An in-process epoch: where, metrics, speed, time so far."""
        rate = f"{_rate(rec['samples_per_s'])} samples/s" if rec["samples_per_s"] else "- samples/s"
        return f"{self._where(rec)}{self._metrics(rec)}  {rate}  {rec['elapsed']:.0f} s"

    def _step(self, rec: dict) -> str:
        """A master's superstep: where, metrics, speed, synchronisation share, shards."""
        rate = rec["samples"] / rec["seconds"] if rec["seconds"] > 0 else 0
        share = rec["sync_seconds"] / rec["seconds"] if rec["seconds"] > 0 else 0
        return (f"step {rec['step'] + 1}/{rec['of']}  {self._where(rec)}{self._metrics(rec)}  "
                f"{_rate(rate)} samples/s  sync {rec['sync_seconds']:.2f} s ({100 * share:.0f}%)  "
                f"shards {rec['shards']}/{rec['shards_total']}  {time.perf_counter() - self.start:.0f} s")


def data_lines(rec: dict) -> str:
    """A ``data`` event: rows, shards, the examples of each class, then one line per warning."""
    where = f" in {counted(rec['shards'], 'shard')}" if rec.get("shards") else ""
    line = f"data: {rec['rows']} rows{where}"
    if rec.get("classes"):
        counts, shown = rec["classes"], 20
        line += f"; {len(counts)} class{'es' if len(counts) > 1 else ''}, examples of each: " + " ".join(
            f"{c}:{n}" for c, n in enumerate(counts[:shown])) + (f" ... ({len(counts) - shown} more)"
                                                                  if len(counts) > shown else "")
    return "\n".join([line, *(f"warning: {w}" for w in rec.get("warnings", ()))])


def summary_line(result: dict) -> str:
    """The last line of ``dbn train``: test error, time, synchronisation share, model file."""
    if result["test_error"] is not None:
        head = f"test error {100 * result['test_error']:.2f} %"
    else:
        head = "pre-trained only: no classifier to test" if result["layers"][-1] is None else "no test set"
    pretrained = result.get("epochs", {}).get("pretrain") != 0  # else the share is of preparing the data alone
    sync = "" if result.get("sync_fraction") is None or not pretrained else \
        f", {100 * result['sync_fraction']:.1f} % of pre-training in sync"
    tracked = f"\ntracked in MLflow: {result['mlflow_run']}" if result.get("mlflow_run") else ""
    return f"{head}  ({result['wall_seconds']:.0f} s{sync})  model: {result['model']}{tracked}"
