"""The test environment is the lock's (locks/lock.py): the suite runs on the versions it names, and the
lock covers every package the test extras need."""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "locks"))
import lock  # noqa: E402


def test_every_package_the_lock_pins_is_installed_at_its_version():
    installed = {lock.normalise(d.metadata["Name"]): d.version for d in metadata.distributions()}
    pins = lock.read_lock(lock.TEST_LOCK)
    wrong = {name: (version, installed.get(name)) for name, version in pins.items()
             if installed.get(name) != version}
    assert not wrong, f"installed versions differ from {lock.TEST_LOCK} (pin, installed): {wrong}; " \
                      "bash bootstrap.sh test installs the lock"


def test_the_lock_names_every_requirement_of_the_test_extras():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = extras["dependencies"] + extras["optional-dependencies"]["test"]
    names = {lock.normalise(re.match(r"[A-Za-z0-9._-]+", requirement).group(0)) for requirement in wanted}
    missing = names - set(lock.read_lock(lock.TEST_LOCK))
    assert not missing, f"{lock.TEST_LOCK} does not pin {sorted(missing)}: python3 locks/lock.py update"


def test_the_tracking_servers_mlflow_is_the_clients_version():
    client = lock.read_lock(lock.TEST_LOCK)["mlflow-skinny"]
    server = lock.read_lock(lock.SERVER_LOCK)
    assert server["mlflow"] == client and server["mlflow-skinny"] == client, (client, server.get("mlflow"))


def test_a_lock_line_that_is_not_a_pin_is_refused_naming_its_place(tmp_path):
    bad = tmp_path / "lock.txt"
    bad.write_text("# a comment\nnumpy==2.0.0\npandas>=2\n")
    with pytest.raises(ValueError, match=r"lock.txt:3: not a name==version pin: 'pandas>=2'"):
        lock.read_lock(bad)


def test_the_newest_report_names_what_moved_what_came_and_what_went():
    lines = lock.differences({"numpy": "2.0.0", "old-one": "1.0", "same": "3"},
                             {"numpy": "2.1.0", "new-one": "0.1", "same": "3"})
    assert lines == ["  new-one: locked -, newest 0.1", "  numpy: locked 2.0.0, newest 2.1.0",
                     "  old-one: locked 1.0, newest -"]
