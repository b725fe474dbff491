"""No process the project or its suite starts runs Python code between fork and exec.

A ``preexec_fn`` (or a bare ``os.fork``) makes Python fork the whole process and run Python code in
the child before exec. In a process full of threads (the suite's: gRPC, hdfs-native, pyarrow's
pools; a master's), the child can deadlock on a lock another thread held at the fork, and the
parent then waits in ``Popen`` forever. It happened three times: fsspec's at-fork handler, pyspark's
``preexec_fn`` (tests/sparktables.py takes it out), and a test's own ``preexec_fn`` that hung CI for
90 minutes inside ``Popen``. Without one, ``subprocess`` starts a child by vfork and exec, with no
Python code between: what a child needs set (a session, signals, a folder) is set by ``Popen``'s
own arguments or by the parent before the call.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest_runtime import REPO

FOLDERS = ("iterreduce", "shardio", "dbn", "tests", "benchmarks", "yarn_specs", "notebooks")
FORKS = {("os", "fork"), ("os", "forkpty")}


def python_files() -> list[Path]:
    return sorted(p for folder in FOLDERS if (REPO / folder).is_dir() for p in (REPO / folder).rglob("*.py"))


def fork_hazards(path: Path, root: Path = REPO) -> list[str]:
    """Each call in ``path`` that passes a ``preexec_fn`` or forks the process, as ``file:line: what``
    (the file named relative to ``root``)."""
    found, name = [], path.relative_to(root)
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        if any(keyword.arg == "preexec_fn" and not (isinstance(keyword.value, ast.Constant)
                                                    and keyword.value.value is None)
               for keyword in node.keywords):
            found.append(f"{name}:{node.lineno}: a preexec_fn")
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and (func.value.id, func.attr) in FORKS:
            found.append(f"{name}:{node.lineno}: {func.value.id}.{func.attr}()")
    return found


def test_no_process_is_started_with_python_code_between_fork_and_exec():
    files = python_files()
    assert len(files) > 50, files  # the walk found the project
    hazards = [h for path in files for h in fork_hazards(path)]
    assert not hazards, "\n".join(hazards)


@pytest.mark.parametrize("source, expected", [
    ("subprocess.Popen(['x'], preexec_fn=f)", 1),
    ("subprocess.run(['x'], preexec_fn=lambda: None)", 1),
    ("pid = os.fork()", 1),
    ("subprocess.Popen(['x'], preexec_fn=None, start_new_session=True)", 0),
    ("subprocess.Popen(['x'], start_new_session=True)", 0),
])
def test_the_check_finds_a_preexec_fn_and_a_fork(tmp_path, source, expected):
    """The check above, on code that has the hazard and code that has not."""
    path = tmp_path / "probe.py"
    path.write_text(f"import os, subprocess\n{source}\n")
    assert len(fork_hazards(path, tmp_path)) == expected
