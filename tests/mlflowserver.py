"""A real MLflow tracking server for the tests: ``mlflow server`` on a SQLite backend with its
artifacts in a local folder (proxied: the client uploads through the server, as a team's does),
on 127.0.0.1.

The server is the full ``mlflow`` package, which the project itself never needs (it talks to a
server with ``mlflow-skinny``): it lives in a virtual environment of its own in a per-user cache
(``$XDG_CACHE_HOME/dbn-yarn/mlflow-server-VERSION-LOCK``, made once from PyPI: the version of the
client installed here, the rest as ``locks/mlflow-server.txt`` pins it), or is ``$DBN_MLFLOW_SERVER``,
an ``mlflow`` executable.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from dbn.user_cache import cache_dir

#: The server environment's pins (locks/lock.py makes them with the test lock's mlflow-skinny version).
SERVER_LOCK = Path(__file__).resolve().parents[1] / "locks" / "mlflow-server.txt"


class ServerError(RuntimeError):
    """The tracking server could not be made or started."""


def mlflow_version() -> str:
    """The version of the MLflow client installed here (the server's is the same)."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("mlflow-skinny", "mlflow"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    raise ServerError("no MLflow client installed: pip install 'dbn-yarn[mlflow]'")


def server_executable() -> Path:
    """``mlflow`` of a full installation: ``$DBN_MLFLOW_SERVER``, or the cache's, made on first use
    (under a file lock: parallel test runs make it once; a stamp says it is complete)."""
    given = os.environ.get("DBN_MLFLOW_SERVER")
    if given:
        return Path(given)
    version = mlflow_version()
    lock_key = hashlib.sha256(SERVER_LOCK.read_bytes()).hexdigest()[:12]
    venv = cache_dir(f"mlflow-server-{version}-{lock_key}")
    executable, stamp = venv / "bin" / "mlflow", venv / ".complete"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".mlflow-server-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                                   "--constraint", str(SERVER_LOCK), f"mlflow=={version}"],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise ServerError(f"pip install mlflow=={version} into {venv}: {done.stderr[-2000:]}")
            stamp.touch()
    return executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` with its database and artifacts under ``folder``; :attr:`uri` to track to."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 180.0) -> MlflowServer:
        log = open(self.folder / "server.log", "ab")
        self.process = subprocess.Popen(
            [str(server_executable()), "server", "--backend-store-uri", f"sqlite:///{self.folder / 'mlflow.db'}",
             "--artifacts-destination", str(self.folder / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            cwd=self.folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.folder / "server.log").read_text(errors="replace")[-2000:]
                raise ServerError(f"mlflow server did not answer on {self.uri}: {tail}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Kill the server and every process it started (its session), at once."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


if __name__ == "__main__":  # bootstrap.sh test makes the server's environment before the suite runs
    print(server_executable())
