"""Elastic by choice (issue 52, part 4): a running job's master takes a new number of workers.

Fewer: the workers no longer wanted give their shards up at the next step's start and retire (told
DONE, they exit 0: nothing is lost, nothing skipped). More: the launcher starts them and they take
their home shards at the next step's start. A shard's update depends only on the step's parameters,
the shard and its seed, and the reduce sums in shard order, so the model is bit-identical to the
undisturbed run's (:func:`conftest_runtime.simulate`). The master and its workers run in this
process here, as in test_iterreduce; on YARN the keeper starts and stops the containers
(test_keeper, and test_shared on a real cluster).
"""

from __future__ import annotations

import threading
import time

import pytest

from conftest_runtime import DELAY_ENV, SLOW_SOFTMAX, SOFTMAX, assert_same_bits, blobs, events, load_npz, records, \
    simulate
from iterreduce.master import Master, MasterConfig
from iterreduce.master.membership import Membership
from iterreduce.transport.security import new_token
from iterreduce.worker import Worker
from shardio.shards import write_shards

CONFIG = {"n_classes": 3, "epochs": 14, "batch_size": 0, "local_steps": 1, "learning_rate": 0.5}


def wait_for(condition, timeout=60.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def changing_job(tmp_path, monkeypatch, change, seed=4):
    """A 3-worker job on 6 shards, master and workers in this process, while ``change(master, start,
    exits)`` runs beside it (what a launcher and `dbn scale` or the drainer do): ``start(name)`` starts
    a worker process of that name, ``exits`` holds each name's exit codes. Returns the output folder,
    the exits and the shards' URIs once the job and its workers ended."""
    monkeypatch.setenv(DELAY_ENV, "0.03")  # steps long enough to act between them
    X, y = blobs(900, d=8, k=3, seed=seed)
    uris = write_shards(X, y, str(tmp_path / "shards"), 6)
    token, out = new_token(), tmp_path / "out"
    master = Master(MasterConfig(program=SLOW_SOFTMAX, program_config=CONFIG, shards=uris, workers=3, token=token,
                                 output=str(out), heartbeat_interval=0.2, heartbeat_timeout=5.0, ui=False))
    exits: dict[str, list[int]] = {}
    threads: list[threading.Thread] = []
    errors: list[BaseException] = []

    def on_serving(address: str) -> None:
        def start(name: str) -> None:
            def run():
                exits.setdefault(name, []).append(Worker(address, token, name).run())
            threads.append(threading.Thread(target=run, name=name, daemon=True))
            threads[-1].start()

        def act():
            try:
                change(master, start, exits)
            except BaseException as exc:  # noqa: BLE001 - the test thread raises it
                errors.append(exc)

        for k in range(3):
            start(f"worker-{k}")
        threading.Thread(target=act, daemon=True).start()

    try:
        master.serve_and_run(on_serving=on_serving)
    finally:
        master._log.close()
    for thread in threads:
        thread.join(15)
    assert not errors, errors
    assert master.wanted_workers() == 0  # ended: a launcher asks for no container any more
    return out, exits, uris


def test_a_job_shrunk_to_one_worker_and_grown_back_gives_the_undisturbed_model(tmp_path, monkeypatch):
    def scale(master, start, exits):  # what a launcher and `dbn scale` do
        wait_for(lambda: master.current >= 3, what="step 3")
        master.resize(1)
        wait_for(lambda: exits.get("worker-1") == [0] and exits.get("worker-2") == [0], what="two retirements")
        shrunk_at = master.current
        wait_for(lambda: master.current >= shrunk_at + 3, what="three steps on one worker")
        master.resize(3)
        start("worker-1")
        start("worker-2")

    out, exits, uris = changing_job(tmp_path, monkeypatch, scale)
    assert exits == {"worker-0": [0], "worker-1": [0, 0], "worker-2": [0, 0]}
    assert [(e["workers"], e["was"]) for e in events(out, "resized")] == [(1, 3), (3, 1)]
    retired = events(out, "worker_retired")
    assert sorted(e["worker"].split("#")[0] for e in retired) == ["worker-1", "worker-2"]
    assert not events(out, "worker_lost")  # leaving is not being lost
    assert all(r["shards"] == 6 for r in records(out))  # no step went without a shard
    assert_same_bits(load_npz(out / "parameters.npz"), simulate(SOFTMAX, CONFIG, uris))


def test_resize_moves_the_shards_at_a_rounds_start_each_to_its_home_none_to_an_unwanted_worker():
    work = threading.Condition()
    members = Membership(4, 2, work=work, on_moved=lambda shard: None)
    with work:  # as the master calls it: with its lock held
        for name in ("worker-0", "worker-1"):
            members.register(name, "h", "", in_flight={})
        for bad in (0, 5):
            with pytest.raises(ValueError, match=f"workers = {bad}: expected 1 to 4"):
                members.resize(bad)
        members.resize(4)
        members.register("worker-3", "h", "", in_flight={})  # no worker-2 yet
        members.rebalance()
        # Each at its home; worker-2's shard stays with its wanted live holder until worker-2 comes.
        assert {w.name: sorted(w.shards) for w in members.live()} == {"worker-0": [0, 2], "worker-1": [1],
                                                                       "worker-3": [3]}
        members.resize(1)
        members.rebalance()
        assert {w.name: sorted(w.shards) for w in members.live()} == {"worker-0": [0, 1, 2, 3], "worker-1": [],
                                                                       "worker-3": []}
        assert [members.wanted(w) for w in members.live()] == [True, False, False]


def test_min_workers_starts_the_job_with_some_and_fails_it_without_them(tmp_path):
    X, y = blobs(60, d=4, k=3)
    uris = write_shards(X, y, str(tmp_path / "shards"), 3)
    common = dict(program=SOFTMAX, program_config={"n_classes": 3}, shards=uris, workers=3, token="t")
    with pytest.raises(ValueError, match=r"min_workers = 4: expected 0 to workers \(3\)"):
        MasterConfig(**common, output=str(tmp_path / "bad"), min_workers=4)
    from iterreduce.exceptions import JobFailed
    from iterreduce.proto import iterreduce_pb2 as pb

    master = Master(MasterConfig(**common, output=str(tmp_path / "two"), min_workers=2, start_timeout=0.5))
    master.service.Register(pb.RegisterRequest(worker_name="worker-0", pid=1), None)
    with pytest.raises(JobFailed, match=r"1 of the 2 workers needed \(of 3\) registered within 0.5 s"):
        master._wait_for_workers()
    master.service.Register(pb.RegisterRequest(worker_name="worker-2", pid=2), None)
    master._wait_for_workers()  # two of three: it starts, the third joins as it comes
    names = {w.worker_id: w.name for w in master.members.live()}
    assert {s: names[w] for s, w in master.members.owner.items()} == {0: "worker-0", 1: "worker-0", 2: "worker-2"}
    master._log.close()
