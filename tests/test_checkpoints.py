"""Checkpoints (iterreduce.master.checkpoint): saved, pruned and loaded round trip, the
background writer (one write at a time, retried, given up when hung, failures raised later), and
unreadable checkpoint files named."""

from __future__ import annotations

import time

import numpy as np
import pytest

from iterreduce.master import checkpoint


# ------------------------------------------------------------------ checkpoints


def test_checkpoint_round_trip_latest_and_pruning(tmp_path):
    directory = str(tmp_path / "ckpt")
    assert checkpoint.latest(directory) is None  # no directory yet
    rng = np.random.default_rng(0)
    saved = {}
    for step in (1, 2, 3, 10):
        arrays = {"w": rng.standard_normal((3, 4)).astype(np.float32), "i": np.arange(step, dtype=np.int64),
                  "f": np.asfortranarray(rng.standard_normal((2, 3)))}
        uri = checkpoint.save(directory, step, {"n_steps": 12, "seed": 5}, arrays, keep=2)
        saved[step] = arrays
        assert uri.endswith(f"ckpt-{step:09d}.npz")
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert names == ["ckpt-000000003.npz", "ckpt-000000010.npz"]  # newest two, no temp files
    latest = checkpoint.latest(directory)
    assert latest.endswith("ckpt-000000010.npz")  # numeric order, not the order of writing
    header, arrays = checkpoint.load(latest)
    assert header == {"n_steps": 12, "seed": 5, "step": 10}
    assert sorted(arrays) == ["f", "i", "w"]
    for k, v in saved[10].items():
        assert arrays[k].dtype == v.dtype and np.array_equal(arrays[k], v)
    header3, arrays3 = checkpoint.load(checkpoint.latest(directory).replace("10.npz", "03.npz"))
    assert header3["step"] == 3 and np.array_equal(arrays3["w"], saved[3]["w"])
    # keep=1 prunes to the newest; file:// URIs work the same
    checkpoint.save(f"file://{tmp_path}/ckpt", 11, {}, {"w": saved[10]["w"]}, keep=1)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["ckpt-000000011.npz"]


def test_checkpoint_keeps_0d_arrays(tmp_path):
    checkpoint.save(str(tmp_path), 1, {}, {"lr": np.array(0.5)})
    _, arrays = checkpoint.load(checkpoint.latest(str(tmp_path)))
    assert arrays["lr"].shape == ()


def test_the_checkpoint_writer_writes_in_the_background_one_at_a_time(tmp_path):
    """The master's writer: the same files as save(), written while the caller goes on, each
    started only once the one before is complete, and reported when complete."""
    import threading

    gate, saved = threading.Event(), []

    def on_saved(step, uri):
        gate.wait(10)  # holds the first write "in flight" until the test lets it end
        saved.append((step, uri, sorted(p.name for p in tmp_path.iterdir())))

    writer = checkpoint.Writer(on_saved=on_saved)
    arrays = {"w": np.arange(6.0).reshape(2, 3)}
    writer.save(str(tmp_path), 1, {"seed": 1}, arrays)  # returns at once: the caller computes on
    arrays["w"] = np.zeros(3)  # the master replaces parameters in its dict: the write keeps what it was given
    assert saved == []
    threading.Timer(0.2, gate.set).start()
    writer.save(str(tmp_path), 2, {"seed": 1}, arrays)  # waits for checkpoint 1, then starts 2
    assert [step for step, _, _ in saved] == [1]
    assert writer.flush() == str(tmp_path / "ckpt-000000002.npz")
    assert saved[1] == (2, str(tmp_path / "ckpt-000000002.npz"), ["ckpt-000000001.npz", "ckpt-000000002.npz"])
    assert writer.flush() is None  # nothing in flight
    header, first = checkpoint.load(str(tmp_path / "ckpt-000000001.npz"))
    assert header == {"seed": 1, "step": 1} and np.array_equal(first["w"], np.arange(6.0).reshape(2, 3))
    writer.close()


def test_a_checkpoint_write_that_fails_is_tried_again_before_the_job_hears_of_it(tmp_path, monkeypatch):
    """hdfs-native raises RuntimeError("All nodes failed for write") when a busy DataNode refuses a
    pipeline; it crashed the master (a keytab job beside a running job). A write is tried again
    after each pause of WRITE_RETRY_PAUSES_S, and only the last failure reaches the job."""
    monkeypatch.setattr(checkpoint, "WRITE_RETRY_PAUSES_S", (0.01, 0.01))
    real_save, calls = checkpoint.save, []

    def flaky(*args, fail=2, **kw):
        calls.append(args[1])
        if len(calls) <= fail:
            raise RuntimeError('DataTransferError("All nodes failed for write")')
        return real_save(*args, **kw)

    monkeypatch.setattr(checkpoint, "save", flaky)
    writer = checkpoint.Writer()
    writer.save(str(tmp_path), 1, {}, {"w": np.zeros(2)})
    assert writer.flush() == str(tmp_path / "ckpt-000000001.npz") and calls == [1, 1, 1]
    monkeypatch.setattr(checkpoint, "save", lambda *args, **kw: flaky(*args, fail=99, **kw))
    writer.save(str(tmp_path), 2, {}, {"w": np.zeros(2)})
    with pytest.raises(RuntimeError, match="All nodes failed for write"):
        writer.flush()
    assert calls == [1, 1, 1, 2, 2, 2]


def test_a_hung_background_checkpoint_is_given_up_after_ten_times_the_slowest_write(tmp_path, monkeypatch):
    """An HDFS client can wait forever on a DataNode lost mid-write: the writer waits a bounded
    time (the first write long, later ones ten times the slowest, at least a floor), then raises
    CheckpointTimeout (not a job error: the next attempt of the master resumes), and close()
    returns though the write never ends."""
    import threading

    from iterreduce.exceptions import CheckpointTimeout, IterReduceError

    monkeypatch.setattr(checkpoint, "MIN_WRITE_TIMEOUT_S", 0.3)
    writer = checkpoint.Writer()
    assert writer.timeout == checkpoint.FIRST_WRITE_TIMEOUT_S
    writer.save(str(tmp_path), 1, {}, {"w": np.zeros(2)})
    assert writer.flush() == str(tmp_path / "ckpt-000000001.npz")
    assert writer.slowest is not None and writer.timeout == max(0.3, 10 * writer.slowest)
    hung = threading.Event()
    real_save = checkpoint.save
    monkeypatch.setattr(checkpoint, "save", lambda *args, **kw: hung.wait(60) or real_save(*args, **kw))
    writer.save(str(tmp_path), 2, {}, {"w": np.zeros(2)})
    started = time.monotonic()
    with pytest.raises(CheckpointTimeout, match="checkpoint 2 still not written after"):
        writer.flush()
    assert time.monotonic() - started < 5
    assert not isinstance(CheckpointTimeout("x"), (IterReduceError, ValueError))  # a crash, not a job error
    writer.save(str(tmp_path), 3, {}, {"w": np.zeros(2)})
    started = time.monotonic()
    writer.close()  # the hung write is left to its daemon thread
    assert time.monotonic() - started < 5
    hung.set()


def test_a_failed_background_checkpoint_is_raised_by_the_next_save_and_flush(tmp_path):
    (tmp_path / "file").write_text("")
    writer = checkpoint.Writer()
    writer.save(str(tmp_path / "file" / "ckpt"), 1, {}, {"w": np.zeros(2)})  # a directory under a file
    with pytest.raises(checkpoint.CheckpointError, match="cannot write the checkpoint"):
        writer.save(str(tmp_path / "ok"), 2, {}, {"w": np.zeros(2)})
    writer.save(str(tmp_path / "file" / "ckpt"), 3, {}, {"w": np.zeros(2)})
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-000000003.npz: cannot write"):
        writer.flush()
    writer.save(str(tmp_path / "file" / "ckpt"), 4, {}, {"w": np.zeros(2)})
    writer.close()  # a failing job reports its own error: close waits, raises nothing


def test_checkpoint_unreadable(tmp_path):
    bad = tmp_path / "ckpt-000000004.npz"
    bad.write_bytes(b"not a zip")
    assert checkpoint.latest(str(tmp_path)) == str(tmp_path) + "/ckpt-000000004.npz"
    with pytest.raises(checkpoint.CheckpointError, match="ckpt-000000004.npz: unreadable checkpoint"):
        checkpoint.load(str(bad))
    np.savez(tmp_path / "ckpt-000000005.npz", w=np.zeros(2))  # an npz without the header
    with pytest.raises(checkpoint.CheckpointError, match="unreadable"):
        checkpoint.load(str(tmp_path / "ckpt-000000005.npz"))
