"""Master checkpoints: parameters + position in the schedule, written atomically.

A checkpoint is an ``.npz`` of the parameter arrays plus a JSON header with the
next superstep, the job seed and a fingerprint of the job (program, its
configuration, seed, shard sizes and schedule) that a resume must match. Files are named
``ckpt-<step>.npz`` so the newest is the one with the highest step.

A directory may also hold checkpoints of other jobs (an earlier run into the same output
directory), or of other runs of the same job (another submission): pruning only ever removes
checkpoints of the run being saved (the same ``fingerprint`` and ``run`` in the header), and
a resume asks :func:`latest` for the newest checkpoint *of its own job* (``fingerprint``), or
of its own run (``run``: a restarted run must not continue another submission's).
"""

from __future__ import annotations

import io
import json
import logging
import re
import threading
import time
from concurrent import futures
from typing import Callable

import numpy as np
import pyarrow.fs as pafs

from ..exceptions import CheckpointError, CheckpointTimeout
from ..storage import npzfile
from ..storage.filesystems import filesystem, join, open_output_file

log = logging.getLogger("iterreduce.checkpoint")

_HEADER = "__checkpoint__"
_NAME = re.compile(r"ckpt-(\d{9})\.npz$")


def _encode(header: dict, arrays: dict) -> bytes:
    payload = {k: np.asarray(v, order="C") for k, v in arrays.items()}
    payload[_HEADER] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **payload)
    return buf.getvalue()


def save(directory: str, step: int, header: dict, arrays: dict, keep: int = 2) -> str:
    """Write checkpoint ``step`` under ``directory`` (any URI); keep the newest ``keep`` of this
    run (checkpoints whose header has the same ``fingerprint`` and ``run``; other jobs' and other
    runs' are never pruned)."""
    fs, path = filesystem(directory)
    name = f"ckpt-{step:09d}.npz"
    try:  # written whole or not at all (a rerun's checkpoint of this step is replaced)
        with open_output_file(join(directory, name), resolve=filesystem) as out:
            out.write(_encode({**header, "step": step}, arrays))
    except OSError as exc:  # a full disk, a quota, lost permissions: no partial file is left behind
        kept = [n for n in _list(fs, path) if n != name]
        raise CheckpointError(f"{join(directory, name)}: cannot write the checkpoint ({exc}); free space there "
                              f"or choose another output directory" +
                              (f"; the job can resume from {kept[-1]}" if kept else "")) from exc
    # Never prune the one just written, nor another job's or another run's (an earlier run's, another
    # submission's) checkpoints: those would otherwise push this run's own out, and they are not its to delete.
    fingerprint, run = header.get("fingerprint"), header.get("run")
    ours = [n for n in _list(fs, path) if n != name and _fingerprint(fs, join(path, n)) == fingerprint
            and _fingerprint(fs, join(path, n), "run") == run]
    for old in ours[:max(0, len(ours) - (keep - 1))] if keep > 0 else []:
        fs.delete_file(join(path, old))
    return join(directory, name)


#: The longest the first checkpoint write may take; later ones may take 10 times the slowest
#: before them (at least :data:`MIN_WRITE_TIMEOUT_S`). Past that the write is given up as hung.
FIRST_WRITE_TIMEOUT_S = 600.0
MIN_WRITE_TIMEOUT_S = 30.0
#: A checkpoint write that fails is tried again after each of these pauses: a busy DataNode now and
#: then refuses a write pipeline (hdfs-native: "All nodes failed for write", a RuntimeError), and a
#: checkpoint is written whole or not at all, so a second try is safe.
WRITE_RETRY_PAUSES_S = (1.0, 5.0)


class Writer:
    """Saves checkpoints in a background thread, so that the next superstep computes while one is
    written (the MNIST network's 13 MB took 20-70 ms a step on local disk, more on HDFS: a
    quarter of a one-GPU job's time went to writes the workers waited for).

    At most one write is in flight: :meth:`save` first waits for the one before and raises the
    error it met (:class:`CheckpointError`), so a job whose checkpoints fail stops one step
    later than it did, and the checkpoint taken after step k is complete before step k + 2
    starts (a killed master redoes at most one step more than with synchronous writes).
    :meth:`flush` waits for the last. ``on_saved(step, uri)`` is called from the writer's
    thread once a checkpoint is complete. The arrays must not change in place
    while they are written (the master replaces its parameters, never writes into them).

    A write is waited for a bounded time (:data:`FIRST_WRITE_TIMEOUT_S`, then ten times the
    slowest so far): past it :meth:`flush` raises :class:`CheckpointTimeout`, and the write's
    thread (a daemon) is left behind, so that a hung HDFS client cannot hang the job."""

    def __init__(self, on_saved: Callable[[int, str], None] | None = None):
        self._pending: tuple[futures.Future, int, str] | None = None
        self._on_saved = on_saved
        self.slowest: float | None = None  # seconds of the slowest write so far

    @property
    def timeout(self) -> float:
        """How long the write in flight is waited for."""
        return FIRST_WRITE_TIMEOUT_S if self.slowest is None else max(MIN_WRITE_TIMEOUT_S, 10 * self.slowest)

    def save(self, directory: str, step: int, header: dict, arrays: dict, keep: int = 2) -> None:
        """Start writing checkpoint ``step`` (see :func:`save`) once the one before is written."""
        self.flush()
        future: futures.Future = futures.Future()

        def write() -> None:
            try:
                future.set_result(self._write(directory, step, header, dict(arrays), keep))
            except BaseException as exc:  # noqa: BLE001 - handed to flush()
                future.set_exception(exc)

        threading.Thread(target=write, name=f"checkpoint-{step}", daemon=True).start()
        self._pending = (future, step, directory)

    def _write(self, directory, step, header, arrays, keep) -> str:
        started = time.perf_counter()
        for pause in (*WRITE_RETRY_PAUSES_S, None):
            try:
                uri = save(directory, step, header, arrays, keep)
                break
            except (OSError, RuntimeError, CheckpointError) as exc:
                if pause is None:
                    raise
                log.warning("checkpoint %d: the write failed (%s); trying again in %g s", step, exc, pause)
                time.sleep(pause)
        seconds = time.perf_counter() - started
        self.slowest = max(self.slowest or 0.0, seconds)
        log.debug("checkpoint %d written in %.4f s", step, seconds)
        if self._on_saved is not None:
            self._on_saved(step, uri)
        return uri

    def flush(self) -> str | None:
        """Wait for the write in flight; its URI (None when there was none), or its error
        (:class:`CheckpointTimeout` when it did not end in :attr:`timeout` seconds)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        future, step, directory = pending
        try:
            return future.result(timeout=self.timeout)
        except futures.TimeoutError:
            raise CheckpointTimeout(
                f"{directory}: checkpoint {step} still not written after {self.timeout:.0f} s (an HDFS client "
                f"waits forever on a DataNode lost mid-write): given up; the newest complete checkpoint "
                f"stays") from None

    def close(self) -> None:
        """Wait (a bounded time) for the write in flight without raising its error: a failing
        job's own error is the one to report."""
        pending, self._pending = self._pending, None
        if pending is not None:
            futures.wait([pending[0]], timeout=self.timeout)


def _list(fs, path) -> list[str]:
    try:
        entries = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except FileNotFoundError:
        return []
    return sorted(e.base_name for e in entries if _NAME.match(e.base_name))


_UNREADABLE = object()  # the fingerprint of a checkpoint whose header cannot be read: matches no job


def _fingerprint(fs, path, field="fingerprint"):
    """The ``fingerprint`` (or another ``field``, e.g. ``run``) in a checkpoint's header (None
    when it has none), reading only the header; :data:`_UNREADABLE` for a file that is no
    readable checkpoint."""
    try:
        with fs.open_input_file(path) as f:
            header = npzfile.read_npz(f, f.size(), only={_HEADER})[_HEADER]
        return _header(header).get(field)
    except (OSError, KeyError, ValueError, RecursionError) as exc:
        log.warning("%s: unreadable checkpoint header, ignored: %s", path, exc)
        return _UNREADABLE


def latest(directory: str, fingerprint: str | None = None, run: str | None = None) -> str | None:
    """URI of the newest checkpoint in ``directory``, or None.

    With ``fingerprint``, the newest whose header holds that fingerprint, i.e. the newest of
    that job: checkpoints of other jobs (and unreadable files) are passed over. With ``run``
    too, the newest of that job whose header holds that ``run`` (the run id of the submission
    that wrote it): another submission's checkpoints of the same job are passed over as well.
    """
    if run is not None and fingerprint is None:
        raise ValueError("latest: a run's checkpoints are looked up by the job's fingerprint too")
    fs, path = filesystem(directory)
    for name in reversed(_list(fs, path)):  # newest first: most often the first one is it
        uri = join(path, name)
        if fingerprint is None or (_fingerprint(fs, uri) == fingerprint
                                   and (run is None or _fingerprint(fs, uri, "run") == run)):
            return join(directory, name)
    return None


def load(uri: str) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a checkpoint; returns (header, arrays). Read through :func:`iterreduce.storage.npzfile.read_npz`:
    a crafted or corrupt file allocates no more than its limits allow and raises
    :class:`CheckpointError` naming the file."""
    fs, path = filesystem(uri)
    try:
        with fs.open_input_file(path) as f:
            arrays = npzfile.read_npz(f, f.size())
        if _HEADER not in arrays:
            raise KeyError(f"no {_HEADER} array")
        header = _header(arrays.pop(_HEADER))
    except (OSError, KeyError, ValueError, RecursionError) as exc:  # NpzError is a ValueError
        raise CheckpointError(f"{uri}: unreadable checkpoint: {exc}") from exc
    return header, arrays


def _header(raw: np.ndarray) -> dict:
    """A checkpoint's header array as the JSON object it holds; ``ValueError`` for anything else."""
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError(f"header of {raw.dtype} and shape {raw.shape}, not JSON text")
    header = json.loads(raw.tobytes().decode())
    if not isinstance(header, dict):
        raise ValueError(f"header is a JSON {type(header).__name__}, not an object")
    return header
