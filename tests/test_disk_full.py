"""A write that fails part-way (a full disk, a quota): the error names the file it could not
write, no partial temporary file is left to fill the disk further, and what was there before
stays as it was. Before, a master on a full disk died with a traceback naming no file and
left a half-written ``.ckpt-*.npz.tmp`` behind."""

from __future__ import annotations

import errno

import numpy as np
import pytest

from dbn.model import persist
from iterreduce.exceptions import CheckpointError
from iterreduce.master import checkpoint


class FullDisk:
    """A filesystem that accepts ``room`` bytes of new files, then answers ENOSPC."""

    def __init__(self, fs, room: int):
        self.fs, self.room = fs, room

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def open_output_stream(self, path, **kwargs):
        stream, disk = self.fs.open_output_stream(path, **kwargs), self

        class Stream:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                stream.close()

            def write(self, data):
                if len(data) > disk.room:
                    stream.write(bytes(data[:disk.room]))  # what fitted, as a real disk writes it
                    disk.room = 0
                    raise OSError(errno.ENOSPC, "No space left on device")
                disk.room -= len(data)
                return stream.write(data)

        return Stream()


def arrays(seed: int) -> dict:
    return {"w": np.random.default_rng(seed).random((64, 64)).astype(np.float32)}


def test_a_checkpoint_that_does_not_fit_is_named_and_leaves_nothing(tmp_path, monkeypatch):
    directory = str(tmp_path / "checkpoints")
    first = checkpoint.save(directory, 1, {"fingerprint": "job"}, arrays(1))
    before = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints").iterdir()}
    real = checkpoint.filesystem
    monkeypatch.setattr(checkpoint, "filesystem", lambda uri: (FullDisk(real(uri)[0], room=1000), real(uri)[1]))
    with pytest.raises(CheckpointError) as caught:
        checkpoint.save(directory, 2, {"fingerprint": "job"}, arrays(2))
    message = str(caught.value)
    assert message.startswith(f"{directory}/ckpt-000000002.npz: cannot write the checkpoint")
    assert "No space left on device" in message and "resume from ckpt-000000001.npz" in message
    after = {p.name: p.read_bytes() for p in (tmp_path / "checkpoints").iterdir()}
    assert after == before  # no .tmp left, the earlier checkpoint intact
    assert checkpoint.latest(directory, fingerprint="job") == first


def test_a_model_that_does_not_fit_is_named_and_the_old_one_stays(tmp_path):
    path = tmp_path / "model.npz"
    persist.save_arrays(path, {"kind": "old"}, arrays(1))
    old = path.read_bytes()

    def fill_the_disk(f):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as caught:
        persist.atomic_write(path, fill_the_disk)
    assert caught.value.filename == str(path) and "No space left on device" in caught.value.strerror
    assert path.read_bytes() == old
    assert [p.name for p in tmp_path.iterdir()] == ["model.npz"]  # no temporary file left


def test_the_command_line_names_the_file_on_a_full_disk(tmp_path, monkeypatch, capsys):
    from dbn.cli import main
    from test_cli import make_dataset

    make_dataset(tmp_path / "train.npz")
    job = tmp_path / "job.toml"
    job.write_text("[data]\ntrain = 'train.npz'\n[model]\nhidden_layers = [8]\npretrain_epochs = 1\n"
                   "finetune_epochs = 1\n[job]\ndevice = 'cpu'\n")
    real = persist.atomic_write

    def fill_the_disk(f):
        f.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    def full(path, write):  # the disk fills as the model is written
        return real(path, fill_the_disk if str(path).endswith("model.npz") else write)

    monkeypatch.setattr(persist, "atomic_write", full)
    assert main(["train", str(job), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"dbn: error: {tmp_path / 'out' / 'model.npz'}: cannot write it: No space left on device" in err, err
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]

