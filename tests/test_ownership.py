"""Output folders hold the user's files too (issue 36, items 1-4): the project deletes, moves
or overwrites only what it wrote and can prove it, and one run at a time writes into a folder.

- ``dbn shard`` / :func:`write_shards` replace only shard sets their manifest lists; a folder
  holding another tool's files (Spark's ``part-*.parquet``, ``_SUCCESS``) is refused untouched;
- a run's output folder: files under the run's names that no run wrote (``config.json``,
  ``logs/notes.txt``) are refused untouched; files beside them (Spark part files, notes,
  ``previous/2019/return.pdf``) stay byte for byte through any number of runs;
- a run holds the folder's lock: a second run is refused at once (exit 2), naming the holder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest_runtime import DELAY_ENV, REPO, SLOW_DBN, TESTS_DIR
from dbn import DBN
from dbn.cli import main
from iterreduce.exceptions import ForeignFileError, OutputBusy
from iterreduce.storage import ownership
from iterreduce.storage.ownership import locks, prune_previous, set_aside
from shardio.readers import list_shards, read_shard
from shardio.shards import write_shards
from test_cli import make_dataset
from test_output_dir import job, train  # noqa: F401 (job: a fixture)

#: Another tool's files, as the issue's probe found them: (relative path, bytes).
SPARK = {
    "part-00000-7c1e-4b2a-c000.snappy.parquet": b"PAR1 spark rows 0" * 50,
    "part-00001-7c1e-4b2a-c000.snappy.parquet": b"PAR1 spark rows 1" * 70,
    "_SUCCESS": b"",
}
PERSONAL = {
    "notes.txt": b"call the bank\n",
    "previous/2019/return.pdf": b"%PDF-1.4 tax return" * 20,
}
COLLIDING = {  # under names a run writes
    "config.json": b'{"mine": "not the tool\'s"}\n',
    "logs/notes.txt": b"my logs\n",
}


def plant(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


def hashes(folder: Path, files) -> dict[str, str]:
    """sha256 of each of ``files`` (relative paths) in ``folder``; "missing" where absent."""
    return {rel: hashlib.sha256((folder / rel).read_bytes()).hexdigest() if (folder / rel).is_file() else "missing"
            for rel in files}


def data(n=60, d=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, d), dtype=np.float32), rng.integers(0, 3, n)


# ------------------------------------------------------------------ 1. shards


@pytest.mark.parametrize("files", [SPARK, {**SPARK, **PERSONAL}, {"notes.txt": b"x"}, {"part-00000.parquet": b"y"}],
                         ids=["spark", "spark-and-notes", "notes", "a-part-file-named-like-ours"])
def test_dbn_shard_refuses_a_folder_of_another_tools_files_untouched(tmp_path, capsys, files):
    out = tmp_path / "warehouse"
    plant(out, files)
    before = hashes(out, files)
    listing = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    make_dataset(tmp_path / "d.npz")
    assert main(["shard", str(tmp_path / "d.npz"), str(out), "--shards", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dbn: error: ") and "Traceback" not in err
    assert str(out) in err and any(Path(rel).parts[0] in err for rel in files)  # the folder and a file in it
    assert hashes(out, files) == before
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == listing  # nothing added either


def test_write_shards_replaces_only_its_own_set(tmp_path):
    out = str(tmp_path / "s")
    X, y = data()
    assert len(write_shards(X, y, out, 4)) == 4
    manifest = json.loads((tmp_path / "s" / ownership.MANIFEST_NAME).read_text())
    assert sorted(manifest["files"]) == [f"part-{i:05d}.parquet" for i in range(4)]
    assert all(listed == {"size": (tmp_path / "s" / name).stat().st_size,
                          "sha256": hashlib.sha256((tmp_path / "s" / name).read_bytes()).hexdigest()}
               for name, listed in manifest["files"].items())
    write_shards(X, y, out, 2)  # fewer: the earlier set goes, as the manifest lists it
    assert [Path(u).name for u in list_shards(out)] == ["part-00000.parquet", "part-00001.parquet"]
    write_shards(X[:5], None, out, 1, prefix="b")  # another set of its own stays beside
    assert len(list_shards(out)) == 3

    (tmp_path / "s" / "notes.txt").write_bytes(b"mine")  # anything not listed: refused, untouched
    with pytest.raises(ForeignFileError, match="notes.txt"):
        write_shards(X, y, out, 3)
    assert len(list_shards(out)) == 3 and (tmp_path / "s" / "notes.txt").read_bytes() == b"mine"
    (tmp_path / "s" / "notes.txt").unlink()

    shard = tmp_path / "s" / "part-00001.parquet"  # a listed name with other bytes is no longer the tool's
    shard.write_bytes(shard.read_bytes() + b"appended by someone")
    before = shard.read_bytes()
    with pytest.raises(ForeignFileError, match="part-00001.parquet"):
        write_shards(X, y, out, 3)
    assert shard.read_bytes() == before


def test_an_interrupted_shard_write_is_replaced_by_the_next(tmp_path, monkeypatch):
    """The manifest names the files before they are written: what a failed write left is the
    tool's, and the next write replaces it."""
    import pyarrow.parquet as pq

    out = str(tmp_path / "s")
    X, y = data()
    real, calls = pq.write_table, []

    def fail_second(table, where, **kwargs):
        calls.append(where)
        real(table, where, **kwargs)
        if len(calls) == 2:
            raise OSError("disk full (injected)")

    monkeypatch.setattr(pq, "write_table", fail_second)
    with pytest.raises(OSError, match="injected"):
        write_shards(X, y, out, 3)
    monkeypatch.setattr(pq, "write_table", real)
    assert len(write_shards(X, y, out, 2)) == 2
    assert [Path(u).name for u in list_shards(out)] == ["part-00000.parquet", "part-00001.parquet"]
    np.testing.assert_array_equal(read_shard(list_shards(out)[1]).features, X[30:])


# ------------------------------------------------------------------ 2. run folders


def test_five_runs_leave_another_tools_files_byte_identical(job):
    """The issue's bar: Spark's part files, _SUCCESS, notes and previous/2019 beside five
    successive runs (in this process, then on a local mini-cluster) stay byte for byte;
    previous/ keeps the newest three runs of the tool's and the user's 2019 folder."""
    config, out = job
    files = {**SPARK, **PERSONAL}
    plant(out, files)
    before = hashes(out, files)
    for i in range(5):
        flags = ("--local", "2", "--no-ui", "--overwrite") if i == 4 else ()  # another job: workers differ
        assert train(config, out, *flags) == 0, i
        assert hashes(out, files) == before, i
    numbered = sorted(p.name for p in (out / "previous").iterdir())
    assert numbered == ["2", "2019", "3", "4"]
    assert (out / "model.npz").is_file()


def test_a_run_refuses_files_under_its_names_that_no_run_wrote(job, capsys):
    """config.json and logs/notes.txt of the user's (the issue's probe): refused with the file's
    name and another --out suggested, five times over, every byte kept, even with --overwrite."""
    config, out = job
    files = {**SPARK, **PERSONAL, **COLLIDING}
    plant(out, files)
    before = hashes(out, files)
    for flags in [(), ("--overwrite",), ("--local", "2", "--no-ui"), ("--local", "2", "--resume", "--no-ui"), ()]:
        assert train(config, out, *flags) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith("dbn: error: ") and "Traceback" not in err
        assert (f"{out / 'config.json'}" in err or f"{out / 'logs' / 'notes.txt'}" in err) and "--out" in err
        assert hashes(out, files) == before
    assert not (out / "model.npz").exists() and not (out / "previous" / "1").exists()


def test_a_file_added_to_a_runs_folder_or_changed_is_not_the_tools(job, capsys):
    config, out = job
    assert train(config, out) == 0
    (out / "logs").mkdir()
    (out / "logs" / "notes.txt").write_bytes(b"mine")  # a name the in-process run claimed but did not write
    assert train(config, out) == 2
    assert f"{out / 'logs' / 'notes.txt'}" in capsys.readouterr().err
    (out / "logs" / "notes.txt").unlink()
    (out / "logs").rmdir()
    assert train(config, out) == 0
    (out / "config.json").write_text((out / "config.json").read_text() + " ")  # edited by hand: the user's now
    edited = (out / "config.json").read_bytes()
    assert train(config, out) == 2
    assert f"{out / 'config.json'}" in capsys.readouterr().err and (out / "config.json").read_bytes() == edited


def test_pruning_deletes_only_what_the_tool_set_aside(job):
    """A file the user put into a previous/N of the tool's survives its pruning, and keeps its folder."""
    config, out = job
    assert train(config, out) == 0
    assert train(config, out) == 0  # previous/1: the first run
    (out / "previous" / "1" / "keep-me.txt").write_bytes(b"the user's")
    (out / "previous" / "1" / "logs").mkdir(exist_ok=True)
    (out / "previous" / "1" / "logs" / "deep.txt").write_bytes(b"also the user's")
    for _ in range(4):
        assert train(config, out) == 0
    assert not (out / "previous" / "2").exists()  # pruned: the tool's own
    assert (out / "previous" / "1" / "keep-me.txt").read_bytes() == b"the user's"
    assert (out / "previous" / "1" / "logs" / "deep.txt").read_bytes() == b"also the user's"
    assert sorted(p.name for p in (out / "previous" / "1").iterdir() if not p.name.startswith(".")) == \
        ["keep-me.txt", "logs"]  # everything of the tool's there went
    assert sorted(p.name for p in (out / "previous").iterdir()) == ["1", "3", "4", "5"]  # 1: the user's files


def test_set_aside_moves_only_recorded_files(tmp_path):
    out = tmp_path / "out"
    plant(out, {"log.jsonl": b"run", "checkpoints/ckpt-000000001.npz": b"c"})
    with pytest.raises(ForeignFileError, match="log.jsonl"):
        set_aside(out)  # nothing recorded: nothing moves
    assert (out / "log.jsonl").read_bytes() == b"run" and not (out / "previous").exists()
    ownership.claim(out, ("log.jsonl", "checkpoints"))
    ownership.settle(out, ("log.jsonl", "checkpoints"))
    folder = set_aside(out)
    assert (folder / "log.jsonl").read_bytes() == b"run" and (folder / ownership.RECORD_NAME).is_file()
    plant(out, {"previous/7/x.txt": b"a numbered folder of the user's"})
    for _ in range(5):
        plant(out, {"log.jsonl": b"again"})
        ownership.claim(out, ("log.jsonl",))
        ownership.settle(out, ("log.jsonl",))
        set_aside(out)
    prune_previous(out, keep=2)
    assert (out / "previous" / "7" / "x.txt").read_bytes() == b"a numbered folder of the user's"
    assert sorted(p.name for p in (out / "previous").iterdir()) == ["5", "6", "7"]  # 1..6 but 7, the newest two


# ------------------------------------------------------------------ 3. the lock


def test_the_lock_refuses_another_thread_and_names_the_holder(tmp_path):
    out = tmp_path / "out"
    with ownership.hold(out):
        with ownership.hold(out):  # the same thread again: nested runs of one command
            pass
        errors = []

        def second():
            try:
                with ownership.hold(out):
                    pass
            except OutputBusy as exc:
                errors.append(str(exc))

        t = threading.Thread(target=second)
        t.start()
        t.join()
        assert len(errors) == 1 and str(out) in errors[0] and f"pid {os.getpid()}" in errors[0]
        assert f"pid {os.getpid()}" in (out / ownership.LOCK_NAME).read_text()
    with ownership.hold(out):  # let go at the end
        pass


def test_the_lock_goes_with_a_killed_process(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from iterreduce.storage import ownership\n"
                               f"with ownership.hold({str(out)!r}):\n    print('held', flush=True); time.sleep(60)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputBusy, match=f"pid {holder.pid} on "):
            with ownership.hold(out):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with ownership.hold(out):  # no stale lock
        pass


TRAIN_SLOW = """
import sys
import dbn.jobs.spec
dbn.jobs.spec.PROGRAM = {program!r}
from dbn.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_second_run_into_a_running_jobs_folder_is_refused_while_the_first_runs(job, tmp_path):
    """With real processes: `dbn train --local 2` runs (its steps slowed); a second `dbn train
    --local 2` of another job into the same folder exits 2 while the first still runs (refused,
    never waiting for the lock), naming the folder and the first's pid; the first completes with
    its own model."""
    config, out = job
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS_DIR), str(REPO), os.environ.get("PYTHONPATH", "")]),
               **{DELAY_ENV: "0.3"})
    command = [sys.executable, "-c", TRAIN_SLOW.format(program=SLOW_DBN), "train", str(config), "--out", str(out),
               "--local", "2", "--no-ui", "--quiet"]
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not any((out / "checkpoints").glob("ckpt-*.npz")) and not (out / "master.json").exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        start = time.monotonic()
        second = subprocess.run([*command, "--layers", "12"], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=60)
        refused_after = time.monotonic() - start
        print(f"second run refused after {refused_after:.2f} s")
        assert second.returncode == 2, second.stderr
        assert second.stderr.startswith("dbn: error: ") and str(out) in second.stderr
        assert f"pid {first.pid} on " in second.stderr
        assert first.poll() is None  # still running, untouched
        stdout, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, stderr
    assert DBN.load(out / "model.npz", device="cpu").hidden_layers == [16, 8]  # the first's model
    assert json.loads((out / "result.json").read_text())["layers"][1:3] == [16, 8]
    assert not (out / "previous").exists()  # the refused run moved nothing


def test_a_yarn_lock_is_stale_once_the_resourcemanager_reports_its_application_ended():
    """dbn submit's question to the ResourceManager about an HDFS lock's holder (the real
    cluster's answer: tests/test_yarn.py)."""
    from types import SimpleNamespace

    from dbn.jobs.yarn import holder_running

    class Client:
        def __init__(self, state):
            self.state = state

        def application_report(self, app_id):
            if self.state is None:
                raise ValueError(f"{app_id}: no such application")
            return SimpleNamespace(state=self.state)

    held = {"app_id": "application_1_0007", "pid": 1, "host": "elsewhere", "since": "then"}
    for state in ("ACCEPTED", "RUNNING"):
        assert holder_running(Client(state), held) == f"application application_1_0007 is {state}"
    for state in ("FINISHED", "FAILED", "KILLED", None):
        assert holder_running(Client(state), held) is None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    staging = {"app_id": None, "pid": dead.pid, "host": socket.gethostname(), "since": "then"}
    assert holder_running(Client(None), staging) is None  # a submission of this host that died before submitting
    alive = {**staging, "pid": os.getpid()}
    assert f"pid {os.getpid()}" in holder_running(Client(None), alive)
    assert "delete the lock" in holder_running(Client(None), {**staging, "host": "another-host"})
    assert "not readable" in holder_running(Client(None), {})


@pytest.mark.parametrize("command", [["train", "{config}"], ["train", "{config}", "--local", "2", "--no-ui"],
                                     ["mnist", "--quick", "--local", "2", "--no-ui"]],
                         ids=["train", "train-local", "mnist"])
def test_every_command_that_writes_a_run_is_refused_by_a_held_folder(job, capsys, command):
    """A folder another process holds (here a process holding the lock alone) is refused at
    once by dbn train, dbn train --local N and dbn mnist, naming the folder and the holder;
    nothing in it changes."""
    config, out = job
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from iterreduce.storage import ownership\n"
                               f"with ownership.hold({str(out)!r}):\n    print('held', flush=True); time.sleep(60)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in out.iterdir())
        start = time.monotonic()
        assert main([part.format(config=config) for part in command] + ["--out", str(out), "--quiet"]) == 2
        assert holder.poll() is None, f"refused only after {time.monotonic() - start:.0f} s, once the holder ended"
        err = capsys.readouterr().err
        assert err.startswith(f"dbn: error: {out}: another run is writing into this output folder")
        assert f"held by pid {holder.pid} on " in err
        assert sorted(p.name for p in out.iterdir()) == before == [ownership.LOCK_NAME]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_a_folder_made_for_a_refused_run_goes_but_never_a_file_put_there_meanwhile(job, capsys, monkeypatch):
    """A run that made its output folder and is then refused before training (bad test data)
    removes the folder it made, its lock alone in it; a file someone else put there in the
    meantime stays, and so does the folder holding it."""
    import dbn.jobs.run as run_module

    config, out = job

    def bad_test_data(spec):
        raise run_module.DataError("test.npz: bad test data")

    monkeypatch.setattr(run_module, "check_test_data", bad_test_data)
    assert train(config, out) == 2
    assert not out.exists()

    def bad_test_data_beside_a_users_file(spec):
        (out / "notes.txt").write_bytes(b"mine")
        raise run_module.DataError("test.npz: bad test data")

    monkeypatch.setattr(run_module, "check_test_data", bad_test_data_beside_a_users_file)
    assert train(config, out) == 2
    assert (out / "notes.txt").read_bytes() == b"mine"
    assert "bad test data" in capsys.readouterr().err


def test_a_folder_where_the_lock_goes_is_refused_and_left_as_it_is(tmp_path):
    """A run's lock and a shard writer's lock: a folder under the lock's name is named, with what to
    choose instead, and left in place."""
    for kind, take, other in (("run", lambda f: ownership.hold(f), "output folder (--out)"),
                              ("shards", lambda f: locks._hold_local_shards(f, str(f)), "folder")):
        folder = tmp_path / kind
        (folder / ownership.LOCK_NAME).mkdir(parents=True)
        refused = f"a folder, not this tool.s lock file.*choose another {re.escape(other)},"
        with pytest.raises(ForeignFileError, match=refused):
            with take(folder):
                pass
        assert (folder / ownership.LOCK_NAME).is_dir()


def test_a_move_never_goes_through_a_link_on_its_way(tmp_path):
    """LocalFolder.move reaches both names one at a time, as a delete does: a folder on the way that
    is a link to somewhere else is refused, and what the link points at stays as it is."""
    from iterreduce.storage.ownership import LocalFolder

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("theirs")
    out = tmp_path / "out"
    (out / "previous").mkdir(parents=True)
    (out / "via").symlink_to(outside)
    (out / "mine").write_text("ours")
    folder = LocalFolder(out)
    with pytest.raises(OSError):
        folder.move("via/f", "previous/f")  # out of the linked folder
    with pytest.raises(OSError):
        folder.move("mine", "via/mine")  # into it
    assert sorted(p.name for p in outside.iterdir()) == ["f"] and (outside / "f").read_text() == "theirs"
    assert (out / "mine").read_text() == "ours"
    folder.move("mine", "previous/mine")
    assert (out / "previous" / "mine").read_text() == "ours"
