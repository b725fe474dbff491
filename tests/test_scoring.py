"""Scoring a table on the local mini-cluster (``dbn predict --local N``): part files committed
whole, every row once, the same predictions as one process, and an earlier output replaced only
when asked and only when it is a scoring output. (On YARN: tests/test_yarn_scoring.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbn.cli import main
from dbn.jobs import scoring

FEATURES = [f"f{j}" for j in range(8)]
CLASSES = np.array(["ant", "bee", "cow"])


def write_table(folder: Path, files: int = 6, rows: int = 400, row_group: int = 100, seed: int = 0,
                first_id: int = 0) -> int:
    """A Parquet table of ``files`` files (row groups of ``row_group`` rows): an ``id`` column,
    features f0.. in [0, 1] that tell three classes apart, a string ``label``; returns its rows."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        y = rng.integers(0, 3, rows)
        X = np.clip(rng.normal(0.25 + 0.25 * y[:, None] * (np.arange(8) % 3 == y[:, None]), 0.15), 0, 1)
        ids = np.arange(first_id + i * rows, first_id + (i + 1) * rows)
        columns = {"id": pa.array(ids, pa.int64()), **{f: pa.array(X[:, j], pa.float32()) for j, f in enumerate(FEATURES)},
                   "label": pa.array(CLASSES[y])}
        pq.write_table(pa.table(columns), folder / f"part-{i:05d}.parquet", row_group_size=row_group)
    return files * rows


def job_file(tmp_path: Path, table: str, model_out: str) -> Path:
    path = tmp_path / "job.toml"
    features = ", ".join(f'"{f}"' for f in FEATURES)
    path.write_text(f"""
[data]
train = "{table}"
features = [{features}]
label = "label"
[model]
hidden_layers = [12]
pretrain_epochs = 2
finetune_epochs = 3
pretrain_batch_size = 20
finetune_batch_size = 20
[output]
dir = "{model_out}"
""")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A table and a classifier trained on it (one process)."""
    tmp = tmp_path_factory.mktemp("scoring")
    rows = write_table(tmp / "table")
    job = job_file(tmp, str(tmp / "table"), str(tmp / "model"))
    assert main(["train", str(job), "--quiet"]) == 0
    return tmp, job, rows


def read_folder(folder: Path) -> pa.Table:
    return pq.ParquetDataset(folder).read()  # pyarrow skips names starting with _ and .


def test_three_local_workers_score_every_row_once_with_one_processs_predictions(trained, tmp_path, capsys):
    tmp, job, rows = trained
    out = tmp_path / "scores"
    code = main(["predict", str(tmp / "model" / "model.npz"), str(job), "--out", str(out), "--local", "3",
                 "--keep", "id", "--part-rows", "150", "--json", "--quiet"])
    assert code == 0
    record = json.loads(capsys.readouterr().out)
    assert record["rows"] == rows and record["label"] == "label" and 0 <= record["error"] < 0.5
    scored = read_folder(out)
    assert sorted(scored.column("id").to_pylist()) == list(range(rows))  # every row once
    names = sorted(p.name for p in out.iterdir())
    assert names[:2] == ["_SUCCESS", "_dbn"] and all(n.startswith("part-") for n in names[2:])
    assert sorted(names[2:]) == record["parts"] and len(record["parts"]) == 15  # 800 rows a share: 5 chunks of 150+
    assert not list(tmp_path.glob(".scores.*"))  # the staging folder became the output
    assert (out / "_dbn" / "log.jsonl").is_file() and (out / "_dbn" / "scoring.json").is_file()

    single = tmp_path / "single.parquet"
    assert main(["predict", str(tmp / "model" / "model.npz"), str(job), "--out", str(single), "--keep", "id",
                 "--quiet"]) == 0
    one = pq.read_table(single).sort_by("id")
    many = scored.sort_by("id")
    assert many.column("prediction").to_pylist() == one.column("prediction").to_pylist()
    assert np.array_equal(many.column("probability").to_numpy(), one.column("probability").to_numpy())


def test_an_existing_output_is_refused_and_replaced_only_when_it_is_a_scoring_output(trained, tmp_path, capsys):
    tmp, job, rows = trained
    model = str(tmp / "model" / "model.npz")
    out = tmp_path / "scores"
    args = ["predict", model, str(job), "--out", str(out), "--local", "2", "--quiet"]
    assert main(args) == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert main(args) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # untouched
    assert main([*args, "--overwrite"]) == 0
    assert json.loads((out / "_dbn" / "scoring.json").read_text())["rows"] == rows
    assert sorted(read_folder(out).column("prediction").to_pylist()) != []

    (out / "notes.txt").write_text("mine")  # the user's file inside: the folder is no longer only ours
    assert main([*args, "--overwrite"]) == 2
    assert "notes.txt: not written by the dbn predict run" in capsys.readouterr().err
    assert (out / "notes.txt").read_text() == "mine"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "part-00000.parquet").write_bytes(b"a table of someone else's")
    assert main(["predict", model, str(job), "--out", str(foreign), "--local", "2", "--quiet", "--overwrite"]) == 2
    assert "not an output of dbn predict" in capsys.readouterr().err
    assert (foreign / "part-00000.parquet").read_bytes() == b"a table of someone else's"


def test_the_commit_moves_and_deletes_only_the_runs_own_names(tmp_path):
    """A staging folder holding a file the run did not write is refused whole: nothing moved or
    deleted. Without one, a killed writer's unfinished part file goes, and files beside it stay."""
    from iterreduce.exceptions import ForeignFileError

    stage, out = tmp_path / ".scores.dbn-r1", tmp_path / "scores"
    (stage / "_dbn").mkdir(parents=True)
    (stage / "part-00000-00000.parquet").write_bytes(b"rows")
    unfinished = stage / ".part-00001-00000.parquet.0123abcd.tmp"
    unfinished.write_bytes(b"half")
    (stage / ".notes").write_text("a user's")
    (tmp_path / "scores.csv").write_text("beside")
    with pytest.raises(ForeignFileError, match=r"\.notes: not written by this scoring run"):
        scoring.commit(str(stage), str(out), overwrite=False, run_id="r1")
    assert unfinished.exists() and (stage / ".notes").exists() and not out.exists()
    (stage / ".notes").unlink()
    scoring.commit(str(stage), str(out), overwrite=False, run_id="r1")
    assert sorted(p.name for p in out.iterdir()) == ["_SUCCESS", "_dbn", "part-00000-00000.parquet"]
    assert not stage.exists() and (tmp_path / "scores.csv").read_text() == "beside"


def test_chunks_split_a_shares_pieces_into_nearly_equal_runs():
    pieces = tuple(range(7))
    runs = [scoring.chunk_of(pieces, k, 3) for k in range(3)]
    assert runs == [(0, 1), (2, 3), (4, 5, 6)] and sum(runs, ()) == pieces
    assert [scoring.chunk_of((0,), k, 3) for k in range(3)] == [(), (), (0,)]
    assert scoring.staging_uri("hdfs://nn:8020/user/a/scores", "r1") == "hdfs://nn:8020/user/a/.scores.dbn-r1"
    assert scoring.staging_uri("scores/", "r1", "replaced") == ".scores.replaced-r1"


def test_scoring_options_that_cannot_work_are_refused_before_anything_runs(trained, tmp_path, capsys):
    tmp, job, _ = trained
    model = str(tmp / "model" / "model.npz")
    for extra, message in ((["--local", "2", "--yarn"], "--yarn and --local: choose one"),
                           (["--part-rows", "10"], "--part-rows goes with --yarn"),
                           (["--local", "2", "--wait"], "--workers and --wait go with --yarn"),
                           (["--local", "2", "--part-rows", "0"], "--part-rows 0: a part file holds at least one row"),
                           (["--local", "2", "--keep", "prediction"], "'prediction' would clash"),
                           (["--yarn"], "must be a URI every container can reach")):
        out = tmp_path / "scores"
        assert main(["predict", model, str(job), "--out", str(out), *extra, "--quiet"]) == 2
        assert message in capsys.readouterr().err
        assert not out.exists() and not list(tmp_path.glob(".scores*"))
    assert main(["predict", model, str(job), "--out", str(tmp_path / "s.parquet"), "--local", "2", "--quiet"]) == 2
    assert "writes a folder of Parquet part files" in capsys.readouterr().err


@pytest.mark.parametrize("skip_lost", [True, False])
def test_a_lost_workers_unfinished_shards_are_skipped_in_training_and_moved_within_the_step_for_scoring(skip_lost):
    """The runtime's two policies (``Program.every_shard_every_step``): training's step goes on
    without a lost worker's unfinished shards; scoring's step waits for the worker they move to."""
    import threading

    from iterreduce.master.membership import Membership
    from iterreduce.program import Step
    from iterreduce.master.rounds import Rounds

    lock = threading.Condition()
    lock.acquire()  # the master's lock, held around every call as the master holds it
    members = Membership(4, 2, work=threading.Condition(lock), on_moved=lambda shard: None)
    a = members.register("worker-0", "h", "", {})
    b = members.register("worker-1", "h", "", {})
    rounds = Rounds(wake=lock, event=lambda *args, **kw: None, skip_lost=skip_lost)
    rounds.start(Step("score", {}, ()), {}, members, peers=False)
    rounds.give(rounds.todo(b), b.worker_id)
    b.alive = False
    lost = rounds.lose(b, "killed", others_live=True)
    members.assign_orphans()
    assert sorted(a.shards) == [0, 1, 2, 3]
    if skip_lost:
        assert lost == {1, 3} and rounds.expected == {0, 2} and rounds.todo(a) == [0, 2]
    else:
        assert lost == set() and rounds.expected == {0, 1, 2, 3} and rounds.todo(a) == [0, 1, 2, 3]
