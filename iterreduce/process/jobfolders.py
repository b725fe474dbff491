"""The folders a local launcher makes for one job, and their removal.

The launcher makes two: its workers' scratch folder (their local files, such as streamed row
files: ``$ITERREDUCE_LOCAL_DIR`` in their environment) and, where the host has one, the
shared-memory folder the master and the workers pass tensors through
(``$ITERREDUCE_SHARED_DIR``, :mod:`iterreduce.transport.sharedmem`). It hands both to its children
and removes them at the job's end (:func:`remove`). A launcher killed with SIGKILL cannot:
its master, which notices within the lifeline's poll, removes them instead
(:func:`remove_orphaned`), and so do its workers: where the launcher and the master die together
(:func:`remove_if_launcher_gone`), the workers are the job's last processes. Each process that
notices removes them: removal is idempotent and never goes through a link, and once a folder is
gone no process of the job can write in it again, so the last to notice leaves nothing behind.
On YARN no launcher hands out such folders, and there is nothing to remove.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time

from ..storage.rowfile import LOCAL_DIR_VAR, local_directory
from ..transport import sharedmem
from . import lifeline

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
    """Remove the folders a launcher that died gave this process (its master or a worker) in the
    environment: only folders as :func:`make` makes them (:func:`made_here`). The job's other
    processes may write in them until their own lifeline stops them, so this tries again for up to
    ``settle_s`` seconds. Several processes may run this at once: each ends once the folders are gone."""
    scratch = os.environ.get(LOCAL_DIR_VAR, "")
    shared = os.environ.get(sharedmem.SHARED_DIR_VAR, "")
    scratch = scratch if made_here(scratch, SCRATCH_PREFIX) else None
    shared = shared if made_here(shared, sharedmem.FOLDER_PREFIX) else None
    deadline = time.monotonic() + settle_s
    while True:
        remove(scratch, shared)
        if not any(path and os.path.lexists(path) for path in (scratch, shared)) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def remove_if_launcher_gone(wait_s: float = 1.0) -> None:
    """For a process of the job that ends because its master is gone: where the launcher is gone
    too (both killed together, so neither removes the job's folders), remove them
    (:func:`remove_orphaned`). The launcher's end may show a moment after the master's (a loaded
    machine): this waits up to ``wait_s`` seconds for it; a launcher that lives on stops this
    process sooner (it stops the job when its master is gone) and removes the folders itself.
    Nothing where no launcher started the process (YARN)."""
    if lifeline.launcher_gone(wait_s):
        remove_orphaned()
