"""Fuzz tests (hypothesis) of the tensor wire decoder (``iterreduce.transport.wire.Decoder``).

Valid streams (what ``wire.encode`` makes of random arrays, in chunks of any size), mutated
(chunks dropped, reordered, repeated, fields changed, random chunks inserted), and random
chunk sequences (any names, dtypes, shapes, offsets, data, ``last`` and ``narrowed`` flags).

Any sequence gives either arrays (a valid stream: exactly what was encoded; never more bytes
allocated than arrived) or a ``WireError`` whose message names the tensor, never another
exception and never a hang. Rare finds are kept as explicit examples. The harness and the
profiles (``HYPOTHESIS_PROFILE``): ``tests/fuzzing.py``.
"""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from fuzzing import check_error_names, fuzz, outcome, within
from iterreduce.exceptions import WireError
from iterreduce.proto import iterreduce_pb2 as pb
from iterreduce.transport import wire

# ======================================================================= wire

NAMES = st.sampled_from(["a", "b", "0/rbm.0.weights", ""]) | st.text(
    st.characters(exclude_categories=["Cs"]), max_size=8)
DTYPES = st.sampled_from(sorted(wire.ALLOWED_DTYPES)) | st.sampled_from(
    ["", "object", "float128", "int8", "bool", "<f4", "V8", "U3", "complex64", "float32 ", "FLOAT32"])
DIMS = st.integers(0, 4) | st.sampled_from([-1, -(2**63), 2**31, 2**32 + 1, 2**62, 2**63 - 1])
SHAPES = st.lists(DIMS, max_size=4) | st.lists(st.integers(0, 2), min_size=30, max_size=80)
OFFSETS = st.integers(0, 16) | st.sampled_from([-1, 2**31, 2**63 - 1, -(2**63)])


def show_chunk(c: pb.TensorChunk) -> str:
    shape = list(c.shape)
    shape_text = f"[{shape[0]}] * {len(shape)}" if len(shape) > 8 and len(set(shape)) == 1 else repr(shape)
    return (f"TensorChunk(name={c.name!r}, dtype={c.dtype!r}, shape={shape_text}, offset={c.offset}, "
            f"data={c.data!r}, last={c.last}, narrowed={c.narrowed})")


class Chunks(list):
    """A list of chunks, shown one line each."""

    def __repr__(self):
        return "[" + ",\n ".join(show_chunk(c) for c in self) + "]"


@st.composite
def random_chunks(draw):
    """Any chunk; half of them a plausible whole tensor (offset 0, last, as many bytes as its
    header's dtype and shape need, however odd the shape)."""
    chunk = pb.TensorChunk(name=draw(NAMES), dtype=draw(DTYPES), shape=draw(SHAPES), offset=draw(OFFSETS),
                           data=draw(st.binary(max_size=40)), last=draw(st.booleans()),
                           narrowed=draw(st.booleans()))
    if draw(st.booleans()):
        chunk.offset, chunk.last = 0, True
        try:
            size = math.prod(chunk.shape) * np.dtype(chunk.dtype).itemsize
        except TypeError:  # not a dtype NumPy knows
            size = None
        if size is not None and 0 <= size <= 64:
            chunk.data = draw(st.binary(min_size=size, max_size=size))
    return chunk


ARRAYS = st.sampled_from(["float16", "float32", "float64", "int32", "int64", "uint8"]).flatmap(
    lambda dtype: st.lists(st.integers(0, 3), max_size=3).map(
        lambda shape: (np.arange(math.prod(shape)) % 251).astype(dtype).reshape(shape)))


@st.composite
def mutated_streams(draw):
    """(chunks, arrays, float16): a stream that encode() made of random arrays, maybe mutated
    (arrays is None then)."""
    arrays = draw(st.dictionaries(NAMES, ARRAYS, max_size=3))
    float16 = draw(st.booleans())
    with mock.patch.object(wire, "CHUNK_BYTES", draw(st.sampled_from([1, 2, 3, 8, 64]))):
        chunks = list(wire.encode(arrays, float16=float16))
    edits = draw(st.lists(st.sampled_from(["drop", "swap", "repeat", "field", "insert"]), max_size=3))
    for edit in edits:
        if not chunks:
            break
        i = draw(st.integers(0, len(chunks) - 1))
        if edit == "drop":
            del chunks[i]
        elif edit == "swap":
            j = draw(st.integers(0, len(chunks) - 1))
            chunks[i], chunks[j] = chunks[j], chunks[i]
        elif edit == "repeat":
            chunks.insert(i, chunks[i])
        elif edit == "insert":
            chunks.insert(i, draw(random_chunks()))
        else:
            c = pb.TensorChunk()
            c.CopyFrom(chunks[i])
            field = draw(st.sampled_from(["name", "dtype", "shape", "offset", "data", "last", "narrowed"]))
            if field == "name":
                c.name = draw(NAMES)
            elif field == "dtype":
                c.dtype = draw(DTYPES)
            elif field == "shape":
                c.ClearField("shape")
                c.shape.extend(draw(SHAPES))
            elif field == "offset":
                c.offset = draw(OFFSETS)
            elif field == "data":
                c.data = draw(st.binary(max_size=16))
            elif field == "last":
                c.last = not c.last
            else:
                c.narrowed = not c.narrowed
            chunks[i] = c
    return Chunks(chunks), (arrays if not edits else None), float16


def decode_checked(chunks):
    """Decode ``chunks``; returns the arrays, or None after a WireError that names its tensor."""
    decoder = wire.Decoder()
    received = 0
    with within("Decoder"):
        for chunk in chunks:
            try:
                decoder.add(chunk)
            except WireError as exc:
                check_error_names(exc, repr(chunk.name))
                outcome(exc)
                return None
            received += len(chunk.data)
        try:
            arrays = decoder.finish()
        except WireError as exc:
            message = str(exc)
            assert decoder._open and all(repr(name) in message for name in decoder._open), message
            outcome(exc)
            return None
    outcome(f"decoded {len(arrays)} tensor(s)")
    for name, array in arrays.items():
        assert isinstance(array, np.ndarray), name
        assert array.dtype.name in wire.ALLOWED_DTYPES, (name, array.dtype)
    # Nothing is allocated beyond what arrived (twice that for float16 widened to float32).
    assert sum(a.nbytes for a in arrays.values()) <= 2 * received
    return arrays


@fuzz(3)
@given(chunks=st.lists(random_chunks(), max_size=6).map(Chunks))
# The fuzzer's finds (NumPy refused both in reshape, with a ValueError of its own):
@example(chunks=Chunks([pb.TensorChunk(name="a", dtype="float16", shape=[0] * 65, last=True)]))  # > 64 dimensions
@example(chunks=Chunks([pb.TensorChunk(name="a", dtype="uint8", shape=[0, 2**62], last=True)]))  # empty, yet "too big"
def test_decoder_on_random_chunks_gives_arrays_or_a_wire_error(chunks):
    arrays = decode_checked(chunks)
    if arrays is None:
        return
    headers = {}
    for c in chunks:
        if c.offset == 0:
            headers.setdefault(c.name, c)
    for name, array in arrays.items():
        head = headers[name]
        assert array.shape == tuple(head.shape)
        assert array.dtype == (np.float32 if head.narrowed else np.dtype(head.dtype))


@fuzz(3)
@given(stream=mutated_streams())
def test_decoder_on_encoded_streams_round_trips_or_gives_a_wire_error(stream):
    chunks, arrays, float16 = stream
    decoded = decode_checked(chunks)
    if arrays is None:
        return
    assert decoded is not None, "a valid stream refused"
    assert list(decoded) == list(arrays)
    for name, array in arrays.items():
        expected = array.astype(np.float16).astype(np.float32) if float16 and array.dtype == np.float32 else array
        assert decoded[name].dtype == expected.dtype and decoded[name].shape == expected.shape
        np.testing.assert_array_equal(decoded[name], expected)
