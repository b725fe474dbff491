"""Issue 51, class 6 and the ``.npz`` half of 13: what a file's own headers claim (a Parquet
footer's row count, an ``.npz`` member's size and shape) is checked against what the file holds
before it steers an allocation or a read.

- A Parquet shard whose footer says more or fewer rows than its pages hold is an error naming the
  file and both counts, whichever way it is read (whole, streamed to local disk, its labels), and
  never trains on rows that are not there; a footer claiming a huge count on a tiny file makes no
  allocation of that size.
- A data ``.npz`` (``--data``, ``dbn shard``) is read through :func:`iterreduce.storage.npzfile.read_npz`:
  a member whose header claims terabytes, a zip bomb whose directory lies about its size, or
  members claiming more than the machine's available memory, are an error naming the file, the
  member and the claimed size, in little memory; a file that compresses far (one-hot) reads.

Each test keeps the crafted file (and an earlier run's model, where a job runs) byte-identical.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dbn.cli import main
from dbn.data.sharding import load_shards, load_source
from dbn.errors import DataError
from iterreduce.exceptions import ShardError
from shardio.readers import describe_shard, read_labels, read_shard, shard_info, spill_shard
from shardio.shards import write_shards
from test_bad_data import N_ROWS, N_SHARDS, assert_refused, make_job
from test_npz_limits import model_file, npy, npy_header, run_measured  # noqa: F401 - a fixture

ROWS, WIDTH = 1000, 5

# ------------------------------------------------------------------ a Parquet footer rewritten
#
# pyarrow writes a footer but offers no way to change its counts, so the tests rewrite it: a
# Parquet file ends with its FileMetaData (Thrift, compact protocol), the metadata's length (4 bytes,
# little-endian) and b"PAR1". FileMetaData's field 3 is the file's row count and field 4 its row
# groups, each a RowGroup whose field 3 is the group's row count; the counts are i64, written as
# zigzag varints. The helpers below walk the compact protocol's fields (skipping every value by
# its type, so no guess at byte patterns), replace those varints and write the new length: the
# pages before the footer are untouched, and pyarrow reads the result as an ordinary file.


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value, shift, pos = value | (byte & 0x7F) << shift, shift + 7, pos + 1
        if not byte & 0x80:
            return value, pos


def _encoded_i64(value: int) -> bytes:
    """A non-negative i64 as the compact protocol writes it: zigzag, then a varint."""
    value, out = value << 1, bytearray()
    while True:
        value, byte = value >> 7, value & 0x7F
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _skip(data: bytes, pos: int, kind: int) -> int:
    """Where the value of compact-protocol type ``kind`` at ``pos`` ends."""
    if kind in (1, 2):  # booleans live in the field header
        return pos
    if kind == 3:  # byte
        return pos + 1
    if kind in (4, 5, 6):  # i16, i32, i64
        return _varint(data, pos)[1]
    if kind == 7:  # double
        return pos + 8
    if kind == 8:  # binary
        size, pos = _varint(data, pos)
        return pos + size
    if kind in (9, 10):  # list, set
        size, element, pos = _list_header(data, pos)
        for _ in range(size):
            pos = pos + 1 if element in (1, 2) else _skip(data, pos, element)
        return pos
    if kind == 11:  # map
        size, pos = _varint(data, pos)
        types, pos = (data[pos], pos + 1) if size else (0, pos)
        for _ in range(size):
            pos = _skip(data, _skip(data, pos, types >> 4), types & 0x0F)
        return pos
    if kind == 12:  # struct
        return _struct_fields(data, pos)[1]
    raise ValueError(f"compact protocol type {kind} at byte {pos}")


def _list_header(data: bytes, pos: int) -> tuple[int, int, int]:
    """A list's size, its elements' type and where they start."""
    size, element, pos = data[pos] >> 4, data[pos] & 0x0F, pos + 1
    if size == 15:  # 15 or more: the size follows as a varint
        size, pos = _varint(data, pos)
    return size, element, pos


def _struct_fields(data: bytes, pos: int) -> tuple[dict[int, tuple[int, int, int]], int]:
    """``{field id: (type, value start, value end)}`` of the struct at ``pos``, and where it ends."""
    fields, last = {}, 0
    while data[pos]:  # 0: the end of the struct
        delta, kind, pos = data[pos] >> 4, data[pos] & 0x0F, pos + 1
        if delta:
            last += delta
        else:
            zigzag, pos = _varint(data, pos)
            last = (zigzag >> 1) ^ -(zigzag & 1)
        end = _skip(data, pos, kind)
        fields[last], pos = (kind, pos, end), end
    return fields, pos + 1


def footer_says(path: str, rows: int, *, row_groups: bool = False) -> bytes:
    """Rewrite the Parquet file at ``path`` so that its footer says ``rows`` rows: the file's count,
    and with ``row_groups`` each row group's too (a footer that agrees with itself). Returns the
    new bytes, for the test to check they stay so."""
    raw = Path(path).read_bytes()
    (length,) = struct.unpack("<I", raw[-8:-4])
    pages, meta = raw[:-8 - length], raw[-8 - length:-8]
    fields, end = _struct_fields(meta, 0)
    assert end == len(meta) and fields[3][0] == 6, "FileMetaData: field 3 is the i64 row count"
    spans = [fields[3][1:]]
    if row_groups:
        count, _, pos = _list_header(meta, fields[4][1])
        for _ in range(count):
            group, pos = _struct_fields(meta, pos)
            assert group[3][0] == 6, "RowGroup: field 3 is the i64 row count"
            spans.append(group[3][1:])
    for start, stop in sorted(spans, reverse=True):  # the last first: earlier spans keep their offsets
        meta = meta[:start] + _encoded_i64(rows) + meta[stop:]
    data = pages + meta + struct.pack("<I", len(meta)) + b"PAR1"
    Path(path).write_bytes(data)
    footer = pq.read_metadata(path)
    assert footer.num_rows == rows and (not row_groups or footer.row_group(0).num_rows == rows)
    return data


def shard(tmp_path) -> str:
    rng = np.random.default_rng(0)
    (uri,) = write_shards(rng.random((ROWS, WIDTH)).astype(np.float32), np.arange(ROWS) % 3,
                          str(tmp_path / "shards"), 1)
    assert pq.read_metadata(uri).num_row_groups == 1
    return uri


READERS = {
    "read whole": lambda uri, tmp: read_shard(uri, need_labels=True),
    "streamed to disk": lambda uri, tmp: spill_shard(uri, str(tmp), need_labels=True),
    "labels alone": lambda uri, tmp: read_labels(uri),
}
#: (rows the footer says, whether its row groups say so too). A footer that disagrees with itself
#: is refused from the footer; one that agrees, by counting the rows read. One whose row groups
#: say fewer rows than the pages hold cannot be caught by counting: pyarrow reads no more rows
#: than a group says (the pages' own counts would tell, which pyarrow does not show).
LIES = {"twice the rows": (2 * ROWS, False), "half the rows": (ROWS // 2, False),
        "twice, row groups too": (2 * ROWS, True)}


def miscounted(uri: str, claimed: int, held: int, row_groups: bool = True) -> str:
    """The start of the error for a footer saying ``claimed`` rows where the file holds ``held``
    (without ``row_groups``: where its row groups still say ``held``)."""
    where = "the file holds" if row_groups else "its row groups say"
    return f"{uri}: its footer says {claimed} rows, but {where} {held}"


@pytest.mark.parametrize("lie", LIES)
@pytest.mark.parametrize("reader", READERS)
def test_a_footer_that_miscounts_the_rows_is_an_error_naming_both_counts(tmp_path, reader, lie):
    uri = shard(tmp_path)
    claimed, row_groups = LIES[lie]
    data = footer_says(uri, claimed, row_groups=row_groups)
    with pytest.raises(ShardError) as error:
        READERS[reader](uri, tmp_path)
    assert str(error.value).startswith(miscounted(uri, claimed, ROWS, row_groups)), error.value
    assert Path(uri).read_bytes() == data
    assert list(tmp_path.glob("*.rows")) == []  # the spilled copy of a refused shard is gone


def test_a_footer_whose_row_groups_disagree_with_its_count_is_refused_from_the_footer(tmp_path):
    uri = shard(tmp_path)
    data = footer_says(uri, 2 * ROWS)
    message = miscounted(uri, 2 * ROWS, ROWS, row_groups=False)
    with pytest.raises(ShardError, match="^" + message.replace(".", r"\.")):
        describe_shard(uri)
    with pytest.raises(ShardError, match="^" + message.replace(".", r"\.")):
        shard_info([uri])  # the master's check, in the footer reader's process
    assert Path(uri).read_bytes() == data


def test_a_shard_with_a_lying_footer_stops_a_job_before_it_trains(tmp_path, capsys):
    """The issue's case: a footer saying twice the rows trained on rows of leftover memory."""
    job, out, bad = make_job(tmp_path, None, workers=0)
    held = N_ROWS // N_SHARDS
    data = footer_says(bad, 2 * held)
    assert_refused(capsys, main(["train", str(job), "--overwrite"]), out, bad,
                   miscounted(bad, 2 * held, held, row_groups=False))
    assert Path(bad).read_bytes() == data


def test_a_footer_that_agrees_with_itself_but_not_the_pages_stops_a_job_before_it_trains(tmp_path, capsys):
    job, out, bad = make_job(tmp_path, None, workers=0)
    held = N_ROWS // N_SHARDS
    data = footer_says(bad, 2 * held, row_groups=True)
    assert_refused(capsys, main(["train", str(job), "--overwrite"]), out, bad, miscounted(bad, 2 * held, held))
    assert Path(bad).read_bytes() == data


#: A child that reads each crafted shard every way and reports, as JSON lines, the error and the
#: most memory it allocated: NumPy's (tracemalloc sees it, pages touched or not) and pyarrow's
#: (its pool's). Its address space is capped, so that the reader of old could not take the
#: machine's memory (it was refused an allocation instead).
MEASURE = """
import json, resource, sys, tracemalloc
import pyarrow as pa
from shardio import readers
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
cap = int(sys.argv[1]) if hard == resource.RLIM_INFINITY else min(int(sys.argv[1]), hard)
resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
tracemalloc.start()
for uri in sys.argv[3:]:
    for reader in ("read_shard", "spill_shard", "read_labels"):
        tracemalloc.reset_peak()
        args = {"read_shard": (uri,), "spill_shard": (uri, sys.argv[2]), "read_labels": (uri,)}[reader]
        try:
            getattr(readers, reader)(*args)
            error = None
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"uri": uri, "reader": reader, "error": error, "numpy": tracemalloc.get_traced_memory()[1],
                          "arrow": pa.default_memory_pool().max_memory()}), flush=True)
"""


def address_space_cap() -> int:
    """A child's address space: this process's own plus 3 GiB (room to run, not to fill the machine)."""
    with open("/proc/self/status") as status:
        size_kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    return size_kib * 1024 + (3 << 30)


def test_a_huge_row_count_on_a_tiny_file_allocates_no_more_than_the_file_holds(tmp_path):
    """Footers claiming 10^8 rows (NumPy of old allocated 2.8 GB for them, pyarrow 1.4 GB) and
    10^12 (a MemoryError, or the machine's memory), with their row groups or without."""
    claims, kept = {}, {}
    for claimed in (10**8, 10**12):
        for row_groups in (False, True):
            uri = shard(tmp_path / f"{claimed}-{row_groups}")
            kept[uri], claims[uri] = footer_says(uri, claimed, row_groups=row_groups), claimed
    bound = 64 * max(map(len, kept.values())) + (16 << 20)  # what a file of its size could hold, read buffers
    child = subprocess.run([sys.executable, "-c", MEASURE, str(address_space_cap()), str(tmp_path), *kept],
                           capture_output=True, text=True, timeout=120)
    results = [json.loads(line) for line in child.stdout.splitlines()]
    assert len(results) == 3 * len(kept), child.stderr
    for result in results:
        uri, where = result["uri"], f"{result['reader']} of {result['uri']}"
        assert (result["error"] or "").startswith(f"ShardError: {uri}: its footer says {claims[uri]} rows, but "), \
            (where, result)
        assert result["numpy"] < bound and result["arrow"] < bound, (where, result, bound)
    for uri, data in kept.items():
        assert Path(uri).read_bytes() == data
    assert list(tmp_path.glob("*.rows")) == []


def test_honest_shards_still_read_every_way(tmp_path):
    uri = shard(tmp_path)
    part = read_shard(uri, need_labels=True)
    X, y = part.features, part.labels
    assert X.shape == (ROWS, WIDTH) and X.flags.c_contiguous and X.flags.owndata
    spilled = spill_shard(uri, str(tmp_path), need_labels=True)
    np.testing.assert_array_equal(spilled.features[0:ROWS], X)
    np.testing.assert_array_equal(spilled.labels, y)
    np.testing.assert_array_equal(read_labels(uri), y)
    spilled.features.close()


def test_a_shard_far_more_compressible_than_believed_reads_whole(tmp_path):
    """A footer is believed only for the rows a file of its size plausibly holds; a real file of
    many identical rows, holding more, still reads (its array grows as the rows come)."""
    X = np.zeros((200_000, 40), np.float32)
    (uri,) = write_shards(X, np.zeros(len(X), np.int64), str(tmp_path / "zeros"), 1)
    assert 64 * Path(uri).stat().st_size < X.nbytes  # more than the preallocation believes
    part = read_shard(uri, need_labels=True)
    assert part.features.shape == X.shape and not part.features.any() and part.labels.shape == (len(X),)


# ------------------------------------------------------------------ data .npz files


def stored_zip(path: Path, members: dict[str, bytes]) -> bytes:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for name, content in members.items():
            z.writestr(name, content)
    return path.read_bytes()


#: (shape a member's header claims, its bytes): NumPy of old allocated the claim before reading
CLAIMS = {"a terabyte": (10**6, 10**6), "a GiB": (1 << 28,)}


@pytest.mark.parametrize("claim", CLAIMS)
def test_a_data_npz_whose_header_claims_a_huge_array_is_an_error_in_little_memory(tmp_path, claim):
    shape = CLAIMS[claim]
    path = tmp_path / "claims.npz"
    data = stored_zip(path, {"X.npy": npy_header(shape) + bytes(64), "y.npy": npy(np.zeros(4, np.int64))})
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as error:
            load_source(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    claimed = int(np.prod(shape)) * 4
    message = str(error.value)
    assert message.startswith(f"{path}: ") and "'X'" in message and f"({claimed} bytes)" in message, message
    assert peak < 16 << 20, f"peak {peak} bytes"
    assert path.read_bytes() == data


def test_dbn_shard_refuses_a_zip_bomb_in_little_memory(tmp_path):
    """A bomb behind a small claim: 256 MiB of deflated zeros whose zip directory claims 64 KiB."""
    path = tmp_path / "bomb.npz"
    data = lying_npz(path, (1024, 16), 1 << 28, len(npy_header((1024, 16))) + (1 << 16))
    assert len(data) < 1 << 20
    out = tmp_path / "shards"
    rc, stderr, peak = run_measured("import os, sys; from dbn.cli import main; sys.stdout = open(os.devnull, 'w'); "
                                    "sys.exit(main(sys.argv[1:]))",
                                    "shard", str(path), str(out), "--shards", "2")
    assert rc == 2, stderr
    assert stderr.startswith(f"dbn: error: {path}: ") and "Traceback" not in stderr, stderr
    assert "array 'X' holds more than the 65536 bytes its member declares" in stderr, stderr
    print(f"peak RSS {peak >> 20} MiB")
    assert peak < 300 << 20, f"peak RSS {peak >> 20} MiB"
    assert path.read_bytes() == data and not out.exists()


def test_dbn_evaluate_refuses_crafted_data_files(tmp_path, capsys, model_file):
    model = model_file.read_bytes()
    for name, members in (("claims.npz", {"X.npy": npy_header((10**6, 10**6)) + bytes(64)}),
                          ("pickled.npz", {"X.npy": npy(np.zeros((4, 5), np.float32)),
                                           "y.npy": npy(np.array([1, "a", None, 2], dtype=object))})):
        path = tmp_path / name
        data = stored_zip(path, members)
        assert main(["evaluate", str(model_file), "--data", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"dbn: error: {path}: ") and "Traceback" not in err, err
        assert ("'X'" if name == "claims.npz" else "array 'y' is of type object") in err, err
        assert path.read_bytes() == data
    assert model_file.read_bytes() == model


def test_honest_data_npz_files_load_as_saved(tmp_path):
    X = np.asfortranarray(np.arange(60, dtype=np.uint8).reshape(12, 5))
    for y in (np.arange(12) % 3, np.array(["cat", "dog", "emu"] * 4)):  # class indices, string labels
        for save in (np.savez, np.savez_compressed):
            save(tmp_path / "d.npz", X=X, y=y, notes=np.ones(3))
            got, labels = load_source(str(tmp_path / "d.npz"))
            np.testing.assert_array_equal(got, X)
            assert got.dtype == np.uint8
            np.testing.assert_array_equal(labels, y)
    np.savez(tmp_path / "other.npz", X=X, target=np.arange(12) % 2)
    with pytest.raises(DataError, match=r"no array 'label' \(\[data\] label; arrays: \['X', 'target'\]\)"):
        load_source(str(tmp_path / "other.npz"), label="label")
    np.testing.assert_array_equal(load_source(str(tmp_path / "other.npz"), label="target")[1], np.arange(12) % 2)


# ------------------------------------------------------------------ data .npz files that compress far
#
# A data file is the user's: one-hot or sparse features, binarised images compress a thousand-fold,
# so a data .npz is bounded by the memory the machine can give, not by a ratio to its size (model
# files keep the ratio: tests/test_npz_limits.py). What its zip directory claims is then the bound:
# a member inflates a chunk at a time into an array of the claimed size, and a stream that yields
# more or fewer bytes than claimed is refused.


def one_hot(rows: int = 8000, width: int = 800) -> tuple[np.ndarray, np.ndarray]:
    """Features of one 1.0 a row: 25 MiB of float32 that np.savez_compressed keeps in about 50 KB."""
    rng = np.random.default_rng(0)
    X = np.zeros((rows, width), np.float32)
    X[np.arange(rows), rng.integers(0, width, rows)] = 1.0
    return X, rng.integers(0, 2, rows)


def test_a_data_npz_that_compresses_far_reads_and_shards(tmp_path):
    X, y = one_hot()
    path = tmp_path / "onehot.npz"
    np.savez_compressed(path, X=X, y=y)
    assert X.nbytes > 400 * path.stat().st_size  # far beyond the 32 times a model file may inflate
    data = path.read_bytes()
    got, labels = load_source(str(path))
    np.testing.assert_array_equal(got, X)
    np.testing.assert_array_equal(labels, y)
    out = tmp_path / "shards"
    assert main(["shard", str(path), str(out), "--shards", "2"]) == 0
    sharded, sharded_labels, _ = load_shards(str(out))
    assert sharded.shape == X.shape and sharded.sum() == len(X) and len(sharded_labels) == len(y)
    assert path.read_bytes() == data


def lying_npz(path: Path, x_shape, zeros: int, declare: int) -> bytes:
    """A data .npz whose X member is deflated: the .npy header of ``x_shape`` (float32), then
    ``zeros`` zero bytes, written a MiB at a time; its zip directory claims ``declare`` bytes for
    X (with the CRC of that many, so that only the size lies)."""
    header = npy_header(x_shape)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        info = zipfile.ZipInfo("X.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w", force_zip64=True) as out:
            out.write(header)
            for start in range(0, zeros, 1 << 20):
                out.write(bytes(min(1 << 20, zeros - start)))
        info.file_size = declare  # the central directory is written from info when the zip closes
        if declare < len(header) + zeros:
            info.CRC = zlib.crc32(bytes(declare - len(header)), zlib.crc32(header))
        z.writestr("y.npy", npy(np.zeros(min(x_shape[0], 1 << 16), np.int64)))  # a label a row
    return path.read_bytes()


def refused_in_little_memory(path: Path) -> str:
    """The message of the DataError that reading the data file at ``path`` raises, checking that
    it allocated less than 16 MiB on the way."""
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as error:
            load_source(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak} bytes"
    return str(error.value)


#: a zip directory that understates the member (a bomb behind a small claim), or overstates it
DIRECTORY_LIES = {"understates": (64 << 20, 1 << 16), "overstates": (1 << 16, 8 << 20)}


@pytest.mark.parametrize("lie", DIRECTORY_LIES)
def test_a_data_npz_whose_zip_directory_lies_about_a_size_is_refused_in_little_memory(tmp_path, lie):
    zeros, claimed = DIRECTORY_LIES[lie]
    header = npy_header((claimed // 4 // 16, 16))
    path = tmp_path / "lies.npz"
    data = lying_npz(path, (claimed // 4 // 16, 16), zeros, len(header) + claimed)
    message = refused_in_little_memory(path)
    assert message.startswith(f"{path}: ") and "array 'X'" in message, message
    assert ("holds more than" if lie == "understates" else "truncated") in message, message
    assert f"{claimed} bytes" in message, message
    assert path.read_bytes() == data


def test_a_data_npz_claiming_more_than_the_machine_can_give_is_an_error_in_little_memory(tmp_path):
    path = tmp_path / "claims.npz"
    data = lying_npz(path, (1 << 48,), 1 << 16, 1 << 50)  # a petabyte, by the zip's directory and the header
    message = refused_in_little_memory(path)
    assert message.startswith(f"{path}: ") and "member 'X.npy' claims 1125899906842624" in message, message
    assert "available" in message, message
    assert path.read_bytes() == data


def test_an_honest_data_npz_larger_than_the_memory_left_is_an_error_before_reading(tmp_path, monkeypatch):
    import iterreduce.process.memory

    X, y = one_hot()
    path = tmp_path / "onehot.npz"
    np.savez_compressed(path, X=X, y=y)
    monkeypatch.setattr(iterreduce.process.memory, "available_memory", lambda: 16 << 20)  # a busy machine
    message = refused_in_little_memory(path)
    assert message.startswith(f"{path}: ") and f"member 'X.npy' claims {X.nbytes + 128}" in message, message
    assert f"the {16 << 20} bytes" in message and "available" in message, message
