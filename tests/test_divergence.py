"""Training that diverges stops at the epoch it shows, with the layer and the setting to lower.

Before, Gaussian visible units on 60,000 rows of standardised data went to NaN in their first
epoch at the default rate 0.1; the job trained on NaN for every later epoch (the second layer
then "reconstructed" perfectly) and failed only when the model file was checked at the end.
The default rate of a Gaussian first layer is now 0.001 (Hinton's practical guide, 13.2)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from dbn import DBN
from dbn.cli import main
from dbn.errors import TrainingDiverged
from dbn.model.divergence import check_arrays, check_epoch
from dbn.model.estimator import GAUSSIAN_LEARNING_RATE, LEARNING_RATE
from iterreduce.exceptions import JobFailed


def gaussian_data(rows: int = 2000, features: int = 50, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, features)).astype(np.float32), rng.integers(0, 2, rows)


def test_one_process_stops_in_the_epoch_that_diverged_and_says_what_to_lower():
    X, y = gaussian_data()
    model = DBN(hidden_layers=[200, 20], visible="gaussian", pretrain_learning_rate=0.1, pretrain_epochs=5,
                finetune_epochs=2, device="cpu")
    with pytest.raises(TrainingDiverged, match=r"^pre-training diverged: layer 1's reconstruction error became "
                                                r"(inf|nan) in epoch 1: lower \[model\] pretrain_learning_rate for "
                                                r"layer 1 \(0\.1 now\); Gaussian visible units need") as caught:
        model.fit(X, y)
    assert isinstance(caught.value, JobFailed)  # a distributed job's master ends on it too
    assert [r["epoch"] for r in model.history_] == [0]  # nothing trained after the epoch that diverged


def test_the_default_rate_of_a_gaussian_first_layer_trains_that_data():
    X, y = gaussian_data()
    model = DBN(hidden_layers=[200, 20], visible="gaussian", pretrain_epochs=3, finetune_epochs=2, device="cpu")
    assert model.pretrain_rates() == [GAUSSIAN_LEARNING_RATE, LEARNING_RATE]
    assert DBN(hidden_layers=[200, 20]).pretrain_rates() == [LEARNING_RATE, LEARNING_RATE]
    model.fit(X, y)
    errors = [r["reconstruction_error"] for r in model.history_ if r["phase"] == "pretrain" and r["layer"] == 0]
    assert all(math.isfinite(e) for e in errors) and errors[-1] < errors[0]


def test_the_messages_of_both_phases_and_of_a_distributed_jobs_arrays():
    with pytest.raises(TrainingDiverged, match=r"^fine-tuning diverged: the loss became nan in epoch 4: lower "
                                                r"\[model\] finetune_learning_rate \(0\.5 now\)$"):
        check_epoch(float("nan"), "the loss", "finetune", 3, rate=0.5)
    check_epoch(3.5, "the loss", "finetune", 3, rate=0.5)  # finite: nothing to say
    finite = {"net.0.weights": np.ones((3, 2), np.float32), "net.0.biases": np.zeros(2, np.float32)}
    check_arrays(finite, "finetune", 0, rate=0.1)
    huge = np.full((3, 2), 3e38, np.float32)  # finite, though their float32 sum would overflow
    check_arrays({"net.0.weights": huge}, "finetune", 0, rate=0.1)
    for bad in (np.nan, np.inf, -np.inf):
        arrays = {**finite, "net.0.biases": np.array([0.0, bad], np.float32)}
        with pytest.raises(TrainingDiverged, match=r"net\.0\.biases holds NaN or infinity in epoch 1"):
            check_arrays(arrays, "finetune", 0, rate=0.1)
    with pytest.raises(TrainingDiverged, match=r"layer 2's rbm\.1\.weights holds NaN or infinity in epoch 3: "
                                                r"lower \[model\] pretrain_learning_rate for layer 2 \(0\.1 now\)$"):
        check_arrays({"rbm.1.weights": np.array([np.nan])}, "pretrain", 2, layer=1, rate=0.1)


def test_a_distributed_job_stops_at_the_superstep_that_diverged(tmp_path, capsys):
    X, y = gaussian_data()
    np.savez(tmp_path / "data.npz", X=X, y=y)
    (tmp_path / "job.toml").write_text(
        "[data]\ntrain = 'data.npz'\n[model]\nhidden_layers = [200, 20]\nvisible = 'gaussian'\n"
        "pretrain_learning_rate = 0.1\npretrain_epochs = 5\nfinetune_epochs = 2\n[job]\ndevice = 'cpu'\n")
    out = tmp_path / "out"
    assert main(["train", str(tmp_path / "job.toml"), "--out", str(out), "--quiet", "--no-ui", "--local", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dbn: error: the job failed: pre-training diverged")  # explained: no "master failed"
    found = re.search(r"pre-training diverged: layer 1's rbm\.0\.\w+ holds NaN or infinity in epoch (\d+): lower "
                      r"\[model\] pretrain_learning_rate for layer 1 \(0\.1 now\)", err)
    assert found, err
    epoch = int(found.group(1)) - 1  # the averaged model went to NaN a little later than one process's
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    pretrained = [(r["layer"], r["epoch"]) for r in records if r.get("phase") == "pretrain"]
    assert pretrained == [(0, e) for e in range(epoch)]  # the superstep that diverged is not logged as trained
    assert records[-1]["event"] == "failed" and not (out / "model.npz").exists()
