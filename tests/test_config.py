"""Tests for dbn.jobs.spec: TOML job files, defaults from DBN's signature, errors that name the key."""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest

from dbn import DBN
from dbn.cli import main
from dbn.jobs.spec import (
    PAPER, QUICK, ConfigError, DataSection, JobSpec, ModelSection, load_recipe, load_spec, parse_override,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ------------------------------------------------------------------ defaults


def test_model_section_mirrors_dbn_signature():
    params = inspect.signature(DBN.__init__).parameters
    expected = [n for n in params if n not in ("self", "callback", "seed", "device")]
    fields = {f.name: f.default for f in dataclasses.fields(ModelSection)}
    assert list(fields) == expected
    for name, default in fields.items():
        want = params[name].default
        assert default == (tuple(want) if isinstance(want, list) else want), name


def test_job_defaults_come_from_dbn():
    params = inspect.signature(DBN.__init__).parameters
    cfg = load_spec(None)
    assert cfg.job.seed == params["seed"].default
    assert cfg.job.device == params["device"].default


def test_default_config_is_the_paper_run():
    cfg = load_spec(None)
    assert cfg.source is None and cfg.job.name == "mnist" and cfg.output.dir == str(Path("runs/mnist"))
    assert cfg.data == DataSection(train="mnist", test="mnist")
    assert cfg.model.hidden_layers == (500, 500, 2000)
    assert (cfg.model.pretrain_epochs, cfg.model.finetune_epochs) == (50, 100)
    assert (cfg.model.finetune_lr_decay, cfg.model.dropout, cfg.model.input_dropout) == (0.98, 0.5, 0.2)


def test_examples_match_builtin_jobs():
    paper, quick = load_spec(EXAMPLES / "mnist.toml"), load_spec(EXAMPLES / "quick.toml")
    default, default_quick = load_spec(None), load_spec(None, QUICK)
    for section in ("data", "model", "job"):
        assert getattr(paper, section) == getattr(default, section)
    assert (quick.data, quick.model) == (default_quick.data, default_quick.model)
    assert quick.data.limit == 20000 and quick.job.name == "quick"
    assert set(PAPER) >= {"model.finetune_epochs", "model.dropout"}


def test_empty_file_gives_dbn_defaults_and_name_from_file(tmp_path):
    cfg = load_spec(write(tmp_path, "", "exp1.toml"))
    assert cfg.model == ModelSection()
    assert cfg.data == DataSection()
    assert cfg.job.name == "exp1" and cfg.output.dir == str(Path("runs/exp1"))


def test_dbn_params_build_a_model(tmp_path):
    cfg = load_spec(write(tmp_path, "[model]\nhidden_layers = [8, 4]\npretrain_learning_rate = [0.1, 0.05]\n"
                                      "[job]\ndevice = 'cpu'\nseed = 3\n"))
    model = DBN(**cfg.dbn_params())
    assert model.hidden_layers == [8, 4] and model.pretrain_learning_rate == [0.1, 0.05]
    assert model.seed == 3 and model.backend.device == "cpu"


def test_to_dict_is_json_and_config_is_frozen(tmp_path):
    cfg = load_spec(write(tmp_path, "[model]\nhidden_layers = [8, 4]\n"))
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d["model"]["hidden_layers"] == [8, 4]
    assert set(d) == {"data", "model", "output", "job", "cluster", "yarn", "source"}
    assert isinstance(cfg, JobSpec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.model.pretrain_epochs = 1


# ------------------------------------------------------------------- values


def test_types_are_checked_and_numbers_widened(tmp_path):
    cfg = load_spec(write(tmp_path, "[model]\nfinetune_learning_rate = 1\nearly_stopping_patience = 3\n"
                                      "persistent = true\nvisible = 'gaussian'\n"))
    assert cfg.model.finetune_learning_rate == 1.0 and isinstance(cfg.model.finetune_learning_rate, float)
    assert cfg.model.early_stopping_patience == 3 and cfg.model.persistent is True


def test_relative_data_paths_follow_the_config_file(tmp_path):
    (tmp_path / "sub").mkdir()
    cfg = load_spec(write(tmp_path / "sub", "[data]\ntrain = 'train.npz'\ntest = 'mnist'\nmnist_dir = '../m'\n"))
    assert cfg.data.train == str(tmp_path / "sub" / "train.npz")
    assert cfg.data.test == "mnist"
    assert Path(cfg.data.mnist_dir).resolve() == (tmp_path / "m").resolve()


def test_overrides_parse_command_line_strings(tmp_path):
    cfg = load_spec(write(tmp_path, "[model]\npretrain_epochs = 7\n"), {
        "model.pretrain_epochs": "5", "model.hidden_layers": "30,20", "model.dropout": "0.25",
        "model.persistent": "true", "model.early_stopping_patience": "none",
        "model.pretrain_learning_rate": "[0.1, 0.2]", "data.train": "x.npz", "job.name": "42",
        "output.dir": "out/here", "data.limit": 100,
    })
    m = cfg.model
    assert (m.pretrain_epochs, m.hidden_layers, m.dropout, m.persistent) == (5, (30, 20), 0.25, True)
    assert m.early_stopping_patience is None and m.pretrain_learning_rate == (0.1, 0.2)
    assert cfg.data.train == "x.npz"  # overrides stay relative to the current directory
    assert cfg.job.name == "42" and cfg.output.dir == "out/here" and cfg.data.limit == 100


def test_a_string_override_quoted_as_in_the_job_file_loses_its_quotes(tmp_path):
    # --set 'data.features="x*"' once searched for columns named '"x*"', quotes and all.
    cfg = load_spec(None, {"data.features": '"x*"', "job.name": "'run 1'", "data.filter": "split == 'train'",
                           "output.dir": '"unclosed'})
    assert cfg.data.features == "x*" and cfg.job.name == "run 1"
    assert cfg.data.filter == "split == 'train'" and cfg.output.dir == '"unclosed'  # not a quoted string: as given


def test_parse_override():
    assert parse_override("model.dropout = 0.5") == ("model.dropout", "0.5")
    assert parse_override("data.train=a=b.npz") == ("data.train", "a=b.npz")
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("model.dropout")


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize("text, message", [
    ("[model]\nhiden_layers = [5]\n",
     r"job.toml: \[model\] unknown key 'hiden_layers' \(did you mean 'hidden_layers'\?\)"),
    ("[model]\nseed = 1\n", r"job.toml: \[model\] unknown key 'seed' \(it belongs in \[job\]\)"),
    ("[modle]\n", r"job.toml: unknown section \[modle\] \(did you mean 'model'\?\)"),
    ("model = 3\n", r"job.toml: 'model' must be a \[model\] table"),
    ("[model]\npretrain_epochs = '5'\n", r"job.toml: \[model\] pretrain_epochs: expected an integer, got string '5'"),
    ("[model]\npretrain_epochs = 5.0\n", r"\[model\] pretrain_epochs: expected an integer, got float 5.0"),
    ("[model]\ncd_k = true\n", r"\[model\] cd_k: expected an integer, got boolean True"),
    ("[model]\npersistent = 1\n", r"\[model\] persistent: expected a boolean"),
    ("[model]\nhidden_layers = [500, 0]\n", r"\[model\] hidden_layers: expected a non-empty array of positive integers, got array \[500, 0\]"),
    ("[model]\nhidden_layers = 500\n", r"\[model\] hidden_layers: expected"),
    ("[model]\npretrain_learning_rate = ['a']\n", r"\[model\] pretrain_learning_rate: expected an array of numbers"),
    ("[model]\nvisible = 'binary'\n", r"\[model\] visible: must be one of 'bernoulli', 'gaussian'"),
    ("[job]\ndevice = 'tpu'\n", r"\[job\] device: must be one of 'cpu', 'gpu', 'auto'"),
    ("[data]\nlimit = 0\n", r"\[data\] limit: must be a positive"),
    ("[model]\npretrain_batch_size = 0\n", r"\[model\] pretrain_batch_size: must be >= 1, got 0"),
    ("[model]\nfinetune_epochs = -1\n", r"\[model\] finetune_epochs: must be >= 0, got -1"),
    ("[data]\ntrain = 5\n", r"\[data\] train: expected a string, got integer 5"),
    ("[model\n", r"job.toml: invalid TOML"),
])
def test_bad_files_name_file_section_and_key(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_spec(write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match=r"nope.toml: no such config file"):
        load_spec(tmp_path / "nope.toml")


@pytest.mark.parametrize("overrides, message", [
    ({"model.hiden_layers": "5"}, r"command line: \[model\] unknown key 'hiden_layers' \(did you mean 'hidden_layers'\?\)"),
    ({"model.pretrain_epochs": "five"}, r"\[model\] pretrain_epochs: expected an integer, got string 'five'"),
    ({"model.hidden_layers": "500,x"}, r"hidden_layers: expected an array of positive integers"),
    ({"modle.dropout": "0.1"}, r"override 'modle.dropout'.*did you mean 'model'"),
    ({"dropout": "0.1"}, r"override 'dropout': keys look like section.key"),
])
def test_bad_overrides(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_spec(None, overrides)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_cluster_section_defaults_to_one_process_and_validates(tmp_path):
    cfg = load_spec(None)
    assert cfg.cluster.workers == 0 and cfg.cluster.sync_every == 0
    job = tmp_path / "job.toml"
    job.write_text("[cluster]\nworkers = 4\nsync_every = 10\n")
    cfg = load_spec(job)
    assert (cfg.cluster.workers, cfg.cluster.sync_every) == (4, 10)
    job.write_text("[cluster]\nworkers = -1\n")
    with pytest.raises(ConfigError, match=r"\[cluster\] workers: must be >= 0"):
        load_spec(job)
    job.write_text("[cluster]\nheartbeat_timeout = 0\n")
    with pytest.raises(ConfigError, match="heartbeat_timeout"):
        load_spec(job)
    with pytest.raises(ConfigError, match="unknown key 'worker'"):
        load_spec(None, {"cluster.worker": "3"})
    for key, bad in (("block_momentum", "1"), ("pretrain_block_momentum", "-0.1"),
                     ("block_learning_rate", "0"), ("pretrain_block_learning_rate", "-2")):
        with pytest.raises(ConfigError, match=rf"\[cluster\] {key}: must be"):
            load_spec(None, {f"cluster.{key}": bad})
    spec = load_spec(None, {"cluster.block_learning_rate": "3", "cluster.workers": "2"})
    assert spec.program_config()["block_learning_rate"] == 3.0


def test_yarn_section_reads_strings_lists_and_checks_counts(tmp_path):
    cfg = load_spec(write(tmp_path, '[yarn]\nqueue = "ml"\nfile_systems = ["hdfs://a:8020", "hdfs://b"]\n'
                                      'worker_gpus = 2\nkeytab = "me.keytab"\n'))
    assert cfg.yarn.queue == "ml" and cfg.yarn.file_systems == ("hdfs://a:8020", "hdfs://b")
    assert cfg.yarn.worker_gpus == 2 and cfg.yarn.keytab == str(tmp_path / "me.keytab")  # relative to the file
    with pytest.raises(ConfigError, match=r"\[yarn\] file_systems: expected an array of strings"):
        load_spec(write(tmp_path, "[yarn]\nfile_systems = [1]\n"))
    with pytest.raises(ConfigError, match=r"\[yarn\] max_attempts: must be >= 1, got 0"):
        load_spec(write(tmp_path, "[yarn]\nmax_attempts = 0\n"))


# ------------------------------------------------------- the spec as data


def test_spec_round_trips_through_toml_and_json(tmp_path):
    spec = load_spec(EXAMPLES / "yarn.toml", {"model.hidden_layers": "300,100", "data.limit": "500",
                                              "model.pretrain_learning_rate": "[0.1, 0.05]"})
    again = tmp_path / "again.toml"
    again.write_text(spec.to_toml())
    reread = load_spec(again)
    assert (reread.data, reread.model, reread.output, reread.job, reread.cluster, reread.yarn) == \
        (spec.data, spec.model, spec.output, spec.job, spec.cluster, spec.yarn)
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_from_dict_checks_every_value_and_names_the_origin():
    with pytest.raises(ConfigError, match=r"job\.json: \[cluster\] unknown key 'wrokers' \(did you mean 'workers'\?\)"):
        JobSpec.from_dict({"cluster": {"wrokers": 2}}, origin="job.json")
    with pytest.raises(ConfigError, match=r"job\.json: \[model\] hidden_layers: expected a non-empty array"):
        JobSpec.from_dict({"model": {"hidden_layers": []}}, origin="job.json")
    with pytest.raises(ConfigError, match=r"job\.json: \[model\] pretrain_learning_rate has 1 values for 2"):
        JobSpec.from_dict({"model": {"hidden_layers": [4, 2], "pretrain_learning_rate": [0.1]}}, origin="job.json")


def test_replace_checks_the_changed_values_too():
    spec = load_spec(None)
    assert spec.replace(data={"limit": 10}).data.limit == 10
    with pytest.raises(ConfigError, match=r"\[data\] limit: must be a positive number of rows"):
        spec.replace(data={"limit": 0})


def test_master_config_is_the_runtime_part_of_the_spec():
    spec = load_spec(None, {"cluster.workers": 3, "cluster.heartbeat_timeout": 7.5, "cluster.float16_wire": True,
                            "job.seed": 9, "model.n_classes": 10})
    config = spec.master_config(shards=["a.parquet", "b.parquet", "c.parquet"], output="out")
    assert (config.workers, config.heartbeat_timeout, config.float16_wire, config.seed) == (3, 7.5, True, 9)
    assert config.program_config == spec.program_config() and config.program_config["n_classes"] == 10
    # The block momentum follows the shards averaged, where fewer than the workers asked (a small table).
    assert config.program_config["block_momentum"] == pytest.approx(2 / 3)
    one = spec.master_config(shards=["a.parquet"], output="out").program_config
    assert (one["block_momentum"], one["pretrain_block_momentum"], one["block_nesterov"]) == (0.0, 0.0, False)
    assert spec.master_config(shards="dir", output="out", n_shards=1).program_config == one
    assert load_spec(None).program_config()["n_classes"] is None  # the master counts them
    assert config.token == ""  # the launcher's to set; never in a file


def test_reduce_auto_has_the_workers_reduce_on_yarn_from_eight_workers():
    def reduce(workers, setting="auto", on_yarn=False):
        spec = load_spec(None, {"cluster.workers": workers, "cluster.reduce": setting})
        return spec.master_config(shards=["a.parquet"], output="out", on_yarn=on_yarn).reduce

    assert [reduce(n, on_yarn=True) for n in (2, 7, 8, 100)] == ["master", "master", "workers", "workers"]
    assert reduce(100) == "master"  # the local mini-cluster: one machine's cores serve every worker
    assert reduce(2, "workers") == "workers" and reduce(100, "master", on_yarn=True) == "master"
    with pytest.raises(ConfigError, match=r"\[cluster\] reduce: must be one of 'auto', 'master', 'workers', got 'peers'"):
        load_spec(None, {"cluster.reduce": "peers"})


def test_none_on_the_command_line_unsets_optional_string_settings_too():
    assert load_spec(None).data.test == "mnist"
    assert load_spec(None, {"data.test": "none", "cluster.shards": "null"}).data.test is None
    assert load_spec(None, {"data.train": "none"}).data.train == "none"  # not optional: a file's name


# ------------------------------------------------------------------ recipes (dbn mnist --recipe)


def test_the_dropout_recipe_is_the_example_jobs_model_over_the_paper():
    recipe = load_recipe(EXAMPLES / "mnist-dropout.toml")
    assert recipe and all(key.startswith("model.") for key in recipe)
    assert load_spec(None, recipe).model == load_spec(EXAMPLES / "mnist-dropout.toml").model
    model = DBN(**load_spec(None, recipe).dbn_params())
    paper = DBN(**load_spec(None).dbn_params())
    last = model.finetune_epochs - 1
    # Twice the epochs, ending near the paper's last learning rate; momentum 0.9 rising to 0.95.
    assert model.finetune_epochs == 2 * paper.finetune_epochs
    assert model.finetune_schedule(last)[0] == pytest.approx(paper.finetune_schedule(paper.finetune_epochs - 1)[0],
                                                             rel=0.02)
    assert model.finetune_schedule(0)[1] == 0.9 and model.finetune_schedule(33)[1] == pytest.approx(0.925)
    assert model.finetune_schedule(66)[1] == model.finetune_schedule(last)[1] == 0.95


def test_a_recipe_reads_only_model_and_checks_every_key(tmp_path):
    recipe = load_recipe(write(tmp_path, "[model]\nfinetune_epochs = 7\nmax_norm = 4.0\n[data]\nlimit = 10\n"))
    assert recipe == {"model.finetune_epochs": 7, "model.max_norm": 4.0}
    for text, words in (
        ("[data]\nlimit = 10\n", ["needs a [model] table", "[data]"]),
        ("", ["needs a [model] table", "nothing"]),
        ("model = 3\n", ["needs a [model] table"]),
        ("[model]\nfinetune_epoch = 7\n", ["[model] unknown key 'finetune_epoch'", "finetune_epochs"]),
        ("[model]\nfinetune_epochs = 'many'\n", ["[model] finetune_epochs: expected"]),
        ("[model]\nfinetune_epochs = -1\n", ["finetune_epochs: must be >= 0"]),
        ("[model\n", ["invalid TOML"]),
    ):
        path = write(tmp_path, text, "recipe.toml")
        with pytest.raises(ConfigError) as err:
            load_recipe(path)
        assert str(path) in str(err.value) and all(w in str(err.value) for w in words), (text, err.value)


def test_unreadable_config_files_are_named(tmp_path):
    binary = tmp_path / "model.npz"
    binary.write_bytes(b"PK\x03\x04\xff\xfe\x00binary")
    for path, words in ((tmp_path / "missing.toml", "no such config file"), (binary, "not a text file"),
                        (tmp_path, "cannot read config file")):
        for load in (load_recipe, load_spec):
            with pytest.raises(ConfigError) as err:
                load(path)
            assert str(path) in str(err.value) and words in str(err.value), (load, path, err.value)


def test_a_bad_model_value_is_blamed_on_where_it_was_set(tmp_path):
    good, bad = write(tmp_path, "[model]\ndropout = 0.1\n", "good.toml"), write(tmp_path, "[model]\ndropout = 0.1\n"
                                                                                 "finetune_final_momentum = 1.5\n")
    for path, overrides, blamed in ((good, {"model.finetune_final_momentum": "1.5"}, "command line: [model]"),
                                    (None, {"model.finetune_final_momentum": "1.5"}, "command line: [model]"),
                                    (bad, {"model.dropout": "0.2"}, f"{bad}: [model]"),
                                    (bad, {}, f"{bad}: [model]")):
        with pytest.raises(ConfigError) as err:
            load_spec(path, overrides)
        assert str(err.value).startswith(blamed) and "finetune_final_momentum must be in [0, 1)" in str(err.value)


@pytest.mark.parametrize("workers,settings,expected", [
    (0, {}, (0.0, 0.0, False)),            # in this process: nothing to average
    (1, {}, (0.0, 0.0, False)),
    (2, {}, (0.5, 0.5, True)),
    (4, {}, (0.75, 0.7, True)),
    (10, {}, (0.9, 0.7, True)),
    (10, {"block_momentum": 0.0, "pretrain_block_momentum": 0.0}, (0.0, 0.0, False)),  # plain averaging, asked for
    (10, {"block_momentum": 0.3}, (0.3, 0.7, True)),
    (10, {"block_nesterov": False}, (0.9, 0.7, False)),
])
def test_block_momentum_unset_follows_the_worker_count(workers, settings, expected):
    """Plain averaging of N shards once an epoch makes N times fewer effective updates; unset
    block settings take the values that gave one process's accuracy (issue 14; digits)."""
    from dbn.jobs.spec import load_spec

    values = {"cluster.workers": workers, **{f"cluster.{k}": v for k, v in settings.items()}}
    spec = load_spec(None, values)
    resolved = spec.cluster.block_settings()
    assert (resolved["block_momentum"], resolved["pretrain_block_momentum"], resolved["block_nesterov"]) == expected
    config = spec.program_config()
    assert {k: config[k] for k in resolved} == resolved  # what the workers and master train with


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.toml")), ids=lambda path: path.name)
def test_every_shipped_example_loads_and_names_its_own_output(example):
    """Each file in examples/ is a valid job, and no two write to the same folder."""
    spec = load_spec(example)
    others = [load_spec(path) for path in EXAMPLES.glob("*.toml") if path != example]
    assert spec.output.dir not in {other.output.dir for other in others}
    assert spec.job.name not in {other.job.name for other in others}


# ------------------------------------------------------------------ every number finite and bounded (issue 64, class 4)


def _float_settings():
    import typing

    from dbn.jobs.sections import SECTIONS

    return [(section, key) for section, cls in SECTIONS.items()
            for key, hint in typing.get_type_hints(cls).items() if "float" in str(hint)]


@pytest.mark.parametrize("section, key", _float_settings(), ids=lambda v: str(v))
@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])  # as TOML and the command line spell them
def test_every_float_setting_refuses_nan_and_infinity_by_name(section, key, bad):
    """`heartbeat_timeout = nan` passed `value <= 0` and the job hung: every float setting, from a
    job file or the command line, refuses what is not a finite number, naming the setting."""
    from dbn.jobs.sections import check_setting

    for value, strings in ((float(bad), False), (bad, True)):
        with pytest.raises(ConfigError, match=rf"\[{section}\] {key}: must be a finite number"):
            check_setting("job.toml", section, key, value, parse_strings=strings)


def test_an_epoch_count_whose_schedule_would_not_fit_memory_is_refused_by_name(tmp_path, capsys):
    """`finetune_epochs = 10**21` grew the master to 3.3 GB before any step."""
    job = tmp_path / "job.toml"
    job.write_text("[data]\ntrain = 'mnist'\n[model]\nfinetune_epochs = 1000000000000000000000\n")
    assert main(["train", str(job), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "[model] finetune_epochs: at most 100,000 epochs" in err and "Traceback" not in err, err

