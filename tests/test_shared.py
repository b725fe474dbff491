"""Jobs on a shared cluster (issue 52): a queue of their own beside a busier one, containers preempted.

The module's Hadoop (one node, tests/minihadoop.py) has the CapacityScheduler with two queues,
``prod`` and ``batch``, each guaranteed half the node; ``batch`` may grow to all of it while
``prod`` is idle, and the preemption monitor takes capacity back within about a second once
``prod`` asks for its share (:data:`SHARED_QUEUES`). A small application in ``prod``
(:class:`Competitor`) is the other team: it asks for containers and gives them back.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from iterreduce.launch.yarn.skein_import import skein

from yarnjobs import KEEP_CLUSTERS, job_file, shared_driver, started
from dbn.cli import main

pytestmark = [pytest.mark.shared, pytest.mark.yarn, pytest.mark.hdfs,
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

#: Each container's memory: the node has NODE_MB; a job in batch of a master (MASTER_MB) and three
#: workers (WORKER_MB each) holds more than batch's half, so prod's first container is taken from it.
NODE_MB, MASTER_MB, WORKER_MB = 3072, 1024, 512
#: Pre-training epochs of the preempted job: long enough for six rounds of preemption.
EPOCHS = 120
SHARED_QUEUES = {
    "yarn.scheduler.capacity.root.queues": "prod,batch,tiny,small",
    "yarn.scheduler.capacity.root.prod.capacity": 50,
    "yarn.scheduler.capacity.root.batch.capacity": 50,
    # A queue that can never hold one worker: 5 % of the node is 154 MiB.
    "yarn.scheduler.capacity.root.tiny.capacity": 0,
    "yarn.scheduler.capacity.root.tiny.maximum-capacity": 5,
    # A queue that holds a master and one worker, never a second: 60 % of the node is 1843 MiB.
    "yarn.scheduler.capacity.root.small.capacity": 0,
    "yarn.scheduler.capacity.root.small.maximum-capacity": 60,
    "yarn.scheduler.capacity.root.small.user-limit-factor": 100,
    "yarn.scheduler.capacity.root.small.maximum-applications": 10,  # else 0: its capacity's share
    "yarn.scheduler.capacity.root.prod.maximum-capacity": 100,
    "yarn.scheduler.capacity.root.batch.maximum-capacity": 100,
    # One user may take the whole queue, and more than its guarantee while the other is idle.
    "yarn.scheduler.capacity.root.prod.user-limit-factor": 2,
    "yarn.scheduler.capacity.root.batch.user-limit-factor": 2,
    "yarn.scheduler.capacity.maximum-am-resource-percent": 1.0,
    # Applications may have priorities 0 to 10 (YARN's default maximum is 0: every one the same).
    "yarn.cluster.max-application-priority": 10,
    # Preemption: looked for twice a second, a container killed a second after it was asked back.
    "yarn.resourcemanager.scheduler.monitor.enable": "true",
    "yarn.resourcemanager.scheduler.monitor.policies":
        "org.apache.hadoop.yarn.server.resourcemanager.monitor.capacity.ProportionalCapacityPreemptionPolicy",
    "yarn.resourcemanager.monitor.capacity.preemption.monitoring_interval": 500,
    "yarn.resourcemanager.monitor.capacity.preemption.max_wait_before_kill": 1000,
    "yarn.resourcemanager.monitor.capacity.preemption.total_preemption_per_round": 1.0,
    "yarn.resourcemanager.monitor.capacity.preemption.natural_termination_factor": 1.0,
    "yarn.resourcemanager.monitor.capacity.preemption.max_ignored_over_capacity": 0,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from minihadoop import MiniHadoop

    with started(MiniHadoop(memory_mb=NODE_MB, vcores=8, gpus=0, conf=SHARED_QUEUES,
                            base_dir=tmp_path_factory.mktemp("shared"), keep=KEEP_CLUSTERS),
                 "the Hadoop with two queues and preemption") as hadoop:
        yield hadoop


@pytest.fixture(scope="module")
def yarn(cluster, tmp_path_factory):
    with shared_driver(cluster, tmp_path_factory.mktemp("skein")) as yarn:
        yield yarn


class Competitor:
    """Another team's application in ``prod``: a master that sleeps and a service ``hog`` of
    containers that sleep, as many as :meth:`take` asks for."""

    def __init__(self, client: skein.Client, queue: str = "prod"):
        spec = skein.ApplicationSpec(
            name="competitor", queue=queue,
            master=skein.Master(resources=skein.Resources(memory=256, vcores=1), script="sleep 3600"),
            services={"hog": skein.Service(instances=0, resources=skein.Resources(memory=WORKER_MB, vcores=1),
                                           script="sleep 3600")})
        self.client = client
        self.app_id = client.submit(spec)
        self.app = client.connect(self.app_id, wait=True)

    def take(self, containers: int) -> None:
        """Ask for ``containers`` more containers."""
        self.app.scale("hog", count=len(self.running()) + containers)

    def running(self):
        return self.app.get_containers(services=["hog"], states=["waiting", "requested", "running"])

    def give_back(self) -> None:
        """End every container of ``hog``."""
        self.app.scale("hog", count=0)

    def close(self) -> None:
        self.client.kill_application(self.app_id)


def preempted(yarn, app_id) -> list:
    """The job's worker containers that YARN preempted, as skein reports them."""
    return [c for c in yarn.containers(app_id, states=["FAILED"]) if "preempted" in (c.exit_message or "").lower()]


def submit(capsys, *args) -> str:
    assert main(["submit", *args, "--quiet"]) == 0
    return capsys.readouterr().out.strip()


def test_the_cluster_has_two_queues_and_batch_may_grow_above_its_share(yarn):
    queues = {name: yarn.client.get_queue(name) for name in ("prod", "batch", "tiny", "small")}
    assert {name: q.capacity for name, q in queues.items()} == {"prod": 50, "batch": 50, "tiny": 0, "small": 0}
    assert queues["batch"].max_capacity == 100


def test_a_queue_too_small_for_one_container_is_refused_before_submitting_naming_it(yarn, tmp_path, capsys):
    import sys

    path = job_file(tmp_path, yarn.hadoop.uri("/user/test/tiny"), extra=f'python = "{sys.executable}"\nqueue = "tiny"')
    before = {a.id for a in yarn.client.get_applications(states=["NEW", "SUBMITTED", "ACCEPTED", "RUNNING"])}
    assert main(["submit", path, "--quiet"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "queue 'tiny' may hold at most 154 MiB of memory" in err, err
    assert "less than the application master (1024 MiB of memory)" in err, err
    assert {a.id for a in yarn.client.get_applications(states=["NEW", "SUBMITTED", "ACCEPTED", "RUNNING"])} == before


def test_a_node_label_no_node_has_is_refused_before_submitting_naming_it(yarn, tmp_path, capsys):
    import sys

    path = job_file(tmp_path, yarn.hadoop.uri("/user/test/label"),
                    extra=f'python = "{sys.executable}"\nqueue = "batch"\nnode_label = "gpu"')
    assert main(["submit", path, "--quiet"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no running node has the node label 'gpu' (the nodes' labels: none)" in err, err


def test_a_job_in_batch_whose_workers_are_preempted_again_and_again_succeeds(yarn, tmp_path, capsys):
    """Issue 52's drill and bar: the job's workers preempted six times, the newest worker's slot
    most of them (YARN takes the youngest container first), more than ``max_restarts`` (2)."""
    import sys

    from urllib.parse import urlparse

    output = yarn.hadoop.uri("/user/test/preempted")
    path = job_file(tmp_path, output, workers=3, epochs=EPOCHS, finetune=20,
                    extra=f'python = "{sys.executable}"\nqueue = "batch"',
                    cluster_extra='lost_shards = "redo"\nthreads_per_process = 1\nprocesses = 3')
    app_id = submit(capsys, path)
    started = time.monotonic()
    competitor = Competitor(yarn.client)
    try:
        for cycle in range(6):
            yarn.wait_step(app_id, 2 + cycle, timeout=120)
            deadline = time.monotonic() + 120
            while len(yarn.containers(app_id, states=["RUNNING"])) < 3:
                assert time.monotonic() < deadline, f"cycle {cycle}: the job's workers are not back"
                time.sleep(0.3)
            before = len(preempted(yarn, app_id))
            competitor.take(1)
            deadline = time.monotonic() + 60
            while len(preempted(yarn, app_id)) <= before:
                report = yarn.report(app_id)
                assert str(report.state) == "RUNNING", (cycle, report.diagnostics, yarn.node_logs(app_id))
                assert time.monotonic() < deadline, f"cycle {cycle}: no worker preempted in 60 s"
                time.sleep(0.3)
            competitor.give_back()
        lost = preempted(yarn, app_id)  # as skein counts them, while the application runs
        churned = time.monotonic() - started
        report = yarn.wait(app_id, timeout=300)
    finally:
        competitor.close()
    print(f"six preemptions in {churned:.0f} s; the job took {time.monotonic() - started:.0f} s")
    yarn.assert_succeeded(report, app_id)
    # The job's log names each loss (skein's books close with the application).
    records = yarn.hdfs_json_lines(urlparse(output).path + "/log.jsonl")
    named = [r for r in records if r.get("event") == "container_lost"]
    by_slot = {}
    for r in named:
        by_slot[r["service"]] = by_slot.get(r["service"], 0) + 1
    print("preempted:", by_slot)
    assert sorted(r["container"] for r in named) == sorted(c.id for c in lost), named  # each loss, by name
    assert all(r["cause"] == "preempted" and not r["counted"] for r in named), named
    assert len(named) >= 6 and max(by_slot.values()) >= 4, by_slot
    # Bit-identical to the same job undisturbed (here on the local mini-cluster: same seeds, one thread a worker).
    with yarn.hadoop.fs().open_input_stream(urlparse(output).path + "/model.npz") as f:
        (tmp_path / "yarn-model.npz").write_bytes(f.read())
    local = tmp_path / "undisturbed"
    assert main(["train", path, "--local", "3", "--quiet", "--no-ui", "--out", str(local)]) == 0
    with np.load(tmp_path / "yarn-model.npz") as churned_model, np.load(local / "model.npz") as undisturbed:
        assert sorted(churned_model.files) == sorted(undisturbed.files)
        different = [k for k in undisturbed.files  # every parameter (the header says where each run went)
                     if k != "__header__" and churned_model[k].tobytes() != undisturbed[k].tobytes()]
    assert different == [], different


def test_a_worker_that_keeps_failing_fails_the_job_once_past_max_restarts_naming_it(yarn, tmp_path, capsys):
    """Preemptions are free, the job's own failures are not: every worker exits 3 at once (a Python
    that fails as a worker), and the job ends FAILED once a worker failed more than max_restarts (2)."""
    import sys

    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\ncase "$*" in *"container worker"*) echo "broken worker" >&2; exit 3;; esac\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    path = job_file(tmp_path, yarn.hadoop.uri("/user/test/failing"), workers=2,
                    extra=f'python = "{python}"\nqueue = "batch"')
    app_id = submit(capsys, path)
    report = yarn.wait(app_id, timeout=240)
    assert str(report.final_status) == "FAILED", report.diagnostics
    assert "failed 3 times, more than max_restarts (2)" in report.diagnostics, report.diagnostics
    from urllib.parse import urlparse

    records = yarn.hdfs_json_lines(urlparse(yarn.hadoop.uri("/user/test/failing")).path + "/log.jsonl")
    failed = [r for r in records if r.get("event") == "container_lost"]
    assert all(r["cause"] == "failed" and r["counted"] for r in failed), failed
    assert 3 <= len(failed) <= 6, failed  # the job ended at the third of a worker: not restarted for ever


def test_dbn_scale_shrinks_a_running_job_to_one_worker_and_grows_it_back_to_the_same_model(yarn, tmp_path, capsys):
    """Issue 52's bar for part 4: `dbn scale APP_ID --workers 1`, then 3, mid-job: the workers no
    longer wanted retire (their containers end with exit 0, nothing counted), spare containers come
    for the new ones, the job ends SUCCEEDED with the model bit-identical to the undisturbed run's."""
    import sys
    from urllib.parse import urlparse

    output = yarn.hadoop.uri("/user/test/scaled")
    path = job_file(tmp_path, output, workers=3, epochs=40, finetune=10,
                    extra=f'python = "{sys.executable}"\nqueue = "batch"',
                    cluster_extra='lost_shards = "redo"\nthreads_per_process = 1\nprocesses = 3')
    app_id = submit(capsys, path)
    yarn.wait_step(app_id, 3, timeout=120)
    assert main(["scale", app_id, "--workers", "1"]) == 0
    assert capsys.readouterr().out.strip() == f"{app_id}: 1 workers from its next step (it had 3)"
    deadline = time.monotonic() + 120
    while len(yarn.containers(app_id, states=["SUCCEEDED"])) < 2:  # two retired: exit 0
        assert time.monotonic() < deadline, yarn.containers(app_id)
        time.sleep(0.3)
    shrunk_at = yarn.step(app_id)
    yarn.wait_step(app_id, shrunk_at + 5, timeout=120)  # steps on one worker
    assert len(yarn.containers(app_id, states=["RUNNING"])) == 1
    assert main(["scale", app_id, "--workers", "3"]) == 0
    assert capsys.readouterr().out.strip() == f"{app_id}: 3 workers from its next step (it had 1)"
    assert main(["scale", app_id, "--workers", "9"]) == 2  # its data was cut into 3 shards: 3 at most
    err = capsys.readouterr().err
    assert f"--workers 9: {app_id} can have 1 to 3 workers" in err and len(err.strip().splitlines()) == 1, err
    report = yarn.wait(app_id, timeout=300)
    yarn.assert_succeeded(report, app_id)
    records = yarn.hdfs_json_lines(urlparse(output).path + "/log.jsonl")
    assert [(r["workers"], r["was"]) for r in records if r.get("event") == "resized"] == [(1, 3), (3, 1)]
    retired = sorted(r["worker"].split("#")[0] for r in records if r.get("event") == "worker_retired")
    assert retired == ["worker-1", "worker-2"], retired
    assert not [r for r in records if r.get("event") == "container_lost" and r["counted"]]
    joined = [r["worker"].split("#")[0] for r in records if r.get("event") == "worker_registered"]
    assert sorted(joined) == ["worker-0", "worker-1", "worker-1", "worker-2", "worker-2"], joined
    with yarn.hadoop.fs().open_input_stream(urlparse(output).path + "/model.npz") as f:
        (tmp_path / "yarn-model.npz").write_bytes(f.read())
    local = tmp_path / "undisturbed"
    assert main(["train", path, "--local", "3", "--quiet", "--no-ui", "--out", str(local)]) == 0
    with np.load(tmp_path / "yarn-model.npz") as scaled, np.load(local / "model.npz") as undisturbed:
        different = [k for k in undisturbed.files
                     if k != "__header__" and scaled[k].tobytes() != undisturbed[k].tobytes()]
    assert different == [], different


def test_submit_priority_gives_the_application_its_priority_capped_at_the_clusters_maximum(yarn, tmp_path, capsys,
                                                                                        monkeypatch):
    """skein's spec has no priority: `dbn submit --priority N` has the ResourceManager set it just
    after submitting (Hadoop's `yarn application -updatePriority`), and says what YARN gave."""
    import os
    import sys

    from iterreduce.launch.yarn.client import set_priority

    monkeypatch.setenv("PATH", f"{yarn.hadoop.bin_dir}{os.pathsep}{os.environ['PATH']}")
    path = job_file(tmp_path, yarn.hadoop.uri("/user/test/priority"), workers=1, epochs=200,
                    extra=f'python = "{sys.executable}"\nqueue = "batch"')
    assert main(["submit", path, "--priority", "50"]) == 0
    out, err = capsys.readouterr()
    app_id = out.strip().splitlines()[-1]
    try:
        assert f"{app_id} has priority 10 in queue 'batch' (asked 50: the cluster's maximum)" in err, err

        def priority() -> str:
            status = yarn.hadoop.run("yarn", "application", "-status", app_id).stdout
            return next(line.split(":", 1)[1].strip() for line in status.splitlines() if "Priority" in line)

        assert priority() == "10"
        assert set_priority(app_id, 3) == 3 and priority() == "3"
    finally:
        assert main(["kill", app_id]) == 0
    assert main(["submit", path, "--priority", "-1", "--dry-run"]) == 2
    assert "[yarn] priority = -1: expected 0 (the queue's default) or more" in capsys.readouterr().err


def test_a_job_whose_queue_has_no_room_for_its_minimum_says_so_while_it_waits_and_fails_at_its_bound(
        yarn, tmp_path, capsys):
    """Issue 52 part 5, a queue at its limit: `small` holds the master and one worker, never a
    second. With [yarn] min_workers = 3, `dbn status` says what the job waits for while it waits,
    and at [yarn] start_timeout the job ends FAILED with one line naming the queue and the count;
    with min_workers = 1 the same job starts on the one worker it got and succeeds."""
    import sys
    from urllib.parse import urlparse

    yarn_extra = f'python = "{sys.executable}"\nqueue = "small"\nstart_timeout = 30'
    path = job_file(tmp_path, yarn.hadoop.uri("/user/test/small"), workers=3, extra=yarn_extra + "\nmin_workers = 3")
    app_id = submit(capsys, path)
    deadline = time.monotonic() + 120
    while True:
        assert main(["status", app_id]) == 0
        said = capsys.readouterr().out
        if "containers pending" in said:
            break
        assert "FAILED" not in said and time.monotonic() < deadline, said
        time.sleep(1)
    assert "1 of 3 workers running; 2 containers pending in queue 'small': YARN has no room for them yet" in said, said
    report = yarn.wait(app_id, timeout=180)
    assert str(report.final_status) == "FAILED", report.diagnostics
    assert report.diagnostics.startswith("job failed: 1 of the 3 workers needed (of 3) registered within 30 s; "
                                         "2 worker containers pending in queue 'small': YARN has no room for them"), \
        report.diagnostics
    assert len(report.diagnostics.splitlines()) == 1

    output = yarn.hadoop.uri("/user/test/small-min1")
    path = job_file(tmp_path, output, workers=3, extra=yarn_extra + "\nmin_workers = 1")
    app_id = submit(capsys, path)
    report = yarn.wait(app_id, timeout=300)
    yarn.assert_succeeded(report, app_id)
    records = yarn.hdfs_json_lines(urlparse(output).path + "/log.jsonl")
    registered = [r["worker"] for r in records if r.get("event") == "worker_registered"]
    assert len(registered) == 1, registered  # the queue never had room for a second
