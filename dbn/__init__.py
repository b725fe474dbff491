"""Deep Belief Networks trained data-parallel on Hadoop YARN or a local mini-cluster."""

from .backend import Backend, BackendError, get_backend, gpu_available
from .model import DBN
from .network import Network
from .persist import ModelFileError
from .rbm import RBM
from .validation import DataError

__all__ = [
    "Backend", "BackendError", "DBN", "DataError", "ModelFileError", "Network", "RBM",
    "get_backend", "gpu_available",
]
__version__ = "0.1.0"
