"""Fuzz test (hypothesis) of the live page's HTTP handler (iterreduce.webui.server), over real sockets.

Raw requests go to a real :class:`~iterreduce.webui.server.ViewServer`: methods (the usual ones,
odd ones, junk), request targets (the page's paths and their neighbours, percent-escapes such as
``%00`` and ``%ff``, ``..``, absolute forms, very long ones, random text), HTTP versions, ``Host``
headers (its own, other hosts and ports, none, duplicated) and any other headers, or random bytes
for the whole request. Every request is answered with a well-formed HTTP response of a status the
page gives on purpose (never 500, no traceback in the body), within a time limit, and once the
connections are closed no thread is left behind.

Profiles as in tests/fuzzing.py: ``ci`` (the default: a fixed seed, a few seconds) and
``long`` (``HYPOTHESIS_PROFILE=long``).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iterreduce.storage import runlog
from iterreduce.webui import ViewServer

settings.register_profile("webui-ci", max_examples=150, derandomize=True, database=None,
                          deadline=timedelta(seconds=5), suppress_health_check=[HealthCheck.too_slow],
                          print_blob=True)
settings.register_profile("webui-long", max_examples=3000, deadline=timedelta(seconds=10),
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
FUZZ = settings.get_profile("webui-long" if os.environ.get("HYPOTHESIS_PROFILE") == "long" else "webui-ci")
#: what the page answers on purpose: the page, not modified, bad request, not found, method not
#: allowed, request timeout, URI too long, misdirected (Host), header fields too large, busy
#: (beyond its connection cap), HTTP version not supported (HTTP/2+ over HTTP/1 framing)
STATUSES = {200, 400, 404, 405, 408, 414, 421, 431, 503, 505}
TIME_LIMIT_S = 5.0
SECRET = "pageSecret_0"

METHODS = st.one_of(st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE",
                                     "CONNECT", "get", "G ET", ""]),
                    st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12))
PAGE_PATHS = ["/", "/index.html", "/static/view.js", "/static/view.css", "/static/uPlot.iife.min.js",
              "/api/state", "/images/filters.png", "/images/.png", "/static/", "/static", "/api/state/",
              "/static/../server.py", "/static/%2e%2e/server.py", "/static/view.js%00", "/static/view.js%00.css",
              "/%ff", "/static/%c0%af", "//[x", "//host/api/state", "http://127.0.0.1/api/state", "*", "",
              "/static/view.js?x=1#f", "/api/state?%00"]
SEGMENTS = st.one_of(st.sampled_from(["static", "api", "state", "images", "..", ".", "%00", "%2f", "%ff", "%",
                                      "view.js", "x.png", "index.html", SECRET, "", "\\", "~"]),
                     st.text(st.characters(min_codepoint=32, max_codepoint=0x2fff, exclude_characters="\r\n"),
                             max_size=10))
TARGETS = st.one_of(
    st.sampled_from(PAGE_PATHS),
    st.builds(lambda p: f"/{SECRET}" + p, st.sampled_from(PAGE_PATHS)),
    st.lists(SEGMENTS, max_size=6).map(lambda parts: "/" + "/".join(parts)),
    st.text(max_size=40).map(lambda t: t.replace("\r", "").replace("\n", "")),
    st.integers(1, 70_000).map(lambda n: "/" + "a" * n),
)
VERSIONS = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/0.9", "HTTP/2.0", "HTTP/1.1x", "HTTP/11.1", "http/1.1",
                            "HTTP/", ""])
HEADER_NAMES = st.one_of(st.sampled_from(["Accept", "Connection", "Content-Length", "Transfer-Encoding",
                                          "Expect", "Cookie", "If-Modified-Since", "Range", "X-Forwarded-Host"]),
                         st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=":"),
                                 min_size=1, max_size=20))
HEADER_VALUES = st.one_of(st.sampled_from(["close", "keep-alive", "0", "-1", "99999999999999999999", "chunked",
                                           "100-continue", "bytes=0-1"]),
                          st.text(st.characters(min_codepoint=32, max_codepoint=0x2fff), max_size=40)
                          .map(lambda t: t.replace("\r", "").replace("\n", "")))


def hosts(port: int):
    return st.one_of(st.sampled_from([f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}",
                                      "127.0.0.1", f"127.0.0.1:{port + 1}", f"evil.example:{port}", "", " ",
                                      f"127.0.0.1:{port}, evil.example"]),
                     st.text(max_size=30).map(lambda t: t.replace("\r", "").replace("\n", "")))


def requests(port: int):
    """Raw requests: a request line, headers (Host among them, or not) and maybe a body; or random bytes."""
    def assemble(method, target, version, host, headers, body):
        line = " ".join(part for part in (method, target, version) if part)
        fields = ([f"Host: {host}"] if host is not None else []) + [f"{k}: {v}" for k, v in headers]
        return (line + "\r\n" + "".join(f + "\r\n" for f in fields) + "\r\n").encode("utf-8", "surrogateescape") + body

    structured = st.builds(assemble, METHODS, TARGETS, VERSIONS, st.none() | hosts(port),
                           st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=4), st.binary(max_size=64))
    return st.one_of(structured, structured, structured, st.binary(min_size=1, max_size=300))


def exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` (then end the sending side), read until the server closes; fails past the time limit."""
    deadline = time.monotonic() + TIME_LIMIT_S
    with socket.create_connection(("127.0.0.1", port), timeout=TIME_LIMIT_S) as conn:
        try:
            conn.sendall(raw)
            conn.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed before taking everything (e.g. 414)
            pass
        chunks = []
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no end of the answer to {raw[:200]!r} in {TIME_LIMIT_S} s"
            conn.settimeout(left)
            try:
                chunk = conn.recv(65536)
            except ConnectionResetError:
                break
            except TimeoutError:
                pytest.fail(f"no end of the answer to {raw[:200]!r} in {TIME_LIMIT_S} s (a hang)")
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def check_answer(raw: bytes, answer: bytes) -> None:
    """Each response in ``answer`` is well formed, of a status the page gives on purpose, without a traceback."""
    assert b"Traceback" not in answer and b"Error code: 500" not in answer, (raw[:200], answer[:500])
    first_line = raw.split(b"\n", 1)[0].strip()
    if not answer:  # no answer: only to no request at all (a blank first line is skipped by HTTP)
        assert not first_line or first_line.split() == [], (raw[:200], answer)
        return
    assert answer.startswith(b"HTTP/1."), (raw[:200], answer[:300])
    statuses = [int(line.split()[1]) for line in answer.split(b"\r\n") if line.startswith(b"HTTP/1.") and
                len(line.split()) > 1 and line.split()[1].isdigit()]
    assert statuses and set(statuses) <= STATUSES, (raw[:200], answer[:500])


def test_any_request_to_the_live_page_gets_an_http_answer_and_leaves_no_thread(tmp_path):
    log = tmp_path / "log.jsonl"
    with runlog.RunLog(log) as run:
        run.write({"step": 0, "of": 2, "phase": "train", "seconds": 1.0, "time": 1000.0, "loss": 1.0})
    baseline = set(threading.enumerate())  # what earlier tests left may end meanwhile: count only new threads
    import numpy as np

    server = ViewServer(log, job={"name": "fuzz"}, images=lambda: {"filters": np.eye(4)}, secret=None,
                        spec={"title": "T", "charts": [{"x": "step", "y": ["loss"]}], "images": {"filters": "F"}},
                        max_connections=8, idle_timeout=2.0)
    secret_server = ViewServer(log, job={"name": "fuzz"}, secret=SECRET, max_connections=8, idle_timeout=2.0)
    server.start()
    secret_server.start()
    try:
        @FUZZ
        @given(data=st.data())
        def one(data):
            target = data.draw(st.sampled_from([server, secret_server]))
            raw = data.draw(requests(target.port))
            check_answer(raw, exchange(target.port, raw))

        one()
        # The page still answers as before.
        for view, prefix in ((server, ""), (secret_server, SECRET + "/")):
            answer = exchange(view.port, f"GET /{prefix}api/state HTTP/1.1\r\nHost: 127.0.0.1:{view.port}\r\n"
                                         f"Connection: close\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 200") and json.loads(answer.split(b"\r\n\r\n", 1)[1])["job"] == \
                {"name": "fuzz"}
    finally:
        server.stop()
        secret_server.stop()
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - baseline and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [t.name for t in set(threading.enumerate()) - baseline] == []
