"""Files written at a path the user names (`dbn predict --out`, a table's shares): a bare file
name, a new folder, a folder where the file should be, and a write that fails half-way.

Before, a bare name such as `--out pred.parquet` made a *folder* of that name (its "parent" was
the name itself) and then failed to open it as a file; and a failed write left a partial file
in place of an earlier one."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from dbn import DBN
from dbn.cli import main
from iterreduce.storage.filesystems import open_output_file


def test_a_bare_file_name_is_a_file_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_output_file("plain.bin") as stream:
        stream.write(b"abc")
    assert (tmp_path / "plain.bin").read_bytes() == b"abc"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.bin"]  # no partial file left beside it


def test_new_folders_are_made_for_a_path_and_a_file_uri(tmp_path):
    for target, written in ((str(tmp_path / "a" / "b" / "out.bin"), tmp_path / "a" / "b" / "out.bin"),
                            ((tmp_path / "c" / "out.bin").as_uri(), tmp_path / "c" / "out.bin")):
        with open_output_file(target) as stream:
            stream.write(b"xyz")
        assert written.read_bytes() == b"xyz"


def test_a_folder_at_the_path_is_refused_by_name(tmp_path):
    (tmp_path / "taken").mkdir()
    with pytest.raises(IsADirectoryError, match="a folder is there: name the file to write") as caught:
        with open_output_file(str(tmp_path / "taken")) as stream:
            stream.write(b"never")
    assert caught.value.filename == str(tmp_path / "taken")
    assert list((tmp_path / "taken").iterdir()) == []


def test_a_failed_write_leaves_no_partial_file_and_keeps_the_earlier_one(tmp_path):
    target = tmp_path / "result.bin"
    target.write_bytes(b"earlier")
    with pytest.raises(RuntimeError, match="half-way"):
        with open_output_file(str(target)) as stream:
            stream.write(b"new but unfinished")
            raise RuntimeError("half-way")
    assert target.read_bytes() == b"earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.bin"]
    with open_output_file(str(target)) as stream:  # a finished write replaces it
        stream.write(b"new")
    assert target.read_bytes() == b"new"


def test_dbn_predict_writes_a_bare_out_name_into_the_current_folder(tmp_path, monkeypatch, capsys):
    rng = np.random.default_rng(0)
    X = rng.random((200, 6)).astype(np.float32)
    y = (X[:, 0] > 0.5).astype(int)
    np.savez(tmp_path / "data.npz", X=X, y=y)
    DBN(hidden_layers=[4], pretrain_epochs=1, finetune_epochs=2, device="cpu").fit(X, y).save(tmp_path / "model.npz")
    (tmp_path / "job.toml").write_text("[data]\ntrain = 'data.npz'\n")
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "model.npz", "job.toml", "--out", "pred.parquet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 200
    assert (tmp_path / "pred.parquet").is_file()
    assert pq.read_table(tmp_path / "pred.parquet").num_rows == 200
    (tmp_path / "folder.parquet").mkdir()
    assert main(["predict", "model.npz", "job.toml", "--out", "folder.parquet"]) == 2
    assert "folder.parquet: a folder is there: name the file to write" in capsys.readouterr().err
