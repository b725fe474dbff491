"""The footer reader: a child process that reads shards' footers for its parent.

On some corrupt footers pyarrow ends the process that reads them (std::terminate): the master
must name the shard instead of dying. So :func:`shardio.readers.shard_info` asks a helper,
started on first use and kept: the module that describes a shard, run with :func:`serve` as its
main. Requests and replies are length-prefixed pickles on the helper's stdin and stdout: it is this process's own child, and nothing else writes there. Not a
multiprocessing pool: a pool's named semaphores stay in ``/dev/shm`` when its process tree is
killed with SIGKILL (as a YARN container's is), and a plain child needs none.

The helper is in its parent's process group, so a terminal's Ctrl-C reaches it too: it ends
quietly on SIGINT and SIGTERM (:mod:`iterreduce.process.stopping`), and its parent, interrupted as well,
says so; a helper stopped alone is named as stopped, not as a crash the shard caused.
"""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
from pathlib import Path

from collections.abc import Callable

from iterreduce.exceptions import ShardError
from iterreduce.process import stopping
from iterreduce.process.lifeline import follow_parent

_LENGTH = struct.Struct("<Q")


class FooterReader:
    """The parent's side: :meth:`describe` a shard in the helper, which is started when needed:
    ``python -m helper_module``, a module that calls :func:`serve` when run."""

    def __init__(self, helper_module: str):
        self.helper_module = helper_module
        self.process: subprocess.Popen | None = None

    def describe(self, uri: str, environment: tuple[str, ...]) -> dict:
        """:func:`shardio.readers.describe_shard` of ``uri`` in the helper, with the caller's
        client ``environment``; raises what it raised, or :class:`ShardError` naming ``uri`` when
        reading it ended the helper."""
        if self.process is None or self.process.poll() is not None:
            self.process = _start(self.helper_module)
        try:
            _send(self.process.stdin, (uri, environment))
            status, value = _receive(self.process.stdout)
        except (OSError, EOFError):
            pid, code = self.process.pid, self.close(grace=1.0)
            if -code in stopping.STOP_SIGNALS:  # not the shard's doing
                raise ShardError(f"{uri}: the footer reader (pid {pid}) was stopped by "
                                 f"{signal.Signals(-code).name} before it answered") from None
            raise ShardError(f"{uri}: not a readable Parquet file (reading its footer crashed the Parquet "
                             f"reader)") from None
        if status == "error":
            raise value
        return value

    def close(self, grace: float = 0.0) -> int | None:
        """End the helper, if one runs, after ``grace`` seconds to end by itself (one whose pipe
        broke is ending); returns its exit status (negative: the signal that ended it)."""
        if self.process is None:
            return None
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
        code = self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()
        self.process = None
        return code


def _start(helper_module: str) -> subprocess.Popen:
    # The helper imports the packages from where this process does, whatever its PYTHONPATH says.
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    return subprocess.Popen([sys.executable, "-m", helper_module], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env, close_fds=True)


def _send(stream, message) -> None:
    data = pickle.dumps(message)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError
    (size,) = _LENGTH.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)  # noqa: S301 - from this process's own child, on its private pipe


def serve(describe: Callable[[str, tuple[str, ...]], dict]) -> int:
    """The helper's loop: ``describe(uri, environment)`` for each request, replied, until its parent
    closes the pipe or is gone."""
    follow_parent()
    requests, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write on the replies' pipe
    while True:
        try:
            uri, environment = _receive(requests)
        except EOFError:
            return 0
        try:
            reply = ("ok", describe(uri, environment))
        except Exception as exc:  # noqa: BLE001 - raised again in the parent
            reply = ("error", exc)
        try:
            pickle.dumps(reply)
        except Exception:  # noqa: BLE001 - an error that does not pickle goes as its message
            reply = ("error", ShardError(f"{uri}: {reply[1]}"))
        _send(replies, reply)
