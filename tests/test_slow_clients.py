"""Slow clients of the live page (iterreduce.webui.server): issue 51, class 11.

32 connections sending one header byte every 20 s kept every reader at 503 for 100 s: each read
waited up to the idle timeout afresh, so a request that never ends held its thread for ever. Now a
request has a deadline as a whole (``request_timeout``: its head from accept, or from its first
byte on a kept-alive connection; its answer from its first byte written), a connection over it is
closed (408 when a request was under way), and one client address holds at most
``max_per_address`` of the connections, so that other addresses are still served.

Real servers on 127.0.0.1; the slow clients come from 127.0.0.1 and the other address is
127.0.0.2 (loopback). Every loop is bounded in count and time.
"""

from __future__ import annotations

import http.client
import select
import socket
import threading
import time

import numpy as np

from iterreduce.storage import runlog
from threadwatch import NewThreads
from iterreduce.webui import ViewServer

LOOPBACK, OTHER_LOOPBACK = "127.0.0.1", "127.0.0.2"


class Trickle:
    """``count`` slow clients from ``source``: each sends one byte of a request head that never
    ends every ``interval`` s, all in one thread, until the server closes it or ``limit`` s pass.
    ``silent`` more connect first and send nothing. Records what the server sent each and when it closed
    it (seconds after that client connected; None: still open)."""

    def __init__(self, port: int, count: int, source: str = LOOPBACK, interval: float = 0.1, limit: float = 10.0,
                 silent: int = 0):
        self.head = (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode() + b"a" * 60_000)
        self.interval, self.limit = interval, limit
        self.conns, self.opened = [], []
        for _ in range(count + silent):
            self.conns.append(socket.create_connection((LOOPBACK, port), timeout=5, source_address=(source, 0)))
            self.opened.append(time.monotonic())
        self.silent = silent
        self.answers = [b""] * len(self.conns)
        self.closed_after: list[float | None] = [None] * len(self.conns)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="trickle", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        end = time.monotonic() + self.limit
        for sent in range(len(self.head)):
            open_ = [i for i, t in enumerate(self.closed_after) if t is None]
            if not open_ or time.monotonic() > end or self.stopped.is_set():
                return
            for i in open_:
                if i >= self.silent:
                    try:
                        self.conns[i].send(self.head[sent:sent + 1])
                    except OSError:
                        pass  # closed by the server: seen by the read below
            self._read_until(time.monotonic() + self.interval)

    def _read_until(self, until: float) -> None:
        while (left := until - time.monotonic()) > 0:
            open_ = [self.conns[i] for i, t in enumerate(self.closed_after) if t is None]
            if not open_:
                return
            readable, _, _ = select.select(open_, [], [], left)
            for conn in readable:
                i = self.conns.index(conn)
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    chunk = b""
                self.answers[i] += chunk
                if not chunk:
                    self.closed_after[i] = time.monotonic() - self.opened[i]

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=self.limit + 5)
        for conn in self.conns:
            conn.close()


def small_log(tmp_path):
    """A job's log of one step."""
    log = tmp_path / "log.jsonl"
    with runlog.RunLog(log) as run:
        run.write({"step": 0, "of": 5, "phase": "train", "seconds": 1.0, "time": 1000.0, "loss": 1.0})
    return log


def wait_until(condition, seconds: float = 5.0) -> bool:
    """Whether ``condition()`` came true within ``seconds``."""
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.02)
    return condition()


def refusals(slow: Trickle) -> int:
    return sum(a.startswith(b"HTTP/1.1 503 ") for a in slow.answers)


def get(port: int, target: str = "/api/state", source: str = LOOPBACK) -> int:
    """The status of one GET of ``target`` from ``source`` (0: no answer: the connection failed)."""
    try:
        with socket.create_connection((LOOPBACK, port), timeout=10, source_address=(source, 0)) as conn:
            conn.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            answer = http.client.HTTPResponse(conn, method="GET")
            answer.begin()
            answer.read()
            return answer.status
    except (OSError, http.client.HTTPException):
        return 0


def get_page_within(port: int, seconds: float, source: str = LOOPBACK) -> tuple[int, float]:
    """A reader that tries again after a 503 (as its ``Retry-After`` asks) for at most ``seconds``:
    (the last status, seconds it took)."""
    start = time.monotonic()
    status = 0
    for _ in range(int(seconds / 0.1) + 1):
        status = get(port, source=source)
        if status != 503 or time.monotonic() - start > seconds:
            break
        time.sleep(0.1)
    return status, time.monotonic() - start


def test_slow_clients_beyond_the_thread_cap_are_closed_at_their_deadline_and_a_reader_gets_the_page(tmp_path):
    """Twice the cap of slow clients, each trickling a head that would take far longer than the
    deadline (but never silent for the idle timeout): the first ``cap`` are answered 408 and closed
    at the deadline, the rest 503 at once, a silent connection is closed at the deadline too, and a
    reader that tries again after each 503 gets its page within a small multiple of the deadline."""
    cap, deadline = 4, 1.5
    server = ViewServer(small_log(tmp_path), job={"name": "j"}, max_connections=cap, idle_timeout=30.0,
                        request_timeout=deadline, max_per_address=cap)
    started = NewThreads()
    server.start()
    slow = None
    try:
        slow = Trickle(server.port, count=2 * cap - 1, silent=1, interval=0.1, limit=6 * deadline)
        assert wait_until(lambda: refusals(slow) == cap)  # the slow ones hold every slot
        status, took = get_page_within(server.port, 4 * deadline)
        assert status == 200 and took < 3 * deadline, (status, took)
        slow.thread.join(timeout=6 * deadline + 5)
        served = [i for i, a in enumerate(slow.answers) if not a.startswith(b"HTTP/1.1 503 ")]
        refused = [i for i in range(len(slow.conns)) if i not in served]
        assert len(served) == cap and len(refused) == cap, slow.answers
        for i in served:
            assert slow.closed_after[i] is not None and deadline - 0.1 < slow.closed_after[i] < deadline + 2.0, \
                (i, slow.closed_after[i])
            if i >= slow.silent:  # a request under way: told why
                assert slow.answers[i].startswith(b"HTTP/1.1 408 Request Timeout\r\n"), slow.answers[i]
            else:  # nothing asked: closed without a word
                assert slow.answers[i] == b"", slow.answers[i]
        for i in refused:
            assert slow.closed_after[i] is not None and slow.closed_after[i] < deadline, (i, slow.closed_after[i])
        assert started.settle(1) == 1, started.alive()  # serve_forever's thread alone
    finally:
        if slow is not None:
            slow.close()
        server.stop()


def test_one_address_cannot_take_every_slot(tmp_path):
    """Slow clients of one address get at most ``max_per_address`` connections (the next are
    answered 503 though slots are free): another address is served at once, long before the
    deadline frees any."""
    cap, per_address, deadline = 6, 3, 4.0
    server = ViewServer(small_log(tmp_path), job={"name": "j"}, max_connections=cap, idle_timeout=30.0,
                        request_timeout=deadline, max_per_address=per_address)
    server.start()
    slow = None
    try:
        slow = Trickle(server.port, count=cap, interval=0.1, limit=deadline + 3)
        assert wait_until(lambda: refusals(slow) == cap - per_address)  # though slots are free
        started = time.monotonic()
        assert get(server.port, source=OTHER_LOOPBACK) == 200
        assert get(server.port, source=LOOPBACK) == 503  # the slow clients' address is at its cap
        assert time.monotonic() - started < deadline - 1
        assert refusals(slow) == cap - per_address
        assert all(slow.closed_after[i] is None for i, a in enumerate(slow.answers) if not a)  # still held
    finally:
        if slow is not None:
            slow.close()
        server.stop()


def bytes_sent_to_a_client_that_reads_nothing() -> int:
    """How much a loopback connection takes before a send to a client with a tiny window that
    reads nothing blocks (the kernel's buffers: 2 MB here, more on hosts with larger ones)."""
    with socket.create_server((LOOPBACK, 0)) as listener:
        with socket.socket() as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect(listener.getsockname())
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(0.2)
                sent, chunk = 0, b"x" * 65536
                for _ in range(4096):  # 256 MiB at most
                    try:
                        sent += conn.send(chunk)
                    except TimeoutError:
                        break
                return sent


def test_a_client_that_does_not_read_its_answer_is_cut_off_at_the_deadline(tmp_path):
    """A client that asks for a large image and reads none of it held its thread for the idle
    timeout: its answer too must be written within the deadline, then the slot is free."""
    deadline = 1.0
    side = int((2 * bytes_sent_to_a_client_that_reads_nothing() + 2**20) ** 0.5)  # a PNG the buffers cannot hold
    noise = np.random.default_rng(0).integers(0, 256, (side, side), dtype=np.uint8)
    server = ViewServer(small_log(tmp_path), job={"name": "j"}, images=lambda: {"pic": noise},
                        spec={"title": "T", "charts": [], "images": {"pic": "P"}}, max_connections=1,
                        idle_timeout=30.0, request_timeout=deadline)
    server.start()
    try:
        server.image("pic")  # drawn before the clock starts
        with socket.socket() as stuck:  # as in bytes_sent_to_a_client_that_reads_nothing
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a tiny window, never read
            stuck.settimeout(5)
            stuck.connect((LOOPBACK, server.port))
            stuck.sendall(f"GET /images/pic.png HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
            assert select.select([stuck], [], [], 5)[0]  # its answer has begun
            assert get(server.port) == 503  # it holds the only slot
            status, took = get_page_within(server.port, 4 * deadline)
            assert status == 200 and took < deadline + 2.0, (status, took)
    finally:
        server.stop()


def test_a_kept_alive_connection_may_wait_between_requests_but_each_request_has_its_deadline(tmp_path):
    """The deadline does not shorten the wait between two requests of a kept-alive connection (a
    proxy's pool keeps them idle longer): the next request is served after more than the deadline
    of silence, and its own deadline runs from its first byte."""
    deadline = 1.0
    server = ViewServer(small_log(tmp_path), job={"name": "j"}, idle_timeout=30.0, request_timeout=deadline)
    server.start()
    request = f"GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode()
    try:
        with socket.create_connection((LOOPBACK, server.port), timeout=10) as conn:
            for pause in (deadline + 0.5, 0):  # idle longer than the deadline after the first: still open
                conn.sendall(request)
                answer = http.client.HTTPResponse(conn, method="GET")
                answer.begin()
                assert answer.status == 200 and answer.read()
                time.sleep(pause)
            began = time.monotonic()
            for i in range(int(3 * deadline / 0.1)):  # a third request, one byte each 0.1 s
                try:
                    conn.sendall(request[i:i + 1])
                except OSError:
                    break
                readable, _, _ = select.select([conn], [], [], 0.1)
                if readable:
                    break
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            assert data.startswith(b"HTTP/1.1 408 ") and deadline - 0.1 < time.monotonic() - began < deadline + 2.0
    finally:
        server.stop()

