"""The master's synchronisation path (issue 13): the reduce's bits whatever the arrival order,
and the broadcast encoded once per parameter value."""

from __future__ import annotations

import numpy as np
import pytest

from conftest_runtime import InProcessJob, blobs, load_npz, simulate
from iterreduce.program import REDUCE_BLOCK, Update, block_momentum_average, weighted_average
from iterreduce.proto import iterreduce_pb2 as pb
from iterreduce.transport import wire
from shardio.shards import write_shards


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("shape", [(), (7,), (300, 250), (3, 1 << 15, 1)])
def test_weighted_average_keeps_its_bits_in_any_arrival_order(dtype, shape):
    """Updates arrive in whatever order the workers finish: the average is summed in shard order."""
    rng = np.random.default_rng([len(shape), np.dtype(dtype).num])
    updates = [Update(i, int(rng.integers(1, 7000)), {"w": (100 * rng.standard_normal(shape)).astype(dtype)})
               for i in range(9)]
    updates[4].samples = 0  # left out
    expected = weighted_average(updates, ["w"])["w"]
    total = sum(u.samples for u in updates)
    exact = sum(u.samples / total * u.arrays["w"].astype(np.float64) for u in updates)
    assert np.allclose(expected, exact, rtol=1e-5, atol=1 if dtype == np.int32 else 1e-3)  # the weighted mean
    for order in (updates[::-1], [updates[i] for i in rng.permutation(len(updates))]):
        got = weighted_average(order, ["w"])["w"]
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()


# ------------------------------------------------------------------- the broadcast


@pytest.fixture
def job(tmp_path):
    X, y = blobs(300, d=6, k=3)
    uris = write_shards(X, y, str(tmp_path / "shards"), 3)
    made = InProcessJob(tmp_path / "out", uris, workers=2)
    yield made
    made.close()


def test_the_broadcast_is_encoded_once_per_value(job):
    master = job.master
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    first = master.broadcast.encoded("w", w, 1)
    assert master.broadcast.encoded("w", w, 1) is first  # the next worker gets the same bytes
    chunks = [c for raw in first for c in pb.TaskChunk.FromString(raw).tensors]
    assert np.array_equal(wire.decode(chunks)["w"], w)
    # A new value is encoded again, at a new version or at the same one (a resume, before_step).
    again = master.broadcast.encoded("w", w.copy(), 1)
    assert again is not first and again == first
    changed = w + 1
    newer = master.broadcast.encoded("w", changed, 2)
    assert np.array_equal(wire.decode(c for raw in newer for c in pb.TaskChunk.FromString(raw).tensors)["w"], changed)
    assert master.broadcast.encoded("w", changed, 2) is newer
    assert len(master.broadcast.cache) == 1  # older values are not kept


def test_float16_broadcast_is_narrowed_once(tmp_path):
    X, y = blobs(120, d=4, k=3)
    uris = write_shards(X, y, str(tmp_path / "shards"), 2)
    job = InProcessJob(tmp_path / "out", uris, workers=1, float16_wire=True)
    try:
        w = np.linspace(-1, 1, 10, dtype=np.float32)
        chunks = [c for raw in job.master.broadcast.encoded("w", w, 0) for c in pb.TaskChunk.FromString(raw).tensors]
        assert chunks[0].narrowed and chunks[0].dtype == "float16"
        assert np.array_equal(wire.decode(chunks)["w"], w.astype(np.float16).astype(np.float32))
    finally:
        job.close()


def test_a_job_through_the_new_sync_path_is_the_sequential_run(job):
    """Fetches share the encoded broadcast and pushes wake only the step's driver: the model
    is still the one a sequential run computes, bit for bit."""
    for name in ("worker-0", "worker-1"):
        job.add_worker(name)
    job.start().wait(timeout=60)
    final = load_npz(job.output / "parameters.npz")
    expected = simulate(job.config.program, job.config.program_config, job.config.shards)
    assert sorted(final) == sorted(expected)
    for name in expected:
        assert final[name].tobytes() == expected[name].tobytes(), name
    # The cache holds the last broadcast value of each parameter, no more.
    assert {name for name, _ in job.master.broadcast.cache} <= set(job.master.parameters)
    for (name, _), (version, array, _) in job.master.broadcast.cache.items():
        assert version <= job.master.versions[name]


# ------------------------------------------------------------------- the reduce a block at a time


def _whole_average(updates, names):
    """The weighted average on whole arrays: what the blocked reduce must equal bit for bit."""
    updates = [u for u in updates if u.samples > 0]
    total = float(sum(u.samples for u in updates))
    result = {}
    for name in names:
        acc = np.zeros(updates[0].arrays[name].shape, dtype=np.float64)
        for u in sorted(updates, key=lambda u: u.shard):
            acc += (u.samples / total) * u.arrays[name]
        result[name] = acc.astype(updates[0].arrays[name].dtype)
    return result


def _whole_block_momentum(parameters, updates, names, momentum, plain, rate, nesterov):
    mean = _whole_average(updates, names)
    result = {}
    for name in names:
        if name in plain:
            result[name] = mean[name]
            continue
        key = f"master.block_delta.{name}"
        delta = rate * (mean[name].astype(np.float64) - parameters[name])
        previous = parameters.get(key) if momentum else None
        if previous is not None:
            delta += momentum * previous
        if momentum:
            result[key] = delta.astype(np.float32)
        moved = parameters[name] + delta
        if nesterov and momentum:
            moved += momentum * (delta if previous is None else delta - previous)
        result[name] = moved.astype(parameters[name].dtype)
    return result


BLOCK_SHAPES = [(), (0,), (7,), (REDUCE_BLOCK - 1,), (REDUCE_BLOCK + 1,), (3, REDUCE_BLOCK // 2 + 5), (300, 250)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("shape", BLOCK_SHAPES)
def test_the_blocked_average_is_the_whole_arrays_average(dtype, shape):
    rng = np.random.default_rng([len(shape), np.dtype(dtype).num, sum(shape)])
    updates = [Update(i, int(rng.integers(1, 9000)), {"w": (50 * rng.standard_normal(shape)).astype(dtype)})
               for i in (3, 0, 2, 1)]
    got, expected = weighted_average(updates, ["w"])["w"], _whole_average(updates, ["w"])["w"]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("momentum, rate, nesterov, with_previous",
                         [(0.9, 1.0, True, True), (0.9, 1.0, True, False), (0.7, 1.5, False, True), (0.0, 1.5, False, False)])
@pytest.mark.parametrize("shape", BLOCK_SHAPES)
def test_the_blocked_block_momentum_is_the_whole_arrays(shape, momentum, rate, nesterov, with_previous):
    rng = np.random.default_rng([len(shape), sum(shape), int(10 * momentum)])
    params = {"w": rng.standard_normal(shape).astype(np.float32), "w_inc": rng.standard_normal(shape).astype(np.float32)}
    if with_previous:
        params["master.block_delta.w"] = rng.standard_normal(shape).astype(np.float32)
    updates = [Update(i, int(rng.integers(1, 9000)), {k: params[k] + rng.standard_normal(shape).astype(np.float32)
                                                      for k in ("w", "w_inc")}) for i in range(3)]
    got = block_momentum_average(params, updates, ["w", "w_inc"], momentum, plain=("w_inc",),
                                 block_learning_rate=rate, nesterov=nesterov)
    expected = _whole_block_momentum(params, updates, ["w", "w_inc"], momentum, ("w_inc",), rate, nesterov)
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name].dtype == expected[name].dtype and got[name].shape == expected[name].shape, name
        assert got[name].tobytes() == expected[name].tobytes(), name
