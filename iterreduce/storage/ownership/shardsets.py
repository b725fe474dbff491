"""The shard manifest (:data:`~.names.MANIFEST_NAME`) beside a set of shards: the file names
written, each with its size and the SHA-256 of its bytes (:func:`start_shard_set`,
:func:`commit_shard`). A later write replaces only files the manifest lists and whose bytes still
hash as listed: a proof a person's file cannot have by accident, nor by a copied or hand-written
manifest (a listed size, or a name listed as being written, proves nothing). A folder holding
anything else is refused, touching no byte. Each shard is written beside its name, hashed and
recorded, then renamed into place: a write cut short leaves a hidden leftover or a proven file,
never an unproven file at a listed name. Written once over a :class:`~.folders.Folder` (local
disk, where no link is followed; HDFS); one writer at a time holds the folder
(:func:`~.locks.shard_folder`)."""

from __future__ import annotations

import json
import logging
import re

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


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _listed(value) -> bool:
    """Whether a manifest's entry is one the tool writes: ``{"size": bytes, "sha256": hex}`` (a
    file written), or None (being written: proves nothing)."""
    return value is None or (isinstance(value, dict) and set(value) == {"size", "sha256"}
                             and type(value["size"]) is int and value["size"] >= 0
                             and isinstance(value["sha256"], str) and _SHA256.fullmatch(value["sha256"]) is not None)


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
    """The shard manifest in folder ``path`` (``{"files": {name: {"size", "sha256"} or None},
    "notes": {...}}``); empty where there is none or it is unreadable (then nothing there is proven
    the runtime's). Only what the tool writes is taken: an entry whose name is not a plain name in
    the folder (:func:`plain_name`) or whose value is not a size and a hash, or None, is left out
    (an earlier version's bare sizes too), with a warning naming the manifest and the entry."""
    return _read_manifest(folder_on(fs, path))


def _read_manifest(folder: Folder) -> dict:
    data = _manifest_json(folder)
    if data is None:
        return {"files": {}, "notes": {}}
    where = folder.path(MANIFEST_NAME)
    files = {}
    for name, value in data.get("files", {}).items():
        if plain_name(name) and _listed(value):
            files[name] = value
        else:
            log.warning("%s: ignored its entry %s (%s): not a file name inside this folder with its size and "
                        "SHA-256, so nothing is done to it", where, shown(name), shown(value))
    notes = data.get("notes", {})
    if not isinstance(notes, dict):
        log.warning("%s: ignored its notes %s: not an object", where, shown(notes))
        notes = {}
    return {"files": files, "notes": dict(notes)}


def _write_manifest(folder: Folder, manifest: dict) -> None:
    text = json.dumps({"written_by": "iterreduce", "files": dict(sorted(manifest["files"].items())),
                       "notes": manifest.get("notes", {})}, indent=1).encode()
    folder.write(MANIFEST_NAME, text)  # whole, or the earlier one


def _ours(folder: Folder, name: str, entry: Entry, files: dict) -> bool:
    """Whether a folder entry is a shard file the manifest ``files`` lists as it is (its size, and
    its bytes' SHA-256: read whole), or a leftover of an interrupted write of one or of the manifest
    (exactly :mod:`iterreduce.storage.durable`'s hidden names, :func:`~iterreduce.storage.durable.hidden_target`).
    A link is never the tool's: it writes none."""
    if entry.kind != "file":
        return False
    if name in files:
        listed = files[name]
        if listed is None or listed["size"] != entry.size:
            return False
        try:
            return folder.digest(name) == listed["sha256"]
        except ValueError:  # a link or not a plain file meanwhile
            return False
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
        if not _ours(folder, name, entry, files):
            raise ForeignFileError(
                f"{uri}: holds {name}, which this tool cannot prove it wrote (not listed in {MANIFEST_NAME} with "
                f"its size and the SHA-256 of its bytes): shards are written into an empty folder or one holding "
                f"shards written here; nothing was changed: choose another folder, or move the file away")
        if name not in files or name.startswith(f"{prefix}-") or name in names:
            replaced.append(name)
    # The files that stay keep their proof; the new names are being written (proof comes with each
    # file, :func:`commit_shard`). A listed name with no file (a write cut short) is dropped.
    here = {name for name, _ in entries}
    manifest["files"] = {**{name: value for name, value in files.items() if name in here and name not in replaced},
                         **{name: None for name in names}}
    for name in replaced:  # each proven just above
        folder.remove_file(name)
    _write_manifest(folder, manifest)


def commit_shard(fs: pafs.FileSystem, path: str, name: str, written: str) -> None:
    """Put the shard file ``written`` (a hidden name beside it, whole) in folder ``path`` under its
    name ``name``: first recorded in the manifest with its size and SHA-256, then renamed."""
    folder = folder_on(fs, path)
    entry = folder.entry(written)
    if entry is None or entry.kind != "file":
        raise ForeignFileError(f"{folder.path(written)}: the shard just written is not there as a file")
    manifest = _read_manifest(folder)
    manifest["files"][name] = {"size": entry.size, "sha256": folder.digest(written)}
    _write_manifest(folder, manifest)
    folder.move(written, name)


def finish_shard_set(fs: pafs.FileSystem, path: str, names: list[str]) -> None:
    """Check that every shard file ``names`` in folder ``path`` was committed (:func:`commit_shard`)."""
    missing = [name for name in names if read_manifest(fs, path)["files"].get(name) is None]
    if missing:
        raise ForeignFileError(f"{folder_on(fs, path).path(missing[0])}: not written (its set is incomplete)")


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
