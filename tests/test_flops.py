"""FLOP counts, and the FLOP figures every run's result.json reports."""

from __future__ import annotations

import json

import pytest

from dbn.cli import main
from dbn.jobs import figures as figures_module
from dbn.model import flops

from test_cli import N_CLASSES, N_FEATURES, make_dataset


def test_cd_counts_five_products_for_cd1_and_two_more_per_gibbs_step():
    assert flops.cd_per_sample(784, 500) == 10 * 784 * 500
    assert flops.cd_per_sample(784, 500, cd_k=3) == 2 * 784 * 500 * (1 + 6 + 2)
    assert flops.cd_per_sample(784, 500, persistent=True) == 12 * 784 * 500


def test_backprop_counts_forward_gradients_and_deltas_of_trained_layers():
    sizes = (784, 500, 500, 2000, 10)
    weights = [784 * 500, 500 * 500, 500 * 2000, 2000 * 10]
    assert flops.backprop_per_sample(sizes) == 6 * sum(weights) - 2 * weights[0]
    # The softmax layer alone: the whole forward pass, its gradient, no delta below it.
    assert flops.backprop_per_sample(sizes, lowest=3) == 2 * sum(weights) + 2 * weights[3]


def test_job_flops_adds_the_logged_steps():
    sizes = [10, 6, 4, 3]
    records = [
        {"phase": "transform", "layer": 0, "samples": 50},  # the data itself: nothing computed
        {"phase": "pretrain", "layer": 0, "samples": 40},
        {"phase": "transform", "layer": 1, "samples": 50},
        {"phase": "pretrain", "layer": 1, "samples": 40},
        {"phase": "finetune", "epoch": 0, "samples": 40},  # in-process records: top-only by epoch
        {"phase": "finetune", "epoch": 1, "samples": 40, "top_only": False},
        {"event": "done"},
    ]
    expected = (40 * 10 * 10 * 6 + 50 * 2 * 10 * 6 + 40 * 10 * 6 * 4
                + 40 * flops.backprop_per_sample(sizes, lowest=2) + 40 * flops.backprop_per_sample(sizes))
    assert flops.job_flops(records, sizes, top_layer_epochs=1) == expected


def test_sgemm_rate_is_positive_and_finite():
    rate = flops.sgemm_gflops(size=128)
    assert 0 < rate < 1e6


@pytest.mark.parametrize("measured", [True, False])
def test_result_json_reports_flops_and_the_ratio_to_the_limit(tmp_path, monkeypatch, measured):
    if measured:  # this tiny job is under the threshold at which a run measures the sgemm rate
        monkeypatch.setattr(figures_module, "LIMIT_MIN_FLOPS", 0)
        monkeypatch.setattr(figures_module, "SGEMM_MEASUREMENTS", 2)
    make_dataset(tmp_path / "train.npz", n=240)
    out = tmp_path / "o"
    assert main(["train", "--set", f"data.train={tmp_path / 'train.npz'}", "--set", "data.test=none",
                 "--set", "model.top_layer_epochs=1", "--set", "model.pretrain_batch_size=20",
                 "--set", "model.finetune_batch_size=20", "--layers", "8", "--epochs", "2",
                 "--finetune-epochs", "2", "--device", "cpu", "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    sizes = [N_FEATURES, 8, N_CLASSES]
    expected = (2 * 240 * flops.cd_per_sample(N_FEATURES, 8) + 240 * flops.backprop_per_sample(sizes, lowest=1)
                + 240 * flops.backprop_per_sample(sizes))
    assert result["flops"] == expected
    if measured:
        assert result["sgemm_gflops"] > 0
        assert result["flop_limit_seconds"] == pytest.approx(expected / (result["sgemm_gflops"] * 1e9))
        assert result["ratio_to_limit"] == pytest.approx(result["train_wall_seconds"] / result["flop_limit_seconds"])
    else:
        assert result["sgemm_gflops"] is None and result["ratio_to_limit"] is None
