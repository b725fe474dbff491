"""Atomic, durable file replacement (issue 36, items 4 and 5): iterreduce.storage.durable, as every
writer uses it (open_output_file: checkpoints, predictions, a table's shares, YARN uploads;
persist.atomic_write: models, result.json).

Before, open_output_file deleted the earlier file and then renamed the new one in (a moment
with neither) and fsynced nothing; persist.atomic_write fsynced the file but not its folder.
"""

from __future__ import annotations

import os
import threading
import zipfile

import numpy as np
import pyarrow.fs as pafs
import pytest

from dbn.model import persist
from iterreduce.master import checkpoint
from iterreduce.storage import durable
from iterreduce.storage.filesystems import open_output_file


def write_with_open_output_file(path, data: bytes) -> None:
    with open_output_file(str(path)) as stream:
        stream.write(data)


def write_with_atomic_write(path, data: bytes) -> None:
    persist.atomic_write(path, lambda f: f.write(data))


WRITERS = [write_with_open_output_file, write_with_atomic_write]


def npz_bytes(i: int) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, w=np.full(1000 + 37 * (i % 50), i, dtype=np.float32))
    return buf.getvalue()


@pytest.mark.parametrize("write", WRITERS, ids=lambda w: w.__name__)
def test_a_reader_never_sees_a_missing_or_partial_file_while_it_is_overwritten(tmp_path, write):
    """One thread overwrites model.npz again and again; another opens and np.load's it all the
    while: every read finds a whole file, the earlier or the new one."""
    path = tmp_path / "model.npz"
    write(path, npz_bytes(0))
    done, problems, reads = threading.Event(), [], [0]

    def reader():
        while not done.is_set():
            try:
                with np.load(path) as npz:
                    w = npz["w"]
                assert w.size == 1000 + 37 * (int(w[0]) % 50) and (w == w[0]).all()
                reads[0] += 1
            except Exception as exc:  # noqa: BLE001 - recorded: any is a failure
                problems.append(repr(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(1, 1500):
            write(path, npz_bytes(i))
    finally:
        done.set()
        thread.join()
    assert problems == [], problems[:5]
    assert reads[0] > 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]  # no temporary file left


def record_fsyncs(monkeypatch) -> list[str]:
    """Patch os.fsync to record what each call synced (a file's or a folder's path)."""
    synced, real = [], os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


@pytest.mark.parametrize("write", WRITERS, ids=lambda w: w.__name__)
def test_the_bytes_are_fsynced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch, write):
    path = tmp_path / "sub" / "model.npz"
    write(path, b"earlier")
    synced = record_fsyncs(monkeypatch)
    renamed, real_replace = [], os.replace

    def replace(src, dst, **kw):
        renamed.append(len(synced))  # how many fsyncs came before the rename
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "replace", replace)
    write(path, b"new")
    assert path.read_bytes() == b"new"
    assert len(synced) == 2 and renamed == [1], (synced, renamed)
    temporary, folder = synced
    assert os.path.dirname(temporary) == str(path.parent) and os.path.basename(temporary).startswith(".model.npz.")
    assert folder == str(path.parent)


def test_a_checkpoint_and_a_model_are_fsynced_with_their_folders(tmp_path, monkeypatch):
    synced = record_fsyncs(monkeypatch)
    checkpoint.save(str(tmp_path / "ckpt"), 3, {"fingerprint": "f"}, {"w": np.zeros(3)})
    persist.save_arrays(tmp_path / "model.npz", {}, {"w": np.zeros(3)})
    assert str(tmp_path / "ckpt") in synced and str(tmp_path) in synced
    assert sum(os.path.basename(p).startswith(".ckpt-000000003.npz.") for p in synced) == 1
    assert sum(os.path.basename(p).startswith(".model.npz.") for p in synced) == 1


def test_pyarrows_local_move_replaces_an_existing_file_in_one_rename(tmp_path):
    """What replace_local relies on, and why pyarrow's move is as good locally: the target is
    replaced by the very inode moved onto it (rename(2)), with no delete first."""
    (tmp_path / "a").write_bytes(b"old")
    (tmp_path / "b").write_bytes(b"new")
    inode = (tmp_path / "b").stat().st_ino
    pafs.LocalFileSystem().move(str(tmp_path / "b"), str(tmp_path / "a"))
    assert (tmp_path / "a").read_bytes() == b"new" and (tmp_path / "a").stat().st_ino == inode
    assert not (tmp_path / "b").exists()


class NoOverwrite(pafs.FileSystemHandler):
    """A local file system that renames like libhdfs' HDFS: never onto an existing file. The
    next moves fail or not as ``fail_moves`` (True: fails) says, e.g. as a crash between two
    renames would leave things."""

    def __init__(self):
        self.local = pafs.LocalFileSystem()
        self.fail_moves: list[bool] = []
        self.moves: list[tuple[str, str]] = []

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def get_type_name(self):
        return "no-overwrite"

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise NotImplementedError

    def delete_file(self, path):
        self.local.delete_file(path)

    def move(self, src, dest):
        if self.fail_moves and self.fail_moves.pop(0):
            raise OSError(f"rename {src} -> {dest}: the NameNode is gone")
        if os.path.exists(dest):
            raise FileExistsError(f"rename destination {dest} exists")
        self.moves.append((os.path.basename(src), os.path.basename(dest)))
        self.local.move(src, dest)

    def copy_file(self, src, dest):
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.local.open_input_stream(path)

    def open_input_file(self, path):
        return self.local.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return self.local.open_output_stream(path)

    def open_append_stream(self, path, metadata):
        return self.local.open_append_stream(path)


def test_without_atomic_overwrite_the_earlier_file_is_set_aside_and_restored(tmp_path):
    """A file system that renames onto no existing file (libhdfs): the earlier file is renamed
    to a hidden backup, the new one moved in, the backup deleted; cut short between the two
    renames, the earlier bytes are whole under the backup, and the next write of that name
    restores them first."""
    handler = NoOverwrite()
    fs = pafs.PyFileSystem(handler)
    target = str(tmp_path / "model.npz")

    def write(data: bytes) -> None:
        with open_output_file(target, resolve=lambda uri: (fs, uri)) as stream:
            stream.write(data)

    write(b"first")
    write(b"second")
    assert (tmp_path / "model.npz").read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]
    old, new = handler.moves[-2:]  # the earlier file aside first, then the new one in
    assert old[0] == "model.npz" and old[1].startswith(".model.npz.") and old[1].endswith(".old")
    assert new[0].startswith(".model.npz.") and new[0].endswith(".tmp") and new[1] == "model.npz"

    handler.fail_moves = [False, True, True]  # aside, then the new file's move fails, and so does moving it back
    with pytest.raises(OSError, match="the NameNode is gone"):
        write(b"third")
    (backup,) = [p for p in tmp_path.iterdir() if p.name.endswith(".old")]
    assert not (tmp_path / "model.npz").exists() and backup.read_bytes() == b"second"  # whole, aside
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert durable.restore(fs, target) == str(backup)
    assert (tmp_path / "model.npz").read_bytes() == b"second"

    handler.fail_moves = [False, True, True]
    with pytest.raises(OSError):
        write(b"fourth")
    write(b"fifth")  # restores the backup first, then replaces it as usual
    assert (tmp_path / "model.npz").read_bytes() == b"fifth"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]


def test_a_failed_move_in_puts_the_earlier_file_back(tmp_path):
    handler = NoOverwrite()
    fs = pafs.PyFileSystem(handler)
    target = str(tmp_path / "log.jsonl")
    (tmp_path / "log.jsonl").write_bytes(b"earlier")
    real_move = handler.move
    calls = []

    def move(src, dest):
        calls.append(dest)
        if len(calls) == 2:  # the new file's move in
            raise OSError("quota exceeded")
        real_move(src, dest)

    handler.move = move
    with pytest.raises(OSError, match="quota exceeded"):
        with open_output_file(target, resolve=lambda uri: (fs, uri)) as stream:
            stream.write(b"new")
    assert (tmp_path / "log.jsonl").read_bytes() == b"earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


def test_restore_leaves_a_backup_beside_a_file_in_place_alone(tmp_path):
    fs = pafs.LocalFileSystem()
    (tmp_path / "model.npz").write_bytes(b"current")
    (tmp_path / ".model.npz.0123abcd.old").write_bytes(b"older")
    assert durable.restore(fs, str(tmp_path / "model.npz")) is None
    assert (tmp_path / "model.npz").read_bytes() == b"current"
    assert (tmp_path / ".model.npz.0123abcd.old").read_bytes() == b"older"


def test_a_model_written_by_atomic_write_is_a_whole_npz(tmp_path):
    persist.save_arrays(tmp_path / "m.npz", {"x": 1}, {"w": np.ones(4)})
    with zipfile.ZipFile(tmp_path / "m.npz") as z:
        assert z.testzip() is None
    assert oct((tmp_path / "m.npz").stat().st_mode & 0o777) == oct(0o666 & ~current_umask())


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
