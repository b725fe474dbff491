"""The command line's distributed side: dbn shard, and dbn train --local N."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbn import DBN
from dbn.cli import main
from shardio.readers import list_shards, read_shard

from test_cli import HAVE_MNIST, N_CLASSES, N_FEATURES, REAL_MNIST, make_dataset, read_jsonl


def test_shard_npz_into_parquet_and_back(tmp_path, capsys):
    make_dataset(tmp_path / "d.npz", n=90)
    assert main(["shard", str(tmp_path / "d.npz"), str(tmp_path / "shards"), "--shards", "4"]) == 0
    printed = capsys.readouterr().out.split()
    uris = list_shards(str(tmp_path / "shards"))
    assert printed == uris and len(uris) == 4
    parts = [read_shard(u, i) for i, u in enumerate(uris)]
    with np.load(tmp_path / "d.npz") as d:
        np.testing.assert_array_equal(np.concatenate([p.features for p in parts]), d["X"])
        np.testing.assert_array_equal(np.concatenate([p.labels for p in parts]), d["y"])
    assert sorted(p.rows for p in parts) == [22, 22, 23, 23]


def test_shard_csv_with_label_column(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,label\n0.1,0.2,1\n0.3,0.4,0\n0.5,0.6,2\n")
    assert main(["shard", str(csv), str(tmp_path / "s"), "--shards", "2"]) == 0
    rows = [read_shard(u) for u in list_shards(str(tmp_path / "s"))]
    np.testing.assert_allclose(np.concatenate([r.features for r in rows]), [[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]], rtol=1e-6)
    assert np.concatenate([r.labels for r in rows]).tolist() == [1, 0, 2]


@pytest.mark.skipif(not HAVE_MNIST, reason="MNIST files not found beside the checkout")
def test_shard_mnist_keeps_uint8_pixels(tmp_path):
    assert main(["shard", "mnist", str(tmp_path / "m"), "--shards", "3", "--limit", "300",
                 "--mnist-dir", str(REAL_MNIST)]) == 0
    uris = list_shards(str(tmp_path / "m"))
    assert len(uris) == 3
    assert pq.read_schema(uris[0].removeprefix("file://")).field("features").type == pa.list_(pa.uint8(), 784)
    shard = read_shard(uris[0])
    assert shard.rows == 100 and 0.0 <= shard.features.min() and shard.features.max() <= 1.0


@pytest.mark.parametrize("args, message", [
    (["nothing.npz", "OUT", "--shards", "2"], "no such data file"),
    (["DATA", "OUT", "--shards", "1000"], "cannot cut 90 rows into 1000 shards"),
    (["DATA.txt", "OUT", "--shards", "2"], "unknown data format"),
])
def test_shard_errors_exit_2_with_message(tmp_path, capsys, args, message):
    make_dataset(tmp_path / "d.npz", n=90)
    (tmp_path / "d.txt").write_text("x")
    args = [a.replace("DATA.txt", str(tmp_path / "d.txt")).replace("DATA", str(tmp_path / "d.npz"))
            .replace("OUT", str(tmp_path / "o")).replace("nothing.npz", str(tmp_path / "nothing.npz")) for a in args]
    assert main(["shard", *args]) == 2
    assert message in capsys.readouterr().err


def test_train_local_two_workers_end_to_end(tmp_path, capsys):
    make_dataset(tmp_path / "train.npz", n=400)
    make_dataset(tmp_path / "test.npz", n=150, seed=1)
    config = tmp_path / "job.toml"
    config.write_text(
        "[data]\ntrain = 'train.npz'\ntest = 'test.npz'\n"
        # Averaging once per epoch makes half the sequential updates of one process per
        # epoch with 2 shards, so this job gets a few more epochs than test_cli's.
        "[model]\nhidden_layers = [16, 8]\npretrain_epochs = 4\nfinetune_epochs = 8\ntop_layer_epochs = 1\n"
        "pretrain_batch_size = 20\nfinetune_batch_size = 20\n"
        "[job]\nseed = 1\ndevice = 'cpu'\n[cluster]\nheartbeat_timeout = 5.0\n"
    )
    out = tmp_path / "out"
    assert main(["train", str(config), "--local", "2", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "local mini-cluster of 2 workers" in captured.err
    assert "pretrain layer 1/2 epoch 1/4" in captured.err and "sync" in captured.err
    assert "test error" in captured.out
    assert "live view: http://127.0.0.1:" in captured.err  # the page, on this machine only

    result = json.loads((out / "result.json").read_text())
    assert result["workers"] == 2 and result["shards"] == 2 and result["sync_every"] == 0
    assert result["layers"] == [N_FEATURES, 16, 8, N_CLASSES]
    assert 0 <= result["sync_fraction"] <= 1 and result["pretrain_seconds"] > 0
    assert result["test_error"] < 0.3  # the classes are easy to tell apart
    model = DBN.load(out / "model.npz", device="cpu")
    assert 1 - model.score(*_load(tmp_path / "test.npz")) == pytest.approx(result["test_error"])

    log = read_jsonl(out / "log.jsonl")
    steps = [r for r in log if "step" in r and "event" not in r]
    assert [r["step"] for r in steps] == list(range(len(steps)))
    assert {r["phase"] for r in steps} == {"transform", "pretrain", "finetune"}
    assert log[-1]["event"] == "done"
    assert len(list_shards(str(out / "shards"))) == 2
    assert [r["url"] for r in log if r.get("event") == "ui"][0].startswith("http://127.0.0.1:")

    # --json: machine-readable lines, the last one the summary; --no-ui: no page.
    assert main(["train", str(config), "--local", "2", "--out", str(tmp_path / "out2"), "--json", "--quiet",
                 "--no-ui"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[-1]["event"] == "summary" and lines[-1]["workers"] == 2
    assert any("step" in line for line in lines) and not any(line.get("event") == "ui" for line in lines)
    assert not any(r.get("event") == "ui" for r in read_jsonl(tmp_path / "out2" / "log.jsonl"))


def test_resume_needs_a_cluster(tmp_path, capsys):
    make_dataset(tmp_path / "train.npz", n=60)
    assert main(["train", "--set", f"data.train={tmp_path / 'train.npz'}", "--resume", "--out", str(tmp_path / "o")]) == 2
    assert "--resume continues a distributed job" in capsys.readouterr().err


def _load(path):
    with np.load(path) as d:
        return d["X"], d["y"]


def test_train_local_pretraining_only(tmp_path, capsys):
    make_dataset(tmp_path / "train.npz", n=200)
    assert main(["train", "--set", f"data.train={tmp_path / 'train.npz'}", "--set", "data.test=mnist",
                 "--layers", "8", "--epochs", "2", "--finetune-epochs", "0", "--device", "cpu",
                 "--local", "2", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    result = json.loads((tmp_path / "o" / "result.json").read_text())
    assert result["test_error"] is None and result["layers"] == [N_FEATURES, 8, None]
    assert DBN.load(tmp_path / "o" / "model.npz").network_ is None
    assert "pre-trained only: no classifier to test" in capsys.readouterr().out


def test_train_local_on_unlabelled_shards_exits_2_naming_the_shard(tmp_path, capsys):
    from shardio.shards import write_shards

    X = np.random.default_rng(0).random((40, N_FEATURES), dtype=np.float32)
    write_shards(X, None, str(tmp_path / "shards"), 2)
    assert main(["train", "--set", f"cluster.shards={tmp_path / 'shards'}", "--local", "2",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "dbn: error:" in err and "part-00000.parquet: no 'label' column" in err


def test_workers_packed_into_fewer_processes_train_the_same_model(tmp_path, capsys):
    """How the local mini-cluster maps workers (shards) to processes changes no bit of the model."""
    make_dataset(tmp_path / "train.npz", n=240)
    make_dataset(tmp_path / "test.npz", n=60, seed=1)
    states = {}
    for processes in (2, 4):
        out = tmp_path / f"p{processes}"
        assert main(["train", "--set", f"data.train={tmp_path / 'train.npz'}", "--set", f"data.test={tmp_path / 'test.npz'}",
                     "--set", f"cluster.processes={processes}", "--layers", "8", "--epochs", "2",
                     "--finetune-epochs", "2", "--device", "cpu", "--local", "4", "--out", str(out)]) == 0
        err = capsys.readouterr().err
        assert ("local mini-cluster of 4 workers in 2 processes" in err) == (processes == 2)
        result = json.loads((out / "result.json").read_text())
        assert result["workers"] == 4 and result["shards"] == 4 and result["processes"] == processes
        states[processes] = DBN.load(out / "model.npz").get_state()
        registered = [r for r in read_jsonl(out / "log.jsonl") if r.get("event") == "worker_registered"]
        assert len(registered) == processes and {s for r in registered for s in r["shards"]} == {0, 1, 2, 3}
    assert states[2].keys() == states[4].keys()
    for key in states[2]:
        assert np.array_equal(states[2][key], states[4][key]), key


def test_streaming_workers_train_the_same_model_as_in_memory_ones(tmp_path, capsys):
    """[cluster] stream = "always": every worker copies its shard to local disk and streams it;
    the model is the in-memory one bit for bit, and the start line says where the data is."""
    make_dataset(tmp_path / "train.npz", n=240)
    states = {}
    for stream in ("never", "always"):
        out = tmp_path / stream
        assert main(["train", "--set", f"data.train={tmp_path / 'train.npz'}", "--set", "data.test=none",
                     "--set", f"cluster.stream={stream}", "--layers", "8,6", "--epochs", "2", "--finetune-epochs", "2",
                     "--device", "cpu", "--local", "2", "--out", str(out)]) == 0
        err = capsys.readouterr().err
        assert ("streaming the data from local disk" in err) == (stream == "always")
        result = json.loads((out / "result.json").read_text())
        assert result["memory"]["stream"] == (stream == "always")
        assert result["memory"]["worker_bytes"] <= result["memory"]["budget_bytes"]
        states[stream] = DBN.load(out / "model.npz").get_state()
    for key in states["never"]:
        assert np.array_equal(states["never"][key], states["always"][key]), key


@pytest.mark.parametrize("setting, says", [("model.validation_fraction=0.2", "validation_fraction = 0.2 holds out rows"),
                                           ("model.early_stopping_patience=3", "early_stopping_patience needs a "
                                                                                "validation set")])
def test_settings_workers_cannot_honour_are_refused_not_ignored(tmp_path, capsys, setting, says):
    """Held-out rows, and early stopping without a validation shard: workers used to drop them silently."""
    from dbn.errors import ConfigError
    from dbn.jobs.spec import load_spec

    make_dataset(tmp_path / "train.npz")
    job = tmp_path / "job.toml"
    job.write_text("[data]\ntrain = 'train.npz'\n[model]\nhidden_layers = [8]\npretrain_epochs = 1\n"
                   "finetune_epochs = 1\n[job]\ndevice = 'cpu'\n")
    capsys.readouterr()
    assert main(["train", str(job), "--local", "2", "--out", str(tmp_path / "out"), "--set", setting, "--quiet",
                 "--no-ui"]) == 2
    err = capsys.readouterr().err
    assert f"dbn: error: {job}: [model] {says}" in err and "[cluster] validation" in err, err
    assert not (tmp_path / "out").exists()  # refused before any shard is written
    key, value = setting.split("=")
    spec = load_spec(str(job), overrides={key: value})
    with pytest.raises(ConfigError, match=says.split(" ")[0]):
        spec.master_config(shards=str(tmp_path / "s"), output=str(tmp_path / "o"), on_yarn=True)  # dbn submit too
    assert main(["train", str(job), "--out", str(tmp_path / "one"), "--set", setting, "--quiet"]) == 0  # one process
