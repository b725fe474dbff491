"""A job's ``log.jsonl``: the one place that writes, reads and tails it.

One JSON object per line, appended as things happen. Two kinds of record:

**Progress record**: one unit of work done, with a ``"phase"`` key. The master
writes one per superstep, a *step record* (see :func:`step_record`)::

    {"step": 3, "of": 12, "phase": "...", <the step's info>, <the program's summary
     and metrics>, "shards": 4, "shards_total": 4, "seconds": 1.2,
     "compute_seconds": 1.0, "compute_seconds_min": 0.9, "sync_seconds": 0.2,
     "reduce_seconds": 0.01, "reducers": 0, "updates": 4, "time": 1700000000.0}

``seconds`` is the step's wall time on the master, ``compute_seconds`` the slowest
worker's compute time (``compute_seconds_min`` the fastest's: their gap is the time the
others waited), ``sync_seconds`` the rest (transfers, waiting, reduce),
``reduce_seconds`` the reduce and evaluation, and ``reducers`` how many workers reduced
the updates among themselves (0: the master did); ``updates`` how many updates the shards' results
came in (fewer than ``shards`` where workers combined theirs); ``time`` is a Unix timestamp. A
training loop that runs in one process may write its own progress records (no
``step``; it may tag them ``"event": "epoch"``): they count as progress because
they carry a ``phase``.

**Event record**: something that happened (see :func:`event_record`)::

    {"event": "worker_lost", "time": 1700000000.0, <fields of the event>}

Events of the runtime: ``worker_registered``, ``worker_lost``, ``resumed``,
``done``, ``resized``, ``worker_retired`` (master); ``worker_restarted``, ``worker_gave_up`` (local launcher); ``container_lost``
and ``containers_pending``
(YARN's application master: a worker container ended, and why; containers YARN has no room for:
:mod:`iterreduce.launch.yarn.keeper`).

A resumed job appends to the same file and logs again the steps it redoes;
:func:`progress` keeps the latest record of each step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

from ..redact import redact_all

#: The log's file name in a job's output directory.
LOG_NAME = "log.jsonl"


def log_path(directory) -> Path:
    """The log of the job whose output directory is ``directory``."""
    return Path(directory) / LOG_NAME


# ------------------------------------------------------------------ records


def step_record(step: int, of: int, phase: str, fields: dict, *, shards: int, shards_total: int,
                seconds: float, compute_seconds: float, reduce_seconds: float, reducers: int = 0,
                compute_seconds_min: float | None = None, updates: int | None = None) -> dict:
    """The progress record of superstep ``step`` of ``of``; ``fields`` are the program's
    keys (step info, summary, metrics). ``sync_seconds`` is derived: seconds - compute.
    ``reducers``: how many workers reduced the step's updates (0: the master did);
    ``compute_seconds_min``: the fastest worker's compute time (default: the slowest's);
    ``updates``: the updates the shards' results came in (default: one a shard)."""
    return {
        "step": step, "of": of, "phase": phase, **fields,
        "shards": shards, "shards_total": shards_total,
        "seconds": seconds, "compute_seconds": compute_seconds,
        "compute_seconds_min": compute_seconds if compute_seconds_min is None else compute_seconds_min,
        "sync_seconds": max(seconds - compute_seconds, 0.0), "reduce_seconds": reduce_seconds,
        "reducers": reducers, "updates": shards if updates is None else updates, "time": time.time(),
    }


def event_record(event: str, **fields) -> dict:
    """An event record stamped with the current Unix time (a ``time`` in ``fields`` wins)."""
    return {"event": event, "time": time.time(), **fields}


def is_progress(record: dict) -> bool:
    """Whether ``record`` is a progress record (it has a ``phase``), not a bare event."""
    return "phase" in record


# ------------------------------------------------------------------ writing


class RunLog:
    """Appends records to a log file, each written and flushed as it comes.

    Several processes may append to one log (the master and its launcher): every
    record is a single ``write`` to a file opened for appending, so lines never mix.
    The log is never opened through a link
    (:class:`~iterreduce.exceptions.ForeignFileError`), and one sharing its bytes with another
    name through hard links is first replaced by a private copy
    (:func:`iterreduce.storage.durable.open_append`).
    """

    def __init__(self, path):
        from .durable import open_append  # here: reading a log needs none of durable's pyarrow

        self.path = Path(path)
        self._file = open_append(self.path)

    def write(self, record: dict) -> dict:
        """Append ``record`` (a progress record, or any record built by the caller), with any
        password in a URI hidden (:func:`iterreduce.redact.redact_all`); returns it."""
        self._file.write((json.dumps(redact_all(record)) + "\n").encode("utf-8"))
        return record

    def event(self, event: str, **fields) -> dict:
        """Append an event record stamped with the current time; returns it."""
        return self.write(event_record(event, **fields))

    def close(self) -> None:
        """Close the file; later writes raise ``ValueError``."""
        self._file.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------ reading


def _parse(line: bytes | str, where: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
        raise ValueError(f"{where}: not valid JSON ({exc.msg}): {text.strip()[:80]!r}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record


def read_records(path) -> list[dict]:
    """Every record of the log at ``path``, in order; blank lines are skipped.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the
    file and line for a line that is not a JSON object.
    """
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        return [_parse(line, f"{path}, line {lineno}") for lineno, line in enumerate(f, 1) if line.strip()]


def progress(records: Iterable[dict]) -> list[dict]:
    """The progress records among ``records``, in order, each step once.

    When a resumed run logs a step again, its later record replaces the earlier one
    in place, so the result describes the last run of every step.
    """
    kept: list[dict] = []
    by_step: dict[int, int] = {}
    for record in records:
        if not is_progress(record):
            continue
        if "step" in record:
            if record["step"] in by_step:
                kept[by_step[record["step"]]] = record
                continue
            by_step[record["step"]] = len(kept)
        kept.append(record)
    return kept


def read_progress(path) -> list[dict]:
    """:func:`progress` of the log at ``path`` (errors as :func:`read_records`)."""
    return progress(read_records(path))


def seconds_by_phase(records: Iterable[dict]) -> dict[str, dict]:
    """Per phase, ``{"steps": n, "seconds": s, "sync_seconds": s}`` summed over the step records.

    Pass the result of :func:`progress` to count each step's last run once. Records
    without a ``step`` are left out: their ``seconds`` are not the master's step times.
    """
    totals: dict[str, dict] = {}
    for record in records:
        if "step" not in record or not is_progress(record):
            continue
        total = totals.setdefault(record["phase"], {"steps": 0, "seconds": 0.0, "sync_seconds": 0.0})
        total["steps"] += 1
        total["seconds"] += record.get("seconds", 0.0)
        total["sync_seconds"] += record.get("sync_seconds", 0.0)
    return totals


# ------------------------------------------------------------------ tailing


class Follower:
    """Reads the records appended to a log since the last call (e.g. while a job runs).

    Only complete lines are read: a line still being written is left for the next
    call. A log that does not exist yet reads as empty.
    """

    def __init__(self, path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset  # bytes already read

    @classmethod
    def at_end(cls, path) -> Follower:
        """A follower that skips what the log holds now (e.g. an earlier run's records)."""
        path = Path(path)
        return cls(path, path.stat().st_size if path.exists() else 0)

    def poll(self, errors: list | None = None) -> list[dict]:
        """The records of the complete lines written since the last call.

        Raises ``ValueError`` naming the file and byte offset for a line that is not a JSON
        object; with an ``errors`` list, that message goes there instead and the line is skipped.
        """
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        records = []
        start = 0
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines(keepends=True):
            if line.strip():
                try:
                    records.append(_parse(line, f"{self.path}, byte {self.offset + start}"))
                except ValueError as exc:
                    if errors is None:
                        raise
                    errors.append(str(exc))
            start += len(line)
        self.offset += end
        return records
