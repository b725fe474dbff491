"""The fused CPU kernels: same bits as their NumPy formulas, accurate, independent of alignment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dbn.model import kernels
from dbn.model.backend import Backend
from dbn.model.rbm import RBM

pytestmark = pytest.mark.skipif(kernels.load() is None, reason="numba is not installed")


@pytest.fixture(autouse=True)
def compiled():
    """The kernels loaded, whatever work this process did before (a process loads them only once it
    has done enough in NumPy's expressions): these tests compare them with those expressions."""
    assert kernels.load() is not None and kernels.kernels() is kernels.load()


def _awkward_values(rng, n):
    """Ordinary values plus the edges: +-0, the clamp, huge, tiny and subnormal magnitudes."""
    edges = np.array([0.0, -0.0, 15.81, -15.81, 15.82, -15.82, 1e30, -1e30, 1e-30, 1e-42, -1e-42, 88.0, -104.0],
                     dtype=np.float32)
    x = (rng.standard_normal(n) * 8).astype(np.float32)
    x[: edges.size] = edges
    return x


@pytest.mark.parametrize("offset", [0, 1, 3, 7])  # element offsets: the vector loop starts unaligned
def test_sigmoid_kernel_gives_the_reference_bits_at_any_alignment(offset):
    rng = np.random.default_rng(offset)
    buffer = np.empty(1037 + offset, dtype=np.float32)
    x = buffer[offset:]
    x[...] = _awkward_values(rng, x.size)
    expected = kernels.sigmoid_reference(x)
    kernels.sigmoid_(x)
    assert np.array_equal(x.view(np.uint32), expected.view(np.uint32))


def test_sigmoid_kernel_with_bias_is_the_reference_of_the_sum():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 29)).astype(np.float32) * 5
    bias = rng.standard_normal(29).astype(np.float32)
    expected = kernels.sigmoid_reference(x + bias)
    assert np.array_equal(kernels.sigmoid_(x.copy(), bias), expected)
    # Not contiguous: the NumPy formula runs instead, with the same result.
    wide = np.zeros((37, 58), dtype=np.float32)
    wide[:, ::2] = x
    assert np.array_equal(kernels.sigmoid_(wide[:, ::2], bias), expected)


def test_float32_sigmoid_is_accurate_and_stays_in_the_unit_interval():
    x = np.linspace(-60, 60, 400_001, dtype=np.float32)
    exact = 1 / (1 + np.exp(-x.astype(np.float64)))
    got = kernels.sigmoid_(x.copy())
    assert np.abs(got - exact).max() < 3e-7
    assert got.min() >= 0 and got.max() <= 1
    assert np.diff(got).min() >= -2.5e-7  # monotone to within a few float32 steps near 1


def test_float64_sigmoid_keeps_the_exact_formula():
    x = np.linspace(-30, 30, 1001)
    assert np.abs(Backend("cpu", "float64").sigmoid(x) - 1 / (1 + np.exp(-x))).max() < 1e-15


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_momentum_kernel_gives_the_bits_of_the_array_expressions(dtype):
    rng = np.random.default_rng(1)
    param, inc, grad = (rng.standard_normal((61, 17)).astype(dtype) for _ in range(3))
    p2, i2 = param.copy(), inc.copy()
    kernels.momentum_step_(param, inc, grad, 0.9, 2e-5)
    i2 *= 0.9
    i2 += grad
    i2 -= dtype(2e-5) * p2
    p2 += i2
    assert np.array_equal(inc, i2) and np.array_equal(param, p2)


def test_float32_cd_step_follows_the_float64_reference(naive_cd):
    """The fused float32 path does the same CD-1 update as the plain float64 reference."""
    rng = np.random.default_rng(3)
    X = rng.random((40, 12))
    rbm = RBM(7, batch_size=8, learning_rate=0.2, weight_cost=0.01, device="cpu", seed=5).initialize(X)
    rbm.set_state({"weights": rng.normal(0, 0.8, (12, 7)), "visible_bias": rng.normal(0, 0.5, 12),
                   "hidden_bias": rng.normal(0, 0.5, 7)})

    class Float32Draws:
        """Hands the reference the float32 uniforms the RBM drew, in order."""

        def __init__(self):
            self.rng = np.random.Generator(type(rbm.backend._rng.bit_generator)())
            self.rng.bit_generator.state = rbm.backend._rng.bit_generator.state

        def random(self, out, dtype):  # 64-bit outputs split into 32-bit halves, (bits >> 8) / 2**24
            bits = self.rng.bit_generator.random_raw((out.size + 1) // 2).view(np.uint32)[:out.size]
            out[...] = ((bits >> 8) / 2**24).reshape(out.shape)

    ref = naive_cd(rbm, Float32Draws())
    order = rbm.epoch_order(40, 0)
    for i in range(3):
        ref.step(X[order[i * 8:(i + 1) * 8]], 0.5)
    rbm.train_epoch(X.astype(np.float32), 0, batches=range(3))
    state = rbm.get_state()
    np.testing.assert_allclose(state["weights"], ref.W, atol=2e-5)
    np.testing.assert_allclose(state["hidden_bias"], ref.b, atol=2e-5)
    np.testing.assert_allclose(state["visible_bias"], ref.a, atol=2e-5)


def test_float32_uniforms_are_numpys_formula_from_the_raw_stream():
    """From a fresh generator they are exactly what Generator.random(dtype=float32) draws."""
    be = Backend("cpu", seed=11)
    fresh = np.random.default_rng(11)
    got = be.uniform(np.empty((37, 50), dtype=np.float32))
    assert np.array_equal(got, fresh.random((37, 50), dtype=np.float32))
    assert 0 <= got.min() and got.max() < 1
    odd = be.uniform(np.empty(7, dtype=np.float32))  # 4 raw outputs; the last half is dropped
    assert np.array_equal(odd, fresh.random(8, dtype=np.float32)[:7])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_and_backward_kernels_give_the_bits_of_the_array_expressions(dtype):
    rng = np.random.default_rng(2)
    a = rng.random((33, 21)).astype(dtype)
    u = rng.random((33, 21)).astype(dtype)
    delta = rng.standard_normal((33, 21)).astype(dtype)
    dropped = kernels.dropout(a, u.copy(), 0.3, out=np.empty_like(a))
    expected = (u >= 0.3) * a
    expected *= dtype(1 / (1 - 0.3))
    assert np.array_equal(dropped, expected) and (dropped == 0).any()

    got = kernels.sigmoid_backward_(delta.copy(), a, dropped, 1 / (1 - 0.3))
    want = delta * (dropped != 0)
    want *= dtype(1 / (1 - 0.3))
    want *= a * (1 - a)
    assert np.array_equal(got, want)
    plain = kernels.sigmoid_backward_(delta.copy(), a)  # no dropout: a's own derivative
    assert np.array_equal(plain, delta * (a * (1 - a)))


def test_dropout_refuses_an_output_that_overlaps_its_inputs():
    """An overlapping output would run the scalar fallback loop, with a branch on every random
    number: 30 times slower, and it once cost fine-tuning a third of its time."""
    a = np.random.default_rng(3).random((10, 8)).astype(np.float32)
    u = np.random.default_rng(4).random((10, 8)).astype(np.float32)
    for out in (u, a, u[2:]):
        with pytest.raises(ValueError, match="out must be an array of its own"):
            kernels.dropout(a, u, 0.5, out=out)


def _example_arguments(name: str) -> tuple:
    f32, n = np.float32, 64
    a, b, c = (np.ones(n, f32) for _ in range(3))
    return {"dropout": (a, b, f32(0.5), f32(2), f32(1), c), "sigmoid_flat": (a,),
            "sigmoid_bias": (a.reshape(8, 8), b[:8]), "momentum_step": (a, b, c, f32(0.9), f32(0.1)),
            "sigmoid_backward": (a, b, c, f32(2), f32(1)), "uniform_from_bits": (np.ones(n, np.uint32), a)}[name]


@pytest.mark.parametrize("name", sorted(kernels.load() or {}))
def test_every_float32_kernel_compiles_to_a_vector_loop(name):
    """The kernels exist to make one pass in SIMD registers; a branch or a Python-level check in a
    loop body silently makes it scalar. Recompiled uncached (numba cannot show cached code)."""
    numba = pytest.importorskip("numba")
    import re

    fresh = numba.njit(error_model="numpy", nogil=True)(kernels.load()[name].py_func)
    fresh(*_example_arguments(name))
    llvm_ir = next(iter(fresh.inspect_llvm().values()))
    assert re.search(r"<(4|8|16) x float>", llvm_ir), f"{name} has no vector loop over float32"


def _call_every_kernel():
    """Each float32 kernel once, through the functions training calls (so with their types)."""
    x, bias = np.zeros((2, 8), np.float32), np.zeros(8, np.float32)
    kernels.sigmoid_(x)
    kernels.sigmoid_(x, bias)
    kernels.momentum_step_(x, np.zeros_like(x), np.zeros_like(x), 0.9, 2e-4)
    kept = np.ones_like(x)
    kernels.dropout(x, kept, 0.5, out=np.zeros_like(x))
    kernels.sigmoid_backward_(np.zeros_like(x), x, kept, 2.0)
    kernels.uniform_float32_(np.random.PCG64(0), x)


def test_every_kernel_loads_from_the_disk_cache_in_the_next_process(tmp_path):
    """A kernel numba cannot find in its cache compiles again in every worker process (0.2 s
    each, more with 8 at once) and saves one more file each time: one kernel held the element
    sigmoid in a closure cell, whose pickled bytes (part of the cache key) change per process."""
    import inspect
    import os
    import subprocess
    import sys

    child = f"from dbn.model import kernels\nimport numpy as np\n{inspect.getsource(_call_every_kernel)}\nkernels.load()\n_call_every_kernel()"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), NUMBA_DEBUG_CACHE="1")

    def run() -> str:
        done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 0, done.stderr
        return done.stdout

    first, second = run(), run()
    n = len(kernels.load())
    assert first.count("data saved") == n
    assert second.count("data loaded") == n and "data saved" not in second, second
    assert len(list(tmp_path.rglob("*.nbc"))) == n


#: A child that fits a small DBN (dropout on, so every kernel is met) with the kernels loaded after
#: ``argv[1]`` elements of NumPy's passes, and says whether numba was loaded, how many elements NumPy's
#: expressions took and the digest of the model's arrays.
FIT_CHILD = """
import hashlib, json, sys
import numpy as np
from dbn.model import kernels
kernels.LOAD_AFTER_ELEMENTS = float(sys.argv[1])
from dbn import DBN
rng = np.random.default_rng(0)
X = rng.random((300, 20), dtype=np.float32)
y = (X[:, :4].sum(axis=1) > 2).astype(np.int64)
model = DBN([16, 8], pretrain_epochs=2, finetune_epochs=2, pretrain_batch_size=10, finetune_batch_size=10,
            dropout=0.5, input_dropout=0.2, device="cpu", seed=3).fit(X, y)
digest = hashlib.sha256()
for name, array in sorted(model.get_state().items()):
    digest.update(name.encode() + np.ascontiguousarray(array).tobytes())
print(json.dumps({"numba": "numba" in sys.modules, "elements": kernels._numpy_elements, "digest": digest.hexdigest()}))
"""


def test_a_short_fit_never_loads_numba_and_one_that_loads_it_early_or_midway_learns_the_same_bits():
    """The kernels are loaded only once a process has done :data:`~dbn.model.kernels.LOAD_AFTER_ELEMENTS`
    of work in NumPy's expressions (a job's short processes never pay numba's load); whenever that
    happens, before the first pass or between two, the model is the same bits."""
    import json
    import subprocess
    import sys

    def fit(load_after) -> dict:
        done = subprocess.run([sys.executable, "-c", FIT_CHILD, str(load_after)], capture_output=True, text=True,
                              timeout=300, cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    short = fit(kernels.LOAD_AFTER_ELEMENTS)
    assert not short["numba"] and 0 < short["elements"] < kernels.LOAD_AFTER_ELEMENTS
    at_once, midway = fit(0), fit(short["elements"] // 2)
    assert at_once["numba"] and at_once["elements"] < short["elements"] // 100  # the first pass loaded them
    assert midway["numba"] and short["elements"] // 2 <= midway["elements"] < short["elements"]
    assert short["digest"] == at_once["digest"] == midway["digest"]
