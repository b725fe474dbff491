"""Tensors on the wire: named NumPy arrays cut into chunks of a gRPC stream.

A 2000x500 float32 layer is 4 MB, and gRPC's default message limit is 4 MB, so
arrays travel in chunks of ``CHUNK_BYTES``. Optionally float32 arrays travel as
float16 (half the bytes) and are widened again on arrival. Small chunks share a
message (:func:`packed`): a message costs a trip through gRPC's queues on both
sides whatever its size.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np

from ..exceptions import WireError
from ..proto import iterreduce_pb2 as pb
from .sharedmem import SharedFolder

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
#: the largest gRPC message either side accepts: one chunk plus headers, with room to spare
MAX_MESSAGE_BYTES = 4 * CHUNK_BYTES
ALLOWED_DTYPES = {"float16", "float32", "float64", "int32", "int64", "uint8"}
MAX_ELEMENTS = 1 << 31  # refuse to allocate absurd tensors from a malformed header
#: at most as many dimensions as every NumPy version takes (NumPy 1 stops at 32, NumPy 2 at 64)
MAX_DIMS = 32


def encode(arrays: dict[str, np.ndarray], float16: bool = False,
           shared: SharedFolder | None = None) -> Iterator[pb.TensorChunk]:
    """Cut ``arrays`` into :class:`TensorChunk` messages (the bytes of each chunk are copied
    once, from the array straight into its message). With ``shared``, each array's bytes go
    into a new file of that folder instead, and one chunk names the file."""
    for name, array in arrays.items():
        array = np.asarray(array, order="C")
        narrowed = float16 and array.dtype == np.float32
        if narrowed:
            array = array.astype(np.float16)
        if shared is not None:
            try:
                file = shared.write(array)
            except OSError as exc:  # e.g. a full /dev/shm: this one goes as bytes
                log.warning("tensor %r sent through gRPC, not shared memory: %s", name, exc)
            else:
                yield pb.TensorChunk(name=name, dtype=array.dtype.name, shape=array.shape, narrowed=narrowed,
                                     last=True, shared_file=file)
                continue
        flat = array.reshape(-1).view(np.uint8)  # C order: the bytes ``array.tobytes()`` gives
        offsets = range(0, max(flat.size, 1), CHUNK_BYTES)
        for i, offset in enumerate(offsets):
            chunk = pb.TensorChunk(name=name, offset=offset, data=flat[offset:offset + CHUNK_BYTES].tobytes(),
                                   last=i == len(offsets) - 1)
            if offset == 0:
                chunk.dtype = array.dtype.name
                chunk.shape.extend(array.shape)
                chunk.narrowed = narrowed
            yield chunk


T = TypeVar("T")


def packed(items: Iterable[T], size: Callable[[T], int], limit: int = CHUNK_BYTES) -> Iterator[list[T]]:
    """``items`` in order, grouped one group a message: each group as many as add up to at most
    ``limit`` bytes by ``size`` (an item that big travels alone). Lazy: holds one group at a time."""
    group: list[T] = []
    total = 0
    for item in items:
        n = size(item)
        if group and total + n > limit:
            yield group
            group, total = [], 0
        group.append(item)
        total += n
    if group:
        yield group


def check_tensor(name: str, dtype: str, shape, narrowed: bool) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape a tensor's header announces, checked before anything is allocated
    for it; raises :class:`WireError` naming the tensor."""
    if dtype not in ALLOWED_DTYPES:
        raise WireError(f"tensor {name!r}: dtype {dtype!r} not allowed")
    shape = tuple(int(n) for n in shape)
    if len(shape) > MAX_DIMS:
        raise WireError(f"tensor {name!r}: bad shape of {len(shape)} dimensions (at most {MAX_DIMS})")
    # math.prod on Python ints: numpy's int64 product wraps around for absurd shapes. Zero
    # dimensions count as 1: NumPy refuses (0, 2**62) as too big although it holds nothing.
    if any(n < 0 for n in shape) or math.prod(max(n, 1) for n in shape) > MAX_ELEMENTS:
        raise WireError(f"tensor {name!r}: bad shape {shape} (at most {MAX_ELEMENTS} elements, "
                        f"zero dimensions counted as one)")
    if narrowed and dtype != "float16":
        raise WireError(f"tensor {name!r}: marked narrowed but sent as {dtype}")
    return np.dtype(dtype), shape


class _Open:
    """A tensor whose chunks are arriving: their bytes are kept as they came (no copy) and
    copied once, into the array, when the last one is in."""

    __slots__ = ("dtype", "shape", "narrowed", "expected", "received", "pieces")

    def __init__(self, dtype: np.dtype, shape: tuple, narrowed: bool):
        self.dtype, self.shape, self.narrowed = dtype, shape, narrowed
        self.expected = math.prod(shape) * dtype.itemsize
        self.received = 0
        self.pieces: list[bytes] = []


class Decoder:
    """Reassembles :class:`TensorChunk` messages into arrays, checking every header.

    Nothing is allocated for a tensor before its bytes arrive (a header alone cannot make
    the receiver reserve memory), and each byte is copied once, into the finished array.
    ``shared``: the run's shared-memory folder, where a chunk may name the file that holds
    its tensor (:mod:`iterreduce.transport.sharedmem`); without, such a chunk is refused."""

    def __init__(self, shared: SharedFolder | None = None):
        self.arrays: dict[str, np.ndarray] = {}
        self._open: dict[str, _Open] = {}
        self.shared = shared

    def add(self, chunk: pb.TensorChunk) -> None:
        if chunk.shared_file:
            self._add_shared(chunk)
            return
        if chunk.offset == 0:
            dtype, shape = check_tensor(chunk.name, chunk.dtype, chunk.shape, chunk.narrowed)
            if chunk.name in self._open or chunk.name in self.arrays:
                raise WireError(f"tensor {chunk.name!r} sent twice")
            self._open[chunk.name] = _Open(dtype, shape, chunk.narrowed)
        tensor = self._open.get(chunk.name)
        if tensor is None:
            raise WireError(f"tensor {chunk.name!r}: chunk at offset {chunk.offset} without a header")
        if chunk.offset != tensor.received:
            raise WireError(f"tensor {chunk.name!r}: chunk at offset {chunk.offset}, expected {tensor.received}")
        data = chunk.data
        if tensor.received + len(data) > tensor.expected:
            raise WireError(f"tensor {chunk.name!r}: chunk at offset {chunk.offset} brings {len(data)} bytes, "
                            f"more than the {tensor.expected} bytes its shape needs")
        if data:
            tensor.pieces.append(data)
            tensor.received += len(data)
        if chunk.last:
            if tensor.received != tensor.expected:
                raise WireError(f"tensor {chunk.name!r}: {tensor.received} bytes, expected {tensor.expected}")
            array = np.empty(tensor.shape, dtype=tensor.dtype)  # writable, owns its memory
            flat = array.reshape(-1).view(np.uint8)
            position = 0
            for piece in tensor.pieces:
                flat[position:position + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
                position += len(piece)
            if tensor.narrowed:
                array = array.astype(np.float32)
            self.arrays[chunk.name] = array
            del self._open[chunk.name]

    def _add_shared(self, chunk: pb.TensorChunk) -> None:
        """A whole tensor whose bytes are in a file of the shared folder."""
        dtype, shape = check_tensor(chunk.name, chunk.dtype, chunk.shape, chunk.narrowed)
        if chunk.name in self._open or chunk.name in self.arrays:
            raise WireError(f"tensor {chunk.name!r} sent twice")
        if chunk.offset or chunk.data or not chunk.last:
            raise WireError(f"tensor {chunk.name!r}: a shared file's chunk must be the whole tensor "
                            f"(offset 0, no data, last)")
        if self.shared is None:
            raise WireError(f"tensor {chunk.name!r}: sent in shared file {chunk.shared_file!r}, and this "
                            f"process shares no folder with the sender")
        array = self.shared.read(chunk.shared_file, dtype, shape, chunk.name)
        self.arrays[chunk.name] = array.astype(np.float32) if chunk.narrowed else array

    def finish(self) -> dict[str, np.ndarray]:
        if self._open:
            raise WireError(f"stream ended inside tensor(s) {sorted(self._open)}")
        return self.arrays


def decode(chunks: Iterable[pb.TensorChunk], shared: SharedFolder | None = None) -> dict[str, np.ndarray]:
    """Reassemble a whole stream of chunks (``shared``: see :class:`Decoder`)."""
    decoder = Decoder(shared)
    for chunk in chunks:
        decoder.add(chunk)
    return decoder.finish()
