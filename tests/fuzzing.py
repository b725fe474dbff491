"""The harness of the fuzz tests (hypothesis) of everything read from disk or the network.

The tests, by subject:

- ``tests/test_fuzz_shards.py``: the Parquet shard reader and the master's footer check;
- ``tests/test_fuzz_wire.py``: the tensor wire decoder;
- ``tests/test_fuzz_models.py``: the model file loader, the bounded .npz reader and the
  checkpoint loader;
- ``tests/test_fuzz_inputs.py``: the row filter parser and the job file reader.

The property is the same for each: any input gives either a well-formed result (valid
inputs: exactly what was written) or the project's own error whose message names the file
(or the tensor, or the filter), never another exception, never a crash and never a hang.
Rare finds are kept as explicit examples, so that CI sees them on every run.

What they share lives here (this is no test module): the settings (:func:`fuzz`), the time
limit of every call besides hypothesis's deadline (:func:`within`, :class:`Hang`), calls in a
child process (:class:`Isolated`, :class:`Crash`: pyarrow ends the process on some corrupt
footers instead of raising), the byte mutations (:func:`mutated`), the inputs shown by how
they were made (:class:`Sample`), and the checks :func:`outcome` (the results counted in
hypothesis's statistics) and :func:`check_error_names`.

Profiles: ``ci`` (the default: a fixed seed, so a CI failure reproduces, and a
budget of well under a minute per file) and ``long`` for deeper local fuzzing, chosen with
the environment variable ``HYPOTHESIS_PROFILE``::

    HYPOTHESIS_PROFILE=long .venv/bin/python -m pytest -q tests/test_fuzz_*.py
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, currently_in_test_context, event, settings
from hypothesis import strategies as st

# ------------------------------------------------------------------ settings

_COMMON = dict(
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile("ci", max_examples=100, derandomize=True, database=None,
                          deadline=timedelta(seconds=5), **_COMMON)
settings.register_profile("long", max_examples=3000, deadline=timedelta(seconds=10), **_COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
FUZZ = settings.get_profile(PROFILE if PROFILE in ("ci", "long") else "ci")
#: the hard limit of one call on one input: longer is a hang (the deadline reports slow inputs first)
TIME_LIMIT_S = 20


def fuzz(scale: float = 1.0):
    """The profile's settings, with ``scale`` times its number of examples."""
    return settings(FUZZ, max_examples=max(1, int(FUZZ.max_examples * scale)))


class Hang(Exception):
    """A call that ran past TIME_LIMIT_S (not a project error, so the test fails)."""


@contextmanager
def within(what: str, seconds: float = TIME_LIMIT_S):
    """Fail with :class:`Hang` when the body runs longer than ``seconds``.

    SIGALRM stops a loop in Python code; a hang inside C code (where no signal handler
    runs) ends the whole test process after twice the limit, with every thread's stack.
    """
    def on_alarm(signum, frame):
        raise Hang(f"{what}: no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(2 * seconds, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


class Crash(Exception):
    """A call that killed the process it ran in (an abort or a segfault in native code)."""


#: the child of :class:`Isolated`: runs the calls it reads from stdin, answers on stdout
_SERVER = r"""
import importlib, pickle, sys, traceback
requests, replies = sys.stdin.buffer, sys.stdout.buffer
sys.stdout = sys.stderr  # the replies channel carries nothing else
while True:
    try:
        module, name, args = pickle.load(requests)
    except EOFError:
        break
    try:
        reply = (True, getattr(importlib.import_module(module), name)(*args), None)
    except BaseException as exc:  # every exception goes back to the test, which judges it
        reply = (False, exc, traceback.format_exc())
    try:
        data = pickle.dumps(reply)
    except Exception:  # an exception that does not pickle
        data = pickle.dumps((False, RuntimeError(repr(reply[1])), reply[2]))
    replies.write(len(data).to_bytes(8, "little") + data)
    replies.flush()
"""


class Isolated:
    """Calls a function in a child process (started once, again after a crash or a hang).

    The Parquet reader is native code: on some corrupt footers pyarrow ends the process
    (``std::terminate``) instead of raising. Run in the test process, that would end the
    whole test run; here it fails the test with :class:`Crash` and the input, and a hang
    inside native code, where no signal handler runs, is stopped after ``TIME_LIMIT_S``.
    """

    def __init__(self):
        self.proc = None

    def _start(self):
        here = Path(__file__).resolve().parent  # so that the child can import the test modules' helpers
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(here), os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     cwd=here.parent, env=env)

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()
            self.proc = None

    def call(self, fn, *args, timeout: float = TIME_LIMIT_S):
        """``fn(*args)`` in the child: its result, or the exception it raised (with the child's
        traceback as a note); :class:`Crash` or :class:`Hang` when the child dies or does not answer."""
        if self.proc is None:
            self._start()
        what = f"{fn.__name__}{args!r}"
        self.proc.stdin.write(pickle.dumps((fn.__module__, fn.__name__, args)))
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise Hang(f"{what}: no answer within {timeout} s")
        size = self.proc.stdout.read(8)
        if len(size) < 8:
            code = self.proc.wait()
            self.close()
            raise Crash(f"{what} ended the process it ran in (exit status {code}"
                        f"{f', signal {signal.strsignal(-code)}' if code < 0 else ''})")
        ok, value, trace = pickle.loads(self.proc.stdout.read(int.from_bytes(size, "little")))
        if ok:
            return value
        value.add_note(f"in the child process:\n{trace}")
        raise value


# ------------------------------------------------------------ byte mutations

@st.composite
def mutated(draw, data: bytes, footer: bool = False) -> tuple[bytes, str]:
    """(bytes, what was done): ``data`` truncated, with bytes flipped, overwritten, inserted or
    appended; with ``footer`` (Parquet) also flips in the footer and a rewritten footer length."""
    ops = ["truncate", "flip", "overwrite", "insert", "append"]
    if footer:
        ops += ["footer_flip", "footer_flip", "footer_length"]
    op = draw(st.sampled_from(ops))
    n = len(data)
    if n == 0:
        return data, "kept (no bytes)"
    buf = bytearray(data)
    if op == "truncate":
        cut = draw(st.integers(0, n - 1) | st.integers(max(0, n - 64), n - 1))  # the footer is at the end
        return bytes(buf[:cut]), f"truncated to {cut} of {n} bytes"
    if op in ("flip", "footer_flip"):
        lo = 0
        if op == "footer_flip":  # the Thrift metadata: its length is stored before the closing magic
            footer_len = struct.unpack("<i", data[-8:-4])[0] if n >= 8 else 0
            lo = max(0, n - 8 - max(0, min(footer_len, n)))
        flips = []
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(lo, n - 1))
            mask = draw(st.sampled_from([0x01, 0x80, 0xFF, 0x10]))
            buf[i] ^= mask
            flips.append(f"{i}^{mask:#x}")
        return bytes(buf), f"{op} of {n} bytes at {', '.join(flips)}"
    if op == "footer_length":
        value = draw(st.sampled_from([0, 1, n - 8, n, n + 1, 2**31 - 1, -1, -(2**31)])
                     | st.integers(-(2**31), 2**31 - 1))
        buf[-8:-4] = struct.pack("<i", value)
        return bytes(buf), f"footer length set to {value} ({n} bytes)"
    if op == "overwrite":
        i = draw(st.integers(0, n - 1))
        patch = draw(st.binary(min_size=1, max_size=32))
        buf[i:i + len(patch)] = patch
        return bytes(buf[:max(n, i + len(patch))]), f"{patch!r} written at {i} of {n} bytes"
    if op == "insert":
        i = draw(st.integers(0, n))
        patch = draw(st.binary(min_size=1, max_size=32))
        return bytes(buf[:i]) + patch + bytes(buf[i:]), f"{patch!r} inserted at {i} of {n} bytes"
    patch = draw(st.binary(min_size=1, max_size=32))
    return data + patch, f"{patch!r} appended to {n} bytes"


class Sample:
    """Bytes to read, shown (in hypothesis's reports) by how they were made rather than byte by byte."""

    def __init__(self, data: bytes, how: str, table=None, expected=None):
        self.data, self.how, self.table, self.expected = data, how, table, expected

    def __repr__(self):
        return f"<{len(self.data)} bytes: {self.how}>"


def outcome(result, path: str = "") -> None:
    """Count a result (an error by the start of its message) in hypothesis's statistics
    (``--hypothesis-show-statistics``), to see what the inputs reach."""
    if not currently_in_test_context():
        return
    if not isinstance(result, Exception):
        event(str(result))
        return
    words = str(result).replace(path, "").replace("'", "").split(":")
    event(f"{type(result).__name__}: {(words[1] if len(words) > 1 else words[0]).strip()[:40]}")


def check_error_names(exc: Exception, what: str) -> None:
    message = str(exc)
    assert message.strip(), f"{type(exc).__name__} without a message"
    assert what in message, f"the message does not name {what!r}: {message!r}"
