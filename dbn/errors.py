"""Every error dbn raises on purpose, under one base class.

The command line prints any :class:`DBNError` (and the runtime's
:class:`iterreduce.exceptions.IterReduceError`) as ``dbn: error: <message>`` and
exits with status 2. Each class also keeps its built-in base (``ValueError`` for
bad input, ``RuntimeError`` for a device that cannot be used), so code that
catches those still works.
"""

from iterreduce.exceptions import DataError as RuntimeDataError
from iterreduce.exceptions import JobFailed


class DBNError(Exception):
    """Base class of dbn's errors; the message names the file, section, key or value at fault."""


class ConfigError(DBNError, ValueError):
    """A job spec that cannot be used; the message names file, section and key."""


class DataError(DBNError, RuntimeDataError):
    """Input data that cannot be trained on (wrong shape, NaN, out of range, bad labels).

    A runtime data error too: raised in a worker, it stops the job instead of being retried."""


class MnistError(DBNError, ValueError):
    """MNIST files that are missing, truncated or corrupt."""


class ModelFileError(DBNError, ValueError):
    """A model file that is missing, truncated, corrupt or of another format."""


class BackendError(DBNError, RuntimeError):
    """A device that cannot be used (no CuPy, no GPU)."""


class UsageError(DBNError):
    """A request the command cannot carry out, e.g. a missing optional package."""


class TrainingDiverged(DBNError, JobFailed):
    """Training that went to NaN or infinity (a learning rate too high for the data): stopped at
    the first epoch it shows, naming the layer, the epoch and the setting to lower. A job
    failure of the runtime's too, so a distributed job ends with this message."""
