"""One array module for NumPy (CPU) and CuPy (GPU).

The model code calls ``backend.xp`` (numpy or cupy) and the few helpers here, so
the same maths runs on either device. Arrays stay on the device between steps;
only ``to_numpy`` brings them back to the host.
"""

from __future__ import annotations

import numpy as np

from . import kernels
from ..exceptions import BackendError

DEVICES = ("cpu", "gpu", "auto")
DTYPES = ("float32", "float64")


def _import_cupy():
    try:
        import cupy
    except ImportError:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # no driver, no device: CuPy imports but cannot run
        return None
    return cupy


def gpu_available() -> bool:
    """True when CuPy is installed and sees at least one CUDA device."""
    return _import_cupy() is not None


def resolve_device(device: str) -> str:
    """Turn ``"cpu" | "gpu" | "auto"`` into ``"cpu"`` or ``"gpu"``."""
    if device not in DEVICES:
        raise BackendError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "auto":
        return "gpu" if gpu_available() else "cpu"
    if device == "gpu" and not gpu_available():
        raise BackendError(
            "device='gpu' needs CuPy and a CUDA device: install the extra "
            "(pip install 'dbn-yarn[gpu]') on a machine with a GPU, or use device='cpu'"
        )
    return device


class Backend:
    """An array module, a dtype and a seeded random stream on one device.

    Parameters
    ----------
    device : "cpu", "gpu" or "auto"
        "auto" picks the GPU when CuPy sees one.
    dtype : "float32" (default) or "float64"
        float64 is for gradient checks; training uses float32.
    seed : int or None
        Seeds the device's random numbers and the host generator used for
        shuffling. The same seed gives the same numbers on the same device.
    """

    def __init__(self, device: str = "auto", dtype: str = "float32", seed: int | None = None):
        if dtype not in DTYPES:
            raise BackendError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.device = resolve_device(device)
        self.dtype = np.dtype(dtype)
        if self.device == "gpu":
            import cupy

            self.xp = cupy
        else:
            self.xp = np
        self.reseed(seed)

    def __repr__(self) -> str:
        return f"Backend(device={self.device!r}, dtype={self.dtype.name!r})"

    def reseed(self, seed: int | None) -> None:
        """Restart the device's random stream from ``seed`` (distributed steps seed each step)."""
        if self.device == "gpu":
            self._rng = self.xp.random.default_rng(seed)
            self._uniform = CurandUniform(seed)
        else:
            self._rng = np.random.default_rng(seed)

    def asarray(self, x, dtype=None):
        """Copy ``x`` to the device (no copy when it is already there in ``dtype``)."""
        return self.xp.asarray(x, dtype=dtype or self.dtype)

    def copy(self, x, dtype=None):
        """A device copy of ``x`` that the caller owns (for state that is updated in place)."""
        return self.xp.array(x, dtype=dtype or self.dtype, copy=True)

    def to_numpy(self, x) -> np.ndarray:
        """A host NumPy copy of a device array (a copy on the CPU too, so it never
        changes when training goes on)."""
        if self.device == "gpu":
            return self.xp.asnumpy(x)
        return np.array(x, copy=True)

    def empty(self, shape, dtype=None):
        return self.xp.empty(shape, dtype=dtype or self.dtype)

    def zeros(self, shape, dtype=None):
        return self.xp.zeros(shape, dtype=dtype or self.dtype)

    def uniform(self, out):
        """Fill ``out`` with uniform [0, 1) numbers on the device and return it
        (float32 on the CPU: :func:`dbn.model.kernels.uniform_float32_`)."""
        if self.device == "gpu":
            return self._uniform.fill(out)
        if not out.flags.c_contiguous:  # NumPy's generators write only contiguous arrays
            out[...] = self.uniform(np.empty(out.shape, out.dtype))
        elif out.dtype == np.float32:
            kernels.uniform_float32_(self._rng.bit_generator, out)
        else:
            self._rng.random(out=out, dtype=out.dtype)
        return out

    def normal(self, shape, scale: float = 1.0):
        """Normal(0, scale^2) numbers of the backend dtype on the device."""
        x = self._rng.standard_normal(shape, dtype=self.dtype)
        if scale != 1.0:
            x *= scale
        return x

    def sigmoid(self, x, out=None, bias=None):
        """Logistic function of ``x + bias`` (``bias`` optional, broadcast along the last axis).

        One fused pass (:mod:`dbn.model.kernels`): on the CPU in float32 a rational tanh, else
        0.5*tanh(x/2)+0.5; neither can overflow. ``out=x`` works in place, which the training
        loops rely on; ``out=None`` returns a new array.
        """
        if out is None:
            out = x.copy()
        elif out is not x:
            out[...] = x
        if self.device == "cpu":
            return kernels.sigmoid_(out, bias)
        return kernels.gpu_sigmoid_(out, bias)

    def momentum_step(self, param, inc, grad, momentum: float, decay: float = 0.0) -> None:
        """In place: ``inc = momentum * inc + grad - decay * param``, then ``param += inc``."""
        kernels.momentum_step_(param, inc, grad, momentum, decay, xp=self.xp)

    def synchronize(self) -> None:
        """Wait for queued device work (for honest timings on the GPU)."""
        if self.device == "gpu":
            self.xp.cuda.get_current_stream().synchronize()


class CurandUniform:
    """Uniform numbers from cuRAND's Philox generator, written in place into CuPy arrays.

    Not ``cupy.random.Generator.random(out=...)``: in CuPy 14.2 that wrote one value into
    every element (seen on an H100 on 2026-11-24), which silently turned Gibbs sampling and
    dropout masks into one coin per minibatch. cuRAND's numbers lie in (0, 1]: a sample
    ``u < p`` is 1 with probability p, a dropout ``u >= p`` keeps a unit with 1 - p.
    """

    def __init__(self, seed: int | None):
        from cupy.cuda import curand

        self._curand = curand
        self._generator = curand.createGenerator(curand.CURAND_RNG_PSEUDO_PHILOX4_32_10)
        # Any seed NumPy accepts (None: fresh entropy), folded into cuRAND's 64-bit seed.
        state = np.random.SeedSequence(seed).generate_state(1, np.uint64)[0]
        curand.setPseudoRandomGeneratorSeed(self._generator, int(state))

    def fill(self, out):
        """Fill the float32 or float64 CuPy array ``out`` and return it."""
        import cupy

        if not out.flags.c_contiguous:
            out[...] = self.fill(cupy.empty(out.shape, out.dtype))
            return out
        curand = self._curand
        curand.setStream(self._generator, cupy.cuda.get_current_stream().ptr)
        if out.dtype == np.float32:
            curand.generateUniform(self._generator, out.data.ptr, out.size)
        elif out.dtype == np.float64:
            curand.generateUniformDouble(self._generator, out.data.ptr, out.size)
        else:
            raise BackendError(f"uniform numbers are float32 or float64, not {out.dtype}")
        return out

    def __del__(self):
        generator, self._generator = getattr(self, "_generator", None), None
        if generator is not None:
            try:
                self._curand.destroyGenerator(generator)
            except Exception:  # interpreter shutdown: the CUDA context may be gone already
                pass


def get_backend(device: str = "auto", dtype: str = "float32", seed: int | None = None) -> Backend:
    """Convenience constructor, see :class:`Backend`."""
    return Backend(device=device, dtype=dtype, seed=seed)
