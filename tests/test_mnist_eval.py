"""`dbn mnist`: the evaluation script, on real MNIST from ../shared (reduced sizes, real processes)."""

import json
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from dbn.cli import main
from dbn.jobs.mnist_eval import PUBLISHED, SWEEP_MARKER, mnist_config, prepare_validation, sweep_table
from iterreduce.storage import ownership

from conftest import MNIST_DIR

RESULT_KEYS = {"test_error", "layers", "workers", "sync_every", "epochs", "wall_seconds", "pretrain_seconds",
               "finetune_seconds", "sync_fraction", "seed", "device"}


@pytest.fixture(autouse=True)
def _mnist_files():
    from dbn.data import mnist

    if not all((MNIST_DIR / name).is_file() for name in mnist.MNIST_FILES):
        pytest.skip(f"real MNIST files not found in {MNIST_DIR}")


def tiny(out, *extra):
    return ["mnist", "--data", str(MNIST_DIR), "--out", str(out), "--local", "2", "--layers", "32",
            "--set", "data.limit=1500", "--set", "model.pretrain_epochs=2", "--set", "model.finetune_epochs=3",
            "--quiet", *extra]


def test_mnist_writes_result_log_and_plots(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(tiny(out, "--validation", "300", "--seed", "3")) == 0
    assert "test error" in capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    assert RESULT_KEYS <= set(result)
    assert result["layers"] == [784, 32, 10] and result["workers"] == 2 and result["seed"] == 3
    assert result["train_images"] == 1500 and result["validation_images"] == 300
    assert 0.0 <= result["test_error"] < 0.5 and result["epochs"] == {"pretrain": 2, "finetune": 3}
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    valid = [r["valid_error"] for r in records if r.get("phase") == "finetune"]
    assert len(valid) == 3 and all(0 <= v <= 1 for v in valid)
    for name in ("reconstruction.png", "finetune.png", "filters.png"):
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0.01, name


def test_a_recipe_sets_the_model_and_the_command_line_wins_over_it(tmp_path, capsys):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("[model]\nfinetune_epochs = 2\nfinetune_final_momentum = 0.95\nfinetune_momentum_epochs = 1\n"
                      "input_dropout = 0.1\npretrain_epochs = 9\n")
    out = tmp_path / "report"
    # tiny() sets pretrain_epochs=2 and finetune_epochs=3 with --set: those win over the recipe's.
    assert main(tiny(out, "--recipe", str(recipe))) == 0
    model = json.loads((out / "config.json").read_text())["model"]
    assert (model["finetune_final_momentum"], model["finetune_momentum_epochs"], model["input_dropout"]) == (0.95, 1, 0.1)
    assert (model["pretrain_epochs"], model["finetune_epochs"]) == (2, 3)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["momentum"] for r in records if r.get("phase") == "finetune"] == [0.9, 0.95, 0.95]
    capsys.readouterr()
    # A recipe over the distributed defaults: its epochs replace the 150 fine-tuning epochs of 10 workers.
    recipe.write_text("[model]\nfinetune_epochs = 200\n")
    from dbn.jobs.spec import load_recipe

    assert mnist_config(out=str(tmp_path), workers=10, overrides=load_recipe(recipe)).model.finetune_epochs == 200
    # The shipped recipe is fine-tuning only: on 10 workers pre-training keeps dbn mnist's longer schedule.
    shipped = load_recipe(Path(__file__).resolve().parents[1] / "examples" / "mnist-dropout.toml")
    assert set(shipped) >= {"model.finetune_epochs", "model.finetune_final_momentum"}
    ten = mnist_config(out=str(tmp_path), workers=10, overrides=shipped)
    assert (ten.model.pretrain_epochs, ten.model.finetune_epochs) == (100, 200)
    assert main(["mnist", "--recipe", str(tmp_path / "nope.toml"), "--out", str(tmp_path / "x")]) == 2
    assert "nope.toml: no such config file" in capsys.readouterr().err


@pytest.mark.parametrize("args, says", [
    (["--local", "0"], "--local 0: a mini-cluster needs at least 1 worker"),
    (["--sweep", "--local", "3"], "--sweep trains each size on 1 and 10 workers; drop --local"),
    (["--sweep", "--layers", "100"], "--sweep trains its own sizes (300-300-1000, 500-500-2000, 1000-1000-2000)"),
    (["--sweep", "--set", "model.hidden_layers=[50]"], "model.hidden_layers (from --recipe, --layers or --set)"),
    (["--seed", "-1"], "command line: [job] seed must be a non-negative integer"),
])
def test_flags_that_would_be_ignored_or_misread_are_refused(tmp_path, capsys, args, says):
    """Before: --local 0 ran 10 workers, --sweep dropped --local, and hidden_layers from a recipe or
    --set replaced every size of the sweep (each row then trained the same network)."""
    assert main(["mnist", *args, "--out", str(tmp_path / "out"), "--no-ui"]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_validation_images_are_held_out_of_training(tmp_path):
    cfg = mnist_config(out=str(tmp_path), workers=2, quick=True, data_dir=str(MNIST_DIR))
    held = prepare_validation(cfg, 5000, str(tmp_path))
    assert held.data.limit == cfg.data.limit  # the quick run's first images end long before the last 5,000
    full = prepare_validation(mnist_config(out=str(tmp_path), workers=2, data_dir=str(MNIST_DIR)), 5000, str(tmp_path))
    assert full.data.limit == 55000 and full.cluster.validation.endswith(".parquet")
    with pytest.raises(ValueError, match="--validation 60000: must leave training images"):
        prepare_validation(cfg, 60000, str(tmp_path))


def test_block_momentum_follows_the_worker_count_unless_set(tmp_path):
    def momentum(**kwargs):
        return mnist_config(out=str(tmp_path), **kwargs).cluster.block_settings()["block_momentum"]

    assert momentum(workers=1) == 0.0
    assert momentum(workers=2) == 0.5
    assert momentum(workers=10) == 0.9
    assert momentum(workers=10, overrides={"cluster.block_momentum": 0.0}) == 0.0


def test_sweep_table_sits_beside_the_published_figures():
    result = {"test_error": 0.0123, "wall_seconds": 100.0, "pretrain_seconds": 40.0, "finetune_seconds": 55.0}
    table = sweep_table([((500, 500, 2000), 10, result), ((300, 300, 1000), 1, result)], quick=False)
    assert "| 500-500-2000 | 10 | **1.23 %** | 1.66 % (PayPal 2014, 10 nodes) |" in table
    assert "| 300-300-1000 | 1 | **1.23 %** | - |" in table
    assert PUBLISHED[(500, 500, 2000)][1][0] == "1.2 %"
    resumed = sweep_table([((300, 300, 1000), 1, {**result, "resumed_at_step": 17})], quick=False)
    assert "| 100 s (resumed at step 17) | 40 s |" in resumed and "resumed" not in table


def test_yarn_needs_an_hdfs_output(capsys):
    assert main(["mnist", "--yarn"]) == 2
    assert "--yarn needs --hdfs-out URI" in capsys.readouterr().err


def test_sweep_runs_every_pair_and_writes_the_table(tmp_path, monkeypatch, capsys):
    import dbn.jobs.mnist_eval as ev

    monkeypatch.setattr(ev, "SWEEP_LAYERS", ((16,),))
    monkeypatch.setattr(ev, "SWEEP_WORKERS", (1, 2))
    assert main(["mnist", "--sweep", "--data", str(MNIST_DIR), "--out", str(tmp_path), "--set", "data.limit=600",
                 "--set", "model.pretrain_epochs=1", "--set", "model.finetune_epochs=1", "--quiet"]) == 0
    table = (tmp_path / "sweep.md").read_text()
    assert table == f"{SWEEP_MARKER}\n{capsys.readouterr().out}"  # what it prints, under the sweep's marker line
    rows = [line for line in table.splitlines() if line.startswith("| 16 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "2"]
    for name in ("16_w1", "16_w2"):
        assert json.loads((tmp_path / name / "result.json").read_text())["test_error"] < 0.9

    # The same command again goes on where the sweep stopped: a finished pair is kept as it is,
    # a pair whose run was cut short (here: no model or result yet) resumes from its checkpoint.
    kept, cut = tmp_path / "16_w1", tmp_path / "16_w2"
    def files(folder):  # the run's files (the lock file names its newest holder: bookkeeping, not the run)
        return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ownership.LOCK_NAME}

    before = files(kept)
    model = np.load(cut / "model.npz")
    model = {k: model[k] for k in model.files}
    (cut / "model.npz").unlink()
    (cut / "result.json").unlink()
    assert main(["mnist", "--sweep", "--data", str(MNIST_DIR), "--out", str(tmp_path), "--set", "data.limit=600",
                 "--set", "model.pretrain_epochs=1", "--set", "model.finetune_epochs=1"]) == 0
    err = capsys.readouterr().err
    assert "16_w1: finished before" in err and "kept" in err
    assert files(kept) == before
    assert not (kept / "previous").exists()
    events = [json.loads(line).get("event") for line in (cut / "log.jsonl").read_text().splitlines()]
    assert "resumed" in events
    again = np.load(cut / "model.npz")
    assert set(again.files) == set(model) and all(np.array_equal(again[k], model[k]) for k in model)
    assert (tmp_path / "sweep.md").read_text().count("| 16 |") == 2


def test_a_run_resumes_locally_only(tmp_path, capsys):
    assert main(["mnist", "--yarn", "--hdfs-out", "hdfs:///x", "--resume", "--out", str(tmp_path)]) == 2
    assert "--resume runs on the local mini-cluster" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_evaluation_learns_mnist(tmp_path):
    """The README's `dbn mnist --quick` on 8,000 images with 5 + 10 epochs (45 s instead of 5 min
    on 2 cores; 6.4 % measured): a sanity bound that catches a run that stopped learning. The
    accuracy of the whole quick run is a benchmark figure (benchmarks/RESULTS.md, "Quick runs")."""
    assert main(["mnist", "--quick", "--data", str(MNIST_DIR), "--out", str(tmp_path), "--quiet",
                 "--epochs", "5", "--finetune-epochs", "10", "--set", "data.limit=8000"]) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["test_error"] < 0.10, result
    assert np.isfinite(result["sync_fraction"])


def test_full_run_trains_longer_on_several_workers(tmp_path):
    one, ten = (mnist_config(out=str(tmp_path), workers=n).model for n in (1, 10))
    assert (one.pretrain_epochs, one.finetune_epochs, one.finetune_lr_decay) == (50, 100, 0.98)
    assert (ten.pretrain_epochs, ten.finetune_epochs) == (100, 150)
    assert ten.finetune_lr_decay ** 150 == pytest.approx(one.finetune_lr_decay ** 100)  # the same last rate
    assert mnist_config(out=str(tmp_path), workers=2, quick=True).model.pretrain_epochs == 20
    assert mnist_config(out=str(tmp_path), workers=10,
                        overrides={"model.pretrain_epochs": 7}).model.pretrain_epochs == 7


def test_quick_run_on_many_workers_trains_three_times_the_epochs_to_the_same_last_rate(tmp_path):
    two, ten = (mnist_config(out=str(tmp_path), workers=n, quick=True).model for n in (2, 10))
    assert (two.pretrain_epochs, two.finetune_epochs, two.finetune_lr_decay) == (20, 30, 0.98)
    assert (ten.pretrain_epochs, ten.finetune_epochs) == (60, 90)
    assert ten.finetune_lr_decay ** 90 == pytest.approx(two.finetune_lr_decay ** 30)
    assert mnist_config(out=str(tmp_path), workers=10, quick=True,
                        overrides={"model.finetune_epochs": 5}).model.finetune_epochs == 5


def test_nesterov_block_momentum_on_several_workers_only(tmp_path):
    def nesterov(**kwargs):
        return mnist_config(out=str(tmp_path), **kwargs).cluster.block_settings()["block_nesterov"]

    assert not nesterov(workers=1)
    assert nesterov(workers=2, quick=True)
    assert nesterov(workers=10)
