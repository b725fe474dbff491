"""One interface to a folder the runtime owns files in, on local disk or on any pyarrow file
system (HDFS): the few things the ownership rules do to a folder, each done without going
through a link. The rules (:mod:`.records`, :mod:`.claims`, :mod:`.previous`,
:mod:`.shardsets`) are written once over it.

Paths inside a folder are relative: names joined by ``/`` (``.`` is the folder itself).

- :class:`LocalFolder`: every name is reached from the folder one name at a time with
  ``O_NOFOLLOW`` (a link at any depth is never followed: it is seen as a link, or the call
  fails), small files are read from a descriptor so opened, files are replaced atomically
  (:func:`~iterreduce.storage.durable.write_local`).
- :class:`ArrowFolder`: a folder of a pyarrow file system (HDFS has no links); files are
  replaced with :func:`~iterreduce.storage.filesystems.open_output_file`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
from abc import ABC, abstractmethod
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from ...exceptions import ForeignFileError, HdfsAccessError
from .. import durable
from ..filesystems import join, open_output_file

#: The bytes read at a time from a small file: a file never makes the process hold much more than it holds.
CHUNK_BYTES = 1 << 16


@dataclass(frozen=True)
class Entry:
    """What a name in a folder is, itself (a link is a link, not its target): ``kind`` is
    ``file``, ``folder``, ``link`` or ``other``; ``mtime_ns`` is None where the file system
    keeps no time (hdfs-native's listing)."""

    kind: str
    size: int
    mtime_ns: int | None


class Folder(ABC):
    """A folder whose files the runtime may own: the primitives the ownership rules use. Every
    ``rel`` is a path relative to the folder; none of these goes through a link."""

    #: The folder's own path on its file system.
    root: str

    def path(self, rel: str = ".") -> str:
        """``rel`` as a path of its file system (for messages and for the file system's own calls)."""
        return self.root if rel == "." else join(self.root, rel)

    @abstractmethod
    def sub(self, rel: str) -> "Folder":
        """The folder ``rel`` of this one, as a folder of the same kind."""

    @abstractmethod
    def entry(self, rel: str) -> Entry | None:
        """What ``rel`` is (a link itself, not its target); None where nothing is there."""

    def kind(self, rel: str) -> str | None:
        """What ``rel`` is (:attr:`Entry.kind`); None where nothing is there."""
        found = self.entry(rel)
        return None if found is None else found.kind

    @abstractmethod
    def entries(self, rel: str = ".") -> list[tuple[str, Entry]]:
        """The names in the folder ``rel`` with what each is, sorted by name; none where ``rel``
        is not a plain folder."""


    def digest(self, rel: str) -> str | None:
        """The SHA-256 (hex) of the file ``rel``'s bytes (None where it is missing), read
        ``CHUNK_BYTES`` at a time; ValueError and OSError as :meth:`read`."""
        with self._reader(rel) as read:
            if read is None:
                return None
            hashed = hashlib.sha256()
            while chunk := read(CHUNK_BYTES):
                hashed.update(chunk)
            return hashed.hexdigest()

    def read(self, rel: str, most: int) -> bytes | None:
        """At most ``most`` bytes of the file ``rel`` (None where it is missing), read
        ``CHUNK_BYTES`` at a time. ValueError where it is a link or not a plain file (it is
        then not read); OSError where it cannot be read."""
        with self._reader(rel) as read:
            return None if read is None else _read_chunks(read, most)

    @abstractmethod
    def _reader(self, rel: str):
        """A context giving the ``read(n)`` of the file ``rel``, or None where it is missing (see :meth:`read`)."""

    @abstractmethod
    def write(self, rel: str, data: bytes) -> None:
        """Put a new file holding ``data`` at ``rel``, whole or not at all (written beside it, then
        renamed over it: never written through a link or into bytes another name shares)."""

    @abstractmethod
    def remove_file(self, rel: str) -> None:
        """Delete the file ``rel`` (a link there goes itself, never its target); missing is fine."""

    @abstractmethod
    def remove_folder(self, rel: str = ".") -> None:
        """Remove the folder ``rel`` (``.``: this one); OSError where it is not empty or not there."""

    @abstractmethod
    def make_folder(self, rel: str = ".") -> None:
        """Make the folder ``rel``; FileExistsError where anything is there already. ``.``: this
        folder, with the folders above it, where missing."""

    @abstractmethod
    def move(self, rel: str, to: str) -> None:
        """Move ``rel`` (a link: the link itself) to ``to``, both in this folder."""

    @abstractmethod
    def link_or_copy(self, rel: str, to: str) -> None:
        """A second name ``to`` for the file ``rel`` (a hard link; a copy where links fail)."""


def _read_chunks(read, most: int) -> bytes:
    """At most ``most`` bytes from ``read(n)``, asked for ``CHUNK_BYTES`` at a time, so that a
    small file never makes the process allocate ``most``."""
    chunks, left = [], most
    while left > 0:
        chunk = read(min(left, CHUNK_BYTES))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _entry_of(st: os.stat_result) -> Entry:
    kinds = ((stat.S_ISLNK, "link"), (stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"))
    kind = next((name for test, name in kinds if test(st.st_mode)), "other")
    return Entry(kind, st.st_size, st.st_mtime_ns)


class LocalFolder(Folder):
    """A folder on local disk (see the module docstring)."""

    def __init__(self, root):
        self.root = str(root)

    def sub(self, rel: str) -> "LocalFolder":
        return LocalFolder(self.path(rel))

    @contextlib.contextmanager
    def _parent(self, rel: str):
        """The folder holding ``rel``'s last name, reached one name at a time and never through
        a link: yields its descriptor and that last name. OSError (``ELOOP``, ``ENOTDIR``,
        ``ENOENT``) where a name on the way is a link, a file, or missing."""
        *parts, name = rel.split("/")
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts:
                inner = os.open(part, _FOLDER_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = inner
            yield fd, name
        finally:
            os.close(fd)

    def entry(self, rel: str) -> Entry | None:
        try:
            with self._parent(rel) as (fd, name):
                return _entry_of(os.stat(name, dir_fd=fd, follow_symlinks=False))
        except (OSError, ValueError):  # ValueError: a NUL in a name
            return None

    def entries(self, rel: str = ".") -> list[tuple[str, Entry]]:
        found = []
        try:
            with self._parent(rel) as (fd, name):
                inner = os.open(name, _FOLDER_FLAGS, dir_fd=fd)
            try:
                for child in sorted(os.listdir(inner)):
                    with contextlib.suppress(OSError):  # gone meanwhile: passed over
                        found.append((child, _entry_of(os.stat(child, dir_fd=inner, follow_symlinks=False))))
            finally:
                os.close(inner)
        except (OSError, ValueError):
            return []
        return found

    @contextlib.contextmanager
    def _reader(self, rel: str):
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a pipe never blocks
        try:
            with self._parent(rel) as (folder, name):
                fd = os.open(name, flags, dir_fd=folder)
        except FileNotFoundError:
            yield None
            return
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise ValueError("a link, which this tool never makes: not followed") from None
            raise
        with os.fdopen(fd, "rb", buffering=0) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("not a plain file")
            yield f.read

    def write(self, rel: str, data: bytes) -> None:
        durable.write_local(self.path(rel), lambda f: f.write(data))

    def remove_file(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            with self._parent(rel) as (fd, name):
                os.unlink(name, dir_fd=fd)

    def remove_folder(self, rel: str = ".") -> None:
        if rel == ".":
            os.rmdir(self.root)
            return
        with self._parent(rel) as (fd, name):
            os.rmdir(name, dir_fd=fd)

    def make_folder(self, rel: str = ".") -> None:
        if rel == ".":
            Path(self.root).mkdir(parents=True, exist_ok=True)
            return
        with self._parent(rel) as (fd, name):
            os.mkdir(name, dir_fd=fd)

    def move(self, rel: str, to: str) -> None:
        # both ends reached one name at a time, as a delete is: a link on the way is refused (ELOOP)
        with self._parent(rel) as (source, name), self._parent(to) as (target, new_name):
            os.rename(name, new_name, src_dir_fd=source, dst_dir_fd=target)

    def link_or_copy(self, rel: str, to: str) -> None:
        try:
            os.link(self.path(rel), self.path(to), follow_symlinks=False)
        except OSError:
            shutil.copy2(self.path(rel), self.path(to))


_KINDS = {pafs.FileType.File: "file", pafs.FileType.Directory: "folder"}


def _entry_of_info(info: pafs.FileInfo) -> Entry:
    return Entry(_KINDS.get(info.type, "other"), info.size or 0, info.mtime_ns)


class ArrowFolder(Folder):
    """A folder of a pyarrow file system (HDFS; any other, local disk too, seen through its
    calls: links are then followed as pyarrow does). See the module docstring."""

    def __init__(self, fs: pafs.FileSystem, root: str):
        self.fs, self.root = fs, root

    def sub(self, rel: str) -> "ArrowFolder":
        return ArrowFolder(self.fs, self.path(rel))

    def entry(self, rel: str) -> Entry | None:
        info = self.fs.get_file_info(self.path(rel))
        return None if info.type == pafs.FileType.NotFound else _entry_of_info(info)

    def entries(self, rel: str = ".") -> list[tuple[str, Entry]]:
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.path(rel)))
        except HdfsAccessError:
            raise  # HDFS refused this process: said as it is
        except (OSError, pa.ArrowException):  # missing, or not a folder
            return []
        return sorted((info.base_name, _entry_of_info(info)) for info in infos)

    @contextlib.contextmanager
    def _reader(self, rel: str):
        path = self.path(rel)
        try:
            stream = self.fs.open_input_stream(path, compression=None)
        except HdfsAccessError:
            raise  # HDFS refused this process: said as it is
        except FileNotFoundError:
            stream = None
        except (OSError, pa.ArrowException) as exc:
            found = self.entry(rel)
            if found is not None and found.kind != "file":
                raise ValueError("not a plain file") from None
            if found is not None:
                raise OSError(f"{path}: cannot read: {exc}") from exc
            stream = None  # gone meanwhile
        if stream is None:
            yield None
            return
        with stream:
            def read(n: int) -> bytes:
                try:
                    return stream.read(n)
                except pa.ArrowException as exc:
                    raise OSError(f"{path}: cannot read: {exc}") from exc
            yield read

    def write(self, rel: str, data: bytes) -> None:
        path = self.path(rel)
        with open_output_file(path, resolve=lambda _: (self.fs, path)) as f:  # whole, or the earlier one
            f.write(data)

    def remove_file(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.path(rel))

    def remove_folder(self, rel: str = ".") -> None:
        # pyarrow's delete_dir takes what is in the folder too: it is called on an empty one only
        if self.entries(rel):
            raise OSError(errno.ENOTEMPTY, "not empty", self.path(rel))
        self.fs.delete_dir(self.path(rel))

    def make_folder(self, rel: str = ".") -> None:
        if rel != "." and self.entry(rel) is not None:
            raise FileExistsError(errno.EEXIST, "already there", self.path(rel))
        self.fs.create_dir(self.path(rel), recursive=True)

    def move(self, rel: str, to: str) -> None:
        self.fs.move(self.path(rel), self.path(to))

    def link_or_copy(self, rel: str, to: str) -> None:
        self.fs.copy_file(self.path(rel), self.path(to))  # no hard links on HDFS


def folder_on(fs: pafs.FileSystem, path: str) -> Folder:
    """The folder ``path`` of ``fs``: a :class:`LocalFolder` on local disk (no link followed), an
    :class:`ArrowFolder` elsewhere."""
    return LocalFolder(path) if isinstance(fs, pafs.LocalFileSystem) else ArrowFolder(fs, path)


def as_folder(folder) -> Folder:
    """``folder`` as a :class:`Folder`: one already, or a local path."""
    return folder if isinstance(folder, Folder) else LocalFolder(Path(folder))


def check_not_link(folder) -> None:
    """Refuse (:class:`~iterreduce.exceptions.ForeignFileError`, naming it) the local folder
    ``folder`` the tool is about to write into or delete in where it is a symbolic link: nothing
    the tool writes or deletes goes through a link (its target is someone else's)."""
    if os.path.islink(folder):
        raise ForeignFileError(f"{folder}: a link, which this tool never makes nor writes through; it is left as it "
                               f"is, and what it points to too: move it away, or choose another folder")
