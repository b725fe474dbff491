"""The test environment's locks: what ``bash bootstrap.sh test`` installs, version for version.

    python3 locks/lock.py update     remake both locks from the newest versions the registry serves now
    python3 locks/lock.py newest     say where the newest versions differ from the locks (changes nothing)

Two locks, one per environment the suite uses:

- ``locks/test.txt``: the project's test extras (``.[test]``), the constraints ``bootstrap.sh test``
  installs with;
- ``locks/mlflow-server.txt``: the full ``mlflow`` of the tests' tracking server (tests/mlflowserver.py),
  in an environment of its own; its ``mlflow`` is the version of the test lock's ``mlflow-skinny``.

The server is resolved first: the newest ``mlflow`` whose whole environment the registry serves (pip goes
back past a release whose dependencies are not all published yet), then the test extras with
``mlflow-skinny`` at that version. A lock changes on purpose: ``update``, then the whole suite, then commit
the locks with the run's result. The main job's install (``bash bootstrap.sh``) stays unpinned.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

LOCKS = Path(__file__).resolve().parent
REPO = LOCKS.parent
TEST_LOCK = LOCKS / "test.txt"
SERVER_LOCK = LOCKS / "mlflow-server.txt"
PROJECT = "dbn-yarn"
_PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)$")


def read_lock(path: Path) -> dict[str, str]:
    """``{normalised name: version}`` of a lock's ``name==version`` lines (comments skipped)."""
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = _PIN.match(line)
        if match is None:
            raise ValueError(f"{path}:{number}: not a name==version pin: {line!r}")
        pins[normalise(match.group(1))] = match.group(2)
    return pins


def normalise(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _venv(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    return python


def _freeze(python: Path) -> dict[str, str]:
    out = subprocess.run([str(python), "-m", "pip", "freeze", "--exclude-editable"], check=True,
                         capture_output=True, text=True).stdout
    return {normalise(m.group(1)): m.group(2) for m in map(_PIN.match, out.splitlines())
            if m and normalise(m.group(1)) != PROJECT}


def resolve_newest(work: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(test environment, server environment) as the registry resolves them today, in ``work``."""
    server = _venv(work / "server")
    subprocess.run([str(server), "-m", "pip", "install", "--quiet", "mlflow"], check=True)
    server_pins = _freeze(server)
    test = _venv(work / "test")
    subprocess.run([str(test), "-m", "pip", "install", "--quiet", f"{REPO}[test]",
                    f"mlflow-skinny=={server_pins['mlflow']}"], check=True)
    return _freeze(test), server_pins


def _write(path: Path, pins: dict[str, str], what: str) -> None:
    python = ".".join(map(str, sys.version_info[:3]))
    header = (f"# {what}, locked with Python {python} by `python3 locks/lock.py update` (see locks/lock.py).\n"
              "# Change it on purpose: update, run the whole suite, commit the lock with the result.\n")
    path.write_text(header + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))


def differences(locked: dict[str, str], newest: dict[str, str]) -> list[str]:
    """One line per package whose newest version differs from the lock, or that one side lacks."""
    lines = []
    for name in sorted(set(locked) | set(newest)):
        old, new = locked.get(name), newest.get(name)
        if old != new:
            lines.append(f"  {name}: locked {old or '-'}, newest {new or '-'}")
    return lines


def main(argv: list[str]) -> int:
    if argv not in (["update"], ["newest"]):
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dbn-lock-") as work:
        test, server = resolve_newest(Path(work))
    if argv == ["update"]:
        _write(TEST_LOCK, test, "The test environment: the project's test extras")
        _write(SERVER_LOCK, server, "The tests' MLflow tracking server (tests/mlflowserver.py)")
        print(f"wrote {TEST_LOCK} ({len(test)} pins) and {SERVER_LOCK} ({len(server)} pins)")
        return 0
    for path, newest in ((TEST_LOCK, test), (SERVER_LOCK, server)):
        lines = differences(read_lock(path), newest)
        print(f"{path.relative_to(REPO)}: " + (f"{len(lines)} differ from the newest\n" + "\n".join(lines)
                                             if lines else "the newest versions, all of them"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
