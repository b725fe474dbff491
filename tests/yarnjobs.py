"""What the tests of YARN jobs share: a view of the cluster from a test (:class:`Yarn`) and a small
job (:func:`job_file`)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import numpy as np
from iterreduce.launch.yarn.skein_import import skein

from iterreduce.launch.yarn import KV_PROGRESS
from iterreduce.launch.yarn import client as yarn_client

N_FEATURES = 16
TERMINAL = ("FINISHED", "FAILED", "KILLED")
#: ``DBN_HADOOP_KEEP=1`` keeps the test clusters' folders (data, every daemon's and container's logs).
KEEP_CLUSTERS = bool(os.environ.get("DBN_HADOOP_KEEP"))


@contextlib.contextmanager
def started(cluster, what: str):
    """``cluster`` (a :class:`minihadoop.MiniHadoop`, not yet started) started for some tests and
    stopped after them, also when they fail. Skips only when Java 17+ or Maven is missing; when
    the cluster cannot start (or its jars cannot be fetched) the tests fail, naming ``what``."""
    import pytest

    from minihadoop import HadoopError, ToolMissing

    try:
        cluster.start()
    except ToolMissing as exc:
        pytest.skip(str(exc))
    except HadoopError as exc:
        pytest.fail(f"cannot start {what}: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


class Yarn:
    """The session's cluster seen from a test: skein's client, and the processes behind containers."""

    def __init__(self, hadoop, client: skein.Client):
        self.hadoop, self.client = hadoop, client

    def report(self, app_id):
        return self.client.application_report(app_id)

    def wait(self, app_id, states=TERMINAL, timeout=240.0):
        deadline = time.monotonic() + timeout
        while True:
            report = self.report(app_id)
            if str(report.state) in states:
                return report
            assert time.monotonic() < deadline, f"{app_id} still {report.state} after {timeout} s"
            time.sleep(0.5)

    def step(self, app_id) -> int:
        """The master's newest superstep (-1 before the first), from the key-value store."""
        if str(self.report(app_id).state) != "RUNNING":
            return -1
        try:
            value = yarn_client.application(self.client, app_id).kv.get(KV_PROGRESS)  # its own credentials
        except (skein.exceptions.SkeinError, ConnectionError, ValueError):
            return -1
        return json.loads(value)["step"] if value else -1

    def wait_step(self, app_id, step: int, timeout=180.0) -> None:
        deadline = time.monotonic() + timeout
        while self.step(app_id) < step:
            report = self.report(app_id)
            assert str(report.state) not in TERMINAL, f"{report.diagnostics}\n{self.node_logs(app_id)}"
            assert time.monotonic() < deadline, f"{app_id} did not reach superstep {step} in {timeout} s"
            time.sleep(0.3)

    def containers(self, app_id, states=None):
        """The application's worker containers (services ``worker-K``)."""
        app = yarn_client.application(self.client, app_id)
        return [c for c in app.get_containers(states=states) if c.service_name.startswith("worker-")]

    def pids(self, yarn_container_id: str, command_part: str) -> list[int]:
        """Processes of a container (by $CONTAINER_ID) whose command line contains ``command_part``."""
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                environ = (proc / "environ").read_bytes().split(b"\0")
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if f"CONTAINER_ID={yarn_container_id}".encode() in environ and command_part.encode() in cmdline:
                found.append(int(proc.name))
        return found

    def node_logs(self, app_id, tail: int = 3000) -> str:
        """The containers' logs straight from the NodeManager's log folder (for assertion messages):
        the last ``tail`` characters of each."""
        texts = []
        for path in sorted([*self.hadoop.dir.glob(f"cluster/**/*-logDir-*/{app_id}/container_*/*"),
                            *self.hadoop.dir.glob(f"nodes/*/nm-logs/{app_id}/container_*/*")]):
            texts.append(f"== {path.parent.name}/{path.name}\n" + path.read_text(errors="replace")[-tail:])
        return "\n".join(texts) or "(no container logs)"

    def assert_succeeded(self, report, app_id) -> None:
        """Fail unless ``report`` (the application's final report) says SUCCEEDED: the diagnostics
        in the message, and every container's whole log on stdout (pytest shows a failing test's
        output in full; an assertion message it cuts short at its default verbosity)."""
        if str(report.final_status) != "SUCCEEDED":
            print(self.node_logs(app_id, tail=200_000))
            raise AssertionError(f"{app_id} ended {report.final_status}: {report.diagnostics} (its logs: stdout)")

    def hdfs_json_lines(self, path: str) -> list[dict]:
        with self.hadoop.fs().open_input_stream(path) as f:
            return [json.loads(line) for line in f.read().decode().splitlines()]


def labelled_rows(rows=600, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """A small labelled data set of :data:`N_FEATURES` binary features in three learnable classes."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, rows)
    X = (rng.random((rows, N_FEATURES)) < 0.2 + 0.2 * y[:, None] * (np.arange(N_FEATURES) % 3 == y[:, None])
         ).astype(np.float32)
    return X, y


def job_file(tmp_path, output: str, *, env: str | None = None, workers=2, epochs=6, finetune=4,
             gpus=0, extra="", cluster_extra="") -> str:
    """A small labelled data set and a job config that trains a 16-12-8-3 DBN on it."""
    X, y = labelled_rows()
    np.savez(tmp_path / "train.npz", X=X, y=y)
    path = tmp_path / "job.toml"
    path.write_text(f"""
[data]
train = "{tmp_path / 'train.npz'}"
[model]
hidden_layers = [12, 8]
pretrain_epochs = {epochs}
finetune_epochs = {finetune}
pretrain_batch_size = 10
finetune_batch_size = 10
[output]
dir = "{output}"
[cluster]
workers = {workers}
heartbeat_timeout = 6.0
max_restarts = 2
{cluster_extra}
[yarn]
{f'env = "{env}"' if env else ''}
worker_memory = "512 MiB"
worker_vcores = 1
worker_gpus = {gpus}
master_memory = "1 GiB"
{extra}
[job]
name = "e2e"
device = "cpu"
""")
    return str(path)


def shipped_job(output: str) -> dict:
    """The job file ``dbn submit`` wrote and shipped for the newest submission whose output folder is
    ``output``: not merely the newest in the cache, which the submissions of tests on other xdist
    workers share."""
    from dbn.jobs.yarn import SUBMISSIONS
    from dbn.user_cache import cache_dir

    mine = []
    for path in cache_dir(SUBMISSIONS).glob("*/job.json"):
        job = json.loads(path.read_text())  # other commands' job files (dbn score's) hold no job spec
        if ((job.get("spec") or {}).get("output") or {}).get("dir") == output:
            mine.append((path.stat().st_mtime, job))
    assert mine, f"no job file in {cache_dir(SUBMISSIONS)} writes to {output}"
    return max(mine, key=lambda found: found[0])[1]


def upload(fs, local: Path, remote: str) -> None:
    """Copy the folder ``local`` to ``remote`` on HDFS, as it is (side files included)."""
    for path in sorted(local.rglob("*")):
        target = f"{remote}/{path.relative_to(local).as_posix()}"
        if path.is_dir():
            fs.create_dir(target)
        else:
            with fs.open_output_stream(target, compression=None) as out:
                out.write(path.read_bytes())


@contextlib.contextmanager
def shared_driver(cluster, skein_dir: Path):
    """This process set up as a client of ``cluster`` (its environment), with skein credentials of its
    own in ``skein_dir`` and one skein driver that the in-process CLI calls share; yields a :class:`Yarn`
    and puts the environment back afterwards."""
    saved = dict(os.environ)
    os.environ.update(cluster.env())
    security = skein.Security.new_credentials()
    security.to_directory(str(skein_dir))
    os.environ["SKEIN_CONFIG"] = str(skein_dir)
    client = skein.Client(security=security)  # skein's own driver, found through `yarn classpath`
    os.environ["ITERREDUCE_SKEIN_DRIVER"] = client.address
    try:
        yield Yarn(cluster, client)
    finally:
        client.close()
        os.environ.clear()
        os.environ.update(saved)
