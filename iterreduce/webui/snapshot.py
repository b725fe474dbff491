"""What the live page shows, built from a job's log records: one JSON-friendly dict.

Everything the page draws comes from here, so the same code serves a running job
(records tailed from ``log.jsonl`` plus the master's worker table) and a finished one
(``dbn view OUT``: the log alone). The page itself only renders.

A *view spec* says which curves to draw; a program gives its own
(:meth:`iterreduce.program.Program.view`), else :func:`default_spec` plots every
numeric metric of the step records::

    {"title": "DBN 784-500-10",
     "charts": [{"title": "Reconstruction error", "phase": "pretrain", "x": "epoch",
                 "y": ["reconstruction_error"], "by": "layer", "label": "layer {layer}"}],
     "images": {"filters": "First layer's filters"},
     "position": ["layer", "epoch"]}

``x`` is a record key (points with the same x are merged by a samples-weighted mean:
the parts of one epoch; ``epoch1`` is ``epoch`` plus one, for people), ``by`` splits a chart into one series per value of that key,
``label`` names a series (``{key}`` is the record's value, ``{key1}`` it plus one) and
``position`` lists the keys that say where a job is (shown one-based).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from ..storage.runlog import is_progress, progress

#: Keys of the runtime's step records (iterreduce.storage.runlog.step_record): not metrics to plot.
RUNTIME_KEYS = frozenset({"step", "of", "phase", "shards", "shards_total", "seconds", "compute_seconds",
                          "sync_seconds", "reduce_seconds", "reducers", "updates", "time", "samples", "event",
                          "part"})

#: How each event reads on the page (any other event: its name and fields).
EVENT_TEXT = {
    "worker_registered": "{worker} joined from {host} with shards {shards}",
    "worker_lost": "{worker} lost: {reason}",
    "worker_restarted": "{worker} exited ({error}): restart {restart}",
    "worker_gave_up": "{worker} used up its {restarts} restarts ({error})",
    "container_lost": "YARN container {container} ended ({cause})",
    "containers_pending": "{pending} worker containers wait for room in queue {queue}",
    "resized": "{workers} workers wanted (were {was})",
    "worker_draining": "{worker} leaves: {reason}",
    "worker_retired": "{worker} retired",
    "checkpoint": "checkpoint after step {step}",
    "resumed": "resumed at step {step}",
    "exchange_failed": "step {step}: the workers' exchange failed ({reason}); the master reduced",
    "exchange_off": "the master reduces from step {step} on",
    "data_error": "bad data reported by {worker}: {message}",
    "stopped": "stopped early after step {step} of {of}",
    "done": "done: {steps} steps in {seconds:.0f} s",
    "failed": "the job failed: {reason}",
}
#: Events too frequent or too large for the list (the data facts are shown with the job, the links in its header).
QUIET_EVENTS = frozenset({"epoch", "start", "data", "ui", "links"})
MAX_EVENTS = 100


def default_spec(records: Iterable[dict], title: str = "") -> dict:
    """A view spec for any program: one chart per numeric metric, against the step, a series per phase."""
    metrics: dict[str, None] = {}
    for r in records:
        if is_progress(r):
            for key, value in r.items():
                if key not in RUNTIME_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                    metrics.setdefault(key)
    return {"title": title, "charts": [{"title": key.replace("_", " "), "x": "step", "y": [key], "by": "phase",
                                        "label": "{phase}"} for key in metrics], "images": {}}


def _one_based(record: dict) -> dict:
    """``record`` plus ``KEY1`` = ``KEY`` + 1 for each integer ``KEY`` (layer 0 is "layer 1" to people)."""
    return {**record, **{f"{k}1": v + 1 for k, v in record.items() if isinstance(v, int) and not isinstance(v, bool)}}


def _label(template: str, record: dict) -> str:
    values = _one_based(record)
    try:
        return template.format_map(values)
    except (KeyError, IndexError, ValueError):
        return template


def chart_series(records: list[dict], chart: dict) -> list[dict]:
    """The series of one chart: ``[{"label", "x": [...], "y": {metric: [...]}}]``, points with the
    same x merged by a samples-weighted mean (a metric missing from some records is averaged over
    those that have it; a point where it is missing everywhere is ``None``)."""
    phase, x_key, metrics = chart.get("phase"), chart.get("x", "step"), list(chart["y"])
    by, label = chart.get("by"), chart.get("label", "")
    groups: dict = {}  # series key -> {"label", "sums": {x: {metric: (sum, weight)}}}
    for r in records:
        if phase is not None and r.get("phase") != phase:
            continue
        r = _one_based(r)
        if x_key not in r:
            continue
        if not any(isinstance(r.get(m), (int, float)) for m in metrics):
            continue
        key = r.get(by) if by else None
        group = groups.setdefault(key, {"label": _label(label, r) if label else (str(key) if by else ""), "sums": {}})
        point = group["sums"].setdefault(r[x_key], {})
        weight = float(r.get("samples") or 1)
        for m in metrics:
            value = r.get(m)
            if isinstance(value, (int, float)) and math.isfinite(value):
                total, weights = point.get(m, (0.0, 0.0))
                point[m] = (total + weight * value, weights + weight)
    series = []
    for key in sorted(groups, key=lambda k: (k is None, k if isinstance(k, (int, float)) else str(k))):
        group = groups[key]
        xs = sorted(group["sums"])
        series.append({"label": group["label"], "x": xs, "y": {
            m: [(lambda t: t[0] / t[1] if t and t[1] else None)(group["sums"][x].get(m)) for x in xs]
            for m in metrics}})
    return series


def _runs(schedule: list) -> list[tuple[str, int, int]]:
    """(phase, first step, steps) of each run of consecutive steps of one phase."""
    runs, first = [], 0
    for phase, count in schedule:
        runs.append((phase, first, count))
        first += count
    return runs


def remaining_seconds(steps: list[dict], schedule: list | None, of: int) -> float | None:
    """Seconds left, estimated per run of the schedule: a run under way at its own mean step time,
    a later one at the mean of the finished steps of its phase (else of every phase)."""
    if not steps:
        return None
    done = {r["step"]: r["seconds"] for r in steps}
    every = sum(done.values()) / len(done)
    if not schedule:
        return every * max(of - len(done), 0)
    by_phase: dict[str, list[float]] = {}
    for phase, first, count in _runs(schedule):
        by_phase.setdefault(phase, []).extend(done[s] for s in range(first, first + count) if s in done)
    left = 0.0
    for phase, first, count in _runs(schedule):
        todo = [s for s in range(first, first + count) if s not in done]
        if not todo:
            continue
        own = [done[s] for s in range(first, first + count) if s in done]
        same = by_phase.get(phase)
        per_step = (sum(own) / len(own)) if own else (sum(same) / len(same) if same else every)
        left += per_step * len(todo)
    return left


def _position(record: dict, spec: dict) -> str:
    where = [str(record.get("phase", ""))]
    for key in spec.get("position", ()):
        value = record.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            where.append(f"{key} {value + 1}")
    return " ".join(where)


def progress_of(records: list[dict], job: dict, spec: dict, now: float | None = None) -> dict:
    """Where the job is: the last step done, the fraction, elapsed and remaining seconds, and its state."""
    now = time.time() if now is None else now
    steps = [r for r in progress(records) if "step" in r and "of" in r]
    ended = next((r["event"] for r in reversed(records) if r.get("event") in ("done", "failed", "resumed")), None)
    start = next((r["time"] for r in records if isinstance(r.get("time"), (int, float))), None)
    last = steps[-1] if steps else next((r for r in reversed(records) if is_progress(r)), None)
    of = steps[-1]["of"] if steps else job.get("steps")
    done = len(steps) if steps else sum(1 for r in records if is_progress(r))  # a run in one process: its epochs
    state = ended if ended in ("done", "failed") else "running" if last is not None else "starting"
    fraction = 1.0 if state == "done" else (done / of if of else None)
    end = records[-1]["time"] if state != "running" and records and "time" in records[-1] else now
    return {
        "state": state, "steps_done": done, "of": of, "fraction": fraction,
        "where": _position(last, spec) if last else "", "elapsed_s": (end - start) if start else None,
        "remaining_s": 0.0 if state == "done" else remaining_seconds(steps, job.get("schedule"), of or 0),
    }


def sync_of(records: list[dict]) -> dict:
    """Seconds of step time, of it synchronising, and the share, over the steps' last runs."""
    steps = [r for r in progress(records) if "step" in r]
    total = sum(r.get("seconds", 0.0) for r in steps)
    sync = sum(r.get("sync_seconds", 0.0) for r in steps)
    return {"seconds": sync, "step_seconds": total, "share": sync / total if total else None}


def event_text(record: dict) -> str:
    """One event as a line of the page's event list."""
    template = EVENT_TEXT.get(record.get("event"))
    if template:
        try:
            return template.format_map(record)
        except (KeyError, IndexError, ValueError):
            pass
    detail = ", ".join(f"{k} {v}" for k, v in record.items() if k not in ("event", "time"))
    return f"{record.get('event')}: {detail}" if detail else str(record.get("event"))


def events_of(records: list[dict]) -> list[dict]:
    """The newest :data:`MAX_EVENTS` events worth listing, oldest first. Of checkpoints written
    one after another (one a step) only the newest is listed: they would bury the rest."""
    listed: list[dict] = []
    for r in records:
        if "event" not in r or is_progress(r) or r["event"] in QUIET_EVENTS:
            continue
        entry = {"time": r.get("time"), "event": r["event"], "text": event_text(r)}
        if entry["event"] == "checkpoint" and listed and listed[-1]["event"] == "checkpoint":
            listed[-1] = entry
        else:
            listed.append(entry)
    return listed[-MAX_EVENTS:]


def links_of(records: list[dict]) -> dict[str, str]:
    """Where the job is shown beyond this page (the newest ``links`` event: name to URL), web
    addresses only: the page makes each a link."""
    for record in reversed(records):
        if record.get("event") == "links" and isinstance(record.get("links"), dict):
            return {str(name): url for name, url in record["links"].items()
                    if isinstance(url, str) and url.startswith(("http://", "https://"))}
    return {}


def workers_from_log(records: list[dict]) -> list[dict]:
    """The workers table of a finished job, from its events (no live figures)."""
    table: dict[str, dict] = {}
    for r in records:
        event = r.get("event")
        if event not in ("worker_registered", "worker_lost", "worker_restarted", "worker_gave_up"):
            continue
        name = str(r.get("worker", "")).split("#")[0]
        row = table.setdefault(name, {"name": name, "state": "", "shards": [], "restarts": 0, "host": "", "local": None,
                                      "samples_per_s": None, "heartbeat_age_s": None})
        if event == "worker_registered":
            row.update(state="registered", shards=r.get("shards", []), host=r.get("host", ""), local=r.get("local"))
        elif event == "worker_lost":
            row["state"] = "lost"
        elif event == "worker_restarted":
            row["restarts"] = max(row["restarts"], int(r.get("restart", 0)))
        else:
            row["state"] = "gave up"
    if any(r.get("event") == "done" for r in records):
        for row in table.values():
            if row["state"] == "registered":
                row["state"] = "finished"
    return sorted(table.values(), key=lambda row: _natural(row["name"]))


def _natural(name: str):
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def resolve_spec(records: list[dict], job: dict, spec: dict | None = None) -> dict:
    """``spec``, or :func:`default_spec` of the records when the program gives none."""
    return spec or default_spec(records, job.get("name", ""))


def from_log(records: list[dict], *, job: dict, spec: dict, images: Iterable[str] = ()) -> dict:
    """The part of the page's state that changes only when the log grows: the title, the charts,
    synchronisation, events, images and the workers table derived from the log. The costly part
    (it reads every record for every chart): a server builds it once per new record
    (:class:`iterreduce.webui.server.ViewServer`)."""
    steps = progress(records)
    return {
        "job": job, "title": spec.get("title") or job.get("name", ""),
        "charts": [{"title": c.get("title", ""), "x": c.get("x_label", c.get("x", "step")), "y": list(c["y"]),
                    "series": chart_series(steps, c)} for c in spec.get("charts", ())],
        "sync": sync_of(records),
        "workers": workers_from_log(records), "live": False,
        "events": events_of(records),
        "links": links_of(records),
        "images": [{"name": name, "title": spec.get("images", {}).get(name, name)} for name in images],
    }


def progress_at(progress: dict, built_at: float, now: float) -> dict:
    """``progress`` (:func:`progress_of` at ``built_at``) as it reads at ``now``: a running job's
    elapsed time moves on (the rest changes only with new records)."""
    if progress.get("state") != "running" or progress.get("elapsed_s") is None:
        return progress
    return {**progress, "elapsed_s": progress["elapsed_s"] + (now - built_at)}


def now_part(records: list[dict], *, job: dict, spec: dict, workers: list[dict] | None = None,
             now: float | None = None) -> dict:
    """The part of the page's state that moves with the clock or the master: progress (its
    elapsed and remaining time) and, when given, the live workers table."""
    part = {"progress": progress_of(records, job, spec, now)}
    if workers is not None:
        part.update(workers=workers, live=True)
    return part


def build(records: list[dict], *, job: dict, spec: dict | None = None, workers: list[dict] | None = None,
          images: Iterable[str] = (), now: float | None = None) -> dict:
    """The page's state: job, progress, charts, synchronisation, workers, events and images
    (:func:`from_log` and :func:`now_part` together).

    ``job``: what the page says of the job (name, workers asked for, the program's config;
    ``schedule``: ``[[phase, steps], ...]`` for the time left). ``workers``: the live table,
    or None to derive it from the log.
    """
    spec = resolve_spec(records, job, spec)
    return {**from_log(records, job=job, spec=spec, images=images),
            **now_part(records, job=job, spec=spec, workers=workers, now=now)}
