"""Tests for dbn.jobs.plots: reading both log formats, per-epoch aggregation, and the PNG files."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from matplotlib.image import imread  # noqa: E402

from dbn import DBN  # noqa: E402
from dbn.jobs.plots import per_epoch, plot_filters, plot_finetune, plot_reconstruction, plot_run, read_log  # noqa: E402


def write_log(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def single_process_records(valid=True):
    records = [{"phase": "pretrain", "layer": layer, "epoch": e, "reconstruction_error": 10.0 / (e + 1 + layer),
                "samples": 100, "seconds": 0.1} for layer in range(2) for e in range(3)]
    for e in range(4):
        rec = {"phase": "finetune", "epoch": e, "loss": 1.0 / (e + 1), "train_error": 0.3 / (e + 1),
               "samples": 100, "seconds": 0.2}
        if valid:
            rec["valid_error"] = 0.35 / (e + 1)
        records.append(rec)
    return records


def distributed_records():
    """A master log syncing twice per epoch (parts of 100 and 300 samples), with events and a
    resumed step 3 logged twice (the second, with loss 2.0, wins)."""
    records = [{"event": "worker_registered", "time": 1.0, "worker": "w#1", "shards": [0]},
               {"step": 0, "of": 9, "phase": "transform", "layer": 0, "samples": 400, "seconds": 0.1}]
    step = 1
    for e in range(2):
        for part, samples in enumerate((100, 300)):
            records.append({"step": step, "of": 9, "phase": "pretrain", "layer": 0, "epoch": e, "part": part,
                            "batches": [part, part + 1], "samples": samples,
                            "reconstruction_error": 8.0 - e - part})
            step += 1
    for e in range(2):
        for part, samples in enumerate((100, 300)):
            records.append({"step": step, "of": 9, "phase": "finetune", "epoch": e, "part": part,
                            "samples": samples, "loss": 1.0 - 0.1 * e - 0.4 * part,
                            "train_error": 0.2 - 0.1 * part})
            step += 1
    records[-1]["valid_error"] = 0.05
    records.append({"event": "worker_lost", "time": 2.0, "worker": "w#1"})
    records.append({"step": 3, "of": 9, "phase": "pretrain", "layer": 0, "epoch": 1, "part": 0,
                    "samples": 100, "reconstruction_error": 2.0})
    records.append({"event": "done", "time": 3.0, "steps": 9})
    return records


def cli_records():
    """A single-process log as ``dbn train`` writes it: a start event, epoch records tagged
    ``"event": "epoch"``, and a summary event."""
    epochs = [{"event": "epoch", **r, "epoch_seconds": 0.1, "elapsed": 1.0} for r in single_process_records()]
    return [{"event": "start", "time": "2024-01-01T00:00:00", "config": {}}, *epochs,
            {"event": "summary", "test_error": 0.1, "epochs": {"pretrain": 3, "finetune": 4}}]


def assert_png(path):
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
    assert image.std() > 0  # not a blank canvas


@pytest.fixture(scope="module")
def tiny_dbn():
    X = np.random.default_rng(0).random((64, 784), dtype=np.float32)
    return DBN([12, 6], pretrain_epochs=1, device="cpu", seed=0).pretrain(X)


# ------------------------------------------------------------------ reading


def test_read_log_skips_events_and_dedups_by_step(tmp_path):
    records = read_log(write_log(tmp_path / "log.jsonl", distributed_records()))
    assert all("event" not in r for r in records)
    steps = [r["step"] for r in records]
    assert steps == list(range(9))  # step 3 once, in its place
    assert records[3]["reconstruction_error"] == 2.0  # the later record won


def test_read_log_single_process_keeps_every_record(tmp_path):
    log = write_log(tmp_path / "log.jsonl", single_process_records())
    assert read_log(log) == single_process_records()


def test_read_log_keeps_the_epoch_records_of_a_cli_log(tmp_path):
    records = read_log(write_log(tmp_path / "log.jsonl", cli_records()))
    assert records == cli_records()[1:-1]  # the epoch records, not the start and summary events
    assert per_epoch(records, "finetune") == per_epoch(single_process_records(), "finetune")


def test_per_epoch_is_samples_weighted_mean_of_parts(tmp_path):
    records = read_log(write_log(tmp_path / "log.jsonl", distributed_records()))
    pre = per_epoch(records, "pretrain", layer=0)
    assert list(pre) == [0, 1]
    assert pre[0]["reconstruction_error"] == pytest.approx((100 * 8.0 + 300 * 7.0) / 400)
    assert pre[1]["reconstruction_error"] == pytest.approx((100 * 2.0 + 300 * 6.0) / 400)  # resumed value
    fine = per_epoch(records, "finetune")
    assert fine[1]["loss"] == pytest.approx((100 * 0.9 + 300 * 0.5) / 400)
    assert fine[0]["train_error"] == pytest.approx((100 * 0.2 + 300 * 0.1) / 400)
    assert "valid_error" not in fine[0] and fine[1]["valid_error"] == pytest.approx(0.05)  # only parts that have it


def test_per_epoch_single_record_per_epoch_is_unchanged():
    fine = per_epoch(single_process_records(), "finetune")
    assert fine[2] == pytest.approx({"loss": 1 / 3, "train_error": 0.1, "valid_error": 0.35 / 3})


def test_garbled_line_names_file_and_line(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(single_process_records()[0]) + "\n\n" + '{"phase": "pretrain", "lay\n')
    with pytest.raises(ValueError, match=r"log\.jsonl, line 3: not valid JSON"):
        read_log(log)
    log.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"line 1: expected a JSON object"):
        read_log(log)


def test_missing_log_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_log(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="no log.jsonl or model.npz"):
        plot_run(tmp_path)


# ------------------------------------------------------------------ plots


@pytest.mark.parametrize("make", [single_process_records, cli_records, distributed_records])
def test_curves_are_valid_pngs(tmp_path, make):
    records = read_log(write_log(tmp_path / "log.jsonl", make()))
    assert_png(plot_reconstruction(records, tmp_path / "r.png", sizes=[784, 12, 6]))
    assert_png(plot_finetune(records, tmp_path / "f.png"))


def test_finetune_without_validation(tmp_path):
    assert_png(plot_finetune(single_process_records(valid=False), tmp_path / "f.png"))


def test_filters_from_model_and_both_weight_layouts(tmp_path, tiny_dbn):
    assert_png(plot_filters(tiny_dbn, tmp_path / "a.png"))
    weights = tiny_dbn.rbms_[0].get_state()["weights"]
    assert weights.shape == (784, 12)
    assert_png(plot_filters(weights, tmp_path / "b.png", n=5))
    assert_png(plot_filters(weights.T, tmp_path / "c.png", n=5))
    assert_png(plot_filters(np.zeros((784, 3)), tmp_path / "flat.png"))  # constant filters don't divide by 0


def test_filters_wrong_visible_size(tmp_path, tiny_dbn):
    with pytest.raises(ValueError, match="784 = 28x28"):
        plot_filters(np.ones((100, 12)), tmp_path / "x.png")
    with pytest.raises(ValueError, match="100 = 10x10"):
        plot_filters(tiny_dbn, tmp_path / "x.png", image_shape=(10, 10))
    with pytest.raises(ValueError, match="no pre-trained RBM"):
        plot_filters(DBN([4]), tmp_path / "x.png")


@pytest.mark.parametrize("make", [single_process_records, cli_records])
def test_plot_run_writes_all_three(tmp_path, tiny_dbn, make):
    write_log(tmp_path / "log.jsonl", make())
    tiny_dbn.save(tmp_path / "model.npz")
    written = plot_run(tmp_path)
    assert [p.name for p in written] == ["reconstruction.png", "finetune.png", "filters.png"]
    for path in written:
        assert path.parent == tmp_path
        assert_png(path)


def test_plot_run_skips_absent_data(tmp_path):
    write_log(tmp_path / "log.jsonl", [r for r in distributed_records() if r.get("phase") != "finetune"])
    assert [p.name for p in plot_run(tmp_path)] == ["reconstruction.png"]
    assert not (tmp_path / "finetune.png").exists()
