"""No secret in what a run shows, keeps or sends (issue 64, class 2): a password in a URI
(`[output] mlflow`, `[data] metastore`, `MLFLOW_TRACKING_URI`) is hidden in every file a run
writes, every message, and every MLflow parameter and link; the value is used as given."""

from __future__ import annotations

import pytest

from dbn.cli import main
from dbn.jobs.spec import load_spec
from dbn.jobs.tracking import params_of
from iterreduce.redact import redact, redact_all
from test_cli import make_dataset

SECRET = "Pl4nted-S3cret"


@pytest.mark.parametrize("text, shown", [
    (f"http://bob:{SECRET}@host:5000", "http://bob:***@host:5000"),
    (f"thrift://meta:{SECRET}@host:9083 and https://a:{SECRET}@b/c", "thrift://meta:***@host:9083 and https://a:***@b/c"),
    (f"tracked in MLflow: http://:{SECRET}@h/#/x", "tracked in MLflow: http://:***@h/#/x"),
    ("hdfs://nn:8020/user/me", "hdfs://nn:8020/user/me"), ("bob@example.com", "bob@example.com"),
    ("http://bob@host:5000", "http://bob@host:5000"),
])
def test_redact_hides_a_uris_password_and_keeps_the_rest(text, shown):
    assert redact(text) == shown
    assert redact_all({"a": [text], text: (1, text)}) == {"a": [shown], shown: (1, shown)}


def job(tmp_path, extra=""):
    make_dataset(tmp_path / "train.npz")
    path = tmp_path / "job.toml"
    path.write_text("[data]\ntrain = 'train.npz'\n[model]\nhidden_layers = [8]\npretrain_epochs = 1\n"
                    f"finetune_epochs = 1\n[output]\nmlflow = 'http://bob:{SECRET}@127.0.0.1:9'\n{extra}"
                    "[job]\nseed = 1\ndevice = 'cpu'\n")
    return path


def test_the_jobs_public_settings_and_parameters_hold_no_password(tmp_path):
    spec = load_spec(job(tmp_path))
    assert SECRET in spec.output.mlflow  # used as given
    assert SECRET not in str(spec.public_dict()) and "http://bob:***@127.0.0.1:9" in str(spec.public_dict())
    assert not [v for v in params_of(spec.public_dict()).values() if SECRET in v]
    assert not [v for v in params_of(spec.to_dict()).values() if SECRET in v]  # whatever it is given


@pytest.mark.parametrize("local", [(), ("--local", "2", "--no-ui")], ids=["in-process", "local-2"])
def test_a_run_with_a_password_in_its_tracking_uri_writes_and_says_it_nowhere(tmp_path, capsys, local):
    """The tracking server cannot be reached (port 9): the run warns, naming it, and goes on. Every
    file it wrote, and all it said, hold the server's URI without the password."""
    pytest.importorskip("mlflow")
    out = tmp_path / "out"
    code = main(["train", str(job(tmp_path)), "--out", str(out), *local])
    said = capsys.readouterr()
    assert code == 0, said.err[-2000:]
    written = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "config.json" for p in written) and any(p.name == "log.jsonl" for p in written)
    assert not [p for p in written if SECRET.encode() in p.read_bytes()]
    assert SECRET not in said.out + said.err
    assert "http://bob:***@127.0.0.1:9" in (out / "config.json").read_text()


def test_a_second_run_of_the_same_job_is_the_same_job_though_its_config_json_hides_the_password(tmp_path, capsys):
    """config.json holds the public view: the job's own rerun compares equal to it."""
    pytest.importorskip("mlflow")
    path, out = job(tmp_path), tmp_path / "out"
    assert main(["train", str(path), "--out", str(out), "--quiet"]) == 0
    assert main(["train", str(path), "--out", str(out), "--quiet"]) == 0  # no "another job", no --overwrite
    assert "holds a run of another job" not in capsys.readouterr().err


def test_an_error_naming_a_metastore_hides_its_password(tmp_path, capsys):
    path = tmp_path / "job.toml"
    path.write_text(f"[data]\ntrain = 'db.animals'\nmetastore = 'thrift://meta:{SECRET}@127.0.0.1:9'\n"
                    "features = ['x']\nlabel = 'y'\n[job]\ndevice = 'cpu'\n")
    assert main(["train", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dbn: error: ") and SECRET not in err and "thrift://meta:***@127.0.0.1:9" in err, err


def test_a_submissions_job_file_which_holds_the_settings_as_given_is_the_users_alone(tmp_path, monkeypatch):
    import stat

    from dbn.jobs.yarn import write_job_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = write_job_file("e2e", {"spec": {"output": {"mlflow": f"http://bob:{SECRET}@h:5000"}}})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
