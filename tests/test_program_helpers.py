"""The pieces of iterreduce.program a reduce is made of, tested alone: the weighted average of
updates, metrics summarized by samples, shard seeds, steps as JSON, and block momentum (classical
and Nesterov, with a block learning rate)."""

from __future__ import annotations

import numpy as np
import pytest

from iterreduce.program import Program, Step, Update, shard_seed, step_from_json, step_to_json, weighted_average


# ------------------------------------------------------------- program helpers


def test_weighted_average_weights_by_samples_and_ignores_empty_updates():
    a = Update(0, 100, {"w": np.full((2, 2), 1.0, np.float32), "b": np.array([0.0], np.float32)})
    b = Update(1, 300, {"w": np.full((2, 2), 5.0, np.float32), "b": np.array([4.0], np.float32)})
    empty = Update(2, 0, {"w": np.full((2, 2), np.nan, np.float32), "b": np.array([1e30], np.float32)})
    out = weighted_average([empty, b, a], ["w", "b"])
    np.testing.assert_allclose(out["w"], 4.0)  # 0.25 * 1 + 0.75 * 5
    np.testing.assert_allclose(out["b"], 3.0)
    assert out["w"].dtype == np.float32 and out["w"].shape == (2, 2)
    # Only the named arrays are reduced.
    assert set(weighted_average([a, b], ["w"])) == {"w"}
    # The order the updates arrive in does not change a bit.
    x = [Update(i, n, {"w": np.random.default_rng(i).standard_normal(50).astype(np.float32)})
         for i, n in enumerate([3, 7, 11, 13])]
    assert np.array_equal(weighted_average(x, ["w"])["w"], weighted_average(x[::-1], ["w"])["w"])
    with pytest.raises(ValueError, match="no update with samples"):
        weighted_average([empty], ["w"])


def test_summarize_weights_metrics_by_samples():
    class P(Program):
        def initial_parameters(self, seed, shards):
            return {}

        def schedule(self, shards):
            return iter(())

    rec = P({}).summarize(Step("x"), [Update(0, 10, metrics={"loss": 1.0, "tag": "a"}),
                                       Update(1, 30, metrics={"loss": 3.0, "err": 0.5})])
    assert rec["samples"] == 40
    assert rec["loss"] == pytest.approx(2.5)
    assert rec["err"] == pytest.approx(0.5)  # averaged over the updates that report it
    assert "tag" not in rec


def test_shard_seed_depends_on_job_step_and_shard_only():
    seeds = {(j, s, k): shard_seed(j, s, k) for j in range(2) for s in range(4) for k in range(4)}
    assert len(set(seeds.values())) == len(seeds)  # all distinct
    assert all(shard_seed(*key) == value for key, value in seeds.items())  # and reproducible
    assert all(isinstance(v, int) and 0 <= v < 2**32 for v in seeds.values())


def test_step_json_round_trip():
    step = Step("pretrain", {"layer": 1, "batches": [2, 4]}, ("a", "b"))
    assert step_from_json(step_to_json(step)) == Step("pretrain", {"layer": 1, "batches": [2, 4]}, ("a", "b"))


# ------------------------------------------------------------- block momentum


def test_block_momentum_average_accelerates_a_steady_direction():
    from iterreduce.program import MASTER_ONLY, block_momentum_average

    params = {"w": np.zeros(3, np.float32), "w_inc": np.zeros(3, np.float32)}
    ups = [Update(0, 10, {"w": np.ones(3, np.float32), "w_inc": np.full(3, 2, np.float32)}),
           Update(1, 30, {"w": np.ones(3, np.float32), "w_inc": np.full(3, 4, np.float32)})]
    plain = block_momentum_average(params, ups, ["w", "w_inc"], 0.0)
    assert set(plain) == {"w", "w_inc"}  # momentum 0 is the weighted average
    np.testing.assert_allclose(plain["w_inc"], 3.5)
    first = block_momentum_average(params, ups, ["w", "w_inc"], 0.9, plain=["w_inc"])
    np.testing.assert_allclose(first["w"], 1.0)  # no previous delta yet
    np.testing.assert_allclose(first["w_inc"], 3.5)  # optimizer state: only averaged
    params.update(first)
    # Workers again move +1 from the new point: the block momentum adds 0.9 of the last delta.
    ups2 = [Update(0, 10, {"w": params["w"] + 1, "w_inc": params["w_inc"]})]
    second = block_momentum_average(params, ups2, ["w", "w_inc"], 0.9, plain=["w_inc"])
    np.testing.assert_allclose(second["w"], 1.0 + 1.0 + 0.9)
    np.testing.assert_allclose(second[f"{MASTER_ONLY}block_delta.w"], 1.9)


def test_block_learning_rate_scales_each_syncs_step_at_once():
    from iterreduce.program import MASTER_ONLY, block_momentum_average

    params = {"w": np.full(3, 2, np.float32), "w_inc": np.zeros(3, np.float32)}
    ups = [Update(0, 10, {"w": params["w"] + 1, "w_inc": np.ones(3, np.float32)}),
           Update(1, 10, {"w": params["w"] + 3, "w_inc": np.ones(3, np.float32)})]
    # Without momentum: the mean moved +2, the block learning rate 5 moves +10; no state kept.
    scaled = block_momentum_average(params, ups, ["w", "w_inc"], 0.0, plain=["w_inc"], block_learning_rate=5.0)
    assert set(scaled) == {"w", "w_inc"}
    np.testing.assert_allclose(scaled["w"], 2 + 10)
    np.testing.assert_allclose(scaled["w_inc"], 1.0)  # optimizer state: only averaged, never scaled
    # With momentum the scaled step is what the momentum remembers.
    first = block_momentum_average(params, ups, ["w"], 0.5, block_learning_rate=2.0)
    np.testing.assert_allclose(first["w"], 2 + 4)
    np.testing.assert_allclose(first[f"{MASTER_ONLY}block_delta.w"], 4)
    params.update(first)
    second = block_momentum_average(params, [Update(0, 1, {"w": params["w"] + 1})], ["w"], 0.5, block_learning_rate=2.0)
    np.testing.assert_allclose(second["w"], 6 + 2 + 0.5 * 4)


def test_nesterov_block_momentum_sends_the_look_ahead_point():
    from iterreduce.program import MASTER_ONLY, block_momentum_average

    params = {"w": np.zeros(2, np.float32)}
    first = block_momentum_average(params, [Update(0, 1, {"w": np.ones(2, np.float32)})], ["w"], 0.5, nesterov=True)
    np.testing.assert_allclose(first[f"{MASTER_ONLY}block_delta.w"], 1.0)
    np.testing.assert_allclose(first["w"], 1.0 + 0.5 * 1.0)  # the mean plus momentum x the new delta
    params.update(first)
    # The workers move +1 from the look-ahead point 1.5: the mean is 2.5.
    second = block_momentum_average(params, [Update(0, 1, {"w": np.full(2, 2.5, np.float32)})], ["w"], 0.5,
                                    nesterov=True)
    delta = 0.5 * 1.0 + (2.5 - 1.5)
    np.testing.assert_allclose(second[f"{MASTER_ONLY}block_delta.w"], delta)
    np.testing.assert_allclose(second["w"], 2.5 + 0.5 * delta)
    classical = block_momentum_average({"w": np.zeros(2, np.float32)}, [Update(0, 1, {"w": np.ones(2, np.float32)})],
                                       ["w"], 0.5)
    np.testing.assert_allclose(classical["w"], 1.0)  # classical block momentum: no look-ahead
