"""One run (or one shard writer) at a time in a folder: the folder's lock file
:data:`~.names.LOCK_NAME`.

- On local disk (:func:`hold` for a run's output folder, :func:`shard_folder` for shards): an
  exclusive ``flock`` held for the whole ``with`` block on the lock file, which says who holds
  it (:func:`~.holders.holder_text`). The kernel lets it go when the process ends, however it
  ends: no stale lock. A second writer is refused at once
  (:class:`~iterreduce.exceptions.OutputBusy`) naming the folder and the holder. The lock file
  is never opened through a link, and never written while it shares its bytes with another
  folder's through hard links (a folder copied with ``cp -al``): it is replaced.
- On HDFS, where there is no ``flock``: the create-if-absent lock of :mod:`.remote_locks`
  (:func:`shard_folder` takes it there; see :mod:`dbn.jobs.yarn` for a submission's).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import threading
from pathlib import Path

import pyarrow.fs as pafs

from ...exceptions import ForeignFileError, OutputBusy
from .folders import LocalFolder, check_not_link
from .holders import LOCK_MAX_BYTES, RUN, SHARDS, busy, holder_text
from .names import LOCK_NAME
from .remote_locks import acquire_remote, shard_writer_running

#: The line of a lock file (after its holder's) naming the folder its holder holds (:func:`_folder_id`).
FOLDER_LINE = "folder "
#: The most bytes of a lock file :func:`holder` reads (its holder's line is shorter).
HOLDER_MAX_BYTES = 600

_held: dict[tuple[str, int], list] = {}  # (real path, thread) -> [fd, depth]: hold() is re-entrant per thread
_held_guard = threading.Lock()


@contextlib.contextmanager
def hold(folder):
    """Hold the output folder ``folder`` (made if missing) for a run, for the ``with`` block.

    An exclusive ``flock`` on :data:`~.names.LOCK_NAME` in it; the file then says who holds it. A
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
        _say_holder(fd, f"{FOLDER_LINE}{_folder_id(folder)}\n")
        with _held_guard:
            _held[key] = [fd, 1]
        yield folder
    finally:
        with _held_guard:
            _held.pop(key, None)
        os.close(fd)  # lets the flock go


def _say_holder(fd: int, more: str = "") -> None:
    """Write who holds the lock (then ``more``) into the lock file ``fd``, held."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, (holder_text() + "\n" + more).encode(), 0)


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
        fd, _made, taken = _open_flocked(lock, "output folder (--out)", alone=False)
        mine = False
        try:
            if not taken:
                if _held_for_another_folder(fd, folder) and _unshare_lock(folder, fd, lock):
                    continue  # a copy (cp -al) of a running folder: a lock of its own now, taken next time round
                raise busy(str(folder), RUN, holder(folder))
            mine = _same_file(fd, lock) and os.fstat(fd).st_nlink == 1
            if mine:
                return fd
            if _same_file(fd, lock):  # shared with another folder through hard links: this folder's own from now on
                LocalFolder(folder).write(LOCK_NAME, (holder_text() + "\n").encode())
        finally:
            if not mine:
                os.close(fd)  # then take the lock file now in place
    raise OutputBusy(f"{folder}: could not take this output folder's lock {lock}: it keeps being replaced")


def _open_flocked(lock: Path, other: str, alone: bool) -> tuple[int, bool, bool]:
    """The lock file ``lock`` opened (:func:`_open_lock`), whether this call made it, and whether
    its ``flock`` was taken (False: another holds it). One that is not a plain file (with
    ``alone``: or one shared through hard links, whose holder's line would go where else it
    is linked) is refused (:class:`~iterreduce.exceptions.ForeignFileError`; its fix names
    ``other``, what to choose instead) and closed."""
    fd, made = _open_lock(lock, other)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (alone and st.st_nlink != 1):
            alone_text = " of this folder's alone" if alone else ""
            raise ForeignFileError(f"{lock}: not a plain file{alone_text}, so not this tool's lock file; it is left as "
                                   f"it is: choose another {other}, or move it away")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return fd, made, False
        os.close(fd)
        raise
    except BaseException:
        os.close(fd)
        raise
    return fd, made, True


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
            LocalFolder(folder).write(LOCK_NAME, b"")
        return True
    finally:
        os.close(where)  # lets the folder's flock go


def holder(folder) -> str:
    """What the lock file in ``folder`` says of its holder (a few words when it says nothing
    yet): its first line, read without following a link, and never more than a few hundred bytes."""
    try:
        raw = LocalFolder(folder).read(LOCK_NAME, HOLDER_MAX_BYTES) or b""
    except (OSError, ValueError):
        raw = b""
    text = raw.decode(errors="replace").strip().split("\n", 1)[0].strip()  # the holder's line, not its folder's
    return f"held by {text}" if text else "its holder is starting"


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
        fd, made, taken = _open_flocked(lock, "folder", alone=True)
        if not taken:
            os.close(fd)
            raise busy(uri, SHARDS, holder(folder))
        if _same_file(fd, lock):
            break
        os.close(fd)  # its last holder removed it after this process opened it
    try:
        _say_holder(fd)
        yield
    finally:
        if made and _same_file(fd, lock):
            lock.unlink()
        os.close(fd)  # lets the flock go


@contextlib.contextmanager
def shard_folder(fs: pafs.FileSystem, path: str, uri: str):
    """Hold the shard folder ``path`` (``uri``, made if missing) for one writer, for the ``with``
    block: a second writer is refused at once (:class:`~iterreduce.exceptions.OutputBusy`,
    naming the folder and the holder). On local disk an exclusive ``flock`` on :data:`~.names.LOCK_NAME`,
    as :func:`hold` takes (the kernel lets it go however the process ends); elsewhere (HDFS) the
    create-if-absent lock of :func:`~.remote_locks.acquire_remote`, a holder counting as gone only where it is
    a process of this host that has ended (:func:`~.remote_locks.shard_writer_running`). The lock file goes
    when the block ends."""
    if isinstance(fs, pafs.LocalFileSystem):
        with _hold_local_shards(Path(path), uri):
            yield
        return
    fs.create_dir(path, recursive=True)
    lock = acquire_remote(fs, path, uri, running=shard_writer_running, what=SHARDS.what, advice=SHARDS.advice)
    try:
        yield
    finally:
        lock.release()
