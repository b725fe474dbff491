"""A file the user names is never replaced unasked (issue 36, the single-file class).

`dbn predict MODEL JOB --out OUT` and `dbn transform ... --out OUT` used to replace whatever
file was at OUT (a user's own `scores.parquet`, a Spark table's part file) without a word.
Now they follow the Hadoop world's convention (Spark's ErrorIfExists, `hdfs dfs -put` without
`-f`): an existing OUT is refused before anything is computed, exit 2, the file byte for byte
as it was; `--overwrite` replaces it atomically; a fresh path is written as before. The same
holds from Python (`predict_file`, `predict_table`: `overwrite=False` by default), and for a
file that appears at OUT while the predictions are written. `dbn mnist --sweep` replaces its
`OUT/sweep.md` only when it wrote it (the marker on its first line).
The same refusal on a real HDFS is in tests/test_hdfs.py (`-k predict_out`).
"""

from __future__ import annotations

import numpy as np
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from dbn.cli import main
import dbn.data.sharding as sharding
import dbn.data.table_data as table_data
from dbn.model.estimator import DBN
from iterreduce.exceptions import ForeignFileError, OutputExists
from iterreduce.storage.filesystems import open_output_file
from test_table_jobs import animals, train  # noqa: F401 - the fixture, and a trained table job

USERS_OWN = b"id,score\n1,0.25\n2,0.75\n" + bytes(range(256))  # not ours: any bytes at all


@pytest.fixture(scope="module")
def table_job(tmp_path_factory, animals):  # noqa: F811
    """(model, job): a model trained on a Parquet table (predict_table's path)."""
    root, _ = animals
    tmp = tmp_path_factory.mktemp("guard-table")
    train(tmp, root, 0)
    return tmp / "out" / "model.npz", tmp / "job.toml"


@pytest.fixture(scope="module")
def file_job(tmp_path_factory):
    """(model, job): a model trained on a .npz data file (predict_file's path)."""
    tmp = tmp_path_factory.mktemp("guard-file")
    rng = np.random.default_rng(0)
    X = rng.random((120, 6)).astype(np.float32)
    y = (X[:, 0] > 0.5).astype(int)
    np.savez(tmp / "data.npz", X=X, y=y)
    DBN(hidden_layers=[4], pretrain_epochs=1, finetune_epochs=2, device="cpu", pretrain_batch_size=12,
        finetune_batch_size=12).fit(X, y).save(tmp / "model.npz")
    (tmp / "job.toml").write_text(f"[data]\ntrain = '{tmp / 'data.npz'}'\n")
    return tmp / "model.npz", tmp / "job.toml"


@pytest.fixture
def nothing_computed(monkeypatch):
    """Fails the test if a prediction or a feature is computed (each writer's one way to them)."""
    calls = []

    def computed(*args, **kwargs):
        calls.append(args)
        raise AssertionError("computed before the existing --out was refused")

    monkeypatch.setattr(sharding, "output_columns", computed)
    monkeypatch.setattr(table_data, "output_columns", computed)
    return calls


JOBS = ["table_job", "file_job"]
COMMANDS = ["predict", "transform"]
NAMES = ["scores.parquet", "scores.csv"]


def run(request, which, command, out, *flags) -> int:
    model, job = request.getfixturevalue(which)
    return main([command, str(model), str(job), "--out", str(out), "--device", "cpu", *flags])


def read(path):
    return pacsv.read_csv(path) if str(path).endswith(".csv") else pq.read_table(path)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("which", JOBS)
def test_an_existing_out_is_refused_before_anything_is_computed_and_left_byte_identical(
        request, tmp_path, capsys, nothing_computed, which, command, name):
    out = tmp_path / name
    out.write_bytes(USERS_OWN)
    before = out.stat()
    assert run(request, which, command, out) == 2
    err = capsys.readouterr().err
    assert err == f"dbn: error: {out}: already exists; pass --overwrite to replace it, or choose another --out\n"
    assert out.read_bytes() == USERS_OWN
    assert (out.stat().st_ino, out.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not even rewritten
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no partial file beside it
    assert nothing_computed == []


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("which", JOBS)
def test_overwrite_replaces_it_with_what_a_fresh_path_gets(request, tmp_path, capsys, which, command, name):
    fresh, out = tmp_path / "new" / name, tmp_path / name
    assert run(request, which, command, fresh) == 0  # a fresh path (its folder made) is written as before
    out.write_bytes(USERS_OWN)
    assert run(request, which, command, out, "--overwrite") == 0
    capsys.readouterr()
    assert out.read_bytes() != USERS_OWN
    assert read(out).equals(read(fresh)) and read(out).num_rows > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["new", name])  # no partial file left


@pytest.mark.parametrize("command", COMMANDS)
def test_a_folder_at_out_stays_refused_with_or_without_overwrite(request, tmp_path, capsys, command):
    out = tmp_path / "p.parquet"
    (out / "part-00000.parquet").parent.mkdir()
    (out / "part-00000.parquet").write_bytes(USERS_OWN)
    for flags in ((), ("--overwrite",)):
        assert run(request, "table_job", command, out, *flags) == 2
        assert "a folder is there: name the file to write" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["part-00000.parquet"]
    assert (out / "part-00000.parquet").read_bytes() == USERS_OWN


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("which", JOBS)
def test_an_out_that_names_a_folder_is_refused_and_makes_nothing(request, tmp_path, capsys, which, command):
    """`--out nope/` made an empty folder nope and said it "already exists" (2026-12-08)."""
    for given in (f"{tmp_path}/nope/", f"{tmp_path}/nope/."):
        assert run(request, which, command, given) == 2
        err = capsys.readouterr().err
        assert "a folder's name: name the file to write" in err and "already exists" not in err, err
    assert not (tmp_path / "nope").exists()


def test_the_python_api_refuses_too_unless_told_to_overwrite(tmp_path, table_job, file_job):
    from dbn.jobs.spec import load_spec

    for (model_path, job), predict in ((file_job, "file"), (table_job, "table")):
        model = DBN.load(model_path, device="cpu")
        spec = load_spec(job)
        out = tmp_path / f"{predict}.parquet"

        def write(**kwargs):
            if predict == "file":
                return sharding.predict_file(model, spec.data.test or spec.data.train, str(out), **kwargs)
            return table_data.predict_table(model, spec.data, str(out), **kwargs)

        out.write_bytes(USERS_OWN)
        with pytest.raises(OutputExists, match=f"^{out}: already exists"):
            write()
        assert out.read_bytes() == USERS_OWN
        assert write(overwrite=True)["rows"] == pq.read_table(out).num_rows > 0


def test_a_file_that_appears_while_writing_is_left_as_it_is(tmp_path):
    """Refused at the start is not enough: a file put at OUT while the predictions are written
    is not replaced either (the finished file moves in only where the name is still free)."""
    out = tmp_path / "scores.parquet"
    with pytest.raises(OutputExists, match="appeared while this file was written"):
        with open_output_file(str(out), overwrite=False) as stream:
            stream.write(b"our predictions")
            out.write_bytes(USERS_OWN)
    assert out.read_bytes() == USERS_OWN
    assert [p.name for p in tmp_path.iterdir()] == ["scores.parquet"]
    with open_output_file(str(tmp_path / "free.parquet"), overwrite=False) as stream:
        stream.write(b"ours")
    assert (tmp_path / "free.parquet").read_bytes() == b"ours"


# ------------------------------------------------------------------ dbn mnist --sweep's OUT/sweep.md


def fake_sweep(monkeypatch):
    """The sweep with every run replaced by a result (the table's writing is what is tested)."""
    import dbn.jobs.mnist_eval as ev

    trained = []

    def evaluate(cfg, **kwargs):
        trained.append(cfg.output.dir)
        return {"test_error": 0.0123, "wall_seconds": 1.0, "pretrain_seconds": 0.5, "finetune_seconds": 0.5}

    monkeypatch.setattr(ev, "evaluate", evaluate)
    monkeypatch.setattr(ev, "SWEEP_LAYERS", ((16,),))
    monkeypatch.setattr(ev, "SWEEP_WORKERS", (1,))
    return ev, trained


def test_a_sweep_md_the_sweep_did_not_write_is_refused_before_training(tmp_path, capsys, monkeypatch):
    ev, trained = fake_sweep(monkeypatch)
    (tmp_path / "sweep.md").write_bytes(b"# my notes on sweeps\n")
    assert main(["mnist", "--sweep", "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dbn: error: {tmp_path / 'sweep.md'}: already exists, and dbn mnist --sweep did not "
                          f"write it")
    assert (tmp_path / "sweep.md").read_bytes() == b"# my notes on sweeps\n"
    assert trained == [] and [p.name for p in tmp_path.iterdir()] == ["sweep.md"]
    with pytest.raises(ForeignFileError):
        ev.sweep(out=str(tmp_path), quick=True, seed=0, data_dir=None)
    assert trained == [] and (tmp_path / "sweep.md").read_bytes() == b"# my notes on sweeps\n"


def test_the_sweeps_own_table_is_replaced_and_overwrite_replaces_another(tmp_path, monkeypatch):
    ev, trained = fake_sweep(monkeypatch)
    table = ev.sweep(out=str(tmp_path), quick=True, seed=0, data_dir=None)
    written = (tmp_path / "sweep.md").read_text()
    assert written == f"{ev.SWEEP_MARKER}\n{table}" and "| 16 | 1 | **1.23 %** |" in table
    (tmp_path / "sweep.md").write_text(written.replace("1.23 %", "9.99 %"))  # the sweep's own, an older one
    assert ev.sweep(out=str(tmp_path), quick=True, seed=0, data_dir=None) == table
    assert (tmp_path / "sweep.md").read_text() == written
    (tmp_path / "sweep.md").write_bytes(b"# my notes on sweeps\n")
    assert ev.sweep(out=str(tmp_path), quick=True, seed=0, data_dir=None, overwrite=True) == table
    assert (tmp_path / "sweep.md").read_text() == written and len(trained) == 3
    (tmp_path / "sweep.md").unlink()
    (tmp_path / "sweep.md").mkdir()  # a folder there: refused even with overwrite
    with pytest.raises(ForeignFileError, match="a folder is there"):
        ev.sweep(out=str(tmp_path), quick=True, seed=0, data_dir=None, overwrite=True)
