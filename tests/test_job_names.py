"""A job's name names files and folders (runs/<name>, the YARN submission's folder): it must
be one safe path component, checked where it is read, with errors naming the key and value."""

from __future__ import annotations

import pytest
import tomli_w

from dbn.cli import main
from dbn.errors import ConfigError
from dbn.jobs.spec import JobSection, load_spec, name_problem

UNSAFE = ["../outside", "a/b", "..", "../../etc/cron.d/x", "/abs", "a\\b", "C:x", ".hidden", "x..y", "", " x",
          "x\n", "a\x00b", "x" * 101]
SAFE = ["mnist", "run 1", "42", "mnist-dropout", "exp_1.v2", "a+b=c,d@e", "modèle"]


@pytest.mark.parametrize("name", UNSAFE)
def test_an_unsafe_name_is_refused_naming_the_key_and_the_value(name, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(tomli_w.dumps({"job": {"name": name}}))
    with pytest.raises(ConfigError, match=r"\[job\] name: .* cannot name a job's files") as info:
        load_spec(job)
    assert str(job) in str(info.value) and repr(name) in str(info.value)
    with pytest.raises(ConfigError, match=r"^command line: \[job\] name: "):
        load_spec(None, {"job.name": name})
    with pytest.raises(ConfigError, match=r"^\[job\] name "):
        JobSection(name=name)


@pytest.mark.parametrize("name", SAFE)
def test_safe_names_name_their_output_folder(name):
    assert name_problem(name) is None
    assert load_spec(None, {"job.name": tomli_w.dumps({"v": name})[4:].strip()}).output.dir == f"runs/{name}"


def test_a_job_file_whose_own_name_is_unsafe_must_name_its_job(tmp_path):
    job = tmp_path / ".hidden.toml"
    job.write_text("[model]\nhidden_layers = [3]\n")
    with pytest.raises(ConfigError, match=r"the job file's name '.hidden' cannot name .*; set \[job\] name"):
        load_spec(job)
    job.write_text("[job]\nname = \"fine\"\n")
    assert load_spec(job).output.dir == "runs/fine"


def test_dbn_train_refuses_a_name_outside_the_output_folder_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--set", "job.name=../escaped", "--set", "data.limit=10"]) == 2
    assert capsys.readouterr().err.startswith("dbn: error: command line: [job] name: '../escaped'")
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / "escaped").exists()
