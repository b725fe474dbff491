#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv.
# Needs only Python >= 3.11 with venv and pip; downloads from PyPI.
# Usage: bash bootstrap.sh [EXTRAS]   (default extras: test)
set -euo pipefail
cd "$(dirname "$0")"
extras="${1:-test}"
python="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
# Reinstall only when the package metadata or the extras changed.
stamp=".venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[${extras}]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
