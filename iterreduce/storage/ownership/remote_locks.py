"""The lock of a folder on a file system without ``flock`` (HDFS): the file
:data:`~.names.LOCK_NAME`, created only if absent (:func:`create_exclusive`), naming its holder
as JSON (``token``, ``pid``, ``host``, ``since``, later ``app_id``). A lock already there is
replaced only once its holder is found gone, and only if it is still the lock that was read
(:func:`acquire_remote`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os

import pyarrow as pa
import pyarrow.fs as pafs

from ...exceptions import OutputBusy, OutputExists
from .. import durable
from ..filesystems import open_output_file
from .folders import ArrowFolder
from .holders import JOB, LOCK_MAX_BYTES, Writer, busy, describe_holder, ended_here, this_process
from .names import LOCK_NAME, STALE_SUFFIX

log = logging.getLogger(__name__)


def create_exclusive(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    """Create the file ``path`` holding ``data`` only if nothing is there; returns False when a
    file is already there. The file appears whole, by :func:`~iterreduce.storage.filesystems.open_output_file`
    without overwrite (:func:`~iterreduce.storage.durable.place_new`): atomic among all clients on HDFS
    (the NameNode's rename without OVERWRITE) and on local disk (``link(2)``); elsewhere a look,
    then a move."""
    try:
        with open_output_file(path, resolve=lambda _: (fs, path), overwrite=False) as f:
            f.write(data)
    except OutputExists:
        return False
    return True


def _read_lock(folder: ArrowFolder, rel: str = LOCK_NAME) -> bytes | None:
    """The bytes of the lock file ``rel`` of ``folder`` (None where it is gone), never many."""
    return folder.read(rel, LOCK_MAX_BYTES)


class RemoteLock:
    """The lock of an output folder on a file system without ``flock`` (see the module
    docstring), as its holder ``held`` took it. Take it with :func:`acquire_remote`."""

    def __init__(self, folder: ArrowFolder, held: dict):
        self.folder, self.held = folder, held
        self.path = folder.path(LOCK_NAME)

    def _is_mine(self) -> bool:
        try:
            raw = _read_lock(self.folder)
            return raw is not None and json.loads(raw).get("token") == self.held["token"]
        except (ValueError, AttributeError, RecursionError):
            return False

    def name_holder(self, **fields) -> None:
        """Add ``fields`` (e.g. ``app_id``: the job that now holds the folder) to the lock file."""
        if not self._is_mine():
            raise OutputBusy(f"{self.path}: the lock of this output folder is no longer this submission's")
        self.held.update(fields)
        self.folder.write(LOCK_NAME, json.dumps(self.held).encode())

    def release(self) -> None:
        """Delete the lock file, if it is still this holder's."""
        with contextlib.suppress(OSError, pa.ArrowException):
            if self._is_mine():
                self.folder.fs.delete_file(self.path)


def shard_writer_running(held: dict) -> str | None:
    """What still writes into a remote shard folder whose lock names ``held`` (the ``running``
    of :func:`acquire_remote` for :func:`~.locks.shard_folder`), or None when it is gone: a process of
    this host that has ended. Any other holder counts as running (this process cannot see
    another host's processes): its lock has to be deleted by hand if it is gone."""
    if not held:
        return "a lock file that is not readable (delete it if nothing writes there)"
    if not held.get("app_id") and ended_here(held):
        return None
    return f"{describe_holder(held)} (delete the lock if it is gone)"


def _remove_stale_lock(folder: ArrowFolder, stale: bytes) -> None:
    """Delete the lock file of ``folder`` of a holder found gone only if it still holds ``stale``
    (the bytes read from it). A read, then a delete, would delete a lock another submission
    took in between; instead it is first renamed to a fresh hidden name (atomic, and refused
    where the lock is gone) and read there: a new holder's lock goes back in place untouched."""
    aside = durable.hidden_name(LOCK_NAME, STALE_SUFFIX)
    try:
        folder.move(LOCK_NAME, aside)
    except (OSError, pa.ArrowException):
        if folder.entry(LOCK_NAME) is None:
            return  # let go in the meantime
        raise
    if _read_lock(folder, aside) == stale:
        folder.remove_file(aside)
    elif not durable.place_new(folder.fs, folder.path(aside), folder.path(LOCK_NAME)):
        # a third submission took the name in the moment it was free
        log.warning("%s: the lock of a new holder, taken while a gone holder's lock was replaced, is left in %s: "
                    "another submission took the lock meanwhile", folder.path(LOCK_NAME), folder.path(aside))


def _holder_said(raw: bytes) -> dict:
    """The holder a lock file's bytes name; ``{}`` where they are not a JSON object."""
    try:
        held = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return held if isinstance(held, dict) else {}


def acquire_remote(fs: pafs.FileSystem, path: str, uri: str, *, running,
                   what: str = JOB.what, advice: str = JOB.advice) -> RemoteLock:
    """Take the lock of output folder ``path`` (``uri``) on ``fs`` with the file system's
    create-if-absent (:func:`create_exclusive`). A lock already there is asked
    ``running(held)`` (the holder as the lock file says it, ``{}`` when unreadable): a string
    saying what still runs refuses the folder (:class:`~iterreduce.exceptions.OutputBusy`,
    naming the folder and the holder: "another ``what``", then ``advice``);
    None means the holder is gone, and its lock is replaced (:func:`_remove_stale_lock`: only
    if it is still the one read), then created afresh."""
    folder = ArrowFolder(fs, path)
    lock = folder.path(LOCK_NAME)
    mine = {"token": os.urandom(12).hex(), **this_process(), "app_id": None}
    for _ in range(3):
        if create_exclusive(fs, lock, json.dumps(mine).encode()):
            return RemoteLock(folder, mine)
        raw = _read_lock(folder)
        if raw is None:
            continue  # let go in the meantime
        still = running(_holder_said(raw))
        if still:
            raise busy(uri, Writer(what, advice), f"{still}; its lock: {lock}")
        _remove_stale_lock(folder, raw)
    raise OutputBusy(f"{uri}: could not take this output folder's lock {lock}: other submissions keep taking it")
