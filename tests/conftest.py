"""Shared fixtures: tiny synthetic data sets and a small slice of real MNIST."""

from __future__ import annotations

import os
from itertools import product
from pathlib import Path

import numpy as np
import pytest

MNIST_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"

# The programs the tests run (tests/softmax_program.py, conftest_runtime's) live here: every process a
# test starts (a job's master and workers) imports them, and this checkout, as the test does.
_TESTS = Path(__file__).resolve().parent
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_TESTS), str(_TESTS.parent), os.environ.get("PYTHONPATH"))
                                           if p)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


class NaiveCD:
    """CD-k / persistent CD written plainly in row layout (samples x units), float64.

    It starts from a copy of ``rbm``'s current state and reads the RBM's settings.
    ``rng`` (anything with ``random(out=, dtype=)``, e.g. a copy of the RBM's NumPy
    generator) supplies the uniform numbers, drawn with the same shapes and in the
    same order as ``RBM._cd_step``: one (batch, n_hidden) array per hidden
    sampling, plus one for the persistent chain.
    """

    def __init__(self, rbm, rng):
        state = rbm.get_state()
        self.W = state["weights"].copy()
        self.a = state["visible_bias"].copy()
        self.b = state["hidden_bias"].copy()
        self.dW = state["weights_inc"].copy()
        self.da = state["visible_bias_inc"].copy()
        self.db = state["hidden_bias_inc"].copy()
        self.rbm, self.rng, self.chain = rbm, rng, None

    def _sample(self, p_rows):
        u = np.empty(p_rows.shape)  # (batch, n_hidden), filled in C order like the code's buffer
        self.rng.random(out=u, dtype=np.float64)
        return (u < p_rows).astype(np.float64)

    def step(self, v0, momentum):
        r = self.rbm
        W, a, b, B = self.W, self.a, self.b, v0.shape[0]
        h0 = sigmoid(v0 @ W + b)
        h = self.chain if (r.persistent and self.chain is not None) else h0
        for _ in range(r.cd_k):
            hs = self._sample(h)
            v_lin = hs @ W.T + a
            vk = sigmoid(v_lin) if r.visible == "bernoulli" else v_lin
            hk = sigmoid(vk @ W + b)
            h = hk
        if r.persistent:
            self.chain = self._sample(hk)
        error = float(((v0 - vk) ** 2).sum())
        lr = r.learning_rate
        self.dW = momentum * self.dW + lr * ((v0.T @ h0 - vk.T @ hk) / B - r.weight_cost * W)
        self.da = momentum * self.da + lr * (v0 - vk).sum(axis=0) / B
        self.db = momentum * self.db + lr * (h0 - hk).sum(axis=0) / B
        self.W = W + self.dW
        self.a = a + self.da
        self.b = b + self.db
        return error


@pytest.fixture(scope="session")
def naive_cd():
    """The :class:`NaiveCD` reference class (shared by the CPU and GPU tests)."""
    return NaiveCD


def bars_and_stripes(size: int = 4) -> np.ndarray:
    """All distinct size x size bars-and-stripes images, flattened (30 of them for 4x4).

    Each pattern turns on a subset of the rows (horizontal bars) or of the columns
    (vertical stripes); all-off and all-on appear in both families and are kept once.
    """
    patterns = set()
    for bits in product((0, 1), repeat=size):
        rows = np.repeat(np.array(bits)[:, None], size, axis=1)
        patterns.add(tuple(rows.ravel()))
        patterns.add(tuple(rows.T.ravel()))
    return np.array(sorted(patterns), dtype=np.float64)


@pytest.fixture(scope="session")
def bas_patterns() -> np.ndarray:
    return bars_and_stripes(4)


@pytest.fixture(scope="session")
def bas_data(bas_patterns) -> np.ndarray:
    """The 30 patterns repeated to 300 rows, in a fixed shuffled order."""
    data = np.tile(bas_patterns, (10, 1))
    return data[np.random.default_rng(123).permutation(len(data))]


REPO = Path(__file__).resolve().parents[1]
#: What a test run may leave at the checkout's top: pytest's and hypothesis's own caches.
RUN_CACHES = {".pytest_cache", ".hypothesis"}


@pytest.fixture(scope="session", autouse=True)
def _the_checkout_stays_as_it_was():
    """A test writes in its own folders, never in the checkout (the working folder of the run):
    the session ends with an error naming any file or folder that appeared at its top (once,
    an empty ``runs`` and Spark's ``spark-warehouse``)."""
    before = {p.name for p in REPO.iterdir()}
    yield
    new = sorted({p.name for p in REPO.iterdir()} - before - RUN_CACHES)
    assert not new, f"tests left {new} in the checkout {REPO}: write in tmp_path"


@pytest.fixture(scope="session", autouse=True)
def _one_blas_thread():
    """Run BLAS on one thread: on a small, busy machine a multi-threaded OpenBLAS waits on
    descheduled threads and the small products in these tests get up to 20x slower."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _downscale(images_uint8: np.ndarray) -> np.ndarray:
    """28x28 uint8 images -> 14x14 (2x2 means) float32 in [0, 1], flattened to 196 features."""
    from dbn.data.mnist import scale_images

    x = scale_images(images_uint8).reshape(-1, 14, 2, 14, 2).mean(axis=(2, 4))
    return np.ascontiguousarray(x.reshape(len(x), 196), dtype=np.float32)


@pytest.fixture(scope="session")
def mnist_small():
    """(x_train, y_train, x_test, y_test): the first 2000 training and 1000 test images of real
    MNIST, downscaled to 14x14 = 196 features in [0, 1]; labels int64."""
    from dbn.data import mnist

    if not all((MNIST_DIR / name).is_file() for name in mnist.MNIST_FILES):
        pytest.skip(f"real MNIST files not found in {MNIST_DIR}")
    data = mnist.load_mnist(MNIST_DIR, verify=True)
    return (_downscale(data.x_train[:2000]), data.y_train[:2000].astype(np.int64),
            _downscale(data.x_test[:1000]), data.y_test[:1000].astype(np.int64))


@pytest.fixture(scope="session")
def hadoop(tmp_path_factory):
    """A real single-node Hadoop 3 for the session (:class:`minihadoop.MiniHadoop`: HDFS + YARN
    in one JVM, containers as real processes), stopped at the end, also when tests fail.
    Skips only when Java 17+ or Maven is missing; when the cluster cannot start (or its
    jars cannot be fetched) the tests fail, saying why. ``DBN_HADOOP_KEEP=1`` keeps its folder
    (data and every daemon's and container's logs) for a look after the session."""
    from minihadoop import MiniHadoop
    from yarnjobs import KEEP_CLUSTERS, started

    with started(MiniHadoop(base_dir=tmp_path_factory.mktemp("hadoop"), keep=KEEP_CLUSTERS),
                 "the real Hadoop") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def hdfs(hadoop):
    """The session's HDFS (the same Hadoop as YARN's); tests each work under a directory of their own."""
    return hadoop


@pytest.fixture(scope="session")
def secure_hadoop(tmp_path_factory):
    """A Kerberos-secured single-node Hadoop 3 for the session (:class:`securehadoop.SecureHadoop`: a KDC,
    and HDFS + YARN that take only Kerberos or delegation tokens, RPC and block transfers encrypted,
    SPNEGO on the web pages), started on first use, stopped at the end. The user's ticket is in the
    cluster's own ticket cache (``secure_hadoop.env()`` names it, with ``KRB5_CONFIG`` and
    ``HADOOP_CONF_DIR``). Skips only when Java 17+ or Maven is missing; when the cluster cannot start
    the tests fail, saying why. ``DBN_HADOOP_KEEP=1`` keeps its folder, as for :func:`hadoop`."""
    from securehadoop import SecureHadoop
    from yarnjobs import KEEP_CLUSTERS, started

    with started(SecureHadoop(base_dir=tmp_path_factory.mktemp("securehadoop"), keep=KEEP_CLUSTERS),
                 "the Kerberos-secured Hadoop") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def yarn(hadoop, tmp_path_factory):
    """The session cluster as a module's tests see it (:class:`yarnjobs.Yarn`): its client environment
    in this process, skein credentials of the module's own, and one skein driver that the in-process
    CLI calls share. A module with a cluster of its own defines ``yarn`` on that one."""
    from yarnjobs import shared_driver

    with shared_driver(hadoop, tmp_path_factory.mktemp("skein")) as yarn:
        yield yarn


def pytest_itemcollected(item):
    """Each test in its group (tests/scheduling.py)."""
    import scheduling

    scheduling.mark(item)


@pytest.hookimpl(tryfirst=True)  # before -m and -k deselect any
def pytest_collection_modifyitems(config, items):
    """On xdist workers, the groups first (tests/scheduling.py); in one process, the collection's order."""
    import scheduling

    scheduling.note_collected(items)
    if hasattr(config, "workerinput"):
        scheduling.order(items)


def pytest_collection_finish(session):
    """Refuse to run where xdist would not keep a cluster's tests together (tests/scheduling.py)."""
    import scheduling

    scheduling.check_groups_reach_the_ids(session.config, session.items)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown where it is not installed
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: twice the cores (tests/scheduling.py: the drills mostly wait)."""
    import scheduling

    return scheduling.workers()
