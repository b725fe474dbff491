"""CUDA graphs: a training step captured once and replayed with one launch.

A CD step on the GPU is about 23 small kernels that CuPy launches from Python at 25-30 µs
each, so the GPU waits on the host and the step takes as long at batch 1,000 as at 100
(measured on an H100, ``benchmarks/RESULTS.md``, 2026-11-24). Captured into a graph, the
same kernels go to the device with one launch.

What a captured step may do, and how the callers keep to it:

- host values are baked in (learning rate, momentum): the caller's key names every
  one of them, and the device addresses of the arrays the step reads and writes, so a
  changed value or a replaced array gets a graph of its own instead of a stale one;
- memory the step allocates for temporaries comes from a pool of the graph's own, which
  nothing else allocates from while the graph lives;
- random numbers come from a generator whose counter lives on the device
  (:class:`dbn.model.backend.PhiloxUniform`), so each replay draws new ones;
- nothing waits for the device (no ``float(x)``, no host copies) inside the step.

The first run of a key is eager (CuPy compiles its kernels, cuBLAS sets up), the second
captures and launches, later ones replay. A capture that fails falls back to running the
step eagerly, with a warning. ``DBN_CUDA_GRAPHS=0`` (or false, no, off) in the environment
turns graphs off (for A/B timings and as an escape hatch).
"""

from __future__ import annotations

import os
import warnings

from ..errors import BackendError

#: The environment variable that turns graphs off when set to "0".
ENV_SWITCH = "DBN_CUDA_GRAPHS"

_SEEN_ONCE = "seen once"
_EAGER = "eager"


_OFF, _ON = ("0", "false", "no", "off"), ("", "1", "true", "yes", "on")


def graphs_enabled() -> bool:
    """Whether GPU training steps may run as CUDA graphs: yes unless ``DBN_CUDA_GRAPHS`` is
    0, false, no or off; a value that is neither is refused, naming it."""
    value = os.environ.get(ENV_SWITCH, "").strip().lower()
    if value in _OFF or value in _ON:
        return value not in _OFF
    raise BackendError(f"{ENV_SWITCH}={os.environ[ENV_SWITCH]!r}: expected 1 or 0 (also true/false, yes/no, on/off)")


class StepGraphs:
    """Training steps captured as CUDA graphs, one per key.

    ``run(key, step)`` runs ``step()`` (a function of no arguments that only queues device
    work) and returns nothing; :meth:`bind` makes the key. ``replays`` counts the steps that
    ran as a graph.
    """

    #: Graphs kept; the least recently used goes first (keys of replaced arrays are never used again).
    MAX_GRAPHS = 4

    def __init__(self):
        self._graphs: dict = {}
        self.replays = 0

    def bind(self, step, settings: tuple, arrays):
        """A function of no arguments that runs ``step`` as a graph keyed by ``settings`` (the
        host values it bakes in) and the device addresses of ``arrays`` (what it reads and
        writes that could be replaced by a new array)."""
        key = (*settings, *(a.data.ptr for a in arrays))
        return lambda: self.run(key, step)

    def run(self, key, step) -> None:
        entry = self._graphs.pop(key, None)
        if len(self._graphs) >= self.MAX_GRAPHS:
            del self._graphs[next(iter(self._graphs))]
        if entry is None:  # first time: eagerly, so that every kernel exists before the capture
            self._graphs[key] = _SEEN_ONCE
            step()
            return
        if entry is _SEEN_ONCE:
            entry = _capture(step)
        self._graphs[key] = entry  # the most recently used, last
        if entry is _EAGER:
            step()
            return
        entry.launch()
        self.replays += 1


class _Captured:
    """A graph with the memory pool its temporaries live in (kept alive together)."""

    def __init__(self, graph, pool, stream):
        self.graph, self.pool, self.stream = graph, pool, stream

    def launch(self) -> None:
        self.graph.launch()  # on the current stream, after the work queued before it


def _capture(step):
    """Capture ``step`` into a graph (its work is queued, not run); ``_EAGER`` if that fails."""
    import cupy

    pool = cupy.cuda.MemoryPool()
    stream = cupy.cuda.Stream(non_blocking=True)  # capture needs a stream other than the default
    try:
        with cupy.cuda.using_allocator(pool.malloc), stream:
            stream.begin_capture()
            try:
                step()
            finally:
                graph = stream.end_capture()
    except Exception as error:  # the step did something a graph cannot hold: run it as before
        warnings.warn(f"a training step could not be captured as a CUDA graph and runs without one: {error}",
                      RuntimeWarning, stacklevel=3)
        return _EAGER
    return _Captured(graph, pool, stream)
