"""The master: it holds the job's parameters and drives its schedule, superstep by superstep
(:mod:`.master`), serves the workers over gRPC (:mod:`.service`), and keeps track of them
(:mod:`.membership`), of the current step (:mod:`.rounds`), of the tasks it sends
(:mod:`.broadcast`) and the updates it reads (:mod:`.pushes`), and of checkpoints
(:mod:`.checkpoint`, :mod:`.resume`), and serves the job's live page (:mod:`.livepage`); its
configuration is :mod:`.config`'s. ``python -m iterreduce.master JOB.json`` serves one job."""

from .config import MasterConfig, new_run_id
from .master import EXIT_DATA_ERROR, JOB_ERRORS, Master, main

__all__ = ["EXIT_DATA_ERROR", "JOB_ERRORS", "Master", "MasterConfig", "main", "new_run_id"]
