"""The user's cache folder: one rule (XDG's) for every file dbn-yarn and its tests keep there."""

from __future__ import annotations

from pathlib import Path

from dbn.data import mnist
from dbn.jobs import yarn
from dbn.user_cache import cache_dir, cache_home


def test_an_absolute_xdg_cache_home_is_followed_at_each_call_and_a_relative_one_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_home() == tmp_path / "xdg" and cache_dir("a", "b") == tmp_path / "xdg" / "dbn-yarn" / "a" / "b"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG rule: not a base directory
    assert cache_home() == tmp_path / "home" / ".cache"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == tmp_path / "home" / ".cache" / "dbn-yarn"


def test_submissions_and_mnist_keep_their_files_under_the_one_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    job_file = yarn.write_job_file("j", {"spec": {}})
    assert job_file.read_text() == '{\n  "spec": {}\n}' and job_file.parent.parent == tmp_path / "dbn-yarn" / "submissions"
    assert mnist.default_cache_dir() == tmp_path / "dbn" / "mnist"  # where it was before the project's folder
    assert not (Path.home() / ".cache" / "dbn-yarn" / "submissions" / job_file.parent.name).exists()
