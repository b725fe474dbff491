"""No input of a job lies inside what the job deletes, moves or overwrites (issue 64, class 1): a run
whose data is in its output folder's model, checkpoints, shards or earlier runs, `dbn shard` whose
source is in the folder it writes, `dbn predict` over its own data, are refused before anything is
touched, naming the setting and the place; the user's files stay byte-identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dbn.cli import main
from iterreduce.storage.ownership import within
from test_cli import make_dataset


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def run(tmp_path):
    """A first run whose output folder OUT holds its shards (cut from train.npz), model, log, checkpoints."""
    make_dataset(tmp_path / "train.npz")
    out = tmp_path / "OUT"
    job = tmp_path / "job.toml"
    job.write_text("[data]\ntrain = 'train.npz'\n[model]\nhidden_layers = [8]\npretrain_epochs = 1\n"
                   "finetune_epochs = 1\n[cluster]\nworkers = 2\n[job]\nseed = 1\ndevice = 'cpu'\n")
    assert main(["train", str(job), "--out", str(out), "--local", "2", "--quiet", "--no-ui"]) == 0
    assert list((out / "shards").glob("part-*.parquet")) and (out / "model.npz").is_file()
    return tmp_path, out


def second_job(tmp_path: Path, data: str, cluster: str = "") -> Path:
    job = tmp_path / "second.toml"
    job.write_text(f"[data]\n{data}\n[model]\nhidden_layers = [8]\npretrain_epochs = 1\nfinetune_epochs = 1\n"
                   f"[cluster]\nworkers = 2\n{cluster}\n[job]\nseed = 2\ndevice = 'cpu'\n")
    return job


@pytest.mark.parametrize("local", [(), ("--local", "2", "--no-ui")], ids=["in-process", "local-2"])
@pytest.mark.parametrize("data, cluster, entry", [
    # the probe: the first run's shards as the table to train on (cut into OUT/shards again)
    ("train = 'OUT/shards'\nfeatures = 'features'\nlabel = 'label'", "", "shards"),
    ("train = 'train.npz'\ntest = 'OUT/shards/part-00000.parquet'\nlabel = 'label'", "", "shards"),
    ("train = 'train.npz'", "validation = '{out}/checkpoints/v.parquet'", "checkpoints"),  # (cwd-relative: absolute)
    ("train = 'OUT/model.npz'", "", "model.npz"),
    ("train = 'train.npz'", "shards = '{out}/previous/1/shards'", "previous"),
], ids=["table-in-shards", "test-in-shards", "validation-in-checkpoints", "train-is-the-model", "shards-in-previous"])
def test_a_job_whose_data_is_in_what_it_rewrites_is_refused_with_its_files_untouched(run, capsys, data, cluster,
                                                                                      entry, local):
    tmp_path, out = run
    (out / "previous" / "1" / "shards").mkdir(parents=True, exist_ok=True)
    job = second_job(tmp_path, data, cluster.format(out=out))
    before = files_of(tmp_path)
    capsys.readouterr()
    code = main(["train", str(job), "--out", str(out), "--overwrite", "--quiet", *local])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("dbn: error: ") and "Traceback" not in err and err.count("\n") == 1, err
    assert f"lies in {out}/{entry}, which this run rewrites" in err and "nothing was changed" in err, err
    assert files_of(tmp_path) == before


def test_the_shards_the_job_reads_from_its_own_shards_folder_and_data_elsewhere_in_it_still_train(run, capsys):
    """`[cluster] shards = OUT/shards` is read there, never rewritten; OUT/data is not the run's."""
    tmp_path, out = run
    shards = files_of(out / "shards")
    job = second_job(tmp_path, "train = 'train.npz'", f"shards = '{out}/shards'")
    assert main(["train", str(job), "--out", str(out), "--overwrite", "--quiet", "--local", "2", "--no-ui"]) == 0
    assert files_of(out / "shards") == shards
    (out / "data").mkdir()
    make_dataset(out / "data" / "train.npz", seed=3)
    job = second_job(tmp_path, "train = 'OUT/data/train.npz'")
    assert main(["train", str(job), "--out", str(out), "--overwrite", "--quiet"]) == 0


def test_dbn_shard_refuses_a_source_inside_the_folder_it_writes(tmp_path, capsys):
    make_dataset(tmp_path / "rows.npz")
    assert main(["shard", str(tmp_path / "rows.npz"), str(tmp_path / "S"), "--shards", "2"]) == 0
    table = pq.read_table(tmp_path / "S" / "part-00000.parquet")
    np.savez(tmp_path / "S" / "copy.npz", X=np.stack(table["features"].to_numpy(zero_copy_only=False)),
             y=table["label"].to_numpy())
    before = files_of(tmp_path)
    capsys.readouterr()
    assert main(["shard", str(tmp_path / "S" / "copy.npz"), str(tmp_path / "S"), "--shards", "2"]) == 2
    err = capsys.readouterr().err
    assert f"the source = '{tmp_path / 'S' / 'copy.npz'}' lies in {tmp_path / 'S'}" in err, err
    assert files_of(tmp_path) == before


@pytest.mark.parametrize("over", ["data", "model"])
def test_dbn_predict_refuses_to_write_over_its_own_data_or_model(run, capsys, over):
    tmp_path, out = run
    target = tmp_path / "train.npz" if over == "data" else out / "model.npz"
    before = files_of(tmp_path)
    capsys.readouterr()
    code = main(["predict", str(out / "model.npz"), str(tmp_path / "job.toml"), "--out", str(target), "--overwrite"])
    err = capsys.readouterr().err
    setting = "data.train" if over == "data" else "the model"
    assert code == 2 and f"{setting} = '{target}' lies in {target}, where the rows scored are written" in err, err
    assert files_of(tmp_path) == before


@pytest.mark.parametrize("inner, outer, expected", [
    ("/a/b/c", "/a/b", True), ("/a/b", "/a/b", True), ("/a/bc", "/a/b", False), ("/a", "/a/b", False),
    ("hdfs://nn:8020/out/shards/x", "hdfs://nn:8020/out/shards", True),
    ("hdfs://NN:8020/out/shards/../shards/x", "hdfs://nn:8020/out/shards", True),
    ("hdfs://other:8020/out/shards/x", "hdfs://nn:8020/out/shards", False),
    ("hdfs://nn:8020/out/shards", "/out/shards", False),
    ("file:///a/b/c", "/a/b", True),
])
def test_within_compares_file_systems_and_normalised_paths(inner, outer, expected):
    assert within(inner, outer) is expected


def test_within_follows_a_local_link_as_the_run_resolves_its_output(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert within(str(tmp_path / "link" / "x"), str(tmp_path / "real"))
