"""The master's configuration (:class:`MasterConfig`): everything a job's master needs, as the
launcher writes it to the job file."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

from ..specification import Specification

#: where a step's updates are reduced: by the master, or by the workers among themselves
REDUCE_CHOICES = ("master", "workers")
#: What a step does with the unfinished shards of a worker lost in it: "skip" goes on without them
#: (they sit the step out); "redo" has the live workers do them within the step, so that the model is
#: bit-identical to an undisturbed run whatever comes and goes (a shard's update depends on the
#: step's parameters, the shard and a seed of (job, step, shard) alone). A program whose steps need
#: every shard (Program.every_shard_every_step) always redoes them.
LOST_SHARDS_CHOICES = ("skip", "redo")

def new_run_id() -> str:
    """A fresh run id (see :attr:`MasterConfig.run_id`): 32 random hex digits."""
    return uuid.uuid4().hex


@dataclass
class MasterConfig(Specification):
    """Everything the master needs; JSON-friendly (the launcher writes it to a file, read back with
    :meth:`~iterreduce.specification.Specification.from_dict`)."""

    source_name = "job file"  # where the settings come from, in errors (a class attribute, not a field)

    program: str
    program_config: dict
    shards: list[str]
    workers: int
    token: str = field(repr=False)  # never in a log, a traceback or an error message
    output: str
    seed: int = 0
    host: str = "127.0.0.1"   # the address to bind ("0.0.0.0" in a YARN container)
    port: int = 0
    advertise_host: str | None = None  # the host workers dial, when it differs from ``host``
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    checkpoint_keep: int = 2
    resume: bool = False      # the user's: continue from the newest checkpoint of this job, whichever run wrote it
    #: This run's identity (a submission's, or a new local run's): written in every checkpoint it
    #: takes, so that a restart of the same run (``resume_own``) can tell its own from another's.
    run_id: str = ""
    #: A restart of this same run (a new attempt of its YARN application master): continue from
    #: the newest checkpoint of this job whose header carries ``run_id``; none: start at step 0.
    #: Another submission's checkpoints of the same job, in the same folder, are never resumed.
    resume_own: bool = False
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 10.0
    start_timeout: float = 300.0
    #: Start once this many workers registered, the others joining as they come (0: wait for all
    #: of ``workers``, and start with any at ``start_timeout``); fewer by ``start_timeout``: the job fails.
    min_workers: int = 0
    float16_wire: bool = False
    reduce: str = "master"  # where the updates are reduced: "master", or "workers" (see iterreduce.transport.exchange)
    lost_shards: str = "skip"  # a lost worker's unfinished shards: see LOST_SHARDS_CHOICES
    #: A worker holding several shards pushes one update for them, their sample-weighted mean, in
    #: star rounds of steps whose reduce reads only that mean (Program.averages): one update's
    #: bytes through the master instead of one a shard, and a program may make the mean where its
    #: results are (a GPU). One worker holding every shard: the bits of one update a shard. Several:
    #: a group's mean rounds once more, so the model's last bits depend on which shards each worker
    #: held (iterreduce.program.combine_updates): with "redo", a lost worker's shards moving to
    #: another may change them.
    combine: bool = False
    name: str = ""          # the job's name, shown on its page
    ui: bool = True         # serve the job's live page (iterreduce.webui) while it runs
    ui_host: str = "127.0.0.1"  # the page's bind address: this machine only (on YARN too: skein's AM proxies it)
    ui_port: int = 0

    def __post_init__(self):
        for name in ("heartbeat_interval", "heartbeat_timeout", "start_timeout"):  # seconds a wait lasts
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} = {value!r}: expected a finite number of seconds above 0")
        if self.reduce not in REDUCE_CHOICES:
            raise ValueError(f"reduce = {self.reduce!r}: expected one of {', '.join(map(repr, REDUCE_CHOICES))}")
        if not 0 <= self.min_workers <= self.workers:
            raise ValueError(f"min_workers = {self.min_workers}: expected 0 to workers ({self.workers})")
        if self.lost_shards not in LOST_SHARDS_CHOICES:
            raise ValueError(f"lost_shards = {self.lost_shards!r}: expected one of "
                             f"{', '.join(map(repr, LOST_SHARDS_CHOICES))}")
