"""Fuzz tests (hypothesis) of model files, the bounded .npz reader and the checkpoint loader.

- the model file loader (``dbn.DBN.load`` / ``dbn.model.persist``): the files of two tiny
  fitted models, with arrays removed, renamed, reshaped, retyped or made non-finite, headers
  rewritten, other zip members, or the bytes mutated; and a sweep of each hyperparameter of
  the header, good values and bad;
- the bounded .npz reader (``iterreduce.storage.npzfile.read_npz``) and the checkpoint loader
  (``iterreduce.master.checkpoint.load`` and ``latest``): crafted .npz files, with .npy
  headers that lie, zip directory fields rewritten, members that overlap, the bytes mutated,
  or a zip bomb.

Any file gives either a well-formed result (a model that works, the same parameters as saved
when only its bytes were mutated; arrays and checkpoints within the reader's limits, its peak
memory too) or the project's own error (``ModelFileError``, a ``DBNError``; ``NpzError``;
``CheckpointError``) whose message names the file, never another exception and never a hang.
Rare finds are kept as explicit examples. The harness and the profiles
(``HYPOTHESIS_PROFILE``): ``tests/fuzzing.py``.
"""

from __future__ import annotations

import ast
import io
import json
import math
import struct
import warnings
import zipfile

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dbn import DBN
from dbn.errors import DBNError
from dbn.model import persist
from fuzzing import Sample, check_error_names, fuzz, mutated, outcome, within

# ================================================================= model files

class Files(dict):
    """Names to bytes, shown by their names and sizes."""

    def __repr__(self):
        return "{" + ", ".join(f"{name!r}: <{len(data)} bytes>" for name, data in self.items()) + "}"


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """The bytes of two tiny models' files: fitted (2 hidden layers, 3 classes) and pre-trained only."""
    rng = np.random.default_rng(0)
    X = rng.random((12, 5)).astype(np.float32)
    y = np.arange(12) % 3
    tiny = dict(pretrain_epochs=1, finetune_epochs=1, top_layer_epochs=0, pretrain_batch_size=4,
                finetune_batch_size=4, device="cpu", seed=1)
    folder = tmp_path_factory.mktemp("fuzz-models")
    files = Files()
    for kind, model in (("fitted", DBN([4, 3], **tiny).fit(X, y)), ("pretrained", DBN([3], **tiny).pretrain(X))):
        path = folder / f"{kind}.npz"
        model.save(path)
        files[kind] = path.read_bytes()
    return files


def npz_members(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def json_containers(inner):
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 2**64) | st.floats() | st.text(max_size=4),
                    json_containers, max_leaves=6)
#: values of the hyperparameters in a model file's header, good and bad
PARAM_VALUES = {
    "hidden_layers": [[4, 3], [3], [4], [3, 4], [4, 3, 2], [], [0], [-1], [4.0, 3.0], "4", [10**12], None,
                      [4, 3, 3], True, [True, 3]],
    "visible": ["bernoulli", "gaussian", "binary", 1, None],
    "pretrain_learning_rate": [0.1, [0.1, 0.1], [0.1], "x", None, [], math.nan],
    "dropout": [0.0, 0.5, 1.0, -1.0, "0", None, math.nan],
    "input_dropout": [2.0, None],
    "validation_fraction": [-0.5, "x"],
    "cd_k": [1, 0, -1, 2.5, "1", None],
    "seed": [0, -1, 2**70, "0", None, 1.5, True, [1]],
    "pretrain_batch_size": [4, 0, -1, None],
    "finetune_batch_size": [0, -1, None, "4"],
    "early_stopping_patience": [None, 0, "3", -1],
    "n_classes": [None, 3, 2, 10, 1, 0, -1, "3", 2.5],
    "momentum": [None, "x"],
    "persistent": ["yes", None],
    "finetune_epochs": [-1, None],
    "device": ["gpu", "cpu", "tpu"],
    "callback": [None, "print"],
    "nonsense": [None, 1, "x", {"a": [1]}],
}
HEADER_VALUES = {
    "format": st.sampled_from([persist.FORMAT, "dbn-yarn-model ", "npz", None, 1]),
    "version": st.sampled_from([1, 2, 3, 0, -1, "2", None, 2.5, True, 2**70, [2]]),
    "has_network": st.sampled_from([True, False, None, "yes", 1, 0]),
    "n_features_in": st.sampled_from([5, 4, 0, -1, "5", None]),
    "n_classes": st.sampled_from([3, 2, 0, None, "3"]),
    "params": st.sampled_from([None, [], "params", {}, 5]),
    "n_rbms": st.sampled_from([1, 2, 7]),
}
DTYPE_CHANGES = ["float64", "float16", ">f4", "int64", "uint8", "bool", "complex64", "U3", "S2", "V4", "object",
                 "datetime64[s]"]


@st.composite
def edited_model_files(draw, files) -> Sample:
    """The bytes of a model file: a valid one with its arrays and header edited, or its
    members replaced, or its bytes mutated."""
    kind = draw(st.sampled_from(sorted(files)))
    data = files[kind]
    mode = draw(st.sampled_from(["arrays", "arrays", "arrays", "members", "bytes", "bytes", "junk"]))
    if mode == "bytes":  # zip checks each member's CRC: what loads is what was saved
        changed, how = draw(mutated(data))
        return Sample(changed, f"the {kind} model's file, {how}", expected=npz_members(data))
    if mode == "junk":
        data = draw(st.sampled_from([b"", b"PK\x03\x04", b"PK\x05\x06" + bytes(18), b"\x93NUMPY"])
                    | st.binary(max_size=64))
        return Sample(data, f"the bytes {data!r}")
    arrays = npz_members(data)
    header = json.loads(arrays.pop("__header__").tobytes())
    names = sorted(arrays)
    if mode == "members":
        data, how = draw(zip_of_members(arrays, header))
        return Sample(data, f"the {kind} model's members, {how}")
    done = []
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(["remove", "rename", "reshape", "dtype", "values", "add", "header", "param",
                                     "header_array"]))
        name = draw(st.sampled_from(sorted(arrays) or names))
        done.append(f"{edit} {name}")
        if edit == "remove":
            arrays.pop(name, None)
        elif edit == "rename" and name in arrays:
            new = draw(st.sampled_from(names + ["network.weights.0", "network.biases.1", "rbm.1.weights_inc",
                                                "rbm.7.weights", "net.9.biases", "__header__"]) | st.text(max_size=6))
            arrays[new] = arrays.pop(name)
            done[-1] += f" to {new!r}"
        elif edit == "reshape" and name in arrays:
            a = np.atleast_1d(arrays[name])
            how = draw(st.sampled_from(["T", "ravel", "newaxis", "drop_row", "drop_col", "scalar", "empty", "grow"]))
            arrays[name] = {"T": lambda: a.T, "ravel": lambda: a.ravel(), "newaxis": lambda: a[None],
                            "drop_row": lambda: a[:-1], "drop_col": lambda: a[..., :-1],
                            "scalar": lambda: np.float32(1.0), "empty": lambda: a[:0],
                            "grow": lambda: np.concatenate([a, a])}[how]()
            done[-1] += f": {how} to {np.shape(arrays[name])}"
        elif edit == "dtype" and name in arrays:
            dtype = draw(st.sampled_from(DTYPE_CHANGES))
            done[-1] += f" to {dtype}"
            a = np.asarray(arrays[name])
            with warnings.catch_warnings(), np.errstate(all="ignore"):  # NaN to int, complex to real, ...
                warnings.simplefilter("ignore")
                if dtype == "object":
                    arrays[name] = np.array(a.tolist() if a.ndim else [a.item()], dtype=object)
                elif dtype in ("V4", "datetime64[s]"):
                    arrays[name] = np.zeros(a.shape, dtype)
                else:
                    try:
                        arrays[name] = a.astype(dtype)
                    except Exception:  # noqa: BLE001 - e.g. strings or datetimes of an earlier edit
                        arrays[name] = np.zeros(a.shape, dtype)
        elif edit == "values" and name in arrays:
            with warnings.catch_warnings():  # from complex or strings, after an earlier edit
                warnings.simplefilter("ignore")
                try:
                    a = np.asarray(arrays[name]).astype(np.float32)
                except (TypeError, ValueError):
                    continue
            if a.size:
                value = draw(st.sampled_from([math.nan, math.inf, -math.inf, 3e38, -3e38, 1e30]))
                a.flat[draw(st.integers(0, a.size - 1))] = value
                done[-1] += f": one value {value}"
            arrays[name] = a
        elif edit == "add":
            new = draw(st.sampled_from(["rbm.0.weights_inc", "rbm.3.weights", "net.5.weights", "extra", "x.y"]))
            arrays[new] = np.zeros(draw(st.lists(st.integers(0, 3), max_size=2)), np.float32)
            done[-1] = f"add {new} of shape {arrays[new].shape}"
        elif edit == "header" and isinstance(header, dict):
            key = draw(st.sampled_from(sorted(HEADER_VALUES)))
            if draw(st.integers(0, 4)) == 0:
                header.pop(key, None)
                done[-1] = f"header without {key!r}"
            else:
                header[key] = draw(HEADER_VALUES[key])
                done[-1] = f"header {key!r} = {header[key]!r}"
        elif edit == "param" and isinstance(header, dict) and isinstance(header.get("params"), dict):
            key = draw(st.sampled_from(sorted(PARAM_VALUES)))
            if draw(st.integers(0, 4)) == 0:
                header["params"].pop(key, None)
                done[-1] = f"params without {key!r}"
            else:
                header["params"][key] = draw(st.sampled_from(PARAM_VALUES[key]) | JSON)
                done[-1] = f"param {key!r} = {header['params'][key]!r}"
        elif edit == "header_array":
            header = draw(st.sampled_from(["list", "number", "null", "string", "bad json", "latin-1", "float",
                                           "2-D", "object", "missing"]))
            done[-1] = f"header replaced by: {header}"
    out = io.BytesIO()
    np.savez(out, **{**header_member(header), **arrays})  # an array renamed to __header__ replaces it
    return Sample(out.getvalue(), f"the {kind} model with {'; '.join(done)}")


def header_member(header) -> dict:
    """The ``__header__`` array for ``header``: a dict as JSON, or one of the malformed kinds by name."""
    if isinstance(header, dict):
        return {"__header__": np.frombuffer(json.dumps(header, allow_nan=True).encode(), np.uint8)}
    text = {"list": b"[1, 2]", "number": b"2", "null": b"null", "string": b'"dbn-yarn-model"',
            "bad json": b'{"format": ', "latin-1": '{"format": "\xe9"}'.encode("latin-1")}
    if header in text:
        return {"__header__": np.frombuffer(text[header], np.uint8)}
    return {"float": {"__header__": np.array([1.5, 2.5])}, "2-D": {"__header__": np.zeros((2, 2), np.uint8)},
            "object": {"__header__": np.array([{"format": persist.FORMAT}], dtype=object)},
            "missing": {}}[header]


@st.composite
def zip_of_members(draw, arrays, header) -> tuple[bytes, str]:
    """A zip whose members are the model's .npy files, some replaced by raw bytes or by
    .npy files whose header lies (a huge shape, another dtype), compressed in any way zip knows."""
    members = {f"{name}.npy": npy_bytes(a) for name, a in arrays.items()}
    members["__header__.npy"] = npy_bytes(header_member(header)["__header__"])
    done = []
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(members) + ["readme.txt", "dir/", "x.npy"]))
        how = draw(st.sampled_from(["raw", "huge", "descr", "fortran", "truncate", "remove", "no_suffix"]))
        done.append(f"{name}: {how}")
        content = members.get(name, b"")
        if how == "raw":
            members[name] = draw(st.binary(max_size=32))
            done[-1] += f" {members[name]!r}"
        elif how == "huge" and content:  # the npy header claims more than the member holds
            shape = draw(st.sampled_from([f"({10**12},)", f"({2**40}, {2**40})", "(3000000000,)", "(1000, 1000, 1000)",
                                          "(-1,)", f"(0, {2**62})", "(5, 4)", "()"]))
            members[name] = npy_with_header(content, shape=shape)
            done[-1] += f" {shape}"
        elif how == "descr" and content:
            descr = draw(st.sampled_from(["'<f8'", "'|O'", "'<U10'", "'>i4'", "[('a', '<f4')]", "'|V16'", "'<c8'"]))
            members[name] = npy_with_header(content, descr=descr)
            done[-1] += f" {descr}"
        elif how == "fortran" and content:
            members[name] = npy_with_header(content, fortran="True")
        elif how == "truncate" and content:
            members[name] = content[:draw(st.integers(0, len(content) - 1))]
        elif how == "remove":
            members.pop(name, None)
        elif how == "no_suffix" and name.endswith(".npy") and name in members:
            members[name[:-4]] = members.pop(name)
    compression = draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2,
                                        zipfile.ZIP_LZMA]))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compression) as z:
        for name, content in members.items():
            z.writestr(name, content)
    return out.getvalue(), f"{'; '.join(done)} (compression {compression})"


def npy_bytes(array) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, np.asanyarray(array), allow_pickle=True)
    return out.getvalue()


def npy_with_header(content: bytes, shape=None, descr=None, fortran=None) -> bytes:
    """``content`` (an .npy file) with fields of its header dict replaced by the given source
    text; ``content`` as it is when an earlier edit left no .npy header to edit."""
    stream = io.BytesIO(content)
    try:
        version = np.lib.format.read_magic(stream)
        header_len = struct.unpack("<H" if version == (1, 0) else "<I", stream.read(2 if version == (1, 0) else 4))[0]
        start = stream.tell()
        fields = ast.literal_eval(content[start:start + header_len].decode("latin-1"))
        fields["descr"], fields["fortran_order"], fields["shape"]  # noqa: B018 - all there
    except Exception:  # noqa: BLE001 - raw bytes or a truncated member
        return content
    text = "{'descr': %s, 'fortran_order': %s, 'shape': %s, }" % (
        descr or repr(fields["descr"]), fortran or repr(fields["fortran_order"]), shape or repr(fields["shape"]))
    text = text.ljust(64 * math.ceil((len(text) + 11) / 64) - 11) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin-1") + content[start + header_len:]


def check_loaded_model(model) -> None:
    """A model that loads works: its parameters are finite numbers, and transform and
    predict_proba take rows of its features and give results of the right shapes."""
    assert isinstance(model, DBN) and model.rbms_
    for name, array in model.get_state().items():
        assert array.dtype == np.float32 and np.isfinite(array).all(), name
    n = model.n_features_in_
    assert isinstance(n, int) and n >= 1
    X = np.linspace(0, 1, 4 * n, dtype=np.float32).reshape(4, n)
    hidden = model.transform(X)
    assert hidden.shape == (4, model.hidden_layers[-1])
    if model.network_ is not None:
        proba = model.predict_proba(X)
        assert proba.shape == (4, model.n_classes_)
        assert model.predict(X).shape == (4,)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz-model") / "model.npz"


def load_checked(path, data: bytes):
    """DBN.load of ``data`` written to ``path``: a working model, or None after a DBNError naming the file."""
    path.write_bytes(data)
    try:
        with within(f"DBN.load({str(path)!r})"):
            model = DBN.load(path, device="cpu")
    except DBNError as exc:
        check_error_names(exc, str(path))
        outcome(exc, str(path))
        return None
    outcome("loaded")
    with within(f"using the model of {str(path)!r}"):
        check_loaded_model(model)
    return model


def test_the_unedited_model_files_load(model_files, model_path):
    for data in model_files.values():
        assert load_checked(model_path, data) is not None


@pytest.mark.parametrize("key, value", [pytest.param(key, value, id=f"{key}={value!r}"[:40])
                                        for key, values in PARAM_VALUES.items() for value in values])
def test_each_hyperparameter_in_a_model_file_gives_a_working_model_or_a_model_file_error(
        model_files, model_path, key, value):
    """A sweep of the header's hyperparameters, good values and bad, in both models' files."""
    for data in model_files.values():
        arrays = npz_members(data)
        header = json.loads(arrays.pop("__header__").tobytes())
        header["params"][key] = value
        out = io.BytesIO()
        np.savez(out, **arrays, **header_member(header))
        load_checked(model_path, out.getvalue())


@fuzz(1.5)
@given(data=st.data())
def test_model_loader_gives_a_working_model_or_a_model_file_error(model_files, model_path, data):
    sample = data.draw(edited_model_files(model_files))
    model = load_checked(model_path, sample.data)
    if model is not None and sample.expected is not None:  # mutated bytes: loaded unchanged, or refused
        saved = {name: array for name, array in sample.expected.items() if name != "__header__"}
        loaded = model.get_state(increments=False)
        assert set(loaded) == set(saved)
        for name, array in saved.items():
            np.testing.assert_array_equal(loaded[name], array, err_msg=name)


# ====================================================================== .npz files: the bounded reader

#: the central directory entry's fields a crafted zip may lie in: (offset in the entry, struct format)
DIRECTORY_FIELDS = {"compress_type": (10, "<H"), "crc": (16, "<I"), "compress_size": (20, "<I"),
                    "file_size": (24, "<I"), "header_offset": (42, "<I"), "flag_bits": (8, "<H")}


@st.composite
def crafted_npz(draw) -> Sample:
    """An .npz of a few small arrays (stored or deflated: a checkpoint's ``__checkpoint__`` header
    among them), then maybe with .npy headers that lie, zip directory fields rewritten (sizes,
    offsets, compression, flags), directory entries repeated (members that overlap), or bytes mutated."""
    arrays = draw(st.dictionaries(st.sampled_from(["w", "b", "v.0", "__checkpoint__"]),
                                  st.sampled_from([np.zeros((3, 2), np.float32), np.arange(5.0), np.ones(0),
                                                   np.eye(4, dtype=np.int64), np.float64(2.0), np.zeros(2000)]),
                                  max_size=3))
    if draw(st.booleans()):
        arrays["__checkpoint__"] = np.frombuffer(json.dumps(draw(st.sampled_from(
            [{"fingerprint": "f", "step": 1}, {}, [1], "x", None]))).encode(), np.uint8)
    members = {f"{name}.npy": npy_bytes(array) for name, array in arrays.items()}
    done = []
    for name in list(members):
        how = draw(st.sampled_from(["keep", "keep", "keep", "huge", "descr", "fortran", "truncate"]))
        if how == "huge":
            shape = draw(st.sampled_from([f"({2**40},)", "(1000, 1000, 1000)", "(2000,)", "(-1,)", "()"]))
            members[name] = npy_with_header(members[name], shape=shape)
        elif how == "descr":
            members[name] = npy_with_header(members[name], descr=draw(st.sampled_from(["'|O'", "'<U2'", "'<f8'"])))
        elif how == "fortran":
            members[name] = npy_with_header(members[name], fortran="True")
        elif how == "truncate":
            members[name] = members[name][:draw(st.integers(0, len(members[name])))]
        if how != "keep":
            done.append(f"{name}: {how}")
    compression = draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2]))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compression) as z:
        for name, content in members.items():
            z.writestr(name, content)
    data = bytearray(out.getvalue())
    directory = data.find(b"PK\x01\x02")
    for _ in range(draw(st.integers(0, 2)) if directory >= 0 else 0):
        field = draw(st.sampled_from(sorted(DIRECTORY_FIELDS)))
        offset, fmt = DIRECTORY_FIELDS[field]
        bits = 8 * struct.calcsize(fmt)
        value = draw(st.sampled_from([0, 1, 8, 12, 14, 99, 2**bits - 1, len(data), len(data) * 1000])
                     | st.integers(0, 2**bits - 1)) % 2**bits
        data[directory + offset:directory + offset + struct.calcsize(fmt)] = struct.pack(fmt, value)
        done.append(f"first directory entry's {field} = {value}")
    if directory >= 0 and draw(st.integers(0, 4)) == 0:  # the first entry repeated: members that overlap
        end = data.rfind(b"PK\x05\x06")
        entry_end = data.find(b"PK\x01\x02", directory + 4)
        entry = bytes(data[directory:entry_end if 0 < entry_end < end else end])
        copies = draw(st.integers(2, 50))
        record = bytearray(data[end:])
        if len(record) >= 22:
            count = struct.unpack("<H", record[10:12])[0] + copies
            record[8:10] = record[10:12] = struct.pack("<H", min(count, 0xFFFF))
            record[12:16] = struct.pack("<I", struct.unpack("<I", record[12:16])[0] + len(entry) * copies)
            data = data[:end] + entry * copies + record
            done.append(f"first directory entry repeated {copies} times")
    if draw(st.integers(0, 3)) == 0:
        mutation, how = draw(mutated(bytes(data)))
        data = bytearray(mutation)
        done.append(how)
    return Sample(bytes(data), f"{sorted(arrays)} (compression {compression}){': ' if done else ''}{'; '.join(done)}")


@fuzz()
@given(sample=crafted_npz())
@example(sample=Sample(b"PK\x05\x06" + bytes(18), "an empty zip"))
def test_npz_reader_gives_arrays_within_the_limits_or_an_npz_error(sample):
    """``iterreduce.storage.npzfile.read_npz``: any bytes give arrays whose bytes the limits allow, or
    an NpzError; peak allocation (tracemalloc sees NumPy's) stays within the same bound."""
    import tracemalloc

    from iterreduce.storage import npzfile

    size = len(sample.data)
    bound = npzfile.MAX_INFLATION_RATIO * size + npzfile.INFLATION_ALLOWANCE
    tracemalloc.start()
    try:
        with within("read_npz"):
            arrays = npzfile.read_npz(io.BytesIO(sample.data), size)
    except npzfile.NpzError as exc:
        outcome(exc)
        assert str(exc).strip()
        return
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    outcome("read")
    assert peak < bound + 4 * npzfile.READ_CHUNK_BYTES, f"peak {peak} bytes from a file of {size}"
    assert sum(a.nbytes for a in arrays.values()) <= bound
    for name, array in arrays.items():
        assert array.dtype.kind in npzfile.PLAIN_KINDS and array.flags.c_contiguous and array.flags.writeable, name


def zero_bomb(megabytes: int) -> Sample:
    """A checkpoint whose one array is ``megabytes`` MiB of deflated zeros: a few KiB on disk."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("__checkpoint__.npy", npy_bytes(np.frombuffer(b'{"fingerprint": "f"}', np.uint8)))
        z.writestr("w.npy", npy_bytes(np.zeros(megabytes << 18, np.float32)))
    return Sample(out.getvalue(), f"{megabytes} MiB of zeros, deflated")


@fuzz()
@given(sample=crafted_npz())
@example(sample=zero_bomb(64))  # loaded whole by np.load before the bounded reader
def test_checkpoint_loader_gives_a_checkpoint_or_a_checkpoint_error(sample, tmp_path_factory):
    """``iterreduce.master.checkpoint.load``: a checkpoint within the reader's limits, or a
    CheckpointError naming the file; ``latest`` passes over what it cannot read."""
    from iterreduce.master import checkpoint
    from iterreduce.storage import npzfile
    from iterreduce.exceptions import CheckpointError

    path = tmp_path_factory.mktemp("ckpt", numbered=True) / "ckpt-000000001.npz"
    path.write_bytes(sample.data)
    try:
        with within(f"checkpoint.load({str(path)!r})"):
            header, arrays = checkpoint.load(str(path))
    except CheckpointError as exc:
        check_error_names(exc, str(path))
        outcome(exc, str(path))
    else:
        outcome("loaded")
        assert isinstance(header, dict) and "__checkpoint__" not in arrays
        limit = npzfile.MAX_INFLATION_RATIO * len(sample.data) + npzfile.INFLATION_ALLOWANCE
        assert sum(a.nbytes for a in arrays.values()) <= limit
    with within(f"checkpoint.latest({str(path.parent)!r})"):  # an unreadable one is passed over, never an error
        found = checkpoint.latest(str(path.parent), "f")
    assert found in (None, str(path))
