"""The run record (:data:`~.names.RECORD_NAME`) in a run's output folder and in every
``previous/N`` the runtime makes: the names a run claimed (written while it holds the folder's
lock, so whatever is found under them is its own, even after a crash) and, once the run ends,
every file it left under them with its size and modification time, and its folders.

A record is checked before it is trusted (:meth:`RunRecord.read`): an entry naming anything
outside its folder, or a file without its size and time, is ignored with a warning. It is read
and written through a :class:`~.folders.Folder`: never through a link, and replaced whole.
"""

from __future__ import annotations

import json
import logging
import os

from ...exceptions import HdfsAccessError
from .folders import Entry, Folder, as_folder
from .names import RECORD_NAME

log = logging.getLogger(__name__)

#: The most bytes of a run record read (every file of a run with its size and time: some 80
#: bytes each): a larger file is not one this tool wrote, and is not read.
RECORD_MAX_BYTES = 64 * 2**20


def record_path(rel) -> bool:
    """Whether ``rel`` (read from a run record) names something inside the record's folder: a
    string of names joined by ``/``, none of them empty, ``.`` or ``..``, without NUL, and one
    that this system can name a file by (a lone surrogate cannot be)."""
    if not isinstance(rel, str) or "\0" in rel or len(rel) > 4096:
        return False
    try:
        os.fsencode(rel)
    except UnicodeEncodeError:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _record_identity(value) -> bool:
    """Whether ``value`` is a size and time as a record keeps them: two ints (not bools), not negative."""
    return (isinstance(value, list) and len(value) == 2
            and all(type(v) is int and v >= 0 for v in value))


def shown(value) -> str:
    """``value`` as a message shows it: its ``repr``, cut to 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def walk(folder: Folder, rel: str):
    """Everything under the folder ``rel`` of ``folder``, as (relative path, what it is), each
    folder before its contents, never through a link."""
    pending = [rel]
    while pending:
        current = pending.pop()
        for child, entry in folder.entries(current):
            sub = f"{current}/{child}"
            yield sub, entry
            if entry.kind == "folder":
                pending.append(sub)


def entries_under(folder: Folder, name: str) -> list[tuple[str, Entry]]:
    """``name`` of ``folder`` and, where it is a folder, everything under it (:func:`walk`); none
    where nothing is there."""
    found = folder.entry(name)
    if found is None:
        return []
    return [(name, found), *(walk(folder, name) if found.kind == "folder" else ())]


_warned: set[tuple[str, str]] = set()


def warn_once(where: str, message: str) -> None:
    """Log ``message`` about the record ``where`` once per process (a run reads a record many times)."""
    if (str(where), message) not in _warned:
        _warned.add((str(where), message))
        log.warning("%s", message)


class RunRecord:
    """The run record of one folder (see the module docstring): ``claimed`` names (written
    under the lock, not yet inventoried), ``files`` (relative path -> [size, mtime_ns]) and
    ``folders`` (relative paths) the runtime left there. ``folder``: a local path or a
    :class:`~.folders.Folder`."""

    def __init__(self, folder, claimed=(), files=None, folders=()):
        self.folder = as_folder(folder)
        self.claimed = set(claimed)
        self.files = dict(files or {})
        self.folders = set(folders)

    @classmethod
    def read(cls, folder) -> "RunRecord":
        """The record in ``folder``; an empty one where there is none or it is unreadable (then
        nothing there is proven the runtime's). Only what the runtime writes is taken: a claimed
        name directly in the folder, a file or folder inside it (no ``..``, no absolute path), a
        file with its size and time; any other entry is left out, with a warning naming the
        record and the entry. A record that is a link is not read."""
        record = cls(folder)
        where = record.folder.path(RECORD_NAME)
        try:
            raw = record.folder.read(RECORD_NAME, RECORD_MAX_BYTES + 1)
            if raw is not None and len(raw) > RECORD_MAX_BYTES:
                raise ValueError(f"larger than {RECORD_MAX_BYTES} bytes: not read")
            data = None if raw is None else json.loads(raw)
            if data is not None and not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except HdfsAccessError:
            raise  # HDFS refused this process: said as it is, not taken for a folder without a record
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            warn_once(where, f"{where}: not a run record of this tool ({str(exc)[:120]}): nothing in its folder is "
                             f"taken for this tool's")
            return record
        if data is not None:
            record._take(where, data)
        return record

    def _take(self, where: str, data: dict) -> None:
        """Keep the entries of the record ``data`` (from ``where``) that are the runtime's kind (see :meth:`read`)."""
        ignored = []
        claimed, files, folders = data.get("claimed", []), data.get("files", {}), data.get("folders", [])
        for field, value, kind in (("claimed", claimed, list), ("files", files, dict), ("folders", folders, list)):
            if not isinstance(value, kind):
                ignored.append(f"{field} {shown(value)} (not a {kind.__name__})")
        for name in claimed if isinstance(claimed, list) else ():
            if record_path(name) and "/" not in name:
                self.claimed.add(name)
            else:
                ignored.append(f"claimed {shown(name)}")
        for rel, identity in files.items() if isinstance(files, dict) else ():
            if record_path(rel) and _record_identity(identity):
                self.files[rel] = list(identity)
            else:
                ignored.append(f"files {shown(rel)}: {shown(identity)}")
        for rel in folders if isinstance(folders, list) else ():
            if record_path(rel):
                self.folders.add(rel)
            else:
                ignored.append(f"folders {shown(rel)}")
        if ignored:
            said = "; ".join(ignored[:5]) + (f"; and {len(ignored) - 5} more" if len(ignored) > 5 else "")
            warn_once(where, f"{where}: ignored {len(ignored)} entries that are not a name inside its folder (or a "
                             f"file without its size and time), so nothing is done to what they name: {said}")

    def write(self) -> None:
        """Save the record, atomically (a new file renamed over it: never written through a link
        or into a file another name shares)."""
        data = {"written_by": "iterreduce", "claimed": sorted(self.claimed), "files": dict(sorted(self.files.items())),
                "folders": sorted(self.folders)}
        self.folder.write(RECORD_NAME, (json.dumps(data, indent=1) + "\n").encode())

    def owns(self, rel: str) -> bool:
        """Whether the file or folder ``rel`` (relative to the folder) is provably the runtime's:
        a plain file or folder (never a link, at any depth), under a claimed name or recorded as
        it is now (a folder: with everything in it)."""
        found = self.folder.entry(rel) if record_path(rel) else None
        if found is None or not self.owns_entry(rel, found):
            return False
        return found.kind != "folder" or all(self.owns_entry(sub, e) for sub, e in walk(self.folder, rel))

    def owns_entry(self, rel: str, entry: Entry) -> bool:
        """Whether the entry ``rel`` (``entry``: what it is) alone, not what is in it, is provably the runtime's."""
        claimed = rel.split("/", 1)[0] in self.claimed
        if entry.kind == "file":
            return claimed or self.files.get(rel) == [entry.size, entry.mtime_ns]
        return entry.kind == "folder" and (claimed or rel in self.folders)

    def forget(self, name: str) -> None:
        """Drop ``name`` and everything under it from the record (it moved away)."""
        self.claimed.discard(name)
        self.files = {k: v for k, v in self.files.items() if k != name and not k.startswith(f"{name}/")}
        self.folders = {k for k in self.folders if k != name and not k.startswith(f"{name}/")}

    def take_inventory(self, names) -> None:
        """Record every plain file and folder now under ``names`` as the runtime's, and the claims
        on them settled (links, never the runtime's, are left out). A name holding a file whose
        time the file system does not say (hdfs-native's listing) stays claimed: a size alone
        would prove nothing."""
        for name in names:
            found = entries_under(self.folder, name)
            if any(entry.kind == "file" and entry.mtime_ns is None for _, entry in found):
                continue
            self.forget(name)
            for rel, entry in found:
                if entry.kind == "folder":
                    self.folders.add(rel)
                elif entry.kind == "file":
                    self.files[rel] = [entry.size, entry.mtime_ns]
