"""Load MNIST from the four original gzip-compressed IDX files.

The files are ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
``t10k-images-idx3-ubyte.gz`` and ``t10k-labels-idx1-ubyte.gz``, byte-identical
to the originals from yann.lecun.com/exdb/mnist/ (their SHA256 sums are checked).

Typical use::

    from dbn.data.mnist import load_mnist, scale_images
    data = load_mnist()                    # finds the files, verifies checksums
    x = scale_images(data.x_train)         # (60000, 784) float32 in [0, 1]

Without local copies, ``download_mnist()`` fetches them (network needed) into the
cache directory, where ``load_mnist()`` finds them.

IDX format: big-endian; magic ``0x0000 08 D`` (``08`` = unsigned byte data,
``D`` = number of dimensions), then ``D`` uint32 sizes, then the data, row-major.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import math
import os
import tempfile
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np

from ..errors import MnistError
from ..user_cache import cache_home

__all__ = [
    "DEFAULT_MIRRORS",
    "ENV_VAR",
    "MNIST_FILES",
    "MnistData",
    "MnistError",
    "default_cache_dir",
    "download_mnist",
    "find_mnist_dir",
    "load_mnist",
    "read_idx",
    "scale_images",
]


class FileInfo(NamedTuple):
    """Known size (bytes) and SHA256 of one original .gz file."""

    size: int
    sha256: str


TRAIN_IMAGES = "train-images-idx3-ubyte.gz"
TRAIN_LABELS = "train-labels-idx1-ubyte.gz"
TEST_IMAGES = "t10k-images-idx3-ubyte.gz"
TEST_LABELS = "t10k-labels-idx1-ubyte.gz"

#: The four original files, with their sizes and SHA256 digests.
MNIST_FILES: dict[str, FileInfo] = {
    TRAIN_IMAGES: FileInfo(9_912_422, "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
    TRAIN_LABELS: FileInfo(28_881, "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
    TEST_IMAGES: FileInfo(1_648_877, "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
    TEST_LABELS: FileInfo(4_542, "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
}

#: Mirror base URLs tried in order by download_mnist (each holds the four files).
DEFAULT_MIRRORS: tuple[str, ...] = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)

#: Environment variable naming the directory that holds the four files.
ENV_VAR = "DBN_MNIST_DIR"

_IMAGE_SHAPE = (28, 28)


@dataclass(frozen=True, eq=False)
class MnistData:
    """MNIST as uint8 arrays: images flattened to 784 pixels, labels 0-9."""

    x_train: np.ndarray  # (60000, 784) uint8
    y_train: np.ndarray  # (60000,) uint8
    x_test: np.ndarray  # (10000, 784) uint8
    y_test: np.ndarray  # (10000,) uint8


# --------------------------------------------------------------------------- IDX


#: A gzip-compressed IDX file may inflate to at most this many times its size (MNIST's images:
#: about 5, its labels about 2; deflate's own limit is about 1032): a few kilobytes never inflate
#: to gigabytes in memory.
MAX_INFLATION = 100


def _gunzip_bounded(path: Path, data: bytes) -> bytes:
    """The gzip stream ``data`` (of file ``path``) inflated, a chunk at a time, refused
    (:class:`MnistError`) once it passes :data:`MAX_INFLATION` times its size."""
    limit = MAX_INFLATION * len(data) + (1 << 20)
    out, rest = bytearray(), data
    try:
        while rest:  # one gzip member after another, as gzip.decompress reads them
            member = zlib.decompressobj(16 + zlib.MAX_WBITS)
            chunk = member.decompress(rest, 1 << 20)
            while True:
                out += chunk
                if len(out) > limit:
                    raise MnistError(f"{path}: inflates to more than {limit} bytes, over {MAX_INFLATION} times its "
                                     f"{len(data)} bytes: not an IDX file of this tool's (a damaged or crafted file)")
                if member.eof or not member.unconsumed_tail:
                    break
                chunk = member.decompress(member.unconsumed_tail, 1 << 20)
            if not member.eof:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
            rest = member.unused_data.lstrip(b"\x00")  # gzip.decompress passes over padding between members
    except (EOFError, zlib.error) as e:
        raise MnistError(f"{path}: corrupt gzip stream: {e}") from e
    return bytes(out)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file of unsigned bytes, gzip-compressed or raw.

    Returns a uint8 array of shape ``(n, *dims)``: ``(n, 28, 28)`` for MNIST
    images (magic 0x00000803), ``(n,)`` for labels (magic 0x00000801).
    Raises MnistError naming the path for an unreadable file, a corrupt gzip
    stream, a bad magic number, or a payload whose length differs from what
    the header promises (truncated file or trailing bytes).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise MnistError(f"{path}: cannot read file: {e.strerror or e}") from e

    if path.suffix == ".gz" or data[:2] == b"\x1f\x8b":
        data = _gunzip_bounded(path, data)

    if len(data) < 4:
        raise MnistError(f"{path}: too short for an IDX header ({len(data)} bytes)")
    magic = int.from_bytes(data[:4], "big")
    ndim = data[3]
    if data[:3] != b"\x00\x00\x08" or ndim == 0:
        raise MnistError(
            f"{path}: bad IDX magic number 0x{magic:08x}; expected 0x00000803 (images) "
            f"or 0x00000801 (labels), i.e. 0x000008NN for unsigned-byte data with NN dimensions"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise MnistError(
            f"{path}: truncated IDX header: expected {header} bytes, got {len(data)}"
        )
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected, actual = math.prod(dims), len(data) - header
    if actual != expected:
        what = "file truncated" if actual < expected else f"{actual - expected} trailing bytes"
        raise MnistError(
            f"{path}: header promises shape {dims} = {expected} data bytes after the "
            f"{header}-byte header, but found {actual} ({what})"
        )
    # copy(): frombuffer over bytes is read-only; callers may shuffle in place.
    return np.frombuffer(data, np.uint8, count=expected, offset=header).reshape(dims).copy()


# ------------------------------------------------------------------- locating


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dbn/mnist``, or ``~/.cache/dbn/mnist`` when that is unset."""
    return cache_home() / "dbn" / "mnist"  # before the project's own folder was named: kept where users have it


def _has_all_files(d: Path) -> bool:
    return all((d / name).is_file() for name in MNIST_FILES)


def find_mnist_dir() -> Path:
    """Find the directory holding the four MNIST files.

    Looks, in order, at: ``$DBN_MNIST_DIR`` (used as given when set); a
    ``shared/data/mnist`` directory in the current directory or any parent
    (so a checkout beside a ``shared/`` folder finds ``../shared/data/mnist``);
    the cache directory (see default_cache_dir). Apart from ``$DBN_MNIST_DIR``,
    a directory counts only if it holds all four files. Raises MnistError
    listing every place it looked.
    """
    env = os.environ.get(ENV_VAR)
    if env:
        d = Path(env).expanduser()
        if d.is_dir():
            return d
        raise MnistError(f"{d}: ${ENV_VAR} names a directory that does not exist")

    looked = [f"${ENV_VAR} (not set)"]
    cwd = Path.cwd().resolve()
    for candidate in [p / "shared" / "data" / "mnist" for p in (cwd, *cwd.parents)] + [
        default_cache_dir()
    ]:
        if _has_all_files(candidate):
            return candidate
        looked.append(f"{candidate} ({'incomplete' if candidate.is_dir() else 'absent'})")
    raise MnistError(
        "MNIST files not found; looked in:\n  "
        + "\n  ".join(looked)
        + f"\nSet ${ENV_VAR}, pass data_dir=, or fetch them with "
        f"dbn.data.mnist.download_mnist() (into {default_cache_dir()})."
    )


# -------------------------------------------------------------------- loading


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _verify(path: Path) -> None:
    info = MNIST_FILES[path.name]
    actual = _sha256(path)
    if actual != info.sha256:
        raise MnistError(
            f"{path}: SHA256 mismatch: expected {info.sha256}, got {actual} "
            f"({path.stat().st_size} bytes, expected {info.size}); the file is corrupt or "
            f"not the original MNIST file (delete it and download again, or pass verify=False)"
        )


def _load_split(images_path: Path, labels_path: Path) -> tuple[np.ndarray, np.ndarray]:
    x, y = read_idx(images_path), read_idx(labels_path)
    if x.shape[1:] != _IMAGE_SHAPE:
        raise MnistError(f"{images_path}: expected images of shape (n, 28, 28), got {x.shape}")
    if y.ndim != 1:
        raise MnistError(f"{labels_path}: expected labels of shape (n,), got {y.shape}")
    if len(x) != len(y):
        raise MnistError(
            f"{images_path} holds {len(x)} images but {labels_path} holds {len(y)} labels"
        )
    if y.size and y.max() > 9:
        raise MnistError(f"{labels_path}: label {y.max()} is outside 0-9")
    return x.reshape(len(x), -1), y


def load_mnist(data_dir: str | os.PathLike | None = None, *, verify: bool = True) -> MnistData:
    """Load MNIST from the four .gz files in ``data_dir`` (default: find_mnist_dir()).

    With ``verify=True`` each file's SHA256 is checked against MNIST_FILES first.
    Returns MnistData with uint8 arrays x_train (60000, 784), y_train (60000,),
    x_test (10000, 784), y_test (10000,). Raises MnistError for missing, corrupt
    or inconsistent files.
    """
    d = find_mnist_dir() if data_dir is None else Path(data_dir).expanduser()
    paths = {name: d / name for name in MNIST_FILES}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise MnistError(
            "missing MNIST file(s): " + ", ".join(missing)
            + f"; fetch them with dbn.data.mnist.download_mnist({str(d)!r})"
        )
    if verify:
        for p in paths.values():
            _verify(p)
    x_train, y_train = _load_split(paths[TRAIN_IMAGES], paths[TRAIN_LABELS])
    x_test, y_test = _load_split(paths[TEST_IMAGES], paths[TEST_LABELS])
    return MnistData(x_train, y_train, x_test, y_test)


def scale_images(x: np.ndarray) -> np.ndarray:
    """Pixel values 0-255 (uint8, or another integer type) -> float32 in [0, 1] (x / 255).

    Float input is refused (TypeError) because it is most likely already scaled.
    """
    x = np.asarray(x)
    if not (np.issubdtype(x.dtype, np.integer) or x.dtype == bool):
        raise TypeError(f"scale_images expects integer pixels 0-255, got {x.dtype} (already scaled?)")
    if x.dtype != np.uint8 and x.size and (x.min() < 0 or x.max() > 255):
        raise ValueError(f"scale_images: pixel values outside 0-255 (min {x.min()}, max {x.max()})")
    return x.astype(np.float32) / np.float32(255)


# ---------------------------------------------------------------- downloading


def _fetch_verified(url: str, final: Path, sha256: str, timeout: float) -> None:
    """Download url to a temp file beside final; rename into place only if the digest matches."""
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".part")
    try:
        h = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            while chunk := resp.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
        if h.hexdigest() != sha256:
            raise MnistError(f"SHA256 mismatch: expected {sha256}, got {h.hexdigest()}")
        os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def download_mnist(
    dest_dir: str | os.PathLike | None = None,
    *,
    mirrors: Iterable[str] = DEFAULT_MIRRORS,
    timeout: float = 60.0,
) -> Path:
    """Download the four MNIST files into ``dest_dir`` (default: default_cache_dir()).

    Files already present with the right SHA256 are kept. Each other file is
    fetched from the mirror base URLs in turn (any URL urllib opens, file://
    included) into a temp file, checked against its SHA256 and only then renamed
    into place, so a bad download never sits under the final name. Raises
    MnistError listing every mirror's failure if no mirror gives a good copy.
    Returns the destination directory.
    """
    dest = default_cache_dir() if dest_dir is None else Path(dest_dir).expanduser()
    dest.mkdir(parents=True, exist_ok=True)
    mirrors = list(mirrors)
    for name, info in MNIST_FILES.items():
        final = dest / name
        if final.is_file() and _sha256(final) == info.sha256:
            continue
        failures = []
        for base in mirrors:
            url = base.rstrip("/") + "/" + name
            try:
                _fetch_verified(url, final, info.sha256, timeout)
                break
            except (OSError, http.client.HTTPException, ValueError) as e:  # MnistError too
                failures.append(f"{url}: {e}")
        else:
            raise MnistError(
                f"{final}: could not download a good copy from any mirror:\n  "
                + ("\n  ".join(failures) if failures else "(no mirrors given)")
            )
    return dest
