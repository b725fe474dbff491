"""How the suite's tests share the machine: which must run in one process, and in what order.

The suite runs on pytest-xdist workers side by side (``-n auto --dist loadgroup`` in pyproject.toml;
``-n 0`` runs it in one process), so the unit tests fill the cores while a Hadoop drill
waits on YARN. A costly fixture lives once per worker process, so every test that uses one is put
in that fixture's group (``xdist_group``), and xdist runs a group in one worker, in order:

- a session cluster (:data:`CLUSTERS`): every test on it, whatever its module, in one group;
- a module's own fixtures of wider scope than a test (a cluster of its own, a trained model): the
  module's tests that use them, in the module's group.

Groups start first, the longest first (:data:`CLUSTERS`' order, then the modules'), so the chain of
drills that bounds the suite's time never waits behind short tests.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

#: Session fixtures that start a cluster -> their group, in the order the groups start (longest first).
CLUSTERS = {"hadoop": "hadoop", "hdfs": "hadoop", "secure_hadoop": "secure-hadoop"}
_CLUSTER_ORDER = list(dict.fromkeys(CLUSTERS.values()))

#: Module groups that are long drills on a cluster of their own, the longest first (2026-12-06's run:
#: test_shared 8.4 min, test_multinode 4.5, test_kerberos_yarn's short-lived tokens 3.2; 2026-12-08:
#: test_hadoop_versions 3.0, test_ha_hdfs 1.8): they start right after the session clusters', so that none of them ends
#: the run alone.
DRILLS = ["tests/test_shared.py", "tests/test_multinode.py", "tests/test_kerberos_yarn.py",
          "tests/test_hadoop_versions.py", "tests/test_ha_hdfs.py"]

#: Workers for ``-n auto``: more than the cores, since the drills mostly wait; ``DBN_TEST_WORKERS`` overrides.
WORKERS_PER_CORE = 2
WORKERS_ENV = "DBN_TEST_WORKERS"


def workers() -> int:
    """How many xdist workers ``-n auto`` starts."""
    given = os.environ.get(WORKERS_ENV)
    if given:
        if not given.isdigit() or int(given) < 1:
            raise ValueError(f"${WORKERS_ENV}={given!r}: not a positive whole number")
        return int(given)
    return WORKERS_PER_CORE * (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())


def group_of(item) -> str | None:
    """The group ``item`` must run in, or None where any worker may run it."""
    definitions = item._fixtureinfo.name2fixturedefs
    clusters = {CLUSTERS[name] for name in item.fixturenames if name in CLUSTERS and name in definitions}
    if clusters:  # a test on two clusters joins the later one's group (the shorter chain) and starts the other there
        return max(clusters, key=_CLUSTER_ORDER.index)
    module = item.module.__name__ if getattr(item, "module", None) else None
    for name in item.fixturenames:
        for definition in definitions.get(name, ()):
            if definition.scope in ("module", "class", "package") and _defined_in(definition, module):
                return item.nodeid.split("::", 1)[0]
    return None


def _defined_in(definition, module: str | None) -> bool:
    function = getattr(definition, "func", None)
    return module is not None and getattr(function, "__module__", None) == module


def rank(group: str | None) -> tuple[int, int]:
    """Sort key of a group: clusters first (in :data:`CLUSTERS`' order), then :data:`DRILLS`, then the
    other modules' groups, then the tests any worker may run."""
    if group is None:
        return (3, 0)
    if group in _CLUSTER_ORDER:
        return (0, _CLUSTER_ORDER.index(group))
    return (1, DRILLS.index(group)) if group in DRILLS else (2, 0)


#: The markers of tests that need more than this process and its children: a cluster, Spark, a browser, a GPU.
HEAVY_MARKS = ("yarn", "hdfs", "kerberos", "multinode", "shared", "spark", "browser", "gpu", "slow")


#: The tests measured too slow for the quick tier (a local mini-cluster job, a fuzzing run), one
#: ``SECONDS NODE_ID`` a line, made by ``python tests/scheduling.py slow REPORT.xml`` from a junit report
#: of the quick tier (``pytest -m quick -n auto --junitxml REPORT.xml``).
SLOW_LIST = Path(__file__).resolve().parent / "slow-tests.txt"
#: A test that took this long (setup, call and teardown, on the quick tier's xdist workers on 2 cores) is not
#: quick: 3 s keeps 1,696 of its 1,849 tests, 5.1 minutes of test time (2026-12-07).
QUICK_LIMIT_S = 3.0


def read_slow(path: Path = SLOW_LIST) -> frozenset[str]:
    """The node ids of :data:`SLOW_LIST` (none where the file is missing); a line that is not
    ``SECONDS NODE_ID`` is refused, naming the file and line."""
    if not path.is_file():
        return frozenset()
    ids = set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        seconds, _, node = line.partition(" ")
        try:
            float(seconds)
        except ValueError:
            node = ""
        if not node.startswith("tests/") or "::" not in node:
            raise ValueError(f"{path}:{number}: {line[:80]!r} is not 'SECONDS tests/...::test'")
        ids.add(node.strip())
    return frozenset(ids)


#: Every test id this process collected, before any was deselected (:func:`note_collected`).
COLLECTED: set[str] = set()


def note_collected(items) -> None:
    """Keep the ids of ``items`` (the whole collection) in :data:`COLLECTED`."""
    COLLECTED.update(_base_id(item.nodeid) for item in items)


def is_quick(item, group: str | None) -> bool:
    """Whether ``item`` belongs to the quick tier (``pytest -m quick``): no heavy marker, no cluster,
    not measured slow (:data:`SLOW_LIST`)."""
    return (not any(item.get_closest_marker(name) for name in HEAVY_MARKS)
            and group not in _CLUSTER_ORDER and _base_id(item.nodeid) not in _slow())


@functools.cache
def _slow() -> frozenset[str]:
    """:data:`SLOW_LIST` read once a process."""
    return read_slow()


def _base_id(node_id: str) -> str:
    """A node id without xdist's ``@group`` suffix."""
    return node_id.split("@", 1)[0]


def slow_lines(report: Path, limit: float = QUICK_LIMIT_S) -> list[str]:
    """:data:`SLOW_LIST`'s lines from a junit report: the tests that took ``limit`` seconds or more,
    the slowest first (a parametrised test's cases each on its own)."""
    import xml.etree.ElementTree as ET

    took: dict[str, float] = {}
    for case in ET.parse(report).iter("testcase"):
        module = case.get("classname", "").split(".")
        name, seconds = case.get("name", ""), float(case.get("time") or 0)
        # junit writes tests.test_x.TestClass for tests/test_x.py::TestClass
        path = [p for p in module if p.startswith("test_") or p == "tests"]
        classes = module[len(path):]
        node = "/".join(path) + ".py::" + "::".join([*classes, _base_id(name)])
        took[node] = took.get(node, 0.0) + seconds
    return [f"{took[n]:.1f} {n}" for n in sorted(took, key=lambda n: -took[n]) if took[n] >= limit]


def mark(item) -> None:
    """Put ``item`` in its group (on collection: xdist reads the groups into the test ids after it) and,
    where it is light, in the quick tier."""
    import pytest

    group = group_of(item)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))
    if is_quick(item, group):
        item.add_marker(pytest.mark.quick)


def order(items) -> None:
    """Order ``items`` so that the groups start first, the longest first (a stable sort)."""
    def key(item):
        marker = item.get_closest_marker("xdist_group")
        return rank(marker.args[0] if marker else None)

    items.sort(key=key)


def check_groups_reach_the_ids(config, items) -> None:
    """On an xdist worker of ``--dist loadgroup``: fail the run unless xdist put each group into its test
    ids (where it does not, as with pytest 9.2 and xdist 3.8, every worker would start every cluster)."""
    import pytest

    if not (hasattr(config, "workerinput") and getattr(config.option, "loadgroup", False)):
        return
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not group {len(lost)} tests (the first: {lost[0]}): "
                                "pytest and pytest-xdist must be the versions of locks/test.txt")


if __name__ == "__main__":  # python tests/scheduling.py slow REPORT.xml > tests/slow-tests.txt
    if sys.argv[1:2] != ["slow"] or len(sys.argv) != 3:
        sys.exit("usage: python tests/scheduling.py slow REPORT.xml > tests/slow-tests.txt")
    print(f"# Measured too slow for the quick tier (>= {QUICK_LIMIT_S} s): seconds, then the test.\n"
          "# Made by: pytest -m quick -n auto --junitxml REPORT.xml; python tests/scheduling.py slow REPORT.xml")
    print("\n".join(slow_lines(Path(sys.argv[2]))))
