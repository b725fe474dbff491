"""Host <-> GPU copies of a superstep's parameters: pageable against pinned host memory.

A GPU worker copies the trained state to the host after every superstep (for the master's
average) and the averaged state back. This times those copies for the main job's network
(784-500-500-2000-10: 1.66 M float32 numbers, 6.6 MB) each way: from and to ordinary
(pageable) NumPy memory, as the worker does, from and to pinned (page-locked) memory, and
narrowed to float16 on the device first (the float16 wire's bytes). Median of ``--reps``.

    python benchmarks/gpu_transfers.py [--reps 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

SHAPES = [(784, 500), (500,), (784,), (500, 500), (500,), (500, 2000), (2000,), (2000, 10), (10,)]


def timed(fn, stream, reps: int) -> float:
    """Median seconds of ``fn()`` with the stream drained after each call."""
    fn()
    stream.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        stream.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    import cupy
    import cupyx

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(0)
    host = [rng.random(s, dtype=np.float32) for s in SHAPES]
    device = [cupy.asarray(h) for h in host]
    pinned = [cupyx.empty_pinned(s, np.float32) for s in SHAPES]
    pinned16 = [cupyx.empty_pinned(s, np.float16) for s in SHAPES]
    stream = cupy.cuda.Stream(non_blocking=True)
    nbytes = sum(h.nbytes for h in host)

    def down_pageable():
        return [cupy.asnumpy(d) for d in device]

    def down_pinned():
        with stream:
            for d, p in zip(device, pinned):
                d.get(out=p, stream=stream, blocking=False)

    def down_pinned_fresh():  # a new pinned buffer each call (from CuPy's pinned pool)
        with stream:
            return [d.get(out=cupyx.empty_pinned(d.shape, d.dtype), stream=stream, blocking=False) for d in device]

    def down_float16():
        with stream:
            for d, p in zip(device, pinned16):
                d.astype(cupy.float16).get(out=p, stream=stream, blocking=False)

    def up_pageable():
        for d, h in zip(device, host):
            d.set(h)

    def up_pinned():
        with stream:
            for d, p in zip(device, pinned):
                d.set(p, stream=stream)

    def up_staged():  # a host copy into pinned memory, then the pinned upload
        with stream:
            for d, h, p in zip(device, host, pinned):
                np.copyto(p, h)
                d.set(p, stream=stream)

    rows = []
    for name, fn in [("device -> pageable host (cupy.asnumpy)", down_pageable),
                     ("device -> pinned host, buffers kept", down_pinned),
                     ("device -> pinned host, fresh pooled buffers", down_pinned_fresh),
                     ("device -> float16 on device -> pinned host", down_float16),
                     ("pageable host -> device (ndarray.set)", up_pageable),
                     ("pinned host -> device", up_pinned),
                     ("pageable -> pinned copy -> device", up_staged)]:
        seconds = timed(fn, stream, args.reps)
        rows.append({"copy": name, "ms": 1e3 * seconds, "gb_per_s": nbytes / seconds / 1e9})
    result = {"bytes": nbytes, "arrays": len(SHAPES), "reps": args.reps,
              "gpu": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(), "rows": rows}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['gpu']}: {len(SHAPES)} arrays, {nbytes / 1e6:.1f} MB (float32), median of {args.reps}\n")
        print("| copy | ms | GB/s (of the float32 bytes) |\n| --- | ---: | ---: |")
        for r in rows:
            print(f"| {r['copy']} | {r['ms']:.3f} | {r['gb_per_s']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
