"""Loading a state into a model that already has one: in place, with the same results.

A worker loads the master's state every superstep. Arrays of the same shapes are
overwritten where they are, so the step buffers and, on a GPU, the captured CUDA graphs
that read them stay valid (dbn.model.graphs); training after a load must give the very
bits a freshly built model gives.
"""

from __future__ import annotations

import numpy as np
import pytest

from dbn import RBM
from dbn.model.backend import Backend
from dbn.model.network import Network


@pytest.fixture
def data():
    return np.random.default_rng(0).random((200, 12)).astype(np.float32)


def a_state(n_visible=12, n_hidden=6, seed=1, increments=True):
    rng = np.random.default_rng(seed)
    state = {"weights": rng.normal(0, 0.1, (n_visible, n_hidden)), "visible_bias": rng.normal(0, 0.1, n_visible),
             "hidden_bias": rng.normal(0, 0.1, n_hidden)}
    if increments:
        state.update(weights_inc=rng.normal(0, 0.01, (n_visible, n_hidden)),
                     visible_bias_inc=rng.normal(0, 0.01, n_visible), hidden_bias_inc=rng.normal(0, 0.01, n_hidden))
    return state


def test_rbm_loads_in_place_and_trains_as_a_fresh_one(data):
    used = RBM(6, batch_size=20, device="cpu", seed=3).fit(data[:100])  # buffers and state of its own
    arrays = {key: getattr(used, key + "_") for key in ("weights", "weights_inc", "hidden_bias")}
    buffers = used._buffers[20]
    used.set_state(a_state())
    assert all(getattr(used, key + "_") is array for key, array in arrays.items())  # same arrays
    assert used._buffers[20] is buffers
    fresh = RBM(6, batch_size=20, device="cpu", seed=3).set_state(a_state())
    for rbm in (used, fresh):
        rbm.backend.reseed(9)
        rbm.train_epoch(data, 2)
    for key, value in fresh.get_state().items():
        np.testing.assert_array_equal(used.get_state()[key], value, err_msg=key)


def test_rbm_increments_absent_from_the_state_are_zero(data):
    rbm = RBM(6, batch_size=20, device="cpu", seed=3).fit(data)
    assert np.abs(rbm.get_state()["weights_inc"]).max() > 0
    rbm.set_state(a_state(increments=False))
    for key in ("weights_inc", "visible_bias_inc", "hidden_bias_inc"):
        assert not rbm.get_state()[key].any(), key


def test_rbm_takes_a_state_of_another_width_as_new_arrays(data):
    rbm = RBM(6, batch_size=20, device="cpu", seed=3).fit(data)
    rbm.set_state(a_state(n_visible=5))
    assert rbm.weights_.shape == (5, 6) and rbm.weights_inc_.shape == (5, 6) and not rbm._buffers
    rbm.train_epoch(data[:, :5], 0)
    assert np.isfinite(rbm.get_state()["weights"]).all()


def test_rbm_refuses_a_state_of_other_hidden_units_and_keeps_its_own(data):
    rbm = RBM(6, batch_size=20, device="cpu", seed=3).fit(data)
    before = rbm.get_state()
    with pytest.raises(ValueError, match=r"shape \(12, 7\), expected \(n_visible, 6\)"):
        rbm.set_state(a_state(n_hidden=7))
    for key, value in rbm.get_state().items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)


def net_state(seed, increments=True):
    rng = np.random.default_rng(seed)
    state = {}
    for i, (a, b) in enumerate([(12, 8), (8, 3)]):
        state[f"net.{i}.weights"], state[f"net.{i}.biases"] = rng.normal(0, 0.3, (a, b)), rng.normal(0, 0.1, b)
        if increments:
            state[f"net.{i}.weights_inc"], state[f"net.{i}.biases_inc"] = rng.normal(0, 0.01, (a, b)), rng.normal(0, 0.01, b)
    return state


def test_network_loads_in_place_and_trains_as_a_fresh_one(data):
    labels = np.random.default_rng(1).integers(0, 3, len(data))

    def train(net):
        net.backend.reseed(4)
        return net.train_epoch(data, labels, 0, learning_rate=0.1, momentum=0.9, batch_size=20, dropout=(0.2, 0.5))

    used = Network.from_state(net_state(0), 2, Backend("cpu", seed=0))
    train(used)
    weights = list(used.weights)
    used.set_state(net_state(1))
    assert all(a is b for a, b in zip(used.weights, weights))
    fresh = Network.from_state(net_state(1), 2, Backend("cpu", seed=0))
    assert train(used) == train(fresh)
    for key, value in fresh.get_state().items():
        np.testing.assert_array_equal(used.get_state()[key], value, err_msg=key)
    used.set_state(net_state(2, increments=False))
    assert not any(used.get_state()[f"net.{i}.{k}"].any() for i in range(2) for k in ("weights_inc", "biases_inc"))
