"""Ownership of output folders: the runtime deletes, moves or overwrites only files it wrote
itself and can prove it, and one run at a time writes into an output folder.

Three records, each defined here once:

- :data:`LOCK_NAME`, the **lock** of a run's output folder (:func:`hold`): an exclusive
  ``flock`` held for the whole run on a file of that name in the folder, which holds the
  holder's pid, host and start time as text, then the folder it holds. The kernel lets it go
  when the process ends, however it ends: no stale lock. A second run into the folder is refused at once
  (:class:`~iterreduce.exceptions.OutputBusy`) naming the folder and the holder. On HDFS,
  where there is no ``flock``, :func:`create_exclusive` gives the NameNode's
  create-if-absent instead (see :mod:`dbn.jobs.yarn` for how a submission uses it).
- :data:`RECORD_NAME`, the **run record** in a run's output folder and in every
  ``previous/N`` folder the runtime makes: the names the run claimed (it writes them while
  holding the lock, so whatever is found under them is its own, even after a crash) and,
  once the run ends, every file it left under them with its size and modification time.
  :func:`foreign_file` finds the first file under given names that the record does not prove
  the runtime's: such a file is never moved, overwritten or deleted. A record is checked
  before it is trusted (:meth:`RunRecord.read`): an entry naming anything outside its folder,
  or a file without its size and time, is ignored with a warning.

None of these is written, and nothing in a run's folder is deleted, through a symbolic link at
any depth (paths are walked one name at a time with ``O_NOFOLLOW``); a link is never the
runtime's. The lock and the record are never changed in place while they share their bytes
with another name through hard links (a folder copied with ``cp -al``): they are replaced.
- :data:`MANIFEST_NAME`, the **shard manifest** beside a set of shards
  (:func:`start_shard_set`, :func:`finish_shard_set`): the file names written, with their
  sizes. A later write replaces only files the manifest lists (and whose size still
  matches it); a folder holding anything else is refused, touching no byte. It works on any
  pyarrow file system (local disk, HDFS). One writer at a time holds a shard folder
  (:func:`shard_folder`: the lock above on local disk, create-if-absent on HDFS).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from ..exceptions import ForeignFileError, HdfsAccessError, OutputBusy, OutputExists
from . import durable
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
#: What a run of the runtime writes in its output folder (:func:`iterreduce.launch.local.run_local`).
RUN_FILES = (LOG_NAME, "checkpoints", "logs", "job.json", "error.txt", "master.json")


# ------------------------------------------------------------------ the lock


def holder_text() -> str:
    """Who holds a lock: this process's pid, host, start time and command line, one line."""
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300] if sys.argv and sys.argv[0] else "python"
    command = command.replace("\n", " ").replace("\r", " ")  # one line: a lock file's next line names its folder
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
    when the outermost ``with`` ends, or by the kernel when the process dies. A lock file that
    is a link (or not a plain file) is refused, never written through; one shared with another
    folder through hard links is replaced by this folder's own (:func:`_take_lock`)."""
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
    fd = _take_lock(folder)
    try:
        text = (holder_text() + f"\n{FOLDER_LINE}{_folder_id(folder)}\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
        with _held_guard:
            _held[key] = [fd, 1]
        yield folder
    finally:
        with _held_guard:
            _held.pop(key, None)
        os.close(fd)  # lets the flock go


def _take_lock(folder: Path) -> int:
    """The lock file of ``folder`` opened and ``flock``-ed, a file of this folder's alone. It is
    never opened through a link, nor taken when it is not a plain file
    (:class:`~iterreduce.exceptions.ForeignFileError`). One shared through hard links with
    another folder (copied with ``cp -al``) is replaced by a private one while its ``flock`` is
    held (no other run of this folder can take it in between), and the new one taken: writing
    the holder into it never changes the other folder's lock. One that a run of the other
    folder holds (its folder line names that folder) is replaced too (:func:`_unshare_lock`):
    a copy of a running folder can be run; a run of this very folder still refuses."""
    lock = folder / LOCK_NAME
    for _ in range(10):
        fd, _made = _open_lock(lock, "output folder (--out)")
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ForeignFileError(f"{lock}: not a plain file, so not this tool's lock file; it is left as it "
                                       f"is: choose another output folder (--out), or move it away")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            if _held_for_another_folder(fd, folder) and _unshare_lock(folder, fd, lock):
                os.close(fd)  # a copy (cp -al) of a running folder: a lock of its own now, taken next time round
                continue
            os.close(fd)
            raise OutputBusy(f"{folder}: another run is writing into this output folder ({holder(folder)}); "
                             f"wait for it to end, or choose another output folder (--out)") from None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, lock) and os.fstat(fd).st_nlink == 1:
            return fd
        if _same_file(fd, lock):  # shared with another folder through hard links: this folder's own from now on
            durable.write_local(lock, lambda f: f.write((holder_text() + "\n").encode()))
        os.close(fd)  # then take the lock file now in place
    raise OutputBusy(f"{folder}: could not take this output folder's lock {lock}: it keeps being replaced")


#: The line of a lock file (after its holder's) naming the folder its holder holds (:func:`_folder_id`).
FOLDER_LINE = "folder "
#: The most bytes of a lock file read for its folder line (a holder's line and a path's).
LOCK_MAX_BYTES = 16384


def _held_for_another_folder(fd: int, folder: Path) -> bool:
    """Whether the lock file ``fd``, held by another process and shared through hard links, is
    held for another folder (its holder wrote that folder's path in it, :data:`FOLDER_LINE`):
    ``folder`` is then a copy of that one (``cp -al``), not the folder that run writes into."""
    if os.fstat(fd).st_nlink <= 1:
        return False
    lines = os.pread(fd, LOCK_MAX_BYTES, 0).decode(errors="replace").split("\n")
    if len(lines) < 3 or not lines[1].startswith(FOLDER_LINE):  # no whole folder line: perhaps this folder's
        return False
    return lines[1][len(FOLDER_LINE):] != _folder_id(folder)


def _folder_id(folder) -> str:
    """``folder``'s real path on one line (as JSON: a newline in a name stays on it)."""
    return json.dumps(os.path.realpath(folder))


def _unshare_lock(folder: Path, fd: int, lock: Path) -> bool:
    """Replace ``folder``'s lock file ``lock`` (open as ``fd``, shared through hard links with a
    folder whose run holds it) by a private one; False where it cannot be done safely. The folder
    itself is ``flock``-ed meanwhile and the name checked to be still ``fd``'s: of two runs of
    this folder, one replaces it, and the other then finds the new file (taken, or free)."""
    where = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(where, fcntl.LOCK_EX)
        except OSError:  # a file system that cannot lock a folder: the shared lock stays, and refuses
            return False
        if _same_file(fd, lock):
            durable.write_local(lock, lambda f: f.write(b""))
        return True
    finally:
        os.close(where)  # lets the folder's flock go


def holder(folder) -> str:
    """What the lock file in ``folder`` says of its holder (a few words when it says nothing
    yet): its first line, read without following a link, and never more than a few hundred bytes."""
    try:
        raw = _read_own_file(Path(folder) / LOCK_NAME, HOLDER_MAX_BYTES, whole=False) or b""
    except (OSError, ValueError):
        raw = b""
    text = raw.decode(errors="replace").strip().split("\n", 1)[0].strip()  # the holder's line, not its folder's
    return f"held by {text}" if text else "its holder is starting"


#: The most bytes of a lock file :func:`holder` reads (its holder's line is shorter).
HOLDER_MAX_BYTES = 600


def _read_own_file(path: Path, limit: int, whole: bool = True) -> bytes | None:
    """The bytes of the small file ``path`` of the tool's own (a lock, a run record), read without
    following a link; None where nothing is there. A link, anything but a plain file, or (with
    ``whole``) a file over ``limit`` bytes cannot be the tool's: ValueError saying which. Never
    more than ``limit`` bytes are read (``whole=False``: the first ``limit``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError("a link, which this tool never makes: not followed") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a plain file")
        data = f.read(limit + 1)
    if len(data) > limit:
        if whole:
            raise ValueError(f"larger than {limit} bytes: not read")
        data = data[:limit]
    return data


# ------------------------------------------------------------------ the run record

#: The most bytes of a run record read (every file of a run with its size and time: some 80
#: bytes each): a larger file is not one this tool wrote, and is not read.
RECORD_MAX_BYTES = 64 * 2**20

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _record_path(rel) -> bool:
    """Whether ``rel`` (read from a run record) names something inside the record's folder: a
    string of names joined by ``/``, none of them empty, ``.`` or ``..``, without NUL, and one
    that this system can name a file by (a lone surrogate cannot be)."""
    if not isinstance(rel, str) or "\0" in rel or len(rel) > 4096:
        return False
    try:
        os.fsencode(rel)
    except UnicodeEncodeError:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _record_identity(value) -> bool:
    """Whether ``value`` is a size and time as a record keeps them: two ints (not bools), not negative."""
    return (isinstance(value, list) and len(value) == 2
            and all(type(v) is int and v >= 0 for v in value))


@contextlib.contextmanager
def _parent(folder: Path, rel: str):
    """The folder holding ``rel``'s last name, reached from ``folder`` one name at a time and
    never through a link: yields its descriptor and that last name. OSError (``ELOOP``,
    ``ENOTDIR``, ``ENOENT``) where a name on the way is a link, a file, or missing."""
    *parts, name = rel.split("/")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            inner = os.open(part, _FOLDER_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
        yield fd, name
    finally:
        os.close(fd)


def _lstat(folder: Path, rel: str) -> os.stat_result | None:
    """What ``rel`` in ``folder`` is (a link itself, not its target), reached without following
    a link; None where it is missing or something on the way is not a plain folder."""
    try:
        with _parent(folder, rel) as (fd, name):
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except (OSError, ValueError):
        return None


def _names_in(folder: Path, rel: str) -> list[str]:
    """The names in the folder ``rel`` of ``folder``, reached without following a link (none
    where it is not a plain folder)."""
    try:
        with _parent(folder, rel) as (fd, name):
            inner = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
        try:
            return sorted(os.listdir(inner))
        finally:
            os.close(inner)
    except (OSError, ValueError):
        return []


def _walk(folder: Path, rel: str):
    """Everything under the folder ``rel`` of ``folder``, as (relative path, what it is), each
    folder before its contents, never through a link."""
    pending = [rel]
    while pending:
        current = pending.pop()
        for child in _names_in(folder, current):
            sub = f"{current}/{child}"
            st = _lstat(folder, sub)
            if st is not None:
                yield sub, st
                if stat.S_ISDIR(st.st_mode):
                    pending.append(sub)


def _unlink(folder: Path, rel: str) -> None:
    """Delete the file ``rel`` of ``folder``, reached without following a link (a link in its
    place would go itself, never what it points to)."""
    with contextlib.suppress(FileNotFoundError):
        with _parent(folder, rel) as (fd, name):
            os.unlink(name, dir_fd=fd)


def _unlink_file(folder: Path, rel: str) -> None:
    """Delete ``rel`` of ``folder``, a file its run record lists, only where it is a plain file:
    a folder there (a record calling a folder a file) is left, with a warning naming the record."""
    st = _lstat(folder, rel)
    if st is None:
        return
    if stat.S_ISREG(st.st_mode):
        _unlink(folder, rel)
    else:
        _warn_once(folder / RECORD_NAME, f"{folder / RECORD_NAME}: lists {_shown(rel)} as a file, but it is not a "
                                         f"plain file: not deleted as one")


def _rmdir(folder: Path, rel: str) -> None:
    """Remove the folder ``rel`` of ``folder`` if it is empty (else leave it), never through a link."""
    with contextlib.suppress(OSError):
        with _parent(folder, rel) as (fd, name):
            os.rmdir(name, dir_fd=fd)


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
        """The record in ``folder``; an empty one where there is none or it is unreadable (then
        nothing there is proven the runtime's). Only what the runtime writes is taken: a claimed
        name directly in the folder, a file or folder inside it (no ``..``, no absolute path), a
        file with its size and time; any other entry is left out, with a warning naming the
        record and the entry. A record that is a link is not read."""
        record = cls(folder)
        where = record.folder / RECORD_NAME
        try:
            raw = _read_own_file(where, RECORD_MAX_BYTES)
            data = None if raw is None else json.loads(raw)
            if data is not None and not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            _warn_once(where, f"{where}: not a run record of this tool ({str(exc)[:120]}): nothing in its folder is "
                              f"taken for this tool's")
            return record
        if data is not None:
            record._take(where, data)
        return record

    def _take(self, where: Path, data: dict) -> None:
        """Keep the entries of the record ``data`` (from ``where``) that are the runtime's kind (see :meth:`read`)."""
        ignored = []
        claimed, files, folders = data.get("claimed", []), data.get("files", {}), data.get("folders", [])
        for field, value, kind in (("claimed", claimed, list), ("files", files, dict), ("folders", folders, list)):
            if not isinstance(value, kind):
                ignored.append(f"{field} {_shown(value)} (not a {kind.__name__})")
        for name in claimed if isinstance(claimed, list) else ():
            if _record_path(name) and "/" not in name:
                self.claimed.add(name)
            else:
                ignored.append(f"claimed {_shown(name)}")
        for rel, identity in files.items() if isinstance(files, dict) else ():
            if _record_path(rel) and _record_identity(identity):
                self.files[rel] = list(identity)
            else:
                ignored.append(f"files {_shown(rel)}: {_shown(identity)}")
        for rel in folders if isinstance(folders, list) else ():
            if _record_path(rel):
                self.folders.add(rel)
            else:
                ignored.append(f"folders {_shown(rel)}")
        if ignored:
            shown = "; ".join(ignored[:5]) + (f"; and {len(ignored) - 5} more" if len(ignored) > 5 else "")
            _warn_once(where, f"{where}: ignored {len(ignored)} entries that are not a name inside its folder (or a "
                              f"file without its size and time), so nothing is done to what they name: {shown}")

    def write(self) -> None:
        """Save the record, atomically (a new file renamed over it: never written through a link
        or into a file another name shares)."""
        data = {"written_by": "iterreduce", "claimed": sorted(self.claimed), "files": dict(sorted(self.files.items())),
                "folders": sorted(self.folders)}
        text = (json.dumps(data, indent=1) + "\n").encode()
        durable.write_local(self.folder / RECORD_NAME, lambda f: f.write(text))

    def owns(self, rel: str) -> bool:
        """Whether the file or folder ``rel`` (relative to the folder) is provably the runtime's:
        a plain file or folder (never a link, at any depth), under a claimed name or recorded as
        it is now (a folder: with everything in it)."""
        st = _lstat(self.folder, rel) if _record_path(rel) else None
        if st is None or not self._owns_entry(rel, st):
            return False
        return not stat.S_ISDIR(st.st_mode) or all(self._owns_entry(sub, st) for sub, st in _walk(self.folder, rel))

    def _owns_entry(self, rel: str, st: os.stat_result) -> bool:
        """Whether the entry ``rel`` (``st``: what it is) alone, not what is in it, is provably the runtime's."""
        claimed = rel.split("/", 1)[0] in self.claimed
        if stat.S_ISREG(st.st_mode):
            return claimed or self.files.get(rel) == [st.st_size, st.st_mtime_ns]
        return stat.S_ISDIR(st.st_mode) and (claimed or rel in self.folders)

    def forget(self, name: str) -> None:
        """Drop ``name`` and everything under it from the record (it moved away)."""
        self.claimed.discard(name)
        self.files = {k: v for k, v in self.files.items() if k != name and not k.startswith(f"{name}/")}
        self.folders = {k for k in self.folders if k != name and not k.startswith(f"{name}/")}

    def take_inventory(self, names) -> None:
        """Record every plain file and folder now under ``names`` as the runtime's, and the claims
        on them settled (links, never the runtime's, are left out)."""
        for name in names:
            self.forget(name)
            st = _lstat(self.folder, name)
            if st is None:
                continue
            entries = [(name, st), *(_walk(self.folder, name) if stat.S_ISDIR(st.st_mode) else ())]
            for rel, st in entries:
                if stat.S_ISDIR(st.st_mode):
                    self.folders.add(rel)
                elif stat.S_ISREG(st.st_mode):
                    self.files[rel] = [st.st_size, st.st_mtime_ns]


_warned: set[tuple[str, str]] = set()


def _warn_once(where: Path, message: str) -> None:
    """Log ``message`` about the record ``where`` once per process (a run reads a record many times)."""
    if (str(where), message) not in _warned:
        _warned.add((str(where), message))
        log.warning("%s", message)


def foreign_file(folder, names) -> str | None:
    """The first file (or folder, or link) under ``names`` in ``folder`` that its run record does
    not prove the runtime's, as a path; None when every one there is."""
    folder = Path(folder)
    record = RunRecord.read(folder)
    for name in names:
        st = _lstat(folder, name) if _record_path(name) else None
        if st is None or record.owns(name):
            continue
        if stat.S_ISDIR(st.st_mode):  # name the file (or link) inside that is not the runtime's
            for rel, sub in sorted(_walk(folder, name), key=lambda entry: entry[0]):
                if not stat.S_ISDIR(sub.st_mode) and not record._owns_entry(rel, sub):
                    return str(folder / rel)
        return str(folder / name)
    return None


def check_owned(folder, names) -> None:
    """Refuse (:class:`~iterreduce.exceptions.ForeignFileError`, naming the file) an output
    folder holding a file under ``names`` that the runtime cannot prove it wrote (a link, at
    any depth, never is)."""
    found = foreign_file(folder, names)
    if found is not None:
        record = Path(folder) / RECORD_NAME
        if os.path.islink(found):
            why = "a link, which this tool never makes nor follows"
        elif os.path.isfile(record) and not os.path.islink(record):
            why = f"no record of it in {record}"
        else:
            why = (f"the folder has no run record {RECORD_NAME}: another tool's files, or a run of a version of this "
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
    Anything else in it stays, byte for byte: a name outside the folder, and anything reached
    through a link, at any depth, is never touched; a folder whose record is missing or
    unreadable is left whole."""
    folder = Path(folder)
    record = RunRecord.read(folder)
    if not (record.files or record.claimed or record.folders):
        return False
    for rel in sorted(record.files):
        if record.owns(rel):
            _unlink_file(folder, rel)
    for name in sorted(record.claimed):
        st = _lstat(folder, name)
        if st is None:
            continue
        entries = [*(_walk(folder, name) if stat.S_ISDIR(st.st_mode) else ()), (name, st)]
        for rel, sub in sorted(entries, key=lambda entry: -entry[0].count("/")):  # the deepest first
            if stat.S_ISDIR(sub.st_mode):
                _rmdir(folder, rel)
            elif stat.S_ISREG(sub.st_mode):
                _unlink(folder, rel)
    for rel in sorted(record.folders, key=lambda r: -r.count("/")):  # the deepest first
        _rmdir(folder, rel)  # not empty: something not the runtime's is in it
    if any(name != RECORD_NAME for name in os.listdir(folder)):
        record.claimed = set()
        record.files = {k: v for k, v in record.files.items() if record.owns(k)}
        record.folders = {k for k in record.folders if (st := _lstat(folder, k)) and stat.S_ISDIR(st.st_mode)}
        record.write()
        return False
    _unlink(folder, RECORD_NAME)
    folder.rmdir()
    return True


# ------------------------------------------------------------------ HDFS: create if absent


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


# ------------------------------------------------------------------ shard manifests

log = logging.getLogger(__name__)

#: The most bytes of a shard manifest read (a million shards' names take some 50 MB): a larger
#: file is not one this tool wrote, and is not read whole.
MANIFEST_MAX_BYTES = 64 * 2**20
#: The longest file name (in UTF-8 bytes) local file systems and HDFS take.
NAME_MAX_BYTES = 255


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def plain_name(name) -> bool:
    """Whether ``name`` (read from a manifest) names a file directly inside its folder: a
    string, neither empty nor ``.`` or ``..``, without ``/`` or NUL, a valid file name (UTF-8,
    no lone surrogates, at most :data:`NAME_MAX_BYTES` bytes), and none of the tool's
    bookkeeping names (the manifest, the lock)."""
    if not isinstance(name, str) or name in ("", ".", "..", MANIFEST_NAME, LOCK_NAME) or "/" in name or "\0" in name:
        return False
    try:
        return len(name.encode("utf-8")) <= NAME_MAX_BYTES
    except UnicodeEncodeError:  # a lone surrogate: no file is named so
        return False


def _listed_size(size) -> bool:
    """Whether a manifest's size is one the tool writes: bytes (an int, not a bool), or None (being written)."""
    return size is None or (type(size) is int and size >= 0)


def _manifest_json(fs: pafs.FileSystem, where: str):
    """The JSON object in the manifest file ``where``; None where there is none, or it is too
    large, unreadable or not an object with a ``files`` object (said as a warning)."""
    if _is_link(fs, where) or (isinstance(fs, pafs.LocalFileSystem) and os.path.exists(where)
                               and not os.path.isfile(where)):
        log.warning("%s: not a file this tool wrote (a link, or not a regular file): not read", where)
        return None
    try:
        with fs.open_input_stream(where, compression=None) as f:
            raw = f.read(MANIFEST_MAX_BYTES + 1)
    except HdfsAccessError:
        raise  # HDFS refused this process: said as it is
    except (OSError, pa.ArrowException) as exc:
        if not isinstance(exc, FileNotFoundError) and fs.get_file_info(where).type != pafs.FileType.NotFound:
            log.warning("%s: not readable (%s): nothing in its folder is taken for this tool's", where, exc)
        return None
    why = None
    if len(raw) > MANIFEST_MAX_BYTES:
        why = f"larger than {MANIFEST_MAX_BYTES} bytes"
    else:
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            data, why = None, f"not JSON: {type(exc).__name__}: {str(exc)[:120]}"
        if why is None and not (isinstance(data, dict) and isinstance(data.get("files", {}), dict)):
            why = "not an object with a 'files' object"
    if why is not None:
        log.warning("%s: not a shard manifest of this tool (%s): nothing in its folder is taken for this tool's",
                    where, why)
        return None
    return data


def read_manifest(fs: pafs.FileSystem, path: str) -> dict:
    """The shard manifest in folder ``path`` (``{"files": {name: size or None}, "notes": {...}}``);
    empty where there is none or it is unreadable (then nothing there is proven the runtime's).
    Only what the tool writes is taken: an entry whose name is not a plain name in the folder
    (:func:`plain_name`) or whose size is not bytes or None is left out, with a warning naming
    the manifest and the entry."""
    where = _join(path, MANIFEST_NAME)
    data = _manifest_json(fs, where)
    if data is None:
        return {"files": {}, "notes": {}}
    files = {}
    for name, size in data.get("files", {}).items():
        if plain_name(name) and _listed_size(size):
            files[name] = size
        else:
            log.warning("%s: ignored its entry %s (size %s): not a file name inside this folder with its size in "
                        "bytes, so nothing is done to it", where, _shown(name), _shown(size))
    notes = data.get("notes", {})
    if not isinstance(notes, dict):
        log.warning("%s: ignored its notes %s: not an object", where, _shown(notes))
        notes = {}
    return {"files": files, "notes": dict(notes)}


def _write_manifest(fs: pafs.FileSystem, path: str, manifest: dict) -> None:

    text = json.dumps({"written_by": "iterreduce", "files": dict(sorted(manifest["files"].items())),
                       "notes": manifest.get("notes", {})}, indent=1).encode()
    target = _join(path, MANIFEST_NAME)
    with open_output_file(target, resolve=lambda _: (fs, target)) as f:  # whole, or the earlier one
        f.write(text)


def _is_link(fs: pafs.FileSystem, path: str) -> bool:
    """Whether ``path`` is a symbolic link (pyarrow's listing follows links; HDFS has none)."""
    return isinstance(fs, pafs.LocalFileSystem) and os.path.islink(path)


def _ours(fs: pafs.FileSystem, entry: pafs.FileInfo, files: dict) -> bool:
    """Whether a folder entry is a shard file the manifest ``files`` lists as it is (its size;
    None: being written), or a leftover of an interrupted write of one or of the manifest
    (exactly :mod:`iterreduce.storage.durable`'s hidden names, :func:`~iterreduce.storage.durable.hidden_target`).
    A link is never the tool's: it writes none."""
    name = entry.base_name
    if entry.type != pafs.FileType.File or _is_link(fs, entry.path):
        return False
    if name in files:
        return files[name] is None or files[name] == entry.size
    leftover = durable.hidden_target(name)
    return leftover is not None and (leftover[0] in files or leftover[0] == MANIFEST_NAME)


def _lock_file(name: str) -> bool:
    """Whether ``name`` is the folder's lock or a hidden name of one (being created, set aside):
    another writer's, neither refused nor deleted by a shard write."""
    return name == LOCK_NAME or durable.hidden_target(
        name, (durable.PARTIAL_SUFFIX, durable.BACKUP_SUFFIX, STALE_SUFFIX)) in (
        (LOCK_NAME, durable.PARTIAL_SUFFIX), (LOCK_NAME, durable.BACKUP_SUFFIX), (LOCK_NAME, STALE_SUFFIX))


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``path`` (not unlinked or replaced)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _open_lock(lock: Path, other: str = "folder") -> tuple[int, bool]:
    """The lock file ``lock`` opened (never through a link), and whether this call made it; a folder
    under its name is :class:`ForeignFileError`, whose fix names ``other`` (what to choose instead)."""
    flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    while True:
        try:
            return os.open(lock, flags | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            pass
        try:
            return os.open(lock, flags), False
        except FileNotFoundError:
            continue  # let go and removed in the meantime: make it
        except IsADirectoryError:
            raise ForeignFileError(f"{lock}: a folder, not this tool's lock file; it is left as it is: choose another "
                                   f"{other}, or move it away") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ForeignFileError(f"{lock}: a link, not this tool's lock file; it is left as it is: choose "
                                       f"another folder, or move it away") from None
            raise


def check_not_link(folder) -> None:
    """Refuse (:class:`~iterreduce.exceptions.ForeignFileError`, naming it) the local folder
    ``folder`` the tool is about to write into or delete in where it is a symbolic link: nothing
    the tool writes or deletes goes through a link (its target is someone else's)."""
    if os.path.islink(folder):
        raise ForeignFileError(f"{folder}: a link, which this tool never makes nor writes through; it is left as it "
                               f"is, and what it points to too: move it away, or choose another folder")


@contextlib.contextmanager
def _hold_local_shards(folder: Path, uri: str):
    """The exclusive ``flock`` of :func:`shard_folder` on local disk; the lock file goes at the
    end where this writer made it (still holding it: a writer that opened it meanwhile finds it
    unlinked once it has it, and makes a new one). A link at the folder is refused, never written through."""
    check_not_link(folder)
    folder.mkdir(parents=True, exist_ok=True)
    check_not_link(folder)  # made meanwhile
    lock = folder / LOCK_NAME
    while True:
        fd, made = _open_lock(lock, "folder")
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # its holder's line would go where else it is linked
                raise ForeignFileError(f"{lock}: not a plain file of this folder's alone, so not this tool's lock "
                                       f"file; it is left as it is: choose another folder, or move it away")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise OutputBusy(f"{uri}: another writer is writing shards into this folder ({holder(folder)}); wait "
                             f"for it to end, or choose another folder") from None
        except BaseException:
            os.close(fd)
            raise
        if _same_file(fd, lock):
            break
        os.close(fd)  # its last holder removed it after this process opened it
    try:
        text = (holder_text() + "\n").encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)
        yield
    finally:
        if made and _same_file(fd, lock):
            lock.unlink()
        os.close(fd)  # lets the flock go


@contextlib.contextmanager
def shard_folder(fs: pafs.FileSystem, path: str, uri: str):
    """Hold the shard folder ``path`` (``uri``, made if missing) for one writer, for the ``with``
    block: a second writer is refused at once (:class:`~iterreduce.exceptions.OutputBusy`,
    naming the folder and the holder). On local disk an exclusive ``flock`` on :data:`LOCK_NAME`,
    as :func:`hold` takes (the kernel lets it go however the process ends); elsewhere (HDFS) the
    create-if-absent lock of :func:`acquire_remote`, a holder counting as gone only where it is
    a process of this host that has ended (:func:`shard_writer_running`). The lock file goes
    when the block ends."""
    if isinstance(fs, pafs.LocalFileSystem):
        with _hold_local_shards(Path(path), uri):
            yield
        return
    fs.create_dir(path, recursive=True)
    lock = acquire_remote(fs, path, uri, running=shard_writer_running, what="writer is writing shards into this folder",
                          advice="wait for it to end, or choose another folder")
    try:
        yield
    finally:
        lock.release()


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
    entries = sorted(fs.get_file_info(pafs.FileSelector(path)), key=lambda e: e.base_name)
    for entry in entries:
        if entry.base_name == MANIFEST_NAME and entry.type == pafs.FileType.File and not _is_link(fs, entry.path):
            continue  # the manifest itself: replaced whole, never written through
        if _lock_file(entry.base_name):
            continue
        if not _ours(fs, entry, files):
            raise ForeignFileError(
                f"{uri}: holds {entry.base_name}, which this tool did not write (not listed as it is in "
                f"{MANIFEST_NAME}): shards are written into an empty folder or one holding shards written here; "
                f"nothing was changed: choose another folder")
        if entry.base_name not in files or entry.base_name.startswith(f"{prefix}-") or entry.base_name in names:
            replaced.append(entry)
    # First the record of what may be there now (old and new names, sizes unknown): an
    # interrupted write leaves nothing the next one cannot prove its own.
    here = {e.base_name for e in entries}  # a listed name with no file (a write cut short) is dropped: nothing to prove
    manifest["files"] = {**{name: size for name, size in files.items() if name in here},
                         **{e.base_name: None for e in replaced if e.base_name in files},
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
        except (ValueError, AttributeError, RecursionError):
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
    def field(key):  # as the lock says it, cut short: a lock file is read, not trusted
        return str(held.get(key))[:100]

    where = f"pid {field('pid')} on {field('host')} since {field('since')}"
    return f"application {field('app_id')}, submitted by {where}" if held.get("app_id") else f"a submission by {where}"


def shard_writer_running(held: dict) -> str | None:
    """What still writes into a remote shard folder whose lock names ``held`` (the ``running``
    of :func:`acquire_remote` for :func:`shard_folder`), or None when it is gone: a process of
    this host that has ended. Any other holder counts as running (this process cannot see
    another host's processes): its lock has to be deleted by hand if it is gone."""
    if not held:
        return "a lock file that is not readable (delete it if nothing writes there)"
    pid = held.get("pid")
    if held.get("host") == socket.gethostname() and not held.get("app_id") and type(pid) is int and pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    return f"{describe_holder(held)} (delete the lock if it is gone)"


#: Suffix of a gone holder's lock moved aside to be deleted (:func:`_remove_stale_lock`). Not
#: durable's ``.old``: :func:`~iterreduce.storage.durable.restore` would move that back as a backup.
STALE_SUFFIX = ".stale"


def _remove_stale_lock(fs: pafs.FileSystem, lock: str, stale: bytes) -> None:
    """Delete the lock file ``lock`` of a holder found gone only if it still holds ``stale``
    (the bytes read from it). A read, then a delete, would delete a lock another submission
    took in between; instead it is first renamed to a fresh hidden name (atomic, and refused
    where the lock is gone) and read there: a new holder's lock goes back in place untouched."""
    aside = durable.hidden_name(lock, STALE_SUFFIX)
    try:
        fs.move(lock, aside)
    except (OSError, pa.ArrowException):
        if fs.get_file_info(lock).type == pafs.FileType.NotFound:
            return  # let go in the meantime
        raise
    if _read_bytes(fs, aside) == stale:
        fs.delete_file(aside)
    elif not durable.place_new(fs, aside, lock):  # a third submission took the name in the moment it was free
        log.warning("%s: the lock of a new holder, taken while a gone holder's lock was replaced, is left in %s: "
                    "another submission took the lock meanwhile", lock, aside)


def acquire_remote(fs: pafs.FileSystem, path: str, uri: str, *, running,
                   what: str = "job is writing into this output folder",
                   advice: str = "wait for it to end, or choose another output folder ([output] dir or --out)"
                   ) -> RemoteLock:
    """Take the lock of output folder ``path`` (``uri``) on ``fs`` with the file system's
    create-if-absent (:func:`create_exclusive`). A lock already there is asked
    ``running(held)`` (the holder as the lock file says it, ``{}`` when unreadable): a string
    saying what still runs refuses the folder (:class:`~iterreduce.exceptions.OutputBusy`,
    naming the folder and the holder: "another ``what``", then ``advice``);
    None means the holder is gone, and its lock is replaced (:func:`_remove_stale_lock`: only
    if it is still the one read), then created afresh."""
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
        except (ValueError, RecursionError):
            held = {}
        still = running(held)
        if still:
            raise OutputBusy(f"{uri}: another {what} ({still}; its lock: {lock}); {advice}")
        _remove_stale_lock(fs, lock, raw)
    raise OutputBusy(f"{uri}: could not take this output folder's lock {lock}: other submissions keep taking it")


def remote_claimed(fs: pafs.FileSystem, path: str) -> set[str]:
    """The names the run record of remote folder ``path`` says runs claimed there (written
    while they held its lock); empty where there is none or it is unreadable."""
    raw = _read_bytes(fs, _join(path, RECORD_NAME))
    try:
        claimed = json.loads(raw).get("claimed", []) if raw is not None else []
        return {name for name in claimed if isinstance(name, str)}
    except (ValueError, AttributeError, TypeError, RecursionError):
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


def _number(name: str) -> bool:
    """Whether the folder name ``name`` (read from a listing) is one of ``previous/``'s numbers:
    ASCII digits only (``str.isdigit`` also takes ``²`` and ``٣``, which ``int`` refuses or reads)."""
    return name.isascii() and name.isdigit()


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
    numbers = [int(e.base_name) for e in fs.get_file_info(pafs.FileSelector(previous)) if _number(e.base_name)]
    folder = _join(previous, str(max(numbers, default=0) + 1))
    fs.create_dir(folder, recursive=True)
    remote_claim(fs, folder, present)
    for name in present:
        fs.move(_join(path, name), _join(folder, name))
    return folder


# ------------------------------------------------------------------ earlier runs, on local disk

#: Earlier runs that ``previous/`` keeps once a new run has succeeded.
KEEP_PREVIOUS = 3


def _previous_folder(out: Path, make: bool) -> Path | None:
    """``out/previous``, made first where ``make``; None where there is none. A link (or a file)
    there is not a folder of the runtime's, and nothing goes through it: with ``make`` it is
    refused (:class:`~iterreduce.exceptions.ForeignFileError`, naming it), else passed over."""
    previous = out / PREVIOUS
    if make:
        with contextlib.suppress(FileExistsError):  # perhaps someone else's folder: a numbered folder is added to it
            previous.mkdir()
    st = _lstat(out, PREVIOUS)
    if st is not None and stat.S_ISDIR(st.st_mode):
        return previous
    if make:
        raise ForeignFileError(f"{previous}: a link or a file, not a folder, where earlier runs are kept; nothing is "
                               f"moved through a link, and it is left as it is: move it away, or choose another "
                               f"output folder (--out)")
    return None


def _earlier_runs(previous: Path) -> list[Path]:
    """The folders :func:`set_aside` made in ``previous``, oldest first: numbered plain folders
    (not links) holding a run record that is a plain file."""
    runs = []
    for name in _names_in(previous, "."):
        st = _lstat(previous, f"{name}/{RECORD_NAME}")
        if _number(name) and st is not None and stat.S_ISREG(st.st_mode):
            runs.append((int(name), previous / name))
    return [folder for _, folder in sorted(runs)]


def set_aside(out, move=None, keep_in_place=()) -> Path | None:
    """Keep an earlier run's files in a new folder ``out/previous/N`` (N: one more than the
    highest of the folders it made there, passing over any other) instead of deleting them;
    returns it, or None when there was nothing.

    ``move`` (names in ``out``; default :data:`RUN_FILES`) move there: a new run starts without them. ``keep_in_place``
    (files) are hard-linked there (copied where links fail) and stay where they are until
    the new run replaces them atomically: the link then still holds the earlier bytes.
    Only files the run record of ``out`` proves a run's (:mod:`iterreduce.storage.ownership`) are
    moved: any other under those names is refused
    (:class:`~iterreduce.exceptions.ForeignFileError`, naming it) before anything moves. The
    new folder gets a run record of what it holds, which :func:`prune_previous` goes by.
    """
    out, move = Path(out), RUN_FILES if move is None else move
    check_owned(out, (*move, *keep_in_place))
    moving = [name for name in move if _lstat(out, name) is not None]
    linking = [name for name in keep_in_place if (st := _lstat(out, name)) is not None and stat.S_ISREG(st.st_mode)]
    if not moving and not linking:
        return None
    previous = _previous_folder(out, make=True)
    number = 1 + max((int(p.name) for p in _earlier_runs(previous)), default=0)
    while os.path.lexists(previous / str(number)):
        number += 1  # a numbered folder of someone else's: passed over
    folder = previous / str(number)
    folder.mkdir()
    aside = RunRecord(folder, claimed=[*moving, *linking])
    aside.write()  # first: a move cut short leaves nothing there that is not provably the runtime's
    for name in linking:  # first: a failure here has moved nothing yet
        try:
            os.link(out / name, folder / name, follow_symlinks=False)
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
    previous = _previous_folder(Path(out), make=False)  # a link there: not followed
    if previous is None:
        return
    runs = _earlier_runs(previous)
    for old in runs[:max(0, len(runs) - keep)]:
        try:
            remove_owned(old)
        except OSError as exc:  # the run that prunes has succeeded: an earlier run's folder never fails it
            log.warning("%s: not pruned (%s), left as it is; its run record: %s", old, exc, old / RECORD_NAME)
