"""Parquet shards: write/list/read round trips, URIs, and errors that name the file."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from iterreduce.exceptions import ShardError
from shardio.readers import list_shards, read_shard
from shardio.shards import write_shards


def fixed_list(values: np.ndarray, width: int, type_=None):
    flat = pa.array(values.reshape(-1), type=type_)
    return pa.FixedSizeListArray.from_arrays(flat, width)


def write_table(path, **columns):
    pq.write_table(pa.table(columns), str(path))
    return str(path)


# ------------------------------------------------------------------ round trips


def test_uint8_round_trip_is_scaled_to_unit_interval(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(103, 12), dtype=np.uint8)
    X[0, :3] = [0, 255, 128]
    y = rng.integers(0, 10, size=103)
    written = write_shards(X, y, str(tmp_path / "d"), 4)
    assert written == list_shards(str(tmp_path / "d"))
    assert [p.rsplit("/", 1)[1] for p in written] == [f"part-{i:05d}.parquet" for i in range(4)]
    # The parquet column keeps the compact uint8 type.
    assert pq.read_schema(written[0]).field("features").type == pa.list_(pa.uint8(), 12)

    shards = [read_shard(uri, i) for i, uri in enumerate(written)]
    assert [s.rows for s in shards] == [26, 26, 26, 25]  # near-equal, in order
    assert [s.index for s in shards] == [0, 1, 2, 3]
    features = np.concatenate([s.features for s in shards])
    labels = np.concatenate([s.labels for s in shards])
    assert features.dtype == np.float32 and labels.dtype == np.int64
    np.testing.assert_array_equal(features, X.astype(np.float32) / np.float32(255))
    assert features.min() == 0.0 and features.max() == 1.0
    assert features[0, 2] == pytest.approx(128 / 255)
    np.testing.assert_array_equal(labels, y)


def test_float32_round_trip_without_labels(tmp_path):
    X = np.random.default_rng(1).standard_normal((50, 7)).astype(np.float32) * 100
    written = write_shards(X, None, str(tmp_path), 3)
    shards = [read_shard(uri, i, n_features=7) for i, uri in enumerate(written)]
    np.testing.assert_array_equal(np.concatenate([s.features for s in shards]), X)  # not rescaled
    assert all(s.labels is None for s in shards)


def test_float64_input_is_stored_as_float32(tmp_path):
    X = np.linspace(0, 1, 20).reshape(10, 2)
    (uri,) = write_shards(X, np.arange(10), str(tmp_path), 1)
    assert pq.read_schema(uri).field("features").type.value_type == pa.float32()
    np.testing.assert_allclose(read_shard(uri).features, X, rtol=1e-7)


def test_file_uris_and_plain_paths_read_the_same(tmp_path):
    X = np.arange(60, dtype=np.float32).reshape(20, 3)
    y = np.arange(20) % 2
    uri = f"file://{tmp_path}/shards"
    written = write_shards(X, y, uri, 2)
    assert all(w.startswith(f"file://{tmp_path}/shards/part-") for w in written)
    assert (tmp_path / "shards" / "part-00001.parquet").is_file()
    assert list_shards(uri) == written
    plain = list_shards(str(tmp_path / "shards"))
    assert plain == [str(tmp_path / "shards" / f"part-0000{i}.parquet") for i in range(2)]
    for a, b in zip(written, plain):
        sa, sb = read_shard(a, 5), read_shard(b, 5)
        np.testing.assert_array_equal(sa.features, sb.features)
        np.testing.assert_array_equal(sa.labels, sb.labels)
        assert sa.uri == a and sa.index == 5
    # A file URI (or path) given instead of a directory lists just that file.
    assert list_shards(written[1]) == [written[1]]
    assert list_shards(plain[0]) == [plain[0]]


def test_list_shards_ignores_other_files_and_sorts(tmp_path):
    X = np.ones((6, 2), np.float32)
    write_shards(X, None, str(tmp_path), 3, prefix="b")
    write_shards(X[:2], None, str(tmp_path), 1, prefix="a")
    (tmp_path / "README.txt").write_text("not a shard")
    (tmp_path / "sub.parquet").mkdir()  # a directory, even with the suffix, is no shard
    names = [u.rsplit("/", 1)[1] for u in list_shards(str(tmp_path))]
    assert names == ["a-00000.parquet", "b-00000.parquet", "b-00001.parquet", "b-00002.parquet"]


def test_variable_length_list_features_are_read(tmp_path):
    uri = write_table(tmp_path / "l.parquet",
                      features=pa.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], type=pa.list_(pa.float32())),
                      label=pa.array([0, 1, 0], type=pa.int32()))
    shard = read_shard(uri, n_features=2, need_labels=True)
    np.testing.assert_array_equal(shard.features, np.arange(6, dtype=np.float32).reshape(3, 2))
    assert shard.labels.dtype == np.int64 and shard.labels.tolist() == [0, 1, 0]


def test_write_shards_refuses_bad_input(tmp_path):
    with pytest.raises(ShardError, match="2-D"):
        write_shards(np.zeros(5, np.float32), None, str(tmp_path), 1)
    with pytest.raises(ShardError, match="non-empty"):
        write_shards(np.zeros((0, 3), np.float32), None, str(tmp_path), 1)
    with pytest.raises(ShardError, match="cannot cut 3 rows into 4 shards"):
        write_shards(np.zeros((3, 2), np.float32), None, str(tmp_path), 4)


# ---------------------------------------------------------------------- errors


def test_missing_file(tmp_path):
    uri = str(tmp_path / "nope.parquet")
    with pytest.raises(ShardError, match="nope.parquet: shard not found"):
        read_shard(uri)
    with pytest.raises(ShardError, match="nope.parquet: no such"):
        list_shards(uri)
    with pytest.raises(ShardError, match="nope.parquet"):
        read_shard(f"file://{uri}")


def test_directory_without_parquet_files(tmp_path):
    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(ShardError, match=f"{tmp_path}: directory holds no .parquet"):
        list_shards(str(tmp_path))


def test_not_a_parquet_file(tmp_path):
    bad = tmp_path / "garbage.parquet"
    bad.write_bytes(b"this is not parquet at all" * 10)
    with pytest.raises(ShardError, match="garbage.parquet: not a readable Parquet file"):
        read_shard(str(bad))


def test_no_features_column(tmp_path):
    uri = write_table(tmp_path / "nofeat.parquet", pixels=fixed_list(np.zeros(6, np.float32), 3))
    with pytest.raises(ShardError, match=r"nofeat.parquet: no 'features' column \(columns: \['pixels'\]\)"):
        read_shard(uri)


@pytest.mark.parametrize("column,what", [
    (fixed_list(np.arange(6, dtype=np.int64), 3), "values must be float32 or uint8, got int64"),
    (pa.array([["a", "b"], ["c", "d"]]), "values must be float32 or uint8, got string"),
    (pa.array(["a", "b"]), "must be a list of float32 or uint8, got string"),
    (pa.array([1.0, 2.0], type=pa.float32()), "must be a list"),
])
def test_wrong_feature_value_type(tmp_path, column, what):
    uri = write_table(tmp_path / "typed.parquet", features=column)
    with pytest.raises(ShardError, match=f"typed.parquet: '?features'? {what}"):
        read_shard(uri)


def test_wrong_feature_count(tmp_path):
    (uri,) = write_shards(np.zeros((4, 5), np.float32), None, str(tmp_path), 1)
    assert read_shard(uri, n_features=5).features.shape == (4, 5)
    with pytest.raises(ShardError, match="part-00000.parquet: 5 features per row, expected 784"):
        read_shard(uri, n_features=784)


def test_rows_of_different_lengths(tmp_path):
    uri = write_table(tmp_path / "ragged.parquet",
                      features=pa.array([[0.0, 1.0], [2.0]], type=pa.list_(pa.float32())))
    with pytest.raises(ShardError, match="ragged.parquet: rows have different feature counts"):
        read_shard(uri)


def test_empty_shard(tmp_path):
    empty = pa.table({"features": pa.array([], type=pa.list_(pa.float32(), 4)),
                      "label": pa.array([], type=pa.int64())})
    pq.write_table(empty, str(tmp_path / "empty.parquet"))
    with pytest.raises(ShardError, match="empty.parquet: shard is empty"):
        read_shard(str(tmp_path / "empty.parquet"))


def test_null_feature_rows(tmp_path):
    uri = write_table(tmp_path / "nullrow.parquet",
                      features=pa.array([[0.0, 1.0], None], type=pa.list_(pa.float32(), 2)))
    with pytest.raises(ShardError, match="nullrow.parquet: 'features' has 1 null rows"):
        read_shard(uri)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_features(tmp_path, bad):
    X = np.ones((5, 3), np.float32)
    X[3, 1] = bad
    (uri,) = write_shards(X, None, str(tmp_path), 1)
    with pytest.raises(ShardError, match=r"part-00000.parquet: 'features' contains NaN or infinite values \(1, nulls included\), "
                                         r"the first at row 3, column 1$"):
        read_shard(uri)


def test_null_value_inside_a_feature_row(tmp_path):
    uri = write_table(tmp_path / "nullval.parquet",
                      features=pa.array([[0.0, None], [1.0, 2.0]], type=pa.list_(pa.float32(), 2)))
    with pytest.raises(ShardError, match="nullval.parquet"):
        read_shard(uri)


def test_nullable_label_with_nulls(tmp_path):
    uri = write_table(tmp_path / "nulllabel.parquet",
                      features=fixed_list(np.zeros(6, np.float32), 2),
                      label=pa.array([1, None, 2], type=pa.int64()))
    with pytest.raises(ShardError, match="nulllabel.parquet: 'label' has 1 nulls"):
        read_shard(uri)


def test_nullable_label_without_nulls_is_fine(tmp_path):
    uri = write_table(tmp_path / "ok.parquet", features=fixed_list(np.zeros(6, np.float32), 2),
                      label=pa.array([1, 0, 2], type=pa.int64()))
    assert read_shard(uri).labels.tolist() == [1, 0, 2]


def test_non_integer_labels(tmp_path):
    uri = write_table(tmp_path / "flabel.parquet", features=fixed_list(np.zeros(4, np.float32), 2),
                      label=pa.array([0.5, 1.0]))
    with pytest.raises(ShardError, match="flabel.parquet: 'label' must be an integer column, got double"):
        read_shard(uri)


def test_labels_needed_but_absent(tmp_path):
    (uri,) = write_shards(np.zeros((4, 2), np.float32), None, str(tmp_path), 1)
    assert read_shard(uri).labels is None  # fine when the job does not need them
    with pytest.raises(ShardError, match="part-00000.parquet: no 'label' column, but this job needs labels"):
        read_shard(uri, need_labels=True)


def test_rewriting_into_fewer_shards_leaves_no_stale_shard(tmp_path):
    X = np.random.default_rng(0).random((40, 4), dtype=np.float32)
    write_shards(X, None, str(tmp_path / "s"), 4)
    written = write_shards(X, None, str(tmp_path / "s"), 2)
    assert list_shards(str(tmp_path / "s")) == written and len(written) == 2


def test_the_footer_reader_process_ends_with_the_process_that_started_it(tmp_path):
    """shard_info reads footers in a helper process; a master killed with SIGKILL must not
    leave it behind."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    (uri,) = write_shards(np.ones((4, 3), np.float32), None, str(tmp_path), 1)
    script = ("import sys, time\nfrom shardio import readers as shards\nshards.shard_info([sys.argv[1]])\n"
              "print(shards._footer_reader.process.pid, flush=True)\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", script, uri], stdout=subprocess.PIPE, text=True, env=env)
    (helper,) = (int(pid) for pid in proc.stdout.readline().split())
    os.kill(helper, 0)  # alive while its parent is
    proc.kill()  # SIGKILL: no atexit handler shuts the helper down
    proc.wait()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{helper}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{helper}").exists(), "the footer reader outlived its parent"


def test_a_process_tree_killed_leaves_nothing_in_dev_shm(tmp_path):
    """A YARN container's end kills its whole process tree with SIGKILL: the footer reader (once a
    multiprocessing pool, whose named semaphores then stayed in /dev/shm) leaves nothing there. The
    tree's own files are those its processes hold open or mapped when it is killed (others in
    /dev/shm are other jobs', not this test's to judge)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    (uri,) = write_shards(np.ones((4, 3), np.float32), None, str(tmp_path), 1)
    script = ("import sys, time\nfrom shardio import readers\nreaders.shard_info([sys.argv[1]])\n"
              "print('read', flush=True)\ntime.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", script, uri], stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "read"
    tree = process_group(proc.pid)
    assert proc.pid in tree and len(tree) >= 2  # the script and its footer reader
    held = {path for pid in tree for path in dev_shm_files_held(pid)}
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    assert [path for path in held if os.path.lexists(path)] == []


def process_group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def dev_shm_files_held(pid: int) -> set[str]:
    """The paths under /dev/shm that process ``pid`` has open or mapped (and that still have a name)."""
    import os
    from pathlib import Path

    paths = set()
    try:
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6:
                paths.add(parts[5])
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                paths.add(os.readlink(fd))
            except OSError:
                pass
    except OSError:
        pass
    return {path for path in paths if path.startswith("/dev/shm/") and not path.endswith(" (deleted)")}


def test_a_footer_that_ends_the_reader_is_an_error_naming_the_shard(tmp_path, monkeypatch):
    """pyarrow ends the process reading some corrupt footers (std::terminate): the caller gets an
    error naming the shard, and the next call a new helper."""
    import subprocess
    import sys

    from shardio import footers, readers

    (uri,) = write_shards(np.ones((4, 3), np.float32), None, str(tmp_path), 1)
    reader = footers.FooterReader("shardio.readers")
    real_start = footers._start
    monkeypatch.setattr(footers, "_start", lambda module: subprocess.Popen(  # reads the request, then dies as pyarrow does
        [sys.executable, "-c", "import os, sys; sys.stdin.buffer.read(8); os.abort()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
    with pytest.raises(ShardError, match=f"{uri}: not a readable Parquet file"):
        reader.describe(uri, ())
    assert reader.process is None
    monkeypatch.setattr(footers, "_start", real_start)
    try:
        assert reader.describe(uri, ()) == readers.describe_shard(uri)
        with pytest.raises(ShardError, match="nowhere.parquet"):  # an error in the helper is raised here as it was
            reader.describe(str(tmp_path / "nowhere.parquet"), ())
    finally:
        reader.close()
