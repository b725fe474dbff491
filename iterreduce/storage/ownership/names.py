"""The names of the files the ownership rules write, and of the runtime's own files in a run's
output folder (see :mod:`iterreduce.storage.ownership`)."""

from __future__ import annotations

from ..runlog import LOG_NAME

#: The lock file in a run's output folder and in a shard folder being written (:mod:`.locks`).
LOCK_NAME = ".iterreduce.lock"
#: The run record in a run's output folder and in each ``previous/N`` (:mod:`.records`).
RECORD_NAME = ".iterreduce-files.json"
#: The shard manifest beside a set of shards (:mod:`.shardsets`). A leading ``_``, like Hadoop's
#: ``_SUCCESS``: Spark, Hive and pyarrow's dataset readers pass over it.
MANIFEST_NAME = "_iterreduce_shards.json"
#: Files of the runtime's own bookkeeping in an output folder: never another's, never moved.
BOOKKEEPING = (LOCK_NAME, RECORD_NAME)
#: Where earlier runs' files are kept in an output folder: ``previous/1``, ``2``, ... (the highest is the newest).
PREVIOUS = "previous"
#: What a run of the runtime writes in its output folder (:func:`iterreduce.launch.local.run_local`).
RUN_FILES = (LOG_NAME, "checkpoints", "logs", "job.json", "error.txt", "master.json")
#: Suffix of a gone holder's lock moved aside to be deleted (:mod:`.remote_locks`). Not durable's
#: ``.old``: :func:`~iterreduce.storage.durable.restore` would move that back as a backup.
STALE_SUFFIX = ".stale"
