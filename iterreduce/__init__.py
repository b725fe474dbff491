"""IterativeReduce: a generic master/worker runtime for data-parallel iterative programs.

A master (:mod:`.master`) averages what workers (:mod:`.worker`) compute on their own
data shards, superstep by superstep, over gRPC (:mod:`.transport`), or has the workers average
among themselves, each its own rows (:mod:`.transport.exchange`); a :class:`.program.Program`
says what a superstep is, and names the :class:`.program.Reader` of its shards: the runtime reads
no data format itself. The same code runs as a local mini-cluster of processes
(:mod:`.launch.local`) or in YARN containers (:mod:`.launch.yarn`), with its files on local
disk or HDFS (:mod:`.storage`). It knows nothing about DBNs.
"""

import os
from pathlib import Path

#: The folder that holds this package (a checkout, or site-packages): the processes a launcher starts
#: put it first on their PYTHONPATH, to import the runtime from where the launcher does.
PACKAGES_ROOT = str(Path(__file__).resolve().parent.parent)
#: Environment variables that set a process's BLAS and OpenMP threads (read when the library loads).
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: Environment variable with the log level of a master or worker process (default INFO; DEBUG
#: adds, e.g., each superstep's compute seconds by worker to the master's log).
LOG_LEVEL_VAR = "ITERREDUCE_LOG_LEVEL"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def log_level() -> str:
    """The log level :data:`LOG_LEVEL_VAR` names, INFO when unset; ValueError names a wrong one."""
    level = os.environ.get(LOG_LEVEL_VAR, "").strip().upper() or "INFO"
    if level not in LOG_LEVELS:
        raise ValueError(f"{LOG_LEVEL_VAR}={os.environ[LOG_LEVEL_VAR]!r}: not a log level ({', '.join(LOG_LEVELS)})")
    return level
