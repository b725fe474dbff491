"""A helper process whose parent was killed ends, and ends silently: it writes to its parent's log, which the
launcher takes stock of once the parent is dead (issue 36's run record); a line added after that made the
run's own log unprovable and refused its --resume (seen once in the suite, a race of half a second)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

PARENT = """
import sys, time
import numpy as np
from shardio import readers
from shardio.shards import write_shards
(uri,) = write_shards(np.ones((4, 3), np.float32), None, sys.argv[1], 1)
readers.shard_info([uri])  # starts the footer reader, as the master does
print(readers._footer_reader.process.pid, flush=True)
time.sleep(600)
"""


def test_a_helper_whose_parent_is_killed_exits_without_writing_to_the_shared_log(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    log = tmp_path / "master.log"
    with open(log, "wb") as err:
        parent = subprocess.Popen([sys.executable, str(script), str(tmp_path / "shard")], stdout=subprocess.PIPE,
                                  stderr=err, text=True, cwd=os.getcwd())
        helper = int(parent.stdout.readline())
        before = log.read_bytes()
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(helper, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the helper (pid {helper}) outlived its parent by 30 s")
        parent.stdout.close()
    assert log.read_bytes() == before, log.read_text()
