"""No input of a run lies inside what the run may delete, move or overwrite.

A run rewrites named entries of its output folder (its model, log, checkpoints, shards cut from its
data, earlier runs set aside under ``previous/``): data read from one of them would be deleted or
replaced before, or while, it is read. :func:`check_inputs_outside` refuses such a run before it
touches anything, naming the setting, the input and the entry.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from urllib.parse import urlparse

from ...exceptions import InputInsideOutput


def location(where: str) -> tuple[str, str]:
    """``(file system, absolute normalised path)`` of a path or URI: a URI's scheme and authority
    (``hdfs://nn:8020``; ``""`` for local files) and its path; a local path (or ``file://`` URI)
    made absolute with its links resolved, as a run resolves its output folder."""
    parts = urlparse(where)
    if "://" in where and parts.scheme != "file":
        return f"{parts.scheme}://{parts.netloc}".lower(), posixpath.normpath("/" + parts.path.lstrip("/"))
    path = parts.path if parts.scheme == "file" else where
    return "", str(Path(path).expanduser().resolve())


def within(inner: str, outer: str) -> bool:
    """Whether ``inner`` is ``outer`` or lies under it (paths or URIs, :func:`location`)."""
    (fs_in, path_in), (fs_out, path_out) = location(inner), location(outer)
    return fs_in == fs_out and (path_in == path_out or path_in.startswith(path_out.rstrip("/") + "/"))


def check_inputs_outside(inputs: dict[str, str | None], out: str, names: tuple[str, ...]) -> None:
    """Raise :class:`~iterreduce.exceptions.InputInsideOutput` when an input (``{setting: path or
    URI}``, None for unset) is the output folder ``out``'s entry ``NAME`` for one of ``names`` (what
    the run may delete, move or overwrite there), or lies inside one."""
    for setting, given in inputs.items():
        if not given:
            continue
        for name in names:
            entry = out.rstrip("/") + "/" + name
            if within(given, entry):
                raise InputInsideOutput(
                    f"{setting} = {given!r} lies in {entry}, which this run rewrites ([output] dir {out!r}: "
                    f"its {name}): nothing was changed; move the data out of the output folder, or write the "
                    f"run elsewhere")


def check_not_within(setting: str, given: str | None, folder: str, what: str) -> None:
    """Raise :class:`~iterreduce.exceptions.InputInsideOutput` when the input ``setting`` =
    ``given`` is ``folder`` or lies inside it; ``what`` says what is done to ``folder``."""
    if given and within(given, folder):
        raise InputInsideOutput(f"{setting} = {given!r} lies in {folder}, {what}: nothing was changed; "
                                f"write elsewhere")
