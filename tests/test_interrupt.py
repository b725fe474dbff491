"""Ctrl-C and SIGTERM end every process the project starts quietly (issue 51, class 12).

Ctrl-C on `dbn train --local 1` once printed a KeyboardInterrupt traceback of the footer reader
(the launcher's child, in its process group) before `dbn: interrupted (Ctrl-C)`. Now each child
(the footer reader, the master, the workers, a benchmark's per-core processes) ends on SIGINT and
SIGTERM with no traceback, by that signal, after removing its own files; and a job stopped as a
terminal or a scheduler stops it leaves no process behind. Each test looks at its own job's
processes only (those under the process it started, found in /proc), never the machine's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest_runtime import DELAY_ENV, REPO, SLOW_DBN, TESTS_DIR, master_info, records, worker_pids

STOPS = [signal.SIGINT, signal.SIGTERM]
TRACEBACKS = ("Traceback", "KeyboardInterrupt")


# ------------------------------------------------------------------ the job's processes, from /proc


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat``'s fields after the command name: state, ppid, pgrp, session, ...; None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(root: int) -> dict[int, tuple[str, str]]:
    """The live processes under ``root`` (its children, theirs...): pid -> (start time, command line)."""
    parents, starts = {}, {}
    for entry in os.listdir("/proc"):
        fields = _stat(int(entry)) if entry.isdigit() else None
        if fields and fields[0] != "Z":
            parents[int(entry)], starts[int(entry)] = int(fields[1]), fields[19]
    found, frontier = {}, {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in found}
        found.update({pid: (starts[pid], _cmdline(pid)) for pid in frontier})
    return found


def identity(pid: int) -> tuple[str, str]:
    """Process ``pid``'s start time and command line, as :func:`descendants` gives them."""
    fields = _stat(pid)
    return (fields[19] if fields else "", _cmdline(pid))


def still_alive(processes: dict[int, tuple[str, str]], within: float = 30.0) -> list[str]:
    """Those of ``processes`` (from :func:`descendants`) still running after ``within`` seconds
    (normally they end in a tenth of a second; the bound is for a loaded machine). Each one left is
    described (its state and where each of its threads waits in the kernel), then sent SIGABRT:
    a Python started with PYTHONFAULTHANDLER=1 (as :func:`child_env` starts them) writes every
    thread's stack to its stderr, the log a failing test prints."""
    deadline = time.monotonic() + within
    while True:
        alive = {pid: command for pid, (start, command) in processes.items()
                 if (fields := _stat(pid)) and fields[0] != "Z" and fields[19] == start}
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    stuck = [f"{command} ({where_it_waits(pid)})" for pid, command in alive.items()]
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGABRT)
    if alive:
        time.sleep(2)  # for the stacks to reach the logs
    return stuck


def where_it_waits(pid: int) -> str:
    """Process ``pid``'s state and, for each of its threads, its name and the kernel function it waits in."""
    threads = []
    with contextlib.suppress(OSError):
        for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
            with contextlib.suppress(OSError):
                threads.append(f"{(task / 'comm').read_text().strip()}: {(task / 'wchan').read_text().strip() or '-'}")
    return f"state {(_stat(pid) or ['gone'])[0]}; threads {'; '.join(threads)}"


def in_group(group: int) -> list[int]:
    """Live processes of process group ``group`` (a job started in a session of its own)."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and (f := _stat(int(e))) and f[0] != "Z"
            and int(f[2]) == group]


def wait_for(condition, what: str, process: subprocess.Popen, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert process.poll() is None, f"the job ended before {what}: {process.communicate(timeout=30)}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
        time.sleep(0.1)
    return found


def environment_of(pid: int, name: str) -> str | None:
    """Variable ``name`` of process ``pid``'s environment (a process of this user)."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        key, _, value = item.partition(b"=")
        if key.decode() == name:
            return value.decode()
    return None


def child_env(**extra: str) -> dict:
    return {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONPATH": os.pathsep.join(filter(None, (str(TESTS_DIR), str(REPO),
                                                                       os.environ.get("PYTHONPATH")))), **extra}


@contextlib.contextmanager
def as_from_a_terminal():
    """Processes started in the block begin with SIGINT at its default action, as a terminal's
    foreground job has it. A suite started in the background (``&`` without job control, as a CI
    runner may) has SIGINT ignored, and its children inherit that: Python then installs no Ctrl-C
    handler, and Ctrl-C does nothing. exec keeps an ignored signal but resets a caught one, so this
    process catches SIGINT while it starts them. (Not a ``preexec_fn``: that makes Python fork and run
    Python code before exec, and in the suite's process, full of threads, the child can deadlock on
    a lock another thread held at the fork: the suite hung so in CI, inside ``Popen``.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def assert_quiet(text: str, where: str) -> None:
    assert not any(word in text for word in TRACEBACKS), f"{where}:\n{text}"


# -------------------------------------------------------------------------------- the mechanism


CLEANS_UP = """
import atexit, os, sys, time
from iterreduce.process import stopping
folder = sys.argv[1]

class Spilled:  # removes its file when collected, as a worker's row files do
    def __init__(self, path):
        self.path = path
        open(path, "w").close()
        self.me = self  # a cycle: only the collector frees it
    def __del__(self):
        os.unlink(self.path)

def main():
    kept = Spilled(os.path.join(folder, "collected"))
    open(os.path.join(folder, "at exit"), "w").close()
    atexit.register(os.unlink, os.path.join(folder, "at exit"))  # as a worker removes its row files
    open(os.path.join(folder, "scratch"), "w").close()
    try:
        print("ready", flush=True)
        time.sleep(60)
    finally:
        os.unlink(os.path.join(folder, "scratch"))
    return 0

sys.exit(stopping.run(main))
"""


@pytest.mark.parametrize("signum", STOPS, ids=lambda s: s.name)
def test_a_stop_signal_unwinds_the_process_then_ends_it_by_that_signal(tmp_path, signum):
    script = tmp_path / "child.py"
    script.write_text(CLEANS_UP)
    folder = tmp_path / "files"
    folder.mkdir()
    child = subprocess.Popen([sys.executable, str(script), str(folder)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=child_env())
    assert child.stdout.readline() == "ready\n"
    child.send_signal(signum)
    _, err = child.communicate(timeout=30)
    assert child.returncode == -signum and err == ""
    assert not list(folder.iterdir())  # the finally block, the collector and the atexit function ran


# ---------------------------------------------------------------------------- the footer reader


@pytest.mark.parametrize("signum", STOPS, ids=lambda s: s.name)
def test_the_footer_reader_ends_quietly_on_a_stop_signal(tmp_path, capfd, signum):
    from shardio.footers import FooterReader
    from iterreduce.storage.filesystems import client_environment
    from shardio.shards import write_shards

    (uri,) = write_shards(np.ones((4, 3), np.float32), None, str(tmp_path / "shard"), 1)
    reader = FooterReader("shardio.readers")
    try:
        assert reader.describe(uri, client_environment())["rows"] == 4  # the helper is up and answering
        helper = reader.process
        helper.send_signal(signum)
        assert helper.wait(timeout=30) == -signum
        assert reader.describe(uri, client_environment())["rows"] == 4  # a new helper takes its place
    finally:
        reader.close()
    assert_quiet(capfd.readouterr().err, "the footer reader's stderr")


def test_a_footer_reader_stopped_while_asked_is_named_as_stopped_not_as_a_crash(tmp_path, monkeypatch):
    """The shard did not end the helper: the error says what did (a real crash is test_shards' business)."""
    from shardio import footers
    from iterreduce.exceptions import ShardError
    from iterreduce.storage.filesystems import client_environment
    from shardio.shards import write_shards

    (uri,) = write_shards(np.ones((4, 3), np.float32), None, str(tmp_path / "shard"), 1)
    reader = footers.FooterReader("shardio.readers")
    try:
        reader.describe(uri, client_environment())

        def stopped_meanwhile(stream):
            reader.process.send_signal(signal.SIGTERM)
            reader.process.wait(timeout=30)
            raise EOFError

        monkeypatch.setattr(footers, "_receive", stopped_meanwhile)
        with pytest.raises(ShardError, match=r"footer reader \(pid \d+\) was stopped by SIGTERM before it answered"):
            reader.describe(uri, client_environment())
        assert reader.process is None
    finally:
        reader.close()


# -------------------------------------------------------------------- the master and the workers


LAUNCHER = """
import sys
from iterreduce.exceptions import MasterKilled
from iterreduce.launch.local import run_local
from iterreduce.master import MasterConfig
try:
    run_local(MasterConfig(program=sys.argv[1], program_config={"hidden_layers": [8], "pretrain_epochs": 100000,
              "finetune_epochs": 1, "n_classes": 2, "stream": True}, shards=sys.argv[2], workers=1, token="",
              output=sys.argv[3], heartbeat_interval=0.2, heartbeat_timeout=5.0))
except MasterKilled as exc:
    print(exc, file=sys.stderr)
    sys.exit(3)
"""


def test_a_worker_and_the_master_end_quietly_and_remove_their_files(tmp_path):
    """A worker stopped by SIGTERM, then the one the launcher starts in its place by SIGINT, write no
    traceback in their log and remove their row files; the master stopped by SIGINT writes none
    either, and the launcher reads it as killed by SIGINT (a --resume continues such a job)."""
    from shardio.shards import write_shards

    rng = np.random.default_rng(0)
    write_shards(rng.random((200, 6)).astype(np.float32), np.arange(200) % 2, str(tmp_path / "shards"), 1)
    out = tmp_path / "out"
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    launcher = subprocess.Popen([sys.executable, str(script), SLOW_DBN, str(tmp_path / "shards"), str(out)],
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env=child_env(**{DELAY_ENV: "0.05"}))
    try:
        wait_for(lambda: len(records(out)) >= 1, "steps done", launcher)
        for signum in (signal.SIGTERM, signal.SIGINT):
            (worker,) = wait_for(lambda: worker_pids(master_info(out)["address"], "worker-0"), "a worker", launcher)
            scratch = Path(environment_of(worker, "ITERREDUCE_LOCAL_DIR"))
            row_files = wait_for(lambda: [f for f in open_files(worker, scratch) if f.suffix == ".rows"],
                                 "row files of the worker", launcher)
            stopped = {worker: identity(worker)}
            os.kill(worker, signum)
            stuck = still_alive(stopped)
            assert not stuck, f"{stuck} outlived {signum.name}: {(out / 'logs' / 'worker-0.log').read_text()[-6000:]}"
            assert not [f for f in row_files if f.exists()], f"the worker stopped by {signum.name} left its row files"
            assert_quiet((out / "logs" / "worker-0.log").read_text(), "worker-0.log")

        job = descendants(launcher.pid)
        os.kill(master_info(out)["pid"], signal.SIGINT)
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 3 and "the master was killed by SIGINT" in err, err
    assert_quiet((out / "logs" / "master.log").read_text(), "master.log")
    assert not still_alive(job), "processes of the job outlived it"


def open_files(pid: int, folder: Path) -> list[Path]:
    """The files under ``folder`` that process ``pid`` has open."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
            if folder in target.parents:
                found.append(target)
    return found


# ------------------------------------------------------------------------- a whole job, from a terminal


def write_table(root: Path) -> None:
    rng = np.random.default_rng(1)
    root.mkdir()
    pq.write_table(pa.table({**{f"x{i}": rng.random(200) for i in range(4)}, "y": np.arange(200) % 2}),
                   root / "part-0.parquet")


@pytest.mark.parametrize("signum", STOPS, ids=lambda s: s.name)
def test_a_local_job_stopped_from_its_terminal_ends_quietly_and_leaves_nothing_running(tmp_path, signum):
    """`dbn train --local 1` in a session of its own, as a terminal runs it: SIGINT (Ctrl-C) or SIGTERM to
    its process group, which holds the launcher and its footer reader, once the master and the worker work."""
    write_table(tmp_path / "table")
    job = tmp_path / "job.toml"
    job.write_text(textwrap.dedent(f"""
        [data]
        train = "{tmp_path / 'table'}"
        features = ["x*"]
        label = "y"
        [model]
        hidden_layers = [8]
        pretrain_epochs = 100000
        finetune_epochs = 1
        pretrain_batch_size = 20
        finetune_batch_size = 20
        [output]
        dir = "{tmp_path / 'out'}"
        [job]
        device = "cpu"
        """))
    with as_from_a_terminal():
        dbn = subprocess.Popen([sys.executable, "-m", "dbn.cli", "train", str(job), "--local", "1", "--no-ui"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env=child_env(**{DELAY_ENV: "0"}))
    try:
        def working() -> dict | None:
            processes = descendants(dbn.pid)
            commands = " ".join(command for _, command in processes.values())
            up = all(name in commands for name in ("iterreduce.master", "iterreduce.worker", "shardio.readers"))
            logs = list((tmp_path / "out").rglob("log.jsonl"))
            return processes if up and any(len(records(log.parent)) >= 2 for log in logs) else None

        processes = wait_for(working, "master, worker and footer reader at work", dbn)
        master = next(pid for pid, (_, command) in processes.items() if "iterreduce.master" in command)
        folders = [Path(p) for p in (environment_of(master, "ITERREDUCE_LOCAL_DIR"),
                                     environment_of(master, "ITERREDUCE_SHARED_DIR")) if p]
        os.killpg(dbn.pid, signum)
        _, err = dbn.communicate(timeout=60)
    finally:
        if dbn.poll() is None:
            os.killpg(dbn.pid, signal.SIGKILL)
            dbn.wait()
    assert_quiet(err, "dbn's stderr")
    if signum == signal.SIGINT:
        assert dbn.returncode == 130 and "dbn: interrupted (Ctrl-C)" in err, err
    else:
        assert dbn.returncode == 128 + signum and f"dbn: interrupted ({signum.name})" in err, err
    # What to do next says what the folder holds: a checkpoint to resume from, or none yet.
    resumable = any((tmp_path / "out" / "checkpoints").glob("ckpt-*.npz"))
    assert ("continue with the same command and --resume" if resumable else
            "before its first checkpoint, so nothing to resume: run the same command again") in err, err
    assert not still_alive(processes), "processes of the job outlived it"
    assert not in_group(dbn.pid)
    assert folders and not [f for f in folders if f.exists()], "the job's folders stayed"


# ------------------------------------------------------------------------- a benchmark's processes


BENCH = """
import sys
from dbn.jobs.bench import _PerCore, contender
if __name__ == "__main__":
    runner = _PerCore(contender("rbm", n_visible=8, n_hidden=4), 1)
    print(runner.procs[0].pid, flush=True)
    try:
        runner.run(60.0)
    except KeyboardInterrupt:
        runner.close()
        sys.exit(130)
"""


def test_a_benchmarks_per_core_process_ends_quietly_on_ctrl_c(tmp_path):
    script = tmp_path / "bench.py"
    script.write_text(BENCH)
    with as_from_a_terminal():
        bench = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True, env=child_env())
    try:
        child = int(bench.stdout.readline())
        processes = descendants(bench.pid)
        assert child in processes
        time.sleep(0.5)  # the child is training
        os.killpg(bench.pid, signal.SIGINT)
        _, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.wait()
    assert bench.returncode == 130
    assert_quiet(err, "the benchmark's stderr")
    assert not still_alive(processes)
