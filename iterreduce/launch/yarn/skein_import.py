"""skein, imported the one way the client and the containers share, on every supported Python.

skein 0.8.2 (2022, its last release) imports ``distutils.version.LooseVersion`` in
``skein/utils.py``, once, to compare grpc's version with 1.18. ``distutils`` left the
standard library in Python 3.12, so there ``import skein`` ends in ``ModuleNotFoundError``.
Where the real module is missing, :func:`import_skein` lends skein a stand-in for the length
of its import and takes it away again: no other library sees a ``distutils`` that is not
there. Every module of the project that uses skein imports it from here
(``from iterreduce.launch.yarn.skein_import import skein``), never directly.
"""

from __future__ import annotations

import importlib
import re
import sys
import types

#: The modules the stand-in takes the place of, only while skein is imported.
_STAND_IN_NAMES = ("distutils", "distutils.version")


class LooseVersion:
    """``distutils.version.LooseVersion`` as skein uses it: a version string cut into numbers
    and words, compared part by part with another version or a string (as distutils did)."""

    _parts = re.compile(r"(\d+|[a-z]+|\.)", re.IGNORECASE)

    def __init__(self, vstring: str):
        self.vstring = str(vstring)
        self.version = [int(p) if p.isdigit() else p
                        for p in self._parts.split(self.vstring) if p and p != "."]

    def _other(self, other) -> list:
        return (other if isinstance(other, LooseVersion) else LooseVersion(other)).version

    def __eq__(self, other):
        return self.version == self._other(other)

    def __lt__(self, other):
        return self.version < self._other(other)

    def __le__(self, other):
        return self.version <= self._other(other)

    def __gt__(self, other):
        return self.version > self._other(other)

    def __ge__(self, other):
        return self.version >= self._other(other)

    def __repr__(self) -> str:
        return f"LooseVersion({self.vstring!r})"


def _has_distutils() -> bool:
    try:
        importlib.import_module("distutils.version")
    except ImportError:
        return False
    return True


def import_skein() -> types.ModuleType:
    """The ``skein`` module, imported with a ``distutils.version`` stand-in where Python has none
    (3.12 and later, without setuptools' own copy), which is removed again right after."""
    if "skein" in sys.modules or _has_distutils():
        return importlib.import_module("skein")
    package = types.ModuleType("distutils")
    package.__path__ = []  # a package, so that "distutils.version" is found beneath it
    version = types.ModuleType("distutils.version")
    version.LooseVersion = LooseVersion
    package.version = version
    lent = dict(zip(_STAND_IN_NAMES, (package, version)))
    sys.modules.update(lent)
    try:
        return importlib.import_module("skein")
    finally:
        for name, module in lent.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


skein = import_skein()
