"""The page's HTTP server: the page, its state as JSON, and the program's images as PNG.

Read-only and small: the standard library's threading HTTP server, in daemon threads
of the process that owns the job (the master while it runs, ``dbn view`` after). Every
address the page asks for is relative, so it works under a path prefix and behind YARN's
web proxy and skein's.

====================  ==================================================
``/``                 the page (``static/index.html``)
``/static/NAME``      its script, style and the plotting library (uPlot): the files of
                      ``static/`` and nothing else (:data:`STATIC_FILES`)
``/api/state``        :func:`iterreduce.webui.snapshot.build` as JSON
``/images/NAME.png``  an image the program draws from the parameters
====================  ==================================================

Who may read it, and how much it may cost:

- ``secret``: the page lives under ``/SECRET/`` only; any other path is 404. On YARN the
  page listens on the container's loopback and only skein's application master, which
  serves it to YARN's web proxy alone (Hadoop's proxy filter), knows the secret: a
  process on the same node that does not come through the proxy gets nothing.
- The ``Host`` header must name this server (``127.0.0.1:PORT``, ``localhost:PORT``,
  ``[::1]:PORT``; bound to another address also that address, this host's names and any IP
  address with the port): a page of another site cannot read it through DNS rebinding (421
  otherwise).
- At most ``max_connections`` connections are served at once (one thread each; the next
  are answered 503 and closed), at most ``max_per_address`` of them from one client address
  (one peer cannot take every slot), and a connection idle for ``idle_timeout`` seconds is
  closed.
- Each request has ``request_timeout`` seconds as a whole, however its client trickles it:
  for its head (from accept on a new connection, from its first byte on a kept-alive one)
  and again for its answer (from the answer's first byte). Each read and write waits only
  as long as that deadline leaves; a connection past it is closed, with a 408 when a request
  was under way. The page reads no request body (GET and HEAD; anything else is 405 and
  closed).
- The state and the images are built once per new log record, however many ask.
"""

from __future__ import annotations

import hmac
import io
import ipaddress
import json
import logging
import math
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..storage.runlog import Follower
from . import png, snapshot

log = logging.getLogger("iterreduce.webui")

STATIC = Path(__file__).resolve().parent / "static"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".png": "image/png", ".json": "application/json"}
#: The names ``/static/NAME`` may ask for: the page's own files, fixed when the module loads (a
#: name is looked up here, never joined to a path, so no path of the request reaches the disk).
STATIC_FILES = frozenset(p.name for p in STATIC.iterdir() if p.is_file() and p.suffix in CONTENT_TYPES)
#: Connections served at once (one thread each); more are answered 503 and closed.
MAX_CONNECTIONS = 32
#: Seconds a connection may stay silent (keep-alive or a slow client) before it is closed; more than
#: the 30 s after which skein's proxy (Jetty's) drops its own idle connections, so that it closes first.
IDLE_TIMEOUT = 45.0
#: Connections one client address may hold at once: a browser (6) or a proxy's pool fits, and
#: 8 of :data:`MAX_CONNECTIONS` stay for other addresses however one peer behaves.
MAX_PER_ADDRESS = 24
#: Seconds a request may take as a whole, once for its head and once for its answer, however
#: slowly its client sends or reads (see the module docstring): a browser or a proxy sends a
#: head in one packet, and the page's answers are small.
REQUEST_TIMEOUT = 10.0
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
#: What a client whose request did not arrive within its deadline is told before the close.
TIMEOUT_ANSWER = (b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n"
                  b"Content-Length: 20\r\nConnection: close\r\n\r\n408 Request Timeout\n")


def _finite(value):
    """``value`` with NaN and infinities as None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if hasattr(value, "item"):  # NumPy scalars
        return _finite(value.item())
    return value


def to_json_bytes(obj) -> bytes:
    """Strict JSON (no NaN) of a snapshot."""
    return json.dumps(_finite(obj), allow_nan=False, default=str).encode("utf-8")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def allowed_hosts(bind_host: str, port: int, advertise_host: str | None = None) -> frozenset[str]:
    """The ``Host`` header values (lower case, ``name:PORT``) a server bound to ``bind_host``
    answers by name: the loopback names, and for any other address also it, ``advertise_host``,
    this host's names and its IP addresses (:meth:`ViewServer.host_allowed` adds any IP literal
    there: an address cannot be rebound by DNS)."""
    names = set(LOOPBACK_NAMES)
    if not _is_loopback(bind_host):
        names.update(n for n in (bind_host, advertise_host, socket.gethostname(), socket.getfqdn()) if n)
        try:
            names.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None))
        except OSError:
            pass
        names.discard("0.0.0.0")
        names.discard("")
    return frozenset(f"[{n}]:{port}".lower() if ":" in n and not n.startswith("[") else f"{n}:{port}".lower()
                     for n in names)


class _Slots:
    """The connections served at once: at most ``total``, at most ``per_address`` of one client address."""

    def __init__(self, total: int, per_address: int):
        self._lock = threading.Lock()
        self._free, self._per_address = total, per_address
        self._held: Counter[str] = Counter()  # at most `total` addresses

    def take(self, address: str) -> bool:
        """Take a slot for a connection from ``address``; False when none is free for it."""
        with self._lock:
            if self._free <= 0 or self._held[address] >= self._per_address:
                return False
            self._free -= 1
            self._held[address] += 1
            return True

    def give(self, address: str) -> None:
        """Give back a slot :meth:`take` took for ``address``."""
        with self._lock:
            self._free += 1
            self._held[address] -= 1
            if self._held[address] <= 0:
                del self._held[address]


class _BoundedServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``max_connections`` connections at once, at
    most ``max_per_address`` from one client address: one more is answered 503 and closed at
    once, holding no thread. It notes when it accepted each connection (:meth:`accepted_at`)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64  # the kernel's backlog: a burst of connections is accepted (and refused) fast

    def __init__(self, address, handler, max_connections: int, max_per_address: int):
        self._slots = _Slots(max_connections, max_per_address)
        self._accepted: dict[socket.socket, float] = {}  # connections whose thread has not started yet
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self._slots.take(client_address[0]):
            self._refuse(request)
            return
        self._accepted[request] = time.monotonic()
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._accepted.pop(request, None)
            self._slots.give(client_address[0])
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._accepted.pop(request, None)
            self._slots.give(client_address[0])

    def accepted_at(self, request) -> float:
        """When ``request`` (a connection) was accepted (``time.monotonic()``)."""
        return self._accepted.pop(request, time.monotonic())

    def _refuse(self, request) -> None:
        try:
            request.settimeout(1.0)
            request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
                            b"Connection: close\r\n\r\n")
        except OSError:
            pass
        self.shutdown_request(request)


@dataclass(frozen=True)
class _Built:
    """The page's state read from the log when it held ``records`` records, at time ``at``:
    :func:`snapshot.from_log` (``part``, and as JSON less what each request replaces) and
    :func:`snapshot.progress_of`."""

    records: int
    part: dict
    json: bytes
    progress: dict
    at: float


class ViewServer:
    """Serves the live page of the job whose log is ``log_path``.

    ``job``: what the page says of the job (see :func:`snapshot.build`). ``spec``: the
    program's view spec (None: :func:`snapshot.default_spec`). ``workers``: returns the
    live workers table (None: derived from the log). ``images``: returns ``{name: 2-D
    array}`` drawn from the current parameters (None: no images). ``secret``: serve the page
    under ``/SECRET/`` only (see the module docstring). ``max_connections``,
    ``max_per_address``, ``idle_timeout`` and ``request_timeout``: see :data:`MAX_CONNECTIONS`,
    :data:`MAX_PER_ADDRESS`, :data:`IDLE_TIMEOUT` and :data:`REQUEST_TIMEOUT`.
    """

    def __init__(self, log_path, *, job: dict, spec: dict | None = None,
                 workers: Callable[[], list[dict]] | None = None,
                 images: Callable[[], dict] | None = None, secret: str | None = None,
                 max_connections: int = MAX_CONNECTIONS, idle_timeout: float = IDLE_TIMEOUT,
                 request_timeout: float = REQUEST_TIMEOUT, max_per_address: int = MAX_PER_ADDRESS):
        if secret is not None and (not secret or not secret.replace("-", "").replace("_", "").isalnum()):
            raise ValueError(f"the page's secret must be a non-empty URL-safe word, got {secret!r}")
        if not request_timeout > 0 or max_per_address < 1:
            raise ValueError(f"the page's request_timeout must be > 0 and max_per_address >= 1, got "
                             f"{request_timeout!r} and {max_per_address!r}")
        self.job, self.spec = job, spec
        self.workers_fn, self.images_fn = workers, images
        self.secret, self.max_connections, self.idle_timeout = secret, max_connections, idle_timeout
        self.request_timeout, self.max_per_address = request_timeout, max_per_address
        self._follower = Follower(log_path)
        self._records: list[dict] = []
        self._lock = threading.Lock()
        self._built: _Built | None = None  # the newest build of the state read from the log
        self._pictures: tuple[int, dict[str, bytes]] | None = None  # (records, {name: PNG})
        self.builds = 0  # how often the costly part of the state was built (one per new record)
        self._httpd: _BoundedServer | None = None
        self.hosts: frozenset[str] = frozenset()
        self._public = False
        self.url = self.origin = ""

    # ------------------------------------------------------------ content

    def records(self) -> list[dict]:
        """Every record of the log so far (tailed: each line is read once)."""
        with self._lock:
            return list(self._poll())

    def _poll(self) -> list[dict]:
        errors: list[str] = []
        self._records.extend(self._follower.poll(errors))  # a foreign line is skipped, not fatal
        for error in errors:
            log.warning("live view: %s", error)
        return self._records

    def _build(self) -> _Built:
        """The state read from the log, built again only when the log has grown."""
        with self._lock:
            records = self._poll()
            if self._built is None or self._built.records != len(records):
                names = list((self.spec or {}).get("images", {})) if self.images_fn else []
                spec = snapshot.resolve_spec(records, self.job, self.spec)
                part = snapshot.from_log(records, job=self.job, spec=spec, images=names)
                now = time.time()
                live = ("workers", "live") if self.workers_fn else ()  # replaced on each request
                self._built = _Built(len(records), part, to_json_bytes({k: v for k, v in part.items() if k not in live}),
                                     snapshot.progress_of(records, self.job, spec, now), now)
                self.builds += 1
            return self._built

    def _fresh(self, built: _Built) -> dict:
        """What moves between two records: the elapsed time, and the live workers table."""
        fresh = {"progress": snapshot.progress_at(built.progress, built.at, time.time())}
        if self.workers_fn:
            fresh.update(workers=self.workers_fn(), live=True)
        return fresh

    def state(self) -> dict:
        """The page's state now (:func:`snapshot.build`): the part read from the log built
        once per new record, the elapsed time and the live workers table each time."""
        built = self._build()
        return {**built.part, **self._fresh(built)}

    def state_json(self) -> bytes:
        """:meth:`state` as JSON (:func:`to_json_bytes`), the part read from the log encoded
        once per new record too."""
        built = self._build()
        return built.json[:-1] + b"," + to_json_bytes(self._fresh(built))[1:]  # two objects' members, joined

    def image(self, name: str) -> bytes | None:
        """PNG of image ``name``, or None when the program has no such image (yet). The images
        are drawn once per new log record (a step), however many ask."""
        if not self.images_fn:
            return None
        with self._lock:
            count = len(self._poll())
            if self._pictures is None or self._pictures[0] != count:
                drawn = self.images_fn()
                self._pictures = (count, {str(k): png.encode_gray(v) for k, v in drawn.items() if v is not None})
            return self._pictures[1].get(name)

    # ------------------------------------------------------------ serving

    def start(self, host: str = "127.0.0.1", port: int = 0, advertise_host: str | None = None) -> str:
        """Serve in a daemon thread; returns the page's URL (``http://HOST:PORT/``, plus
        ``SECRET/`` with a secret; :attr:`origin` is the URL without it). HOST is ``host``
        itself when it is a loopback address (``advertise_host`` would name an address the
        page does not listen on), else ``advertise_host`` or ``host``."""
        view = self

        class Handler(_Handler):
            server_view = view
            timeout = self.idle_timeout  # the longest wait for a byte: a silent client is dropped
            request_timeout = self.request_timeout  # the longest a request may take (see _Deadline)

        self._httpd = _BoundedServer((host, port), Handler, self.max_connections, self.max_per_address)
        self.hosts = allowed_hosts(host, self.port, advertise_host)
        self._public = not _is_loopback(host)  # reached on other addresses: any IP literal of this port too
        threading.Thread(target=self._httpd.serve_forever, name="live-view", daemon=True).start()
        if _is_loopback(host):  # reached on this host alone, whatever name others know it by
            shown = f"[{host}]" if ":" in host else host
        else:
            shown = advertise_host or ("127.0.0.1" if host in ("", "0.0.0.0") else host)
        self.origin = f"http://{shown}:{self.port}/"
        self.url = self.origin + (f"{self.secret}/" if self.secret else "")
        return self.url

    @property
    def port(self) -> int:
        """The port served on (0 before :meth:`start`)."""
        return self._httpd.server_address[1] if self._httpd else 0

    def stop(self) -> None:
        """Stop serving (requests under way finish)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def host_allowed(self, host: str) -> bool:
        """Whether a request's ``Host`` header names this server (see the module docstring)."""
        host = host.strip().lower()
        if host in self.hosts:
            return True
        if not self._public:
            return False
        name, _, port = host.rpartition(":")
        try:
            ipaddress.ip_address(name[1:-1] if name.startswith("[") and name.endswith("]") else name)
        except ValueError:
            return False
        return port == str(self.port)

    def route(self, target: str) -> str | None:
        """The page's own path (``/``, ``/api/state``, ...) of a request target, or None when
        it is not the page's (outside ``/SECRET/``, or not a path)."""
        try:
            path = unquote(urlsplit(target).path, errors="strict")
        except (ValueError, UnicodeDecodeError):
            return None
        if not path.startswith("/"):
            return None
        if self.secret is None:
            return path
        first, slash, rest = path[1:].partition("/")
        if not slash or not hmac.compare_digest(first.encode(), self.secret.encode()):
            return None
        return "/" + rest


class _Deadline:
    """How long a connection's next read or write may wait (seconds, for ``settimeout``): a
    request's head must arrive within ``request_timeout`` of ``since`` (its accept) or of its first
    byte (on a kept-alive connection, whose wait for that byte is ``idle_timeout``), and its
    answer be written within ``request_timeout`` of its first byte; no wait exceeds ``idle_timeout``.
    A wait past the deadline raises TimeoutError, as the socket's own timeout does."""

    def __init__(self, request_timeout: float, idle_timeout: float, since: float):
        self.request_timeout, self.idle_timeout = request_timeout, idle_timeout
        self.read_by: float | None = since + request_timeout
        self.write_by: float | None = None
        self.begun = False  # a byte of the request being read has arrived
        self.read_timed_out = False

    def next_request(self) -> None:
        """Between two requests of a kept-alive connection: the next one's clocks start with its first bytes."""
        self.read_by = self.write_by = None
        self.begun = self.read_timed_out = False

    @property
    def cut_short(self) -> bool:
        """Whether a request under way did not arrive in time (then it is told 408)."""
        return self.begun and self.read_timed_out

    def read_timeout(self) -> float:
        """The longest the next read may wait."""
        if self.read_by is None:
            return self.idle_timeout
        return min(self._left(self.read_by), self.idle_timeout)

    def received(self, count: int) -> None:
        """``count`` bytes of the request have arrived."""
        if count and not self.begun:
            self.begun = True
            if self.read_by is None:
                self.read_by = time.monotonic() + self.request_timeout

    def write_timeout(self) -> float:
        """The longest the next write of the answer may wait."""
        if self.write_by is None:
            self.write_by = time.monotonic() + self.request_timeout
        return min(self._left(self.write_by), self.idle_timeout)

    @staticmethod
    def _left(by: float) -> float:
        left = by - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline has passed")
        return left


class _TimedReader(io.RawIOBase):
    """A connection's bytes, each read waiting only as long as its :class:`_Deadline` allows."""

    def __init__(self, sock: socket.socket, deadline: _Deadline):
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            self._sock.settimeout(self._deadline.read_timeout())
            count = self._sock.recv_into(buffer)
        except TimeoutError:
            self._deadline.read_timed_out = True
            raise
        self._deadline.received(count)
        return count

    def fileno(self) -> int:
        return self._sock.fileno()


class _TimedWriter(io.BufferedIOBase):
    """Writes to a connection, each waiting only as long as its :class:`_Deadline` allows
    (``sendall``'s timeout bounds the whole call)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline):
        self._sock, self._deadline = sock, deadline

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._sock.settimeout(self._deadline.write_timeout())
        self._sock.sendall(data)
        with memoryview(data) as view:
            return view.nbytes

    def fileno(self) -> int:
        return self._sock.fileno()


class _Handler(BaseHTTPRequestHandler):
    server_view: ViewServer
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.0"  # no HTTP/0.9 answers (a body without a status line)
    timeout = IDLE_TIMEOUT
    request_timeout = REQUEST_TIMEOUT

    def setup(self) -> None:
        """The connection's files, each read and write bounded by the request's :class:`_Deadline`
        (the standard library's wait up to ``timeout`` afresh for each byte)."""
        self.connection = self.request
        self.deadline = _Deadline(self.request_timeout, self.timeout, since=self.server.accepted_at(self.request))
        self.rfile = io.BufferedReader(_TimedReader(self.connection, self.deadline))
        self.wfile = _TimedWriter(self.connection, self.deadline)

    def handle_one_request(self) -> None:
        """The standard library's (a read or write past the deadline ends in its ``except
        TimeoutError``, which closes the connection), telling a client whose request did not
        arrive in time why (408)."""
        super().handle_one_request()
        if self.deadline.cut_short:
            self.close_connection = True
            self._send_timeout()
        self.deadline.next_request()

    def _send_timeout(self) -> None:
        """The 408, if the connection takes it at once (the connection is closed anyway)."""
        try:
            self.connection.settimeout(0.0)
            self.connection.send(TIMEOUT_ANSWER)
            for _ in range(16):  # bytes left unread would make the close a reset, which may lose the 408
                if not self.connection.recv(65536):
                    break
        except OSError:  # BlockingIOError: nothing (more) can go or come at once
            pass

    def parse_request(self) -> bool:
        """The standard library's, refusing HTTP/0.x (answered 505 in HTTP/1.0, not as HTTP/0.9: a
        body without a status line)."""
        ok = super().parse_request()
        if ok and not self.request_version.startswith("HTTP/1."):
            self.request_version = "HTTP/1.0"
            self.send_error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED)
            return False
        return ok

    def do_GET(self):  # noqa: N802 (the standard library's name)
        self._answer(body=True)

    def do_HEAD(self):  # noqa: N802
        self._answer(body=False)

    def __getattr__(self, name: str):
        """Any other method (``do_POST``, ``do_FOO``, ...): 405, not the standard library's 501."""
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        self.close_connection = True
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()

    def _answer(self, body: bool) -> None:
        view = self.server_view
        self._body = body
        try:
            if not view.host_allowed(self.headers.get("Host") or ""):
                self._error(HTTPStatus.MISDIRECTED_REQUEST, "this page answers only to its own address "
                                                            "(Host: 127.0.0.1:PORT, localhost:PORT or [::1]:PORT)")
                return
            path = view.route(self.path)
            if path is None:
                self._error(HTTPStatus.NOT_FOUND)
            elif path in ("/", "/index.html"):
                self._file("index.html")
            elif path.startswith("/static/"):
                self._file(path[len("/static/"):])
            elif path == "/api/state":
                self._send(view.state_json(), CONTENT_TYPES[".json"], cache=False)
            elif path.startswith("/images/") and path.endswith(".png"):
                data = view.image(path[len("/images/"):-len(".png")])
                if data is None:
                    self._error(HTTPStatus.NOT_FOUND, "no such image")
                else:
                    self._send(data, CONTENT_TYPES[".png"], cache=False)
            else:
                self._error(HTTPStatus.NOT_FOUND)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception:  # the job must never fail because of its page; the traceback stays in the log
            log.exception("live view: %r failed", self.path)
            self.close_connection = True
            try:
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR)
            except OSError:
                pass

    def _file(self, name: str) -> None:
        if name not in STATIC_FILES:  # only the page's own files, by name
            self._error(HTTPStatus.NOT_FOUND)
            return
        self._send(_static_bytes(name), CONTENT_TYPES[Path(name).suffix], cache=True)

    def _error(self, status: HTTPStatus, message: str | None = None, close: bool = False) -> None:
        """An error answer: a line of text, no HTML, no traceback."""
        status = HTTPStatus(status)
        text = f"{status.value} {message or status.phrase}\n".encode("ascii", "backslashreplace")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(text)))
        self.send_header("Cache-Control", "no-store")
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        if getattr(self, "_body", True) and self.command != "HEAD":
            self.wfile.write(text)

    def send_error(self, code, message=None, explain=None):
        """The standard library's answer to a request it cannot parse (400, 414, 431, 505, ...),
        as :meth:`_error` writes it; the connection is closed after it."""
        self.close_connection = True
        if not str(getattr(self, "request_version", "")).startswith("HTTP/1."):
            self.request_version = "HTTP/1.0"  # a status line and headers, whatever the request claimed
        self._error(code, message, close=True)

    def _send(self, data: bytes, content_type: str, cache: bool) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self._body:
            self.wfile.write(data)

    def log_message(self, format, *args):  # noqa: A002 (the standard library's name): no line per request
        log.debug("live view: " + format, *args)


_STATIC_BYTES: dict[str, bytes] = {}


def _static_bytes(name: str) -> bytes:
    """The bytes of one of :data:`STATIC_FILES` (read once)."""
    if name not in _STATIC_BYTES:
        _STATIC_BYTES[name] = (STATIC / name).read_bytes()
    return _STATIC_BYTES[name]
