"""Which hosts hold a shard's HDFS blocks, so workers can run next to their data.

Neither hdfs-native nor pyarrow report block locations, so this asks the
cluster's own ``hdfs fsck PATH -files -blocks -locations`` (present on any
Hadoop edge node, where ``yarn`` must be too for skein). Without it, or for
non-HDFS shards, there is no locality information and YARN places containers
anywhere.
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
import socket
import subprocess
from urllib.parse import urlparse

from .. import kerberos
from ..exceptions import HadoopConfigError
from ..filesystems import keytab_login

log = logging.getLogger("iterreduce.yarn")

# Hadoop 2.7+: "[DatanodeInfoWithStorage[10.0.0.5:50010,DS-...,DISK], ...]"; older: "[10.0.0.5:50010, ...]"
_LOCATION = re.compile(r"(?:DatanodeInfoWithStorage\[|\[|,\s*)([A-Za-z0-9_.\-]+):\d+(?=[,\]])")
_FILE = re.compile(r"^(/\S*) \d+ bytes")


def parse_fsck(text: str) -> dict[str, list[str]]:
    """Hosts holding each file's blocks, from ``hdfs fsck -files -blocks -locations`` output.

    Returns ``{path: [host, ...]}``, hosts ordered by how many of the file's blocks they hold.
    """
    result: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        match = _FILE.match(line)
        if match:
            current = match.group(1)
            result[current] = {}
        elif current and "blk_" in line:
            for host in _LOCATION.findall(line.split(" len=", 1)[-1]):
                result[current][host] = result[current].get(host, 0) + 1
    return {path: sorted(hosts, key=lambda h: -hosts[h]) for path, hosts in result.items()}


@functools.lru_cache(maxsize=1024)
def _hostname(address: str) -> str:
    try:
        return socket.gethostbyaddr(address)[0]
    except OSError:
        return address


def block_hosts(uris: list[str], timeout: float = 120.0) -> dict[str, list[str]]:
    """``{uri: [hosts]}`` for the shards on HDFS, or ``{}`` where it cannot be known.

    ``hdfs fsck`` checks one path at a time, so this runs it once per folder of shards
    (usually one) and picks the shards' files out of its report.
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
    found: dict[str, list[str]] = {}
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
            found[uri] = [_hostname(h) for h in by_path.get(urlparse(uri).path, [])]
    return found


def slot_hosts(uris: list[str], workers: int, hosts: dict[str, list[str]]) -> list[list[str]]:
    """For worker slot K (shards K, K+N, ...), the hosts holding the most of its shards' blocks."""
    slots = []
    for k in range(workers):
        counts: dict[str, int] = {}
        for uri in uris[k::workers]:
            for host in hosts.get(uri, []):
                counts[host] = counts.get(host, 0) + 1
        slots.append(sorted(counts, key=lambda h: -counts[h]))
    return slots
