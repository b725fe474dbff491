"""Tests for dbn.model.rbm.RBM: the CD update against a naive reference, learning, determinism, state."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from dbn import RBM
from dbn.model.rbm import EpochStats

# --------------------------------------------------------------------------- helpers


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def copy_rng(rng: np.random.Generator) -> np.random.Generator:
    """An independent generator in exactly the same state."""
    clone = np.random.Generator(type(rng.bit_generator)())
    clone.bit_generator.state = rng.bit_generator.state
    return clone


def exact_mean_log_likelihood(rbm: RBM, patterns: np.ndarray) -> float:
    """Mean log p(pattern) under a Bernoulli RBM with 16 visible units, by enumerating all 2^16 images."""
    n = patterns.shape[1]
    everything = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(np.float64)
    log_z = np.logaddexp.reduce(-rbm.backend.to_numpy(rbm.free_energy(everything)).astype(np.float64))
    return float(np.mean(-rbm.backend.to_numpy(rbm.free_energy(patterns)) - log_z))


def record_errors(errors):
    return lambda stats: errors.append(stats.reconstruction_error)


# ------------------------------------------------------- CD step vs naive reference


@pytest.mark.parametrize("visible", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("cd_k,persistent", [(1, False), (3, False), (1, True), (2, True)])
@pytest.mark.parametrize("epoch", [0, 7], ids=["momentum", "final_momentum"])
def test_cd_minibatches_match_naive_reference(naive_cd, visible, cd_k, persistent, epoch):
    rng = np.random.default_rng(42)
    n, nv, nh, batch = 20, 6, 5, 4
    X = rng.random((n, nv)) if visible == "bernoulli" else rng.standard_normal((n, nv))
    rbm = RBM(
        nh, visible=visible, cd_k=cd_k, persistent=persistent, learning_rate=0.3, momentum=0.5,
        final_momentum=0.9, momentum_epoch=5, weight_cost=0.01, batch_size=batch,
        device="cpu", dtype="float64", seed=7,
    )
    rbm.initialize(X)
    # Large weights and non-zero increments so that every term of the update matters.
    rbm.set_state({
        "weights": rng.normal(0, 0.8, (nv, nh)), "visible_bias": rng.normal(0, 0.5, nv),
        "hidden_bias": rng.normal(0, 0.5, nh), "weights_inc": rng.normal(0, 0.05, (nv, nh)),
        "visible_bias_inc": rng.normal(0, 0.05, nv), "hidden_bias_inc": rng.normal(0, 0.05, nh),
    })
    ref = naive_cd(rbm, copy_rng(rbm.backend._rng))
    momentum = 0.5 if epoch < 5 else 0.9
    n_steps = 3
    order = rbm.epoch_order(n, epoch)
    ref_error = sum(ref.step(X[order[i * batch:(i + 1) * batch]], momentum) for i in range(n_steps))

    stats = rbm.train_epoch(X, epoch, batches=range(n_steps))

    state = rbm.get_state()
    tol = dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(state["weights"], ref.W, **tol)
    np.testing.assert_allclose(state["visible_bias"], ref.a, **tol)
    np.testing.assert_allclose(state["hidden_bias"], ref.b, **tol)
    np.testing.assert_allclose(state["weights_inc"], ref.dW, **tol)
    np.testing.assert_allclose(state["visible_bias_inc"], ref.da, **tol)
    np.testing.assert_allclose(state["hidden_bias_inc"], ref.db, **tol)
    assert stats.n_samples == n_steps * batch
    if not persistent:  # under PCD the error is that of reconstructing v0 itself (see test_persistent_cd_reconstruction_error_goes_down)
        assert stats.reconstruction_error == pytest.approx(ref_error / (n_steps * batch), rel=1e-10)
    # Both consumed exactly the same random numbers.
    assert rbm.backend._rng.bit_generator.state == ref.rng.bit_generator.state


def test_momentum_switches_at_momentum_epoch():
    """Increments decay by ``momentum`` before momentum_epoch and by ``final_momentum`` from it on."""
    X = np.random.default_rng(0).random((8, 3))
    updates = {}
    for epoch in (2, 3):
        rbm = RBM(2, learning_rate=0.0, momentum=0.25, final_momentum=0.75, momentum_epoch=3,
                  batch_size=8, device="cpu", dtype="float64", seed=0).initialize(X)
        state = rbm.get_state()
        state["weights_inc"] = np.ones((3, 2))
        rbm.set_state(state)
        rbm.train_epoch(X, epoch)
        updates[epoch] = rbm.get_state()["weights_inc"]
    np.testing.assert_allclose(updates[2], 0.25)
    np.testing.assert_allclose(updates[3], 0.75)


# --------------------------------------------------------------- learning


def test_cd1_learns_bars_and_stripes(bas_patterns, bas_data):
    errors = []
    rbm = RBM(8, learning_rate=0.1, batch_size=10, epochs=100, weight_cost=2e-4,
              device="cpu", dtype="float64", seed=0)
    rbm.initialize(bas_data)
    ll_before = exact_mean_log_likelihood(rbm, bas_patterns)
    rbm.fit(bas_data, callback=record_errors(errors))

    assert len(errors) == 100
    assert errors[-1] < 0.05 * errors[0]  # about 4 bits wrong per image at first
    # Mean-field reconstructions of every pattern are close to the pattern.
    recon = rbm.reconstruct(bas_patterns)
    assert np.abs(recon - bas_patterns).max() < 0.2
    # Valid patterns are far more probable than random binary images ...
    rng = np.random.default_rng(1)
    random_images = (rng.random((300, 16)) < 0.5).astype(np.float64)
    is_pattern = (random_images[:, None, :] == bas_patterns[None]).all(axis=2).any(axis=1)
    random_images = random_images[~is_pattern]
    assert rbm.free_energy(bas_patterns).mean() < rbm.free_energy(random_images).mean() - 10
    # ... and the exact likelihood of the patterns rose from ~uniform over 2^16 images. One
    # seed's figure varies by +-1.5 nats (CD-1 with 8 units finds different optima; about
    # +3.1 on average over 8 seeds), so the bar is on the mean of four seeds.
    assert ll_before == pytest.approx(-16 * np.log(2), abs=0.5)
    ll_after = [exact_mean_log_likelihood(rbm, bas_patterns)]
    for seed in (1, 2, 3):
        other = RBM(**{**rbm.get_params(), "seed": seed}).fit(bas_data)
        ll_after.append(exact_mean_log_likelihood(other, bas_patterns))
    assert np.mean(ll_after) > ll_before + 2.5


def test_cd3_trains(bas_patterns, bas_data):
    errors = []
    rbm = RBM(8, cd_k=3, learning_rate=0.1, batch_size=10, epochs=60, device="cpu", dtype="float64", seed=0)
    rbm.fit(bas_data, callback=record_errors(errors))
    assert errors[-1] < 0.1 * errors[0]
    assert exact_mean_log_likelihood(rbm, bas_patterns) > -8.0  # uniform over 2^16 is -11.1


def test_persistent_cd_raises_likelihood(bas_patterns, bas_data):
    """PCD (with a small learning rate, as PCD needs) makes the patterns much more probable."""
    rbm = RBM(16, persistent=True, learning_rate=0.01, final_momentum=0.5, batch_size=10, epochs=60,
              device="cpu", dtype="float64", seed=0)
    rbm.initialize(bas_data)
    before = exact_mean_log_likelihood(rbm, bas_patterns)
    rbm.fit(bas_data)
    after = exact_mean_log_likelihood(rbm, bas_patterns)
    assert after > before + 3
    everything = ((np.arange(2**16)[:, None] >> np.arange(16)) & 1).astype(np.float64)
    assert rbm.free_energy(bas_patterns).mean() < rbm.free_energy(everything).mean() - 3


def test_persistent_cd_reconstruction_error_goes_down(bas_data):
    errors = []
    rbm = RBM(16, persistent=True, learning_rate=0.01, final_momentum=0.5, batch_size=10, epochs=60,
              device="cpu", dtype="float64", seed=0)
    rbm.fit(bas_data, callback=record_errors(errors))
    assert errors[-1] < 0.5 * errors[0]


def test_gaussian_rbm_trains_on_standardized_real_data():
    rng = np.random.default_rng(0)
    latent = rng.standard_normal((400, 3))
    X = latent @ rng.standard_normal((3, 10)) + 0.3 * rng.standard_normal((400, 10))
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    assert X.min() < 0 and X.max() > 1  # real-valued: not valid for Bernoulli units
    errors = []
    rbm = RBM(20, visible="gaussian", learning_rate=0.01, batch_size=20, epochs=40, device="cpu", seed=0)
    rbm.fit(X, callback=record_errors(errors))
    assert errors[-1] < 0.5 * errors[0]
    state = rbm.get_state()
    assert all(np.isfinite(v).all() for v in state.values())
    # The mean-field reconstruction explains most of the variance (10 per row).
    recon = rbm.reconstruct(X)
    assert ((recon - X) ** 2).sum(axis=1).mean() < 2.0
    with pytest.raises(Exception, match=r"\[0, 1\]"):
        RBM(4, device="cpu").fit(X)  # the same data is refused by Bernoulli units


# ------------------------------------------------------- determinism and batches


def test_same_seed_bit_identical_different_seed_differs(bas_data):
    def train(seed):
        rbm = RBM(6, batch_size=10, epochs=3, device="cpu", seed=seed)
        rbm.fit(bas_data)
        return rbm.get_state()

    a, b, c = train(5), train(5), train(6)
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    assert not np.array_equal(a["weights"], c["weights"])


def test_batch_ranges_count_samples_and_compose_to_full_epoch(bas_data):
    def fresh():
        return RBM(6, batch_size=10, device="cpu", dtype="float64", seed=3).initialize(bas_data)

    n_batches = len(bas_data) // 10  # 30
    part = fresh().train_epoch(bas_data, 0, batches=range(4, 9))
    assert isinstance(part, EpochStats) and part.n_samples == 5 * 10

    full_rbm, split_rbm = fresh(), fresh()
    for epoch in range(2):
        full = full_rbm.train_epoch(bas_data, epoch)
        first = split_rbm.train_epoch(bas_data, epoch, batches=range(0, 11))
        second = split_rbm.train_epoch(bas_data, epoch, batches=range(11, n_batches))
        assert full.n_samples == len(bas_data) == first.n_samples + second.n_samples
        assert full.reconstruction_error * full.n_samples == pytest.approx(
            first.reconstruction_error * first.n_samples + second.reconstruction_error * second.n_samples,
            rel=1e-12)
    a, b = full_rbm.get_state(), split_rbm.get_state()
    for key in a:
        assert np.array_equal(a[key], b[key]), key

    with pytest.raises(IndexError, match="out of range"):
        fresh().train_epoch(bas_data, 0, batches=range(n_batches, n_batches + 1))


def test_leftover_rows_are_not_trained_in_that_epoch(bas_data):
    rbm = RBM(4, batch_size=70, device="cpu", seed=0).initialize(bas_data)
    assert rbm.train_epoch(bas_data, 0).n_samples == (300 // 70) * 70


def test_train_epoch_before_initialise_raises(bas_data):
    with pytest.raises(RuntimeError, match="not initialised"):
        RBM(4, device="cpu").train_epoch(bas_data, 0)


# ------------------------------------------------------------------ state


def test_get_state_set_state_round_trip(bas_data):
    rbm = RBM(6, batch_size=10, epochs=2, device="cpu", seed=0).fit(bas_data)
    state = rbm.get_state()
    assert set(state) == {"weights", "visible_bias", "hidden_bias",
                          "weights_inc", "visible_bias_inc", "hidden_bias_inc"}
    assert all(isinstance(v, np.ndarray) for v in state.values())
    assert state["weights"].shape == (16, 6) and state["visible_bias"].shape == (16,)
    assert np.abs(state["weights_inc"]).sum() > 0

    other = RBM(6, batch_size=10, device="cpu", seed=99).set_state({k: v.copy() for k, v in state.items()})
    for key, value in other.get_state().items():
        assert np.array_equal(value, state[key]), key
    np.testing.assert_array_equal(other.transform(bas_data), rbm.transform(bas_data))
    # Without increments in the state, the momentum terms restart at zero.
    bare = RBM(6, device="cpu").set_state({k: state[k] for k in ("weights", "visible_bias", "hidden_bias")})
    assert not np.abs(bare.get_state()["weights_inc"]).any()

    with pytest.raises(ValueError, match="expected"):
        RBM(5, device="cpu").set_state(state)  # 6 hidden units in the state


def test_get_state_is_a_snapshot(bas_data):
    rbm = RBM(6, batch_size=10, epochs=1, device="cpu", seed=0).fit(bas_data)
    state = rbm.get_state()
    saved = {k: v.copy() for k, v in state.items()}
    rbm.train_epoch(bas_data, 1)
    for key in state:
        assert np.array_equal(state[key], saved[key]), key


def test_refit_with_other_feature_count(bas_data):
    rbm = RBM(4, batch_size=10, epochs=1, device="cpu", seed=0).fit(bas_data)
    rbm.fit(bas_data[:, :9])
    assert rbm.get_state()["weights"].shape == (9, 4)


def test_free_energy_gap_and_validation_reporting(bas_data):
    records = []
    train, valid = bas_data[:200], bas_data[200:]
    rbm = RBM(6, batch_size=10, epochs=3, device="cpu", seed=0)
    rbm.fit(train, X_valid=valid, callback=records.append)
    assert [r.epoch for r in records] == [0, 1, 2]
    assert all(isinstance(r.free_energy_gap, float) and np.isfinite(r.free_energy_gap) for r in records)
    gap = rbm.free_energy_gap(train, valid)
    assert isinstance(gap, float)
    assert rbm.free_energy_gap(train, train) == 0.0
    expected = float(rbm.free_energy(valid[:100]).mean() - rbm.free_energy(train[:100]).mean())
    assert gap == pytest.approx(expected, rel=1e-6)


def test_free_energy_matches_definition():
    rng = np.random.default_rng(0)
    X = rng.random((5, 4))
    for visible in ("bernoulli", "gaussian"):
        rbm = RBM(3, visible=visible, device="cpu", dtype="float64", seed=0).initialize(n_visible=4)
        W, a, b = rng.normal(size=(4, 3)), rng.normal(size=4), rng.normal(size=3)
        rbm.set_state({"weights": W, "visible_bias": a, "hidden_bias": b})
        softplus = np.log1p(np.exp(X @ W + b)).sum(axis=1)
        expected = (-(X @ a) if visible == "bernoulli" else 0.5 * ((X - a) ** 2).sum(axis=1)) - softplus
        np.testing.assert_allclose(rbm.free_energy(X), expected, rtol=1e-12)
        np.testing.assert_allclose(rbm.transform(X), sigmoid(X @ W + b), rtol=1e-12)


def test_hyperparameters_are_checked_when_training_starts(bas_data):
    """The constructor only stores its arguments; validate_params, fit, initialize and train_epoch check them."""
    cases = [(dict(n_hidden=0), "n_hidden must be >= 1"), (dict(n_hidden=3, cd_k=0), "cd_k must be >= 1"),
             (dict(n_hidden=3, batch_size=0), "batch_size must be >= 1"), (dict(n_hidden=3, epochs=-1), "epochs must be >= 0"),
             (dict(n_hidden=2.5), "n_hidden must be an integer"),
             (dict(n_hidden=3, visible="poisson"), "visible must be one of")]
    for kwargs, match in cases:
        rbm = RBM(**kwargs, device="cpu")
        for check in (rbm.validate_params, lambda: rbm.fit(bas_data), lambda: rbm.initialize(n_visible=4)):
            with pytest.raises(ValueError, match=match):
                check()
    good = RBM(3, batch_size=10, device="cpu").initialize(bas_data)
    good.cd_k = 0
    with pytest.raises(ValueError, match="cd_k must be >= 1"):
        good.train_epoch(bas_data, 0)


def test_get_params_set_params_and_clone():
    rbm = RBM(5, learning_rate=0.05, dtype="float64", device="cpu", seed=3)
    params = rbm.get_params()
    assert list(params) == list(inspect.signature(RBM).parameters) == RBM._param_names()
    assert params["n_hidden"] == 5 and params["dtype"] == "float64" and params["learning_rate"] == 0.05
    clone = RBM(**rbm.get_params(deep=False))
    assert all(clone.get_params()[name] is value for name, value in params.items())
    assert rbm.backend.dtype == np.float64 and rbm.backend is rbm.backend
    # A new seed gives a fresh backend whose random stream starts from it.
    a = rbm.set_params(seed=11).initialize(n_visible=4).get_state()["weights"]
    b = RBM(5, dtype="float64", device="cpu", seed=11).initialize(n_visible=4).get_state()["weights"]
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="invalid parameter 'n_visible'"):
        rbm.set_params(n_visible=4)
