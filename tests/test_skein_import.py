"""skein on a Python without ``distutils`` (3.12 and later): iterreduce.launch.yarn.skein_import.

The suite's Python has ``distutils``; a child process here loses it (a finder that refuses it
first, as 3.12 does) to show the project's modules import skein there, and that skein itself
would not. The real 3.12 and 3.13 run in tests/test_pythons.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import pytest

from iterreduce.launch.yarn.skein_import import LooseVersion

VERSIONS = ["1.18.0", "1.17.9", "1.18", "1.9", "1.10.0rc1", "1.85.1", "2.0.0.dev0", "1.18.0.post1", "1.2a", "1.2b3", "1.18.0.1"]

#: What runs first in the child: Python 3.12's view of distutils (none), also past setuptools' copy.
NO_DISTUTILS = textwrap.dedent("""
    import sys
    class NoDistutils:
        def find_spec(self, name, path=None, target=None):
            if name == "distutils" or name.startswith("distutils."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, NoDistutils())
    sys.modules.pop("distutils", None)
""")


def child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_DISTUTILS + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


def test_the_stand_in_orders_versions_as_distutils_did():
    warnings.simplefilter("ignore", DeprecationWarning)  # distutils' own, on every call (pytest restores the filters)
    real = pytest.importorskip("distutils.version").LooseVersion
    unordered = 0
    for a in VERSIONS:
        for b in VERSIONS:
            try:
                expected = (real(a) < real(b), real(a) == real(b), real(a) >= real(b))
            except TypeError:  # a number against a word: distutils cannot order them either
                with pytest.raises(TypeError):
                    LooseVersion(a) < LooseVersion(b)  # noqa: B015
                unordered += 1
                continue
            assert (LooseVersion(a) < b, LooseVersion(a) == LooseVersion(b), LooseVersion(a) >= b) == expected, (a, b)
    assert unordered == 2  # "1.18.0.post1" and "1.18.0.1", both ways


def test_without_distutils_skein_alone_fails_and_through_the_project_it_imports_and_works():
    alone = child("import skein")
    assert alone.returncode == 1 and "No module named 'distutils'" in alone.stderr, alone.stderr

    through = child("""
        from iterreduce.launch.yarn import appspec, client, container  # the client's and the containers' side
        from iterreduce.launch.yarn.skein_import import LooseVersion, skein
        import dbn.jobs.yarn
        assert skein.utils.LooseVersion is LooseVersion
        with skein.utils.grpc_fork_support_disabled():  # skein's one use of it
            pass
        assert "distutils" not in sys.modules and "distutils.version" not in sys.modules  # lent, then taken back
        try:
            import distutils.version
        except ModuleNotFoundError:
            print("no distutils after skein")
        print(skein.Security.new_credentials().cert_bytes[:27].decode())
    """)
    assert through.returncode == 0, through.stderr
    assert through.stdout.splitlines() == ["no distutils after skein", "-----BEGIN CERTIFICATE-----"]
    assert through.stderr == ""


def test_where_distutils_is_there_skein_gets_the_real_one():
    done = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c",
                           "from iterreduce.launch.yarn.skein_import import skein\n"
                           "import distutils.version\n"
                           "assert skein.utils.LooseVersion is distutils.version.LooseVersion"],
                          capture_output=True, text=True, timeout=120)
    if "No module named 'distutils'" in done.stderr:
        pytest.skip(f"this Python ({sys.version.split()[0]}) has no distutils")
    assert done.returncode == 0, done.stderr
