"""The folders' promises (docs/design.md, "Where things live"): the runtime knows no data format and
no model, the data formats know no model, and no package imports in a circle."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: Each package, and the packages of this project it must never import.
NEVER = {"iterreduce": ("shardio", "dbn"), "shardio": ("dbn",)}


def imported_modules(path: Path) -> set[str]:
    """The absolute modules a source file imports (relative imports stay inside its package)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_no_package_imports_one_it_must_not():
    wrong = [(str(path.relative_to(REPO)), module)
             for package, banned in NEVER.items() for path in sorted((REPO / package).rglob("*.py"))
             for module in imported_modules(path) if module.split(".")[0] in banned]
    assert wrong == []


def test_the_master_and_the_worker_load_no_data_format():
    """What a job's master and worker processes load before their program is named: no table, lakehouse,
    filter or label code, and neither deltalake nor pyiceberg."""
    code = ("import sys, iterreduce.master, iterreduce.worker, iterreduce.launch.local, "
            "iterreduce.launch.yarn.container; print(' '.join(sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=REPO).stdout.split()
    assert "iterreduce.master.master" in loaded and "iterreduce.worker.worker" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("shardio", "dbn", "deltalake", "pyiceberg")] == []
