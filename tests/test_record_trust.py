"""The project's own earlier files are checked before they steer a delete or a write (issue 51,
classes 1-3): a run record names only plain names inside its folder, no write or delete ever
goes through a symbolic link at any depth, and a file shared through hard links (a run folder
copied with ``cp -al``) is replaced, never changed in place.

Each test keeps a file outside the job's folders (a victim folder, a link's target, the
original of a hard link) and asserts it byte-identical, with the same modification times.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from iterreduce.exceptions import ForeignFileError, IterReduceError
from iterreduce.launch.local import LocalCluster
from iterreduce.master import MasterConfig
from iterreduce.master import master
from iterreduce.storage import ownership, runlog
from iterreduce.storage.ownership import RECORD_NAME, prune_previous, remove_owned, set_aside

RUN = {"log.jsonl": b'{"event": "done"}\n', "logs/master.log": b"master says hi\n",
       "logs/worker-0.log": b"worker says hi\n", "checkpoints/ckpt-000000001.npz": b"checkpoint bytes",
       "checkpoints/deep/part": b"a deeper file"}
VICTIM = {"a.txt": b"the user's a", "sub/b.txt": b"the user's b", "sub/deeper/c.bin": bytes(range(256))}


def plant(folder: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


def state(root: Path) -> dict:
    """Everything at and under ``root`` as it is on disk, links not followed: kind, bytes (a
    link: its target) and modification time of each entry."""
    found = {}
    if not os.path.lexists(root):
        return found
    paths = [root] + sorted(Path(d) / n for d, dirs, files in os.walk(root) for n in (*dirs, *files))
    for path in paths:
        st_ = os.lstat(path)
        if stat.S_ISLNK(st_.st_mode):
            content = os.readlink(path)
        elif stat.S_ISREG(st_.st_mode):
            content = path.read_bytes()
        else:
            content = None
        found[str(path.relative_to(root.parent))] = (stat.S_IFMT(st_.st_mode), content, st_.st_mtime_ns)
    return found


def settled_run(out: Path, files: dict[str, bytes] = RUN) -> None:
    """Files of a finished run in ``out``, provably the tool's (claimed, then settled)."""
    plant(out, files)
    names = sorted({rel.split("/")[0] for rel in files})
    ownership.claim(out, names)
    ownership.settle(out, names)


def earlier_runs(out: Path, count: int) -> None:
    """``count`` earlier runs set aside in ``out/previous/1..count``."""
    for _ in range(count):
        settled_run(out)
        assert set_aside(out) is not None


def edit_record(folder: Path, **fields) -> None:
    record = json.loads((folder / RECORD_NAME).read_text())
    record.update(fields)
    (folder / RECORD_NAME).write_text(json.dumps(record))


def identity(path: Path) -> list[int]:
    st_ = os.lstat(path)
    return [st_.st_size, st_.st_mtime_ns]


@pytest.fixture
def victim(tmp_path):
    """A folder of the user's beside the output folder, and its state now."""
    folder = tmp_path / "victim"
    plant(folder, VICTIM)
    return folder


# ------------------------------------------------------------------ 1. a record names only its own files


@pytest.mark.parametrize("case", ["claimed-relative", "claimed-absolute", "claimed-nested", "files-relative",
                                  "files-absolute", "files-through-dotdot", "folders-relative"])
def test_a_record_naming_a_path_outside_its_folder_steers_no_delete(tmp_path, victim, caplog, case):
    """The issue's probe: ``claimed: ["../../../victim"]`` in previous/1's record made the next
    pruning delete the folder victim/ beside OUT. Every way of naming a path outside the
    record's folder is ignored, with a warning naming the record file and the entry, and the
    run's own files there still go."""
    out = tmp_path / "out"
    earlier_runs(out, 4)
    first = out / "previous" / "1"
    field, how = case.split("-", 1)
    name = {"relative": "../../../victim", "absolute": str(victim), "nested": "logs/../../../../victim",
            "through-dotdot": "logs/../../../../victim/a.txt"}[how]
    if field == "files":
        name = name if name.endswith("a.txt") else f"{name}/a.txt"
        edit_record(first, files={**json.loads((first / RECORD_NAME).read_text())["files"],
                                  name: identity(victim / "a.txt")})
    else:
        edit_record(first, **{field: [*json.loads((first / RECORD_NAME).read_text())[field], name]})
    before = state(victim)
    with caplog.at_level(logging.WARNING, logger="iterreduce.storage.ownership"):
        prune_previous(out, keep=3)
    assert state(victim) == before
    assert not (first / "log.jsonl").exists() and not (first / "logs").exists()  # the run's own files went
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    from iterreduce.storage.ownership.records import shown  # a long name is cut (the temporary folder's
    assert any(str(first / RECORD_NAME) in m and shown(name) in m for m in warned), warned  # length varies)


@pytest.mark.parametrize("entry", [["12"], [1, 2, 3], "size", None, [True, 5], [-1, 5], [1.5, 2]])
def test_a_file_entry_without_a_size_and_time_is_ignored_and_said_so(tmp_path, caplog, entry):
    out = tmp_path / "out"
    earlier_runs(out, 4)
    first = out / "previous" / "1"
    plant(first, {"mine.txt": b"the user's, added later"})
    edit_record(first, files={"mine.txt": entry})
    with caplog.at_level(logging.WARNING, logger="iterreduce.storage.ownership"):
        prune_previous(out, keep=3)
    assert (first / "mine.txt").read_bytes() == b"the user's, added later"
    assert any("'mine.txt'" in r.getMessage() and str(first / RECORD_NAME) in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("raw", [b"[" * 100_000, b"\xff\xfe not utf-8", b'{"claimed": "logs"}', b"[1, 2]",
                                 b'{"files": [["logs", 1]]}'])
def test_an_unreadable_record_proves_nothing_and_is_said_so(tmp_path, caplog, raw):
    """A record that is not the tool's JSON (deeply nested, not UTF-8, of the wrong shape) is a
    folder without a record: nothing in it goes, and no traceback."""
    out = tmp_path / "out"
    earlier_runs(out, 4)
    first = out / "previous" / "1"
    (first / RECORD_NAME).write_bytes(raw)
    before = state(first)
    with caplog.at_level(logging.WARNING, logger="iterreduce.storage.ownership"):
        prune_previous(out, keep=3)
    assert {k: v for k, v in state(first).items() if RECORD_NAME not in k} == \
        {k: v for k, v in before.items() if RECORD_NAME not in k}
    assert any(str(first / RECORD_NAME) in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------ 2. links


def cluster_of(out: Path) -> LocalCluster:
    """A launcher of a job writing into ``out`` (nothing started)."""
    return LocalCluster(MasterConfig(program="p", program_config={}, shards=[], workers=1, token="t" * 32,
                                     output=str(out)))


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-file", "dangling"])
def test_the_lock_never_writes_through_a_link(tmp_path, victim, dangling):
    """``OUT/.iterreduce.lock`` as a link: ``dbn train`` wrote its pid line into the link's
    target (or made a file where a dangling link pointed). Now the run is refused, naming the
    lock, and the target is as it was."""
    out = tmp_path / "out"
    out.mkdir()
    target = victim / ("a.txt" if not dangling else "made-by-the-lock")
    os.symlink(target, out / ownership.LOCK_NAME)
    before = state(victim)
    with pytest.raises(ForeignFileError, match=str(out / ownership.LOCK_NAME)):
        with ownership.hold(out):
            pass
    assert state(victim) == before


def test_what_the_lock_says_is_read_without_following_a_link_and_in_a_few_bytes(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim / "a.txt", out / ownership.LOCK_NAME)
    assert "the user's" not in ownership.holder(out)
    (out / ownership.LOCK_NAME).unlink()
    (out / ownership.LOCK_NAME).write_bytes(b"pid 1 " + b"x" * 1_000_000)  # a lock file grown large
    assert len(ownership.holder(out)) < 1000


def move_logs_away(first: Path, moved: Path) -> None:
    """The issue's probe: previous/1/logs moved elsewhere, a link to it put in its place."""
    shutil.move(str(first / "logs"), str(moved))
    os.symlink(moved, first / "logs")


@pytest.mark.parametrize("where", ["logs", "checkpoints/deep", "logs/master.log", "previous"])
def test_pruning_never_follows_a_link_at_any_depth(tmp_path, where):
    """A link in place of a folder (or file) of an earlier run: pruning deletes nothing through
    it, at any depth; the moved files are byte-identical."""
    out = tmp_path / "out"
    earlier_runs(out, 4)
    first = out / "previous" / "1"
    moved = tmp_path / "moved"
    if where == "previous":  # OUT/previous a link to another output folder's earlier runs
        other = tmp_path / "other"
        earlier_runs(other, 4)
        shutil.rmtree(out / "previous")
        os.symlink(other / "previous", out / "previous")
        moved = other
    else:
        shutil.move(str(first / where), str(moved))
        os.symlink(moved, first / where)
    before = state(moved)
    prune_previous(out, keep=3)
    assert state(moved) == before


def test_removing_a_claimed_folder_deletes_nothing_through_a_link_in_it(tmp_path, victim):
    """A move cut short leaves names claimed in previous/N: what is under them goes, but
    never what a link there points to."""
    folder = tmp_path / "out" / "previous" / "1"
    plant(folder, RUN)
    ownership.RunRecord(folder, claimed=["logs", "checkpoints"]).write()
    os.symlink(victim, folder / "checkpoints" / "deep" / "link")
    os.symlink(victim / "a.txt", folder / "logs" / "file-link")
    before = state(victim)
    remove_owned(folder)
    assert state(victim) == before
    assert not (folder / "logs" / "master.log").exists()  # the run's own file went


def test_set_aside_moves_nothing_into_a_linked_previous_folder(tmp_path, victim):
    out = tmp_path / "out"
    settled_run(out)
    os.symlink(victim, out / "previous")
    before, run_before = state(victim), state(out / "logs")
    with pytest.raises(ForeignFileError, match=str(out / "previous")):
        set_aside(out)
    assert state(victim) == before and state(out / "logs") == run_before


def test_a_link_under_a_claimed_name_is_refused_before_a_write(tmp_path, victim):
    """A run that crashed leaves its names claimed; a link put there since is not the tool's:
    a resume is refused naming it, and the log is never appended through it."""
    out = tmp_path / "out"
    out.mkdir()
    ownership.claim(out, ownership.RUN_FILES)
    os.symlink(victim / "a.txt", out / "log.jsonl")
    os.symlink(victim, out / "logs")
    before = state(victim)
    with pytest.raises(ForeignFileError, match="link"):
        ownership.check_owned(out, ownership.RUN_FILES)
    with pytest.raises(ForeignFileError, match=str(out / "log.jsonl")):
        runlog.RunLog(out / "log.jsonl")
    assert state(victim) == before


def test_the_process_logs_are_never_appended_through_a_linked_folder(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / "logs")
    cluster = cluster_of(out)
    before = state(victim)
    with pytest.raises(ForeignFileError, match=str(out / "logs")):
        cluster._spawn(["this"], "master", None)
    assert state(victim) == before


def test_a_run_record_is_never_written_or_read_through_a_link(tmp_path, victim):
    out = tmp_path / "out"
    settled_run(out)
    # Where a write put its bytes before (now a fresh hidden name, made only where nothing is).
    os.symlink(victim / "a.txt", out / f"{RECORD_NAME}.{os.getpid()}.tmp")
    before = state(victim)
    ownership.claim(out, ["log.jsonl"])
    assert state(victim) == before
    # A record that is a link vouches for nothing: here one elsewhere claiming a file of the user's.
    plant(out, {"notes.txt": b"the user's"})
    (victim / "record.json").write_text(json.dumps({"claimed": ["notes.txt"]}))
    (out / RECORD_NAME).unlink()
    os.symlink(victim / "record.json", out / RECORD_NAME)
    with pytest.raises(ForeignFileError, match="notes.txt"):
        ownership.check_owned(out, ["notes.txt"])


# ------------------------------------------------------------------ 3. hard links


def run_folder(out: Path) -> None:
    """A finished run's folder as the tool writes it: lock, record, log, job file, process logs."""
    with ownership.hold(out):
        ownership.claim(out, ownership.RUN_FILES)
        plant(out, {"job.json": b'{"workers": 1}', "checkpoints/ckpt-000000001.npz": b"ckpt"})
        with runlog.RunLog(out / "log.jsonl") as log:
            log.event("done")
        plant(out, {"logs/master.log": b"master\n", "master.json": b"{}", "error.txt": b"no error\n"})
        ownership.settle(out, ownership.RUN_FILES)


def test_a_hard_linked_copy_of_a_run_changes_nothing_of_the_original(tmp_path):
    """The issue's probe: a run folder copied with ``cp -al`` and resumed changed the original's
    lock, log.jsonl and logs, after which the original was refused. Now every file the resumed
    copy changes is replaced by a private copy first: the original stays byte-identical and
    still provably the tool's."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    original.mkdir()
    run_folder(original)
    subprocess.run(["cp", "-al", str(original), str(copy)], check=True)
    before = state(original)
    with ownership.hold(copy):
        ownership.check_owned(copy, ownership.RUN_FILES)
        ownership.claim(copy, ownership.RUN_FILES)
        with runlog.RunLog(copy / "log.jsonl") as log:
            log.event("resumed")
        cluster = cluster_of(copy)
        cluster._spawn(["this"], "master", None).wait()  # appends the Zen of Python to logs/master.log
        ownership.settle(copy, ownership.RUN_FILES)
    assert state(original) == before
    ownership.check_owned(original, ownership.RUN_FILES)  # still provably the tool's
    assert b"resumed" in (copy / "log.jsonl").read_bytes() and b'{"event": "done"' in (copy / "log.jsonl").read_bytes()
    assert (copy / "logs" / "master.log").read_bytes().startswith(b"master\nThe Zen of Python")
    assert os.lstat(copy / "log.jsonl").st_nlink == 1


def test_the_run_files_the_launcher_and_master_rewrite_are_replaced_not_changed_in_place(tmp_path):
    """job.json (launcher), master.json and error.txt (master) of a hard-linked copy: written
    anew and renamed in, so the original keeps its bytes."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    original.mkdir()
    run_folder(original)
    subprocess.run(["cp", "-al", str(original), str(copy)], check=True)
    before = state(original)
    cluster = cluster_of(copy)
    job_file = cluster._write_job_file()
    assert json.loads(job_file.read_text())["program"] == "p" and "token" not in json.loads(job_file.read_text())
    master.publish_address(str(copy), "127.0.0.1:1234")
    master.write_error(str(copy), RuntimeError("it broke"))
    assert state(original) == before
    assert json.loads((copy / "master.json").read_text())["address"] == "127.0.0.1:1234"
    assert (copy / "error.txt").read_text() == "it broke\n"


def test_a_lock_shared_through_a_hard_link_is_replaced_by_a_private_one(tmp_path):
    original, copy = tmp_path / "original", tmp_path / "copy"
    original.mkdir()
    with ownership.hold(original):
        pass
    copy.mkdir()
    os.link(original / ownership.LOCK_NAME, copy / ownership.LOCK_NAME)
    before = state(original)
    with ownership.hold(copy):
        assert state(original) == before
        with ownership.hold(original):  # not the same lock: both folders can be held at once
            pass
    assert os.lstat(copy / ownership.LOCK_NAME).st_nlink == 1


# ------------------------------------------------------------------ a property: nothing outside is touched

NASTY = ["..", ".", "", "/", "../victim", "../../victim", "../../../victim", "{VICTIM}", "{VICTIM}/a.txt",
         "{TARGET}", "logs", "logs/..", "logs/../../../../victim", "logs/../../../../victim/a.txt",
         "../../../victim/a.txt", "../../../victim/sub", "link", "link/a.txt", "link/sub/b.txt", "flink",
         "logs/master.log", "checkpoints", "checkpoints/deep", "a" * 300, "x/" * 40 + "y", "\udcff", "\ud800",
         "nul\0byte", "logs//master.log", "./logs", "log.jsonl", RECORD_NAME, "previous", "previous/2",
         "hollow", "hollow/"]  # hollow: an empty folder in each run (a folder a record may call a file)
nasty = st.sampled_from(NASTY)
others = st.one_of(st.text(max_size=12), st.integers(-3, 2**70), st.none(), st.booleans(),
                   st.lists(nasty, max_size=2))
names = st.one_of(nasty, nasty, nasty, others)  # mostly the names that would do harm
identities = st.one_of(st.just("{IDENTITY}"), st.lists(st.integers(-1, 2**70), max_size=3), st.text(max_size=3),
                       st.none(), st.floats(allow_nan=True), st.booleans())
fields = st.one_of(st.lists(names, min_size=1, max_size=4), names)
records = st.one_of(
    *[st.fixed_dictionaries({
        "claimed": fields,
        "files": st.one_of(st.dictionaries(st.one_of(nasty, nasty, st.text(max_size=12)), identities, min_size=1,
                                           max_size=4), names),
        "folders": fields,
    })] * 4,
    st.binary(max_size=64),
)


def resolve(value, folder: Path, victim: Path, target: Path):
    """A drawn record with its placeholders filled in: the victim's and the link target's real
    paths, and for a file entry the real size and time of whatever its name reaches (so that
    code trusting the name would take it for the tool's)."""
    if isinstance(value, str):
        return value.replace("{VICTIM}", str(victim)).replace("{TARGET}", str(target))
    if isinstance(value, list):
        return [resolve(v, folder, victim, target) for v in value]
    if isinstance(value, dict):
        files = {}
        for key, entry in value.items():
            key = resolve(key, folder, victim, target)
            if entry == "{IDENTITY}":
                try:
                    entry = identity(Path(os.path.normpath(folder / key)))
                except (OSError, ValueError):
                    entry = [0, 0]
            files[key] = resolve(entry, folder, victim, target)
        return files
    return value


def write_record(folder: Path, drawn, victim: Path, target: Path) -> None:
    if isinstance(drawn, bytes):
        (folder / RECORD_NAME).write_bytes(drawn)
        return
    data = {k: resolve(v, folder, victim, target) for k, v in drawn.items()}
    (folder / RECORD_NAME).write_text(json.dumps(data))


@pytest.fixture(scope="module")
def four_runs(tmp_path_factory) -> Path:
    """An output folder with four earlier runs set aside and a fifth in place (copied for each
    example: copies keep the files' times, so their records still prove them)."""
    out = tmp_path_factory.mktemp("template") / "out"
    earlier_runs(out, 4)
    settled_run(out)
    for folder in (out, *(out / "previous").iterdir()):
        (folder / "hollow").mkdir()
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=records, second=records, top=records, extra=st.lists(nasty, max_size=3))
@example(first={"claimed": ["../../../victim"], "files": {}, "folders": []}, second=b"", top=b"", extra=[])
@example(first={"claimed": [], "files": {"hollow": "{IDENTITY}", "logs": "{IDENTITY}"}, "folders": ["hollow", "logs"]},
         second={"claimed": [], "files": {"logs/master.log": "{IDENTITY}"}, "folders": ["logs/master.log", "hollow"]},
         top=b"", extra=[])
def test_no_record_makes_the_tool_touch_anything_outside_its_folder(four_runs, first, second, top, extra):
    """Random run records (names with ``..``, absolute, through links, empty, long, not UTF-8,
    nested; sizes and times of any type) in previous/1, previous/2 and OUT itself, with links
    to a victim folder and a file beside OUT: pruning, removing, setting aside and checking
    either succeed or raise the tool's clear error, and nothing outside OUT changes."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out, victim, target = root / "out", root / "victim", root / "target.txt"
        plant(victim, VICTIM)
        target.write_bytes(b"a link's target")
        shutil.copytree(four_runs, out, symlinks=True)
        for folder in (out, out / "previous" / "1", out / "previous" / "2"):
            os.symlink(victim, folder / "link")
            os.symlink(target, folder / "flink")
        write_record(out / "previous" / "1", first, victim, target)
        write_record(out / "previous" / "2", second, victim, target)
        write_record(out, top, victim, target)
        before = state(victim), state(target)
        calls = [lambda: ownership.check_owned(out, [*ownership.RUN_FILES, *(n for n in extra if n)]),
                 lambda: remove_owned(out / "previous" / "2"),
                 lambda: prune_previous(out, keep=3),
                 lambda: set_aside(out),
                 lambda: prune_previous(out, keep=0)]
        for call in calls:
            try:
                call()
            except IterReduceError:
                pass
            assert (state(victim), state(target)) == before


# ------------------------------------------------------------------ review: a record calling a folder a file


@pytest.mark.parametrize("case", ["folder-as-file", "file-as-folder"])
def test_pruning_never_fails_a_run_over_a_record_that_calls_a_folder_a_file(tmp_path, victim, caplog, case):
    """Hand-edited records of earlier runs list a folder under "files" (with its real size and
    time, and under "folders"), or a file under "folders": pruning them never fails the run that
    has just succeeded; a folder listed as a file is not unlinked, and the warning names the
    record and the entry. Nothing outside the output folder changes."""
    out = tmp_path / "out"
    earlier_runs(out, 4)
    for n in "1234":
        folder = out / "previous" / n
        (folder / "hollow").mkdir()
        os.symlink(victim, folder / "link")
        if case == "folder-as-file":
            edit_record(folder, files={"hollow": identity(folder / "hollow")}, folders=["hollow"])
        else:
            edit_record(folder, folders=["logs/master.log", "hollow"])
    before = state(victim)
    with caplog.at_level(logging.WARNING):
        prune_previous(out, keep=3)
    assert state(victim) == before
    first = out / "previous" / "1"
    if case == "folder-as-file":
        assert f"{first / RECORD_NAME}" in caplog.text and "hollow" in caplog.text
    else:  # a file the record proves goes, whatever "folders" says of it
        assert not (first / "logs" / "master.log").exists() and (first / "link").is_symlink()


def test_a_copy_of_a_held_folder_made_while_held_does_not_let_a_second_run_in(tmp_path):
    """A folder held by a run, then copied with ``cp -al`` (its lock file now has two names): a
    second run of the held folder itself is still refused, and its lock is not replaced."""
    held, copy = tmp_path / "held", tmp_path / "copy"
    held.mkdir()
    code = (f"import sys, time; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
            f"from iterreduce.storage import ownership\n"
            f"with ownership.hold({str(held)!r}):\n    print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"held\n"
        copy.mkdir()
        os.link(held / ownership.LOCK_NAME, copy / ownership.LOCK_NAME)
        before = state(held)
        with pytest.raises(ownership.OutputBusy, match=f"pid {proc.pid} "):
            with ownership.hold(held):
                pass
        assert state(held) == before and os.lstat(held / ownership.LOCK_NAME).st_nlink == 2
    finally:
        proc.kill()
        proc.wait()
