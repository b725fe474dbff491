"""Early stopping on a validation shard (``[cluster] validation`` with ``model.early_stopping_
patience``), in one process and on the local mini-cluster, as ``DBN.finetune`` does it on held-out
rows: after each fine-tuning epoch the validation error is scored; the job stops once it has not
improved for ``patience`` epochs (never during the top-layer-only epochs) and keeps the best
epoch's network. On workers the master keeps that state with the parameters (checkpointed), the
runtime's generic ``Program.after_step`` / ``finished`` hooks. Before, workers ignored the
setting and one process ignored the shard."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dbn import DBN, DataError
from dbn.cli import main
from dbn.jobs.dbn_program import BEST_ERROR, SINCE_BEST, STOP, DBNProgram
from iterreduce.program import MASTER_STATE, Step
from shardio.readers import list_shards
from shardio.shards import write_shards

FEATURES, CLASSES, EPOCHS, PATIENCE = 16, 3, 12, 2


def blobs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(5).random((CLASSES, FEATURES))
    y = rng.integers(0, CLASSES, n)
    return np.clip(centers[y] + rng.normal(0, 0.15, (n, FEATURES)), 0, 1).astype(np.float32), y


@pytest.fixture
def data(tmp_path):
    X, y = blobs(400, 0)
    np.savez(tmp_path / "train.npz", X=X, y=y)
    Xv, yv = blobs(200, 1)
    write_shards(Xv, yv, str(tmp_path / "valid"), 1)
    job = tmp_path / "job.toml"
    # The rate doubles every epoch: the validation error falls, then rises (as in test_dbn.py).
    job.write_text(f"[data]\ntrain = 'train.npz'\n[model]\nhidden_layers = [12]\npretrain_epochs = 2\n"
                   f"finetune_epochs = {EPOCHS}\ntop_layer_epochs = 1\nfinetune_learning_rate = 0.05\n"
                   f"finetune_lr_decay = 2.0\nearly_stopping_patience = {PATIENCE}\n"
                   f"[cluster]\nvalidation = '{list_shards(str(tmp_path / 'valid'))[0]}'\n[job]\ndevice = 'cpu'\n")
    return job, (Xv, yv)


def finetune_errors(out: Path) -> list[float]:
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return [r["valid_error"] for r in records if r.get("phase") == "finetune" and "valid_error" in r]


@pytest.mark.parametrize("where", [(), ("--local", "2", "--no-ui")], ids=["in-process", "local-2"])
def test_a_job_stops_when_the_validation_error_stops_improving_and_keeps_the_best(data, tmp_path, where):
    job, (Xv, yv) = data
    out = tmp_path / f"out{len(where)}"
    assert main(["train", str(job), "--out", str(out), "--quiet", *where]) == 0
    errors = finetune_errors(out)
    best = int(np.argmin(errors))
    assert len(errors) < EPOCHS, errors  # stopped early
    assert len(errors) == best + 1 + PATIENCE  # exactly `patience` epochs without a better one
    assert all(e >= errors[best] for e in errors[best + 1:])
    model = DBN.load(out / "model.npz", device="cpu")
    assert 1 - model.score(Xv, yv) == pytest.approx(errors[best])  # the best epoch's network, not the last


def test_the_master_keeps_early_stopping_state_as_checkpointed_parameters():
    program = DBNProgram({"hidden_layers": [4], "early_stopping_patience": 2, "validation": "v.parquet"})
    names = program._net_names()
    params = {name: np.full(3, i, np.float32) for i, name in enumerate(names)}
    top, full = Step("finetune", {"top_only": True}, ()), Step("finetune", {"top_only": False}, ())
    for step, error, since, stop in [(full, 0.30, 0, False), (top, 0.40, 1, False), (top, 0.35, 2, False),
                                     (full, 0.31, 3, True)]:
        params = program.after_step(step, params, {"valid_error": error})
        assert int(params[SINCE_BEST]) == since and bool(params[STOP]) is stop and program.finished(params) is stop
    assert float(params[BEST_ERROR]) == 0.30
    assert all(k.startswith(MASTER_STATE) for k in params if k not in names)
    unchanged = {"x": np.zeros(1)}
    assert program.after_step(full, unchanged, {}) is unchanged  # no validation error: nothing to keep


def test_fit_scores_validation_data_in_label_values_and_refuses_two_validation_sets():
    X, y = blobs(300, 0)
    Xv, yv = blobs(100, 1)
    names = np.array(["a", "b", "c"])
    model = DBN([8], pretrain_epochs=1, finetune_epochs=3, device="cpu").fit(X, names[y], validation_data=(Xv, names[yv]))
    errors = [r["valid_error"] for r in model.history_ if r["phase"] == "finetune"]
    assert len(errors) == 3 and errors[-1] == pytest.approx(1 - model.score(Xv, names[yv]))
    with pytest.raises(ValueError, match="choose one validation set"):
        DBN([8], pretrain_epochs=1, finetune_epochs=1, validation_fraction=0.2, device="cpu").fit(
            X, y, validation_data=(Xv, yv))
    with pytest.raises(DataError, match="validation y must hold integer class labels"):  # indices, not text
        DBN([8], pretrain_epochs=1, finetune_epochs=1, device="cpu").fit(X, y, validation_data=(Xv, names[yv]))
    with pytest.raises(DataError, match="label 'd'"):
        DBN([8], pretrain_epochs=1, finetune_epochs=1, device="cpu").fit(X, names[y], validation_data=(Xv, np.full(100, "d")))
