"""A CSV file as users write them, faults included: every fault is ``dbn: error:`` naming the
file (and the column or row), exit status 2, nothing trained, on each path that reads a CSV
(``dbn train`` in this process and on the local mini-cluster, ``dbn shard``, ``dbn predict``).
Before, a text column or a file separated by ';' ended in a traceback, and an empty label
cell became a class of its own ("")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dbn import DBN
from dbn.cli import main

GOOD_HEADER = "a,b,label"
GOOD_ROWS = ["0,1,x", "1,0,y", "0.5,0.5,x", "1,1,y"]

FAULTS = {  # name: (file text, what the error says)
    "text feature": ("a,colour,label\n0,red,x\n1,blue,y\n", ["column 'colour' is not numeric", "'red'"]),
    "semicolons": ("a;b;label\n0;1;x\n1;0;y\n", ["column 'a;b;label' is not numeric", "separated by ';'"]),
    "tabs": ("a\tb\tlabel\n0\t1\tx\n1\t0\ty\n", ["is not numeric", "separated by ';' or tabs"]),
    "empty text label": ("a,b,label\n0,1,x\n1,0,\n", ["no label at row 1"]),
    "empty number label": ("a,b,label\n0,1,1\n1,0,\n", ["no label at row 1"]),
    "fractional label": ("a,b,label\n0,1,1\n1,0,0.5\n", ["integer class labels", "0.5 at row 1"]),
    "empty feature": ("a,b,label\n0,,x\n1,0,y\n", ["NaN or infinite", "row 0, column 1"]),
    "header only": ("a,b,label\n", ["no samples"]),
    "no features": ("label\nx\ny\n", ["no feature columns"]),
    "ragged row": ("a,b,label\n0,1,x\n1,y\n", ["not a readable CSV file"]),
    "out of range": ("a,b,label\n0,5,x\n1,0,y\n", ["values in [0, 5]", "Bernoulli visible units"]),
}


def job(root: Path, data: str) -> Path:
    path = root / "job.toml"
    path.write_text(f"[data]\ntrain = '{data}'\n[model]\nhidden_layers = [4]\npretrain_epochs = 1\n"
                    "finetune_epochs = 1\n[job]\ndevice = 'cpu'\n")
    return path


def refused(capsys, argv: list[str], fragments: list[str]) -> None:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dbn: error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_bad_csv_is_named_in_one_process(tmp_path, capsys, fault):
    text, fragments = FAULTS[fault]
    (tmp_path / "data.csv").write_text(text)
    refused(capsys, ["train", str(job(tmp_path, "data.csv")), "--out", str(tmp_path / "out"), "--quiet"],
            [str(tmp_path / "data.csv"), *fragments])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fault", [f for f in FAULTS if f != "out of range"])  # shards may hold any range
def test_a_bad_csv_is_named_when_sharded(tmp_path, capsys, fault):
    text, fragments = FAULTS[fault]
    (tmp_path / "data.csv").write_text(text)
    refused(capsys, ["shard", str(tmp_path / "data.csv"), str(tmp_path / "shards"), "--shards", "1"],
            ["data.csv", *fragments])


@pytest.mark.parametrize("fault", ["text feature", "empty text label"])
def test_a_bad_csv_is_named_before_a_local_cluster_starts(tmp_path, capsys, fault):
    text, fragments = FAULTS[fault]
    (tmp_path / "data.csv").write_text(text)
    refused(capsys, ["train", str(job(tmp_path, "data.csv")), "--local", "2", "--out", str(tmp_path / "out"),
                     "--quiet", "--no-ui"], ["data.csv", *fragments])


def test_a_good_csv_trains_and_a_bad_one_is_named_at_predict(tmp_path, capsys):
    (tmp_path / "data.csv").write_text("\n".join([GOOD_HEADER, *GOOD_ROWS]) + "\n")
    assert main(["train", str(job(tmp_path, "data.csv")), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    (tmp_path / "new.csv").write_text("a,b\n0,red\n")
    refused(capsys, ["predict", str(tmp_path / "out" / "model.npz"), str(job(tmp_path, "data.csv")), "--table",
                     str(tmp_path / "new.csv"), "--out", str(tmp_path / "p.parquet")],
            ["new.csv", "column 'b' is not numeric"])
    assert not (tmp_path / "p.parquet").exists()


def test_labels_named_elsewhere_are_found_on_every_path(tmp_path, capsys):
    """``[data] label`` (``--label``) names a CSV's label column or a .npz's label array; before, it
    applied to tables only and a CSV's 'target' column was read as a feature."""
    rows = ["0,1,x", "1,0,y", "0.1,0.9,x", "0.9,0.1,y"] * 10
    (tmp_path / "data.csv").write_text("a,b,target\n" + "\n".join(rows) + "\n")
    np.savez(tmp_path / "data.npz", X=np.array([[float(v) for v in r.split(",")[:2]] for r in rows]),
             labels=np.array([r[-1] for r in rows]))
    for data in ("data.csv", "data.npz"):
        label = "target" if data.endswith(".csv") else "labels"
        path = job(tmp_path, data)
        path.write_text(path.read_text().replace("[data]\n", f"[data]\nlabel = '{label}'\ntest = '{data}'\n"))
        for where in ((), ("--local", "2", "--no-ui")):
            out = tmp_path / f"out-{data}-{len(where)}"
            assert main(["train", str(path), "--out", str(out), "--quiet", *where]) == 0
            assert DBN.load(out / "model.npz", device="cpu").classes_.tolist() == ["x", "y"]
        capsys.readouterr()
        assert main(["evaluate", str(out / "model.npz"), "--data", str(tmp_path / data), "--label", label]) == 0
        assert main(["shard", str(tmp_path / data), str(tmp_path / f"shards-{data}"), "--shards", "2",
                     "--label", label]) == 0
        refused(capsys, ["train", str(path), "--out", str(tmp_path / "bad"), "--set", "data.label=nope"],
                [data, "'nope' ([data] label;", "target" if data.endswith(".csv") else "arrays: ['X', 'labels']"])
    refused(capsys, ["evaluate", str(out / "model.npz"), "--data", str(tmp_path / "data.csv")],
            ["column 'target' is not numeric", "'label' unless [data] label or --label names another"])


@pytest.mark.parametrize("where", [(), ("--local", "2", "--no-ui")])
def test_features_named_for_a_csv_say_that_a_csv_is_read_whole(tmp_path, capsys, where):
    """``[data] features`` selects a table's columns; on a .csv (an id column to leave out) it
    once ended in pyarrow's "Parquet magic bytes not found in footer"."""
    (tmp_path / "data.csv").write_text("id,a,b,label\n" + "\n".join(f"u{i},{r}" for i, r in enumerate(GOOD_ROWS)) + "\n")
    path = job(tmp_path, "data.csv")
    path.write_text(path.read_text().replace("[data]\n", "[data]\nfeatures = ['a', 'b']\nlabel = 'label'\n"))
    refused(capsys, ["train", str(path), "--out", str(tmp_path / "out"), "--quiet", *where],
            ["data.csv: [data] features names the columns of a table", "every column but the label is a feature",
             "or write the data as Parquet"])
    assert not (tmp_path / "out").exists()
