"""A program whose module takes ``$SLOW_IMPORT_S`` seconds to import, as one importing CuPy may: longer
than the heartbeat timeout of the tests' jobs."""

import os
import time

from softmax_program import SoftmaxRegression

time.sleep(float(os.environ.get("SLOW_IMPORT_S", "0")))


class SlowImportSoftmax(SoftmaxRegression):
    """Softmax regression, named by this module: a worker imports the module when it registers."""
