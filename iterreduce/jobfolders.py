"""The folders a local launcher makes for one job, and their removal.

The launcher makes two: its workers' scratch folder (their local files, such as streamed row
files: ``$ITERREDUCE_LOCAL_DIR`` in their environment) and, where the host has one, the
shared-memory folder the master and the workers pass tensors through
(``$ITERREDUCE_SHARED_DIR``, :mod:`iterreduce.sharedmem`). It hands both to its children
and removes them at the job's end (:func:`remove`). A launcher killed with SIGKILL cannot:
its master, which notices within the lifeline's poll, removes them instead
(:func:`remove_orphaned`).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time

from . import sharedmem
from .rowfile import LOCAL_DIR_VAR, local_directory

SCRATCH_PREFIX = "iterreduce-local-"


def make(shared_memory: bool) -> tuple[str, str | None]:
    """A new scratch folder, and a shared-memory folder where ``shared_memory`` is asked and
    this host has one (else None)."""
    scratch = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=local_directory())
    shared = sharedmem.make_folder() if shared_memory and sharedmem.available() else None
    return scratch, shared


def remove(scratch: str | None, shared: str | None) -> None:
    """Remove the folders :func:`make` made (the shared one: only the names a run writes there)."""
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    if shared:
        sharedmem.remove_folder(shared)


def made_here(path: str, prefix: str) -> bool:
    """Whether ``path`` is a folder as :func:`make` makes them: named ``prefix...``, a real
    directory (not a link) of this user that no one else may enter (mkdtemp's 0700)."""
    if not path or not os.path.basename(path).startswith(prefix):
        return False
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def remove_orphaned(settle_s: float = 2.0) -> None:
    """Remove the folders a launcher that died gave this process (its master) in the environment:
    only folders as :func:`make` makes them (:func:`made_here`). The workers may write in them
    until their own lifeline stops them, so this tries again for up to ``settle_s`` seconds."""
    scratch = os.environ.get(LOCAL_DIR_VAR, "")
    shared = os.environ.get(sharedmem.SHARED_DIR_VAR, "")
    scratch = scratch if made_here(scratch, SCRATCH_PREFIX) else None
    shared = shared if made_here(shared, sharedmem.FOLDER_PREFIX) else None
    deadline = time.monotonic() + settle_s
    while True:
        remove(scratch, shared)
        if not any(path and os.path.exists(path) for path in (scratch, shared)) or time.monotonic() > deadline:
            return
        time.sleep(0.2)
