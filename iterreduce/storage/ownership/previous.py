"""Earlier runs kept in ``previous/N`` of an output folder instead of deleted (:func:`set_aside`),
and pruned to the newest few once a new run has succeeded (:func:`prune_previous`): only what a
run record proves the runtime's moves or goes. Written once over a :class:`~.folders.Folder`:
a local run's folder and a YARN job's folder on HDFS (:func:`remote_set_aside`)."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import pyarrow.fs as pafs

from ...exceptions import ForeignFileError
from .claims import check_owned, remove_owned
from .folders import ArrowFolder, Folder, as_folder
from .names import PREVIOUS, RECORD_NAME, RUN_FILES
from .records import RunRecord

log = logging.getLogger(__name__)

#: Earlier runs that ``previous/`` keeps once a new run has succeeded.
KEEP_PREVIOUS = 3


def _number(name: str) -> bool:
    """Whether the folder name ``name`` (read from a listing) is one of ``previous/``'s numbers:
    ASCII digits only (``str.isdigit`` also takes ``²`` and ``٣``, which ``int`` refuses or reads)."""
    return name.isascii() and name.isdigit()


def _previous_folder(out: Folder, make: bool) -> Folder | None:
    """``out/previous``, made first where ``make``; None where there is none. A link (or a file)
    there is not a folder of the runtime's, and nothing goes through it: with ``make`` it is
    refused (:class:`~iterreduce.exceptions.ForeignFileError`, naming it), else passed over."""
    if make:
        with contextlib.suppress(FileExistsError):  # perhaps someone else's folder: a numbered folder is added to it
            out.make_folder(PREVIOUS)
    if out.kind(PREVIOUS) == "folder":
        return out.sub(PREVIOUS)
    if make:
        raise ForeignFileError(f"{out.path(PREVIOUS)}: a link or a file, not a folder, where earlier runs are kept; "
                               f"nothing is moved through a link, and it is left as it is: move it away, or choose "
                               f"another output folder (--out)")
    return None


def _earlier_runs(previous: Folder) -> list[str]:
    """The folders :func:`set_aside` made in ``previous``, oldest first: numbered plain folders
    (not links) holding a run record that is a plain file."""
    runs = [name for name, _ in previous.entries()
            if _number(name) and previous.kind(f"{name}/{RECORD_NAME}") == "file"]
    return sorted(runs, key=int)


def move_aside(out: Folder, move, keep_in_place=()) -> Folder | None:
    """:func:`set_aside` in any :class:`~.folders.Folder`; returns the new ``previous/N``, or None."""
    check_owned(out, (*move, *keep_in_place))
    moving = [name for name in move if out.entry(name) is not None]
    linking = [name for name in keep_in_place if out.kind(name) == "file"]
    if not moving and not linking:
        return None
    previous = _previous_folder(out, make=True)
    number = 1 + max((int(name) for name in _earlier_runs(previous)), default=0)
    while previous.entry(str(number)) is not None:
        number += 1  # a numbered folder of someone else's: passed over
    aside_rel = f"{PREVIOUS}/{number}"
    out.make_folder(aside_rel)
    aside = RunRecord(out.sub(aside_rel), claimed=[*moving, *linking])
    aside.write()  # first: a move cut short leaves nothing there that is not provably the runtime's
    for name in linking:  # first: a failure here has moved nothing yet
        out.link_or_copy(name, f"{aside_rel}/{name}")
    record = RunRecord.read(out)
    for name in moving:
        out.move(name, f"{aside_rel}/{name}")
        record.forget(name)
    record.write()
    aside.take_inventory([*moving, *linking])
    aside.write()
    return aside.folder


def set_aside(out, move=None, keep_in_place=()) -> Path | None:
    """Keep an earlier run's files in a new folder ``out/previous/N`` (N: one more than the
    highest of the folders it made there, passing over any other) instead of deleting them;
    returns it, or None when there was nothing.

    ``move`` (names in ``out``; default :data:`~.names.RUN_FILES`) move there: a new run starts
    without them. ``keep_in_place`` (files) are hard-linked there (copied where links fail) and
    stay where they are until the new run replaces them atomically: the link then still holds
    the earlier bytes. Only files the run record of ``out`` proves a run's (:mod:`.records`) are
    moved: any other under those names is refused
    (:class:`~iterreduce.exceptions.ForeignFileError`, naming it) before anything moves. The
    new folder gets a run record of what it holds, which :func:`prune_previous` goes by.
    """
    aside = move_aside(as_folder(out), RUN_FILES if move is None else move, keep_in_place)
    return None if aside is None else Path(aside.path())


def remote_set_aside(fs: pafs.FileSystem, path: str, names) -> str | None:
    """:func:`set_aside` of ``names`` in the folder ``path`` of ``fs`` (HDFS); returns the new
    ``previous/N``'s path, or None when nothing was there. Nothing is deleted."""
    aside = move_aside(ArrowFolder(fs, path), names)
    return None if aside is None else aside.path()


def prune_previous(out, keep: int = KEEP_PREVIOUS) -> None:
    """Delete all but the newest ``keep`` earlier runs that :func:`set_aside` put in
    ``out/previous`` (call it once a new run has written its own files, never before). Only
    folders with a run record count, and only what the record proves the runtime's goes:
    anything else there (a ``previous/2019`` of the user's, a file added to a ``previous/N``)
    stays byte for byte."""
    previous = _previous_folder(as_folder(out), make=False)  # a link there: not followed
    if previous is None:
        return
    runs = _earlier_runs(previous)
    for name in runs[:max(0, len(runs) - keep)]:
        old = previous.sub(name)
        try:
            remove_owned(old)
        except OSError as exc:  # the run that prunes has succeeded: an earlier run's folder never fails it
            log.warning("%s: not pruned (%s), left as it is; its run record: %s", old.path(), exc,
                        old.path(RECORD_NAME))
