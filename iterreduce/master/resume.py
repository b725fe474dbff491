"""Where a run starts: what a checkpoint must match to be resumed, and which one it continues from."""

from __future__ import annotations

import hashlib
import json
import logging

from ..exceptions import JobFailed
from ..program import step_to_json
from . import checkpoint

log = logging.getLogger("iterreduce.master")  # a part of the master: its records are the master's


def job_fingerprint(program: str, program_config: dict, seed: int, shards: list[dict], steps: list) -> str:
    """What a checkpoint must match to be resumed: same program, config, seed, data and schedule."""
    return hashlib.sha256(json.dumps(
        [program, program_config, seed, [(s["rows"], s["features"]) for s in shards],
         [step_to_json(st) for st in steps]], sort_keys=True, default=str).encode()).hexdigest()


def checkpoint_to_resume(directory: str | None, fingerprint: str, resume: bool, resume_own: bool,
                         run_id: str) -> str | None:
    """The checkpoint in ``directory`` a run continues from; None: it starts afresh. ``resume``
    (the user's): the newest of this job's (``fingerprint``), else the newest of any, which
    :func:`load_checkpoint` refuses. ``resume_own`` (a restart of run ``run_id``): the newest
    this run wrote."""
    ckpt = None
    if resume and directory:
        # The newest of this job's checkpoints; else the newest of any, which is refused on loading.
        ckpt = checkpoint.latest(directory, fingerprint) or checkpoint.latest(directory)
    elif resume_own and directory:
        ckpt = _own_checkpoint(directory, fingerprint, run_id)
    if ckpt is None and resume:
        log.warning("resume asked for, but no checkpoint in %s: starting afresh", directory)
    return ckpt


def _own_checkpoint(directory: str, fingerprint: str, run_id: str) -> str | None:
    """The newest checkpoint run ``run_id`` wrote, for a restart of it: never another
    submission's checkpoint of the same job (it would continue someone else's run)."""
    if not run_id:
        log.warning("a restart without a run id cannot tell its own checkpoints in %s from another "
                    "submission's: starting at step 0", directory)
        return None
    ckpt = checkpoint.latest(directory, fingerprint, run=run_id)
    if ckpt is None:
        log.info("no checkpoint of this run (%s) in %s: starting at step 0", run_id, directory)
    return ckpt


def load_checkpoint(ckpt: str, fingerprint: str) -> tuple[dict, dict]:
    """Checkpoint ``ckpt``'s header and arrays; :class:`JobFailed` when it is of another job."""
    header, arrays = checkpoint.load(ckpt)
    if header.get("fingerprint") != fingerprint:
        raise JobFailed(f"{ckpt}: checkpoint is of another job (program, configuration, seed, shards or "
                        f"schedule differ); use a new output directory or drop --resume")
    return header, arrays
