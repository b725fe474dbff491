"""One array module for NumPy (CPU) and CuPy (GPU).

The model code calls ``backend.xp`` (numpy or cupy) and the few helpers here, so
the same maths runs on either device. Arrays stay on the device between steps;
only ``to_numpy`` brings them back to the host.
"""

from __future__ import annotations

import numpy as np

from ..errors import BackendError
from . import kernels
from .graphs import graphs_enabled

DEVICES = ("cpu", "gpu", "auto")
DTYPES = ("float32", "float64")
#: GPU -> host copies up to this size land in page-locked (pinned) memory, 4x the bandwidth of
#: a pageable copy (``benchmarks/gpu_transfers.py``); larger ones go to pageable memory, since
#: page-locked memory is a scarce resource of the host and CuPy's pool keeps what it allocated.
PINNED_COPY_BYTES = 64 << 20


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


def check_environment() -> None:
    """Refuse environment settings the backends read that hold unclear values (for a job's
    pre-flight, before anything is written)."""
    graphs_enabled()


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
            "(pip install 'dbn-yarn[gpu]', or 'dbn-yarn[gpu-cuda13]' for CUDA 13) on a machine with a GPU, "
            "or use device='cpu'"
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

    Attributes
    ----------
    graphs : bool
        Whether training steps run as CUDA graphs (:mod:`dbn.model.graphs`): on the GPU
        unless ``DBN_CUDA_GRAPHS=0``; settable, e.g. to compare with eager steps.
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
        # GPU training steps run as CUDA graphs (dbn.model.graphs) unless switched off; the
        # switch is read on every device, so a typo in it shows anywhere.
        self.graphs = graphs_enabled() and self.device == "gpu"
        self.reseed(seed)

    def __repr__(self) -> str:
        return f"Backend(device={self.device!r}, dtype={self.dtype.name!r})"

    def reseed(self, seed: int | None) -> None:
        """Restart the device's random stream from ``seed`` (distributed steps seed each step)."""
        if self.device == "gpu":
            self._rng = self.xp.random.default_rng(seed)
            if getattr(self, "_uniform", None) is None:
                self._uniform = PhiloxUniform(seed)
            else:  # in place: graphs captured with this backend read the generator's device state
                self._uniform.reseed(seed)
        else:
            self._rng = np.random.default_rng(seed)

    @property
    def random_state(self):
        """The device array that holds the GPU generator's key and draw number (None on the CPU):
        a captured graph reads it, so its address is part of the graph's key."""
        return self._uniform.state if self.device == "gpu" else None

    def asarray(self, x, dtype=None):
        """Copy ``x`` to the device (no copy when it is already there in ``dtype``)."""
        return self.xp.asarray(x, dtype=dtype or self.dtype)

    def copy(self, x, dtype=None):
        """A device copy of ``x`` that the caller owns (for state that is updated in place)."""
        return self.xp.array(x, dtype=dtype or self.dtype, copy=True)

    def load(self, target, value):
        """``value`` (host or device) as a device array of the backend dtype: written into
        ``target`` in place when ``target`` has its shape (the address stays, so buffers and
        captured CUDA graphs that read it stay valid), else a new copy."""
        if target is None or tuple(target.shape) != np.shape(value):
            return self.copy(value)
        target[...] = self.xp.asarray(value, dtype=target.dtype)
        return target

    def zeroed(self, target, like):
        """Zeros shaped as ``like``: ``target`` set to zero in place when it has that shape, else a
        new array (an increment a loaded state leaves out, as :meth:`load` keeps addresses)."""
        if target is None or target.shape != like.shape:
            return self.xp.zeros_like(like)
        target[...] = 0
        return target

    def to_numpy(self, x) -> np.ndarray:
        """A host NumPy copy of a device array (a copy on the CPU too, so it never
        changes when training goes on). On the GPU, a copy of at most :data:`PINNED_COPY_BYTES`
        lands in a fresh buffer of page-locked memory (from CuPy's pool: it goes back there when
        the array is freed), as the parameters a worker sends every superstep do."""
        if self.device == "gpu":
            if x.ndim == 0 or not 0 < x.nbytes <= PINNED_COPY_BYTES:
                return self.xp.asnumpy(x)
            import cupyx

            x = self.xp.ascontiguousarray(x)
            return x.get(out=cupyx.empty_pinned(x.shape, x.dtype))
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

    def matmul(self, a, b, out=None):
        """``a @ b`` (into ``out`` when given). On the GPU cuBLAS is called directly
        (:func:`dbn.model.kernels.gpu_matmul`), so a step can be captured as a CUDA graph."""
        if self.device == "cpu":
            return np.matmul(a, b, out=out)
        return kernels.gpu_matmul(a, b, out)

    def momentum_step(self, param, inc, grad, momentum: float, decay: float = 0.0) -> None:
        """In place: ``inc = momentum * inc + grad - decay * param``, then ``param += inc``."""
        kernels.momentum_step_(param, inc, grad, momentum, decay, xp=self.xp)

    def synchronize(self) -> None:
        """Wait for queued device work (for honest timings on the GPU)."""
        if self.device == "gpu":
            self.xp.cuda.get_current_stream().synchronize()


class PhiloxUniform:
    """Uniform [0, 1) numbers from a counter-based generator whose counter lives on the GPU.

    Each call fills ``out`` with Philox4x32-10 of (element index, draw number) under the
    seed's key (:data:`dbn.model.kernels.PHILOX_SOURCE`), then a one-thread kernel advances
    the draw number in device memory. The host holds no state that changes between calls,
    so a training step captured in a CUDA graph (:mod:`dbn.model.graphs`) draws fresh
    numbers on every replay; cuRAND's host API would bake one draw into the graph.
    Values are ``(bits >> 8) * 2**-24``, the CPU's float32 formula: a sample ``u < p`` is 1
    with probability p, a dropout ``u >= p`` keeps a unit with 1 - p.

    (Not ``cupy.random.Generator.random(out=...)``: in CuPy 14.2 that wrote one value into
    every element, seen on an H100 on 2026-11-24.)
    """

    def __init__(self, seed: int | None = None):
        import cupy

        self.state = cupy.zeros(2, dtype=cupy.uint64)  # [key, draw number], updated in place
        self.reseed(seed)

    def reseed(self, seed: int | None) -> None:
        """Restart the stream: any seed NumPy accepts (None: fresh entropy), folded into a 64-bit key."""
        key = np.random.SeedSequence(seed).generate_state(1, np.uint64)[0]
        self.state.set(np.array([key, 0], dtype=np.uint64))  # in place: captured graphs keep the address

    def fill(self, out):
        """Fill the float32 or float64 CuPy array ``out`` (any strides) and return it."""
        if out.dtype not in (np.float32, np.float64):
            raise BackendError(f"uniform numbers are float32 or float64, not {out.dtype}")
        gpu = kernels.gpu_kernels()
        gpu["philox_uniform"](self.state, out)
        gpu["philox_advance"]((1,), (1,), (self.state,))
        return out


def get_backend(device: str = "auto", dtype: str = "float32", seed: int | None = None) -> Backend:
    """Convenience constructor, see :class:`Backend`."""
    return Backend(device=device, dtype=dtype, seed=seed)
