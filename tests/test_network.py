"""Tests for dbn.model.network.Network: gradient check in float64, training, dropout."""

from __future__ import annotations

import numpy as np
import pytest

from dbn import Backend, Network
from dbn.model.state import net_names

SIZES = (7, 5, 4, 3)
BATCH = 6


def make_network(seed=0, sizes=SIZES, scale=0.7):
    rng = np.random.default_rng(seed)
    weights = [rng.normal(0, scale, (m, n)) for m, n in zip(sizes[:-1], sizes[1:])]
    biases = [rng.normal(0, 0.3, n) for n in sizes[1:]]
    return Network(weights, biases, Backend("cpu", "float64", seed))


def make_batch(seed=1, sizes=SIZES, batch=BATCH):
    rng = np.random.default_rng(seed)
    x = rng.random((batch, sizes[0]))  # rows are samples
    labels = rng.integers(0, sizes[-1], batch)
    targets = np.eye(sizes[-1])[labels]
    return x, targets


def numeric_gradient(net, param, loss_fn, eps=1e-5):
    grad = np.zeros_like(param)
    for idx in np.ndindex(param.shape):
        old = param[idx]
        param[idx] = old + eps
        plus = loss_fn()
        param[idx] = old - eps
        minus = loss_fn()
        param[idx] = old
        grad[idx] = (plus - minus) / (2 * eps)
    return grad


def relative_error(analytic, numeric):
    return np.abs(analytic - numeric) / np.maximum(np.abs(analytic) + np.abs(numeric), 1e-7)


def check_gradients(net, loss_fn, grads_w, grads_b, limit=1e-6):
    """Central differences on every weight and bias entry of every layer."""
    for i in range(len(net.weights)):
        for name, param, analytic in (("weights", net.weights[i], grads_w[i]), ("biases", net.biases[i], grads_b[i])):
            assert analytic.shape == param.shape
            numeric = numeric_gradient(net, param, loss_fn)
            assert np.abs(numeric).max() > 1e-4, f"{name}[{i}]: gradient too small to test"
            err = relative_error(analytic, numeric)
            assert err.max() < limit, f"{name}[{i}]: max relative error {err.max():.3g}"


@pytest.mark.parametrize("weight_cost", [0.0, 0.05])
def test_gradient_check(weight_cost):
    net = make_network()
    x, targets = make_batch()
    loss, grads_w, grads_b, probs = net.loss_and_grads(x, targets, weight_cost)

    def loss_fn():
        return net.loss_and_grads(x, targets, weight_cost)[0]

    check_gradients(net, loss_fn, grads_w, grads_b)
    # The loss itself: mean cross-entropy plus the L2 term on the weights only.
    expected = -np.mean(np.log((probs * targets).sum(axis=1)))
    expected += 0.5 * weight_cost * sum((w ** 2).sum() for w in net.weights)
    assert loss == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-12)
    assert probs.shape == (BATCH, SIZES[-1])


def test_weight_cost_adds_exactly_l2_gradient():
    net = make_network()
    x, targets = make_batch()
    _, gw0, gb0, _ = net.loss_and_grads(x, targets, 0.0)
    _, gw1, gb1, _ = net.loss_and_grads(x, targets, 0.1)
    for w, a, b in zip(net.weights, gw0, gw1):
        np.testing.assert_allclose(b - a, 0.1 * w, rtol=1e-10, atol=1e-14)
    for a, b in zip(gb0, gb1):
        np.testing.assert_array_equal(a, b)  # biases are not penalised


def test_gradient_check_with_dropout_mask_held_fixed():
    """With the random stream reset before every evaluation, dropout masks are fixed and the
    loss is a smooth function of the parameters: the dropout backward pass must match it."""
    net = make_network()
    x, targets = make_batch()
    dropout = (0.3, 0.4, 0.25)
    rng = net.backend._rng
    saved = rng.bit_generator.state

    def run():
        rng.bit_generator.state = saved
        return net.loss_and_grads(x, targets, 0.01, dropout, train=True)

    loss, grads_w, grads_b, _ = run()
    check_gradients(net, lambda: run()[0], grads_w, grads_b)
    # Dropout really was applied: the loss differs from the deterministic one.
    assert loss != pytest.approx(net.loss_and_grads(x, targets, 0.01)[0], rel=1e-6)


def separable_problem(n=300, n_features=7, n_classes=3, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.random((n_classes, n_features))
    y = rng.integers(0, n_classes, n)
    X = np.clip(centers[y] + 0.05 * rng.standard_normal((n, n_features)), 0, 1)
    return X, y


def accuracy(net, X, y):
    probs = net.backend.to_numpy(net.predict_proba_device(net.backend.asarray(X)))
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    return float(np.mean(probs.argmax(axis=1) == y))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_train_epoch_lowers_loss(dtype):
    X, y = separable_problem()
    rng = np.random.default_rng(3)
    be = Backend("cpu", dtype, 0)
    net = Network([rng.normal(0, 0.1, (7, 5)), rng.normal(0, 0.1, (5, 3))], [np.zeros(5), np.zeros(3)], be)
    Xd, yd = be.asarray(X), be.asarray(y, dtype=np.int64)
    losses = []
    for epoch in range(30):
        stats = net.train_epoch(Xd, yd, epoch, learning_rate=0.5, momentum=0.9, batch_size=20)
        assert stats.n_samples == 300
        losses.append(stats.loss)
    assert losses[-1] < 0.2 * losses[0]
    assert stats.train_error < 0.05
    assert accuracy(net, X, y) > 0.95


def test_train_layers_only_updates_those_layers():
    X, y = separable_problem(n=60)
    net = make_network()
    before = [w.copy() for w in net.weights]
    net.train_epoch(net.backend.asarray(X), np.asarray(y), 0, learning_rate=0.1, momentum=0.0,
                    batch_size=20, train_layers=slice(-1, None))
    assert all(np.array_equal(a, b) for a, b in zip(before[:-1], net.weights[:-1]))
    assert not np.array_equal(before[-1], net.weights[-1])


def test_dropout_training_runs_and_learns():
    X, y = separable_problem()
    rng = np.random.default_rng(3)
    be = Backend("cpu", "float32", 0)
    net = Network([rng.normal(0, 0.1, (7, 20)), rng.normal(0, 0.1, (20, 3))], [np.zeros(20), np.zeros(3)], be)
    Xd, yd = be.asarray(X), be.asarray(y, dtype=np.int64)
    losses = []
    for epoch in range(30):
        stats = net.train_epoch(Xd, yd, epoch, learning_rate=0.3, momentum=0.9, batch_size=20, dropout=(0.1, 0.5))
        losses.append(stats.loss)
        assert np.isfinite(stats.loss)
    assert losses[-1] < 0.5 * losses[0]
    assert accuracy(net, X, y) > 0.9  # prediction (no dropout, no rescaling) is right


def test_state_round_trip_and_batch_ranges():
    X, y = separable_problem(n=100)
    a, b = make_network(), make_network()
    b.set_state({k: v.copy() for k, v in a.get_state().items()})
    Xd = a.backend.asarray(X)
    kwargs = dict(learning_rate=0.1, momentum=0.9, batch_size=10, seed=4)
    a.train_epoch(Xd, y, 0, **kwargs)
    s1 = b.train_epoch(Xd, y, 0, batches=range(0, 3), **kwargs)
    s2 = b.train_epoch(Xd, y, 0, batches=range(3, 10), **kwargs)
    assert (s1.n_samples, s2.n_samples) == (30, 70)
    for key, value in a.get_state().items():
        np.testing.assert_array_equal(value, b.get_state()[key], err_msg=key)


def test_constructor_rejects_mismatched_layers():
    with pytest.raises(ValueError, match="layer 1 takes 4 inputs"):
        Network([np.zeros((3, 5)), np.zeros((4, 2))], [np.zeros(5), np.zeros(2)], Backend("cpu"))
    with pytest.raises(ValueError, match="do not match"):
        Network([np.zeros((3, 5))], [np.zeros(4)], Backend("cpu"))
    with pytest.raises(ValueError, match="non-empty"):
        Network([], [], Backend("cpu"))


def test_get_state_is_a_snapshot():
    X, y = separable_problem(n=60)
    net = make_network()
    state = net.get_state()
    saved = {k: v.copy() for k, v in state.items()}
    net.train_epoch(net.backend.asarray(X), y, 0, learning_rate=0.1, momentum=0.9, batch_size=20)
    for key in state:
        np.testing.assert_array_equal(state[key], saved[key], err_msg=key)


def test_state_uses_the_flat_names():
    """get_state / set_state speak the names of dbn.model.state, which the program and model file use."""
    X, y = separable_problem(n=60)
    net = make_network()
    net.train_epoch(net.backend.asarray(X), y, 0, learning_rate=0.1, momentum=0.9, batch_size=20)
    state = net.get_state()
    assert list(state) == list(net_names(3)) and state["net.0.weights_inc"].any()
    assert state["net.0.weights"].shape == (7, 5) and state["net.2.biases"].shape == (3,)
    rebuilt = Network.from_state({**state, "rbm.0.weights": np.zeros((7, 5))}, 3, net.backend)  # other names ignored
    for key, value in rebuilt.get_state().items():
        np.testing.assert_array_equal(value, state[key], err_msg=key)
    # Increments absent: they start at zero.
    bare = rebuilt.set_state({k: v for k, v in state.items() if not k.endswith("_inc")})
    assert not any(bare.get_state()[f"net.{i}.weights_inc"].any() for i in range(3))
    with pytest.raises(KeyError, match="net.1.biases"):
        make_network().set_state({k: v for k, v in state.items() if k != "net.1.biases"})


def test_clip_columns_shortens_only_the_long_columns():
    from dbn.model.network import clip_columns

    rng = np.random.default_rng(3)
    w = rng.normal(0, 1, (20, 6)).astype(np.float32)
    w[:, :3] *= 0.01  # norms about 0.045: inside the bound
    w[:, 3:] *= 10  # norms about 45: outside
    before = w.copy()
    clip_columns(w, 2.0)
    assert np.array_equal(w[:, :3], before[:, :3])  # untouched, bit for bit
    np.testing.assert_allclose(np.linalg.norm(w[:, 3:], axis=0), 2.0, rtol=1e-6)
    cosines = np.sum(w[:, 3:] * before[:, 3:], axis=0) / (np.linalg.norm(w[:, 3:], axis=0)
                                                        * np.linalg.norm(before[:, 3:], axis=0))
    np.testing.assert_allclose(cosines, 1.0, rtol=1e-6)  # same directions
    zero = np.zeros((4, 2), np.float32)
    clip_columns(zero, 1.0)
    assert not zero.any() and np.isfinite(zero).all()


@pytest.mark.parametrize("max_norm", [0.5, 3.0])
def test_max_norm_bounds_every_units_incoming_weights_while_training(max_norm):
    net = make_network(scale=2.0)  # columns start far longer than either bound
    rng = np.random.default_rng(4)
    x, y = rng.random((60, SIZES[0])), rng.integers(0, SIZES[-1], 60)
    net.train_epoch(x, y, 0, learning_rate=0.5, momentum=0.9, max_norm=max_norm, batch_size=10, dropout=(0.2, 0.5, 0.5))
    for i, w in enumerate(net.weights):
        assert np.linalg.norm(w, axis=0).max() <= max_norm * (1 + 1e-9), f"layer {i}"
    free = make_network(scale=2.0)
    free.train_epoch(x, y, 0, learning_rate=0.5, momentum=0.9, batch_size=10, dropout=(0.2, 0.5, 0.5))
    assert max(np.linalg.norm(w, axis=0).max() for w in free.weights) > 3.0  # the bound did the work


@pytest.mark.parametrize("train_layers", [slice(None), slice(-1, None), slice(1, 3)])
def test_a_step_is_the_gradient_of_the_weights_before_it(train_layers):
    """Fine-tuning updates each layer during backprop (while it is in cache): the step must still be
    the gradient at the step's starting weights, for every layer trained, and leave the others."""
    net = make_network(seed=4)
    x, targets = make_batch(seed=5)
    labels = targets.argmax(axis=1)
    lr, momentum, cost = 0.3, 0.8, 0.01
    for i in range(len(net.weights)):  # momentum increments already under way
        net.weights_inc[i] += 0.01 * (i + 1)
        net.biases_inc[i] -= 0.02
    before = net.get_state()
    _, grads_w, grads_b, _ = net.loss_and_grads(x, targets)  # no dropout: no random numbers
    trained = range(len(net.weights))[train_layers]
    net.train_epoch(x, labels, 0, learning_rate=lr, momentum=momentum, weight_cost=cost, batch_size=BATCH,
                    train_layers=train_layers)
    for i in range(len(net.weights)):
        w, b = before[f"net.{i}.weights"], before[f"net.{i}.biases"]
        w_inc, b_inc = before[f"net.{i}.weights_inc"], before[f"net.{i}.biases_inc"]
        if i in trained:
            w_inc = momentum * w_inc - lr * grads_w[i] - lr * cost * w
            b_inc = momentum * b_inc - lr * grads_b[i]
            np.testing.assert_allclose(net.weights_inc[i], w_inc, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(net.weights[i], w + w_inc, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(net.biases[i], b + b_inc, rtol=1e-12, atol=1e-14)
        else:
            assert np.array_equal(net.weights[i], w) and np.array_equal(net.biases[i], b), i
