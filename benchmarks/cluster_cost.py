"""What one test cluster costs: its start (wall and CPU seconds) and its idle CPU, with and without the
clusters' Java options (tests/minihadoop.py ``LEAN_JAVA``), one after the other.

    .venv/bin/python benchmarks/cluster_cost.py [--idle 60]

Reads the cluster JVM's CPU from ``/proc/PID/stat`` (Linux); run on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import minihadoop  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(options: tuple[str, ...], idle_s: float) -> str:
    minihadoop.LEAN_JAVA = options
    started = time.monotonic()
    cluster = minihadoop.MiniHadoop().start()
    try:
        up, at_start = time.monotonic() - started, cpu_seconds(cluster._proc.pid)
        time.sleep(idle_s)
        idle = (cpu_seconds(cluster._proc.pid) - at_start) / idle_s
    finally:
        cluster.stop()
    return f"{' '.join(options) or '(no options)'}: up in {up:.1f} s, {at_start:.1f} s of CPU; idle {100 * idle:.1f} % of a core"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of idle to measure (default 60)")
    args = parser.parse_args()
    for options in ((), minihadoop.LEAN_JAVA):
        print(measure(tuple(options), args.idle), flush=True)


if __name__ == "__main__":
    main()
