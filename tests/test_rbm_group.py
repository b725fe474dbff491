"""RBMs trained in lockstep as one computation (issue 54, part 1: :mod:`dbn.model.rbm_group`):
each member ends where its RBM alone on its data ends, bit for bit on NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from dbn.model.rbm import RBM
from dbn.model.rbm_group import GroupError, RBMGroup


def shards(n_members: int, rows: int, n_visible: int, gaussian: bool = False) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    if gaussian:
        return [rng.normal(0, 1, (rows, n_visible)).astype(np.float32) for _ in range(n_members)]
    return [(rng.random((rows, n_visible)) < 0.3).astype(np.float32) for _ in range(n_members)]


def member(seed: int, X: np.ndarray, **params) -> RBM:
    return RBM(params.pop("n_hidden", 7), device="cpu", seed=seed, **params).initialize(X)


@pytest.mark.parametrize("params", [
    {}, {"cd_k": 3}, {"visible": "gaussian", "learning_rate": 0.01}, {"batch_size": 16, "momentum_epoch": 1},
    {"n_hidden": 1}], ids=["cd1", "cd3", "gaussian", "batch16-momentum-switch", "one-hidden"])
def test_each_member_ends_where_its_rbm_alone_ends_bit_for_bit(params):
    Xs = shards(3, 96, 11, gaussian=params.get("visible") == "gaussian")
    alone = [member(100 + g, X, **dict(params)) for g, X in enumerate(Xs)]
    together = [member(100 + g, X, **dict(params)) for g, X in enumerate(Xs)]
    group = RBMGroup(together)
    for epoch in range(3):
        expected = [rbm.train_epoch(X, epoch) for rbm, X in zip(alone, Xs)]
        got = group.train_epoch(Xs, epoch)
        assert [s.reconstruction_error for s in got] == [s.reconstruction_error for s in expected]
        assert [s.n_samples for s in got] == [s.n_samples for s in expected]
    for mine, theirs in zip(together, alone):
        a, b = mine.get_state(), theirs.get_state()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_a_range_of_minibatches_steps_the_members_as_their_own_ranges_do():
    Xs = shards(2, 120, 9)
    alone = [member(5 + g, X, batch_size=10) for g, X in enumerate(Xs)]
    group = RBMGroup([member(5 + g, X, batch_size=10) for g, X in enumerate(Xs)])
    for part in (range(0, 4), range(4, 12)):
        for rbm, X in zip(alone, Xs):
            rbm.train_epoch(X, 0, part)
        group.train_epoch(Xs, 0, part)
    for mine, theirs in zip(group.members, alone):
        np.testing.assert_array_equal(mine.get_state()["weights"], theirs.get_state()["weights"])


def test_a_members_state_loaded_later_is_what_the_group_trains():
    """A worker loads each superstep's parameters with set_state: in place, so into the group's stacks."""
    Xs = shards(2, 64, 8)
    together = [member(g, X) for g, X in enumerate(Xs)]
    group = RBMGroup(together)
    state = member(42, Xs[0]).get_state()
    together[1].set_state(state)
    np.testing.assert_array_equal(group.weights[1], state["weights"])
    alone = member(1, Xs[1]).set_state(state)
    alone.train_epoch(Xs[1], 0)
    group.train_epoch(Xs, 0)
    np.testing.assert_array_equal(together[1].get_state()["weights"], alone.get_state()["weights"])


def test_what_cannot_step_together_is_refused_before_anything_is_trained():
    Xs = shards(2, 64, 8)
    with pytest.raises(GroupError, match="differ in learning_rate"):
        RBMGroup([member(0, Xs[0]), member(1, Xs[1], learning_rate=0.5)])
    with pytest.raises(GroupError, match="persistent CD"):
        RBMGroup([member(0, Xs[0], persistent=True), member(1, Xs[1], persistent=True)])
    with pytest.raises(GroupError, match="differ in shape"):
        RBMGroup([member(0, Xs[0]), member(1, shards(1, 64, 9)[0])])
    group = RBMGroup([member(0, Xs[0]), member(1, Xs[1])])
    before = group.weights.copy()
    with pytest.raises(GroupError, match=r"\[64, 50\] rows\) make minibatches of different sizes or numbers"):
        group.train_epoch([Xs[0], Xs[1][:50]], 0)
    np.testing.assert_array_equal(group.weights, before)
