"""Pack the current Python environment into an archive the containers unpack.

YARN containers have no Python of ours: the job ships an archive of the
environment (venv-pack for a virtual environment, conda-pack for a conda one) as
a file resource, unpacked under the name ``environment``, and starts the
archive's own interpreter by its full path.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from ...exceptions import EnvPackError

ENV_DIR = "environment"  # the archive's name inside the containers


def environment_kind(prefix: str | None = None) -> str | None:
    """``"conda"``, ``"venv"`` or None for the environment at ``prefix`` (default: this one)."""
    prefix = Path(prefix or sys.prefix)
    if (prefix / "conda-meta").is_dir():
        return "conda"
    if (prefix / "pyvenv.cfg").is_file():
        return "venv"
    return None


def check_contained(modules: tuple[str, ...], prefix: str) -> None:
    """Raise :class:`EnvPackError` if a module the containers import lives outside ``prefix``
    (an editable install, or PYTHONPATH): the archive would not carry it."""
    root = Path(prefix).resolve()
    for name in modules:
        spec = importlib.util.find_spec(name)
        origin = Path(spec.origin).resolve() if spec and spec.origin else None
        if origin is not None and root not in origin.parents:
            raise EnvPackError(
                f"module {name!r} is imported from {origin.parent}, outside the environment {prefix} (an editable "
                f"install or PYTHONPATH), so a packed environment would not contain it: `pip install .` "
                f"(not -e) into the environment, or pass --env ARCHIVE or --python PATH")


def pack_environment(output: str, prefix: str | None = None, require: tuple[str, ...] = ("iterreduce",)) -> str:
    """Pack the environment at ``prefix`` (default: the running one) into ``output`` (.tar.gz).

    ``require``: modules the containers import, which must be installed inside the
    environment. Reuses an archive newer than the environment's last install.
    Raises :class:`EnvPackError` naming the fix when the environment cannot be shipped.
    """
    prefix = str(prefix or sys.prefix)
    kind = environment_kind(prefix)
    if kind and Path(prefix).resolve() == Path(sys.prefix).resolve():
        check_contained(require, prefix)
    out = Path(output)
    if out.exists() and out.stat().st_mtime > _last_install(prefix):
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if kind == "venv":
        cmd = [sys.executable, "-m", "venv_pack", "--prefix", prefix, "--output", str(out), "--force"]
        fix = "pip install 'dbn-yarn' (not -e: venv-pack cannot pack editable installs), or pass --env ARCHIVE"
    elif kind == "conda":
        cmd = [sys.executable, "-m", "conda_pack", "--prefix", prefix, "--output", str(out), "--force"]
        fix = "conda install -c conda-forge conda-pack, or pass --env ARCHIVE"
    else:
        raise EnvPackError(
            f"{prefix} is neither a virtual environment nor a conda environment, so it cannot be shipped "
            f"to YARN: install dbn-yarn into one (python -m venv ENV), or pass --env ARCHIVE (a packed "
            f"environment) or --python PATH (a Python installed on every node)")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        reason = (proc.stderr or proc.stdout).strip().splitlines()
        raise EnvPackError(f"packing {prefix} with {cmd[2]} failed: {reason[-1] if reason else proc.returncode}; "
                           f"fix: {fix}")
    return str(out)


def _last_install(prefix: str) -> float:
    site = Path(prefix) / "lib"
    try:
        return max(p.stat().st_mtime for p in site.glob("python*/site-packages"))
    except ValueError:
        return os.stat(prefix).st_mtime
