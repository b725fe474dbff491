"""Tensors through shared memory between processes of one host (issue 42, iterreduce.transport.sharedmem):
the same bits as gRPC's bytes, references checked before anything is read, and nothing left
behind but what is not the run's."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from conftest_runtime import (SLOW_SOFTMAX, SOFTMAX, InProcessJob, blobs, events, kill_master, kill_worker, load_npz,
                              run_job, simulate, subprocess_env)
from iterreduce.exceptions import MasterKilled, WireError
from iterreduce.master.broadcast import SHARED_VALUES_KEPT, Broadcast
from iterreduce.proto import iterreduce_pb2 as pb
from iterreduce.transport import sharedmem, wire
from iterreduce.transport.sharedmem import SharedFolder
from shardio.shards import write_shards

pytestmark = pytest.mark.skipif(not sharedmem.available(), reason="no /dev/shm on this host")


@pytest.fixture
def folder():
    path = sharedmem.make_folder()
    shared = SharedFolder(path)
    yield shared
    shared.close()
    sharedmem.remove_folder(path)
    assert not os.path.exists(path)


@pytest.fixture
def made_folders(monkeypatch):
    """The (scratch, shared-memory) folders each local launcher of the test makes, as it makes them:
    the test's own jobs' folders, whatever other jobs run on the machine."""
    from iterreduce.process import jobfolders

    made, make = [], jobfolders.make
    monkeypatch.setattr(jobfolders, "make", lambda *args, **kwargs: made.append(make(*args, **kwargs)) or made[-1])
    return made


def left_behind(made) -> list[str]:
    """Those of the folders ``made`` that still exist."""
    return [path for folders in made for path in folders if path and os.path.lexists(path)]


# ------------------------------------------------------------------ the folder and its files


@pytest.mark.parametrize("array", [np.arange(12, dtype=np.float32).reshape(3, 4), np.float64(2.5) * np.ones(()),
                                   np.zeros((0, 7), np.int64), np.arange(5, dtype=np.uint8),
                                   np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3))])
def test_an_array_comes_back_bit_for_bit_and_the_file_goes(folder, array):
    name = folder.write(array)
    assert sharedmem.FILE_NAME.fullmatch(name)
    assert os.stat(os.path.join(folder.path, name)).st_mode & 0o777 == 0o600
    got = folder.read(name, array.dtype, array.shape, "t")
    assert got.dtype == array.dtype and got.shape == array.shape
    assert got.tobytes() == np.ascontiguousarray(array).tobytes()
    folder.remove([name])
    assert not os.path.exists(os.path.join(folder.path, name))
    assert got.tobytes() == np.ascontiguousarray(array).tobytes()  # held after the writer removed it


def test_an_array_read_is_this_processs_own(folder):
    """The reader may change its array (a program updating its parameters in place): the file,
    and every other reader's array, keep the bits the writer wrote."""
    array = np.arange(1000, dtype=np.float32)
    name = folder.write(array)
    first, second = (folder.read(name, array.dtype, array.shape, "t") for _ in range(2))
    assert first.flags.writeable
    first += 1
    assert second.tobytes() == array.tobytes()
    assert folder.read(name, array.dtype, array.shape, "t").tobytes() == array.tobytes()
    with open(os.path.join(folder.path, name), "rb") as f:
        assert f.read() == array.tobytes()


def test_a_reference_is_checked_before_anything_is_read(folder, tmp_path):
    name = folder.write(np.arange(10, dtype=np.float32))
    f32 = np.dtype(np.float32)
    for bad in ("../etc/passwd", "/etc/passwd", "x.bin", "0123abcd-1.bin/..", "0123ABCD-1.bin"):
        with pytest.raises(WireError, match="not one a run writes"):
            folder.read(bad, f32, (10,), "t")
    with pytest.raises(WireError, match="holds 40 bytes, not the 44"):  # a shape the file does not hold
        folder.read(name, f32, (11,), "t")
    with pytest.raises(WireError, match="holds 40 bytes, not the 80"):
        folder.read(name, np.dtype(np.float64), (10,), "t")
    with pytest.raises(WireError, match="No such file"):
        folder.read("0123abcd-7.bin", f32, (10,), "t")
    # A link in the folder is not followed, a folder is not a file.
    (tmp_path / "secret").write_bytes(b"\0" * 40)
    os.symlink(tmp_path / "secret", os.path.join(folder.path, "0123abcd-8.bin"))
    with pytest.raises(WireError, match="0123abcd-8.bin"):
        folder.read("0123abcd-8.bin", f32, (10,), "t")
    os.mkdir(os.path.join(folder.path, "0123abcd-9.bin"))
    with pytest.raises(WireError, match="0123abcd-9.bin"):
        folder.read("0123abcd-9.bin", f32, (0,), "t")
    os.unlink(os.path.join(folder.path, "0123abcd-8.bin"))
    os.rmdir(os.path.join(folder.path, "0123abcd-9.bin"))


def test_a_folder_others_may_enter_is_refused(tmp_path):
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    os.chmod(open_folder, 0o755)
    with pytest.raises(WireError, match="not a directory of this user's alone"):
        SharedFolder(str(open_folder))
    os.symlink(sharedmem.make_folder(), tmp_path / "link")
    try:
        with pytest.raises(WireError, match="not a directory"):
            SharedFolder(str(tmp_path / "link"))
    finally:
        sharedmem.remove_folder(os.readlink(tmp_path / "link"))


def test_only_the_runs_own_names_are_removed(folder, tmp_path):
    other = SharedFolder(folder.path)  # another process of the run
    mine, theirs = folder.write(np.ones(3)), other.write(np.ones(3))
    folder.remove([theirs, mine])  # a name another process wrote is not this one's to delete
    assert not os.path.exists(os.path.join(folder.path, mine))
    assert os.path.exists(os.path.join(folder.path, theirs))
    other.close()
    assert os.listdir(folder.path) == []
    # The launcher's removal: the run's names and the folder; a foreign file keeps both.
    path = sharedmem.make_folder()
    SharedFolder(path).write(np.ones(2))
    Path(path, "notes.txt").write_text("a user's")
    sharedmem.remove_folder(path)
    assert os.listdir(path) == ["notes.txt"]
    os.unlink(os.path.join(path, "notes.txt"))
    sharedmem.remove_folder(path)
    assert not os.path.exists(path)


# ------------------------------------------------------------------ on the wire


@pytest.mark.parametrize("float16", [False, True])
def test_a_shared_chunk_decodes_to_what_the_bytes_give(folder, float16):
    arrays = {"w": np.linspace(-3, 3, 1 << 19, dtype=np.float32).reshape(512, 1024), "b": np.arange(4.0)}
    through_bytes = wire.decode(wire.encode(arrays, float16=float16))
    chunks = list(wire.encode(arrays, float16=float16, shared=folder))
    assert len(chunks) == 2 and all(c.shared_file and not c.data for c in chunks)  # one reference a tensor
    assert sum(c.ByteSize() for c in chunks) < 200
    through_files = wire.decode(chunks, shared=folder)
    for name in arrays:
        assert through_files[name].dtype == through_bytes[name].dtype
        assert through_files[name].tobytes() == through_bytes[name].tobytes()


def test_the_decoder_refuses_a_shared_chunk_it_cannot_trust(folder):
    name = folder.write(np.ones(4, np.float32))
    good = dict(name="t", dtype="float32", shape=[4], last=True, shared_file=name)
    with pytest.raises(WireError, match="shares no folder"):
        wire.decode([pb.TensorChunk(**good)])
    for extra in ({"data": b"\0" * 16}, {"offset": 16}, {"last": False}):
        with pytest.raises(WireError, match="must be the whole tensor"):
            wire.decode([pb.TensorChunk(**{**good, **extra})], shared=folder)
    with pytest.raises(WireError, match="dtype 'object' not allowed"):
        wire.decode([pb.TensorChunk(**{**good, "dtype": "object"})], shared=folder)
    with pytest.raises(WireError, match="sent twice"):
        wire.decode([pb.TensorChunk(**good), pb.TensorChunk(**good)], shared=folder)


def test_the_broadcast_writes_a_value_once_and_keeps_the_last_two(folder):
    broadcast = Broadcast(float16=False, shared=folder)
    values = [np.full((3, 4), i, dtype=np.float32) for i in range(4)]
    files = []
    for version, value in enumerate(values):
        first = broadcast.encoded("w", value, version, shared=True)
        assert broadcast.encoded("w", value, version, shared=True) is first  # every worker's task: one file
        (chunk,) = [c for raw in first for c in pb.TaskChunk.FromString(raw).tensors]
        assert wire.decode([chunk], shared=folder)["w"].tobytes() == value.tobytes()
        files.append(chunk.shared_file)
    assert sorted(os.listdir(folder.path)) == sorted(files[-SHARED_VALUES_KEPT:])
    # A worker of no shared folder is sent the bytes, cached apart.
    (chunk,) = [c for raw in broadcast.encoded("w", values[-1], 3) for c in pb.TaskChunk.FromString(raw).tensors]
    assert not chunk.shared_file and chunk.data == values[-1].tobytes()


# ------------------------------------------------------------------ in a job


@pytest.fixture
def uris(tmp_path):
    X, y = blobs(300, d=6, k=3, seed=2)
    return write_shards(X, y, str(tmp_path / "shards"), 3)


@pytest.mark.parametrize("float16", [False, True])
def test_a_job_through_shared_memory_is_the_job_through_grpc(tmp_path, uris, monkeypatch, float16):
    """Master and workers in this process, given a folder: every parameter and update goes
    through its files, and the model is the one gRPC's bytes give, bit for bit."""
    config = {"n_classes": 3, "epochs": 3, "batch_size": 25}
    plain = InProcessJob(tmp_path / "plain", uris, workers=2, program_config=config, float16_wire=float16)
    plain.run_to_end("worker-0", "worker-1")
    path = sharedmem.make_folder()
    monkeypatch.setenv(sharedmem.SHARED_DIR_VAR, path)
    reads = []
    original = SharedFolder.read
    monkeypatch.setattr(SharedFolder, "read", lambda self, *a: reads.append(a[0]) or original(self, *a))
    try:
        job = InProcessJob(tmp_path / "shared", uris, workers=2, program_config=config, float16_wire=float16)
        job.run_to_end("worker-0", "worker-1")
        assert all(w.shared for w in job.master.members.workers.values())
        assert all(e["shared_memory"] for e in events(job.output, "worker_registered"))
        # The workers read the parameters, the master the updates: every step, both ways.
        assert len(reads) >= 2 * 3 * 2
        # What is left is the master's newest values alone (the workers removed their pushes).
        left = os.listdir(path)
        assert left and {n.split("-")[0] for n in left} == {job.master.shared._prefix}
    finally:
        sharedmem.remove_folder(path)
    a, b = load_npz(plain.output / "parameters.npz"), load_npz(job.output / "parameters.npz")
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
    if not float16:
        expected = simulate(SOFTMAX, config, uris)
        for name in expected:
            assert b[name].tobytes() == expected[name].tobytes(), name


@pytest.mark.parametrize("failing", ["every", "every other"])
def test_a_full_folder_sends_the_bytes_instead(tmp_path, uris, monkeypatch, failing):
    """/dev/shm is 64 MB in a default Docker container: a tensor that does not fit goes through
    gRPC (a big one in chunks, never in one oversized message), and the job is the same."""
    config = {"n_classes": 3, "epochs": 3, "batch_size": 25}
    path = sharedmem.make_folder()
    monkeypatch.setenv(sharedmem.SHARED_DIR_VAR, path)
    calls = []
    original = SharedFolder.write

    def write(self, array):
        calls.append(1)
        if failing == "every" or len(calls) % 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(self, array)

    monkeypatch.setattr(SharedFolder, "write", write)
    try:
        job = InProcessJob(tmp_path / "out", uris, workers=2, program_config=config)
        job.run_to_end("worker-0", "worker-1")
        assert calls and all(w.shared for w in job.master.members.workers.values())
        if failing == "every":
            assert os.listdir(path) == []
    finally:
        sharedmem.remove_folder(path)
    got, expected = load_npz(job.output / "parameters.npz"), simulate(SOFTMAX, config, uris)
    for name in expected:
        assert got[name].tobytes() == expected[name].tobytes(), name


def test_a_failed_write_leaves_no_file(folder, monkeypatch):
    def fail(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: type("F", (), {
        "__enter__": lambda self: self, "__exit__": lambda self, *e: os.close(fd), "write": fail})())
    with pytest.raises(OSError, match="No space"):
        folder.write(np.ones(10))
    assert os.listdir(folder.path) == [] and not folder.written


def test_a_worker_given_another_folder_goes_through_grpc(tmp_path, uris, monkeypatch):
    mine, theirs = sharedmem.make_folder(), sharedmem.make_folder()
    monkeypatch.setenv(sharedmem.SHARED_DIR_VAR, mine)
    try:
        job = InProcessJob(tmp_path / "out", uris, workers=1, program_config={"n_classes": 3, "epochs": 2})
        monkeypatch.setenv(sharedmem.SHARED_DIR_VAR, theirs)  # the worker's environment names another folder
        job.run_to_end("worker-0")
        assert [e["shared_memory"] for e in events(job.output, "worker_registered")] == [False]
        assert os.listdir(theirs) == []
    finally:
        sharedmem.remove_folder(mine)
        sharedmem.remove_folder(theirs)


# ------------------------------------------------------------------ on the local mini-cluster


@pytest.fixture
def _env(monkeypatch):
    subprocess_env(monkeypatch)


def test_the_local_launcher_shares_memory_and_leaves_nothing(tmp_path, uris, _env, made_folders):
    config = {"n_classes": 3, "epochs": 4, "batch_size": 30}
    shared = run_job(program=SOFTMAX, program_config=config, shards=uris, workers=3, output=str(tmp_path / "shm"))
    plain = run_job(program=SOFTMAX, program_config=config, shards=uris, workers=3, output=str(tmp_path / "grpc"),
                    shared_memory=False)
    assert [e["shared_memory"] for e in events(shared, "worker_registered")] == [True] * 3
    assert [e["shared_memory"] for e in events(plain, "worker_registered")] == [False] * 3
    a, b = load_npz(shared / "parameters.npz"), load_npz(plain / "parameters.npz")
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name
    assert [shm is not None for _, shm in made_folders] == [True, False]
    assert left_behind(made_folders) == []  # the runs' folders are gone


def test_processes_killed_the_job_ends_and_the_folder_goes(tmp_path, uris, monkeypatch, made_folders):
    """SIGKILL leaves a process's files behind: the launcher removes them with the folder, whether
    the job completes (a worker killed) or fails (the master killed)."""
    subprocess_env(monkeypatch, delay=0.2)
    config = {"n_classes": 3, "epochs": 8, "batch_size": 30}
    killed = []

    def kill_at_step_1(name):
        def on_record(record):
            if record.get("step") == 1 and "event" not in record and not killed:
                killed.append(kill_worker(tmp_path / name, "worker-1") if name == "w" else kill_master(tmp_path / name))
        return on_record

    out = run_job(program=SLOW_SOFTMAX, program_config=config, shards=uris, workers=3, output=str(tmp_path / "w"),
                  on_record=kill_at_step_1("w"), timeout=90)
    assert killed and (out / "parameters.npz").is_file() and events(out, "worker_lost")
    assert len(made_folders) == 1 and made_folders[0][1] and left_behind(made_folders) == []
    killed.clear()
    with pytest.raises(MasterKilled):
        run_job(program=SLOW_SOFTMAX, program_config=config, shards=uris, workers=3, output=str(tmp_path / "m"),
                on_record=kill_at_step_1("m"), timeout=90)
    assert killed and len(made_folders) == 2 and made_folders[1][1] and left_behind(made_folders) == []


def test_a_master_whose_launcher_died_removes_only_folders_the_launcher_made(tmp_path, monkeypatch):
    """The master removes what the environment names only where it is a folder as the launcher
    makes them (its prefix, a real 0700 folder of this user); a user's folders and files stay."""
    from iterreduce.process import jobfolders
    from iterreduce.storage.rowfile import LOCAL_DIR_VAR

    monkeypatch.setenv(LOCAL_DIR_VAR, str(tmp_path))  # jobfolders.make puts the scratch folder here
    scratch, shared = jobfolders.make(shared_memory=True)
    Path(scratch, "dbn-rows-x").mkdir()
    SharedFolder(shared).write(np.ones(3))
    users = tmp_path / "mine"
    users.mkdir()
    (users / "data.csv").write_text("a user's")
    (tmp_path / "notes.txt").write_text("beside it")
    open_named = tmp_path / (jobfolders.SCRATCH_PREFIX + "open")  # the launcher's name, not its folder
    open_named.mkdir()
    os.chmod(open_named, 0o755)
    link = tmp_path / (jobfolders.SCRATCH_PREFIX + "link")
    link.symlink_to(users)
    for named in (users, open_named, link):
        monkeypatch.setenv(LOCAL_DIR_VAR, str(named))
        monkeypatch.setenv(sharedmem.SHARED_DIR_VAR, str(named))
        jobfolders.remove_orphaned(settle_s=0)
    assert (users / "data.csv").read_text() == "a user's" and open_named.is_dir() and link.is_symlink()
    monkeypatch.setenv(LOCAL_DIR_VAR, scratch)
    monkeypatch.setenv(sharedmem.SHARED_DIR_VAR, shared)
    jobfolders.remove_orphaned(settle_s=0)
    assert not os.path.exists(scratch) and not os.path.exists(shared)
    assert (tmp_path / "notes.txt").read_text() == "beside it" and (users / "data.csv").exists()
