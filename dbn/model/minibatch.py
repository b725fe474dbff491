"""Minibatches from data in device memory or streamed from local disk.

Training loops take their rows through :func:`minibatches`, so the same loop trains
on a device array or on a streamed copy (an object with ``shape``, ``take(index)``
and ``chunks(rows)`` returning host arrays, such as :class:`iterreduce.storage.rowfile.RowFile`):
the rows of minibatch ``i`` are the same, and so are their bits. Streamed rows are
read ahead in a background thread while the device computes.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from iterreduce.storage.rowfile import prefetch

#: Rows per block when a whole data set is passed through a layer (transform, means):
#: one value for in-memory and streamed data keeps their products, and results, identical.
CHUNK_ROWS = 8192

#: Minibatches a streamed source reads ahead of the one being trained on.
PREFETCH_DEPTH = 4


def in_memory(X, backend) -> bool:
    """Whether ``X`` is an array on ``backend``'s device (else a streamed source)."""
    return isinstance(X, backend.xp.ndarray)


def minibatches(X, order: np.ndarray, batch: int, numbers, out, backend, labels=None) -> Iterator:
    """For each minibatch number ``i`` in ``numbers``, write rows ``order[i*batch:(i+1)*batch]``
    of ``X`` into the device array ``out`` and yield ``out`` (or ``(out, their labels)`` when
    ``labels`` is given: a device array for in-memory ``X``, a host array for streamed ``X``)."""
    n_batches = len(order) // batch
    for i in numbers:
        if not 0 <= i < n_batches:
            raise IndexError(f"minibatch {i} out of range for {n_batches} minibatches of {batch}")
    xp = backend.xp
    if in_memory(X, backend):
        device_order = backend.asarray(order, dtype=np.int64)
        for i in numbers:
            index = device_order[i * batch:(i + 1) * batch]
            xp.take(X, index, axis=0, out=out)
            yield out if labels is None else (out, labels[index])
        return
    def read():
        for i in numbers:
            index = order[i * batch:(i + 1) * batch]
            yield X.take(index), (None if labels is None else labels[index])

    for rows, batch_labels in prefetch(read(), PREFETCH_DEPTH):
        out[...] = backend.asarray(rows)
        yield out if labels is None else (out, backend.asarray(batch_labels, dtype=np.int64))


def chunks(X, backend) -> Iterator:
    """``(start, block)`` for every block of :data:`CHUNK_ROWS` rows of ``X`` in order, the
    blocks as device arrays."""
    rows = CHUNK_ROWS
    if in_memory(X, backend):
        for start in range(0, X.shape[0], rows):
            yield start, X[start:start + rows]
        return
    for start, block in zip(range(0, X.shape[0], rows), prefetch(X.chunks(rows), 2)):
        yield start, backend.asarray(block)


def column_mean(X, backend) -> np.ndarray:
    """The mean of each column of ``X`` as a float32 host vector, summed in float64 chunk by
    chunk in row order (so in-memory and streamed data give the same bits)."""
    xp = backend.xp
    total = None
    for _, block in chunks(X, backend):
        part = xp.sum(block, axis=0, dtype=np.float64)
        total = part if total is None else total + part
    return backend.to_numpy(total / X.shape[0]).astype(np.float32)
