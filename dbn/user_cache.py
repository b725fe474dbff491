"""The user's cache folder, where dbn-yarn keeps what it makes once and reuses: submissions' job
files and packed environments, MNIST's files; the tests keep Hadoop's jars and an MLflow server there.

The XDG Base Directory rule, as pip follows it: ``$XDG_CACHE_HOME`` where it is an absolute path
(a relative one is ignored), else ``~/.cache``. Read at each call, so that a changed environment
(a test's, a job's) is followed.
"""
from __future__ import annotations

import os
from pathlib import Path

#: The project's own folder in the cache (``cache_dir()``).
PROJECT_FOLDER = "dbn-yarn"


def cache_home() -> Path:
    """``$XDG_CACHE_HOME`` where it is absolute, else ``~/.cache``."""
    given = os.environ.get("XDG_CACHE_HOME", "")
    return Path(given) if os.path.isabs(given) else Path.home() / ".cache"


def cache_dir(*parts: str) -> Path:
    """The project's cache folder (``cache_home() / "dbn-yarn"``), or ``parts`` under it."""
    return cache_home().joinpath(PROJECT_FOLDER, *parts)
