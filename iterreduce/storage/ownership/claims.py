"""What a run may treat as its own in a folder, by its run record (:mod:`.records`): the names it
claims before it writes, which file under them is not provably the runtime's (never moved,
overwritten or deleted), what it settles at its end, and deleting only what the record proves.
Each rule is written once, over a :class:`~.folders.Folder` (local disk or HDFS)."""

from __future__ import annotations

import contextlib

import pyarrow.fs as pafs

from ...exceptions import ForeignFileError
from .folders import ArrowFolder, Folder, as_folder
from .names import RECORD_NAME
from .records import RunRecord, entries_under, record_path, shown, walk, warn_once


def first_foreign(folder: Folder, names) -> str | None:
    """The first file (or folder, or link) under ``names`` in ``folder`` that its run record does
    not prove the runtime's, as a path relative to ``folder`` (in a folder: the first such thing
    inside it); None when every one there is."""
    record = RunRecord.read(folder)
    for name in names:
        found = folder.entry(name) if record_path(name) else None
        if found is None or record.owns(name):
            continue
        if found.kind == "folder":  # name the file (or link) inside that is not the runtime's
            for rel, entry in sorted(walk(folder, name), key=lambda item: item[0]):
                if entry.kind != "folder" and not record.owns_entry(rel, entry):
                    return rel
        return name
    return None


def foreign_file(folder, names) -> str | None:
    """The first file (or folder, or link) under ``names`` in ``folder`` that its run record does
    not prove the runtime's, as a path; None when every one there is."""
    folder = as_folder(folder)
    found = first_foreign(folder, names)
    return None if found is None else folder.path(found)


def check_owned(folder, names) -> None:
    """Refuse (:class:`~iterreduce.exceptions.ForeignFileError`, naming the file) an output
    folder holding a file under ``names`` that the runtime cannot prove it wrote (a link, at
    any depth, never is)."""
    folder = as_folder(folder)
    found = first_foreign(folder, names)
    if found is None:
        return
    if folder.kind(found) == "link":
        why = "a link, which this tool never makes nor follows"
    elif folder.kind(RECORD_NAME) == "file":
        why = f"no record of it in {folder.path(RECORD_NAME)}"
    else:
        why = (f"the folder has no run record {RECORD_NAME}: another tool's files, or a run of a version of this "
               f"tool that kept none")
    raise ForeignFileError(f"{folder.path(found)}: in the way of this run's files, and not provably written by a run "
                           f"of this tool ({why}); it is left as it is: choose another output folder (--out), or move "
                           f"it away")


def claim(folder, names) -> None:
    """Record that a run is about to write ``names`` in ``folder`` (call it holding the lock,
    after :func:`check_owned`): what is found under them later is the runtime's."""
    record = RunRecord.read(folder)
    record.claimed |= set(names)
    record.write()


def settle(folder, names) -> None:
    """Record what a run left under those of ``names`` in ``folder`` that were claimed
    (:func:`claim`) (file sizes and times), at its end. Names not claimed are left out: a run
    refused before it claimed anything records nothing."""
    folder = as_folder(folder)
    if folder.kind(".") != "folder":
        return
    record = RunRecord.read(folder)
    claimed = [name for name in names if name in record.claimed]
    if claimed:
        record.take_inventory(claimed)
        record.write()


def _remove_listed_file(folder: Folder, rel: str) -> None:
    """Delete ``rel`` of ``folder``, a file its run record lists, only where it is a plain file:
    a folder there (a record calling a folder a file) is left, with a warning naming the record."""
    found = folder.entry(rel)
    if found is None:
        return
    if found.kind == "file":
        folder.remove_file(rel)
    else:
        where = folder.path(RECORD_NAME)
        warn_once(where, f"{where}: lists {shown(rel)} as a file, but it is not a plain file: not deleted as one")


def remove_owned(folder) -> bool:
    """Delete what ``folder``'s run record proves the runtime's (files as recorded, what is
    under names claimed by a move cut short, then the recorded folders left empty); the record
    and the folder go too when nothing else is left. Returns whether the folder is gone.
    Anything else in it stays, byte for byte: a name outside the folder, and anything reached
    through a link, at any depth, is never touched; a folder whose record is missing or
    unreadable is left whole."""
    folder = as_folder(folder)
    record = RunRecord.read(folder)
    if not (record.files or record.claimed or record.folders):
        return False
    for rel in sorted(record.files):
        if record.owns(rel):
            _remove_listed_file(folder, rel)
    for name in sorted(record.claimed):
        for rel, entry in sorted(entries_under(folder, name), key=lambda item: -item[0].count("/")):  # deepest first
            if entry.kind == "folder":
                with contextlib.suppress(OSError):  # not empty: something not the runtime's is in it
                    folder.remove_folder(rel)
            elif entry.kind == "file":
                folder.remove_file(rel)
    for rel in sorted(record.folders, key=lambda r: -r.count("/")):  # the deepest first
        with contextlib.suppress(OSError):  # not empty: something not the runtime's is in it
            folder.remove_folder(rel)
    if any(name != RECORD_NAME for name, _ in folder.entries()):
        record.claimed = set()
        record.files = {k: v for k, v in record.files.items() if record.owns(k)}
        record.folders = {k for k in record.folders if folder.kind(k) == "folder"}
        record.write()
        return False
    folder.remove_file(RECORD_NAME)
    folder.remove_folder()
    return True


def remote_claim(fs: pafs.FileSystem, path: str, names) -> None:
    """:func:`claim` in the folder ``path`` of ``fs`` (HDFS)."""
    claim(ArrowFolder(fs, path), names)


def remote_foreign(fs: pafs.FileSystem, path: str, names) -> str | None:
    """:func:`first_foreign` in the folder ``path`` of ``fs`` (HDFS): a path relative to it."""
    return first_foreign(ArrowFolder(fs, path), names)
