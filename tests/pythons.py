"""The other Pythons of this machine, each with the project installed as a user installs it.

For the compatibility tier (tests/test_pythons.py): every supported Python minor version found
here beside the one running the suite (``$DBN_TEST_PYTHONS``, executables separated by ``:``;
else pyenv's ``$PYENV_ROOT/versions/*``, else ``python3.N`` on PATH), and for each a virtual
environment with dbn-yarn installed from its built wheel (not editable).

The dependencies' wheels are downloaded once per Python, lock and dependency list into a
wheelhouse of the per-user cache (``$XDG_CACHE_HOME/dbn-yarn/wheelhouse-...``), pinned by the test
lock; ``bash bootstrap.sh test`` fills it before the suite (``python tests/pythons.py``), and the
suite installs from it without the network.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "locks" / "test.txt"
PYTHONS_ENV = "DBN_TEST_PYTHONS"
#: The Python minor versions the project supports, as pyproject.toml's classifiers name them.
SUPPORTED = tuple(tuple(int(n) for n in m.groups()) for m in re.finditer(
    r'"Programming Language :: Python :: (\d+)\.(\d+)"', (REPO / "pyproject.toml").read_text()))


class PythonsError(RuntimeError):
    """A Python's wheelhouse or environment could not be made."""


@dataclass(frozen=True)
class Python:
    """One Python interpreter of this machine."""

    executable: Path
    version: str  # e.g. "3.13.0"

    @property
    def minor(self) -> tuple[int, int]:
        return tuple(int(n) for n in self.version.split(".")[:2])

    @property
    def name(self) -> str:
        return f"py{self.minor[0]}.{self.minor[1]}"


def _version_of(executable: Path) -> str | None:
    try:
        done = subprocess.run([str(executable), "-c", "import platform; print(platform.python_version())"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _candidates() -> list[Path]:
    given = os.environ.get(PYTHONS_ENV)
    if given is not None:
        return [Path(p) for p in given.split(os.pathsep) if p]
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    found = sorted(root.glob("3.*/bin/python")) if root.is_dir() else []
    return found + [Path(p) for m in SUPPORTED if (p := shutil.which(f"python{m[0]}.{m[1]}"))]


def other_pythons() -> list[Python]:
    """The newest Python of each supported minor version found here, other than this one's."""
    newest: dict[tuple[int, int], Python] = {}
    for executable in _candidates():
        version = _version_of(executable)
        if version is None or not re.fullmatch(r"\d+\.\d+\.\d+", version):
            continue
        python = Python(executable, version)
        if python.minor not in SUPPORTED or python.minor == sys.version_info[:2]:
            continue
        best = newest.get(python.minor)
        if best is None or [int(n) for n in version.split(".")] > [int(n) for n in best.version.split(".")]:
            newest[python.minor] = python
    return [newest[m] for m in sorted(newest)]


#: The extras a user of an HDFS cluster installs (without a Hadoop install: hdfs-native).
EXTRAS = ("hdfs",)


def dependencies() -> list[str]:
    """The project's runtime requirements and :data:`EXTRAS`', as pyproject.toml lists them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + [r for extra in EXTRAS for r in project["optional-dependencies"][extra]]


def wheelhouse(python: Python) -> Path:
    """The folder of the wheels that ``python`` needs to install the project, made on first use
    (under a file lock: parallel runs make it once; a stamp says it is complete)."""
    from dbn.user_cache import cache_dir

    key = hashlib.sha256(LOCK.read_bytes() + json.dumps(dependencies()).encode()).hexdigest()[:12]
    folder = cache_dir(f"wheelhouse-{python.name}-{key}")
    stamp = folder / ".complete"
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".wheelhouse-{python.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done = subprocess.run([str(python.executable), "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                                   "--wheel-dir", str(folder), "--constraint", str(LOCK), *dependencies()],
                                  capture_output=True, text=True, cwd=folder, env=_outside_checkout())
            if done.returncode != 0:
                raise PythonsError(f"{python.executable} -m pip wheel (the project's dependencies, {LOCK.name}) "
                                   f"into {folder}: {done.stderr[-3000:]}")
            stamp.touch()
    return folder


def project_source(base: Path) -> Path:
    """A copy of what the project ships (pyproject.toml's packages, README), so builds leave nothing
    in the checkout."""
    source = base / "src"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for name in {pattern.rstrip("*") for pattern in find["include"]}:
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    return source


def build_wheel(base: Path) -> Path:
    """The project's wheel, built here (by this Python's pip) from a copy of the checkout."""
    source, out = project_source(base), base / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
                           "--wheel-dir", str(out), str(source)], capture_output=True, text=True, cwd=base)
    if done.returncode != 0:
        raise PythonsError(f"building the project's wheel: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    (wheel,) = out.glob("dbn_yarn-*.whl")
    return wheel


def _outside_checkout() -> dict[str, str]:
    """This environment without the suite's import path: pip counts a checkout's
    ``dbn_yarn.egg-info`` on ``sys.path`` as dbn-yarn installed, and installs nothing."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def install(python: Python, wheel: Path, folder: Path) -> Path:
    """A new virtual environment in ``folder`` made by ``python``, with ``wheel`` and its dependencies
    installed from the wheelhouse alone; returns its ``bin`` folder."""
    subprocess.run([str(python.executable), "-m", "venv", str(folder)], check=True, capture_output=True)
    done = subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", "--no-index", "--find-links", str(wheelhouse(python)),
                           "--constraint", str(LOCK), f"{wheel}[{','.join(EXTRAS)}]"], capture_output=True, text=True,
                          cwd=folder, env=_outside_checkout())
    if done.returncode != 0:
        raise PythonsError(f"installing {wheel.name} into {folder}: {done.stderr[-3000:]}")
    if not (folder / "bin" / "dbn").exists():
        raise PythonsError(f"pip installed no `dbn` into {folder}: {done.stdout[-2000:]}")
    return folder / "bin"


if __name__ == "__main__":  # bootstrap.sh test fills the wheelhouses before the suite runs
    for found in other_pythons():
        print(found.version, wheelhouse(found))
