"""Fused elementwise kernels: one pass over memory where array expressions make several.

At batch 100 the products of a training step are small, and the passes between them
(the sigmoids, the momentum update) cost as much as a quarter of the step when each
is a chain of NumPy ufuncs on one core. These kernels fuse each chain into one loop,
compiled with numba and cached on disk, and loaded once a process has done enough work
to repay their load (:data:`LOAD_AFTER_ELEMENTS`; before, NumPy's expressions give the same bits).

Exact arithmetic: no fast-math, so every element gets the same IEEE operations in the
same order whether the compiled loop handles it in its vector body or its scalar tail.
A kernel's result therefore does not depend on the array's alignment or on which
process runs it, and :func:`sigmoid_reference` (the same operations as NumPy ufuncs)
gives the same bits, which the tests check.

The float32 sigmoid is ``0.5 * tanh(x / 2) + 0.5`` with tanh as a rational minimax
approximation on ``[-7.905, 7.905]`` (clamped outside, where float32 tanh is +-1 to
within 3e-7): a polynomial and one division, which vectorise, where NumPy's tanh and
exp take several times longer. Its absolute error is below 3e-7. float64 arrays,
which the gradient checks use, keep the exact formula (:func:`sigmoid_exact`).

On the GPU the same passes are CuPy ``ElementwiseKernel`` s (:func:`gpu_kernels`), with
CUDA's tanh; arrays they cannot take (not contiguous) go through CuPy expressions.
"""

from __future__ import annotations

import ctypes

import numpy as np

_f32 = np.float32
# tanh(x) ~ x * P(x^2) / Q(x^2) on [-_CLAMP, _CLAMP]: odd numerator, even denominator.
_P = tuple(_f32(c) for c in (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05,
                              5.12229709037114e-08, -8.60467152213735e-11, 2.00018790482477e-13,
                              -2.76076847742355e-16))
_Q = tuple(_f32(c) for c in (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04,
                              1.19825839466702e-06))
_CLAMP = _f32(7.90531110763549805)
_HALF = _f32(0.5)


def sigmoid_exact(x, out, xp=np):
    """``out = 0.5 * tanh(x / 2) + 0.5`` with the array module's tanh (any dtype, any device)."""
    out = xp.multiply(x, 0.5, out=out)
    xp.tanh(out, out=out)
    out *= 0.5
    out += 0.5
    return out


def sigmoid_reference(x: np.ndarray) -> np.ndarray:
    """The float32 kernel's formula as NumPy ufuncs: the same bits as :func:`sigmoid_`, slower.

    Used where numba is missing, and by the tests as the kernel's oracle."""
    x = np.minimum(np.maximum(x.astype(_f32) * _HALF, -_CLAMP), _CLAMP)
    x2 = x * x
    p = x2 * _P[6] + _P[5]
    for c in _P[4::-1]:
        p = p * x2 + c
    p = p * x
    q = x2 * _Q[3] + _Q[2]
    for c in _Q[1::-1]:
        q = q * x2 + c
    return _HALF * (p / q) + _HALF


def _compile():
    """Compile the kernels (numba caches them on disk); None when numba is not installed."""
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba is a dependency; this keeps a broken install running
        return None
    p0, p1, p2, p3, p4, p5, p6 = _P
    q0, q1, q2, q3 = _Q
    clamp, half = _CLAMP, _HALF
    # error_model="numpy": a division is a plain IEEE division (no Python zero check), so loops vectorise.
    jit = njit(cache=True, error_model="numpy", nogil=True)

    # The element sigmoid is a module global, not a closure cell: numba keys a cached kernel by
    # the pickled values of its closure cells, and a dispatcher pickles differently in every
    # process, so a kernel holding one in a cell was compiled anew (and saved again) each time.
    global _sig

    @njit(inline="always", error_model="numpy")
    def _sig(v):
        x = v * half
        x = x if x < clamp else clamp  # also maps NaN to the clamp value: NaN inputs are refused earlier
        x = x if x > -clamp else -clamp
        x2 = x * x
        p = ((((((x2 * p6 + p5) * x2 + p4) * x2 + p3) * x2 + p2) * x2 + p1) * x2 + p0) * x
        q = ((x2 * q3 + q2) * x2 + q1) * x2 + q0
        return half * (p / q) + half

    @jit
    def sigmoid_flat(x):
        for i in range(x.shape[0]):
            x[i] = _sig(x[i])

    @jit
    def sigmoid_bias(x, bias):
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                x[i, j] = _sig(x[i, j] + bias[j])

    @jit
    def momentum_step(param, inc, grad, momentum, decay):
        for i in range(param.shape[0]):
            step = momentum * inc[i] + grad[i] - decay * param[i]
            inc[i] = step
            param[i] = param[i] + step

    # Constants come in typed (``one``): a Python literal would make numba compute in float64.
    @jit
    def dropout(a, u, p, scale, one, out):
        zero = one - one
        for i in range(a.shape[0]):
            out[i] = a[i] * one * scale if u[i] >= p else zero

    @jit
    def sigmoid_backward(delta, a, kept, scale, one):
        zero = one - one
        for i in range(delta.shape[0]):
            d = delta[i] * one if kept[i] != zero else zero
            delta[i] = (d * scale) * (a[i] * (one - a[i]))

    @jit
    def uniform_from_bits(bits, out):
        for i in range(out.shape[0]):
            out[i] = np.float32(bits[i] >> np.uint32(8)) * np.float32(2.0 ** -24)

    return {"uniform_from_bits": uniform_from_bits, "sigmoid_flat": sigmoid_flat, "sigmoid_bias": sigmoid_bias,
            "momentum_step": momentum_step, "dropout": dropout, "sigmoid_backward": sigmoid_backward}


_kernels: dict | None = None
_sig = None  # the element sigmoid the float32 kernels inline (set by _compile)

#: Loading numba and the kernels from its cache costs a process about half a second of CPU, which
#: a short job or a small prediction never earns back. So a process does the passes in NumPy's
#: expressions (the same bits) until it has passed this many elements through them, and loads
#: the kernels then: a long job pays at most the load's cost again in slower passes (ski rental).
#: Measured (2026-12-07, the 2-core VM, one thread): the load 0.45-0.5 s; a fit of 10,000 rows of 196
#: features, [256, 256], 3 + 3 epochs passed 1.1e8 elements and took about 0.5 s more in NumPy's
#: expressions than in the kernels, so the two cost the same near 1e8 elements.
LOAD_AFTER_ELEMENTS = 100_000_000
_numpy_elements = 0  # elements passed through NumPy's expressions so far (a lost update between threads only delays)


def kernels(elements: int = 0) -> dict | None:
    """The compiled kernels by name, or None where NumPy's expressions do the passes: before this
    process has passed :data:`LOAD_AFTER_ELEMENTS` through them (``elements``: those of the pass
    asking, counted when NumPy's take it), or without numba."""
    global _numpy_elements
    if _kernels is None:
        _numpy_elements += elements
        if _numpy_elements < LOAD_AFTER_ELEMENTS:
            return None
    return load()


def load() -> dict | None:
    """The compiled kernels by name, loaded now (compiled where numba's disk cache has none), or
    None without numba."""
    global _kernels
    if _kernels is None:
        _kernels = _compile() or {}
    return _kernels or None


def fusable(*arrays) -> bool:
    """True when the kernels can take these arrays (NumPy, C-contiguous, all float32 or all float64)
    and are loaded or now worth loading (:func:`kernels`)."""
    dtype = arrays[0].dtype
    return all(isinstance(a, np.ndarray) and a.flags.c_contiguous and a.dtype == dtype for a in arrays) \
        and dtype in (np.float32, np.float64) and kernels(arrays[0].size) is not None


def sigmoid_(x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """In place on a C-contiguous float32 NumPy array: ``x = sigmoid(x + bias)``, ``bias``
    (optional) broadcast along the last axis; returns ``x``. float64 uses :func:`sigmoid_exact`."""
    k = kernels(x.size) if x.dtype == _f32 and x.flags.c_contiguous else None
    if k is None:
        if bias is not None:
            x += bias
        if x.dtype == _f32:
            x[...] = sigmoid_reference(x)
            return x
        return sigmoid_exact(x, out=x)
    if bias is None:
        k["sigmoid_flat"](x.reshape(-1))
    else:
        k["sigmoid_bias"](x.reshape(-1, x.shape[-1]), bias.astype(_f32, copy=False))
    return x


def momentum_step_(param, inc, grad, momentum: float, decay: float = 0.0, xp=np) -> None:
    """SGD with momentum and L2 decay, in place: ``inc = momentum * inc + grad - decay * param``,
    then ``param += inc``. One pass on the CPU; the same operations as array expressions
    elsewhere (the GPU), so both give the same result up to the device's arithmetic."""
    if xp is np and fusable(param, inc, grad):
        dt = param.dtype.type
        kernels()["momentum_step"](param.reshape(-1), inc.reshape(-1), grad.reshape(-1), dt(momentum), dt(decay))
        return
    if xp is not np and gpu_fusable(param, inc, grad):
        dt = param.dtype.type
        gpu_kernels()["momentum_step"](grad, dt(momentum), dt(decay), param, inc)
        return
    inc *= momentum
    inc += grad
    if decay:
        inc -= decay * param
    param += inc


def dropout(a, u, p: float, out, xp=np):
    """Inverted dropout: ``out = a / (1 - p)`` where the uniform ``u >= p``, else 0.

    ``out`` must not overlap ``a`` or ``u``: the compiled loop then runs in vector registers,
    where an overlapping one falls back to a scalar loop with a branch on every random number
    (30 times slower, measured)."""
    if xp.may_share_memory(out, a) or xp.may_share_memory(out, u):
        raise ValueError("dropout: out must be an array of its own, not a view of a or u")
    scale = 1.0 / (1.0 - p)
    if xp is np and fusable(a, u, out):
        dt = a.dtype.type
        kernels()["dropout"](a.reshape(-1), u.reshape(-1), dt(p), dt(scale), dt(1), out.reshape(-1))
        return out
    if xp is not np and gpu_fusable(a, u, out):
        dt = a.dtype.type
        return gpu_kernels()["dropout"](a, u, dt(p), dt(scale), out)
    xp.greater_equal(u, p, out=out)
    out *= a
    out *= scale
    return out


def sigmoid_backward_(delta, a, kept=None, scale: float = 1.0, xp=np):
    """Back through a sigmoid layer whose output ``a`` was dropped out where ``kept == 0``
    (and scaled by ``scale``), in place: ``delta = delta * [kept != 0] * scale * a * (1 - a)``."""
    if xp is np and fusable(delta, a, *(() if kept is None else (kept,))):
        dt = delta.dtype.type
        kernels()["sigmoid_backward"](delta.reshape(-1), a.reshape(-1), (a if kept is None else kept).reshape(-1),
                                      dt(scale), dt(1))
        return delta
    if xp is not np and gpu_fusable(delta, a, *(() if kept is None else (kept,))):
        gpu_kernels()["sigmoid_backward"](a, a if kept is None else kept, delta.dtype.type(scale), delta)
        return delta
    if kept is not None:
        delta *= kept != 0
        delta *= scale
    delta *= a * (1 - a)
    return delta


def uniform_float32_(bit_generator, out: np.ndarray) -> np.ndarray:
    """Fill the float32 array ``out`` with uniform [0, 1) numbers from ``bit_generator``'s raw
    64-bit outputs, each split into two 32-bit halves (low first), each half turned into
    ``(bits >> 8) * 2**-24``: NumPy's float32 formula, four times faster than
    ``Generator.random(dtype=float32)`` here. An odd count leaves the last half unused."""
    flat = out.reshape(-1)
    bits = bit_generator.random_raw((flat.size + 1) // 2).view(np.uint32)
    k = kernels(flat.size) if out.flags.c_contiguous else None
    if k is None:
        flat[...] = (bits[:flat.size] >> np.uint32(8)).astype(_f32) * _f32(2.0 ** -24)
        return out
    k["uniform_from_bits"](bits, flat)
    return out


# ---------------------------------------------------------------------- GPU (CuPy)

_gpu_kernels: dict | None = None

#: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): ten
#: rounds of two 32-bit multiplies that turn a 128-bit counter and a 64-bit key into four
#: random words. Element ``i`` of a draw takes word ``i % 4`` of block ``i // 4``; the counter
#: is (block, draw number), so every element of every draw gets its own numbers.
PHILOX_SOURCE = r"""
__device__ __forceinline__ unsigned int dbn_philox_word(unsigned long long block, unsigned long long draw,
                                                        unsigned long long key, unsigned int word) {
    unsigned int c0 = (unsigned int)block, c1 = (unsigned int)(block >> 32);
    unsigned int c2 = (unsigned int)draw, c3 = (unsigned int)(draw >> 32);
    unsigned int k0 = (unsigned int)key, k1 = (unsigned int)(key >> 32);
    for (int round = 0; round < 10; ++round) {
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    return word == 0 ? c0 : word == 1 ? c1 : word == 2 ? c2 : c3;
}
"""


def gpu_kernels() -> dict:
    """The fused passes as CuPy ``ElementwiseKernel`` s, built on first use (CuPy compiles
    each for its dtypes when first called). Their formulas are the CPU kernels', but for
    the sigmoid, which is ``0.5 * tanh(x / 2) + 0.5`` with CUDA's tanh."""
    global _gpu_kernels
    if _gpu_kernels is None:
        import cupy

        ek = cupy.ElementwiseKernel
        _gpu_kernels = {
            # x (rows x n) in place; bias (n,) along the last axis, read by the element's column.
            "sigmoid_bias": ek("raw T bias, int64 n", "T x",
                               "x = (T)0.5 * tanh((T)0.5 * (x + bias[i % n])) + (T)0.5", "dbn_sigmoid_bias"),
            "momentum_step": ek("T grad, T momentum, T decay", "T param, T inc",
                                "T step = momentum * inc + grad - decay * param; inc = step; param = param + step",
                                "dbn_momentum_step"),
            "dropout": ek("T a, T u, T p, T scale", "T out", "out = u >= p ? a * scale : (T)0", "dbn_dropout"),
            "sigmoid_backward": ek("T a, T kept, T scale", "T delta",
                                   "T d = kept != (T)0 ? delta : (T)0; delta = (d * scale) * (a * ((T)1 - a))",
                                   "dbn_sigmoid_backward"),
            # state = [key, draw number] in device memory (dbn.model.backend.PhiloxUniform).
            "philox_uniform": ek("raw uint64 state", "T out",
                                 "unsigned long long e = i;"
                                 "out = (T)(dbn_philox_word(e >> 2, state[1], state[0], (unsigned int)(e & 3)) >> 8)"
                                 " * (T)5.9604644775390625e-08",  # 2**-24
                                 "dbn_philox_uniform", preamble=PHILOX_SOURCE),
            # One thread: draw number += 1, after the fill on the same stream.
            "philox_advance": cupy.RawKernel('extern "C" __global__ void dbn_philox_advance('
                                             "unsigned long long* state) { state[1] += 1; }", "dbn_philox_advance"),
        }
    return _gpu_kernels


def gpu_matmul(a, b, out=None):
    """``out = a @ b`` for 2-D float32 or float64 CuPy arrays, through cuBLAS's gemm called
    directly; ``a`` and ``b`` may be transposed views of C-contiguous arrays, ``out`` (new
    when None) is C-contiguous. Other arrays go through ``cupy.matmul``.

    Why not ``cupy.matmul``: CuPy 14 refuses every cuBLAS call while a stream is being
    captured into a CUDA graph (its ``setStream`` raises), and the products are most of a
    training step (:mod:`dbn.model.graphs`). Eager steps call this too, so a graphed step
    and an eager one give the same bits."""
    import cupy

    gemm = _gemm().get(a.dtype.char)
    if gemm is None or a.ndim != 2 or b.ndim != 2 or b.dtype != a.dtype or a.shape[1] != b.shape[0] \
            or (out is not None and (not out.flags.c_contiguous or out.dtype != a.dtype)):
        return cupy.matmul(a, b, out=out)
    m, k = a.shape
    n = b.shape[1]
    if out is None:
        out = cupy.empty((m, n), dtype=a.dtype)
    if k == 0 or m == 0 or n == 0:
        out.fill(0)
        return out
    # Row-major out (m x n) is column-major out^T (n x m) = b^T a^T: cuBLAS gets b first.
    b, op_b, ld_b = _column_major_transpose(b)
    a, op_a, ld_a = _column_major_transpose(a)
    lib = _gemm()["lib"]
    handle = cupy.cuda.device.get_cublas_handle()
    _check_cublas(lib.cublasSetStream_v2(handle, cupy.cuda.get_current_stream().ptr), "cublasSetStream")
    one, zero = _GEMM_SCALARS[a.dtype.char]
    _check_cublas(gemm(handle, op_b, op_a, n, m, k, ctypes.addressof(one), b.data.ptr, ld_b,
                       a.data.ptr, ld_a, ctypes.addressof(zero), out.data.ptr, n), "cublas gemm")
    return out


def _column_major_transpose(x):
    """``(x, op, ld)`` such that cuBLAS's ``op`` of the column-major matrix at ``x`` with
    leading dimension ``ld`` is ``x.T``; ``x`` copied when it is neither C- nor F-contiguous."""
    import cupy

    if x.flags.c_contiguous:  # row-major r x c is column-major c x r = x.T
        return x, _CUBLAS_OP_N, max(x.shape[1], 1)
    if x.flags.f_contiguous:  # a transposed view: column-major r x c = x, transposed by cuBLAS
        return x, _CUBLAS_OP_T, max(x.shape[0], 1)
    x = cupy.ascontiguousarray(x)
    return x, _CUBLAS_OP_N, max(x.shape[1], 1)


_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_GEMM_SCALARS = {"f": (ctypes.c_float(1.0), ctypes.c_float(0.0)), "d": (ctypes.c_double(1.0), ctypes.c_double(0.0))}
_gemm_table: dict | None = None


def _gemm() -> dict:
    """cuBLAS's sgemm and dgemm from the library CuPy loaded (found in this process's memory
    map), by dtype char; empty where there is no such library (CuPy on ROCm, say): the
    products then go through ``cupy.matmul`` and steps are not captured."""
    global _gemm_table
    if _gemm_table is None:
        import cupy

        cupy.cuda.device.get_cublas_handle()  # loads the library
        paths = []
        try:
            with open("/proc/self/maps") as maps:
                paths = [line.split()[-1] for line in maps if line.rstrip().split("/")[-1].startswith("libcublas.so")]
        except OSError:
            pass
        try:
            lib = ctypes.CDLL(paths[0] if paths else "libcublas.so")
            pointer, integer = ctypes.c_void_p, ctypes.c_int
            lib.cublasSetStream_v2.argtypes = [pointer, pointer]
            for name in ("cublasSgemm_v2", "cublasDgemm_v2"):
                getattr(lib, name).argtypes = [pointer, integer, integer, integer, integer, integer, pointer,
                                               pointer, integer, pointer, integer, pointer, pointer, integer]
            _gemm_table = {"lib": lib, "f": lib.cublasSgemm_v2, "d": lib.cublasDgemm_v2}
        except (OSError, AttributeError):
            _gemm_table = {}
    return _gemm_table


def _check_cublas(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


def gpu_fusable(*arrays) -> bool:
    """True when the GPU kernels can take these CuPy arrays: C-contiguous, one dtype."""
    dtype = arrays[0].dtype
    return all(getattr(a, "flags", None) is not None and a.flags.c_contiguous and a.dtype == dtype for a in arrays)


def gpu_sigmoid_(x, bias=None):
    """In place on a CuPy array: ``x = sigmoid(x + bias)``, ``bias`` along the last axis."""
    import cupy

    if bias is None or not gpu_fusable(x, bias):
        if bias is not None:
            x += bias
        return sigmoid_exact(x, out=x, xp=cupy)
    gpu_kernels()["sigmoid_bias"](bias, bias.size, x)
    return x
