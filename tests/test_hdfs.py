"""The project's file I/O against a real HDFS (the NameNode and DataNode of tests/minihadoop.py).

Everything goes through the project's own ``hdfs://`` path (``shardio.shards.
filesystem``: hdfs-native under pyarrow); the ``hdfs`` fixture's own client
(``hdfs.fs()``) only plants files and checks what really landed on HDFS.
"""

from __future__ import annotations

import uuid

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from iterreduce.exceptions import ShardError
from iterreduce.master import checkpoint
from iterreduce.master.checkpoint import CheckpointError
from iterreduce.storage.filesystems import open_output_file
from iterreduce.storage.ownership import MANIFEST_NAME
from shardio.readers import list_shards, read_shard
from shardio.shards import write_shards

pytestmark = pytest.mark.hdfs


@pytest.fixture
def base(hdfs):
    """(uri, path): a fresh, not yet existing directory on the session's HDFS."""
    path = f"/tests/{uuid.uuid4().hex[:12]}"
    return hdfs.uri(path), path


def names_on_hdfs(hdfs, path: str) -> list[str]:
    entries = hdfs.fs().get_file_info(pafs.FileSelector(path))
    return sorted(e.base_name for e in entries)


def fixed_list(values: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


# ------------------------------------------------------------------ shards


def test_parquet_shard_written_to_hdfs_reads_back_equal(hdfs, base):
    uri, path = base
    X = np.random.default_rng(0).random((37, 9), dtype=np.float32)
    y = np.arange(37) % 4
    fs = hdfs.fs()
    fs.create_dir(path)
    pq.write_table(pa.table({"features": fixed_list(X), "label": pa.array(y)}), f"{path}/one.parquet", filesystem=fs)

    shards = list_shards(uri)
    assert shards == [f"{uri}/one.parquet"] and shards[0].startswith(hdfs.url + "/tests/")
    assert list_shards(shards[0]) == shards  # a file URI lists as itself
    shard = read_shard(shards[0], 0, n_features=9, need_labels=True)
    np.testing.assert_array_equal(shard.features, X)
    np.testing.assert_array_equal(shard.labels, y)
    assert shard.uri == shards[0] and shard.rows == 37


def test_write_shards_to_hdfs_round_trip(hdfs, base):
    uri, path = base
    rng = np.random.default_rng(1)
    X = rng.integers(0, 256, size=(103, 12), dtype=np.uint8)
    y = rng.integers(0, 10, size=103)

    written = write_shards(X, y, f"{uri}/train", 4)

    assert written == [f"{uri}/train/part-{i:05d}.parquet" for i in range(4)]
    assert names_on_hdfs(hdfs, f"{path}/train") == [MANIFEST_NAME] + [f"part-{i:05d}.parquet" for i in range(4)]  # really on HDFS
    assert list_shards(f"{uri}/train") == written
    parts = [read_shard(u, i) for i, u in enumerate(written)]
    assert [p.rows for p in parts] == [26, 26, 26, 25]
    np.testing.assert_array_equal(np.concatenate([p.features for p in parts]), X.astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(np.concatenate([p.labels for p in parts]), y)
    # The uint8 column kept its compact type on HDFS too.
    with hdfs.fs().open_input_file(f"{path}/train/part-00000.parquet") as f:
        assert pq.read_schema(f).field("features").type == pa.list_(pa.uint8(), 12)


def test_list_shards_errors_name_the_hdfs_uri(hdfs, base):
    uri, path = base
    with pytest.raises(ShardError, match=f"^{uri}: no such shard file or directory"):
        list_shards(uri)
    hdfs.fs().create_dir(path)
    with hdfs.fs().open_output_stream(f"{path}/notes.txt") as out:
        out.write(b"not a shard")
    with pytest.raises(ShardError, match=f"^{uri}: directory holds no .parquet shards"):
        list_shards(uri)


def test_garbage_parquet_on_hdfs_is_a_shard_error_naming_the_uri(hdfs, base):
    uri, path = base
    fs = hdfs.fs()
    fs.create_dir(path)
    with fs.open_output_stream(f"{path}/x.parquet") as out:
        out.write(b"this is not parquet\x00\x01\x02" * 10)
    (shard,) = list_shards(uri)
    assert shard == f"{uri}/x.parquet"
    with pytest.raises(ShardError, match=f"^{shard}: not a readable Parquet file"):
        read_shard(shard)


def test_wrong_schema_on_hdfs_is_a_shard_error_naming_the_uri(hdfs, base):
    uri, path = base
    fs = hdfs.fs()
    fs.create_dir(path)
    pq.write_table(pa.table({"pixels": pa.array([1.0, 2.0])}), f"{path}/p.parquet", filesystem=fs)
    with pytest.raises(ShardError, match=f"^{uri}/p.parquet: no 'features' column"):
        read_shard(f"{uri}/p.parquet")


def test_missing_shard_on_hdfs_is_a_shard_error_naming_the_uri(hdfs, base):
    uri, _ = base
    with pytest.raises(ShardError, match=f"^{uri}/gone.parquet: shard not found"):
        read_shard(f"{uri}/gone.parquet")


def test_shard_info_and_labels_read_footers_and_one_column_on_hdfs(hdfs, base):
    from shardio.readers import read_labels, shard_info

    uri, path = base
    X = np.random.default_rng(5).random((40, 7), dtype=np.float32)
    written = write_shards(X, np.arange(40) % 5, uri, 2)
    info = shard_info(written)
    assert [{k: v for k, v in i.items() if k != "ranges"} for i in info] == [
        {"uri": u, "rows": 20, "features": 7, "labels": True, "classes": None, "columns": None}
        for u in written]  # indices: no classes; no column names
    assert all(i["ranges"]["label"] == (0, 4) and 0 <= i["ranges"]["features"][0] < i["ranges"]["features"][1] < 1
               for i in info)
    assert np.array_equal(read_labels(written[1]), np.arange(20, 40) % 5)
    named = write_shards(X, None, f"{uri}-named", 1, columns=[f"c {i}" for i in range(7)])  # a CSV's names
    assert shard_info(named)[0]["columns"] == [f"c {i}" for i in range(7)]
    with hdfs.fs().open_output_stream(f"{path}/x.parquet") as out:
        out.write(b"garbage" * 20)
    with pytest.raises(ShardError, match=f"^{uri}/x.parquet: not a readable Parquet file"):
        shard_info(list_shards(uri))


# ------------------------------------------------------------------ checkpoints


def test_checkpoints_on_hdfs_save_latest_load_and_prune(hdfs, base):
    uri, path = base
    directory = f"{uri}/ckpt"
    assert checkpoint.latest(directory) is None  # no directory yet
    rng = np.random.default_rng(2)
    saved = {}
    for step in (1, 2, 3, 4):
        arrays = {"weights": rng.standard_normal((6, 5)).astype(np.float32), "bias": np.full(5, step, np.float64)}
        written = checkpoint.save(directory, step, {"seed": 7, "fingerprint": "abc"}, arrays, keep=2)
        assert written == f"{directory}/ckpt-{step:09d}.npz"
        assert checkpoint.latest(directory) == written
        saved[step] = arrays

    # keep=2 pruned the older ones, and no temporary file is left behind.
    assert names_on_hdfs(hdfs, f"{path}/ckpt") == ["ckpt-000000003.npz", "ckpt-000000004.npz"]
    for step in (3, 4):
        header, arrays = checkpoint.load(f"{directory}/ckpt-{step:09d}.npz")
        assert header == {"seed": 7, "fingerprint": "abc", "step": step}
        assert arrays.keys() == saved[step].keys()
        for name, value in saved[step].items():
            np.testing.assert_array_equal(arrays[name], value)
            assert arrays[name].dtype == value.dtype


def test_checkpoint_save_over_an_existing_step_on_hdfs(hdfs, base):
    """A job re-run (without --resume) into the same checkpoint directory writes the same
    steps again: the new checkpoint must replace the old, as it does on a local disk."""
    uri, _ = base
    checkpoint.save(uri, 5, {"v": 1}, {"a": np.zeros(3)})
    checkpoint.save(uri, 5, {"v": 2}, {"a": np.ones(3)})
    header, arrays = checkpoint.load(checkpoint.latest(uri))
    assert header["v"] == 2 and arrays["a"].tolist() == [1.0, 1.0, 1.0]
    assert not [i for i in hdfs.fs().get_file_info(__import__("pyarrow.fs").fs.FileSelector(base[1]))
                if i.base_name.endswith(".tmp")]


def test_an_output_file_on_hdfs_replaces_an_earlier_one_only_when_finished(hdfs, base):
    """A checkpoint, `dbn predict --out hdfs://... --overwrite`: a new folder is made, a finished
    write replaces the file (HDFS renames never replace one), a failed one leaves the earlier
    file and no partial one."""
    uri, path = base
    target = f"{uri}/predictions/out.parquet"
    for content in (b"first", b"second"):
        with open_output_file(target) as stream:
            stream.write(content)
    with pytest.raises(RuntimeError):
        with open_output_file(target) as stream:
            stream.write(b"unfinished")
            raise RuntimeError("half-way")
    with hdfs.fs().open_input_stream(f"{path}/predictions/out.parquet") as f:
        assert f.read() == b"second"
    assert names_on_hdfs(hdfs, f"{path}/predictions") == ["out.parquet"]


def test_pruning_never_removes_the_checkpoint_just_written(tmp_path):
    """Older checkpoints of a previous run with higher steps must not push out the new one."""
    uri = str(tmp_path / "ck")
    for step in (7, 8, 9):
        checkpoint.save(uri, step, {}, {"a": np.zeros(1)}, keep=5)
    checkpoint.save(uri, 2, {}, {"a": np.ones(1)}, keep=2)
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert names == ["ckpt-000000002.npz", "ckpt-000000009.npz"]


def test_unreadable_checkpoint_on_hdfs_is_a_checkpoint_error(hdfs, base):
    uri, path = base
    fs = hdfs.fs()
    fs.create_dir(path)
    with fs.open_output_stream(f"{path}/ckpt-000000009.npz") as out:
        out.write(b"garbage")
    assert checkpoint.latest(uri) == f"{uri}/ckpt-000000009.npz"
    with pytest.raises(CheckpointError, match=f"^{uri}/ckpt-000000009.npz: unreadable checkpoint"):
        checkpoint.load(f"{uri}/ckpt-000000009.npz")
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        checkpoint.load(f"{uri}/ckpt-000000010.npz")  # missing


# ------------------------------------------------------------------ dbn shard


def _dataset(tmp_path, n=90, n_features=24):
    rng = np.random.default_rng(3)
    X = (rng.random((n, n_features)) < 0.3).astype(np.float32)
    y = rng.integers(0, 3, n)
    np.savez(tmp_path / "d.npz", X=X, y=y)
    return X, y


def test_shard_dataset_writes_to_hdfs(hdfs, base, tmp_path):
    from dbn.data.sharding import shard_dataset

    uri, path = base
    X, y = _dataset(tmp_path)
    written = shard_dataset(str(tmp_path / "d.npz"), uri, 4)
    assert written == list_shards(uri) and len(written) == 4
    assert names_on_hdfs(hdfs, path) == [MANIFEST_NAME] + [f"part-{i:05d}.parquet" for i in range(4)]  # and their manifest
    parts = [read_shard(u, i, n_features=24, need_labels=True) for i, u in enumerate(written)]
    np.testing.assert_array_equal(np.concatenate([p.features for p in parts]), X)
    np.testing.assert_array_equal(np.concatenate([p.labels for p in parts]), y)


def test_dbn_shard_cli_writes_to_hdfs(hdfs, base, tmp_path, capsys):
    from dbn.cli import main

    uri, _ = base
    X, y = _dataset(tmp_path, n=50)
    assert main(["shard", str(tmp_path / "d.npz"), uri, "--shards", "3"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == list_shards(uri) == [f"{uri}/part-{i:05d}.parquet" for i in range(3)]
    parts = [read_shard(u, i) for i, u in enumerate(printed)]
    np.testing.assert_array_equal(np.concatenate([p.features for p in parts]), X)
    np.testing.assert_array_equal(np.concatenate([p.labels for p in parts]), y)


# ------------------------------------------------------------------ a job reading HDFS


def test_local_job_trains_on_shards_read_from_hdfs(hdfs, base, tmp_path, monkeypatch):
    """Master and worker processes read their shards from hdfs:// and get exactly what
    running the same shards one after the other gives."""
    from conftest_runtime import SOFTMAX, blobs, records, run_job, simulate, subprocess_env

    subprocess_env(monkeypatch)
    uri, _ = base
    X, y = blobs(300, d=6, k=3, seed=4)
    shards = write_shards(X, y, uri, 2)
    config = {"n_classes": 3, "epochs": 3, "batch_size": 0, "local_steps": 1, "learning_rate": 0.5}
    out = run_job(program=SOFTMAX, program_config=config, shards=uri, workers=2, output=str(tmp_path / "out"))
    assert [r["step"] for r in records(out)] == [0, 1, 2]
    assert all(r["samples"] == 300 and r["shards"] == 2 for r in records(out))
    with np.load(out / "parameters.npz") as npz:
        result = {k: npz[k] for k in npz.files}
    expected = simulate(SOFTMAX, config, shards)
    for k in expected:
        np.testing.assert_allclose(result[k], expected[k], rtol=1e-6, atol=1e-7)


def test_upload_outputs_copies_the_masters_files_to_hdfs(hdfs, base, tmp_path):
    from iterreduce.launch.yarn.container import upload_outputs

    uri, path = base
    (tmp_path / "model.npz").write_bytes(b"\x00model" * 1000)
    (tmp_path / "log.jsonl").write_text('{"step": 0}\n')
    (tmp_path / ".hidden").write_text("not uploaded")
    (tmp_path / "logs").mkdir()
    written = upload_outputs(tmp_path, f"{uri}/out")
    assert written == [f"{uri}/out/log.jsonl", f"{uri}/out/model.npz"]
    assert names_on_hdfs(hdfs, f"{path}/out") == ["log.jsonl", "model.npz"]
    with hdfs.fs().open_input_file(f"{path}/out/model.npz") as f:
        assert f.read() == b"\x00model" * 1000
    (tmp_path / "model.npz").write_bytes(b"second attempt")  # a later attempt's upload replaces
    upload_outputs(tmp_path, f"{uri}/out")
    with hdfs.fs().open_input_file(f"{path}/out/model.npz") as f:
        assert f.read() == b"second attempt"


def test_outputs_named_like_compressed_files_land_byte_for_byte(hdfs, base, tmp_path):
    """pyarrow's streams compress or decompress by the file name's extension unless told not to:
    an output named *.gz (or .bz2, .zst, ...) must reach HDFS exactly as written, as other
    Hadoop tools (``hdfs dfs -get``, YARN's localizer) read it."""
    from iterreduce.launch.yarn.container import upload_outputs

    uri, path = base
    payload = {"embeddings.csv.gz": b"\x1f\x8b" + bytes(range(256)) * 4, "notes.bz2": b"BZh9 not really",
               "table.zst": b"plain bytes"}
    for name, data in payload.items():
        (tmp_path / name).write_bytes(data)
    upload_outputs(tmp_path, f"{uri}/out")
    raw = hdfs.fsspec()  # hdfs-native directly: no pyarrow stream in between
    for name, data in payload.items():
        assert raw.cat_file(f"{path}/out/{name}") == data, name


def test_string_labels_keep_their_classes_on_hdfs(hdfs, base, tmp_path):
    """The classes of string labels travel in each shard's Parquet metadata (test_string_labels.py)."""
    from dbn.data.sharding import shard_dataset
    from shardio.readers import shard_classes, shard_info

    uri, _ = base
    X, y = _dataset(tmp_path)
    names = np.array(["cat", "cow", "dog"])
    np.savez(tmp_path / "named.npz", X=X, y=names[y])
    written = shard_dataset(str(tmp_path / "named.npz"), uri, 2)
    assert shard_classes(shard_info(written)).classes == tuple(names)
    parts = [read_shard(u, i, n_features=24, need_labels=True) for i, u in enumerate(written)]
    np.testing.assert_array_equal(np.concatenate([p.labels for p in parts]), y)


# ------------------------------------------- atomic, durable replacement on HDFS (issue 36, items 4-5)


def test_an_interrupted_upload_leaves_the_earlier_model_whole(hdfs, base, tmp_path, monkeypatch):
    """A master that fails while copying its outputs (an error, a crash) leaves the earlier
    attempt's model.npz on HDFS byte for byte, and no partial file. Before, the upload wrote in
    place: the model was truncated to what had been copied."""
    import iterreduce.launch.yarn.container as container

    uri, path = base
    earlier = np.random.default_rng(0).bytes(300_000)
    (tmp_path / "model.npz").write_bytes(earlier)
    container.upload_outputs(tmp_path, f"{uri}/out")
    (tmp_path / "model.npz").write_bytes(b"\x01" * 300_000)

    import hdfs_native

    real_write = hdfs_native.FileWriter.write

    def a_third_then_crash(self, buf):
        real_write(self, bytes(buf)[:100_000])
        raise RuntimeError("the container was killed mid-copy")

    monkeypatch.setattr(hdfs_native.FileWriter, "write", a_third_then_crash)
    with pytest.raises(RuntimeError, match="mid-copy"):
        container.upload_outputs(tmp_path, f"{uri}/out")
    assert hdfs.fsspec().cat_file(f"{path}/out/model.npz") == earlier
    assert names_on_hdfs(hdfs, f"{path}/out") == ["model.npz"]


def test_a_reader_on_hdfs_never_finds_a_replaced_file_missing_or_partial(hdfs, base):
    """One thread replaces model.npz on HDFS again and again (the NameNode's rename with
    OVERWRITE); another reads it all the while: every read finds a whole file. Before, the old
    file was deleted and then the new one renamed in: a reader could find neither."""
    import threading

    uri, path = base
    target = f"{uri}/out/model.npz"

    def content(i: int) -> bytes:
        return bytes([i % 251]) * (50_000 + 17 * i)

    with open_output_file(target) as stream:
        stream.write(content(0))
    fs, done, problems, reads = hdfs.fsspec(), threading.Event(), [], [0]

    def reader():
        while not done.is_set():
            try:
                data = fs.cat_file(f"{path}/out/model.npz")
                if data != content((len(data) - 50_000) // 17):
                    problems.append(f"partial or mixed: {len(data)} bytes")
                reads[0] += 1
            except Exception as exc:  # noqa: BLE001 - recorded: any is a failure
                problems.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(1, 30):
            with open_output_file(target) as stream:
                stream.write(content(i))
    finally:
        done.set()
        thread.join()
    assert problems == [], (len(problems), reads[0], problems[:5])
    assert reads[0] > 10
    assert names_on_hdfs(hdfs, f"{path}/out") == ["model.npz"]


def test_a_checkpoint_on_hdfs_is_hsynced_before_it_is_renamed_in(hdfs, base, monkeypatch):
    """The bytes of a file written through hdfs-native are on disk on every datanode of the
    pipeline (hsync) before the rename makes them the file."""
    import hdfs_native

    uri, _ = base
    order, real_hsync = [], hdfs_native.FileWriter.hsync

    def hsync(self):
        order.append("hsync")
        return real_hsync(self)

    monkeypatch.setattr(hdfs_native.FileWriter, "hsync", hsync)
    real_rename = hdfs_native.Client.rename

    def rename(self, src, dst, overwrite=False):
        order.append(("rename", dst.rsplit("/", 1)[-1], overwrite))
        return real_rename(self, src, dst, overwrite)

    monkeypatch.setattr(hdfs_native.Client, "rename", rename)
    checkpoint.save(f"{uri}/ck", 1, {"fingerprint": "f"}, {"a": np.zeros(3)})
    assert order == ["hsync", ("rename", "ckpt-000000001.npz", True)]


# ------------------------------------------------------------------ ownership of folders on HDFS (issue 36)

SPARK_FILES = {"part-00000-7c1e-4b2a-c000.snappy.parquet": b"PAR1 spark rows 0" * 50,
               "part-00001-7c1e-4b2a-c000.snappy.parquet": b"PAR1 spark rows 1" * 70, "_SUCCESS": b""}


def _plant(hdfs, path: str, files: dict[str, bytes]) -> None:
    fs = hdfs.fs()
    for name, data in files.items():
        fs.create_dir(f"{path}/{name}".rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(f"{path}/{name}", compression=None) as f:
            f.write(data)


def _contents(hdfs, path: str) -> dict[str, bytes]:
    fs = hdfs.fs()
    found = {}
    for e in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        if e.is_file:
            with fs.open_input_stream(e.path, compression=None) as f:
                found[e.path.split(path, 1)[1].lstrip("/")] = f.read()
    return found


def test_dbn_shard_on_hdfs_refuses_a_spark_folder_untouched(hdfs, base, tmp_path, capsys):
    """The issue's probe on HDFS (where a delete skips the trash): a Spark output folder is
    refused by `dbn shard`, every file byte-identical and nothing added."""
    from dbn.cli import main

    uri, path = base
    _plant(hdfs, path, SPARK_FILES)
    _dataset(tmp_path, n=50)
    assert main(["shard", str(tmp_path / "d.npz"), uri, "--shards", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dbn: error: ") and uri in err and any(f"holds {name}," in err for name in SPARK_FILES)
    assert _contents(hdfs, path) == SPARK_FILES


def test_shards_on_hdfs_replace_only_the_set_their_manifest_lists(hdfs, base):
    from iterreduce.exceptions import ForeignFileError

    uri, path = base
    X = np.random.default_rng(0).random((40, 5), dtype=np.float32)
    write_shards(X, None, uri, 4)
    write_shards(X, None, uri, 2)
    assert names_on_hdfs(hdfs, path) == [MANIFEST_NAME, "part-00000.parquet", "part-00001.parquet"]
    _plant(hdfs, path, {"_SUCCESS": b""})
    before = _contents(hdfs, path)
    with pytest.raises(ForeignFileError, match="_SUCCESS"):
        write_shards(X, None, uri, 3)
    assert _contents(hdfs, path) == before


def test_hdfs_create_if_absent_is_exclusive_and_the_lock_names_its_holder(hdfs, base):
    from iterreduce.storage import ownership
    from iterreduce.exceptions import OutputBusy
    from iterreduce.storage.filesystems import filesystem

    uri, path = base
    fs, _ = filesystem(uri)
    assert ownership.create_exclusive(fs, f"{path}/x", b"first")
    assert not ownership.create_exclusive(fs, f"{path}/x", b"second")
    assert _contents(hdfs, path) == {"x": b"first"}

    lock = ownership.acquire_remote(fs, path, uri, running=lambda held: None)
    lock.name_holder(app_id="application_1_0001")
    asked = []

    def running(held):
        asked.append(held)
        return f"application {held['app_id']} is RUNNING"

    with pytest.raises(OutputBusy, match=f"{uri}: another job is writing.*application_1_0001 is RUNNING"):
        ownership.acquire_remote(fs, path, uri, running=running)
    assert asked[0]["app_id"] == "application_1_0001"
    second = ownership.acquire_remote(fs, path, uri, running=lambda held: None)  # the holder ended: replaced
    lock.release()  # no longer the first's lock: left alone
    assert fs.get_file_info(f"{path}/{ownership.LOCK_NAME}").is_file
    second.release()
    assert fs.get_file_info(f"{path}/{ownership.LOCK_NAME}").type == pafs.FileType.NotFound


def test_a_submission_guards_its_hdfs_output_folder_like_a_local_one(hdfs, base, tmp_path):
    """dbn submit's claim of [output] dir (before anything is staged): a file no submission
    claimed is refused untouched; another job's run is refused unless --overwrite, then kept in
    previous/N (nothing deleted); a folder whose job still runs is refused."""
    from dbn.errors import UsageError
    from dbn.jobs.spec import load_spec
    from dbn.jobs.yarn import claim_remote_output
    from iterreduce.exceptions import ForeignFileError, OutputBusy

    uri, path = base
    config = tmp_path / "job.toml"
    config.write_text("[model]\nhidden_layers = [8]\n[cluster]\nworkers = 2\n")
    spec = load_spec(config, {"output.dir": uri})
    gone = lambda held: None  # noqa: E731 - every earlier holder has ended

    _plant(hdfs, path, {"model.npz": b"someone's model", "notes.txt": b"mine"})
    with pytest.raises(ForeignFileError, match="model.npz"):
        claim_remote_output(spec, running=gone, overwrite=True)
    assert _contents(hdfs, path) == {"model.npz": b"someone's model", "notes.txt": b"mine"}  # no lock left either
    hdfs.fs().delete_file(f"{path}/model.npz")

    lock = claim_remote_output(spec, running=gone)
    _plant(hdfs, path, {"model.npz": b"job A's model", "checkpoints/ckpt-000000001.npz": b"A"})  # as the job writes
    with pytest.raises(OutputBusy, match="application_1_0001 is RUNNING"):
        lock.name_holder(app_id="application_1_0001")
        claim_remote_output(spec, running=lambda held: f"application {held['app_id']} is RUNNING")
    other = load_spec(config, {"output.dir": uri, "model.hidden_layers": [12]})
    with pytest.raises(UsageError, match="holds a run of another job.*hidden_layers"):
        claim_remote_output(other, running=gone)
    claim_remote_output(other, running=gone, overwrite=True).release()
    found = _contents(hdfs, path)
    assert found["notes.txt"] == b"mine"
    assert found["previous/1/model.npz"] == b"job A's model"
    assert found["previous/1/checkpoints/ckpt-000000001.npz"] == b"A"
    assert "model.npz" not in found and b"[12]" in found["config.json"].replace(b" ", b"").replace(b"\n", b"")


def test_predict_out_on_hdfs_refuses_an_existing_file_untouched(hdfs, base, tmp_path, capsys):
    """`dbn predict`/`dbn transform --out hdfs://...` naming a Spark table's part file (or a
    user's CSV): refused before anything is computed, exit 2, every file of the folder byte for
    byte as it was; `--overwrite` replaces it; a fresh path is written; a file put there while
    the predictions are written is left as it is (the NameNode's rename without OVERWRITE)."""
    import pyarrow.csv as pacsv

    from dbn.cli import main
    from dbn.model.estimator import DBN
    from iterreduce.exceptions import OutputExists

    uri, path = base
    planted = {**SPARK_FILES, "scores.csv": b"id,score\n1,0.25\n"}
    _plant(hdfs, path, planted)
    X, y = _dataset(tmp_path)
    DBN(hidden_layers=[4], pretrain_epochs=1, finetune_epochs=1, device="cpu", pretrain_batch_size=9,
        finetune_batch_size=9).fit(X, y).save(tmp_path / "model.npz")
    (tmp_path / "job.toml").write_text(f"[data]\ntrain = '{tmp_path / 'd.npz'}'\n")
    model, job = str(tmp_path / "model.npz"), str(tmp_path / "job.toml")
    for name in ("part-00000-7c1e-4b2a-c000.snappy.parquet", "scores.csv"):
        for command in ("predict", "transform"):
            assert main([command, model, job, "--out", f"{uri}/{name}", "--device", "cpu"]) == 2
            assert capsys.readouterr().err == (f"dbn: error: {uri}/{name}: already exists; pass --overwrite to "
                                               f"replace it, or choose another --out\n")
    assert _contents(hdfs, path) == planted

    assert main(["predict", model, job, "--out", f"{uri}/scores.csv", "--device", "cpu", "--overwrite"]) == 0
    assert main(["transform", model, job, "--out", f"{uri}/new/features.parquet", "--device", "cpu"]) == 0
    found = _contents(hdfs, path)
    assert pacsv.read_csv(pa.BufferReader(found.pop("scores.csv"))).num_rows == len(X)
    assert pq.read_table(pa.BufferReader(found.pop("new/features.parquet"))).num_rows == len(X)
    assert found == SPARK_FILES

    before = _contents(hdfs, path)
    with pytest.raises(OutputExists, match="appeared while this file was written"):
        with open_output_file(f"{uri}/late.parquet", overwrite=False) as stream:
            stream.write(b"our predictions")
            _plant(hdfs, path, {"late.parquet": b"theirs"})
    assert _contents(hdfs, path) == {**before, "late.parquet": b"theirs"}  # and no partial file


def test_an_iceberg_table_on_hdfs_trains_on_its_current_and_first_snapshot(hdfs, base, tmp_path):
    """Issue 39, part 3: the table's metadata, manifests and data files all read from HDFS through
    the project's own file system (no libhdfs), the current snapshot and the first."""
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    import json

    from dbn.cli import main
    from test_iceberg import job, write_on_hdfs

    uri, path = base
    table = write_on_hdfs(hdfs, tmp_path, path)
    assert table.location().startswith("hdfs://")
    for version, expected in ((None, table.scan().to_arrow().num_rows),
                              (table.snapshots()[0].snapshot_id, 300)):
        out = tmp_path / f"run-{version}"
        out.mkdir()
        spec = job(out, table.location(), f"version = {version}" if version else "")
        assert main(["train", str(spec), "--quiet", "--no-ui"]) == 0
        assert json.loads((out / "out" / "result.json").read_text())["n_train"] == expected
