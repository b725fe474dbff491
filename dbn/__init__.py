"""Deep Belief Networks trained data-parallel on Hadoop YARN or a local mini-cluster.

The package has three rooms: :mod:`dbn.model` (the maths: backend, RBM, network,
the DBN estimator, model files), :mod:`dbn.data` (MNIST, sharding, input checks)
and :mod:`dbn.jobs` (the job spec, the IterativeReduce program, running a job
in-process, on a local mini-cluster or on YARN, the MNIST evaluation, plots,
benchmarks); :mod:`dbn.cli` sits on top and :mod:`dbn.errors` holds every error.
"""

from .errors import BackendError, ConfigError, DataError, DBNError, ModelFileError
from .model.backend import Backend, get_backend, gpu_available
from .model.estimator import DBN
from .model.network import Network
from .model.rbm import RBM

__all__ = [
    "Backend", "BackendError", "ConfigError", "DBN", "DBNError", "DataError", "ModelFileError", "Network", "RBM",
    "get_backend", "gpu_available",
]
__version__ = "0.1.0"
