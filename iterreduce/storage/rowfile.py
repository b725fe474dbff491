"""Rows on local disk: a worker's bounded-memory copy of data larger than its memory.

A :class:`RowFile` holds fixed-width rows of one dtype in a plain file, written once
in order and then read back by row index. It looks enough like a 2-D array
(``shape``, ``dtype``, ``len``, ``rows[a:b]``, ``rows[index]``) that code written for
in-memory arrays can take rows from it, and :func:`prefetch` reads ahead in a
background thread so that the computation never waits for the disk.

Reads use ``pread``, not ``mmap``: pages of a mapped file count towards a process's
resident memory, which is what YARN measures to kill a container; the page cache
that ``pread`` fills does not.
"""

from __future__ import annotations

import os
import queue
import tempfile
import threading
from typing import Callable, Iterable, Iterator

import numpy as np


class RowFile:
    """Fixed-width rows of ``dtype`` in the file ``path`` (created, or truncated, here).

    ``convert`` (optional) turns stored rows into the rows callers see on the way out (a
    shard passes :func:`shardio.shards.as_float32`, the conversion of the in-memory read,
    so a row read from disk has the bits of the same row read into memory while the file
    keeps the compact stored type).
    """

    def __init__(self, path: str | os.PathLike, width: int, dtype, *, convert: Callable | None = None):
        self.path = os.fspath(path)
        self.width = int(width)
        self.stored = np.dtype(dtype)
        self.convert = convert
        #: the dtype rows come out as
        self.dtype = self._converted(np.empty((0, self.width), self.stored)).dtype
        self.row_bytes = self.width * self.stored.itemsize
        self.rows = 0
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)

    @classmethod
    def new(cls, directory: str, prefix: str, width: int, dtype, *, convert: Callable | None = None) -> "RowFile":
        """A row file under a fresh, unique name in ``directory`` (never another file's)."""
        fd, path = tempfile.mkstemp(prefix=prefix, suffix=".rows", dir=directory)
        os.close(fd)
        return cls(path, width, dtype, convert=convert)

    # ------------------------------------------------------------ array-like

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.width)

    @property
    def nbytes(self) -> int:
        """Bytes on disk."""
        return self.rows * self.row_bytes

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.rows)
            if step != 1:
                raise IndexError(f"{self.path}: row slices must be contiguous, got step {step}")
            return self.read(start, stop)
        return self.take(np.asarray(key))

    # --------------------------------------------------------------- writing

    def append(self, block: np.ndarray) -> None:
        """Write ``block`` (rows x width, of the stored dtype) after the last row."""
        block = np.ascontiguousarray(block, dtype=self.stored)
        if block.ndim != 2 or block.shape[1] != self.width:
            raise ValueError(f"{self.path}: rows of width {self.width} expected, got shape {block.shape}")
        view, offset = memoryview(block).cast("B"), self.rows * self.row_bytes
        while view:  # pwrite may write less than asked (a signal, a full pipe of pages)
            written = os.pwrite(self._fd, view, offset)
            view, offset = view[written:], offset + written
        self.rows += block.shape[0]

    # --------------------------------------------------------------- reading

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start`` to ``stop`` (contiguous), converted as the class docstring says."""
        out = np.empty((max(stop - start, 0), self.width), dtype=self.stored)
        self._read_into(out, start)
        return self._converted(out)

    def take(self, index: np.ndarray) -> np.ndarray:
        """Rows at ``index`` (any order, repeats allowed), read in ascending file order."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= self.rows):
            bad = index[(index < 0) | (index >= self.rows)][0]
            raise IndexError(f"{self.path}: row {bad} out of range for {self.rows} rows")
        ascending = np.argsort(index, kind="stable")
        out = np.empty((index.size, self.width), dtype=self.stored)
        fd, size = self._fd, self.row_bytes
        for position in ascending:
            row = memoryview(out[position]).cast("B")
            if os.preadv(fd, [row], int(index[position]) * size) != size:
                raise OSError(f"{self.path}: short read at row {index[position]}")
        return self._converted(out)

    def chunks(self, size: int) -> Iterator[np.ndarray]:
        """Every row in order, ``size`` rows at a time (the last chunk may be shorter)."""
        for start in range(0, self.rows, size):
            yield self.read(start, min(start + size, self.rows))

    def _read_into(self, out: np.ndarray, start: int) -> None:
        view, offset = memoryview(out).cast("B"), start * self.row_bytes
        while view:
            got = os.preadv(self._fd, [view], offset)
            if got <= 0:
                raise OSError(f"{self.path}: file ends before row {offset // self.row_bytes}")
            view, offset = view[got:], offset + got

    def _converted(self, values: np.ndarray) -> np.ndarray:
        return self.convert(values) if self.convert else values

    # --------------------------------------------------------------- cleanup

    def close(self, delete: bool = True) -> None:
        """Close the file and (by default) remove it: a spilled copy is worth nothing after the job."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if delete:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"RowFile({self.path!r}, rows={self.rows}, width={self.width}, stored={self.stored})"


def prefetch(items: Iterable, depth: int = 2) -> Iterator:
    """The items of ``items``, produced ``depth`` ahead in a background thread.

    Reading a file and converting rows release the GIL, so the producer overlaps
    the consumer's products. An exception in the producer is raised in the consumer;
    abandoning the iterator stops the producer at its next item.
    """
    slots: queue.Queue = queue.Queue(maxsize=max(depth, 1))
    stop = threading.Event()
    done = object()

    def produce():
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        slots.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put((done, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            slots.put((done, exc))

    thread = threading.Thread(target=produce, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = slots.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                slots.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)


#: The variable naming the folder for a worker's local files (the local mini-cluster sets it to a
#: folder of its own, which it removes at the end).
LOCAL_DIR_VAR = "ITERREDUCE_LOCAL_DIR"


def local_directory() -> str:
    """Where a worker keeps its row files: ``$ITERREDUCE_LOCAL_DIR``, else the first of YARN's
    local directories for the container (``$LOCAL_DIRS``), else the temporary directory."""
    chosen = os.environ.get(LOCAL_DIR_VAR) or os.environ.get("LOCAL_DIRS", "").split(",")[0]
    return chosen or tempfile.gettempdir()
