"""Which hosts hold a worker's HDFS bytes, so that it runs next to its data.

Neither hdfs-native nor pyarrow report block locations, so this asks the
cluster's own ``hdfs fsck PATH -files -blocks -locations`` (present on any
Hadoop edge node, where ``yarn`` must be too for skein): :class:`Blocks` counts
each host's bytes of a file, :func:`slot_blocks` of each worker's shards, and
:func:`place` picks each worker's node. Without ``hdfs``, or for non-HDFS data,
there is no locality information and YARN places containers anywhere.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
import re
import shutil
import socket
import subprocess
from urllib.parse import urlparse

from ...exceptions import HadoopConfigError
from ...storage import kerberos
from ...storage.filesystems import keytab_login

log = logging.getLogger("iterreduce.yarn")

# Hadoop 2.7+: "[DatanodeInfoWithStorage[10.0.0.5:50010,DS-...,DISK], ...]"; older: "[10.0.0.5:50010, ...]"
_LOCATION = re.compile(r"(?:DatanodeInfoWithStorage\[|\[|,\s*)([A-Za-z0-9_.\-]+):\d+(?=[,\]])")
_FILE = re.compile(r"^(/\S*) \d+ bytes")
_LENGTH = re.compile(r" len=(\d+)")


@dataclass(frozen=True)
class Blocks:
    """Where a file's (or a worker's files') bytes are stored: ``size`` bytes in all, and for
    each host the bytes of the blocks it holds a replica of."""

    size: int = 0
    on: dict[str, int] = field(default_factory=dict)

    def local_fraction(self, host: str) -> float:
        """The share of the bytes a reader on ``host`` reads from its own disks (1.0 with no bytes)."""
        return self.on.get(host, 0) / self.size if self.size else 1.0

    def hosts(self) -> list[str]:
        """The hosts holding any of the bytes, those holding the most first."""
        return sorted(self.on, key=lambda h: (-self.on[h], h))

    def __add__(self, other: Blocks) -> Blocks:
        on = dict(self.on)
        for host, n in other.on.items():
            on[host] = on.get(host, 0) + n
        return Blocks(self.size + other.size, on)

    def part(self, fraction: float) -> Blocks:
        """A ``fraction`` of these bytes, spread over the hosts as the whole is (a part of a file)."""
        return Blocks(round(self.size * fraction), {h: round(n * fraction) for h, n in self.on.items()})


def parse_fsck(text: str) -> dict[str, Blocks]:
    """Each file's :class:`Blocks`, from ``hdfs fsck -files -blocks -locations`` output."""
    result: dict[str, Blocks] = {}
    current = None
    for line in text.splitlines():
        match = _FILE.match(line)
        if match:
            current = match.group(1)
            result[current] = Blocks()
        elif current and "blk_" in line:
            length = _LENGTH.search(line)
            n = int(length.group(1)) if length else 0
            hosts = dict.fromkeys(_LOCATION.findall(line.split(" len=", 1)[-1]), n)
            result[current] = result[current] + Blocks(n, hosts)
    return result


@functools.lru_cache(maxsize=1024)
def _hostname(address: str) -> str:
    try:
        return socket.gethostbyaddr(address)[0]
    except OSError:
        return address


def file_blocks(uris: list[str], timeout: float = 120.0) -> dict[str, Blocks]:
    """``{uri: Blocks}`` for the files on HDFS, or ``{}`` where it cannot be known.

    ``hdfs fsck`` checks one path at a time, so this runs it once per folder of files
    (usually one) and picks the files out of its report.
    """
    hdfs_uris = [u for u in uris if urlparse(u).scheme in ("hdfs", "viewfs")]
    hdfs = shutil.which("hdfs")
    if not hdfs_uris or not hdfs:
        if hdfs_uris:
            log.info("no `hdfs` command on PATH: no data locality for the workers")
        return {}
    folders: dict[str, list[str]] = {}
    for uri in hdfs_uris:
        folders.setdefault(uri.rsplit("/", 1)[0], []).append(uri)
    found: dict[str, Blocks] = {}
    for folder, members in folders.items():
        try:
            with kerberos.keytab_ticket(*keytab_login()) as env:  # Hadoop's tool takes no keytab: a ticket from it
                proc = subprocess.run([hdfs, "fsck", folder, "-files", "-blocks", "-locations"],
                                      capture_output=True, text=True, timeout=timeout, env=env)
        except (OSError, subprocess.TimeoutExpired, HadoopConfigError) as exc:
            log.warning("hdfs fsck %s failed (%s): no data locality", folder, exc)
            return {}
        by_path = parse_fsck(proc.stdout)
        if proc.returncode != 0 or not by_path:
            said = (proc.stderr or proc.stdout).strip().splitlines()
            log.warning("hdfs fsck %s failed (%s): no data locality", folder, said[-1] if said else proc.returncode)
            return {}
        for uri in members:
            blocks = by_path.get(urlparse(uri).path, Blocks())
            found[uri] = Blocks(blocks.size, {_hostname(h): n for h, n in blocks.on.items()})
    return found


def piece_blocks(source_uri: str, pieces, locate=file_blocks) -> list[Blocks]:
    """Where each of a table's ``pieces`` is stored: its rows' part of its file's bytes (pieces of
    one file share it by rows). ``source_uri``: the table's, whose scheme and name service the
    pieces' paths are on; ``locate``: ``{file URI: Blocks}`` of a list of URIs (:func:`file_blocks`)."""
    parts = urlparse(source_uri)
    uris, file_rows = {}, {}
    for piece in pieces:
        uris.setdefault(piece.path, f"{parts.scheme}://{parts.netloc}{piece.path}" if parts.scheme else piece.path)
        file_rows[piece.path] = file_rows.get(piece.path, 0) + piece.rows
    by_file = locate(sorted(set(uris.values())))
    return [by_file.get(uris[p.path], Blocks()).part(p.rows / file_rows[p.path]) if file_rows[p.path] else Blocks()
            for p in pieces]


def slot_blocks(uris: list[str], workers: int, blocks: dict[str, Blocks]) -> list[Blocks]:
    """For worker slot K (shards K, K+N, ...), where its shards' bytes are."""
    return [sum((blocks.get(uri, Blocks()) for uri in uris[k::workers]), Blocks()) for k in range(workers)]


def place(slots: list[Blocks]) -> list[str]:
    """One host for each worker slot: one holding the most of its bytes, and among those (replicas
    make ties) the one with the fewest slots so far, so that workers spread over the nodes where
    locality allows; slots with the fewest such hosts choose first. ``""`` for a slot whose bytes
    are nowhere known (YARN then places it anywhere)."""
    def best(slot: Blocks) -> list[str]:
        top = max(slot.on.values(), default=0)
        return sorted(h for h, n in slot.on.items() if n == top and n > 0)

    placed, load = [""] * len(slots), {}
    for k in sorted(range(len(slots)), key=lambda k: (len(best(slots[k])), k)):
        hosts = best(slots[k])
        if hosts:
            placed[k] = min(hosts, key=lambda h: (load.get(h, 0), h))
            load[placed[k]] = load.get(placed[k], 0) + 1
    return placed
