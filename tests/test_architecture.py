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


def test_the_processes_a_launcher_starts_import_the_packages_from_where_it_does(tmp_path, monkeypatch):
    """A launcher puts the folder holding the packages first on its children's PYTHONPATH (a checkout
    run without an install works): that folder moves with the modules, so it is checked, not assumed."""
    from iterreduce.launch.local import LocalCluster
    from iterreduce.master import MasterConfig
    from shardio import footers

    config = MasterConfig(program="p:P", program_config={}, shards=["a"], workers=1, token="t", output=str(tmp_path))
    first = LocalCluster(config)._env(0)["PYTHONPATH"].split(":")[0]
    started = {}
    monkeypatch.setattr(footers.subprocess, "Popen", lambda args, **kwargs: started.update(kwargs))
    footers._start("shardio.readers")
    for root in (first, started["env"]["PYTHONPATH"].split(":")[0]):
        assert Path(root) == REPO and all((Path(root) / p / "__init__.py").is_file() for p in NEVER.keys() | {"dbn"})
