"""Tests for the dbn command line, run in-process through dbn.cli.main."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dbn import DBN
import dbn
from dbn.cli import main
from dbn.data.mnist import MNIST_FILES
from dbn.jobs.spec import QUICK

REPO = Path(__file__).resolve().parents[1]
REAL_MNIST = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
HAVE_MNIST = all((REAL_MNIST / name).is_file() for name in MNIST_FILES)

N_FEATURES, N_CLASSES = 24, 3
BENCH_KEYS = {
    "samples_per_s", "gflops", "sgemm_gflops", "ratio_to_sgemm", "sklearn_samples_per_s", "ratio_to_sklearn",
    "device", "batch", "n_visible", "n_hidden", "numpy_version", "blas", "date",
}


def make_dataset(path: Path, n: int = 300, seed: int = 0) -> Path:
    """Binary features whose on-probability depends on the class: learnable, in [0, 1]."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, N_CLASSES, n)
    p = np.where(np.arange(N_FEATURES) % N_CLASSES == y[:, None], 0.8, 0.1)
    X = (rng.random((n, N_FEATURES)) < p).astype(np.float32)
    np.savez(path, X=X, y=y)
    return path


@pytest.fixture
def job(tmp_path):
    """A tiny job file training on a generated .npz; returns (config, output dir)."""
    make_dataset(tmp_path / "train.npz")
    make_dataset(tmp_path / "test.npz", n=120, seed=1)
    config = tmp_path / "tiny.toml"
    config.write_text(
        "[data]\ntrain = 'train.npz'\ntest = 'test.npz'\n"
        "[model]\nhidden_layers = [16, 8]\npretrain_epochs = 2\nfinetune_epochs = 3\ntop_layer_epochs = 1\n"
        "pretrain_batch_size = 20\nfinetune_batch_size = 20\n"
        "[job]\nseed = 1\ndevice = 'cpu'\n"
    )
    return config, tmp_path / "out"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------- train


def test_train_writes_model_log_config_and_result(job, capsys):
    config, out = job
    assert main(["train", str(config), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "pretrain layer 1/2 epoch 1/2  recon" in captured.err
    assert "finetune epoch 3/3  loss" in captured.err and "samples/s" in captured.err
    assert "test error" in captured.out

    model = DBN.load(out / "model.npz", device="cpu")
    assert model.hidden_layers == [16, 8] and model.n_classes_ == N_CLASSES

    result = json.loads((out / "result.json").read_text())
    for key in ("test_error", "layers", "epochs", "wall_seconds", "pretrain_seconds", "finetune_seconds", "device", "seed"):
        assert key in result, key
    assert result["layers"] == [N_FEATURES, 16, 8, N_CLASSES]
    assert result["epochs"]["pretrain"] == 2 and result["epochs"]["finetune"] == 3
    assert result["device"] == "cpu" and result["seed"] == 1 and 0 <= result["test_error"] <= 1

    config_json = json.loads((out / "config.json").read_text())
    assert config_json["model"]["hidden_layers"] == [16, 8] and config_json["job"]["seed"] == 1

    log = read_jsonl(out / "log.jsonl")
    assert log[0]["event"] == "start" and log[-1]["event"] == "summary"
    epochs = [r for r in log if r["event"] == "epoch"]
    assert len(epochs) == 2 * 2 + 3
    assert log[-1]["test_error"] == result["test_error"]

    # A second run of the same job keeps the first run's log in previous/1 and starts its own.
    first_log = (out / "log.jsonl").read_bytes()
    assert main(["train", str(config), "--out", str(out), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert (out / "previous" / "1" / "log.jsonl").read_bytes() == first_log
    assert len(read_jsonl(out / "log.jsonl")) == len(log)


def test_train_json_lines_and_flags_override_the_file(job, capsys):
    config, out = job
    code = main(["train", str(config), "--out", str(out), "--json", "--quiet", "--epochs", "1",
                 "--finetune-epochs", "2", "--layers", "12,6,4", "--set", "model.dropout=0.1", "--set", "job.seed=5"])
    assert code == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert [r["event"] for r in records] == ["data"] + ["epoch"] * (3 * 1 + 2) + ["summary"]
    assert records[0]["rows"] == 300 and sum(records[0]["classes"]) == 300 and records[0]["warnings"] == []
    assert records[1]["phase"] == "pretrain" and records[1]["samples_per_s"] > 0
    summary = records[-1]
    assert summary["layers"] == [N_FEATURES, 12, 6, 4, N_CLASSES] and summary["seed"] == 5
    assert summary["params"]["dropout"] == 0.1
    assert json.loads((out / "result.json").read_text())["test_error"] == summary["test_error"]


def test_train_without_test_set_and_data_limit(tmp_path, capsys):
    make_dataset(tmp_path / "d.npz")
    config = tmp_path / "job.toml"
    config.write_text("[data]\ntrain = 'd.npz'\nlimit = 100\n[model]\nhidden_layers = [8]\n"
                      "pretrain_epochs = 1\nfinetune_epochs = 1\n[job]\ndevice = 'cpu'\n")
    assert main(["train", str(config), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert "no test set" in capsys.readouterr().out
    result = json.loads((tmp_path / "o" / "result.json").read_text())
    assert result["test_error"] is None and result["n_train"] == 100


def test_default_output_dir_is_runs_name(job, monkeypatch, capsys):
    config, _ = job
    monkeypatch.chdir(config.parent)
    assert main(["train", str(config), "--quiet", "--finetune-epochs", "1"]) == 0
    assert (config.parent / "runs" / "tiny" / "model.npz").is_file()


def test_quick_reduces_the_run_and_keeps_its_own_output_dir(job, monkeypatch, capsys):
    config, _ = job
    monkeypatch.chdir(config.parent)
    assert main(["train", str(config), "--quick", "--quiet", "--layers", "4", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["epochs"]["pretrain"] == QUICK["model.pretrain_epochs"]
    assert summary["n_train"] == min(300, QUICK["data.limit"])
    assert (config.parent / "runs" / "tiny-quick" / "result.json").is_file()


def test_ctrl_c_gives_a_message_and_nonzero_exit(job, monkeypatch, capsys):
    config, out = job

    def interrupted(self, X):
        raise KeyboardInterrupt

    monkeypatch.setattr(DBN, "pretrain", interrupted)
    assert main(["train", str(config), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err
    assert not (out / "model.npz").exists()
    assert read_jsonl(out / "log.jsonl")[-1]["event"] == "interrupted"


# ------------------------------------------------------------------- evaluate


def test_evaluate(job, capsys):
    config, out = job
    assert main(["train", str(config), "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    capsys.readouterr()
    test_npz = str(config.parent / "test.npz")
    assert main(["evaluate", str(out / "model.npz"), "--data", test_npz, "--device", "cpu"]) == 0
    assert "test error" in capsys.readouterr().out
    assert main(["evaluate", str(out / "model.npz"), "--data", test_npz, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["test_error"] == pytest.approx(result["test_error"])
    assert record["n_samples"] == 120


@pytest.mark.skipif(not HAVE_MNIST, reason=f"real MNIST files not found in {REAL_MNIST}")
def test_evaluate_on_mnist_with_wrong_feature_count(job, capsys):
    config, out = job
    assert main(["train", str(config), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(out / "model.npz"), "--mnist-dir", str(REAL_MNIST)]) == 2
    assert (f"dbn: error: mnist against {out / 'model.npz'}: X has 784 features but the model expects 24"
            in capsys.readouterr().err)


# --------------------------------------------------------------------- errors


@pytest.mark.parametrize("text, message", [
    ("[model]\nhiden_layers = [5]\n", "[model] unknown key 'hiden_layers' (did you mean 'hidden_layers'?)"),
    ("[model]\npretrain_epochs = 'many'\n", "[model] pretrain_epochs: expected an integer, got string 'many'"),
    ("[model]\ndropout = 1.5\n", "dropout must be in [0, 1)"),
    ("[data]\ntrain = 'missing.npz'\n", "missing.npz: no such data file"),
])
def test_bad_config_exits_2_with_message(tmp_path, capsys, text, message):
    config = tmp_path / "job.toml"
    config.write_text(text + "[job]\ndevice = 'cpu'\n")
    assert main(["train", str(config), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dbn: error: ") and message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_a_directory_as_a_data_file_says_where_shards_and_tables_go(tmp_path, capsys):
    (tmp_path / "shards").mkdir()
    config = tmp_path / "job.toml"
    config.write_text("[data]\ntrain = 'shards'\n[job]\ndevice = 'cpu'\n")
    for argv in (["train", str(config), "--out", str(tmp_path / "o")],
                 ["shard", str(tmp_path / "shards"), str(tmp_path / "o"), "--shards", "2"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"dbn: error: {tmp_path / 'shards'}: a directory, not a data file"), err
        assert "[cluster] shards" in err and "[data] features" in err and "Traceback" not in err
        assert not (tmp_path / "o").exists()


def test_missing_config_file_and_bad_set(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.toml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dbn: error: ") and "nope.toml: no such config file" in err
    assert main(["train", "--set", "model.dropout"]) == 2
    assert "expected section.key=value" in capsys.readouterr().err
    assert main(["train", "--set", "model.dropuot=0.1"]) == 2
    assert "did you mean 'dropout'" in capsys.readouterr().err


def test_a_run_refused_for_its_data_leaves_no_folder_it_made(tmp_path, capsys, monkeypatch):
    """The default output folder is runs/<name> in the working folder: a run refused for bad data
    removes what it made for it, runs/ too, and nothing that was there before."""
    np.savez(tmp_path / "noy.npz", X=np.zeros((3, 2)))
    config = tmp_path / "job.toml"
    config.write_text("[data]\ntrain = 'noy.npz'\n[job]\ndevice = 'cpu'\n")
    for there in ([], ["runs"]):
        cwd = tmp_path / f"cwd{len(there)}"
        cwd.mkdir()
        for folder in there:
            (cwd / folder).mkdir()
        monkeypatch.chdir(cwd)
        assert main(["train", str(config)]) == 2
        assert "no labels (a .npz's array 'y'" in capsys.readouterr().err
        assert sorted(str(p.relative_to(cwd)) for p in cwd.rglob("*")) == there


def test_bad_npz_and_missing_model(tmp_path, capsys):
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    np.savez(tmp_path / "noy.npz", X=np.zeros((3, 2)))
    for data, message in (("bad.npz", "not a readable .npz file"), ("noy.npz", "no labels (a .npz's array 'y'")):
        config = tmp_path / "job.toml"
        config.write_text(f"[data]\ntrain = '{data}'\n[job]\ndevice = 'cpu'\n")
        assert main(["train", str(config)]) == 2
        assert message in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "none.npz")]) == 2
    assert "dbn: error: " in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(dbn.ModelFileError):
        main(["evaluate", str(tmp_path / "none.npz"), "--debug"])


def test_version_help_and_usage(capsys):
    assert main(["--version"]) == 0
    assert dbn.__version__ in capsys.readouterr().out
    assert main([]) == 2
    assert main(["frobnicate"]) == 2
    assert main(["train", "--help"]) == 0
    assert "--finetune-epochs" in capsys.readouterr().out


def _subcommands(parser, prefix=("dbn",)):
    """(command words, parser) of every command and subcommand, depth first."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*prefix, name), sub, helps.get(name)
                yield from _subcommands(sub, (*prefix, name))


def test_every_command_has_a_description_and_every_option_a_help():
    from dbn.cli import build_parser

    parser = build_parser()
    commands = list(_subcommands(parser))
    assert {" ".join(words) for words, *_ in commands} >= {"dbn train", "dbn evaluate", "dbn bench rbm", "dbn mnist"}
    for words, sub, summary in [(("dbn",), parser, "top"), *commands]:
        name = " ".join(words)
        assert summary, f"{name}: no help line in its parent's list of commands"
        assert sub.description, f"{name}: no description"
        for action in sub._actions:
            what = "/".join(action.option_strings) or action.dest
            assert action.help, f"{name} {what}: no help text"


@pytest.mark.parametrize("command", ["status", "logs", "kill"])
@pytest.mark.parametrize("fake_yarn", [False, True], ids=["no-yarn", "broken-yarn"])
def test_yarn_commands_without_yarn_fail_cleanly_and_write_nothing(tmp_path, command, fake_yarn):
    """No Hadoop here: only `dbn: error:` on stderr, exit 2, and no ~/.skein left behind
    (skein writes its credentials there before it tries to start a driver)."""
    import os

    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()
    if fake_yarn:  # a `yarn` that cannot give skein a classpath
        (bin_dir / "yarn").write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / "yarn").chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("HADOOP_CONF_DIR", "HADOOP_HOME", "ITERREDUCE_SKEIN_DRIVER", "SKEIN_CONFIG", "JAVA_HOME")}
    env.update(HOME=str(home), PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"]))
    proc = subprocess.run([sys.executable, "-m", "dbn.cli", command, "application_1_1"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    dbn_lines = [line for line in proc.stderr.splitlines() if line.startswith("dbn: ")]
    assert len(dbn_lines) == 1 and dbn_lines[0].startswith("dbn: error: cannot reach YARN")
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    if not fake_yarn:
        assert proc.stderr == dbn_lines[0] + "\n"  # nothing else at all
    assert not (home / ".skein").exists()


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_a_driver_that_fails_to_start_is_quoted_in_the_error_and_shown_whole_with_debug(tmp_path, debug):
    """skein's Java driver logs to the terminal unless told otherwise: its log goes to the project's
    logger, so the terminal shows one error naming the driver's last words (no INFO line of its own),
    and --debug shows every line it logged."""
    import os

    home, bin_dir, jdk = tmp_path / "home", tmp_path / "bin", tmp_path / "jdk" / "bin"
    for folder in (home, bin_dir, jdk):
        folder.mkdir(parents=True)
    (bin_dir / "yarn").write_text("#!/bin/sh\necho /nowhere/hadoop.jar\n")  # skein asks for the classpath
    (jdk / "java").write_text("#!/bin/sh\n" + "".join(
        f'echo "26/12/07 21:0{k}:00 INFO skein.Driver: noise {k}" >&2\n' for k in range(40))
        + 'echo "Error: Could not find or load main class com.anaconda.skein.Driver" >&2\nexit 1\n')
    for script in (bin_dir / "yarn", jdk / "java"):
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("HADOOP_CONF_DIR", "ITERREDUCE_SKEIN_DRIVER", "SKEIN_CONFIG")}
    env.update(HOME=str(home), JAVA_HOME=str(jdk.parent),
               PATH=os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), "/usr/bin", "/bin"]))
    proc = subprocess.run([sys.executable, "-m", "dbn.cli", "status", "application_1_1", *(["--debug"] * debug)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == (1 if debug else 2), proc.stderr
    last_words = "Error: Could not find or load main class com.anaconda.skein.Driver"
    if debug:  # every line, each once, marked as the driver's; then the traceback
        shown = [line for line in proc.stderr.splitlines() if line.startswith("skein driver: ")]
        assert len(shown) == 41 and shown[0].endswith("noise 0") and shown[-1] == f"skein driver: {last_words}"
        assert "Traceback" in proc.stderr
    else:
        message, *quoted = proc.stderr.splitlines()
        assert message.startswith("dbn: error: cannot reach YARN through skein's driver: Failed to start java process")
        assert message.endswith("The driver's last words:"), message
        assert len(quoted) == 30 and quoted[-1] == last_words and quoted[0].endswith("noise 11"), quoted
    assert not (home / ".skein").exists()


@pytest.mark.parametrize("command", ["status", "logs", "kill"])
@pytest.mark.parametrize("app_id", ["notanid", "application_1", "app_1_2", "application_1_2 "])
def test_yarn_commands_refuse_what_is_not_an_application_id_before_reaching_yarn(capsys, command, app_id):
    assert main([command, app_id]) == 2
    err = capsys.readouterr().err
    assert f"dbn: error: {app_id!r} is not a YARN application id" in err and "cannot reach YARN" not in err


def test_python_m_dbn_cli():
    proc = subprocess.run([sys.executable, "-m", "dbn.cli", "--version"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and dbn.__version__ in proc.stdout


# ---------------------------------------------------------------------- bench


def test_bench_rbm_json(capsys):
    code = main(["bench", "rbm", "--json", "--seconds", "0.5", "--hidden", "64", "--visible", "100", "--no-sklearn"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert BENCH_KEYS <= set(result)
    assert (result["n_hidden"], result["n_visible"], result["batch"], result["device"]) == (64, 100, 100, "cpu")
    assert result["samples_per_s"] > 0 and result["sgemm_gflops"] > 0
    assert result["gflops"] == pytest.approx(result["samples_per_s"] * 10 * 100 * 64 / 1e9)
    assert result["ratio_to_sgemm"] == pytest.approx(result["gflops"] / result["sgemm_gflops"])
    assert result["sklearn_samples_per_s"] is None and result["ratio_to_sklearn"] is None


def test_bench_rbm_table_with_sklearn(capsys):
    pytest.importorskip("sklearn")
    code = main(["bench", "rbm", "--seconds", "0.1", "--rounds", "1", "--hidden", "16", "--visible", "20",
                 "--sgemm-size", "128", "--sklearn", "--mapping", "one-process"])
    assert code == 0
    out = capsys.readouterr().out
    assert "sgemm 128^3" in out and "rbm 20x16  one-process" in out and "sklearn 20x16  one-process" in out
    assert "rbm 20x16 / scikit-learn (one-process):" in out


def test_bench_per_core_runs_one_process_per_core_and_adds_their_samples(capsys):
    """Per-core: one single-threaded trainer in each of os.cpu_count() processes, samples summed."""
    code = main(["bench", "rbm", "--json", "--seconds", "0.4", "--rounds", "2", "--hidden", "32", "--visible", "40",
                 "--sgemm-size", "256", "--no-sklearn", "--mapping", "per-core"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["mapping"] == "per-core" and result["processes"] == os.cpu_count()
    assert len(result["samples_per_s_rounds"]) == 2 and min(result["samples_per_s_rounds"]) > 0
    assert len(result["sgemm_gflops_rounds"]) == 3  # one before each round and one after the last


def test_bench_all_measures_the_main_jobs_shapes_and_finetuning(capsys):
    code = main(["bench", "all", "--json", "--seconds", "0.05", "--rounds", "1", "--batch", "20",
                 "--sgemm-size", "256", "--mapping", "one-process"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in result["results"]]
    assert names == ["rbm 784x500", "rbm 500x500", "rbm 500x2000", "finetune 784-500-500-2000-10"]
    for r in result["results"]:
        assert r["mapping"] == "one-process" and r["batch"] == 20 and r["samples_per_s"] > 0
        assert r["gflops"] == pytest.approx(r["samples_per_s"] * r["flops_per_sample"] / 1e9)
        assert r["ratio_to_sgemm"] == pytest.approx(r["gflops"] / result["sgemm_gflops"])
    weights = 784 * 500 + 500 * 500 + 500 * 2000 + 2000 * 10
    assert result["results"][3]["flops_per_sample"] == 6 * weights - 2 * 784 * 500  # no delta below layer 0
    assert main(["bench", "all", "--mapping", "sideways"]) == 2


def test_bench_rejects_bad_sizes(capsys):
    assert main(["bench", "rbm", "--hidden", "0", "--no-sklearn"]) == 2
    assert "dbn: error:" in capsys.readouterr().err


def test_one_process_trains_on_the_shards_the_job_names(tmp_path, capsys):
    """[cluster] shards without --local: the shards are the data, never [data] train (MNIST by default)."""
    from shardio.shards import write_shards

    make_dataset(tmp_path / "d.npz", n=240)
    with np.load(tmp_path / "d.npz") as d:
        write_shards(d["X"], d["y"], str(tmp_path / "shards"), 3)
    assert main(["train", "--set", f"cluster.shards={tmp_path / 'shards'}", "--set", "data.test=none",
                 "--layers", "8", "--epochs", "1", "--finetune-epochs", "1", "--device", "cpu",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 0
    result = json.loads((tmp_path / "o" / "result.json").read_text())
    assert result["n_train"] == 240 and result["layers"] == [N_FEATURES, 8, N_CLASSES]

    write_shards(np.zeros((4, N_FEATURES), np.float32), None, str(tmp_path / "unlabelled"), 2)
    assert main(["train", "--set", f"cluster.shards={tmp_path / 'unlabelled'}", "--layers", "8",
                 "--out", str(tmp_path / "u"), "--quiet"]) == 2
    assert "part-00000.parquet: no 'label' column" in capsys.readouterr().err
    assert not (tmp_path / "u").exists()


def test_bench_names_a_per_core_process_that_died():
    from dbn.errors import BackendError
    from dbn.jobs.bench import contender, measure

    broken = contender("rbm", n_visible=4, n_hidden=3, batch=0)  # the children divide by the batch size
    with pytest.raises(BackendError, match="rbm 4x3 ended early"):
        measure([broken], mappings=("per-core",), seconds=0.1, rounds=1, sgemm_size=64)
