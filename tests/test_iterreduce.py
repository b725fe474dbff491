"""The IterativeReduce runtime in one process: a Master served on 127.0.0.1:0 with Worker objects
in threads (token checks, malformed and stray updates, hand-driven workers), the master's config and
entry point, its messages, streams and heartbeats. The reduce helpers and seeds are in
test_program_helpers.py, checkpoints in test_checkpoints.py."""

from __future__ import annotations

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest_runtime import (DELAY_ENV, SLOW_SOFTMAX, SOFTMAX, InProcessJob, blobs, events, load_npz, read_log,
                              records, simulate)
from iterreduce.master import checkpoint
from iterreduce.proto import iterreduce_pb2 as pb
from iterreduce.transport import wire
from iterreduce.transport.security import TOKEN_KEY, metadata, new_token
from shardio.shards import write_shards


@pytest.fixture
def jobs():
    """Every InProcessJob a test makes is closed (server stopped, threads joined) afterwards."""
    made = []
    yield made
    for job in made:
        job.close()


@pytest.fixture
def delay(monkeypatch):
    """SlowSoftmax workers in this process sleep this long per shard update."""
    def set_delay(seconds: float):
        monkeypatch.setenv("ITERREDUCE_TEST_STEP_DELAY", str(seconds))
    return set_delay


def make_job(jobs, tmp_path, n_shards=3, rows=300, **kwargs) -> InProcessJob:
    X, y = blobs(rows, d=6, k=3)
    uris = write_shards(X, y, str(tmp_path / "shards"), n_shards)
    job = InProcessJob(tmp_path / "out", uris, **kwargs)
    jobs.append(job)
    return job


def push(stub, token, worker_id, step, results, arrays, **kw):
    """Push an update the way a worker does: a header, then the tensors."""
    header = pb.UpdateHeader(worker_id=worker_id, step=step,
                             results=[pb.ShardResult(index=s, samples=n) for s, n in results])
    stream = [pb.UpdateChunk(header=header)] + [pb.UpdateChunk(tensors=[c]) for c in wire.encode(arrays)]
    return stub.PushUpdate(iter(stream), metadata=metadata(token), timeout=10, **kw)


# ------------------------------------------------------------ in-process jobs


@pytest.mark.parametrize("n_workers", [1, 3])
def test_in_process_job_equals_sequential_simulation(jobs, tmp_path, n_workers):
    """Minibatch softmax (seeds matter): the result is bit-identical to running every shard
    sequentially with the same seeds, whichever worker thread ran which shard."""
    config = {"n_classes": 3, "epochs": 4, "batch_size": 25, "local_steps": 2, "learning_rate": 0.3}
    job = make_job(jobs, tmp_path, workers=n_workers, program_config=config, seed=7)
    for i in range(n_workers):
        job.add_worker(f"worker-{i}")
    job.start().wait()
    result = load_npz(tmp_path / "out" / "parameters.npz")
    expected = simulate(SOFTMAX, config, job.config.shards, seed=7)
    assert sorted(result) == ["bias", "weights"]
    for k in result:
        assert result[k].dtype == np.float32
        assert np.array_equal(result[k], expected[k]), k
    recs = records(tmp_path / "out")
    assert [r["step"] for r in recs] == [0, 1, 2, 3]
    assert all(r["samples"] == 300 and r["shards"] == 3 for r in recs)
    assert recs[-1]["train_error"] < 0.2
    registered = events(tmp_path / "out", "worker_registered")
    assert len(registered) == n_workers
    assert events(tmp_path / "out", "done")


def test_wrong_or_missing_token_is_refused_and_the_job_still_completes(jobs, tmp_path, delay):
    delay(0.03)
    job = make_job(jobs, tmp_path, workers=1, program=SLOW_SOFTMAX,
                   program_config={"n_classes": 3, "epochs": 8})
    stub = job.stub()
    bad_metadata = [metadata("wrong-token"), (), ((TOKEN_KEY, ""),), ((TOKEN_KEY, job.token + "x"),),
                    (("authorization", job.token),)]

    def assert_refused(call):
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, info.value
        assert "token" in info.value.details()

    def try_everything(md):
        assert_refused(lambda: stub.Register(pb.RegisterRequest(worker_name="intruder"), metadata=md, timeout=5))
        assert_refused(lambda: stub.Heartbeat(pb.HeartbeatRequest(worker_id="worker-0#1"), metadata=md, timeout=5))
        assert_refused(lambda: list(stub.FetchTask(pb.TaskRequest(worker_id="worker-0#1"), metadata=md, timeout=5)))
        header = pb.UpdateChunk(header=pb.UpdateHeader(worker_id="worker-0#1", step=0))
        assert_refused(lambda: stub.PushUpdate(iter([header]), metadata=md, timeout=5))
        assert_refused(lambda: stub.Sync(pb.SyncRequest(update=header, next=pb.TaskRequest(worker_id="worker-0#1")),
                                         metadata=md, timeout=5))
        assert_refused(lambda: next(stub.Steps(iter([pb.SyncRequest(update=header)]), metadata=md, timeout=5)))

    for md in bad_metadata:  # before any worker exists
        try_everything(md)
    job.add_worker("worker-0")
    job.start()
    job.wait_for(lambda: job.master.current >= 1, what="step 1")
    for md in bad_metadata:  # while the good worker is working
        try_everything(md)
    job.wait()
    with job.master.lock:
        assert "intruder" not in job.master.members.names
        assert [w.name for w in job.master.members.workers.values()] == ["worker-0"]
    assert [e["worker"] for e in events(tmp_path / "out", "worker_registered")] == ["worker-0#1"]
    assert [r["step"] for r in records(tmp_path / "out")] == list(range(8))
    assert (tmp_path / "out" / "parameters.npz").exists()


def test_malformed_updates_are_rejected_and_the_job_still_completes(jobs, tmp_path, delay):
    delay(0.03)
    config = {"n_classes": 3, "epochs": 6}
    job = make_job(jobs, tmp_path, workers=2, program=SLOW_SOFTMAX, program_config=config)
    stub = job.stub()
    job.add_worker("worker-0")
    job.add_worker("worker-1")
    job.start()
    job.wait_for(lambda: job.master.current >= 1, what="step 1")
    worker_id = sorted(job.master.members.workers)[0]
    header = pb.UpdateChunk(header=pb.UpdateHeader(worker_id=worker_id, step=job.master.current,
                                                   results=[pb.ShardResult(index=0, samples=100)]))
    good = list(wire.encode({"0/weights": np.zeros((6, 3), np.float32), "0/bias": np.zeros(3, np.float32)}))
    f32 = "float32"
    malformed = {
        "empty stream": [],
        "no header": [pb.UpdateChunk(tensors=[c]) for c in good],
        "two headers": [header, header],
        "bad chunk beside the header": [pb.UpdateChunk(header=header.header, tensors=[
            pb.TensorChunk(name="0/bias", dtype=f32, shape=[3], data=b"\0" * 16, last=True)])],
        "header beside chunks": [pb.UpdateChunk(tensors=good[:1]), header],
        "chunk without header": [header, pb.UpdateChunk(tensors=[pb.TensorChunk(name="0/bias", offset=4, data=b"\0" * 4, last=True)])],
        "bad offset": [header, pb.UpdateChunk(tensors=[pb.TensorChunk(name="0/weights", dtype=f32, shape=[6, 3], offset=0, data=b"\0" * 8)]),
                       pb.UpdateChunk(tensors=[pb.TensorChunk(name="0/weights", offset=16, data=b"\0" * 64, last=True)])],
        "too many bytes": [header, pb.UpdateChunk(tensors=[pb.TensorChunk(name="0/bias", dtype=f32, shape=[3], data=b"\0" * 16, last=True)])],
        "truncated": [header, pb.UpdateChunk(tensors=[pb.TensorChunk(name="0/bias", dtype=f32, shape=[3], data=b"\0" * 8, last=False)])],
        "bad dtype": [header, pb.UpdateChunk(tensors=[pb.TensorChunk(name="0/bias", dtype="object", shape=[3], data=b"\0" * 24, last=True)])],
        "absurd shape": [header, pb.UpdateChunk(tensors=[pb.TensorChunk(name="0/bias", dtype=f32, shape=[1 << 30, 1 << 30], last=False)])],
    }
    for what, stream in malformed.items():
        with pytest.raises(grpc.RpcError) as info:
            stub.PushUpdate(iter(stream), metadata=metadata(job.token), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, info.value)
    one_message = [stream[0] for stream in malformed.values() if len(stream) == 1]
    one_message.append(pb.UpdateChunk())  # no header at all
    for stream in (malformed["truncated"], malformed["bad dtype"], malformed["absurd shape"]):  # packed
        one_message.append(pb.UpdateChunk(header=stream[0].header, tensors=stream[1].tensors))
    assert len(one_message) == 5
    for message in one_message:  # the same push in one call with its next task: refused alike, nothing given out
        with pytest.raises(grpc.RpcError) as info:
            stub.Sync(pb.SyncRequest(update=message, next=pb.TaskRequest(worker_id=worker_id)),
                      metadata=metadata(job.token), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (message, info.value)
    job.wait()
    # Nothing malformed was counted: the result is the undisturbed one, bit for bit.
    result = load_npz(tmp_path / "out" / "parameters.npz")
    expected = simulate(SOFTMAX, config, job.config.shards)
    for k in expected:
        assert np.array_equal(result[k], expected[k]), k
    assert all(r["shards"] == 3 for r in records(tmp_path / "out"))


def fetch(stub, token, worker_id, versions=None):
    request = pb.TaskRequest(worker_id=worker_id, versions=versions or {})
    messages = list(stub.FetchTask(request, metadata=metadata(token), timeout=10))
    assert messages[0].HasField("header") and not any(m.HasField("header") for m in messages[1:])
    return messages[0].header, wire.decode(c for m in messages for c in m.tensors)


def start_with_fake_worker(jobs, tmp_path, epochs=3, versions=None):
    """A job of 2 shards for 2 workers: a hand-driven "fake" (registered first: it owns shard 0)
    and a real Worker thread (shard 1). The fake fetches step 0's task and holds it."""
    job = make_job(jobs, tmp_path, n_shards=2, rows=200, workers=2, heartbeat_timeout=2.0,
                   program_config={"n_classes": 3, "epochs": epochs})
    stub = job.stub()
    fake = stub.Register(pb.RegisterRequest(worker_name="fake"), metadata=metadata(job.token), timeout=5).worker_id
    job.add_worker("real")
    job.start()
    job.wait_for(lambda: job.master.current == 0, what="step 0")
    header, params = fetch(stub, job.token, fake, versions)
    assert header.kind == pb.TaskHeader.RUN and header.step == 0
    assert [s.index for s in header.shards] == [0]
    if versions is None:  # a new worker gets every array, at version 0
        assert sorted(params) == ["bias", "weights"] and dict(header.versions) == {"bias": 0, "weights": 0}
    else:  # one that holds them already gets none
        assert params == {} and dict(header.versions) == {}
    return job, stub, fake, params


def test_stray_updates_are_not_accepted(jobs, tmp_path):
    job, stub, fake, params = start_with_fake_worker(jobs, tmp_path)
    token = job.token
    arrays0 = {f"0/{k}": v for k, v in params.items()}
    arrays1 = {f"1/{k}": v for k, v in params.items()}

    reply = push(stub, token, fake, 5, [(0, 100)], arrays0)
    assert not reply.accepted and "update for step 5, current is 0" in reply.reason
    reply = push(stub, token, fake, -1, [(0, 100)], arrays0)
    assert not reply.accepted and "current is 0" in reply.reason
    reply = push(stub, token, fake, 0, [(1, 100)], arrays1)  # shard 1 belongs to the real worker
    assert not reply.accepted and "shard 1 was not given to it" in reply.reason
    reply = push(stub, token, fake, 0, [(0, 100), (1, 100)], {**arrays0, **arrays1})
    assert not reply.accepted and "shard 1 was not given to it" in reply.reason
    reply = push(stub, token, "nobody#99", 0, [(0, 100)], arrays0)
    assert not reply.accepted and "unknown or dropped worker nobody#99" in reply.reason
    with pytest.raises(grpc.RpcError) as info:  # an update that lacks a trained array
        push(stub, token, fake, 0, [(0, 100)], {"0/weights": params["weights"]})
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "lacks ['bias']" in info.value.details()
    with job.master.lock:
        assert 0 not in job.master.rounds.results  # none of it counted
        assert job.master.rounds.in_flight.get(0) == fake  # shard 0 is still the fake's to compute

    # The fake goes silent: it is dropped after the heartbeat timeout, step 0 completes without
    # shard 0, which moves to the real worker; the job completes.
    job.wait(timeout=30)
    lost = events(tmp_path / "out", "worker_lost")
    assert [e["worker"] for e in lost] == [fake] and lost[0]["shards_skipped"] == [0]
    recs = records(tmp_path / "out")
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert recs[0]["shards"] == 1 and recs[0]["samples"] == 100
    assert [r["samples"] for r in recs[1:]] == [200, 200]
    with pytest.raises(grpc.RpcError) as info:  # a dropped worker is told to register again
        fetch(stub, token, fake)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_hand_driven_worker_update_is_accepted_once(jobs, tmp_path):
    # The fake claims to hold the current parameters already, so the master sends none.
    job, stub, fake, _ = start_with_fake_worker(jobs, tmp_path, epochs=1, versions={"weights": 0, "bias": 0})
    arrays = {"0/weights": np.zeros((6, 3), np.float32), "0/bias": np.ones(3, np.float32)}
    assert push(stub, job.token, fake, 0, [(0, 100)], arrays).accepted
    reply = push(stub, job.token, fake, 0, [(0, 100)], arrays)  # the same update again
    assert not reply.accepted and "not given to it" in reply.reason
    job.wait(timeout=30)
    # One step, two shards of 100 rows: the mean of the fake's (zeros, ones) and the real worker's update.
    result = load_npz(tmp_path / "out" / "parameters.npz")
    recs = records(tmp_path / "out")
    assert recs[0]["shards"] == 2 and recs[0]["samples"] == 200
    real = simulate(SOFTMAX, {"n_classes": 3, "epochs": 1}, job.config.shards[1:])  # shard 1 alone...
    # ...but from the job's initial parameters, which depend on the seed only, not on the shards.
    np.testing.assert_allclose(result["weights"], 0.5 * real["weights"], rtol=1e-6)
    np.testing.assert_allclose(result["bias"], 0.5 * real["bias"] + 0.5, rtol=1e-6)


def test_wrongly_shaped_update_is_rejected(jobs, tmp_path):
    job, stub, fake, params = start_with_fake_worker(jobs, tmp_path, epochs=1)
    arrays = {"0/weights": np.zeros((params["weights"].shape[0], 1), np.float32), "0/bias": np.zeros(1, np.float32)}
    try:
        reply = push(stub, job.token, fake, 0, [(0, 100)], arrays)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    else:
        assert not reply.accepted


def test_the_listeners_see_every_record_and_a_link_found_after_the_last_step(jobs, tmp_path):
    """A listener (YARN's reporter) is told each record as the log holds it, events too, so a link
    the program comes to know after the last step still reaches it (it waited for a next step)."""
    from conftest_runtime import LateLinkSoftmax

    job = make_job(jobs, tmp_path, workers=1, program="conftest_runtime:LateLinkSoftmax",
                   program_config={"n_classes": 3, "epochs": 2})
    heard = []
    job.master.listeners.append(heard.append)
    job.add_worker("worker-0")
    job.start().wait()
    logged = read_log(tmp_path / "out")
    assert heard == logged[len(logged) - len(heard):]  # the records since it listened, in the log's order
    steps = [r for r in heard if "step" in r]
    links = [r for r in heard if r.get("event") == "links"]
    assert steps and links == [r for r in logged if r.get("event") == "links"]
    assert [r["links"] for r in links] == [LateLinkSoftmax.LINK] and heard.index(links[0]) > heard.index(steps[-1])


def test_softmax_job_on_list_typed_shards(jobs, tmp_path):
    X, y = blobs(60, d=4, k=3)
    uri = str(tmp_path / "list.parquet")
    pq.write_table(pa.table({"features": pa.array(list(X), type=pa.list_(pa.float32())), "label": pa.array(y)}), uri)
    job = InProcessJob(tmp_path / "out", [uri], workers=1, program_config={"n_classes": 3, "epochs": 2})
    jobs.append(job)
    job.add_worker("worker-0")
    job.start().wait(timeout=30)
    assert (tmp_path / "out" / "parameters.npz").exists()


def test_master_refuses_a_checkpoint_of_another_job(jobs, tmp_path):
    job = make_job(jobs, tmp_path, workers=1, program_config={"n_classes": 3, "epochs": 2},
                   checkpoint_dir=str(tmp_path / "ckpt"), resume=True)
    checkpoint.save(str(tmp_path / "ckpt"), 1, {"n_steps": 5, "seed": 0}, {"weights": np.zeros((6, 3), np.float32)})
    job.start()
    job.master_thread.join(10)
    exc = job.results["master"]
    assert type(exc).__name__ == "JobFailed" and "checkpoint is of another job" in str(exc)


def test_overflowing_tensor_shape_in_an_update_is_invalid_argument(jobs, tmp_path):
    job = make_job(jobs, tmp_path, workers=1)
    header = pb.UpdateChunk(header=pb.UpdateHeader(worker_id="w#1", step=0))
    bad = pb.UpdateChunk(tensors=[pb.TensorChunk(name="0/bias", dtype="float32", shape=[1 << 32, 1 << 32], last=True)])
    with pytest.raises(grpc.RpcError) as info:
        job.stub().PushUpdate(iter([header, bad]), metadata=metadata(job.token), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value


def test_float16_wire_job_is_close_to_the_full_precision_one(jobs, tmp_path):
    config = {"n_classes": 3, "epochs": 4}
    job = make_job(jobs, tmp_path, workers=3, program_config=config, float16_wire=True)
    for i in range(3):
        job.add_worker(f"worker-{i}")
    job.start().wait()
    assert all(w.float16 for w in job.worker_objects)
    result = load_npz(tmp_path / "out" / "parameters.npz")
    expected = simulate(SOFTMAX, config, job.config.shards)
    for k in expected:
        assert result[k].dtype == np.float32
        np.testing.assert_allclose(result[k], expected[k], rtol=1e-2, atol=2e-3)
    assert not np.array_equal(result["weights"], expected["weights"])  # it did travel as float16


def test_resume_refuses_a_checkpoint_of_another_program_config(jobs, tmp_path):
    X, y = blobs(90, d=4, k=3)
    uris = write_shards(X, y, str(tmp_path / "shards"), 1)
    ckpt = str(tmp_path / "ckpt")
    first = InProcessJob(tmp_path / "a", uris, workers=1, checkpoint_dir=ckpt,
                         program_config={"n_classes": 3, "epochs": 2, "learning_rate": 0.5})
    jobs.append(first)
    first.add_worker("w")
    first.start().wait()
    second = InProcessJob(tmp_path / "b", uris, workers=1, checkpoint_dir=ckpt, resume=True, start_timeout=0.5,
                          program_config={"n_classes": 3, "epochs": 2, "learning_rate": 0.001})
    jobs.append(second)
    second.start()
    second.master_thread.join(15)
    assert "another job" in str(second.results.get("master"))


def test_a_stalled_master_does_not_drop_its_workers(tmp_path):
    """Silence caused by the master's own stall (VM pause, SIGSTOP) is forgiven; real silence is not."""
    import time

    from iterreduce.master import Master, MasterConfig

    X, y = blobs(60, d=4, k=3)
    uris = write_shards(X, y, str(tmp_path / "shards"), 2)
    master = Master(MasterConfig(program=SOFTMAX, program_config={"n_classes": 3}, shards=uris, workers=2,
                                 token="t", output=str(tmp_path / "out"), heartbeat_timeout=2.0))
    ids = [master.service.Register(pb.RegisterRequest(worker_name=f"w{i}", pid=i), None).worker_id for i in range(2)]
    for worker_id in ids:
        master.members.workers[worker_id].last_seen = time.monotonic() - 60
    with master.lock:  # as the monitor thread calls it
        master._check_heartbeats(since_last_check=60.0)  # the monitor itself slept for a minute
    assert all(master.members.workers[w].alive for w in ids)
    master.members.workers[ids[0]].last_seen = time.monotonic() - 60
    with master.lock:
        master._check_heartbeats(since_last_check=0.5)  # the master ran; w0 really went silent
    assert not master.members.workers[ids[0]].alive and master.members.workers[ids[1]].alive
    assert master.members.owner[0] == master.members.owner[1] == ids[1]  # its shard moved to the live worker


# ------------------------------------------------------------- master config and entry point


def test_master_config_round_trips_and_refuses_unknown_or_missing_keys():
    from iterreduce.master import MasterConfig

    config = MasterConfig(program=SOFTMAX, program_config={"n_classes": 3}, shards=["a.parquet"], workers=2,
                          token="t", output="out", heartbeat_timeout=3.0)
    assert MasterConfig.from_dict(config.to_dict()) == config
    assert config.to_dict()["heartbeat_timeout"] == 3.0
    with pytest.raises(ValueError, match=r"^job file: unknown key 'foo'$"):
        MasterConfig.from_dict({**config.to_dict(), "foo": 1})
    with pytest.raises(ValueError, match=r"^job\.json: unknown keys 'heartbeat', 'zz'$"):
        MasterConfig.from_dict({**config.to_dict(), "zz": 1, "heartbeat": 2}, source="job.json")
    fields = config.to_dict()
    del fields["token"], fields["workers"]
    with pytest.raises(ValueError, match=r"job file: missing keys 'token', 'workers'"):
        MasterConfig.from_dict(fields)
    with pytest.raises(ValueError, match=r"expected a JSON object"):
        MasterConfig.from_dict([1, 2])


def test_master_main_reports_an_unknown_job_key(tmp_path, caplog):
    import json

    from iterreduce.master import main

    job = tmp_path / "job.json"
    job.write_text(json.dumps({"program": SOFTMAX, "program_config": {}, "shards": [], "workers": 1,
                               "output": str(tmp_path / "out"), "worker": 1}))
    assert main([str(job)]) == 1
    assert f"{job}: unknown key 'worker'" in caplog.text
    assert not (tmp_path / "out").exists()  # failed before doing anything


def test_serve_and_run_announces_the_address_runs_and_stops_the_server(tmp_path):
    import threading

    from iterreduce.master import Master, MasterConfig
    from iterreduce.proto import iterreduce_pb2_grpc as pb_grpc
    from iterreduce.worker import Worker

    X, y = blobs(60, d=4, k=3)
    uris = write_shards(X, y, str(tmp_path / "shards"), 2)
    token = new_token()  # a service takes no empty or short token
    master = Master(MasterConfig(program=SOFTMAX, program_config={"n_classes": 3, "epochs": 2}, shards=uris,
                                 workers=1, token=token, output=str(tmp_path / "out"), heartbeat_interval=0.2))
    announced, exits, threads = [], [], []

    def on_serving(address):  # as a launcher publishes the address, then workers dial it
        announced.append(address)
        worker = Worker(address, token, "worker-0")
        threads.append(threading.Thread(target=lambda: exits.append(worker.run()), daemon=True))
        threads[0].start()

    try:
        master.serve_and_run(on_serving=on_serving)
    finally:
        master._log.close()
    threads[0].join(15)
    assert exits == [0]  # the worker fetched DONE before the server stopped
    assert [r["step"] for r in records(tmp_path / "out")] == [0, 1] and events(tmp_path / "out", "done")
    with grpc.insecure_channel(announced[0]) as channel, pytest.raises(grpc.RpcError) as err:
        pb_grpc.MasterStub(channel).Heartbeat(pb.HeartbeatRequest(worker_id="x"), metadata=metadata("t"), timeout=2)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_small_tasks_and_pushes_are_one_message_each_and_one_call_a_step(jobs, tmp_path, monkeypatch):
    # A message, and more so a call, costs both sides a trip through gRPC's queues whatever its
    # size: a task or an update of small arrays travels in one message, header and chunks together,
    # and a worker's push brings back its next task in the same call (Sync).
    from iterreduce.master.service import MasterService

    pushed, synced, fetched = [], [], []
    push_update, sync, fetch_task = MasterService.PushUpdate, MasterService.Sync, MasterService.FetchTask

    def counting_push(self, request_iterator, context):
        call = []
        pushed.append(call)

        def counted():
            for message in request_iterator:
                call.append(len(message.tensors))
                yield message
        return push_update(self, counted(), context)

    def counting_sync(self, request, context):
        reply = sync(self, request, context)
        synced.append((request.update.header.worker_id, len(request.update.tensors), reply.fetch,
                       reply.task.header.kind))
        return reply

    def counting_fetch(self, request, context):
        fetched.append(request.worker_id)
        yield from fetch_task(self, request, context)

    monkeypatch.setattr(MasterService, "PushUpdate", counting_push)
    monkeypatch.setattr(MasterService, "Sync", counting_sync)
    monkeypatch.setattr(MasterService, "FetchTask", counting_fetch)
    job = make_job(jobs, tmp_path, n_shards=2, rows=200, workers=2, program_config={"n_classes": 3, "epochs": 3})
    stub = job.stub()
    fake = stub.Register(pb.RegisterRequest(worker_name="fake"), metadata=metadata(job.token), timeout=5).worker_id
    job.add_worker("real")
    job.start()
    job.wait_for(lambda: job.master.current == 0, what="step 0")
    messages = list(stub.FetchTask(pb.TaskRequest(worker_id=fake), metadata=metadata(job.token), timeout=10))
    assert len(messages) == 1 and messages[0].header.step == 0 and len(messages[0].tensors) == 2
    params = wire.decode(messages[0].tensors)
    reply = push(stub, job.token, fake, 0, [(0, 100)], {f"0/{k}": v for k, v in params.items()})
    assert reply.accepted
    job.wait()
    assert pushed == [[0, 1, 1]]  # push() sends the header, then a chunk a message; the real worker never streams
    real = [s for s in synced if s[0] != fake]
    assert len(real) >= 3 and all(n in (2, 4) and not fetch for _, n, fetch, _ in real), real
    # Its tasks came back with its pushes: it fetched only its first, and after waiting (WAIT), if ever.
    waits = sum(kind == pb.TaskHeader.WAIT for *_, kind in real)
    assert fetched.count(fake) == 1 and len([w for w in fetched if w != fake]) == 1 + waits


def test_a_worker_syncs_on_one_stream_which_ends_when_the_master_drops_it(jobs, tmp_path, monkeypatch):
    # A call costs the master about twice a message on an open stream: a worker keeps one stream
    # (Steps) for all its syncs. Dropped, its next sync ends that stream (NOT_FOUND), and the
    # process registers again as a new worker.
    from iterreduce.master.service import MasterService

    streams = []  # [worker id, requests carried, ended] of each stream
    steps = MasterService.Steps

    def counting(self, request_iterator, context):
        stream = [None, 0, False]
        streams.append(stream)

        def noted():
            for request in request_iterator:
                stream[0] = stream[0] or request.update.header.worker_id
                stream[1] += 1
                yield request
        try:
            yield from steps(self, noted(), context)
        finally:
            stream[2] = True

    monkeypatch.setattr(MasterService, "Steps", counting)
    monkeypatch.setenv(DELAY_ENV, "0.02")  # steps long enough for the drop to land mid-job
    job = make_job(jobs, tmp_path, n_shards=2, rows=200, workers=2, program=SLOW_SOFTMAX,
                   program_config={"n_classes": 3, "epochs": 12})
    job.add_worker("a")
    job.add_worker("b")
    job.start()
    job.wait_for(lambda: job.master.current >= 3, what="step 3")
    with job.master.lock:
        (victim,) = [w for w in job.master.members.workers.values() if w.name == "a" and w.alive]
        job.master.drop(victim, "dropped by the test")
    job.wait(timeout=60)
    assert [r["step"] for r in records(tmp_path / "out")] == list(range(12))
    by_worker = {worker: (n, ended) for worker, n, ended in streams if worker}
    assert len(by_worker) == len([s for s in streams if s[0]]), streams  # one stream a process incarnation
    assert by_worker[victim.worker_id][0] >= 3 and by_worker[victim.worker_id][1]  # its syncs, then the end
    (b,) = [w for w in by_worker if w.startswith("b#")]
    assert by_worker[b][0] >= 12  # every step's push on the one stream
    assert any(e["worker"].startswith("a#") and e["worker"] != victim.worker_id
               for e in events(tmp_path / "out", "worker_registered"))  # the dropped process came back


@pytest.mark.parametrize("workers, expected", [
    (1, (1.0, 10.0)), (100, (1.0, 10.0)),   # 100 heartbeats a second at most: as configured
    (200, (2.0, 10.0)),                     # the interval stretches; 3 missed beats are still inside 10 s
    (1000, (10.0, 30.0)),                   # ... and past that the timeout is 3 intervals
])
def test_heartbeats_to_the_master_are_bounded_whatever_the_workers(workers, expected):
    from iterreduce.master.master import HEARTBEATS_PER_S, heartbeat_timing

    interval, timeout = heartbeat_timing(1.0, 10.0, workers)
    assert (interval, timeout) == expected
    assert workers / interval <= HEARTBEATS_PER_S
    assert heartbeat_timing(0.2, 2.0, 3) == (0.2, 2.0)  # the tests' fast beats are kept


def test_a_master_of_many_workers_hands_out_the_stretched_interval(jobs, tmp_path):
    job = make_job(jobs, tmp_path, n_shards=2, workers=400, heartbeat_interval=1.0, heartbeat_timeout=10.0)
    reply = job.stub().Register(pb.RegisterRequest(worker_name="w-0"), metadata=metadata(job.token), timeout=5)
    assert reply.heartbeat_interval_s == 4.0 and job.master.heartbeat_timeout == 12.0
    (event,) = events(tmp_path / "out", "heartbeat")
    assert (event["interval"], event["timeout"]) == (4.0, 12.0)


def test_a_task_for_sync_is_one_message_however_packing_groups(jobs, tmp_path, monkeypatch):
    # Sync's reply holds one TaskChunk: the tensors are within its limit, but the header comes on
    # top, so a task near the limit would pack into two messages. It must come whole in one.
    from iterreduce.master.service import wire as master_wire

    job = make_job(jobs, tmp_path, n_shards=2, rows=200, workers=1, program_config={"n_classes": 3, "epochs": 2})
    stub = job.stub()
    worker = stub.Register(pb.RegisterRequest(worker_name="w"), metadata=metadata(job.token), timeout=5).worker_id
    job.start()
    job.wait_for(lambda: job.master.current == 0, what="step 0")
    monkeypatch.setattr(master_wire, "packed", lambda items, size, limit=0: ([item] for item in items))  # one a message
    context = type("Context", (), {"is_active": lambda self: True,
                                   "abort": lambda self, code, why: pytest.fail(why)})()
    with job.master.lock:
        nbytes = sum(a.nbytes for a in job.master.parameters.values())
    assert job.master.service._task(pb.TaskRequest(worker_id=worker), context, limit=nbytes - 1) is None  # past it...
    messages = job.master.service._task(pb.TaskRequest(worker_id=worker), context, limit=nbytes)  # ...nothing given out
    assert len(messages) == 1
    task = pb.TaskChunk.FromString(messages[0])
    assert task.header.step == 0 and sorted(wire.decode(task.tensors)) == ["bias", "weights"]


@pytest.mark.parametrize("seconds, beats", [(0.1, "few"), (0.9, "many")])
def test_a_worker_beats_only_when_the_master_has_not_heard_from_it(jobs, tmp_path, monkeypatch, delay, seconds, beats):
    # Its pushes and fetches tell the master it lives: syncing every 0.1 s at a 0.2 s interval it
    # sends (almost) no heartbeat (it would send about 20 in the 2 s); computing for 0.9 s a step,
    # two or more a step (about four: at 0.6 s, exactly two fit, and a late wake-up on a busy
    # machine lost one now and then).
    from iterreduce.master.service import MasterService

    heard = []
    heartbeat = MasterService.Heartbeat
    monkeypatch.setattr(MasterService, "Heartbeat", lambda self, request, context: heard.append(request.worker_id)
                        or heartbeat(self, request, context))
    delay(seconds)
    job = make_job(jobs, tmp_path, n_shards=2, workers=2, program=SLOW_SOFTMAX, heartbeat_interval=0.2,
                   heartbeat_timeout=2.0, program_config={"n_classes": 3, "epochs": 5 if beats == "many" else 20})
    job.add_worker("worker-0")
    job.add_worker("worker-1")
    job.start().wait()
    steps = len(records(tmp_path / "out"))
    if beats == "few":
        assert steps == 20 and len(heard) <= 8, heard  # a beat or two a worker, while the job starts
    else:
        assert steps == 5 and len(heard) >= 2 * 2 * 5, heard
    assert not events(tmp_path / "out", "worker_lost")


def softmax_config(tmp_path, epochs=2, **values):
    from iterreduce.master import MasterConfig

    X, y = blobs(60, d=4, k=3)
    uris = write_shards(X, y, str(tmp_path / "shards"), 2)
    return MasterConfig(program=SOFTMAX, program_config={"n_classes": 3, "epochs": epochs}, shards=uris, workers=1,
                        token=new_token(), output=str(tmp_path / "out"), **values)


def test_the_master_refuses_a_schedule_longer_than_it_holds(tmp_path, monkeypatch):
    """Whatever a program's schedule (`finetune_epochs = 10**21` grew the master to 3.3 GB): the
    master takes at most MAX_STEPS steps from it, lazily, and refuses a longer one."""
    import iterreduce.master.master as master_module

    monkeypatch.setattr(master_module, "MAX_STEPS", 5)
    with pytest.raises(master_module.JobFailed, match="more than 5 steps"):
        master_module.Master(softmax_config(tmp_path, epochs=10**12))


@pytest.mark.parametrize("name", ["heartbeat_interval", "heartbeat_timeout", "start_timeout"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_the_masters_waits_are_finite_positive_seconds(tmp_path, name, bad):
    with pytest.raises(ValueError, match=f"{name} = .*: expected a finite number of seconds above 0"):
        softmax_config(tmp_path, **{name: bad})


@pytest.mark.parametrize("fields, why", [
    ({"worker_name": "worker-" + "9" * 5000}, "worker_name"),  # failed the running job (int's digit limit)
    ({"worker_name": "../x"}, "worker_name"), ({"worker_name": "a b"}, "worker_name"),
    ({"worker_name": "w", "host": "h" * 5000}, "host"), ({"worker_name": "w", "peer_address": "p" * 5000}, "peer_address"),
])
def test_a_registration_no_worker_sends_is_invalid_and_changes_nothing(jobs, tmp_path, fields, why):
    """Issue 64, class 3: a worker's messages are input too."""
    job = make_job(jobs, tmp_path, n_shards=2, rows=100, workers=1)
    stub = job.stub()
    with pytest.raises(grpc.RpcError) as info:
        stub.Register(pb.RegisterRequest(**fields), metadata=metadata(job.token), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in info.value.details()
    with job.master.lock:
        assert job.master.members.workers == {} and job.master.members.names == []
    job.add_worker("w0")  # the job goes on
    job.start()
    job.wait(timeout=60)


@pytest.mark.parametrize("status", ["[]", "[1, 2]", "1", "not json", "{" * 100, '{"a": "' + "x" * 70000 + '"}'])
def test_a_heartbeat_whose_status_is_not_an_object_is_invalid_and_the_live_state_still_answers(jobs, tmp_path,
                                                                                               status):
    """`status_json = "[]"` made the live page's /api/state answer 500."""
    job = make_job(jobs, tmp_path, n_shards=2, rows=100, workers=1)
    stub = job.stub()
    worker = stub.Register(pb.RegisterRequest(worker_name="w"), metadata=metadata(job.token), timeout=5).worker_id
    with pytest.raises(grpc.RpcError) as info:
        stub.Heartbeat(pb.HeartbeatRequest(worker_id=worker, status_json=status), metadata=metadata(job.token),
                       timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with job.master.lock:
        assert isinstance(job.master.members.workers[worker].status, dict)
