"""Model files: one ``.npz`` of plain arrays plus a JSON header, never pickle.

Writes go to a temporary file beside the target and are renamed over it only when
complete, so a failed save never replaces a good model with half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np
from ..exceptions import ModelFileError

FORMAT = "dbn-yarn-model"
VERSION = 2  # 2: the array names of dbn.model.state (1: network.weights.{i}, ...)
_HEADER = "__header__"


def atomic_write(path, write) -> None:
    """Call ``write(file_object)`` on a temporary file, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide models from colleagues
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plain(value):
    """NumPy numbers and arrays in a header (e.g. hidden_layers given as an array) as JSON numbers and lists."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def save_arrays(path, header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Save ``arrays`` and a JSON-serialisable ``header`` atomically to ``path``."""
    if _HEADER in arrays:
        raise ValueError(f"array name {_HEADER!r} is reserved")
    meta = json.dumps({"format": FORMAT, "version": VERSION, **header}, sort_keys=True, default=_plain)
    payload = {name: np.ascontiguousarray(a) for name, a in arrays.items()}
    payload[_HEADER] = np.frombuffer(meta.encode(), dtype=np.uint8)
    atomic_write(path, lambda f: np.savez(f, **payload))


def load_arrays(path) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a file written by :func:`save_arrays`; returns (header, arrays)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such model file")
    try:
        with zipfile.ZipFile(path) as z:  # an .npz is a zip; anything else is not a model
            z.testzip()
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise ModelFileError(f"{path}: not a readable model file (truncated or corrupt, or not an .npz): "
                             f"{type(exc).__name__}") from exc
    if _HEADER not in arrays:
        raise ModelFileError(f"{path}: not a {FORMAT} file (no header)")
    try:
        header = json.loads(arrays.pop(_HEADER).tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"{path}: corrupt header: {exc}") from exc
    if header.get("format") != FORMAT:
        raise ModelFileError(f"{path}: format {header.get('format')!r}, expected {FORMAT!r}")
    if header.get("version", 0) > VERSION:
        raise ModelFileError(
            f"{path}: written by a newer version (file format {header['version']}, this one reads {VERSION})"
        )
    return header, arrays
