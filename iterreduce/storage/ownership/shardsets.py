"""The shard manifest (:data:`~.names.MANIFEST_NAME`) beside a set of shards: the file names
written, with their sizes (:func:`start_shard_set`, :func:`finish_shard_set`). A later write
replaces only files the manifest lists (and whose size still matches it); a folder holding
anything else is refused, touching no byte. Written once over a :class:`~.folders.Folder` (local
disk, where no link is followed; HDFS); one writer at a time holds the folder
(:func:`~.locks.shard_folder`)."""

from __future__ import annotations

import json
import logging

import pyarrow.fs as pafs

from ...exceptions import ForeignFileError, HdfsAccessError
from .. import durable
from .folders import Entry, Folder, folder_on
from .names import LOCK_NAME, MANIFEST_NAME, STALE_SUFFIX
from .records import shown

log = logging.getLogger(__name__)

#: The most bytes of a shard manifest read (a million shards' names take some 50 MB): a larger
#: file is not one this tool wrote, and is not read whole.
MANIFEST_MAX_BYTES = 64 * 2**20
#: The longest file name (in UTF-8 bytes) local file systems and HDFS take.
NAME_MAX_BYTES = 255


def plain_name(name) -> bool:
    """Whether ``name`` (read from a manifest) names a file directly inside its folder: a
    string, neither empty nor ``.`` or ``..``, without ``/`` or NUL, a valid file name (UTF-8,
    no lone surrogates, at most :data:`NAME_MAX_BYTES` bytes), and none of the tool's
    bookkeeping names (the manifest, the lock)."""
    if not isinstance(name, str) or name in ("", ".", "..", MANIFEST_NAME, LOCK_NAME) or "/" in name or "\0" in name:
        return False
    try:
        return len(name.encode("utf-8")) <= NAME_MAX_BYTES
    except UnicodeEncodeError:  # a lone surrogate: no file is named so
        return False


def _listed_size(size) -> bool:
    """Whether a manifest's size is one the tool writes: bytes (an int, not a bool), or None (being written)."""
    return size is None or (type(size) is int and size >= 0)


def _manifest_json(folder: Folder):
    """The JSON object in the manifest file of ``folder``; None where there is none, or it is too
    large, unreadable or not an object with a ``files`` object (said as a warning)."""
    where = folder.path(MANIFEST_NAME)
    try:
        raw = folder.read(MANIFEST_NAME, MANIFEST_MAX_BYTES + 1)
    except HdfsAccessError:
        raise  # HDFS refused this process: said as it is
    except ValueError:
        log.warning("%s: not a file this tool wrote (a link, or not a regular file): not read", where)
        return None
    except OSError as exc:
        log.warning("%s: not readable (%s): nothing in its folder is taken for this tool's", where, exc)
        return None
    if raw is None:
        return None
    why = None
    if len(raw) > MANIFEST_MAX_BYTES:
        why = f"larger than {MANIFEST_MAX_BYTES} bytes"
    else:
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            data, why = None, f"not JSON: {type(exc).__name__}: {str(exc)[:120]}"
        if why is None and not (isinstance(data, dict) and isinstance(data.get("files", {}), dict)):
            why = "not an object with a 'files' object"
    if why is not None:
        log.warning("%s: not a shard manifest of this tool (%s): nothing in its folder is taken for this tool's",
                    where, why)
        return None
    return data


def read_manifest(fs: pafs.FileSystem, path: str) -> dict:
    """The shard manifest in folder ``path`` (``{"files": {name: size or None}, "notes": {...}}``);
    empty where there is none or it is unreadable (then nothing there is proven the runtime's).
    Only what the tool writes is taken: an entry whose name is not a plain name in the folder
    (:func:`plain_name`) or whose size is not bytes or None is left out, with a warning naming
    the manifest and the entry."""
    return _read_manifest(folder_on(fs, path))


def _read_manifest(folder: Folder) -> dict:
    data = _manifest_json(folder)
    if data is None:
        return {"files": {}, "notes": {}}
    where = folder.path(MANIFEST_NAME)
    files = {}
    for name, size in data.get("files", {}).items():
        if plain_name(name) and _listed_size(size):
            files[name] = size
        else:
            log.warning("%s: ignored its entry %s (size %s): not a file name inside this folder with its size in "
                        "bytes, so nothing is done to it", where, shown(name), shown(size))
    notes = data.get("notes", {})
    if not isinstance(notes, dict):
        log.warning("%s: ignored its notes %s: not an object", where, shown(notes))
        notes = {}
    return {"files": files, "notes": dict(notes)}


def _write_manifest(folder: Folder, manifest: dict) -> None:
    text = json.dumps({"written_by": "iterreduce", "files": dict(sorted(manifest["files"].items())),
                       "notes": manifest.get("notes", {})}, indent=1).encode()
    folder.write(MANIFEST_NAME, text)  # whole, or the earlier one


def _ours(name: str, entry: Entry, files: dict) -> bool:
    """Whether a folder entry is a shard file the manifest ``files`` lists as it is (its size;
    None: being written), or a leftover of an interrupted write of one or of the manifest
    (exactly :mod:`iterreduce.storage.durable`'s hidden names, :func:`~iterreduce.storage.durable.hidden_target`).
    A link is never the tool's: it writes none."""
    if entry.kind != "file":
        return False
    if name in files:
        return files[name] is None or files[name] == entry.size
    leftover = durable.hidden_target(name)
    return leftover is not None and (leftover[0] in files or leftover[0] == MANIFEST_NAME)


def _lock_file(name: str) -> bool:
    """Whether ``name`` is the folder's lock or a hidden name of one (being created, set aside):
    another writer's, neither refused nor deleted by a shard write."""
    return name == LOCK_NAME or durable.hidden_target(
        name, (durable.PARTIAL_SUFFIX, durable.BACKUP_SUFFIX, STALE_SUFFIX)) in (
        (LOCK_NAME, durable.PARTIAL_SUFFIX), (LOCK_NAME, durable.BACKUP_SUFFIX), (LOCK_NAME, STALE_SUFFIX))


def start_shard_set(fs: pafs.FileSystem, path: str, uri: str, names: list[str], prefix: str) -> None:
    """Make folder ``path`` (``uri``) ready for the shard files ``names`` of a set whose names
    start with ``prefix`` + "-": refuse it (:class:`~iterreduce.exceptions.ForeignFileError`,
    naming one file, touching nothing) if it holds anything its manifest does not list as it
    is; else record the new names as being written and delete the listed files of the set
    they replace (an earlier write with the same prefix). Other listed sets stay."""
    folder = folder_on(fs, path)
    folder.make_folder()
    manifest = _read_manifest(folder)
    files = manifest["files"]
    replaced = []
    entries = folder.entries()
    for name, entry in entries:
        if name == MANIFEST_NAME and entry.kind == "file":
            continue  # the manifest itself: replaced whole, never written through
        if _lock_file(name):
            continue
        if not _ours(name, entry, files):
            raise ForeignFileError(
                f"{uri}: holds {name}, which this tool did not write (not listed as it is in "
                f"{MANIFEST_NAME}): shards are written into an empty folder or one holding shards written here; "
                f"nothing was changed: choose another folder")
        if name not in files or name.startswith(f"{prefix}-") or name in names:
            replaced.append(name)
    # First the record of what may be there now (old and new names, sizes unknown): an
    # interrupted write leaves nothing the next one cannot prove its own.
    here = {name for name, _ in entries}  # a listed name with no file (a write cut short) is dropped: nothing to prove
    manifest["files"] = {**{name: size for name, size in files.items() if name in here},
                         **{name: None for name in replaced if name in files},
                         **{name: None for name in names}}
    _write_manifest(folder, manifest)
    for name in replaced:
        folder.remove_file(name)
        if name not in names:
            manifest["files"].pop(name, None)
    _write_manifest(folder, manifest)


def finish_shard_set(fs: pafs.FileSystem, path: str, names: list[str]) -> None:
    """Record the shard files ``names`` in folder ``path`` with their sizes, once written."""
    folder = folder_on(fs, path)
    manifest = _read_manifest(folder)
    for name in names:
        found = folder.entry(name)
        manifest["files"][name] = None if found is None else found.size
    _write_manifest(folder, manifest)


def shard_note(fs: pafs.FileSystem, path: str, key: str):
    """A note kept in the shard manifest of folder ``path`` under ``key`` (None if none), e.g.
    what the shards were cut from."""
    return read_manifest(fs, path)["notes"].get(key)


def set_shard_note(fs: pafs.FileSystem, path: str, key: str, value) -> None:
    """Keep ``value`` (JSON) under ``key`` in the shard manifest of folder ``path``."""
    folder = folder_on(fs, path)
    manifest = _read_manifest(folder)
    manifest["notes"][key] = value
    _write_manifest(folder, manifest)
