"""Chunked tensor wire format: round trips, float16 option, and refusal of malformed streams."""

from __future__ import annotations

import numpy as np
import pytest

from iterreduce.proto import iterreduce_pb2 as pb
from iterreduce.transport import wire
from iterreduce.transport.wire import CHUNK_BYTES, Decoder, WireError, decode, encode


def chunk(name="t", dtype="", shape=(), offset=0, data=b"", last=True) -> pb.TensorChunk:
    return pb.TensorChunk(name=name, dtype=dtype, shape=list(shape), offset=offset, data=data, last=last)


def test_round_trip_of_several_arrays_including_multi_chunk_and_empty():
    rng = np.random.default_rng(0)
    big = rng.standard_normal((2000, 500)).astype(np.float32)  # 4 MB: four 1 MiB chunks
    arrays = {
        "big": big,
        "f64": rng.standard_normal((7, 3)),
        "i64": np.arange(-5, 5, dtype=np.int64).reshape(2, 5),
        "i32": np.array([1, -2, 3], dtype=np.int32),
        "u8": np.arange(256, dtype=np.uint8),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "fortran": np.asfortranarray(rng.standard_normal((4, 6)).astype(np.float32)),
        "strided": big[::7, ::3],
    }
    chunks = list(encode(arrays))
    by_name = {}
    for c in chunks:
        by_name.setdefault(c.name, []).append(c)
    assert len(by_name["big"]) == -(-big.nbytes // CHUNK_BYTES) >= 2
    assert all(c.ByteSize() <= wire.MAX_MESSAGE_BYTES for c in chunks)
    # Only the first chunk of each tensor carries dtype and shape; only the final one says last.
    for name, parts in by_name.items():
        assert [c.last for c in parts] == [False] * (len(parts) - 1) + [True], name
        assert parts[0].dtype and all(not c.dtype and not c.shape for c in parts[1:]), name
    assert len(by_name["empty"]) == 1 and by_name["empty"][0].data == b""

    out = decode(chunks)
    assert sorted(out) == sorted(arrays)
    for name, array in arrays.items():
        assert out[name].dtype == array.dtype, name
        assert out[name].shape == array.shape, name
        np.testing.assert_array_equal(out[name], array, err_msg=name)


def test_0d_array_round_trips_with_its_shape():
    out = decode(encode({"scalar": np.array(3.25), "count": np.array(7, dtype=np.int64)}))
    assert out["scalar"].shape == () and float(out["scalar"]) == 3.25
    assert out["count"].shape == () and int(out["count"]) == 7


def test_0d_array_values_survive_the_wire():
    # The value of a 0-d array arrives too.
    out = decode(encode({"scalar": np.array(3.25)}))
    assert out["scalar"].size == 1 and float(out["scalar"].reshape(())) == 3.25


def test_float16_option_halves_the_bytes_and_decodes_close():
    rng = np.random.default_rng(1)
    w = rng.uniform(-4, 4, size=(300, 200)).astype(np.float32)
    other = np.arange(10, dtype=np.float64)
    full = list(encode({"w": w, "other": other}))
    half = list(encode({"w": w, "other": other}, float16=True))

    def nbytes(chunks, name):
        return sum(len(c.data) for c in chunks if c.name == name)

    assert nbytes(full, "w") == w.nbytes
    assert nbytes(half, "w") == w.nbytes // 2
    assert nbytes(half, "other") == other.nbytes  # only float32 is narrowed
    assert half[0].dtype == "float16"

    out = decode(half)
    assert out["w"].dtype == np.float32  # widened again on arrival
    np.testing.assert_allclose(out["w"], w, rtol=1e-3, atol=1e-3)
    assert not np.array_equal(out["w"], w)  # it really travelled as float16
    np.testing.assert_array_equal(out["other"], other)


def test_genuine_float16_array_keeps_its_dtype():
    h = np.array([0.5, -1.25, 3.0], dtype=np.float16)
    assert decode(encode({"h": h}))["h"].dtype == np.float16


def test_decoder_accepts_chunks_of_several_tensors_interleaved():
    a = np.arange(6, dtype=np.int32)
    b = np.arange(4, dtype=np.float64)
    ab, bb = a.tobytes(), b.tobytes()
    d = Decoder()
    d.add(chunk("a", "int32", a.shape, 0, ab[:8], last=False))
    d.add(chunk("b", "float64", b.shape, 0, bb[:16], last=False))
    d.add(chunk("a", offset=8, data=ab[8:], last=True))
    d.add(chunk("b", offset=16, data=bb[16:], last=True))
    out = d.finish()
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], b)


# ---------------------------------------------------------------- malformed streams


def test_chunk_without_header_is_refused():
    with pytest.raises(WireError, match="without a header"):
        Decoder().add(chunk("w", offset=CHUNK_BYTES, data=b"\0" * 8))


def test_first_chunk_without_dtype_is_refused():
    with pytest.raises(WireError, match="dtype"):
        Decoder().add(chunk("w", dtype="", shape=(2,), data=b"\0" * 8))


def test_chunk_at_wrong_offset_is_refused():
    d = Decoder()
    d.add(chunk("w", "float32", (4,), 0, b"\0" * 8, last=False))
    with pytest.raises(WireError, match="offset 12, expected 8"):
        d.add(chunk("w", offset=12, data=b"\0" * 4))


def test_repeated_chunk_is_refused():
    d = Decoder()
    d.add(chunk("w", "float32", (4,), 0, b"\0" * 8, last=False))
    with pytest.raises(WireError):
        d.add(chunk("w", "float32", (4,), 0, b"\0" * 8, last=False))


def test_tensor_sent_twice_is_refused():
    d = Decoder()
    d.add(chunk("w", "float32", (1,), 0, b"\0" * 4))
    with pytest.raises(WireError, match="twice"):
        d.add(chunk("w", "float32", (1,), 0, b"\0" * 4))


def test_more_bytes_than_the_shape_needs_are_refused():
    with pytest.raises(WireError, match="more than the 16 bytes"):
        Decoder().add(chunk("w", "float32", (4,), 0, b"\0" * 20))
    d = Decoder()
    d.add(chunk("w", "float32", (4,), 0, b"\0" * 12, last=False))
    with pytest.raises(WireError, match="more than"):
        d.add(chunk("w", offset=12, data=b"\0" * 8))


def test_last_chunk_before_all_bytes_arrived_is_refused():
    with pytest.raises(WireError, match="12 bytes, expected 16"):
        Decoder().add(chunk("w", "float32", (4,), 0, b"\0" * 12, last=True))


def test_truncated_stream_is_refused():
    chunks = list(encode({"big": np.ones((600, 1000), np.float32)}))
    assert len(chunks) >= 3
    d = Decoder()
    for c in chunks[:-1]:
        d.add(c)
    with pytest.raises(WireError, match="ended inside"):
        d.finish()
    with pytest.raises(WireError):
        decode(chunks[:-1])


@pytest.mark.parametrize("dtype", ["object", "complex128", "bool", "U8", "float128", "garbage"])
def test_disallowed_dtype_is_refused(dtype):
    with pytest.raises(WireError, match="not allowed"):
        Decoder().add(chunk("w", dtype, (1,), 0, b"\0" * 8))


@pytest.mark.parametrize("shape", [(1 << 20, 1 << 20), (-1, 4), (4, -4), (1 << 31, 2), (1 << 40,)])
def test_absurd_shape_is_refused_at_the_header(shape):
    with pytest.raises(WireError, match="bad shape"):
        Decoder().add(chunk("w", "float32", shape, 0, b"", last=False))


@pytest.mark.parametrize("shape", [(1 << 32, 1 << 32), ((1 << 63) - 1, (1 << 63) - 1)])
def test_overflowing_shape_is_refused_at_the_header(shape):
    with pytest.raises(WireError, match="bad shape"):
        Decoder().add(chunk("w", "float32", shape, 0, b"", last=False))


# ------------------------------------------------------------------ packing


@pytest.mark.parametrize("sizes", [[], [5], [3, 3, 3, 3], [10, 1, 10], [4, 7, 2, 9, 1, 1, 1, 12, 0, 0]])
def test_packed_keeps_the_order_and_fills_each_group_up_to_the_limit(sizes):
    limit = 10
    items = list(enumerate(sizes))
    groups = list(wire.packed(items, size=lambda item: item[1], limit=limit))
    assert [item for group in groups for item in group] == items  # nothing lost, nothing reordered
    assert all(groups)
    for group, following in zip(groups, groups[1:]):
        total = sum(n for _, n in group)
        assert total <= limit or len(group) == 1  # only an item past the limit travels alone...
        assert total + following[0][1] > limit  # ...and a group closes only when the next would not fit


def test_packed_is_lazy():
    taken = []

    def items():
        for n in (6, 6, 6):
            taken.append(n)
            yield n

    groups = wire.packed(items(), size=int, limit=10)
    assert next(groups) == [6] and len(taken) == 2  # the second item closed the first group


def test_joined_serialized_chunks_are_one_message_with_all_of_them():
    # What the master does with its cached pieces: serialized messages joined are one message.
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.int32)}
    header = pb.TaskChunk(header=pb.TaskHeader(step=7)).SerializeToString()
    pieces = [header] + [pb.TaskChunk(tensors=[c]).SerializeToString() for c in encode(arrays)]
    (group,) = wire.packed(pieces, len)
    message = pb.TaskChunk.FromString(b"".join(group))
    assert message.header.step == 7
    out = decode(message.tensors)
    assert all(np.array_equal(out[k], arrays[k]) for k in arrays)
