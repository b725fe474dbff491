"""Reading ``.npz`` files (model files, checkpoints, data files) with limits: a small file never
makes the process allocate much more than it holds.

An ``.npz`` is a zip of ``.npy`` members. A zip's headers declare sizes that nothing checks
against the bytes on disk, and a deflated member inflates up to a thousand times: a 100 KB
file of ``np.savez_compressed`` zeros declares hundreds of MB, and NumPy's own reader
allocates it all. :func:`read_npz` checks every declaration before it allocates:

- the members: at most :data:`MAX_MEMBERS`, each an ``.npy`` file, stored or deflated (no
  other compression, no encryption), whose compressed bytes lie within the file's real size
  and together add up to no more than it (members that overlap are refused);
- a stored member holds as many bytes as it declares; the deflated members together inflate
  to at most :data:`MAX_INFLATION_RATIO` times the file's size plus
  :data:`INFLATION_ALLOWANCE`, and never to more than :data:`MAX_INFLATED_BYTES`; or, for a
  data file (the caller passes ``memory``), all members together declare no more than the
  memory the machine can give;
- each ``.npy`` header: format 1.0 or 2.0, a plain numeric dtype (or, where the caller allows,
  fixed-width strings; never Python objects: nothing is unpickled), and a shape whose bytes
  are exactly what the member declares;
- the data is read in chunks of :data:`READ_CHUNK_BYTES` into the array itself, stopping at
  the declared size; a member that holds less, or fails its CRC, is refused, and so is a data
  file's member whose stream holds more (a model file's is cut at its declared size).

Why two bounds: model files and checkpoints are the project's own, saved by ``np.savez`` (weights
hardly compress), so a ratio to the file's size costs users nothing and keeps a crafted small
file from asking for gigabytes. Data files are the users': one-hot or sparse features and
binarised images compress a thousand-fold, so only their declared sizes bound them, checked
against the memory left, and the stream must then yield exactly what was declared.

Anything else raises :class:`NpzError` naming the member; callers add the file and their own
error class (a model file's, a checkpoint's).
"""

from __future__ import annotations

import copy
import math
import zipfile
from typing import Collection

import numpy as np

from ..exceptions import IterReduceError

#: members an .npz may hold (a model has a few per layer; a checkpoint one per parameter)
MAX_MEMBERS = 4096
#: deflated members may inflate to this many times the whole file's size ...
MAX_INFLATION_RATIO = 32
#: ... plus this much, whatever the file's size (small arrays of zeros inflate a thousand-fold)
INFLATION_ALLOWANCE = 16 << 20
#: and never, however large the file, to more than this in all
MAX_INFLATED_BYTES = 1 << 31
#: bytes read from a member at a time (inflating a member never holds more than this besides its array)
READ_CHUNK_BYTES = 1 << 22
#: dtype kinds a member may hold: booleans, integers, floating-point numbers
PLAIN_KINDS = "biuf"
_COMPRESSIONS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
_ENCRYPTED = 0x1  # the zip flag bit of an encrypted member


class NpzError(IterReduceError, ValueError):
    """An ``.npz`` file that is not one of plain arrays within the limits; the message names
    the member at fault (the caller names the file)."""


def read_npz(file, size: int, only: Collection[str] | None = None,
             kinds: str = PLAIN_KINDS, memory: int | None = None) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` in ``file`` (a seekable binary file object whose real size
    is ``size`` bytes), by name without ``.npy``; each array writable, in C order. With
    ``only``, just the arrays of those names (every member is checked all the same).
    ``kinds``: the dtype kinds allowed (a data file's labels may be strings too: "U", "S").
    ``memory``: for a data file, the bytes the machine can give (MemAvailable): its members may
    then declare any sizes that fit in it together, however far they inflate; without it (model
    files, checkpoints), the ratio limit of this module.

    Raises :class:`NpzError` for a file outside the limits of this module or bytes that are
    no readable zip (whatever zipfile, zlib or NumPy raised is in its message), and
    ``OSError`` when the file cannot be read. At most the arrays' bytes plus
    :data:`READ_CHUNK_BYTES` (and the zip's directory, a fraction of ``size``) are allocated."""
    return _guarded(_read, file, size, only, kinds, memory)


def array_names(file, size: int, memory: int | None = None) -> list[str]:
    """The names of the arrays :func:`read_npz` would give for ``file``, in the zip's order, from
    its directory alone (checked against the limits as :func:`read_npz` checks it)."""
    return _guarded(_names, file, size, memory)


def _guarded(read, file, size: int, *args):
    """``read(file, size, *args)``, any error but the file system's an :class:`NpzError`."""
    try:
        return read(file, size, *args)
    except NpzError:
        raise
    except OSError:  # the file system's error (a lost disk, HDFS): not the bytes' fault
        raise
    except Exception as exc:  # noqa: BLE001 - zipfile, zlib and NumPy raise many types for bad bytes
        raise NpzError(f"not a readable .npz (truncated or corrupt, or not a zip): "
                       f"{type(exc).__name__}: {exc}") from exc


def _read(file, size: int, only: Collection[str] | None, kinds: str,
          memory: int | None) -> dict[str, np.ndarray]:
    with _checked_zip(file, size, memory) as z:
        arrays: dict[str, np.ndarray] = {}
        for info, name in zip(z.infolist(), _member_names(z.infolist())):
            if only is not None and name not in only:
                continue
            # A data file's stream must end where its member declares (no ratio bounds it);
            # a model file's is cut there, its CRC then checked (its size bounded by the ratio).
            with z.open(info if memory is None else _declaring_more(info)) as member:
                arrays[name] = _read_member(member, name, info.file_size, kinds)
    return arrays


def _declaring_more(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
    """``info`` declaring :data:`READ_CHUNK_BYTES` more than it does. zipfile stops a member at
    its declared size and then checks the CRC of what it gave, so a crafted CRC hides a stream
    that holds more; declared longer, the stream's own end stops it (CRC checked there), and
    :func:`_read_member` sees the first byte beyond. zipfile inflates at most 4 KiB beyond what
    is asked, far less than the margin."""
    longer = copy.copy(info)
    longer.file_size += READ_CHUNK_BYTES
    return longer


def _names(file, size: int, memory: int | None) -> list[str]:
    with _checked_zip(file, size, memory) as z:
        return _member_names(z.infolist())


def _checked_zip(file, size: int, memory: int | None) -> zipfile.ZipFile:
    """The zip in ``file``, its directory and members' declarations checked against the limits."""
    _check_directory_size(file, size)
    z = zipfile.ZipFile(file)
    try:
        _check_members(z.infolist(), size)
        if memory is None:
            _check_inflation(z.infolist(), size)
        else:
            _check_memory(z.infolist(), memory)
    except BaseException:
        z.close()
        raise
    return z


def _member_names(infos: list[zipfile.ZipInfo]) -> list[str]:
    """The arrays' names (the members' without ``.npy``), refusing a name stored twice."""
    names = [info.filename[:-len(".npy")] for info in infos]
    seen = set()
    for name in names:
        if name in seen:
            raise NpzError(f"array {name!r} is stored twice")
        seen.add(name)
    return names


def _check_directory_size(file, size: int) -> None:
    """Refuse a zip whose end record announces more members than :data:`MAX_MEMBERS`, before
    zipfile builds an object for each (a directory entry is 46 bytes; its object ten times that)."""
    try:
        end = zipfile._EndRecData(file)  # noqa: SLF001 - the record zipfile itself reads first
    except AttributeError:  # a Python without it: the count is checked after parsing
        return
    if end and end[zipfile._ECD_ENTRIES_TOTAL] > MAX_MEMBERS:  # noqa: SLF001
        raise NpzError(f"the zip announces {end[zipfile._ECD_ENTRIES_TOTAL]} members, "  # noqa: SLF001
                       f"at most {MAX_MEMBERS} are read")
    if end and end[zipfile._ECD_SIZE] > size:  # noqa: SLF001
        raise NpzError(f"the zip's directory claims {end[zipfile._ECD_SIZE]} bytes, "  # noqa: SLF001
                       f"the file holds {size}")


def _check_members(infos: list[zipfile.ZipInfo], size: int) -> None:
    """Every member's kind and declared sizes against the file's real ``size``."""
    if len(infos) > MAX_MEMBERS:
        raise NpzError(f"{len(infos)} members, at most {MAX_MEMBERS} are read")
    compressed = 0
    for info in infos:
        where = f"member {info.filename!r}"
        if info.is_dir() or not info.filename.endswith(".npy"):
            raise NpzError(f"{where} is not an .npy array")
        if info.compress_type not in _COMPRESSIONS:
            raise NpzError(f"{where} is compressed with zip method {info.compress_type}; "
                           f"only stored and deflated members are read")
        if info.flag_bits & _ENCRYPTED:
            raise NpzError(f"{where} is encrypted")
        if info.compress_size > size or info.header_offset + info.compress_size > size:
            raise NpzError(f"{where} claims {info.compress_size} bytes at offset {info.header_offset}, "
                           f"beyond the file's {size} bytes")
        compressed += info.compress_size
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise NpzError(f"{where} is stored, yet claims {info.file_size} bytes in {info.compress_size}")
    if compressed > size:  # members that overlap: the same bytes read many times
        raise NpzError(f"its members claim {compressed} bytes in all, more than the file's {size}")


def _check_inflation(infos: list[zipfile.ZipInfo], size: int) -> None:
    """The deflated members' declared sizes together against the ratio limit (model files)."""
    deflated = [info for info in infos if info.compress_type == zipfile.ZIP_DEFLATED]
    inflated = sum(info.file_size for info in deflated)
    largest = max(deflated, key=lambda info: info.file_size, default=None)  # named when too much
    limit = min(MAX_INFLATION_RATIO * size + INFLATION_ALLOWANCE, MAX_INFLATED_BYTES)
    if inflated > limit:
        raise NpzError(f"its deflated members would inflate to {inflated} bytes from a file of {size} "
                       f"(member {largest.filename!r} claims {largest.file_size}): more than the {limit} bytes "
                       f"allowed ({MAX_INFLATION_RATIO} times the file's size plus {INFLATION_ALLOWANCE}, at most "
                       f"{MAX_INFLATED_BYTES}); save it uncompressed (numpy.savez)")


def _check_memory(infos: list[zipfile.ZipInfo], memory: int) -> None:
    """All members' declared sizes together against the ``memory`` the machine can give (data files)."""
    total = sum(info.file_size for info in infos)
    if total > memory:
        largest = max(infos, key=lambda info: info.file_size)
        raise NpzError(f"its members would take {total} bytes in memory (member {largest.filename!r} claims "
                       f"{largest.file_size}): more than the {memory} bytes this machine has available")


def _read_member(member, name: str, declared: int, kinds: str) -> np.ndarray:
    """One ``.npy`` member, ``declared`` bytes long: its header checked, then its data read in
    chunks straight into the array."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
    else:
        raise NpzError(f"array {name!r} is in .npy format {version}, not 1.0 or 2.0")
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in kinds:
        what = "plain numbers" if kinds == PLAIN_KINDS else "plain numbers or strings"
        raise NpzError(f"array {name!r} is of type {dtype}, not {what} (Python objects are never unpickled)")
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no wrap-around for absurd shapes
    held = declared - member.tell()
    if nbytes != held:  # before any allocation: a header may claim terabytes
        raise NpzError(f"array {name!r} claims shape {shape} of {dtype} ({nbytes} bytes), "
                       f"but its member holds {held} bytes")
    array = np.empty(shape[::-1] if fortran else shape, dtype=dtype)
    flat = array.reshape(-1).view(np.uint8)
    position = 0
    while position < nbytes:
        chunk = member.read(min(READ_CHUNK_BYTES, nbytes - position))
        if not chunk:
            raise NpzError(f"array {name!r} is truncated ({position} of {nbytes} bytes)")
        flat[position:position + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
        position += len(chunk)
    if member.read(1):  # a data file's member is opened declaring more (_declaring_more)
        raise NpzError(f"array {name!r} holds more than the {nbytes} bytes its member declares")
    return np.ascontiguousarray(array.T) if fortran else array
