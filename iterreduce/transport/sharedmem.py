"""Tensors through shared memory between processes of one host, instead of gRPC's bytes.

When the master and a worker run on the same host (the local mini-cluster), the bytes of
a tensor need not travel through gRPC's serialisation and HTTP/2 frames twice: the sender
writes them once into a file of the run's folder in ``/dev/shm`` (memory, never disk) and
the :class:`TensorChunk` carries the file's name instead of the bytes (``shared_file``).
The receiver checks the reference before it trusts it (the name, a regular file of this
user, exactly the bytes the checked dtype and shape need) and maps the file copy-on-write:
no copy is made, what the receiver writes stays its own, and the sender may remove the name
once the receiver answered. The run's files are written once under new names and never
changed, so the arrays are bit for bit those gRPC would have carried. (A file truncated
under a reader by another process of the same user would end the reader with SIGBUS: the
folder is the user's alone, 0700, and the run never truncates.)

The launcher makes the folder (:func:`make_folder`, 0700), hands its path to the master and
the workers in ``$ITERREDUCE_SHARED_DIR``, and removes it at the end (:func:`remove_folder`):
only the names a run writes there, then the folder. A worker registers with the path it was
given; the master uses the folder only with a worker that named its own.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import secrets
import stat
import tempfile

import numpy as np

from ..exceptions import WireError

log = logging.getLogger(__name__)

#: The environment variable that hands the run's folder to the master and the workers.
SHARED_DIR_VAR = "ITERREDUCE_SHARED_DIR"
#: Where the folder is made: memory-backed on Linux.
SHM_ROOT = "/dev/shm"
#: The start of a run folder's name.
FOLDER_PREFIX = "iterreduce-shm-"
#: Every name a run writes in its folder: ``<writer's 8 hex>-<counter>.bin``.
FILE_NAME = re.compile(r"[0-9a-f]{8}-[0-9]{1,12}\.bin")


def available(root: str = SHM_ROOT) -> bool:
    """Whether this host has a shared-memory folder this user may write in."""
    return os.path.isdir(root) and os.access(root, os.W_OK | os.X_OK)


def make_folder(root: str = SHM_ROOT) -> str:
    """A new run folder under ``root`` (0700, an unguessable name); the caller removes it with
    :func:`remove_folder`."""
    return tempfile.mkdtemp(prefix=FOLDER_PREFIX, dir=root)


def remove_folder(path: str) -> None:
    """Remove a run folder :func:`make_folder` made: the names a run writes there, then the
    folder itself. Anything else in it stays, and so does the folder (a warning says so). Never
    through a link: ``path`` a link is left as it is. Removing it again, or from several processes
    at once, is harmless."""
    try:  # the names are unlinked in the folder opened here, never by a path a link could redirect
        folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("shared-memory folder %s kept: %s (not a folder, or a link)", path, exc.strerror)
        return
    try:
        for name in os.listdir(folder):
            if FILE_NAME.fullmatch(name):
                try:
                    os.unlink(name, dir_fd=folder)
                except OSError:  # gone already, or a folder of that name: not the run's, it stays
                    pass
    finally:
        os.close(folder)
    try:
        os.rmdir(path)
    except FileNotFoundError:  # another process of the job removed it meanwhile
        pass
    except OSError as exc:
        log.warning("shared-memory folder %s kept: %s (it holds files the run did not write)", path, exc)


class SharedFolder:
    """The run's shared-memory folder as one process uses it: :meth:`write` stores an array in
    a new file of this process's own (named ``<8 hex of this process>-<n>.bin``), :meth:`read`
    copies a referenced file into a new array after checking it, :meth:`remove` deletes a file
    this process wrote."""

    def __init__(self, path: str):
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise WireError(f"shared-memory folder {path}: not a directory of this user's alone (mode "
                            f"{stat.filemode(info.st_mode)}, owner uid {info.st_uid})")
        self.path = path
        self._dir = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._prefix = secrets.token_hex(4)
        self._count = 0
        self.written: set[str] = set()

    @classmethod
    def from_environment(cls) -> SharedFolder | None:
        """The folder the launcher named in :data:`SHARED_DIR_VAR`; None where it named none or
        it cannot be used (then the bytes go through gRPC, as between hosts)."""
        path = os.environ.get(SHARED_DIR_VAR)
        if not path:
            return None
        try:
            return cls(path)
        except (OSError, WireError) as exc:
            log.warning("not using shared memory: %s", exc)
            return None

    def write(self, array: np.ndarray) -> str:
        """Store ``array``'s bytes (C order) in a new file; returns its name. Raises ``OSError``
        where it cannot (a full ``/dev/shm``: 64 MB in a default Docker container), leaving no
        file behind."""
        self._count += 1
        name = f"{self._prefix}-{self._count}.bin"
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self._dir)
        self.written.add(name)
        try:
            with os.fdopen(fd, "wb", buffering=0) as f:
                view = memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))
                while view:
                    view = view[f.write(view):]
        except BaseException:
            self.remove([name])
            raise
        return name

    def read(self, name: str, dtype: np.dtype, shape: tuple[int, ...], tensor: str) -> np.ndarray:
        """An array of ``dtype`` and ``shape`` (checked already: :func:`wire.check_tensor`) over
        file ``name``'s bytes; raises :class:`WireError` naming ``tensor`` where the reference is
        not a file of this folder of exactly that many bytes.

        The array maps the file copy-on-write, not copied: it is writable, what is written to it
        stays this process's, and it holds its bytes after the writer removed the name. The run's
        files are written once and never changed (new names, ``O_EXCL``), so the bits are those
        the writer wrote."""
        if not FILE_NAME.fullmatch(name):
            raise WireError(f"tensor {tensor!r}: shared file name {name!r} is not one a run writes")
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dir)
        except OSError as exc:
            raise WireError(f"tensor {tensor!r}: shared file {name} in {self.path}: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_size != expected:
                raise WireError(f"tensor {tensor!r}: shared file {name} holds {info.st_size} bytes, not the "
                                f"{expected} of {dtype.name} {shape} (or is not this user's file)")
            if expected == 0:
                return np.empty(shape, dtype=dtype)
            mapped = mmap.mmap(fd, expected, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        return np.frombuffer(mapped, dtype=dtype).reshape(shape)

    def remove(self, names) -> None:
        """Delete files this process wrote (others' names are ignored)."""
        for name in names:
            if name in self.written:
                self.written.discard(name)
                try:
                    os.unlink(name, dir_fd=self._dir)
                except FileNotFoundError:
                    pass

    def close(self) -> None:
        """Delete every file this process wrote, and let go of the folder."""
        self.remove(list(self.written))
        os.close(self._dir)
