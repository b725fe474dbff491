"""The page's HTTP server: the page, its state as JSON, and the program's images as PNG.

Read-only and small: the standard library's threading HTTP server, in daemon threads
of the process that owns the job (the master while it runs, ``dbn view`` after). Every
address the page asks for is relative, so it works behind YARN's web proxy and skein's.

====================  ==================================================
``/``                 the page (``static/index.html``)
``/static/NAME``      its script, style and the plotting library (uPlot)
``/api/state``        :func:`iterreduce.webui.snapshot.build` as JSON
``/images/NAME.png``  an image the program draws from the parameters
====================  ==================================================
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..runlog import Follower
from . import png, snapshot

log = logging.getLogger("iterreduce.webui")

STATIC = Path(__file__).resolve().parent / "static"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".png": "image/png", ".json": "application/json"}


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


class ViewServer:
    """Serves the live page of the job whose log is ``log_path``.

    ``job``: what the page says of the job (see :func:`snapshot.build`). ``spec``: the
    program's view spec (None: :func:`snapshot.default_spec`). ``workers``: returns the
    live workers table (None: derived from the log). ``images``: returns ``{name: 2-D
    array}`` drawn from the current parameters (None: no images).
    """

    def __init__(self, log_path, *, job: dict, spec: dict | None = None,
                 workers: Callable[[], list[dict]] | None = None,
                 images: Callable[[], dict] | None = None):
        self.job, self.spec = job, spec
        self.workers_fn, self.images_fn = workers, images
        self._follower = Follower(log_path)
        self._records: list[dict] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self.url = ""

    # ------------------------------------------------------------ content

    def records(self) -> list[dict]:
        """Every record of the log so far (tailed: each line is read once)."""
        with self._lock:
            errors: list[str] = []
            self._records.extend(self._follower.poll(errors))  # a foreign line is skipped, not fatal
            for error in errors:
                log.warning("live view: %s", error)
            return list(self._records)

    def state(self) -> dict:
        """The page's state now."""
        names = list((self.spec or {}).get("images", {})) if self.images_fn else []
        workers = self.workers_fn() if self.workers_fn else None
        return snapshot.build(self.records(), job=self.job, spec=self.spec, workers=workers, images=names)

    def image(self, name: str) -> bytes | None:
        """PNG of image ``name``, or None when the program has no such image (yet)."""
        if not self.images_fn:
            return None
        image = self.images_fn().get(name)
        return None if image is None else png.encode_gray(image)

    # ------------------------------------------------------------ serving

    def start(self, host: str = "127.0.0.1", port: int = 0, advertise_host: str | None = None) -> str:
        """Serve in a daemon thread; returns the page's URL (``http://HOST:PORT/``)."""
        view = self

        class Handler(_Handler):
            server_view = view

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="live-view", daemon=True).start()
        shown = advertise_host or ("127.0.0.1" if host in ("", "0.0.0.0") else host)
        self.url = f"http://{shown}:{self._httpd.server_address[1]}/"
        return self.url

    @property
    def port(self) -> int:
        return self._httpd.server_address[1] if self._httpd else 0

    def stop(self) -> None:
        """Stop serving (requests under way finish)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


class _Handler(BaseHTTPRequestHandler):
    server_view: ViewServer
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (the standard library's name)
        path = unquote(urlsplit(self.path).path)
        try:
            if path in ("/", "/index.html"):
                self._file(STATIC / "index.html")
            elif path.startswith("/static/"):
                self._file(STATIC / path[len("/static/"):])
            elif path == "/api/state":
                self._send(to_json_bytes(self.server_view.state()), CONTENT_TYPES[".json"], cache=False)
            elif path.startswith("/images/") and path.endswith(".png"):
                data = self.server_view.image(path[len("/images/"):-len(".png")])
                if data is None:
                    self.send_error(HTTPStatus.NOT_FOUND, "no such image")
                else:
                    self._send(data, CONTENT_TYPES[".png"], cache=False)
            else:
                self.send_error(HTTPStatus.NOT_FOUND)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception:  # the job must never fail because of its page
            log.exception("live view: %s failed", path)
            try:
                self.send_error(HTTPStatus.INTERNAL_SERVER_ERROR)
            except OSError:
                pass

    def _file(self, path: Path) -> None:
        path = path.resolve()
        if path.parent != STATIC or not path.is_file():  # nothing outside the page's own folder
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        self._send(path.read_bytes(), CONTENT_TYPES.get(path.suffix, "application/octet-stream"), cache=True)

    def _send(self, data: bytes, content_type: str, cache: bool) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "max-age=3600" if cache else "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):  # noqa: A002 (the standard library's name): no line per request
        log.debug("live view: " + format, *args)
