#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment in .venv.
# Needs only Python >= 3.11 with venv and pip; downloads from PyPI.
# Usage: bash bootstrap.sh [EXTRAS]
#   bash bootstrap.sh         the main job's needs: the package and matplotlib for dbn mnist's plots (extra "plots")
#   bash bootstrap.sh test    the test suite's: the test extras, and as root Debian's chromium and MIT Kerberos
#   other extras of pyproject.toml, comma-separated: notebook, gpu, bench, hdfs, delta, iceberg, hive, dev
set -euo pipefail
cd "$(dirname "$0")"
extras="${1:-plots}"
python="${PYTHON:-python3}"

if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
# The live page's browser tests drive Debian's Chromium (tests/browser.py): install it where we may.
if [[ ",$extras," == *",test,"* ]] && ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null \
      || echo "bootstrap: could not install chromium and chromium-driver: the browser tests will be skipped" >&2
  else
    echo "bootstrap: chromium and chromium-driver are not installed: the browser tests will be skipped" >&2
  fi
fi
# The Kerberos tests (tests/securehadoop.py) use MIT Kerberos: the GSSAPI library hdfs-native loads at run
# time, and kinit (without it the harness gets tickets from Java). Debian's packages, where we may.
if [[ ",$extras," == *",test,"* ]] && ! command -v kinit >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      krb5-user libgssapi-krb5-2) >/dev/null \
      || echo "bootstrap: could not install krb5-user and libgssapi-krb5-2: without libgssapi_krb5 the Kerberos HDFS tests will be skipped" >&2
  else
    echo "bootstrap: krb5-user (kinit) is not installed: the Kerberos tests get their tickets from Java" >&2
  fi
fi
# The test environment is installed from its lock (locks/test.txt, remade on purpose by locks/lock.py): an upstream
# release never changes what the suite runs on. The main job's install takes the newest versions.
constraints=()
if [[ ",$extras," == *",test,"* ]]; then
  constraints=(--constraint locks/test.txt)
fi
# Reinstall only when the package metadata, the lock or the extras changed.
stamp=".venv/.installed-$(cat pyproject.toml "${constraints[@]:1}" | sha256sum | cut -c1-16)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet "${constraints[@]}" -e ".[${extras}]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# The compatibility tier's wheelhouses (tests/pythons.py): the dependencies' wheels for this machine's other
# supported Pythons, pinned by the test lock, downloaded once here rather than inside the suite's time.
if [[ ",$extras," == *",test,"* ]]; then
  .venv/bin/python tests/pythons.py >/dev/null \
    || echo "bootstrap: could not fill the other Pythons' wheelhouses: tests/test_pythons.py will try again" >&2
fi
# The jars of the suite's Hadoops (tests/minihadoop.py: 3.5.0 and the older releases of the compatibility
# tier), fetched by Maven once here rather than inside the suite's time.
if [[ ",$extras," == *",test,"* ]]; then
  .venv/bin/python tests/minihadoop.py --fetch-jars >/dev/null \
    || echo "bootstrap: could not fetch Hadoop's jars: the Hadoop tests will try again" >&2
fi
# The MLflow tests' tracking server (tests/mlflowserver.py): full mlflow in an environment of its own in the
# per-user cache, made once here rather than inside the suite's time.
if [[ ",$extras," == *",test,"* ]]; then
  .venv/bin/python tests/mlflowserver.py >/dev/null \
    || echo "bootstrap: could not make the MLflow server's environment: tests/test_tracking.py will try again" >&2
fi
