"""The random streams every device trains with: uniform, independent, reproducible.

A broken stream does not crash; it quietly trains worse (on 2026-11-24 CuPy's
``Generator.random(out=...)`` wrote one value into a whole array, so each minibatch's
Gibbs samples and dropout masks came from one coin, and fine-tuning diverged). These
checks hold for every device that is present; the GPU cases skip without one.
"""

from __future__ import annotations

import numpy as np
import pytest

import dbn
from dbn.model.backend import Backend

DEVICES = ["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not dbn.gpu_available(), reason="needs CuPy and a CUDA GPU")])]


def host(backend, x) -> np.ndarray:
    return backend.to_numpy(x).astype(np.float64)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("device", DEVICES)
def test_uniform_fills_every_element_with_independent_numbers(device, dtype):
    be = Backend(device, dtype=dtype, seed=3)
    out = be.empty((200, 500))
    first = host(be, be.uniform(out))
    second = host(be, be.uniform(out))
    for u in (first, second):
        assert 0.0 <= u.min() and u.max() <= 1.0
        assert u.mean() == pytest.approx(0.5, abs=0.005)
        assert u.std() == pytest.approx(np.sqrt(1 / 12), abs=0.005)
        assert len(np.unique(u)) > 0.99 * u.size  # not one value repeated
        # Neighbours along rows and columns are uncorrelated.
        assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.02
        assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.02
    assert abs(np.corrcoef(first.ravel(), second.ravel())[0, 1]) < 0.02  # each call draws afresh


@pytest.mark.parametrize("device", DEVICES)
def test_uniform_into_a_strided_view_fills_only_the_view(device):
    be = Backend(device, seed=0)
    whole = be.zeros((100, 40))
    be.uniform(whole[:, ::2])
    values = host(be, whole)
    assert (values[:, 1::2] == 0).all()
    drawn = values[:, ::2]
    assert len(np.unique(drawn)) > 0.99 * drawn.size and drawn.mean() == pytest.approx(0.5, abs=0.03)


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_same_stream_and_reseed_restarts_it(device):
    def draws(be):
        return [host(be, be.uniform(be.empty((50, 7)))) for _ in range(3)]

    a, b, c = Backend(device, seed=11), Backend(device, seed=11), Backend(device, seed=12)
    first = draws(a)
    for x, y in zip(first, draws(b)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(first[0], draws(c)[0])
    a.reseed(11)
    np.testing.assert_array_equal(draws(a)[0], first[0])
    a.reseed(2**32 - 1)  # seeds are 32-bit step seeds (iterreduce.program.shard_seed)
    assert not np.array_equal(draws(a)[0], first[0])


@pytest.mark.parametrize("device", DEVICES)
def test_normal_numbers_have_the_asked_scale(device):
    be = Backend(device, seed=5)
    x = host(be, be.normal((300, 400), scale=0.01))
    assert x.mean() == pytest.approx(0.0, abs=2e-4)
    assert x.std() == pytest.approx(0.01, rel=0.02)
    assert len(np.unique(x)) > 0.99 * x.size
    assert abs(np.corrcoef(x[:, :-1].ravel(), x[:, 1:].ravel())[0, 1]) < 0.02


@pytest.mark.parametrize("device", DEVICES)
def test_bernoulli_samples_follow_their_probabilities(device):
    """Gibbs sampling as the RBM does it: a sample is 1 with the unit's probability."""
    from dbn import RBM

    rbm = RBM(4, device=device, seed=0)
    p = rbm.backend.asarray(np.tile(np.linspace(0.05, 0.95, 19, dtype=np.float32), (4000, 1)))
    samples = host(rbm.backend, rbm._sample(p, rbm.backend.empty(p.shape)))
    assert set(np.unique(samples)) <= {0.0, 1.0}
    np.testing.assert_allclose(samples.mean(axis=0), np.linspace(0.05, 0.95, 19), atol=0.03)
    # Rows are independent: the share of rows where unit 9 (p=0.5) is on is not all-or-nothing.
    assert 0.45 < samples[:, 9].mean() < 0.55
