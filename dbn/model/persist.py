"""Model files: one ``.npz`` of plain arrays plus a JSON header, never pickle.

Writes go to a temporary file beside the target and are renamed over it only when
complete, so a failed save never replaces a good model with half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from iterreduce.storage import durable, npzfile

from ..errors import ModelFileError
from . import state

FORMAT = "dbn-yarn-model"
VERSION = 2  # what save_arrays writes unless told; 2: the array names of dbn.model.state (1: network.weights.{i}, ...)
#: 3: a model that scales its inputs, names its classes or its data's columns (dbn.model.preprocess:
#: scaler.* arrays, "scaler", "classes" and "columns" in the header). Only such models are written
#: as 3: a reader of version 2 would ignore them and predict from unscaled rows (or read columns by
#: position), so it must refuse the file instead; models without them stay version 2, which every
#: reader since 2 loads.
INPUTS_VERSION = 3
NEWEST_VERSION = INPUTS_VERSION  # the newest format this code reads
_HEADER = "__header__"


def atomic_write(path, write) -> None:
    """Call ``write(file_object)`` on a temporary file, then rename it to ``path``, durably: the
    file's bytes and its folder fsynced, never a moment without a file at ``path`` if one was
    there (:func:`iterreduce.storage.durable.write_local`, the project's one way of doing it)."""
    durable.write_local(path, write)


def _plain(value):
    """NumPy numbers and arrays in a header (e.g. hidden_layers given as an array) as JSON numbers and lists."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def save_arrays(path, header: dict, arrays: dict[str, np.ndarray], *, version: int = VERSION) -> None:
    """Save ``arrays`` and a JSON-serialisable ``header`` atomically to ``path``, as format
    ``version`` (the oldest that holds what the file holds, so that older readers load it)."""
    if _HEADER in arrays:
        raise ValueError(f"array name {_HEADER!r} is reserved")
    if version not in range(1, NEWEST_VERSION + 1):
        raise ValueError(f"file format version must be 1..{NEWEST_VERSION}, got {version!r}")
    meta = json.dumps({"format": FORMAT, "version": version, **header}, sort_keys=True, default=_plain)
    payload = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
    payload[_HEADER] = np.frombuffer(meta.encode(), dtype=np.uint8)
    atomic_write(path, lambda f: np.savez(f, **payload))


def load_arrays(path) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a file written by :func:`save_arrays`; returns (header, arrays).

    Anything else (truncated, bit-flipped or foreign bytes, members that are not plain
    ``.npy`` arrays of real numbers, an ``.npy`` header that claims more data than its
    member holds, non-finite parameters, a header that is not a JSON object of this format,
    arrays whose shapes do not fit together) raises :class:`ModelFileError` naming the file
    and, where one is at fault, the array. Nothing is allocated beyond what the file holds.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file")
    try:
        arrays = _read_npz(path)
    except ModelFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - zipfile, zlib, bz2, lzma and NumPy raise many types for bad bytes
        raise ModelFileError(f"{path}: not a readable model file (truncated or corrupt, or not an .npz): "
                             f"{type(exc).__name__}: {exc}") from exc
    if _HEADER not in arrays:
        if "__checkpoint__" in arrays:  # iterreduce.master.checkpoint's header: a run's checkpoint
            raise ModelFileError(f"{path}: a training checkpoint, not a model: the model is model.npz in the run's "
                                 f"output directory (a checkpoint continues a run: the same command with --resume)")
        raise ModelFileError(f"{path}: not a {FORMAT} file (no header)")
    header = _header(path, arrays.pop(_HEADER))
    for name, array in arrays.items():
        if array.dtype.kind != "f":
            raise ModelFileError(f"{path}: array {name!r} holds {array.dtype}, not floating-point numbers")
        finite = np.isfinite(array)
        if not finite.all():
            where = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise ModelFileError(f"{path}: array {name!r} holds {int((~finite).sum())} NaN or infinite "
                                 f"value(s), the first at index {where}")
    try:
        state.check_state(state.from_version_1(arrays) if header.get("version", 1) < 2 else arrays)
    except ValueError as exc:
        raise ModelFileError(f"{path}: model file is inconsistent: {exc}") from exc
    return header, arrays


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` at ``path``, through the runtime's bounded reader
    (:func:`iterreduce.storage.npzfile.read_npz`): only plain numeric arrays, and nothing allocated
    beyond what the file's own bytes hold (or a deflated member may inflate to, within its limits)."""
    with open(path, "rb") as f:
        try:
            return npzfile.read_npz(f, os.fstat(f.fileno()).st_size)
        except npzfile.NpzError as exc:
            raise ModelFileError(f"{path}: {exc}") from exc


def _header(path: Path, raw: np.ndarray) -> dict:
    """The JSON header of a model file: an object of this format and of a version this code reads."""
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ModelFileError(f"{path}: corrupt header: {raw.dtype} of shape {raw.shape}, not JSON text")
    try:
        header = json.loads(raw.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelFileError(f"{path}: corrupt header: {exc}") from exc
    if not isinstance(header, dict):
        raise ModelFileError(f"{path}: corrupt header: a JSON {type(header).__name__}, not an object")
    if header.get("format") != FORMAT:
        raise ModelFileError(f"{path}: format {header.get('format')!r}, expected {FORMAT!r}")
    version = header.get("version", 1)  # version 1 files said so; none lack it, but a missing one is the oldest
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ModelFileError(f"{path}: corrupt header: file format version {version!r}")
    if version > NEWEST_VERSION:
        raise ModelFileError(
            f"{path}: written by a newer version (file format {version}, this one reads {NEWEST_VERSION})"
        )
    return header
