#!/usr/bin/env python3
"""The suite's size at a commit: its test functions, assert statements and pytest.raises/warns
checks in tests/*.py (issue 62: a faster suite keeps every assertion).

    python benchmarks/assertion_count.py d7ffbfb HEAD
"""
from __future__ import annotations

import ast
import subprocess
import sys


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def count(commit: str) -> dict[str, int]:
    """The test files, test functions, assert statements and pytest.raises/warns calls at ``commit``."""
    files = [f for f in _git("ls-tree", "-r", "--name-only", commit, "tests/").split() if f.endswith(".py")]
    found = {"files": len(files), "test functions": 0, "assert statements": 0, "pytest.raises/warns": 0}
    for name in files:
        for node in ast.walk(ast.parse(_git("show", f"{commit}:{name}"), name)):
            if isinstance(node, ast.Assert):
                found["assert statements"] += 1
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                found["test functions"] += 1
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("raises", "warns") and isinstance(node.func.value, ast.Name)
                  and node.func.value.id == "pytest"):
                found["pytest.raises/warns"] += 1
    return found


if __name__ == "__main__":
    for commit in sys.argv[1:] or ["HEAD"]:
        print(commit, ", ".join(f"{n} {what}" for what, n in count(commit).items()))
