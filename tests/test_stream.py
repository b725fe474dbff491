"""Data larger than a worker's memory: row files on local disk, streamed shards, the memory plan.

A streamed worker must train the model an in-memory worker trains, bit for bit: the same
rows in every minibatch, the same blocks through every layer."""

from __future__ import annotations


import numpy as np
import pytest

from conftest_runtime import InProcessJob, simulate
from dbn.errors import ConfigError
from dbn.jobs import memory_plan as memory
from iterreduce.exceptions import ShardError
from iterreduce.storage.rowfile import RowFile, prefetch
from shardio import shards as shards_module
from shardio.readers import read_shard, spill_shard
from shardio.shards import as_float32, write_shards
from threadwatch import NewThreads

DBN_PROGRAM = "dbn.jobs.dbn_program:DBNProgram"


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few dozen rows, so that small test shards span many of them."""
    import dbn.model.minibatch as minibatch

    monkeypatch.setattr(shards_module, "STREAM_ROWS", 37)
    monkeypatch.setattr(minibatch, "CHUNK_ROWS", 64)


# --------------------------------------------------------------- row files


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_row_file_reads_back_what_was_written(tmp_path, dtype):
    rng = np.random.default_rng(0)
    values = (rng.random((301, 7)) * 255).astype(dtype)
    rows = RowFile.new(str(tmp_path), "t-", 7, dtype, convert=as_float32)
    for start in range(0, 301, 50):
        rows.append(values[start:start + 50])
    expected = as_float32(values)
    assert rows.shape == (301, 7) and len(rows) == 301 and rows.dtype == np.float32
    assert rows.nbytes == values.nbytes
    assert np.array_equal(rows[:], expected) and np.array_equal(rows[10:20], expected[10:20])
    index = rng.permutation(301)[:100]
    index[5] = index[6]  # a repeat
    assert np.array_equal(rows.take(index), expected[index]) and np.array_equal(rows[index], expected[index])
    assert np.array_equal(np.concatenate(list(rows.chunks(64))), expected)
    with pytest.raises(IndexError, match=r"row 301 out of range for 301 rows"):
        rows.take(np.array([0, 301]))
    with pytest.raises(ValueError, match=r"rows of width 7 expected"):
        rows.append(values[:, :3])
    path = rows.path
    rows.close()
    assert not (tmp_path / path.split("/")[-1]).exists()


def test_row_files_get_unique_names(tmp_path):
    a = RowFile.new(str(tmp_path), "same-", 2, np.float32)
    b = RowFile.new(str(tmp_path), "same-", 2, np.float32)
    a.append(np.ones((3, 2), np.float32))
    b.append(np.zeros((1, 2), np.float32))
    assert a.path != b.path and len(a) == 3 and len(b) == 1
    a.close()
    assert np.array_equal(b[:], np.zeros((1, 2), np.float32))  # closing one removes only its own file


def test_prefetch_yields_in_order_and_raises_the_producers_error():
    assert list(prefetch(iter(range(50)), depth=3)) == list(range(50))

    def failing():
        yield 1
        raise OSError("disk gone")

    got = []
    with pytest.raises(OSError, match="disk gone"):
        for item in prefetch(failing()):
            got.append(item)
    assert got == [1]


def test_an_abandoned_prefetch_stops_its_thread():
    started = NewThreads()
    items = prefetch(iter(range(10_000)), depth=2)
    assert next(items) == 0 and started.count() == 1  # the prefetch's own thread
    items.close()  # the consumer stops early (e.g. an error in training)
    assert started.count() == 0, started.alive()


# ----------------------------------------------------------- spilled shards


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64])
def test_a_spilled_shard_has_the_bits_of_a_read_one(tmp_path, small_blocks, dtype):
    rng = np.random.default_rng(1)
    X = (rng.random((200, 9)) * (255 if dtype == np.uint8 else 1)).astype(dtype)
    y = rng.integers(0, 4, 200)
    (uri,) = write_shards(X, y, str(tmp_path / "s"), 1)
    whole = read_shard(uri, 0)
    spilled = spill_shard(uri, str(tmp_path), 0)
    assert isinstance(spilled.features, RowFile) and spilled.rows == 200
    assert np.array_equal(spilled.features[:], whole.features)
    assert np.array_equal(spilled.labels, whole.labels) and spilled.labels.dtype == np.int64
    assert spilled.features.stored == (np.uint8 if dtype == np.uint8 else np.float32)  # kept compact on disk


def test_spilling_holds_a_few_blocks_not_the_file(tmp_path, monkeypatch):
    """pyarrow's pre-buffering would keep every row group read until the file closes: the
    memory a spill holds must not grow with the shard."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows_per_group, groups, width = 2000, 30, 1000
    path = tmp_path / "big.parquet"
    schema = pa.schema([("features", pa.list_(pa.uint8(), width)), ("label", pa.int64())])
    rng = np.random.default_rng(6)
    with pq.ParquetWriter(path, schema) as writer:
        for _ in range(groups):
            values = rng.integers(0, 256, rows_per_group * width, dtype=np.uint8)
            writer.write_table(pa.table({"features": pa.FixedSizeListArray.from_arrays(pa.array(values), width),
                                         "label": pa.array(np.zeros(rows_per_group, np.int64))}, schema=schema))
    held = []
    append = RowFile.append
    monkeypatch.setattr(RowFile, "append", lambda self, block: (held.append(pa.total_allocated_bytes()),
                                                                append(self, block)))
    spilled = spill_shard(str(path), str(tmp_path), 0)
    assert spilled.rows == rows_per_group * groups and len(held) > 5
    growth, file_bytes = max(held) - held[0], rows_per_group * groups * width
    assert growth < file_bytes / 5, (growth, file_bytes)


def test_bad_values_in_a_later_block_are_named_by_their_row(tmp_path, small_blocks):
    X = np.random.default_rng(2).random((120, 5)).astype(np.float32)
    X[100, 3] = np.nan
    (uri,) = write_shards(X, np.zeros(120, np.int64), str(tmp_path / "nan"), 1)
    with pytest.raises(ShardError, match=r"part-00000.parquet: 'features' contains NaN .* row 100, column 3"):
        spill_shard(uri, str(tmp_path), 0)
    y = np.zeros(120, np.int64)
    y[90] = -2
    (uri,) = write_shards(np.zeros((120, 5), np.float32), y, str(tmp_path / "neg"), 1)
    with pytest.raises(ShardError, match=r"'label' at row 90 is -2"):
        spill_shard(uri, str(tmp_path), 0)
    assert not list(tmp_path.glob("*.rows"))  # a refused shard leaves no row file behind
    with pytest.raises(ShardError, match=r"no 'label' column, but this job needs labels"):
        (uri,) = write_shards(np.zeros((10, 5), np.float32), None, str(tmp_path / "nolabel"), 1)
        spill_shard(uri, str(tmp_path), 0, need_labels=True)


# -------------------------------------------------------- training exactness


def _config(**extra):
    return dict(hidden_layers=[12, 8, 6], pretrain_epochs=2, finetune_epochs=2, top_layer_epochs=1, n_classes=3,
                seed=0, pretrain_batch_size=20, finetune_batch_size=25, **extra)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_streamed_training_gives_the_in_memory_model_bit_for_bit(tmp_path, small_blocks, dtype):
    rng = np.random.default_rng(3)
    X = (rng.random((610, 30)) * 255).astype(np.uint8)
    data = X if dtype == np.uint8 else (X / 300).astype(np.float32)
    uris = write_shards(data, rng.integers(0, 3, 610), str(tmp_path / "s"), 3)
    in_memory = simulate(DBN_PROGRAM, _config(), uris)
    streamed = simulate(DBN_PROGRAM, _config(stream=True), uris)
    assert sorted(in_memory) == sorted(streamed)
    for key in in_memory:
        assert in_memory[key].dtype == streamed[key].dtype and np.array_equal(in_memory[key], streamed[key]), key


def test_streaming_workers_train_the_one_process_model(tmp_path, small_blocks):
    """N workers streaming over gRPC == the in-memory run of every shard in one process."""
    rng = np.random.default_rng(4)
    uris = write_shards((rng.random((400, 20)) * 255).astype(np.uint8), rng.integers(0, 3, 400),
                        str(tmp_path / "s"), 4)
    job = InProcessJob(tmp_path / "out", uris, workers=2, program=DBN_PROGRAM, program_config=_config(stream=True))
    job.run_to_end("w0", "w1")
    saved = dict(np.load(tmp_path / "out" / "model.npz"))
    expected = simulate(DBN_PROGRAM, _config(), uris)
    compared = [k for k in saved if k in expected]
    assert {"rbm.0.weights", "rbm.2.weights", "net.3.weights"} <= set(compared)
    for key in compared:
        assert np.array_equal(saved[key], expected[key]), key


def test_a_streamed_worker_keeps_only_the_data_and_the_newest_layer_on_disk(tmp_path, small_blocks, monkeypatch):
    from iterreduce.program import shard_seed
    from shardio.readers import shard_info
    from dbn.jobs.dbn_program import DBNProgram, DBNWorker

    monkeypatch.setenv("ITERREDUCE_LOCAL_DIR", str(tmp_path / "local"))
    (tmp_path / "local").mkdir()
    rng = np.random.default_rng(5)
    uris = write_shards((rng.random((150, 10)) * 255).astype(np.uint8), rng.integers(0, 3, 150),
                        str(tmp_path / "s"), 1)
    info = shard_info(uris)
    program, worker = DBNProgram(_config(stream=True)), DBNWorker(_config(stream=True))
    program.check_shards(info)
    params = program.initial_parameters(0, info)
    shard = worker.load_shard(uris[0], 0)
    spilled = {}
    for index, step in enumerate(program.schedule(info)):
        params = program.before_step(step, params)
        update = worker.run(step, params, shard, shard_seed(0, index, 0))
        params = {**params, **program.reduce(step, params, [update])}
        spilled[step.phase, step.info.get("layer")] = sorted(
            "data" if "layer" not in p.name else p.name.split("-")[3] for p in (tmp_path / "local").glob("*/*.rows"))
    assert spilled["pretrain", 0] == ["data"]
    assert spilled["pretrain", 1] == ["1", "data"]
    assert spilled["pretrain", 2] == ["2", "data"]  # layer 1's input was removed once layer 2's was made
    assert spilled["finetune", None] == ["2", "data"]


# --------------------------------------------------------------- memory plan


MNIST_SHARD = {"rows": 6000, "features": 784}


def test_the_plan_streams_only_data_that_would_not_fit():
    layers = [500, 500, 2000]
    need = memory.worker_bytes([MNIST_SHARD] * 10, 10, layers, stream=False)
    stream, figures = memory.plan([MNIST_SHARD] * 10, 10, layers, choice="auto", budget_bytes=4 * 2**30,
                                  budget_name="[yarn] worker_memory (4 GiB)")
    assert not stream and figures["worker_bytes"] == need
    big = [{**MNIST_SHARD, "rows": 2_000_000}] * 2
    stream, figures = memory.plan(big, 2, layers, choice="auto", budget_bytes=2**30, budget_name="[yarn] worker_memory")
    assert stream and figures["worker_bytes"] < 2**30 < figures["in_memory_bytes"]
    assert memory.plan([MNIST_SHARD], 1, layers, choice="always", budget_bytes=2**30, budget_name="x")[0]


def test_a_worker_that_cannot_fit_is_refused_naming_the_settings():
    big = [{"rows": 2_000_000, "features": 784}] * 2
    with pytest.raises(ConfigError, match=r"each worker needs about \d+ MiB \(holding its data in memory\) but "
                                          r"\[yarn\] worker_memory gives it 1024 MiB: raise \[yarn\] "
                                          r"worker_memory, set \[cluster\] stream = \"auto\""):
        memory.plan(big, 2, [500, 500, 2000], choice="never", budget_bytes=2**30,
                    budget_name="[yarn] worker_memory")
    with pytest.raises(ConfigError, match=r"\(streaming its data\) but .* gives it 400 MiB: raise"):
        memory.plan(big, 2, [500, 500, 2000], choice="auto", budget_bytes=400 * 2**20, budget_name="[yarn] worker_memory")


def test_workers_that_reduce_among_themselves_are_planned_with_the_exchanges_copies_of_the_model():
    # The parts of an update in flight, the rows a reducer reduces, and the next step's parameters
    # and update computed ahead: four more copies of the model than a star's worker holds.
    layers, weights = [500, 500, 2000], 784 * 500 + 500 * 500 + 500 * 2000 + (784 + 500) + (500 + 500) + (500 + 2000)
    star = memory.worker_bytes([MNIST_SHARD] * 10, 10, layers, stream=False)
    exchange = memory.worker_bytes([MNIST_SHARD] * 10, 10, layers, stream=False, exchange=True)
    assert exchange - star == 4 * 4 * weights
    _, figures = memory.plan([MNIST_SHARD] * 10, 10, layers, choice="auto", budget_bytes=4 * 2**30,
                             budget_name="x", exchange=True)
    assert figures["worker_bytes"] == exchange
    model = memory.PROCESS_BYTES + memory.model_bytes(784, [6000, 6000])
    with pytest.raises(ConfigError, match=r"8 copies: parameters, momentum, steps, the master's copy and the exchange"):
        memory.plan([MNIST_SHARD] * 10, 10, [6000, 6000], choice="auto", budget_bytes=model + 2**20,
                    budget_name="[yarn] worker_memory", exchange=True)
    memory.plan([MNIST_SHARD] * 10, 10, [6000, 6000], choice="auto", budget_bytes=model + 2**30,
                budget_name="[yarn] worker_memory")  # a star's workers fit


def test_a_model_too_big_for_any_worker_says_so_not_more_workers():
    with pytest.raises(ConfigError, match=r"the model alone \(784-20000-20000: \d{3},\d{3},\d{3} weights\) needs about "
                                          r"\d+ MiB in each worker .* use smaller \[model\] hidden_layers"):
        memory.plan([MNIST_SHARD] * 100, 100, [20000, 20000], choice="auto", budget_bytes=4 * 2**30,
                    budget_name="[yarn] worker_memory")


def test_one_process_refuses_a_model_that_cannot_fit_before_allocating_it(tmp_path, capsys):
    from dbn.cli import main

    rng = np.random.default_rng(0)
    np.savez(tmp_path / "d.npz", X=rng.random((20, 4)).astype(np.float32), y=np.arange(20) % 2)
    (tmp_path / "job.toml").write_text("[data]\ntrain = 'd.npz'\n[model]\nhidden_layers = [100000, 100000]\n"
                                       "[job]\ndevice = 'cpu'\n")
    assert main(["train", str(tmp_path / "job.toml"), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "training 4-100000-100000 on 20 rows in this process needs about" in err and "hidden_layers" in err, err
    with pytest.raises(ConfigError, match="needs about 1 MiB more"):  # 326,400 B of model, 400,000 of layer input
        memory.check_one_process(1000, 100, [100, 100], available_bytes=2**19)
    memory.check_one_process(1000, 100, [100, 100], available_bytes=10 * 2**20)  # fits: no error


def test_the_in_memory_formula_grows_with_rows_and_the_streamed_one_barely():
    layers = [500, 500, 2000]
    small = memory.worker_bytes([{**MNIST_SHARD, "rows": 1000}], 1, layers, stream=False)
    large = memory.worker_bytes([{**MNIST_SHARD, "rows": 101_000}], 1, layers, stream=False)
    # 100,000 more rows: float32 features, two layer inputs of 500, labels and the check's mask.
    assert large - small == 100_000 * (4 * 784 + 4 * 1000 + 8 + 784)
    s_small = memory.worker_bytes([{**MNIST_SHARD, "rows": 1000}], 1, layers, stream=True)
    s_large = memory.worker_bytes([{**MNIST_SHARD, "rows": 101_000}], 1, layers, stream=True)
    assert s_large - s_small == 100_000 * 8  # the labels only


def test_a_killed_local_workers_row_files_are_removed_with_the_launchers_folder(tmp_path, monkeypatch):
    """A worker killed with SIGKILL cannot remove its row files: they are in a folder the local
    launcher made for its workers (under ITERREDUCE_LOCAL_DIR), which it removes at the end."""
    from conftest_runtime import kill_worker, run_job

    local = tmp_path / "local"
    local.mkdir()
    (local / "dbn-rows-mine").mkdir()  # a folder of the user's, named as a worker's would be: left as it is
    monkeypatch.setenv("ITERREDUCE_LOCAL_DIR", str(local))
    rng = np.random.default_rng(6)
    write_shards((rng.random((600, 10)) * 255).astype(np.uint8), rng.integers(0, 3, 600), str(tmp_path / "s"), 3)
    out, spilled, killed = tmp_path / "out", [], []

    def on_record(record):  # the first step record that finds the row files: worker-1 killed
        if "step" in record and "event" not in record and not killed:
            spilled.extend(local.glob("iterreduce-local-*/dbn-rows-*/*.rows"))
            if spilled:
                killed.append(kill_worker(out, "worker-1"))

    run_job(program=DBN_PROGRAM, program_config={**_config(stream=True), "pretrain_epochs": 30},
            shards=str(tmp_path / "s"), workers=3, output=str(out), on_record=on_record, timeout=120)
    assert killed and spilled  # the workers' row files were there, in the launcher's folder
    assert [p.name for p in local.iterdir()] == ["dbn-rows-mine"]
