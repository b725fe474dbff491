"""The compatibility tier: the project on this machine's other supported Pythons (tests/pythons.py),
installed from its built wheel as a user installs it, client and containers.

For each such Python: a ``dbn train --local 2`` job whose model is bit-identical to the suite's own
Python's where both run the same numpy (the test lock pins it: the model is numpy's arithmetic,
whatever runs it); and on the session's real YARN a ``dbn submit --wait`` job whose master and
workers run that Python (skein's driver started by the job's own client), SUCCEEDED, then
``dbn status`` and ``dbn logs`` on it and ``dbn scale`` and ``dbn kill`` on a second job.
Skipped where this machine has no other supported Python."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest

import pythons
from yarnjobs import job_file

FOUND = pythons.other_pythons()
pytestmark = [pytest.mark.slow,  # environments of their own: not for the quick tier
              pytest.mark.skipif(not FOUND, reason=f"no other supported Python here ({pythons.SUPPORTED}; "
                                                   f"set ${pythons.PYTHONS_ENV} or install one with pyenv)")]
PARAMS = [pytest.param(p, id=p.name) for p in FOUND] or [pytest.param(None, id="none")]


def _shared(tmp_path_factory, name: str, make):
    """What ``make(folder)`` makes in ``folder``, once for the whole run: xdist's workers share
    the run's temporary root, so the first makes it under a lock and the others find it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's temporary root is in the run's
        root = root.parent
    folder, stamp = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            stamp.write_text(json.dumps(str(make(folder))))
    return Path(json.loads(stamp.read_text()))


@pytest.fixture(scope="session")
def wheel(tmp_path_factory):
    """The project's wheel, built once a run."""
    return _shared(tmp_path_factory, "wheel", lambda folder: pythons.build_wheel(folder))


def installed(tmp_path_factory, wheel, python) -> Path:
    """The ``bin`` folder of a virtual environment of ``python`` with the wheel installed, once a run."""
    return _shared(tmp_path_factory, f"venv-{python.name}", lambda folder: pythons.install(python, wheel, folder))


def run_env(home: Path, *drop: str) -> dict[str, str]:
    """This process's environment for the venv's ``dbn``: a home of its own (dbn's caches), none of
    the suite's import paths, without ``drop``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XDG_CACHE_HOME", *drop)}
    return {**env, "HOME": str(home)}


def dbn(bin_dir: Path, *args, env, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / "dbn"), *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def reference_model(tmp_path_factory):
    """The local job's model trained by the suite's own Python: (its arrays, the job's folder)."""
    from dbn.cli import main

    folder = tmp_path_factory.mktemp("reference")
    path = job_file(folder, str(folder / "out"))
    assert main(["train", path, "--local", "2", "--quiet", "--no-ui"]) == 0
    return dict(np.load(folder / "out" / "model.npz")), folder


@pytest.mark.parametrize("python", PARAMS)
def test_a_local_job_on_another_python_learns_the_suites_model_bit_for_bit(python, wheel, reference_model,
                                                                           tmp_path_factory, tmp_path):
    bin_dir = installed(tmp_path_factory, wheel, python)
    probe = subprocess.run([str(bin_dir / "python"), "-c", "import platform, numpy; "
                            "print(platform.python_version(), numpy.__version__)"], capture_output=True, text=True)
    assert probe.stdout.split() == [python.version, np.__version__], probe  # the lock's numpy on both
    path = job_file(tmp_path, str(tmp_path / "out"))
    done = dbn(bin_dir, "train", path, "--local", "2", "--quiet", "--no-ui", env=run_env(tmp_path / "home"))
    assert done.returncode == 0, done.stderr[-3000:]
    theirs, (ours, _) = dict(np.load(tmp_path / "out" / "model.npz")), reference_model
    assert sorted(theirs) == sorted(ours)
    different = [name for name in ours if not np.array_equal(ours[name], theirs[name])]
    assert not different, f"{python.version} and {sys.version.split()[0]} differ in {different}"


@pytest.mark.parametrize("python", PARAMS)
def test_a_yarn_job_whose_containers_run_another_python_succeeds_and_the_commands_answer_on_it(
        python, wheel, hadoop, yarn, tmp_path_factory, tmp_path):
    bin_dir = installed(tmp_path_factory, wheel, python)
    venv_python = bin_dir / "python"
    home = tmp_path / "home"
    # `dbn submit` starts skein's driver itself (that Python's skein and grpc); the other commands
    # reach the suite's driver ($ITERREDUCE_SKEIN_DRIVER), through that Python's skein client.
    output = hadoop.uri(f"/user/test/{python.name}")
    done = dbn(bin_dir, "submit", job_file(tmp_path, output), "--python", str(venv_python), "--wait", "--quiet",
               env=run_env(home, "ITERREDUCE_SKEIN_DRIVER"), timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    app_id = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"application_\d+_\d+", app_id), done.stdout
    assert yarn.hdfs_json_lines(urlparse(output).path + "/log.jsonl")[-1]["event"] == "done"

    status = dbn(bin_dir, "status", app_id, env=run_env(home))
    assert status.returncode == 0 and "FINISHED (SUCCEEDED)" in status.stdout, status
    logs = dbn(bin_dir, "logs", app_id, env=run_env(home))
    assert logs.returncode == 0, logs.stderr
    # The master's and both workers' containers ran that Python.
    said = f"Python {python.version} ({venv_python})"
    assert logs.stdout.count(said) == 3, (said, logs.stdout[-5000:])
    assert "working as worker-0" in logs.stdout and "working as worker-1" in logs.stdout

    (tmp_path / "second").mkdir()
    long_job = job_file(tmp_path / "second", hadoop.uri(f"/user/test/{python.name}-second"), epochs=2000)
    # The newest Python's ships its environment itself: packed by its venv-pack (185 MB), unpacked in each
    # container (40 s more a Python, so the newest alone: 2026-12-08, 3.12 and 3.13 both did).
    packed = python == FOUND[-1]
    second = dbn(bin_dir, "submit", long_job, *(() if packed else ("--python", str(venv_python))), "--quiet",
                 env=run_env(home))
    assert second.returncode == 0, second.stderr[-3000:]
    app_id = second.stdout.strip().splitlines()[-1]
    yarn.wait_step(app_id, 2, timeout=180)
    ran = re.findall(rf"Python {re.escape(python.version)} \((\S+)\)", yarn.node_logs(app_id, tail=10**6))
    assert len(ran) == 3 and all(path.endswith("/environment/bin/python") if packed else path == str(venv_python)
                                 for path in ran), ran
    scaled = dbn(bin_dir, "scale", app_id, "--workers", "1", env=run_env(home))
    assert scaled.returncode == 0 and scaled.stdout.strip() == f"{app_id}: 1 workers from its next step (it had 2)", scaled
    deadline = time.monotonic() + 120
    while len(yarn.containers(app_id, states=["SUCCEEDED"])) < 1:  # the worker no longer wanted retired
        assert time.monotonic() < deadline, yarn.containers(app_id)
        time.sleep(0.3)
    killed = dbn(bin_dir, "kill", app_id, env=run_env(home))
    assert killed.returncode == 0 and killed.stdout.strip() == f"killed {app_id}", killed
    assert str(yarn.wait(app_id, timeout=120).state) == "KILLED"
