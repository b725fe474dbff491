"""A process's memory: malloc keeping what it frees, the peak resident size, and what the machine can still give."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Have glibc's malloc keep the memory this process frees, for its next allocations.

    A sync moves each tensor through a few megabyte-sized buffers per worker (gRPC's message
    bytes, the decoded arrays); with glibc's defaults many of these come from fresh
    ``mmap`` pages or from heaps that were just trimmed, so every sync pays a page fault
    and a zeroing for each 4 KiB it receives: a fifth of the master's CPU time in a sync
    of 10 workers. Raising the mmap and trim thresholds makes the buffers reuse the same
    pages. Returns False where there is no glibc (the defaults stay)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))


def peak_rss_bytes() -> int:
    """The most resident memory this process has held (what YARN's container limit measures)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def available_memory() -> int:
    """Bytes this machine can still give processes (MemAvailable, else all physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
