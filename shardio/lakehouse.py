"""Lakehouse tables told apart from plain folders of Parquet files.

A Delta Lake, Apache Iceberg or Apache Hudi table is data files plus a log or metadata folder
that says which of them are the table now: an overwrite, a delete or an update leaves the old
files on disk (until a VACUUM or an expiry) and only the log says they are gone. Read as plain
Parquet, such a folder trains on rows the table no longer holds. :func:`check_not_lakehouse`
refuses it, naming the format and what to do, before anything is read. What a table's log or
metadata names must lie in the table's folder (:func:`inside_table`, :func:`outside_table`).
"""

from __future__ import annotations

import datetime
import functools
import os
import posixpath

import pyarrow.fs as pafs

from iterreduce.exceptions import TableError

#: The folder each format keeps beside its data files, and the format's name.
MARKERS = {"_delta_log": "Delta Lake", "metadata": "Apache Iceberg", ".hoodie": "Apache Hudi"}
#: The formats read in place, by the ``format`` that reads them.
READ_AS = {"Delta Lake": "delta", "Apache Iceberg": "iceberg"}
#: How an Iceberg ``metadata`` folder is told from a folder that happens to bear that name.
ICEBERG_FILES = (".metadata.json", "version-hint.text")
#: Folders above a table's that are looked at (a partition folder of a lakehouse table, say).
MAX_LEVELS_UP = 8
#: The setting under which a table's log or metadata may name files outside the table's folder.
ALLOW_OUTSIDE = "[data] allow_outside_files = true"


def lakehouse_format(fs: pafs.FileSystem, path: str) -> tuple[str, str] | None:
    """``(format name, marker folder)`` of the lakehouse table whose folder is ``path`` or one
    of the :data:`MAX_LEVELS_UP` folders above it; None for a plain folder or file."""
    folder = path.rstrip("/") or "/"
    for _ in range(MAX_LEVELS_UP + 1):
        markers = [posixpath.join(folder, name) for name in MARKERS]
        for info in fs.get_file_info(markers):
            if info.type != pafs.FileType.Directory:
                continue
            name = MARKERS[info.base_name]
            if name != "Apache Iceberg" or _iceberg_metadata(fs, info.path):
                return name, info.path
        parent = posixpath.dirname(folder)
        if parent == folder or not parent:
            return None
        folder = parent
    return None


def _iceberg_metadata(fs: pafs.FileSystem, folder: str) -> bool:
    selector = pafs.FileSelector(folder, allow_not_found=True)
    return any(info.base_name.endswith(ICEBERG_FILES) for info in fs.get_file_info(selector))


def check_not_lakehouse(fs: pafs.FileSystem, path: str, uri: str) -> None:
    """Refuse the table at ``uri`` (``path`` on ``fs``) when it is, or is inside, a lakehouse
    table: :class:`~iterreduce.exceptions.TableError` naming the format, its log or metadata
    folder and what to do."""
    found = lakehouse_format(fs, path)
    if found is None:
        return
    name, marker = found
    fmt = READ_AS.get(name)
    what = (f"read it as one with format = '{fmt}' (its table folder, {posixpath.dirname(marker)}; a filter picks "
            f"partitions)" if fmt else
            f"{name} tables are not read in place yet: write the version to train on as plain Parquet "
            f"(e.g. with Spark, df.write.parquet(...)) and name that folder")
    raise TableError(f"{uri}: part of {'an' if name[0] in 'AEIOU' else 'a'} {name} table ({marker} says which of "
                     f"its files are the table now): read as plain Parquet it would train on rows the table no longer "
                     f"holds, so it is refused; {what}")


def inside_table(path: str, root: str, fs: pafs.FileSystem) -> bool:
    """Whether ``path``, as it is opened, lies in the folder ``root``: what a table's log or metadata
    names must be the table's own files. On local disk the kernel follows each link and takes the
    ``..`` after it where it comes (the real path of ``path`` as written), while a URL reader
    (delta-rs) takes ``..`` by text first: ``path`` must stay in ``root`` both ways, so that the
    check is of the file whichever of them opens it. HDFS has no links (and its NameNode refuses a
    ``..`` in a path), nor have object stores: there ``..`` taken by text suffices."""
    if not isinstance(fs, pafs.LocalFileSystem):
        return _under(posixpath.normpath(path), posixpath.normpath(root))
    base = os.path.realpath(root)
    return all(_under(os.path.realpath(way), base) for way in (path, posixpath.normpath(path)))


def _under(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip("/") + "/")


def link_out(path: str, root: str, fs: pafs.FileSystem) -> str | None:
    """The first link on ``path`` (in the folder ``root`` by its text) that leads out of ``root``;
    None where none does, and off local disk, which has no links."""
    if not isinstance(fs, pafs.LocalFileSystem) or not _under(posixpath.normpath(path), posixpath.normpath(root)):
        return None
    base, here = os.path.realpath(root), posixpath.normpath(root)
    for part in posixpath.relpath(posixpath.normpath(path), here).split("/"):
        here = posixpath.join(here, part)
        if os.path.islink(here) and not _under(os.path.realpath(here), base):
            return here
    return None


def check_inside(uri: str, listed_in, entry: str, path: str, root: str, fs: pafs.FileSystem, *,
                 relative: bool, allow_outside: bool) -> None:
    """Refuse ``path`` (the file ``entry`` in ``listed_in`` names; ``relative``: named relative to the
    table) unless it lies in the table's folder ``root`` (:func:`inside_table`) or the user allows
    files outside (``allow_outside``) and it leaves where the format allows: by an absolute path or
    URI, or through a link in the folder (a partition folder on another disk), never by a relative
    path's ``..``. :class:`TableError` from :func:`outside_table` otherwise (``listed_in``: a string,
    or a function that finds it, called only then)."""
    if inside_table(path, root, fs):
        return
    by_text = _under(posixpath.normpath(path), posixpath.normpath(root))
    if allow_outside and (by_text or not relative):
        return
    raise outside_table(uri, listed_in() if callable(listed_in) else listed_in, entry, absolute=not relative,
                        link=link_out(path, root, fs) if by_text else None)


def outside_table(uri: str, listed_in: str, entry: str, absolute: bool, link: str | None = None) -> TableError:
    """The error for ``entry``, a file that ``listed_in`` (a log or manifest file of the table at
    ``uri``) names outside the table's folder; ``absolute``: named by an absolute path or URI,
    which the user may allow (:data:`ALLOW_OUTSIDE`), rather than by a relative path; ``link``: the
    link in the table's folder it leads out through, which the user may allow too."""
    if link is not None:
        what = (f"it leads out of the table's folder through the link {link}: {ALLOW_OUTSIDE} reads it, where "
                f"the link is meant (a partition folder on another disk)")
    elif absolute:
        what = (f"{ALLOW_OUTSIDE} reads files outside the table's folder, where it means to (a Delta shallow "
                f"clone's, files an Iceberg table adopted)")
    else:
        what = "a path relative to the table must stay in its folder"
    return TableError(f"{uri}: {listed_in} names a file outside the table: {entry!r}; it is not read: {what}")


def parse_version(value) -> int | datetime.datetime | None:
    """A ``version`` setting as a number (a Delta version, an Iceberg snapshot id: an int >= 0) or a
    time (an ISO 8601 string, UTC unless it names its zone); None stays None. Raises
    :class:`TableError` naming it."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    if isinstance(value, str):
        try:
            when = datetime.datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)
    raise TableError(f"table source: 'version' = {value!r}: expected a version number (0, 1, ...), a snapshot id or a time "
                     f"such as '2026-11-27T10:00:00Z'")


def once_a_version(load):
    """``load(uri, version, *more)`` with the table at a version number read once: a version (a
    Delta version, an Iceberg snapshot) never changes, so a job's steps, each opening the table at
    its fixed version, share one read of its log. The newest (None) or a time is read each time."""
    @functools.lru_cache(maxsize=4)
    def at_number(uri: str, version: int, *more):
        return load(uri, version, *more)

    @functools.wraps(load)
    def loaded(uri: str, version=None, *more):
        if isinstance(version, int) and not isinstance(version, bool):
            return at_number(uri, version, *more)
        return load(uri, version, *more)
    return loaded
