"""The reduce on the workers (``MasterConfig.reduce = "workers"``, iterreduce.transport.exchange): each
worker reduces its own rows, and the model is the master's reduce's, bit for bit; a failed
exchange runs the step again with the master reducing. Workers running ahead while the master ends
a step are in test_running_ahead.py, which uses this module's _run and fixtures."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest_runtime import (DBN_PROGRAM, SLOW_SOFTMAX, SOFTMAX, InProcessJob, assert_same_bits, blobs, events,
                              kill_worker, load_npz, records, run_job, simulate, subprocess_env)
from iterreduce.master import MasterConfig
from iterreduce.master.service import MasterService
from iterreduce.program import Update, block_momentum_average, weighted_average
from iterreduce.transport import exchange
from softmax_program import SoftmaxRegression
from iterreduce.proto import iterreduce_pb2 as pb
from iterreduce.worker import Worker
from shardio.readers import list_shards
from shardio.shards import write_shards

PARTS = [1, 2, 3, 7, 64]


# ------------------------------------------------------------------ cutting rows


@pytest.mark.parametrize("rows", [0, 1, 5, 500])
@pytest.mark.parametrize("parts", PARTS)
def test_parts_cover_every_row_once_and_join_back(rows, parts):
    array = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    bias = np.arange(rows, dtype=np.float64)
    pieces = [exchange.rows_of({"w": array, "b": bias}, parts, j) for j in range(parts)]
    sizes = [p["w"].shape[0] for p in pieces]
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1
    joined = exchange.join_rows(pieces)
    assert joined["w"].tobytes() == array.tobytes() and joined["w"].shape == array.shape
    assert joined["b"].tobytes() == bias.tobytes()


def test_join_refuses_parts_of_other_arrays():
    with pytest.raises(ValueError, match=r"part 1 holds \['v'\], part 0 holds \['w'\]"):
        exchange.join_rows([{"w": np.zeros(2)}, {"v": np.zeros(2)}])


def test_an_array_without_rows_cannot_be_cut():
    assert exchange.can_cut({"w": np.zeros((2, 3)), "b": np.zeros(3)})
    assert not exchange.can_cut({"w": np.zeros((2, 3)), "lr": np.float32(0.1) * np.ones(())})


def test_a_workers_own_part_takes_the_wires_path():
    a = {"w": np.linspace(-1, 1, 11, dtype=np.float32), "i": np.arange(4, dtype=np.int64)}
    same = exchange.as_received(a, float16=False)
    assert same["w"].tobytes() == a["w"].tobytes() and same["w"] is not a["w"]
    narrowed = exchange.as_received(a, float16=True)
    assert narrowed["w"].dtype == np.float32
    assert narrowed["w"].tobytes() == a["w"].astype(np.float16).astype(np.float32).tobytes()
    assert narrowed["i"].tobytes() == a["i"].tobytes()


# ------------------------------------------------------------------ the grid


def _grid_deliveries(k: int, columns: int):
    """Both phases of the grid's routing, simulated: {(receiver, part, origin): times} for the
    scatter (origin: whose rows) and the gather (part = origin: whose block), and the messages
    each worker sends."""
    scatter, gather, sent = {}, {}, dict.fromkeys(range(k), 0)

    def deliver(box, receiver, part, origin):
        box[receiver, part, origin] = box.get((receiver, part, origin), 0) + 1

    for s in range(k):  # first hop: a message to each column's relay, with that column's parts
        for column in range(columns):
            relay = exchange.grid_relay(k, columns, s, column)
            sent[s] += relay != s
            for t in exchange.grid_column(k, columns, column):
                (deliver(scatter, t, t, s) if relay == t else None)  # the relay's own part: arrived
        for relay in {exchange.grid_relay(k, columns, s, c) for c in range(columns)} - {s}:
            deliver(gather, relay, s, s)
            sent[s] += 1
        deliver(gather, s, s, s)
    for relay in range(k):  # second hop: down the relay's column, what it relays
        relayed = exchange.grid_relayed(k, columns, relay)
        for t in exchange.grid_column(k, columns, relay % columns):
            if t == relay:
                continue
            sent[relay] += 2  # one message a phase
            for s in relayed:
                deliver(scatter, t, t, s)
                deliver(gather, t, s, s)
    return scatter, gather, sent


@pytest.mark.parametrize("k", list(range(3, 41)) + [100, 101, 1000])
def test_the_grid_delivers_every_part_once_in_fewer_messages(k):
    columns = math.isqrt(k - 1) + 1
    scatter, gather, sent = _grid_deliveries(k, columns)
    # Reducer t gets the rows of block t from every sender, once; every worker every block, once.
    assert scatter == {(t, t, s): 1 for t in range(k) for s in range(k)}
    assert gather == {(w, j, j): 1 for w in range(k) for j in range(k)}
    # Every sender has one relay a column, and the first row relays the short row for its missing columns.
    assert all(sorted({exchange.grid_relay(k, columns, s, c) % columns for c in range(columns)}) == list(range(columns))
               for s in range(k))
    straight = 2 * (k - 1)  # a worker's messages sent straight: its rows to each reducer, its block to each
    assert max(sent.values()) <= 4 * (columns - 1)  # no worker sends more than the grid's share
    if k >= 9:
        assert max(sent.values()) < straight


def test_the_grid_is_taken_when_the_messages_it_saves_cost_more_than_the_bytes_it_adds():
    assert exchange.grid_columns(2, 1) == 0  # two reducers: nothing to relay
    assert exchange.grid_columns(100, 8_000_000) == 10  # the MNIST network's biggest layer
    assert exchange.grid_columns(1000, 8_000_000) == 32
    assert exchange.grid_columns(10, 8_000_000) == 0  # 4 (10 - 4) messages cost less than 16 MB
    assert exchange.grid_columns(12, 100_000_000) == 0  # a model of 100 MB: straight
    assert exchange.grid_columns(3, 1_000) == 2


# ------------------------------------------------- reducing rows gives the same bits


def _on_rows(reduce, parameters, updates, parts):
    """``reduce`` run part by part on rows, as the reducers run it, then joined."""
    pieces = []
    for j in range(parts):
        rows = [Update(u.shard, u.samples, exchange.rows_of(u.arrays, parts, j)) for u in updates]
        pieces.append(reduce(exchange.rows_of(parameters, parts, j), rows))
    return exchange.join_rows(pieces)


def _updates(rng, shapes, n=5, dtype=np.float32):
    return [Update(s, int(rng.integers(0, 900)) if s != 2 else 0,
                   {k: rng.standard_normal(shape).astype(dtype) for k, shape in shapes.items()}) for s in range(n)]


@pytest.mark.parametrize("parts", PARTS)
def test_weighted_average_on_rows_is_the_whole_average(parts):
    rng = np.random.default_rng(parts)
    shapes = {"w": (37, 11), "b": (11,), "v": (37,)}
    updates = _updates(rng, shapes)
    expected = weighted_average(updates, shapes)
    assert_same_bits(_on_rows(lambda p, u: weighted_average(u, shapes), {}, updates, parts), expected)


@pytest.mark.parametrize("rate, nesterov", [(1.0, False), (2.0, True)])
@pytest.mark.parametrize("parts", PARTS)
def test_block_momentum_on_rows_is_the_whole_one(parts, rate, nesterov):
    rng = np.random.default_rng([parts, 1])
    shapes = {"w": (40, 9), "b": (9,), "w_inc": (40, 9)}
    parameters = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    reduce = lambda p, u: block_momentum_average(p, u, shapes, 0.9, plain=("w_inc",),  # noqa: E731
                                                 block_learning_rate=rate, nesterov=nesterov)
    first = reduce(parameters, _updates(rng, shapes))  # no delta yet: the master-only deltas appear
    parameters = {**parameters, **first}
    updates = _updates(rng, shapes)
    assert_same_bits(_on_rows(reduce, parameters, updates, parts), reduce(parameters, updates))


@pytest.mark.parametrize("visible", ["bernoulli", "gaussian"])
@pytest.mark.parametrize("parts", [1, 3, 64])
def test_the_dbn_reduce_on_rows_is_the_whole_one(visible, parts):
    from dbn.jobs.dbn_program import DBNProgram
    from iterreduce.program import Step

    program = DBNProgram(dict(hidden_layers=[30, 20], visible=visible, pretrain_block_momentum=0.5,
                              block_momentum=0.8, n_classes=4))
    assert program.reduces_elementwise()
    rng = np.random.default_rng(parts)
    steps = [
        (Step("transform", {"layer": 0}, ("rbm.0.visible_bias",)), {"rbm.0.visible_bias": (50,)}),
        (Step("transform", {"layer": 1}, ("rbm.1.visible_bias",)), {"rbm.1.visible_bias": (30,)}),
        (Step("pretrain", {"layer": 0}, ("rbm.0.weights", "rbm.0.hidden_bias")),
         {"rbm.0.weights": (50, 30), "rbm.0.hidden_bias": (30,)}),
        (Step("finetune", {}, ("net.0.weights", "net.0.bias")), {"net.0.weights": (50, 30), "net.0.bias": (30,)}),
    ]
    for step, shapes in steps:
        parameters = {k: rng.uniform(0.01, 0.99, s).astype(np.float32) for k, s in shapes.items()}
        updates = [Update(s, int(rng.integers(1, 900)),
                          {k: rng.uniform(0, 1, shape).astype(np.float32) for k, shape in shapes.items()})
                   for s in range(4)]
        reduce = lambda p, u: program.reduce(step, p, u)  # noqa: E731
        whole = reduce(parameters, updates)
        assert_same_bits(_on_rows(reduce, parameters, updates, parts), whole)


def test_a_program_overriding_reduce_is_not_taken_as_elementwise():
    assert SoftmaxRegression({}).reduces_elementwise()  # the default reduce
    assert not NormalizedSoftmax({}).reduces_elementwise()


class NormalizedSoftmax(SoftmaxRegression):
    """Its reduce scales by a norm over all rows: rows of it are not rows of the result."""

    def reduce(self, step, parameters, updates):
        mean = weighted_average(updates, step.arrays)
        return {k: (v / max(1.0, float(np.abs(v).max()))).astype(v.dtype) for k, v in mean.items()}


# ------------------------------------------------------------- jobs on the workers


@pytest.fixture(params=["straight", "grid"])
def layout(request, monkeypatch):
    """Both ways the reducers' messages go (iterreduce.transport.exchange): straight, or through the grid
    (taken whenever it saves a message); yields the columns the master chose, round by round."""
    monkeypatch.setattr(exchange, "MESSAGE_COST_BYTES", 0 if request.param == "straight" else 1 << 40)
    chosen = []
    grid_columns = exchange.grid_columns

    def recording(reducers, model_bytes):
        chosen.append(grid_columns(reducers, model_bytes))
        return chosen[-1]

    monkeypatch.setattr(exchange, "grid_columns", recording)
    yield request.param, chosen


@pytest.fixture
def uris(tmp_path):
    X, y = blobs(500, d=6, k=3, seed=4)
    return write_shards(X, y, str(tmp_path / "shards"), 5)


def _run(tmp_path, uris, name, *, workers=3, program=SOFTMAX, program_config=None, worker_class=Worker, **config):
    job = InProcessJob(tmp_path / name, uris, workers=workers, program=program,
                       program_config=program_config or {"n_classes": 3, "epochs": 4, "batch_size": 20}, **config)
    encoded = []
    original = job.master.broadcast.encoded
    job.master.broadcast.encoded = lambda n, a, v, shared=False: encoded.append((n, v)) or original(n, a, v, shared)
    peer_host = "127.0.0.1" if job.config.reduce == "workers" else None
    try:
        for i in range(workers):
            worker = worker_class(job.address, job.token, f"worker-{i}", peer_host=peer_host)
            job.worker_objects.append(worker)
            job._spawn(worker.name, worker.run)
        job.start().wait(timeout=90)
    finally:
        job.close()
    return job, encoded


def test_a_job_reduced_on_the_workers_is_the_sequential_run(tmp_path, uris, layout):
    job, encoded = _run(tmp_path, uris, "workers", reduce="workers")
    assert layout[1] == [2 if layout[0] == "grid" else 0] * 4  # 3 reducers: 2 columns, a short row
    expected = simulate(SOFTMAX, job.config.program_config, uris)
    assert_same_bits(load_npz(job.output / "parameters.npz"), expected)
    assert not events(job.output, "exchange_failed")
    assert job.master.rounds.round == 4  # one round a step: no step was run again
    # The master sent the parameters once, at the start: after that the reducers shared them.
    assert sorted(encoded) == [("bias", 0)] * 3 + [("weights", 0)] * 3
    assert [(r["samples"], r["reducers"]) for r in records(job.output)] == [(500, 3)] * 4


@pytest.fixture
def tasks(monkeypatch):
    """Every RUN task the master sends: (worker id, layout_version, number of reducers listed);
    ``.rows``: (round, rows_kept, the rows sent) of each."""

    class Sent(list):
        rows: list

    sent, rows = Sent(), []
    make_task = MasterService._task  # where FetchTask and Sync get their tasks

    def recording(self, request, context, limit=None):
        messages = make_task(self, request, context, limit)
        if messages:  # serialized TaskChunks joined are one: the header and every chunk
            joined = b"".join(m if isinstance(m, bytes) else m.SerializeToString() for m in messages)
            task = pb.TaskChunk.FromString(joined)
            if task.header.kind == pb.TaskHeader.RUN:
                sent.append((request.worker_id, task.header.layout_version, len(task.header.reducers)))
                rows.append((task.header.round, tuple(task.header.rows_kept),
                             sorted({c.name for c in task.tensors if c.name.startswith(exchange.ROWS_PREFIX)})))
        return messages

    monkeypatch.setattr(MasterService, "_task", recording)
    sent.rows = rows  # (round, rows_kept, rows sent) of each reducer's task
    return sent


def test_the_layout_goes_to_each_worker_once(tmp_path, uris, tasks):
    # A task names the K reducers (and the shards they reduce, and the grid) only when the worker
    # does not hold that layout: K of them in K tasks a sync would be K^2 names (a thousand workers:
    # 36 MB a sync, twice the model).
    job, _ = _run(tmp_path, uris, "workers", reduce="workers")
    assert job.master.rounds.round == 4 and not events(job.output, "exchange_failed")
    assert len(tasks) == 4 * 3 and {version for _, version, _ in tasks} == {1}
    listed = [worker for worker, _, n in tasks if n]
    assert sorted(listed) == sorted(job.master.members.workers) and all(n in (0, 3) for _, _, n in tasks)


def test_a_reducer_is_not_sent_again_the_rows_it_reduced(tmp_path, uris, tasks, layout):
    # Its rows of what the reduce reads come with its first order; after a round that succeeded
    # they are its own rows of that result, which it keeps: the master sends them no more.
    job, _ = _run(tmp_path, uris, "workers", reduce="workers")
    assert job.master.rounds.round == 4 and not events(job.output, "exchange_failed")
    rows = sorted(tasks.rows)
    first, later = [r for r in rows if r[0] == 1], [r for r in rows if r[0] > 1]
    assert len(first) == 3 and all(kept == () and sent == ["rows:bias", "rows:weights"] for _, kept, sent in first)
    assert len(later) == 9 and all(kept == ("bias", "weights") and sent == [] for _, kept, sent in later)
    assert_same_bits(load_npz(job.output / "parameters.npz"), simulate(SOFTMAX, job.config.program_config, uris))


def test_a_star_round_after_exchanges_names_no_reducers(tmp_path, uris, tasks):
    def worker_class(address, token, name, peer_host):
        cls = UnreachableWorker if name == "worker-1" else Worker
        return cls(address, token, name, peer_host=peer_host)

    job, _ = _run(tmp_path, uris, "workers", worker_class=worker_class, reduce="workers")
    assert [(r["shards"], r["reducers"]) for r in records(job.output)] == [(5, 0)] * 4
    # Steps 0 and 1: a round with reducers (list 1), then a star round (0, no list); then stars only.
    assert {(version, n) for _, version, n in tasks} == {(1, 3), (1, 0), (0, 0)}
    assert all(n == 0 for _, version, n in tasks if version == 0)
    assert_same_bits(load_npz(job.output / "parameters.npz"), simulate(SOFTMAX, job.config.program_config, uris))


def test_float16_on_the_wire_gives_the_same_bits_either_way(tmp_path, uris, layout):
    star, _ = _run(tmp_path, uris, "master", float16_wire=True)
    peers, _ = _run(tmp_path, uris, "workers", float16_wire=True, reduce="workers")
    assert peers.master.rounds.round == 4 and not events(peers.output, "exchange_failed")
    assert_same_bits(load_npz(peers.output / "parameters.npz"), load_npz(star.output / "parameters.npz"))


@pytest.mark.parametrize("workers", [4, 7, 9, 10])
def test_any_number_of_workers_reduced_through_the_grid_is_the_sequential_run(tmp_path, workers, layout):
    X, y = blobs(600, d=6, k=3, seed=5)
    uris = write_shards(X, y, str(tmp_path / "shards"), 11)  # more shards than workers: some hold two
    job, _ = _run(tmp_path, uris, "workers", workers=workers, reduce="workers")
    columns = math.isqrt(workers - 1) + 1 if layout[0] == "grid" else 0
    assert layout[1] == [columns] * 4 and not events(job.output, "exchange_failed")
    assert [r["reducers"] for r in records(job.output)] == [workers] * 4
    assert_same_bits(load_npz(job.output / "parameters.npz"), simulate(SOFTMAX, job.config.program_config, uris))


def test_a_dbn_reduced_on_the_workers_is_the_sequential_run(tmp_path, mnist_small, layout):
    x_train, y_train, _, _ = mnist_small
    uris = write_shards(x_train[:300], y_train[:300], str(tmp_path / "shards"), 3)
    config = dict(hidden_layers=[24, 12], pretrain_epochs=2, finetune_epochs=2, top_layer_epochs=1, n_classes=10,
                  seed=0, pretrain_batch_size=10, finetune_batch_size=10, sync_every=4, block_momentum=0.5,
                  pretrain_block_momentum=0.3)
    job, _ = _run(tmp_path, uris, "workers", program=DBN_PROGRAM, program_config=config, reduce="workers")
    steps = len(records(job.output))
    assert steps > 10 and job.master.rounds.round == steps and not events(job.output, "exchange_failed")
    expected = simulate(DBN_PROGRAM, config, uris)
    final = job.master.parameters
    assert any(k.startswith("master.block_delta.") for k in final)  # block momentum ran on the reducers
    assert_same_bits(final, expected)


def test_a_non_elementwise_reduce_stays_on_the_master(tmp_path, uris):
    program = f"{__name__}:NormalizedSoftmax"
    job, _ = _run(tmp_path, uris, "workers", program=program, reduce="workers")
    assert job.master.rounds.round == 4 and not job.master.rounds.gathered  # star rounds only
    assert_same_bits(load_npz(job.output / "parameters.npz"), simulate(program, job.config.program_config, uris))


class UnreachableWorker(Worker):
    """Serves its Peer service but advertises an address where nobody listens."""

    def register(self):
        self.peer_address = "127.0.0.1:1"
        super().register()


def test_an_unreachable_peer_makes_the_master_reduce_again_and_then_for_good(tmp_path, uris, layout):
    def worker_class(address, token, name, peer_host):
        cls = UnreachableWorker if name == "worker-1" else Worker
        return cls(address, token, name, peer_host=peer_host)

    job, _ = _run(tmp_path, uris, "workers", worker_class=worker_class, reduce="workers")
    failed = events(job.output, "exchange_failed")
    assert [e["step"] for e in failed] == [0, 1]
    assert all("worker-1#" in e["reason"] and "127.0.0.1:1" in e["reason"] for e in failed)
    # Two failures in a row: the master reduces from then on, instead of trying every step.
    assert [(e["step"], e["failed"]) for e in events(job.output, "exchange_off")] == [(1, 2)]
    assert job.master.rounds.round == 2 + 2 + 1 + 1  # steps 0 and 1: the failed exchange, then the star
    # Nobody was lost, so every shard is in every step: the sequential run's bits.
    assert [(r["shards"], r["reducers"]) for r in records(job.output)] == [(5, 0)] * 4  # the master reduced
    assert_same_bits(load_npz(job.output / "parameters.npz"), simulate(SOFTMAX, job.config.program_config, uris))


def test_reduce_must_be_master_or_workers(tmp_path):
    with pytest.raises(ValueError, match=r"reduce = 'peers': expected one of 'master', 'workers'"):
        MasterConfig(program=SOFTMAX, program_config={}, shards=[], workers=1, token="", output=str(tmp_path),
                     reduce="peers")


def test_a_worker_killed_mid_exchange_the_step_runs_again_and_the_job_completes(tmp_path, monkeypatch):
    """Real processes: worker-1 is SIGKILLed while the others exchange rows with it (the slow
    program's 0.1 s a shard lets the kill land mid-step)."""
    subprocess_env(monkeypatch, delay=0.1)
    X, y = blobs(900, d=8, k=3, seed=2)
    write_shards(X, y, str(tmp_path / "shards"), 3)
    config = {"n_classes": 3, "epochs": 20, "batch_size": 0, "local_steps": 1, "learning_rate": 0.5}
    out = tmp_path / "out"
    killed = []

    def on_record(rec):
        if rec.get("step") == 4 and "event" not in rec and not killed:
            killed.append(kill_worker(out, "worker-1"))

    run_job(program=SLOW_SOFTMAX, program_config=config, shards=str(tmp_path / "shards"), workers=3,
            output=str(out), on_record=on_record, timeout=120, reduce="workers")
    assert killed
    (lost,) = events(out, "worker_lost")
    failed = events(out, "exchange_failed")
    assert failed and all(lost["worker"] in e["reason"] for e in failed)
    recs = records(out)
    assert [r["step"] for r in recs] == list(range(20))  # every step once
    assert sum(r["shards"] < 3 for r in recs) <= 2 and recs[-1]["shards"] == 3  # the restarted worker is back
    result, expected = load_npz(out / "parameters.npz"), simulate(SOFTMAX, config, list_shards(str(tmp_path / "shards")))
    for k in expected:
        np.testing.assert_allclose(result[k], expected[k], rtol=0.05, atol=0.02 * np.abs(expected[k]).max())


# ------------------------------------------------------------------ a reducer's checks


def test_a_wait_ends_when_its_round_is_abandoned_but_a_complete_box_is_kept():
    import threading

    inbox = exchange.Inbox()
    inbox.put(2, exchange.REDUCED, 0, {"w": np.ones(3)})
    got = {}
    waiter = threading.Thread(target=lambda: got.update(r=inbox.wait(3, exchange.UPDATE, 0, ["0/w"], timeout=None)))
    waiter.start()
    inbox.abandon_before(4)  # round 3 failed: its reducer must not wait for ever
    waiter.join(5)
    assert not waiter.is_alive() and got["r"] is None
    # Round 2's blocks all came: they are still taken (the arrays the master counts as delivered).
    assert inbox.wait(2, exchange.REDUCED, 0, ["w"], timeout=0)["w"].tolist() == [1, 1, 1]
    inbox.put(5, exchange.UPDATE, 1, {"0/w": np.zeros(2)}, {0: 7})
    assert inbox.samples(5, exchange.UPDATE, 1) == {0: 7}
    inbox.drop_before(5)
    assert inbox.wait(2, exchange.REDUCED, 0, ["w"], timeout=0) is None


def test_a_reducer_refuses_rows_of_the_wrong_shape_and_says_whose():
    from iterreduce.program import Step, step_to_json
    from iterreduce.proto import iterreduce_pb2 as pb

    worker = Worker("127.0.0.1:1", "token", "worker-0")  # never connects: only its reduce runs
    worker.reducer = SoftmaxRegression({})
    try:
        header = pb.TaskHeader(round=3, part=0, reduce_shards=[0, 1],
                               info_json=step_to_json(Step("train", {}, ("weights",))))
        worker.inbox.put(3, exchange.UPDATE, 0, {"0/weights": np.zeros((4, 3), np.float32),
                                                 "1/weights": np.zeros((4, 2), np.float32)}, {0: 5, 1: 5})
        result, error = worker._reduce(header, {"weights": np.zeros((4, 3), np.float32)})
        assert result == {}
        assert error == "shard 1 sent rows of weights as float32[4, 2], expected float32[4, 3]"
    finally:
        worker.channel.close()


def test_a_shard_changing_hands_fails_a_grid_round_only(tmp_path, uris):
    # A relay waits for a shard's rows from the reducer that had it when the round began: if the
    # shard moves (a worker rejoining takes back its home shards), the grid round cannot end.
    job = InProcessJob(tmp_path / "out", uris, workers=3, reduce="workers")
    try:
        master = job.master
        with master.lock:
            master.rounds.reducers, master.rounds.columns, master.rounds.shard_reducer = ["a#1", "b#2", "c#3"], 2, {0: 0, 1: 1}
            master.rounds.results = {1: None}
            master.rounds.moved(1)  # already reported: its rows are on their way
            assert master.rounds.exchange_error is None
            master.rounds.moved(0)
            assert master.rounds.exchange_error == "shard 0 changed hands during the exchange"
            master.rounds.exchange_error, master.rounds.columns = None, 0
            master.rounds.moved(0)  # sent straight, the new owner's rows reach every reducer
            assert master.rounds.exchange_error is None
    finally:
        job.close()


class ForgetfulWorker(Worker):
    """Loses the results it reduced once (as if the master counted rows it does not hold)."""

    forgot = False

    def _rows_kept(self, header):
        if header.rows_kept and not ForgetfulWorker.forgot:
            ForgetfulWorker.forgot = True
            self._results.clear()
        return super()._rows_kept(header)


def test_a_reducer_without_the_rows_it_was_said_to_hold_fails_the_round_not_the_bits(tmp_path, uris, layout):
    def worker_class(address, token, name, peer_host):
        cls = ForgetfulWorker if name == "worker-1" else Worker
        return cls(address, token, name, peer_host=peer_host)

    ForgetfulWorker.forgot = False
    job, _ = _run(tmp_path, uris, "workers", worker_class=worker_class, reduce="workers")
    assert ForgetfulWorker.forgot
    (failed,) = events(job.output, "exchange_failed")
    assert "are not held" in failed["reason"] and failed["step"] == 1
    # The step ran again as a star, and the next ones on the workers again: the sequential run's bits.
    assert [r["reducers"] for r in records(job.output)] == [3, 0, 3, 3]
    assert_same_bits(load_npz(job.output / "parameters.npz"), simulate(SOFTMAX, job.config.program_config, uris))
