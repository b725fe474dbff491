"""Every error the runtime raises on purpose, under one base class.

A caller (a command line, a launcher) catches :class:`IterReduceError` to tell a
job's failure, whose message names the file, shard or setting at fault, from a
bug. Each class also keeps the built-in base it always had (``ValueError`` for
bad input, ``RuntimeError`` for a failed operation), so ``except ValueError``
still works.
"""


class IterReduceError(Exception):
    """Base class of the runtime's errors."""


#: How every launcher words the end of a job stopped by a :class:`DataError` (the local
#: launcher's error, a YARN application's diagnostics), so callers can tell it from a crash.
STOPPED_ON_BAD_DATA = "the job stopped on bad data"


class DataError(IterReduceError, ValueError):
    """Input data that cannot be used. Raised by a worker (or a program's worker half), it
    is reported to the master, which stops the job with its message: bad data is never
    retried as a process failure, since a new process would read the same bytes."""


class ShardError(DataError):
    """A shard that cannot be used: unreadable, empty, or of the wrong type or shape."""


class TableError(IterReduceError, ValueError):
    """A table source that cannot be used as written: an unknown key, a bad value, or a
    filter expression that is not allowed. (What is wrong in the data is a ShardError.)"""


class CheckpointError(IterReduceError, ValueError):
    """A checkpoint that is missing, unreadable or of another job."""


class CheckpointTimeout(TimeoutError):
    """A checkpoint write that did not end in time (an HDFS client can wait forever on a DataNode
    lost mid-write). Not a job error: a new process, such as YARN's next attempt of the master,
    writes where this one could not, resuming from the newest complete checkpoint."""


class WireError(IterReduceError, ValueError):
    """A malformed or oversized tensor stream."""


class JobFailed(IterReduceError, RuntimeError):
    """The job cannot go on (no workers, bad shards, a program error)."""


class LocalJobError(IterReduceError, RuntimeError):
    """A job on the local mini-cluster failed; the message says why and where the logs are."""


class MasterKilled(LocalJobError):
    """The master process died from a signal (``kill -9``, the out-of-memory killer): the job
    can be continued from ``checkpoint``, the newest checkpoint (None when none was written)."""

    def __init__(self, message: str, checkpoint: str | None):
        super().__init__(message)
        self.checkpoint = checkpoint


class YarnError(IterReduceError, RuntimeError):
    """A YARN operation failed; the message says which and why."""


class EnvPackError(IterReduceError, RuntimeError):
    """The Python environment cannot be packed for the containers."""


class AppSpecError(IterReduceError, ValueError):
    """A YARN application spec that cannot be built (skein refuses a value, or no Python is given)."""


class ForeignFileError(IterReduceError, ValueError):
    """An output folder holds a file the runtime cannot prove it wrote, where the runtime would
    write, move or delete: refused, naming the file; the file is left byte for byte as it was
    (see :mod:`iterreduce.storage.ownership`)."""


class InputInsideOutput(IterReduceError, ValueError):
    """An input of a run lies inside what the run deletes, moves or overwrites in its output folder."""


class OutputBusy(IterReduceError, RuntimeError):
    """Another run is writing into the output folder (it holds the folder's lock): refused at
    once, naming the folder and the holder (see :func:`iterreduce.storage.ownership.hold`)."""


class OutputExists(ForeignFileError):
    """A file is already at the path a command was told to write (``dbn predict --out``), and
    the caller did not ask to replace it: refused before anything is computed, naming the file,
    which is left byte for byte as it was (see :func:`iterreduce.storage.filesystems.check_output_file`)."""


class HadoopConfigError(IterReduceError, ValueError):
    """The Hadoop client configuration (``$HADOOP_CONF_DIR``) cannot be read, or does not fit
    the cluster or the credentials at hand; the message names the file or setting."""


class HdfsAccessError(IterReduceError, OSError):
    """HDFS refused this process (no Kerberos ticket, an expired delegation token, a client
    configured otherwise than the cluster, ...) or could not be reached: not a fault of the
    data. The message names the file and says what to do (see :mod:`iterreduce.storage.kerberos`)."""
