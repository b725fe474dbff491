"""Ownership of output folders: the runtime deletes, moves or overwrites only files it wrote
itself and can prove it, and one run at a time writes into an output folder.

Three records, each defined here once:

- :data:`LOCK_NAME`, the **lock** of a run's output folder (:func:`hold`): an exclusive
  ``flock`` held for the whole run on a file of that name in the folder, which holds the
  holder's pid, host and start time as text. The kernel lets it go when the process ends,
  however it ends: no stale lock. A second run into the folder is refused at once
  (:class:`~iterreduce.exceptions.OutputBusy`) naming the folder and the holder. On HDFS,
  where there is no ``flock``, :func:`create_exclusive` gives the NameNode's
  create-if-absent instead (see :mod:`dbn.jobs.yarn` for how a submission uses it).
- :data:`RECORD_NAME`, the **run record** in a run's output folder and in every
  ``previous/N`` folder the runtime makes: the names the run claimed (it writes them while
  holding the lock, so whatever is found under them is its own, even after a crash) and,
  once the run ends, every file it left under them with its size and modification time.
  :func:`foreign_file` finds the first file under given names that the record does not prove
  the runtime's: such a file is never moved, overwritten or deleted.
- :data:`MANIFEST_NAME`, the **shard manifest** beside a set of shards
  (:func:`start_shard_set`, :func:`finish_shard_set`): the file names written, with their
  sizes. A later write replaces only files the manifest lists (and whose size still
  matches it); a folder holding anything else is refused, touching no byte. It works on any
  pyarrow file system (local disk, HDFS).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from .exceptions import ForeignFileError, OutputBusy, OutputExists
from .filesystems import open_output_file
from .runlog import LOG_NAME

#: The lock file in a run's output folder (see the module docstring).
LOCK_NAME = ".iterreduce.lock"
#: The run record in a run's output folder and in each ``previous/N`` (see the module docstring).
RECORD_NAME = ".iterreduce-files.json"
#: The shard manifest beside a set of shards. A leading ``_``, like Hadoop's ``_SUCCESS``: Spark,
#: Hive and pyarrow's dataset readers pass over it.
MANIFEST_NAME = "_iterreduce_shards.json"
#: Files of the runtime's own bookkeeping in an output folder: never another's, never moved.
BOOKKEEPING = (LOCK_NAME, RECORD_NAME)
#: Where earlier runs' files are kept in an output folder: ``previous/1``, ``2``, ... (the highest is the newest).
PREVIOUS = "previous"
#: What a run of the runtime writes in its output folder (:func:`iterreduce.local.run_local`).
RUN_FILES = (LOG_NAME, "checkpoints", "logs", "job.json", "error.txt", "master.json")


# ------------------------------------------------------------------ the lock


def holder_text() -> str:
    """Who holds a lock: this process's pid, host, start time and command line, one line."""
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300] if sys.argv and sys.argv[0] else "python"
    return (f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%dT%H:%M:%S%z')} "
            f"({command})")


_held: dict[tuple[str, int], list] = {}  # (real path, thread) -> [fd, depth]: hold() is re-entrant per thread
_held_guard = threading.Lock()


@contextlib.contextmanager
def hold(folder):
    """Hold the output folder ``folder`` (made if missing) for a run, for the ``with`` block.

    An exclusive ``flock`` on :data:`LOCK_NAME` in it; the file then says who holds it. A
    folder another process (or another thread of this one) holds raises
    :class:`~iterreduce.exceptions.OutputBusy` at once, naming the folder and the holder.
    The same thread may hold a folder again (nested runs of one command): the lock is let go
    when the outermost ``with`` ends, or by the kernel when the process dies."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = (os.path.realpath(folder), threading.get_ident())
    with _held_guard:
        if key in _held:
            _held[key][1] += 1
            entered = True
        else:
            entered = False
    if entered:
        try:
            yield folder
        finally:
            with _held_guard:
                _held[key][1] -= 1
        return
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise OutputBusy(f"{folder}: another run is writing into this output folder ({holder(folder)}); "
                         f"wait for it to end, or choose another output folder (--out)") from None
    try:
        text = (holder_text() + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
        with _held_guard:
            _held[key] = [fd, 1]
        yield folder
    finally:
        with _held_guard:
            _held.pop(key, None)
        os.close(fd)  # lets the flock go


def holder(folder) -> str:
    """What the lock file in ``folder`` says of its holder (a few words when it says nothing yet)."""
    try:
        text = (Path(folder) / LOCK_NAME).read_text(errors="replace").strip()
    except OSError:
        text = ""
    return f"held by {text}" if text else "its holder is starting"


# ------------------------------------------------------------------ the run record


def _identity(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


class RunRecord:
    """The run record of one folder (see the module docstring): ``claimed`` names (written
    under the lock, not yet inventoried), ``files`` (relative path -> [size, mtime_ns]) and
    ``folders`` (relative paths) the runtime left there."""

    def __init__(self, folder, claimed=(), files=None, folders=()):
        self.folder = Path(folder)
        self.claimed = set(claimed)
        self.files = dict(files or {})
        self.folders = set(folders)

    @classmethod
    def read(cls, folder) -> "RunRecord":
        """The record in ``folder``; an empty one where there is none or it is unreadable
        (then nothing there is proven the runtime's)."""
        try:
            data = json.loads((Path(folder) / RECORD_NAME).read_text())
            return cls(folder, data.get("claimed", ()), {k: list(v) for k, v in data.get("files", {}).items()},
                       data.get("folders", ()))
        except (OSError, ValueError, TypeError, AttributeError):
            return cls(folder)

    def write(self) -> None:
        """Save the record, atomically (a temporary file renamed over it)."""
        data = {"written_by": "iterreduce", "claimed": sorted(self.claimed), "files": dict(sorted(self.files.items())),
                "folders": sorted(self.folders)}
        tmp = self.folder / f"{RECORD_NAME}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, self.folder / RECORD_NAME)

    def owns(self, rel: str) -> bool:
        """Whether the file or folder ``rel`` (relative to the folder) is provably the runtime's:
        under a claimed name, or recorded as it is now (a folder: with everything in it)."""
        if rel.split("/", 1)[0] in self.claimed:
            return True
        path = self.folder / rel
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            return False
        if path.is_file():
            return self.files.get(rel) == _identity(path)
        return rel in self.folders and all(self.owns(f"{rel}/{child.name}") for child in path.iterdir())

    def forget(self, name: str) -> None:
        """Drop ``name`` and everything under it from the record (it moved away)."""
        self.claimed.discard(name)
        self.files = {k: v for k, v in self.files.items() if k != name and not k.startswith(f"{name}/")}
        self.folders = {k for k in self.folders if k != name and not k.startswith(f"{name}/")}

    def take_inventory(self, names) -> None:
        """Record every file and folder now under ``names`` as the runtime's, and the claims on them settled."""
        for name in names:
            self.forget(name)
            path = self.folder / name
            if path.is_file() and not path.is_symlink():
                self.files[name] = _identity(path)
            elif path.is_dir() and not path.is_symlink():
                self.folders.add(name)
                for sub in path.rglob("*"):
                    rel = sub.relative_to(self.folder).as_posix()
                    if sub.is_symlink():
                        continue
                    if sub.is_dir():
                        self.folders.add(rel)
                    elif sub.is_file():
                        self.files[rel] = _identity(sub)


def foreign_file(folder, names) -> str | None:
    """The first file (or folder) under ``names`` in ``folder`` that its run record does not
    prove the runtime's, as a path; None when every one there is."""
    folder = Path(folder)
    record = RunRecord.read(folder)
    for name in names:
        path = folder / name
        if not (path.exists() or path.is_symlink()) or record.owns(name):
            continue
        if path.is_dir() and not path.is_symlink():  # name the file inside that is not the runtime's
            for sub in sorted(path.rglob("*")):
                rel = sub.relative_to(folder).as_posix()
                if not sub.is_dir() and not record.owns(rel):
                    return str(sub)
        return str(path)
    return None


def check_owned(folder, names) -> None:
    """Refuse (:class:`~iterreduce.exceptions.ForeignFileError`, naming the file) an output
    folder holding a file under ``names`` that the runtime cannot prove it wrote."""
    found = foreign_file(folder, names)
    if found is not None:
        record = Path(folder) / RECORD_NAME
        why = (f"no record of it in {record}" if record.is_file() else
               f"the folder has no run record {RECORD_NAME}: another tool's files, or a run of a version of this "
               f"tool that kept none")
        raise ForeignFileError(f"{found}: in the way of this run's files, and not provably written by a run of this "
                               f"tool ({why}); it is left as it is: choose another output folder (--out), or move "
                               f"it away")


def claim(folder, names) -> None:
    """Record that a run is about to write ``names`` in ``folder`` (call it holding the lock,
    after :func:`check_owned`): what is found under them later is the runtime's."""
    record = RunRecord.read(folder)
    record.claimed |= set(names)
    record.write()


def settle(folder, names) -> None:
    """Record what a run left under those of ``names`` in ``folder`` that were claimed
    (:func:`claim`) (file sizes and times), at its end. Names not claimed are left out: a run
    refused before it claimed anything records nothing."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    record = RunRecord.read(folder)
    claimed = [name for name in names if name in record.claimed]
    if claimed:
        record.take_inventory(claimed)
        record.write()


def remove_owned(folder) -> bool:
    """Delete what ``folder``'s run record proves the runtime's (files as recorded, what is
    under names claimed by a move cut short, then the recorded folders left empty); the record
    and the folder go too when nothing else is left. Returns whether the folder is gone.
    Anything else in it stays, byte for byte; a folder whose record is missing or unreadable
    is left whole."""
    folder = Path(folder)
    record = RunRecord.read(folder)
    if not (record.files or record.claimed or record.folders):
        return False
    for rel in sorted(record.files):
        if record.owns(rel) and (folder / rel).is_file():
            (folder / rel).unlink()
    for name in sorted(record.claimed):
        path = folder / name
        if path.is_file() or path.is_symlink():
            path.unlink()
        elif path.is_dir():
            for sub in sorted(path.rglob("*"), key=lambda p: -len(p.parts)):  # the deepest first
                if sub.is_dir() and not sub.is_symlink():
                    with contextlib.suppress(OSError):
                        sub.rmdir()
                else:
                    sub.unlink()
            with contextlib.suppress(OSError):
                path.rmdir()
    for rel in sorted(record.folders, key=lambda r: -r.count("/")):  # the deepest first
        with contextlib.suppress(OSError):  # not empty: something not the runtime's is in it
            (folder / rel).rmdir()
    if any(p.name != RECORD_NAME for p in folder.iterdir()):
        record.claimed = set()
        record.files = {k: v for k, v in record.files.items() if (folder / k).is_file()}
        record.folders = {k for k in record.folders if (folder / k).is_dir()}
        record.write()
        return False
    (folder / RECORD_NAME).unlink(missing_ok=True)
    folder.rmdir()
    return True


# ------------------------------------------------------------------ HDFS: create if absent


def create_exclusive(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    """Create the file ``path`` holding ``data`` only if nothing is there; returns False when a
    file is already there. The file appears whole, by :func:`~iterreduce.filesystems.open_output_file`
    without overwrite (:func:`~iterreduce.durable.place_new`): atomic among all clients on HDFS
    (the NameNode's rename without OVERWRITE) and on local disk (``link(2)``); elsewhere a look,
    then a move."""
    try:
        with open_output_file(path, resolve=lambda _: (fs, path), overwrite=False) as f:
            f.write(data)
    except OutputExists:
        return False
    return True


# ------------------------------------------------------------------ shard manifests


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def read_manifest(fs: pafs.FileSystem, path: str) -> dict:
    """The shard manifest in folder ``path`` (``{"files": {name: size or None}, "notes": {...}}``);
    empty where there is none or it is unreadable (then nothing there is proven the runtime's)."""
    try:
        with fs.open_input_stream(_join(path, MANIFEST_NAME), compression=None) as f:
            data = json.loads(f.read())
        files = data.get("files", {})
        if not isinstance(files, dict):
            raise ValueError("files")
        return {"files": dict(files), "notes": dict(data.get("notes", {}))}
    except (OSError, pa.ArrowException, ValueError, TypeError, AttributeError):
        return {"files": {}, "notes": {}}


def _write_manifest(fs: pafs.FileSystem, path: str, manifest: dict) -> None:

    text = json.dumps({"written_by": "iterreduce", "files": dict(sorted(manifest["files"].items())),
                       "notes": manifest.get("notes", {})}, indent=1).encode()
    target = _join(path, MANIFEST_NAME)
    with open_output_file(target, resolve=lambda _: (fs, target)) as f:  # whole, or the earlier one
        f.write(text)


def _ours(entry: pafs.FileInfo, files: dict) -> bool:
    """Whether a folder entry is a shard file the manifest ``files`` lists as it is (its size;
    None: being written), or a hidden leftover of an interrupted write of one
    (``.NAME.<8 hex>.tmp`` / ``.old``, :mod:`iterreduce.durable`'s names)."""
    name = entry.base_name
    if entry.type != pafs.FileType.File:
        return False
    if name in files:
        return files[name] is None or files[name] == entry.size
    if name.startswith(".") and name.endswith((".tmp", ".old")):
        listed = name[1:].rsplit(".", 2)[0]
        return listed in files or listed == MANIFEST_NAME
    return False


def start_shard_set(fs: pafs.FileSystem, path: str, uri: str, names: list[str], prefix: str) -> None:
    """Make folder ``path`` (``uri``) ready for the shard files ``names`` of a set whose names
    start with ``prefix`` + "-": refuse it (:class:`~iterreduce.exceptions.ForeignFileError`,
    naming one file, touching nothing) if it holds anything its manifest does not list as it
    is; else record the new names as being written and delete the listed files of the set
    they replace (an earlier write with the same prefix). Other listed sets stay."""
    fs.create_dir(path, recursive=True)
    manifest = read_manifest(fs, path)
    files = manifest["files"]
    replaced = []
    for entry in sorted(fs.get_file_info(pafs.FileSelector(path)), key=lambda e: e.base_name):
        if entry.base_name == MANIFEST_NAME:
            continue
        if not _ours(entry, files):
            raise ForeignFileError(
                f"{uri}: holds {entry.base_name}, which this tool did not write (not listed as it is in "
                f"{MANIFEST_NAME}): shards are written into an empty folder or one holding shards written here; "
                f"nothing was changed: choose another folder")
        if entry.base_name not in files or entry.base_name.startswith(f"{prefix}-") or entry.base_name in names:
            replaced.append(entry)
    # First the record of what may be there now (old and new names, sizes unknown): an
    # interrupted write leaves nothing the next one cannot prove its own.
    manifest["files"] = {**files, **{e.base_name: None for e in replaced if e.base_name in files},
                         **{name: None for name in names}}
    _write_manifest(fs, path, manifest)
    for entry in replaced:
        fs.delete_file(entry.path)
        if entry.base_name not in names:
            manifest["files"].pop(entry.base_name, None)
    _write_manifest(fs, path, manifest)


def finish_shard_set(fs: pafs.FileSystem, path: str, names: list[str]) -> None:
    """Record the shard files ``names`` in folder ``path`` with their sizes, once written."""
    manifest = read_manifest(fs, path)
    for name in names:
        manifest["files"][name] = fs.get_file_info(_join(path, name)).size
    _write_manifest(fs, path, manifest)


def shard_note(fs: pafs.FileSystem, path: str, key: str):
    """A note kept in the shard manifest of folder ``path`` under ``key`` (None if none), e.g.
    what the shards were cut from."""
    return read_manifest(fs, path)["notes"].get(key)


def set_shard_note(fs: pafs.FileSystem, path: str, key: str, value) -> None:
    """Keep ``value`` (JSON) under ``key`` in the shard manifest of folder ``path``."""
    manifest = read_manifest(fs, path)
    manifest["notes"][key] = value
    _write_manifest(fs, path, manifest)


# ------------------------------------------------------------------ remote output folders (HDFS)


def _read_bytes(fs: pafs.FileSystem, path: str) -> bytes | None:
    try:
        with fs.open_input_stream(path, compression=None) as f:
            return f.read()
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException) as exc:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        raise OSError(f"{path}: cannot read: {exc}") from exc


class RemoteLock:
    """The lock of an output folder on a file system without ``flock`` (HDFS): the file
    :data:`LOCK_NAME`, created only if absent (:func:`create_exclusive`), naming its holder as
    JSON (``token``, ``pid``, ``host``, ``since``, later ``app_id``). Take it with
    :func:`acquire_remote`."""

    def __init__(self, fs: pafs.FileSystem, path: str, held: dict):
        self.fs, self.path, self.held = fs, path, held

    def _is_mine(self) -> bool:
        raw = _read_bytes(self.fs, self.path)
        try:
            return raw is not None and json.loads(raw).get("token") == self.held["token"]
        except (ValueError, AttributeError):
            return False

    def name_holder(self, **fields) -> None:
        """Add ``fields`` (e.g. ``app_id``: the job that now holds the folder) to the lock file."""

        if not self._is_mine():
            raise OutputBusy(f"{self.path}: the lock of this output folder is no longer this submission's")
        self.held.update(fields)
        with open_output_file(self.path, resolve=lambda _: (self.fs, self.path)) as f:
            f.write(json.dumps(self.held).encode())

    def release(self) -> None:
        """Delete the lock file, if it is still this holder's."""
        with contextlib.suppress(OSError, pa.ArrowException):
            if self._is_mine():
                self.fs.delete_file(self.path)


def describe_holder(held: dict) -> str:
    """A remote lock's holder in a few words."""
    if not held:
        return "an unreadable lock"
    where = f"pid {held.get('pid')} on {held.get('host')} since {held.get('since')}"
    return f"application {held['app_id']}, submitted by {where}" if held.get("app_id") else f"a submission by {where}"


def acquire_remote(fs: pafs.FileSystem, path: str, uri: str, *, running) -> RemoteLock:
    """Take the lock of output folder ``path`` (``uri``) on ``fs`` with the file system's
    create-if-absent (:func:`create_exclusive`). A lock already there is asked
    ``running(held)`` (the holder as the lock file says it, ``{}`` when unreadable): a string
    saying what still runs refuses the folder (:class:`~iterreduce.exceptions.OutputBusy`,
    naming the folder and the holder); None means the holder is gone, and its lock is
    replaced (deleted only if it is still the one read, then created afresh)."""
    lock = _join(path, LOCK_NAME)
    mine = {"token": os.urandom(12).hex(), "pid": os.getpid(), "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "app_id": None}
    for _ in range(3):
        if create_exclusive(fs, lock, json.dumps(mine).encode()):
            return RemoteLock(fs, lock, mine)
        raw = _read_bytes(fs, lock)
        if raw is None:
            continue  # let go in the meantime
        try:
            held = json.loads(raw)
            held = held if isinstance(held, dict) else {}
        except ValueError:
            held = {}
        still = running(held)
        if still:
            raise OutputBusy(f"{uri}: another job is writing into this output folder ({still}; its lock: {lock}); "
                             f"wait for it to end, or choose another output folder ([output] dir or --out)")
        if _read_bytes(fs, lock) == raw:  # a gone holder's lock, unchanged since read
            fs.delete_file(lock)
    raise OutputBusy(f"{uri}: could not take this output folder's lock {lock}: other submissions keep taking it")


def remote_claimed(fs: pafs.FileSystem, path: str) -> set[str]:
    """The names the run record of remote folder ``path`` says runs claimed there (written
    while they held its lock); empty where there is none or it is unreadable."""
    raw = _read_bytes(fs, _join(path, RECORD_NAME))
    try:
        claimed = json.loads(raw).get("claimed", []) if raw is not None else []
        return {name for name in claimed if isinstance(name, str)}
    except (ValueError, AttributeError):
        return set()


def remote_claim(fs: pafs.FileSystem, path: str, names) -> None:
    """Record in remote folder ``path``'s run record that a run (holding its lock) writes ``names``."""

    target = _join(path, RECORD_NAME)
    data = {"written_by": "iterreduce", "claimed": sorted(remote_claimed(fs, path) | set(names))}
    with open_output_file(target, resolve=lambda _: (fs, target)) as f:
        f.write(json.dumps(data, indent=1).encode())


def remote_foreign(fs: pafs.FileSystem, path: str, names) -> str | None:
    """The first of ``names`` present in remote folder ``path`` that its run record does not
    show a run claimed (so not provably the runtime's); None when there is none."""
    claimed = remote_claimed(fs, path)
    for name in names:
        if name not in claimed and fs.get_file_info(_join(path, name)).type != pafs.FileType.NotFound:
            return name
    return None


def remote_set_aside(fs: pafs.FileSystem, path: str, names) -> str | None:
    """Move what is under ``names`` in remote folder ``path`` (each claimed by a run: check
    :func:`remote_foreign` first) into a new ``previous/N`` (one more than the highest number
    there), with a run record of what it holds; returns it, or None when nothing was there.
    Nothing is deleted."""
    present = [name for name in names if fs.get_file_info(_join(path, name)).type != pafs.FileType.NotFound]
    if not present:
        return None
    previous = _join(path, PREVIOUS)
    fs.create_dir(previous, recursive=True)
    numbers = [int(e.base_name) for e in fs.get_file_info(pafs.FileSelector(previous)) if e.base_name.isdigit()]
    folder = _join(previous, str(max(numbers, default=0) + 1))
    fs.create_dir(folder, recursive=True)
    remote_claim(fs, folder, present)
    for name in present:
        fs.move(_join(path, name), _join(folder, name))
    return folder


# ------------------------------------------------------------------ earlier runs, on local disk

#: Earlier runs that ``previous/`` keeps once a new run has succeeded.
KEEP_PREVIOUS = 3


def set_aside(out, move=None, keep_in_place=()) -> Path | None:
    """Keep an earlier run's files in a new folder ``out/previous/N`` (N: one more than the
    highest of the folders it made there, passing over any other) instead of deleting them;
    returns it, or None when there was nothing.

    ``move`` (names in ``out``; default :data:`RUN_FILES`) move there: a new run starts without them. ``keep_in_place``
    (files) are hard-linked there (copied where links fail) and stay where they are until
    the new run replaces them atomically: the link then still holds the earlier bytes.
    Only files the run record of ``out`` proves a run's (:mod:`iterreduce.ownership`) are
    moved: any other under those names is refused
    (:class:`~iterreduce.exceptions.ForeignFileError`, naming it) before anything moves. The
    new folder gets a run record of what it holds, which :func:`prune_previous` goes by.
    """
    out, move = Path(out), RUN_FILES if move is None else move
    check_owned(out, (*move, *keep_in_place))
    moving = [name for name in move if (out / name).exists()]
    linking = [name for name in keep_in_place if (out / name).is_file()]
    if not moving and not linking:
        return None
    (out / PREVIOUS).mkdir(exist_ok=True)  # perhaps someone else's folder: a new numbered folder is added to it
    number = 1 + max((int(p.name) for p in (out / PREVIOUS).iterdir()
                      if p.name.isdigit() and (p / RECORD_NAME).is_file()), default=0)
    while (out / PREVIOUS / str(number)).exists() or (out / PREVIOUS / str(number)).is_symlink():
        number += 1  # a numbered folder of someone else's: passed over
    folder = out / PREVIOUS / str(number)
    folder.mkdir()
    aside = RunRecord(folder, claimed=[*moving, *linking])
    aside.write()  # first: a move cut short leaves nothing there that is not provably the runtime's
    for name in linking:  # first: a failure here has moved nothing yet
        try:
            os.link(out / name, folder / name)
        except OSError:
            shutil.copy2(out / name, folder / name)
    record = RunRecord.read(out)
    for name in moving:
        (out / name).rename(folder / name)
        record.forget(name)
    record.write()
    aside.take_inventory([*moving, *linking])
    aside.write()
    return folder


def prune_previous(out, keep: int = KEEP_PREVIOUS) -> None:
    """Delete all but the newest ``keep`` earlier runs that :func:`set_aside` put in
    ``out/previous`` (call it once a new run has written its own files, never before). Only
    folders with a run record count, and only what the record proves the runtime's goes:
    anything else there (a ``previous/2019`` of the user's, a file added to a ``previous/N``)
    stays byte for byte."""
    previous = Path(out) / PREVIOUS
    if not previous.is_dir():
        return
    folders = sorted((p for p in previous.iterdir() if p.name.isdigit() and p.is_dir() and not p.is_symlink()
                      and (p / RECORD_NAME).is_file()), key=lambda p: int(p.name))
    for old in folders[:max(0, len(folders) - keep)]:
        remove_owned(old)
