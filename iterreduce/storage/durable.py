"""Atomic, durable replacement of one file: the one way every writer of the project puts a
finished file under its name, on local disk and on HDFS.

The new bytes are written under a hidden temporary name in the file's own folder and moved
onto the file's name only once complete, so a reader finds the earlier file or the new one,
whole, and a crash or an error while writing leaves the earlier file as it was.

- **Local disk** (:func:`write_local`, and :func:`replace` on pyarrow's ``LocalFileSystem``):
  the temporary file's bytes are fsynced, ``os.replace`` (``rename(2)``: atomic on POSIX; the
  name holds the old file or the new, never neither) moves it in, and the folder is fsynced so
  that the rename itself survives a power cut. (pyarrow's ``LocalFileSystem.move`` is the same
  ``rename(2)``: an existing file is replaced atomically.)
- **HDFS through hdfs-native** (``hdfs://`` URIs, see :func:`iterreduce.storage.filesystems.filesystem`):
  the bytes are hsynced (every datanode of the write pipeline has them on disk) before the file
  is closed, and the move is the NameNode's rename with ``OVERWRITE``: one namespace operation,
  journaled before it returns, so a reader again finds the old file or the new, never neither.
- **Other file systems** that refuse to rename onto an existing file (libhdfs' HDFS, object
  stores): the earlier file is first renamed aside to a hidden backup name
  (``.NAME.<8 hex>.old``), the new one moved in, then the backup deleted. Between those two
  renames the name is missing for a moment, but the earlier bytes are whole under the backup
  name; :func:`restore` (run before every write of that name) moves a backup that a crash left
  behind back in place. Closing such a file is all the durability those clients offer: a
  closed HDFS file's blocks have been acknowledged by every datanode of its pipeline.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import shutil
import stat
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from ..exceptions import ForeignFileError

#: Suffixes of the hidden files a replacement makes beside its target (``.NAME.<8 hex><suffix>``).
PARTIAL_SUFFIX, BACKUP_SUFFIX = ".tmp", ".old"
#: The one pattern of every hidden name :func:`hidden_name` makes: ``.NAME.<8 lower-case hex><suffix>``.
#: Whatever recognises the tool's leftovers goes by it (:func:`hidden_target`): a user's
#: ``.NAME.notes.tmp`` is not the tool's.
HIDDEN_NAME = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{8}(?P<suffix>\.[a-z]+)", re.DOTALL)


def hidden_name(path: str, suffix: str) -> str:
    """A fresh hidden name beside ``path``: ``FOLDER/.NAME.<8 hex><suffix>``."""
    folder, name = posixpath.split(path)
    return posixpath.join(folder, f".{name}.{uuid.uuid4().hex[:8]}{suffix}")


def hidden_target(base_name: str, suffixes=(PARTIAL_SUFFIX, BACKUP_SUFFIX)) -> tuple[str, str] | None:
    """``(NAME, suffix)`` where ``base_name`` is exactly a hidden name :func:`hidden_name` makes
    for the file NAME with one of ``suffixes``; None for any other name."""
    found = HIDDEN_NAME.fullmatch(base_name)
    if found is None or found["suffix"] not in suffixes:
        return None
    return found["name"], found["suffix"]


def fsync_folder(folder) -> None:
    """fsync the folder ``folder`` (local), so that a rename or a new file in it is on disk."""
    fd = os.open(folder or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path) -> None:
    """fsync the local file ``path``'s bytes (written and closed by another writer, e.g. pyarrow)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_local(partial, path) -> None:
    """Move the finished local file ``partial`` onto ``path`` durably: its bytes fsynced, then
    ``os.replace`` (atomic: never a moment without a file at ``path`` if one was there), then
    the folder fsynced."""
    fsync_file(partial)
    os.replace(partial, path)
    fsync_folder(os.path.dirname(os.fspath(path)))


def write_local(path, write) -> None:
    """Call ``write(file_object)`` on a hidden temporary file beside the local file ``path`` (its
    folder made first), then put it in place with :func:`replace_local`. The file gets the
    permissions a plain ``open`` would give (0666 less the umask). An error leaves no temporary
    file and ``path`` as it was; an ``OSError`` without a file name (e.g. a full disk) is
    raised again naming ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = hidden_name(str(path), PARTIAL_SUFFIX)  # durable's one pattern: a leftover is known for the tool's
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # 0600 while written; 0600 kept would hide the file from colleagues
        os.replace(tmp, path)
        fsync_folder(path.parent)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:  # e.g. a full disk: say which file
            raise OSError(exc.errno, f"cannot write it: {exc.strerror or exc}", str(path)) from exc
        raise


def _hdfs_native(fs: pafs.FileSystem):
    """hdfs-native's fsspec file system behind ``fs`` (a ``PyFileSystem``), or None."""
    handler = getattr(fs, "handler", None)
    raw = getattr(handler, "fs", None)
    if raw is not None and hasattr(raw, "client") and any(
            cls.__module__.startswith("hdfs_native") for cls in type(raw).__mro__):
        return raw
    return None


@contextlib.contextmanager
def output_stream(fs: pafs.FileSystem, partial: str):
    """A stream writing the new file ``partial`` on ``fs``, its bytes made durable when the
    ``with`` block ends without an error (hsync on HDFS through hdfs-native; local files are
    fsynced by :func:`replace`)."""
    raw = _hdfs_native(fs)
    if raw is None:
        with fs.open_output_stream(partial, compression=None) as stream:  # the bytes as given, whatever the name
            yield stream
        return
    writer = raw.open(partial, "wb", overwrite=False)
    stream = pa.PythonFile(writer, mode="w")
    try:
        yield stream
        stream.flush()
        writer.hsync()  # on disk on every datanode of the pipeline before it is renamed in
    finally:
        stream.close()


def replace(fs: pafs.FileSystem, partial: str, path: str) -> None:
    """Move the finished file ``partial`` onto ``path`` on ``fs``, replacing a file there in the
    safest way the file system allows (see the module docstring)."""
    if isinstance(fs, pafs.LocalFileSystem):
        replace_local(partial, path)
        return
    raw = _hdfs_native(fs)
    if raw is not None:
        raw.client.rename(partial, path, True)  # the NameNode's rename with OVERWRITE: atomic
        return
    if fs.get_file_info(path).type != pafs.FileType.File:
        fs.move(partial, path)
        return
    backup = hidden_name(path, BACKUP_SUFFIX)
    fs.move(path, backup)  # the earlier bytes stay whole under the backup name ...
    try:
        fs.move(partial, path)
    except BaseException:
        with contextlib.suppress(OSError, pa.ArrowException):
            fs.move(backup, path)  # ... and go back where the new file could not be moved in
        raise
    with contextlib.suppress(OSError, pa.ArrowException):  # a backup left behind is restored or cleared later
        fs.delete_file(backup)


def place_new(fs: pafs.FileSystem, partial: str, path: str) -> bool:
    """Move the finished file ``partial`` to ``path`` on ``fs`` only where nothing is there: True
    when moved; False, ``partial`` left as it was, where a file (or anything else) took the name
    meanwhile, which is never touched. Atomic on local disk (``link(2)``, which never replaces,
    then the temporary name removed; fsynced as :func:`replace_local`) and on HDFS through
    hdfs-native (the NameNode's rename without ``OVERWRITE``); elsewhere a look, then a move."""
    if isinstance(fs, pafs.LocalFileSystem):
        fsync_file(partial)
        try:
            os.link(partial, path)
        except FileExistsError:
            return False
        except OSError:  # a file system without hard links: look, then rename
            if os.path.lexists(path):
                return False
            os.rename(partial, path)
        else:
            os.unlink(partial)
        fsync_folder(os.path.dirname(os.fspath(path)))
        return True
    raw = _hdfs_native(fs)
    if raw is not None:
        try:
            raw.client.rename(partial, path, False)  # refused by the NameNode where the name is taken
        except Exception:
            if fs.get_file_info(path).type != pafs.FileType.NotFound:
                return False
            raise
        return True
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        return False
    fs.move(partial, path)
    return True


def _backups(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    folder, name = posixpath.split(path)
    try:
        entries = fs.get_file_info(pafs.FileSelector(folder or ".", allow_not_found=True))
    except FileNotFoundError:
        return []
    return [e for e in entries if e.is_file and hidden_target(e.base_name, (BACKUP_SUFFIX,)) == (name, BACKUP_SUFFIX)]


def restore(fs: pafs.FileSystem, path: str) -> str | None:
    """Where a replacement on a file system without atomic overwrite was cut short between its two
    renames (``path`` missing, its backup ``.NAME.<8 hex>.old`` there), move the newest backup
    back to ``path``; returns the backup's path, or None. Backups beside a file that is in
    place are left alone (the replacement that made them deletes them)."""
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        return None
    found = sorted(_backups(fs, path), key=lambda e: e.mtime_ns or 0)
    if not found:
        return None
    fs.move(found[-1].path, path)
    return found[-1].path


# ------------------------------------------------------------------ appending, on local disk

_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_append(path, root=None):
    """The local file ``path`` opened for appending (made if missing; unbuffered, so that each
    ``write`` is one ``write(2)``), never through a link: a link at its name, or (given ``root``)
    at any folder between ``root`` and it, raises
    :class:`~iterreduce.exceptions.ForeignFileError` naming it, and nothing is written.

    A file that shares its bytes with another name (hard links: a run folder copied with
    ``cp -al``) is first replaced by a private copy of them (written beside it, then renamed
    over it): the appends change this name's file alone. A copy rather than an error: the copy
    is what its user meant to go on with, and the other name keeps its bytes."""
    path = Path(path)
    start = Path(root) if root is not None else path.parent
    folder = os.open(start, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in path.parent.relative_to(start).parts:
            inner = _open_folder_at(folder, part, start / part)
            os.close(folder)
            folder = inner
            start = start / part
        return os.fdopen(_open_own_append(folder, path), "ab", buffering=0)
    finally:
        os.close(folder)


def _open_own_append(folder: int, path: Path) -> int:
    """``path``'s file in the open ``folder``, for appending, a file of this name's alone: one
    shared through hard links is unshared first (:func:`_unshare_at`), and the open is made
    again where the name was replaced meanwhile (another process unsharing it between this
    open and its check: the file opened would then be the other name's alone)."""
    for _ in range(10):
        fd = _open_append_at(folder, path)
        opened = os.fstat(fd)  # before the name is looked at: one link then, and the name's, is this name's alone
        shared = opened.st_nlink > 1
        try:
            at_name = os.stat(path.name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            at_name = None
        if not shared and at_name is not None and (at_name.st_dev, at_name.st_ino) == (opened.st_dev, opened.st_ino):
            return fd
        os.close(fd)
        if shared:
            _unshare_at(folder, path.name)
    raise OSError(errno.EAGAIN, "cannot append to it: it keeps being replaced while it is opened", str(path))


def _not_followed(path, what: str = "a link"):

    return ForeignFileError(f"{path}: {what}, not a file this tool wrote; nothing is written through it, and it is "
                            f"left as it is: move it away, or choose another output folder (--out)")


def _open_folder_at(folder: int, name: str, path) -> int:
    try:
        return os.open(name, _FOLDER_FLAGS, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(path)):  # Linux says ENOTDIR
            raise _not_followed(path) from None
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def _open_append_at(folder: int, path: Path) -> int:
    """``path``'s file in the open ``folder``, for appending: never a link or anything but a plain file."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path.name, flags, 0o666, dir_fd=folder)  # O_NONBLOCK: a pipe put there never blocks the open
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _not_followed(path) from None
        if exc.errno in (errno.ENXIO, errno.EISDIR):
            raise _not_followed(path, "not a plain file") from None
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _not_followed(path, "not a plain file")
    os.set_blocking(fd, True)
    return fd


def _unshare_at(folder: int, name: str) -> None:
    """Replace the file ``name`` in the open ``folder`` by a copy of its bytes of its own (same
    permissions), so that it no longer shares them with its other hard links."""
    tmp = hidden_name(name, PARTIAL_SUFFIX)
    with open(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder), "rb") as src:
        if os.fstat(src.fileno()).st_nlink <= 1:
            return  # unshared meanwhile (by another process appending to it): its own already
        mode = stat.S_IMODE(os.fstat(src.fileno()).st_mode)
        target = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                         dir_fd=folder)
        try:
            with open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
