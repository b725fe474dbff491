"""Training steps as CUDA graphs (dbn.model.graphs) and the generator they draw from.

A graph replays what it captured: baked-in values, fixed addresses, random numbers from
device state. Each test compares a graphed run with an eager one (``backend.graphs =
False``) bit for bit, so a graph that replays stale numbers, stale parameters or stale
buffers fails. The protocol tests (eager, capture, replay, eviction, fallback) run on
every machine; the rest need CuPy and a GPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dbn import RBM
import dbn
from dbn.errors import BackendError
from dbn.model import graphs
from dbn.model.backend import Backend
from dbn.model.network import Network

def needs_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not dbn.gpu_available(), reason="needs CuPy and a CUDA GPU")(test))


# ------------------------------------------------------------ the protocol, on any machine

class FakeGraph:
    def __init__(self, step):
        self.step, self.launches = step, 0

    def launch(self):
        self.launches += 1
        self.step()


def test_first_run_is_eager_second_captures_then_replays(monkeypatch):
    captured = []
    monkeypatch.setattr(graphs, "_capture", lambda step: captured.append(FakeGraph(step)) or captured[-1])
    runs = []
    g = graphs.StepGraphs()
    for _ in range(4):
        g.run("k", lambda: runs.append(1))
    assert len(captured) == 1 and captured[0].launches == 3
    assert len(runs) == 4 and g.replays == 3


def test_each_key_gets_its_own_graph_and_old_ones_are_dropped(monkeypatch):
    monkeypatch.setattr(graphs, "_capture", FakeGraph)
    g = graphs.StepGraphs()
    for key in range(graphs.StepGraphs.MAX_GRAPHS + 3):
        for _ in range(3):
            g.run(key, lambda: None)
    assert g.replays == 2 * (graphs.StepGraphs.MAX_GRAPHS + 3)  # the first of each key runs eagerly
    assert len(g._graphs) == graphs.StepGraphs.MAX_GRAPHS
    assert list(g._graphs) == list(range(3, graphs.StepGraphs.MAX_GRAPHS + 3))  # the newest kept


def test_a_new_setting_or_a_replaced_array_gets_a_graph_of_its_own(monkeypatch):
    """A graph bakes in host values and addresses: a step bound to other ones must not replay it."""
    monkeypatch.setattr(graphs, "_capture", FakeGraph)

    class Array:
        def __init__(self, address):
            self.data = SimpleNamespace(ptr=address)

    g, runs = graphs.StepGraphs(), []
    bound = [g.bind(lambda tag=tag: runs.append(tag), settings, [Array(address)])
             for tag, settings, address in [("a", (0.1,), 1), ("b", (0.1,), 2), ("c", (0.2,), 1), ("a2", (0.1,), 1)]]
    for step in bound:
        step(), step()
    assert len(g._graphs) == 3  # "a2" is "a" again: same settings, same address
    assert runs == ["a", "a", "b", "b", "c", "c", "a", "a"]  # the same key replays the graph captured from a


def test_a_step_that_cannot_be_captured_runs_eagerly(monkeypatch):
    monkeypatch.setattr(graphs, "_capture", lambda step: graphs._EAGER)
    runs = []
    g = graphs.StepGraphs()
    for _ in range(5):
        g.run("k", lambda: runs.append(1))
    assert len(runs) == 5 and g.replays == 0


@pytest.mark.parametrize("value,enabled", [(None, True), ("1", True), ("", True), ("Yes", True), ("0", False),
                                           (" 0 ", False), ("false", False), ("OFF", False), ("no", False)])
def test_the_environment_switch(monkeypatch, value, enabled):
    if value is None:
        monkeypatch.delenv(graphs.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(graphs.ENV_SWITCH, value)
    assert graphs.graphs_enabled() is enabled


@pytest.mark.parametrize("value", ["2", "disable", "0.5"])
def test_an_unclear_environment_switch_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(graphs.ENV_SWITCH, value)
    with pytest.raises(BackendError, match=f"DBN_CUDA_GRAPHS='{value}': expected 1 or 0"):
        graphs.graphs_enabled()
    with pytest.raises(BackendError, match="DBN_CUDA_GRAPHS"):
        Backend("cpu")  # every backend reads it, so a typo shows on any machine


def test_the_cpu_never_uses_graphs():
    assert Backend("cpu").graphs is False and Backend("cpu").random_state is None


# ------------------------------------------------------------ the generator, on a GPU

def philox4x32_10(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10 in NumPy (Salmon et al. 2011): counters (n, 4) uint32, key (2,) uint32."""
    c = [counter[:, j].astype(np.uint64) for j in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    mask = np.uint64(0xFFFFFFFF)
    for _ in range(10):
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & mask]
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & mask, (k1 + np.uint64(0xBB67AE85)) & mask
    return np.stack(c, axis=1).astype(np.uint32)


def expected_uniforms(seed: int, draw: int, n: int) -> np.ndarray:
    key64 = int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0])
    key = np.array([key64 & 0xFFFFFFFF, key64 >> 32], dtype=np.uint64)
    blocks = np.arange((n + 3) // 4, dtype=np.uint64)
    counter = np.stack([blocks & np.uint64(0xFFFFFFFF), blocks >> np.uint64(32),
                        np.full_like(blocks, draw & 0xFFFFFFFF), np.full_like(blocks, draw >> 32)], axis=1)
    words = philox4x32_10(counter, key).reshape(-1)[:n]
    return (words >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


@needs_gpu
@pytest.mark.parametrize("seed", [0, 12345])
def test_gpu_uniforms_are_philox_of_index_and_draw(seed):
    be = Backend("gpu", seed=seed)
    first = be.to_numpy(be.uniform(be.empty((37, 11))))
    second = be.to_numpy(be.uniform(be.empty((37, 11))))
    np.testing.assert_array_equal(first.ravel(), expected_uniforms(seed, 0, 37 * 11))
    np.testing.assert_array_equal(second.ravel(), expected_uniforms(seed, 1, 37 * 11))
    be.reseed(seed)  # in place: the same state array, the stream from its start
    state = be.random_state
    assert be.random_state is state
    np.testing.assert_array_equal(be.to_numpy(be.uniform(be.empty((37, 11)))), first)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gpu_matmul_matches_cupy_for_every_layout(dtype):
    import cupy

    from dbn.model.kernels import gpu_matmul

    rng = np.random.default_rng(0)
    a, b = (cupy.asarray(rng.standard_normal(shape), dtype=dtype) for shape in ((37, 53), (53, 29)))
    at, bt = cupy.ascontiguousarray(a.T).T, cupy.ascontiguousarray(b.T).T  # F-contiguous views
    strided = cupy.asarray(rng.standard_normal((37, 106)), dtype=dtype)[:, ::2]  # neither C nor F
    tol = 1e-5 if dtype == "float32" else 1e-12
    for x, y in [(a, b), (at, b), (a, bt), (at, bt), (strided, b), (a[:1], b), (a, b[:, :1])]:
        expected = cupy.asnumpy(cupy.matmul(x, y))
        np.testing.assert_allclose(cupy.asnumpy(gpu_matmul(x, y)), expected, rtol=tol, atol=tol)
        out = cupy.empty(expected.shape, dtype=dtype)
        assert gpu_matmul(x, y, out) is out
        np.testing.assert_allclose(cupy.asnumpy(out), expected, rtol=tol, atol=tol)


# ------------------------------------------------------------ graphed = eager, on a GPU

def train_rbm(data, graphed: bool, reseeds=()):
    rbm = RBM(48, batch_size=20, momentum_epoch=1, device="gpu", seed=3).initialize(data)
    rbm.backend.graphs = graphed
    errors = []
    for epoch in range(3):
        if reseeds:  # as the distributed program does: a seed per step, a range of minibatches
            for i, seed in enumerate(reseeds):
                rbm.backend.reseed(seed)
                errors.append(rbm.train_epoch(data, epoch, range(4 * i, 4 * i + 4)).reconstruction_error)
        else:
            errors.append(rbm.train_epoch(data, epoch).reconstruction_error)
    return rbm, errors


@needs_gpu
@pytest.mark.parametrize("reseeds", [(), (11, 12, 13)])
def test_graphed_cd_steps_give_the_eager_bits(mnist_small, reseeds):
    data = np.asarray(mnist_small[0][:600], dtype=np.float32)
    eager, eager_errors = train_rbm(data, False, reseeds)
    graphed, graphed_errors = train_rbm(data, True, reseeds)
    assert sum(b["graphs"].replays for b in graphed._buffers.values()) > 0
    assert eager_errors == graphed_errors
    a, b = eager.get_state(), graphed.get_state()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@needs_gpu
def test_graphed_cd_steps_follow_a_new_state(mnist_small):
    """set_state replaces the parameter arrays: the next steps must use the new ones."""
    data = np.asarray(mnist_small[0][:400], dtype=np.float32)
    runs = []
    for graphed in (False, True):
        rbm, _ = train_rbm(data, graphed)
        start = RBM(48, device="cpu", seed=9).initialize(data).get_state()
        rbm.set_state(start)
        rbm.backend.reseed(5)
        rbm.train_epoch(data, 4)
        runs.append(rbm.get_state())
    for key in runs[0]:
        np.testing.assert_array_equal(runs[0][key], runs[1][key], err_msg=key)


def network_run(data, labels, graphed: bool):
    rng = np.random.default_rng(0)
    sizes = [data.shape[1], 64, 32, 10]
    be = Backend("gpu", seed=4)
    be.graphs = graphed
    net = Network([rng.normal(0, 0.1, (a, b)) for a, b in zip(sizes, sizes[1:])],
                  [np.zeros(b) for b in sizes[1:]], be)
    X, y = be.asarray(data), be.asarray(labels, dtype=np.int64)
    stats = []
    for epoch in range(3):
        layers = slice(-1, None) if epoch == 0 else slice(None)  # the top layer alone first, as Hinton
        stats.append(net.train_epoch(X, y, epoch, learning_rate=0.1, momentum=0.5 if epoch < 2 else 0.9,
                                     weight_cost=1e-4, max_norm=3.0, batch_size=25, dropout=(0.2, 0.5, 0.5),
                                     train_layers=layers, seed=1))
    return net, stats


@needs_gpu
def test_graphed_finetuning_steps_give_the_eager_bits(mnist_small):
    data, labels = np.asarray(mnist_small[0][:500], dtype=np.float32), mnist_small[1][:500]
    eager, eager_stats = network_run(data, labels, False)
    graphed, graphed_stats = network_run(data, labels, True)
    assert graphed._graphs.replays > 0
    assert [(s.loss, s.train_error) for s in eager_stats] == [(s.loss, s.train_error) for s in graphed_stats]
    a, b = eager.get_state(), graphed.get_state()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
