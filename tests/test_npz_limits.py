"""Model files and checkpoints are read with limits (``iterreduce.storage.npzfile``): a small file never
makes the process allocate much more than it holds, whatever its zip and ``.npy`` headers claim.

The bar: a model file under 10 MB that would inflate to 1 GiB is refused by ``dbn evaluate``
with ``dbn: error:`` and exit 2, the process's peak memory under 400 MB; a checkpoint as well.
Legitimate files, stored (what the project writes) or deflated (``np.savez_compressed``), load.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from dbn import DBN
from dbn.errors import ModelFileError
from dbn.model import persist
from iterreduce.exceptions import CheckpointError
from iterreduce.master import checkpoint
from iterreduce.storage import npzfile

GIB = 1 << 30
PEAK_LIMIT_BYTES = 400 << 20
#: the largest a model or checkpoint of the bar may be on disk
SMALL_FILE_BYTES = 10 << 20


def npy_header(shape, descr="<f4", fortran=False) -> bytes:
    """The .npy format 1.0 header of an array of ``shape`` and ``descr`` (data not included)."""
    text = "{'descr': %r, 'fortran_order': %s, 'shape': %r, }" % (descr, fortran, tuple(shape))
    text = text.ljust(64 * -(-(len(text) + 11) // 64) - 11) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin-1")


def add_zero_member(z: zipfile.ZipFile, name: str, shape, dtype="<f4") -> None:
    """A deflated .npy member of zeros of ``shape``, written a MiB at a time (never held whole)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with z.open(info, "w", force_zip64=True) as out:
        out.write(npy_header(shape, dtype))
        zeros = bytes(1 << 20)
        for start in range(0, nbytes, len(zeros)):
            out.write(zeros[:min(len(zeros), nbytes - start)])


def bomb(path: Path, members: dict[str, np.ndarray], big: str, shape=(1 << 14, 1 << 14)) -> Path:
    """``members`` stored as they are, and ``big``, a float32 array of ``shape`` (1 GiB of zeros),
    deflated: a file of about a megabyte."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, array in members.items():
            out = io.BytesIO()
            np.lib.format.write_array(out, np.asarray(array), allow_pickle=False)
            z.writestr(zipfile.ZipInfo(f"{name}.npy"), out.getvalue(), compress_type=zipfile.ZIP_STORED)
        add_zero_member(z, f"{big}.npy", shape)
    assert path.stat().st_size < SMALL_FILE_BYTES
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    X, y = rng.random((48, 5)).astype(np.float32), np.arange(48) % 3
    path = tmp_path_factory.mktemp("model") / "model.npz"
    DBN([4], pretrain_epochs=1, finetune_epochs=1, top_layer_epochs=0, pretrain_batch_size=1,
        finetune_batch_size=1, device="cpu", seed=1).fit(X, y).save(path)
    return path


def members_of(path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def run_measured(code: str, *args: str) -> tuple[int, str, int]:
    """Run ``code`` (a Python program, ``args`` in its sys.argv) in a child of a fresh Python that
    measures it alone; returns the child's exit status, its stderr and its peak RSS in bytes."""
    measure = ("import resource, subprocess, sys\n"
               "p = subprocess.run(sys.argv[1:], stderr=subprocess.PIPE, text=True)\n"
               "sys.stdout.write(f'{p.returncode}\\n{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n')\n"
               "sys.stdout.write(p.stderr)\n")
    out = subprocess.run([sys.executable, "-c", measure, sys.executable, "-c", code, *args],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rc, peak_kib, stderr = out.split("\n", 2)
    return int(rc), stderr, int(peak_kib) * 1024


# ------------------------------------------------------------------ the bar


def test_dbn_evaluate_refuses_a_small_model_file_that_inflates_to_a_gib_in_little_memory(model_file, tmp_path):
    arrays = members_of(model_file)
    weights = next(name for name in arrays if name != "__header__" and arrays[name].ndim == 2)
    path = bomb(tmp_path / "bomb.npz", {n: a for n, a in arrays.items() if n != weights}, weights)
    data = tmp_path / "test.npz"
    np.savez(data, X=np.zeros((4, 5), np.float32), y=np.zeros(4, np.int64))
    rc, stderr, peak = run_measured("import sys; from dbn.cli import main; sys.exit(main(sys.argv[1:]))",
                                    "evaluate", str(path), "--data", str(data))
    assert rc == 2, stderr
    assert stderr.startswith("dbn: error: ") and str(path) in stderr and "inflate" in stderr, stderr
    print(f"peak RSS {peak >> 20} MiB")
    assert peak < PEAK_LIMIT_BYTES, f"peak RSS {peak >> 20} MiB"


def test_a_checkpoint_that_inflates_to_a_gib_is_refused_in_little_memory(tmp_path):
    checkpoint.save(str(tmp_path), 3, {"fingerprint": "f"}, {"w": np.ones((4, 4), np.float32)})
    good = tmp_path / "ckpt-000000003.npz"
    header = members_of(good)["__checkpoint__"]
    path = bomb(tmp_path / "ckpt-000000004.npz", {"__checkpoint__": header}, "w")
    code = ("import sys\nfrom iterreduce.master import checkpoint\nfrom iterreduce.exceptions import CheckpointError\n"
            "try:\n    checkpoint.load(sys.argv[2])\nexcept CheckpointError as exc:\n"
            "    sys.stderr.write(str(exc) + '\\n')\n"
            "    assert checkpoint.latest(sys.argv[1], 'f').endswith('ckpt-000000003.npz')  # the bomb passed over\n"
            "    sys.exit(2)\n")
    rc, stderr, peak = run_measured(code, str(tmp_path), str(path))
    assert rc == 2, stderr
    error = stderr.splitlines()[0]  # then the warning of latest(), which passed the file over
    assert error.startswith(f"{path}: unreadable checkpoint: ") and "inflate" in error, stderr
    print(f"peak RSS {peak >> 20} MiB")
    assert peak < PEAK_LIMIT_BYTES, f"peak RSS {peak >> 20} MiB"


# ------------------------------------------------------------------ legitimate files load


def test_a_model_saved_compressed_loads_as_saved(model_file, tmp_path):
    """``np.savez_compressed`` of a model's arrays (as a user may have re-saved one) loads."""
    arrays = members_of(model_file)
    path = tmp_path / "compressed.npz"
    np.savez_compressed(path, **arrays)
    header, loaded = persist.load_arrays(path)
    expected, _ = persist.load_arrays(model_file)
    assert header == expected
    assert set(loaded) == set(arrays) - {"__header__"}
    for name, array in loaded.items():
        np.testing.assert_array_equal(array, arrays[name])
        assert array.flags.c_contiguous and array.flags.writeable


def test_arrays_of_every_plain_type_and_order_round_trip(tmp_path):
    arrays = {"f": np.arange(12, dtype=np.float32).reshape(3, 4), "F": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
              "i": np.array([-1, 2], np.int64), "u": np.arange(3, dtype=np.uint8), "b": np.array([True, False]),
              "scalar": np.float64(2.5), "empty": np.zeros((0, 3), np.float32), "big_endian": np.arange(3, dtype=">i4")}
    for save in (np.savez, np.savez_compressed):
        save(tmp_path / "a.npz", **arrays)
        with open(tmp_path / "a.npz", "rb") as f:
            loaded = npzfile.read_npz(f, (tmp_path / "a.npz").stat().st_size)
        assert set(loaded) == set(arrays)
        for name, array in arrays.items():
            np.testing.assert_array_equal(loaded[name], array)
            assert loaded[name].dtype == np.asarray(array).dtype and loaded[name].flags.c_contiguous


def test_a_checkpoint_round_trips(tmp_path):
    uri = checkpoint.save(str(tmp_path), 1, {"fingerprint": "x", "seed": 3}, {"w": np.eye(3), "b": np.arange(3)})
    header, arrays = checkpoint.load(uri)
    assert header == {"fingerprint": "x", "seed": 3, "step": 1}
    np.testing.assert_array_equal(arrays["w"], np.eye(3))
    np.testing.assert_array_equal(arrays["b"], np.arange(3))


# ------------------------------------------------------------------ crafted zips are refused


def read(data: bytes, only=None) -> dict:
    return npzfile.read_npz(io.BytesIO(data), len(data), only)


def zip_of(members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compression) as z:
        for name, content in members.items():
            z.writestr(name, content)
    return out.getvalue()


def npy(array) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, np.asanyarray(array), allow_pickle=True)
    return out.getvalue()


def test_deflated_members_beyond_the_inflation_limit_are_refused_before_reading():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        add_zero_member(z, "w.npy", (1 << 13, 1 << 10))  # 32 MiB of zeros: far more than 32 x the file + 16 MiB
    data = out.getvalue()
    assert len(data) < 100_000
    with pytest.raises(npzfile.NpzError, match=r"would inflate to 33554560 bytes from a file of \d+"):
        read(data)


def test_other_compressions_and_encrypted_members_are_refused():
    for method in (zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA):
        with pytest.raises(npzfile.NpzError, match=f"member 'a.npy' is compressed with zip method {method}"):
            read(zip_of({"a.npy": npy(np.zeros(3))}, method))
    data = bytearray(zip_of({"a.npy": npy(np.zeros(3))}))
    directory = data.rindex(b"PK\x01\x02")
    data[directory + 8] |= 1  # the central directory's flag bits: encrypted
    with pytest.raises(npzfile.NpzError, match="member 'a.npy' is encrypted"):
        read(bytes(data))


def patched_directory(data: bytes, **fields) -> bytes:
    """``data`` (a zip of one member) with its central directory entry's fields replaced:
    compress_size, file_size (uint32) or header_offset."""
    data = bytearray(data)
    at = data.rindex(b"PK\x01\x02")
    offsets = {"compress_size": 20, "file_size": 24, "header_offset": 42}
    for name, value in fields.items():
        data[at + offsets[name]:at + offsets[name] + 4] = struct.pack("<I", value)
    return bytes(data)


def test_sizes_the_file_cannot_hold_are_refused():
    data = zip_of({"a.npy": npy(np.arange(1000.0))})
    held = len(npy(np.arange(1000.0)))
    with pytest.raises(npzfile.NpzError, match=r"member 'a.npy' claims 4000000000 bytes at offset 0, beyond"):
        read(patched_directory(data, compress_size=4_000_000_000))
    with pytest.raises(npzfile.NpzError, match=rf"member 'a.npy' is stored, yet claims {held + 8} bytes in {held}"):
        read(patched_directory(data, file_size=held + 8))


def test_members_that_overlap_are_refused():
    """A zip whose directory names the same bytes many times (a stored 'overlap bomb')."""
    array = npy(np.arange(100_000.0))
    data = bytearray(zip_of({"a.npy": array}))
    directory = data.rindex(b"PK\x01\x02")
    end = data.rindex(b"PK\x05\x06")
    entry = bytes(data[directory:end])
    copies = [entry.replace(b"a.npy", f"{chr(97 + i)}.npy".encode()) for i in range(5)]
    record = bytearray(data[end:])
    record[8:10] = record[10:12] = struct.pack("<H", len(copies))
    record[12:16] = struct.pack("<I", len(entry) * len(copies))
    crafted = bytes(data[:directory]) + b"".join(copies) + bytes(record)
    with pytest.raises(npzfile.NpzError, match=r"members claim \d+ bytes in all, more than the file's"):
        read(crafted)


def test_too_many_members_are_refused_before_they_are_parsed(monkeypatch):
    monkeypatch.setattr(npzfile, "MAX_MEMBERS", 3)
    with pytest.raises(npzfile.NpzError, match="the zip announces 4 members, at most 3 are read"):
        read(zip_of({f"{i}.npy": npy(np.zeros(1)) for i in range(4)}))


def test_npy_headers_that_lie_or_hold_objects_are_refused():
    content = npy(np.zeros(10, np.float32))
    with pytest.raises(npzfile.NpzError, match=r"array 'a' claims shape \(1000000, 1000000\) of float32"):
        read(zip_of({"a.npy": npy_header((10**6, 10**6)) + content[128:]}))
    with pytest.raises(npzfile.NpzError, match=r"array 'a' is of type object, not plain numbers"):
        read(zip_of({"a.npy": npy(np.array([{"x": 1}], dtype=object))}))
    with pytest.raises(npzfile.NpzError, match=r"array 'a' is of type <U3"):
        read(zip_of({"a.npy": npy(np.array(["abc"]))}))
    with pytest.raises(npzfile.NpzError, match=r"member 'x.txt' is not an .npy array"):
        read(zip_of({"x.txt": b"hello"}))


def test_a_member_that_inflates_to_more_than_it_declares_is_refused():
    """zipfile stops at the declared size; the CRC of the bytes read then does not match."""
    content = npy(np.arange(8, dtype=np.float32))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.npy", content + bytes(64))  # the stream holds 64 bytes more than the header's shape
    data = bytes(out.getvalue())
    info = zipfile.ZipFile(io.BytesIO(data)).getinfo("a.npy")
    crafted = patched_directory(data, file_size=len(content))
    local = data.index(b"PK\x03\x04")
    crafted = crafted[:local + 22] + struct.pack("<I", len(content)) + crafted[local + 26:]
    assert info.file_size == len(content) + 64
    with pytest.raises(npzfile.NpzError, match="not a readable .npz.*(CRC|Bad)"):
        read(crafted)


def test_only_reads_the_named_arrays_but_checks_every_member():
    data = zip_of({"a.npy": npy(np.ones(2)), "b.npy": npy(np.zeros(3))})
    assert list(read(data, only={"a"})) == ["a"]
    with pytest.raises(npzfile.NpzError, match="member 'c' is not an .npy array"):
        read(zip_of({"a.npy": npy(np.ones(2)), "c": b""}), only={"a"})


def test_model_and_checkpoint_errors_name_the_file(tmp_path):
    path = tmp_path / "model.npz"
    path.write_bytes(zip_of({"__header__.npy": npy(np.frombuffer(b"{}", np.uint8))}, zipfile.ZIP_LZMA))
    with pytest.raises(ModelFileError, match=rf"^{path}: member '__header__.npy' is compressed with zip method 14"):
        persist.load_arrays(path)
    ckpt = tmp_path / "ckpt-000000001.npz"
    ckpt.write_bytes(zip_of({"__checkpoint__.npy": npy(np.frombuffer(json.dumps([1]).encode(), np.uint8))}))
    with pytest.raises(CheckpointError, match=rf"^{ckpt}: unreadable checkpoint: header is a JSON list"):
        checkpoint.load(str(ckpt))
    ckpt.write_bytes(zlib.compress(b"not a zip"))
    with pytest.raises(CheckpointError, match=rf"^{ckpt}: unreadable checkpoint: not a readable .npz"):
        checkpoint.load(str(ckpt))
