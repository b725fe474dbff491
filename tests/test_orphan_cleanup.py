"""A local job whose launcher and master die together leaves none of its folders behind (issue 51,
item 10): its workers, the last of its processes, remove them (iterreduce.process.jobfolders): only the
folders the launcher made, never through a link, idempotently however many remove them at once, and
only where a launcher started them and is gone (not on YARN); a user's files beside them stay."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest_runtime import REPO, SOFTMAX, TESTS_DIR, blobs, cmdline, master_info, records, worker_pids
from iterreduce.process import jobfolders, lifeline
from iterreduce.storage.rowfile import LOCAL_DIR_VAR
from iterreduce.transport import sharedmem
from iterreduce.transport.sharedmem import SharedFolder
from shardio.shards import write_shards

LAUNCHER = """
import sys
from iterreduce.launch.local import run_local
from iterreduce.master import MasterConfig
run_local(MasterConfig(program=sys.argv[1], program_config={'n_classes': 3, 'epochs': 100000}, shards=sys.argv[2],
                       workers=2, token='', output=sys.argv[3], heartbeat_interval=0.2, heartbeat_timeout=2.0))
"""


def the_jobs_folders(pid: int) -> list[str]:
    """The folders the launcher made for the job of process ``pid`` (its master or a worker): they are
    in its environment. Only this job's, whatever other jobs run on the machine."""
    items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    environ = dict(item.split(b"=", 1) for item in items if b"=" in item)
    return [os.fsdecode(environ[key]) for key in (LOCAL_DIR_VAR.encode(), sharedmem.SHARED_DIR_VAR.encode())
            if environ.get(key)]


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` (links as such) with a digest of its bytes or its link's target."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path)] = "-> " + os.readlink(path)
        elif path.is_file():
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[str(path)] = "dir"
    return found


@pytest.mark.parametrize("master", ["killed", "hung"])
def test_the_workers_remove_the_folders_when_the_launcher_and_the_master_are_gone(tmp_path, master):
    """SIGKILL to the launcher and, at once, SIGKILL (or SIGSTOP: hung) to the master: neither can
    remove the job's scratch and shared-memory folders, so the workers do, within a bound: once
    they find the master gone and the launcher too (killed), or by their lifeline (hung). The
    user's file and folder beside the scratch folder, and look-alike folders (the launcher's
    prefix, this user's, 0700) holding a foreign file, stay byte for byte."""
    X, y = blobs(300, d=4, k=3)
    write_shards(X, y, str(tmp_path / "shards"), 3)
    local = tmp_path / "local"  # the launcher makes the job's scratch folder in here
    (local / "mine").mkdir(parents=True)
    (local / "mine" / "data.csv").write_text("a user's data")
    (local / "notes.txt").write_text("beside the job's folder")
    lookalike = local / (jobfolders.SCRATCH_PREFIX + "lookalike")
    lookalike.mkdir(mode=0o700)
    (lookalike / "foreign.rows").write_bytes(b"another job's rows")
    shm_lookalike = tempfile.mkdtemp(prefix=sharedmem.FOLDER_PREFIX + "lookalike-", dir=sharedmem.SHM_ROOT) \
        if sharedmem.available() else str(tmp_path / "no-shm")
    Path(shm_lookalike).mkdir(exist_ok=True)
    Path(shm_lookalike, "0123abcd-1.bin").write_bytes(b"another job's tensor")  # a run's name, not this run's
    kept = {**snapshot(local), **snapshot(Path(shm_lookalike))}
    env = {**os.environ, LOCAL_DIR_VAR: str(local),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p)}
    out = tmp_path / "out"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, SOFTMAX, str(tmp_path / "shards"), str(out)], env=env)
    folders: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while not records(out):
            assert time.monotonic() < deadline and launcher.poll() is None, "the job did not start"
            time.sleep(0.1)
        folders = the_jobs_folders(master_info(out)["pid"])
        assert len(workers_alive(out)) == 2 and folders and all(os.path.isdir(f) for f in folders)
        assert Path(folders[0]).parent == local  # the scratch folder: in the test's own folder
        Path(folders[0], "dbn-rows-w").mkdir()  # as a worker's row files would be
        Path(folders[0], "dbn-rows-w", "0.rows").write_bytes(b"\0" * 64)
        launcher.send_signal(signal.SIGKILL)
        assert kill_master(out, signal.SIGKILL if master == "killed" else signal.SIGSTOP), "no master found"
        launcher.wait(30)

        deadline = time.monotonic() + 10  # the bar: the job's folders gone 10 s after the launcher died
        while (any(os.path.lexists(f) for f in folders) or workers_alive(out)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [f for f in folders if os.path.lexists(f)] == [], "the job's folders were left behind"
        assert not workers_alive(out)
        assert {**snapshot(local), **snapshot(Path(shm_lookalike))} == kept
    finally:  # whatever the outcome, this test's processes and folders do not outlive it
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        kill_master(out)  # the hung one
        for pid in workers_alive(out):
            os.kill(pid, signal.SIGKILL)
        jobfolders.remove(*(folders + [None, None])[:2])
        for name in os.listdir(shm_lookalike):
            os.unlink(os.path.join(shm_lookalike, name))
        os.rmdir(shm_lookalike)


def kill_master(out: Path, signum: int = signal.SIGKILL) -> int | None:
    """Send ``signum`` to the master of the job in ``out``, where it still runs; returns its pid."""
    pid = master_info(out)["pid"] if (out / "master.json").exists() else 0
    args = cmdline(pid) if pid else []
    if "iterreduce.master" in args and any(str(out.resolve() / "job.json") in arg for arg in args):
        os.kill(pid, signum)
        return pid
    return None


def workers_alive(out: Path) -> list[int]:
    """The pids of the job's worker processes still running."""
    if not (out / "master.json").exists():
        return []
    address = master_info(out)["address"]
    return [pid for name in ("worker-0", "worker-1") for pid in worker_pids(address, name)]


# ------------------------------------------------------------------ the removal itself


@pytest.fixture
def made(tmp_path, monkeypatch):
    """A job's folders as a launcher makes them (the scratch folder under ``tmp_path``), named in
    this process's environment as in a master's or a worker's; removed afterwards whatever happens."""
    monkeypatch.setenv(LOCAL_DIR_VAR, str(tmp_path))
    scratch, shared = jobfolders.make(shared_memory=True)
    monkeypatch.setenv(LOCAL_DIR_VAR, scratch)
    if shared:
        monkeypatch.setenv(sharedmem.SHARED_DIR_VAR, shared)
    yield scratch, shared
    jobfolders.remove(scratch, shared)


def test_the_removal_never_goes_through_a_link(tmp_path, made):
    """Removing a job's folders deletes nothing through a link: not where a folder's own path is a
    link (to a user's folder holding a name a run writes), nor through links inside the folders."""
    victim = tmp_path / "victim"
    (victim / "dbn-rows-x").mkdir(parents=True)
    (victim / "0123abcd-1.bin").write_bytes(b"a user's file, named as a run's")
    (victim / "dbn-rows-x" / "0.rows").write_bytes(b"a user's rows")
    (victim / "notes.txt").write_text("a user's notes")
    kept = snapshot(victim)
    scratch_link = tmp_path / (jobfolders.SCRATCH_PREFIX + "link")
    shared_link = tmp_path / (sharedmem.FOLDER_PREFIX + "link")
    for link in (scratch_link, shared_link):
        link.symlink_to(victim)
    jobfolders.remove(str(scratch_link), str(shared_link))
    sharedmem.remove_folder(str(shared_link))
    assert snapshot(victim) == kept and scratch_link.is_symlink() and shared_link.is_symlink()
    # The job's own folders, holding links of the names a run writes: the links go, not what they name.
    scratch, shared = made
    Path(scratch, "dbn-rows-l").symlink_to(victim)
    if shared:
        Path(shared, "0123abcd-2.bin").symlink_to(victim / "0123abcd-1.bin")
    jobfolders.remove_orphaned(settle_s=0)
    assert not os.path.lexists(scratch) and not (shared and os.path.lexists(shared))
    assert snapshot(victim) == kept


def test_the_folders_go_however_many_processes_remove_them_at_once(made, caplog):
    """The workers may notice at once, while one still writes: each removes what it finds, none
    fails or warns, the folders go, and the writer can write in them no more."""
    scratch, shared = made
    writer_error: list[OSError] = []
    start = threading.Barrier(5)

    def write_until_refused():
        folder = SharedFolder(shared) if shared else None
        start.wait()
        deadline = time.monotonic() + 10  # a removal that fails must not leave the writer filling /dev/shm
        try:
            while time.monotonic() < deadline:
                os.close(tempfile.mkstemp(suffix=".rows", dir=scratch)[0])
                if folder is not None:
                    folder.write(np.ones(4))
                time.sleep(0.001)
        except OSError as exc:
            writer_error.append(exc)

    def remove():
        start.wait()
        jobfolders.remove_orphaned(settle_s=5)

    threads = [threading.Thread(target=target, daemon=True) for target in [write_until_refused] + [remove] * 4]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads)
    assert not os.path.lexists(scratch) and not (shared and os.path.lexists(shared))
    assert writer_error and isinstance(writer_error[0], FileNotFoundError)
    assert not [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_only_a_process_whose_launcher_is_gone_removes_the_folders(made, monkeypatch):
    """A worker whose master is gone removes the job's folders only where its launcher is gone too:
    not where the launcher lives on (it removes them), nor where no launcher started it (YARN,
    whose containers have no such folders to remove)."""
    scratch, shared = made
    monkeypatch.delenv(lifeline.LAUNCHER_PID, raising=False)  # on YARN
    jobfolders.remove_if_launcher_gone(wait_s=0)
    assert not lifeline.launcher_gone() and os.path.isdir(scratch) and (not shared or os.path.isdir(shared))
    monkeypatch.setenv(lifeline.LAUNCHER_PID, str(os.getppid()))  # the launcher lives: its end is waited for
    started = time.monotonic()
    jobfolders.remove_if_launcher_gone(wait_s=0.3)
    assert time.monotonic() - started >= 0.3
    assert not lifeline.launcher_gone() and os.path.isdir(scratch) and (not shared or os.path.isdir(shared))
    monkeypatch.setenv(lifeline.LAUNCHER_PID, str(os.getpid()))  # not this process's parent: gone
    assert lifeline.launcher_gone()
    jobfolders.remove_if_launcher_gone(wait_s=0)
    assert not os.path.lexists(scratch) and not (shared and os.path.lexists(shared))
