"""Issue 51, classes 4, 5 and the HDFS half of 13: what a shard folder's manifest, its leftovers
and its lock say is checked before it steers a delete or a write.

- 4: only the hidden names the tool itself writes (``.NAME.<8 hex>.tmp`` / ``.old``,
  :data:`iterreduce.storage.durable.HIDDEN_NAME`) count as its leftovers; a user's look-alike is refused
  untouched, in a shard folder and by :func:`iterreduce.storage.durable.restore`;
- 5: one writer per shard folder: a second ``dbn shard`` into a folder being written is refused
  at once, naming the folder and the holder, and the folder holds one input's shards;
- 13: an HDFS stale lock is replaced only if it is still the stale one: a new holder's lock,
  taken meanwhile, survives byte-identical;
- the manifest: whatever it holds, the shard calls never touch anything outside their folder,
  and a name that is not a plain name in it is ignored with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest_runtime import REPO, TESTS_DIR
from iterreduce.exceptions import ForeignFileError, IterReduceError, OutputBusy
from iterreduce.storage import durable, ownership
from shardio.readers import list_shards, read_shard
from shardio.shards import write_shards
from dbn.cli import main

MANIFEST = ownership.MANIFEST_NAME


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (links as their target, not followed), with its bytes' sha256."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[rel] = "link -> " + os.readlink(path)
        elif path.is_file():
            found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[rel] = "folder"
    return found


@pytest.fixture
def victim(tmp_path) -> Path:
    """A folder outside every folder the tests write: what it holds must stay byte-identical."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "thesis.tex").write_bytes(b"\\section{results}" * 40)
    (folder / "part-00000.parquet").write_bytes(b"PAR1 not the tool's" * 10)
    return folder


def rows(n=40, d=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, d), dtype=np.float32), rng.integers(0, 3, n)


# ------------------------------------------------------------------ 4. leftover names


@pytest.mark.parametrize("name", [
    ".part-00000.parquet.notes.tmp",          # the two
    f".{MANIFEST}.v1.old",
    ".part-00000.parquet.0123ABCD.tmp",       # upper case: durable writes lower-case hex
    ".part-00000.parquet.0123abc.tmp",        # 7 hex
    ".part-00000.parquet.0123abcde.tmp",      # 9 hex
    ".part-00000.parquet.0123abcd.tmp.bak",   # more after the suffix
    f".{MANIFEST}.x.0123abcd.old",            # another name's hidden file
    ".notes.txt.0123abcd.tmp",                # the hidden file of a name the manifest does not list
])
def test_a_users_file_named_like_a_leftover_is_refused_untouched(tmp_path, victim, name):
    out = tmp_path / "s"
    X, y = rows()
    write_shards(X, y, str(out), 2)
    (out / name).write_bytes(b"my notes, not the tool's")
    before, outside = snapshot(out), snapshot(victim)
    with pytest.raises(ForeignFileError, match=name.replace(".", r"\.")):
        write_shards(X, y, str(out), 3)
    assert snapshot(out) == before and snapshot(victim) == outside


def test_the_tools_own_leftovers_are_still_cleared(tmp_path, victim):
    """What an interrupted write of the manifest or a shard leaves (durable's hidden names) is
    the tool's: the next write clears it."""
    out = tmp_path / "s"
    X, y = rows()
    write_shards(X, y, str(out), 2)
    leftovers = [Path(durable.hidden_name(str(out / MANIFEST), durable.PARTIAL_SUFFIX)),
                 Path(durable.hidden_name(str(out / MANIFEST), durable.BACKUP_SUFFIX)),
                 Path(durable.hidden_name(str(out / "part-00001.parquet"), durable.PARTIAL_SUFFIX))]
    for path in leftovers:
        path.write_bytes(b"half")
    outside = snapshot(victim)
    write_shards(X, y, str(out), 3)
    assert not any(path.exists() for path in leftovers)
    assert len(list_shards(str(out))) == 3 and snapshot(victim) == outside


@pytest.mark.parametrize("name", [".model.npz.my-notes.old", ".model.npz.0123ABCD.old", ".model.npz.01234567.old.x"])
def test_restore_never_takes_a_users_look_alike_for_a_backup(tmp_path, name):
    """durable.restore moves a backup back only under durable's exact name (8 lower-case hex)."""
    (tmp_path / name).write_bytes(b"mine")
    assert durable.restore(pafs.LocalFileSystem(), str(tmp_path / "model.npz")) is None
    assert (tmp_path / name).read_bytes() == b"mine" and not (tmp_path / "model.npz").exists()
    backup = Path(durable.hidden_name(str(tmp_path / "model.npz"), durable.BACKUP_SUFFIX))
    backup.write_bytes(b"the earlier model")  # durable's own: restored
    assert durable.restore(pafs.LocalFileSystem(), str(tmp_path / "model.npz")) == str(backup)
    assert (tmp_path / "model.npz").read_bytes() == b"the earlier model"


def test_every_hidden_name_durable_writes_matches_its_one_pattern(tmp_path, monkeypatch):
    """write_local's temporary file too: a leftover of it is recognised as the tool's, and only that."""
    seen = []
    real = os.replace

    def spy(src, dst):
        seen.append(os.path.basename(src))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    for i in range(20):
        durable.write_local(tmp_path / "model.npz", lambda f: f.write(b"x"))
    assert len(seen) == 20
    assert all(durable.hidden_target(name) == ("model.npz", durable.PARTIAL_SUFFIX) for name in seen), seen
    assert durable.hidden_target(os.path.basename(durable.hidden_name("a/b.json", ".old"))) == ("b.json", ".old")
    for other in (".b.json.notes.tmp", ".b.json.0123abcd.tmp.x", "b.json.0123abcd.tmp", ".b.json.0123ABCD.old"):
        assert durable.hidden_target(other) is None


def test_a_link_is_never_taken_for_a_listed_shard_or_the_manifest(tmp_path, victim):
    """A link where the manifest lists a shard (of the size it lists), or in the manifest's own
    place, is no file the tool wrote: refused, the link and what it points to untouched."""
    out = tmp_path / "s"
    X, y = rows()
    write_shards(X, y, str(out), 2)
    shard = out / "part-00001.parquet"
    (victim / "copy.parquet").write_bytes(shard.read_bytes())
    shard.unlink()
    shard.symlink_to(victim / "copy.parquet")  # the size the manifest lists
    before, outside = snapshot(out), snapshot(victim)
    with pytest.raises(ForeignFileError, match="part-00001.parquet"):
        write_shards(X, y, str(out), 2)
    assert snapshot(out) == before and snapshot(victim) == outside
    for part in out.glob("part-*.parquet"):
        part.unlink()
    manifest = out / MANIFEST
    (victim / MANIFEST).write_bytes(manifest.read_bytes())
    manifest.unlink()
    manifest.symlink_to(victim / MANIFEST)
    before = snapshot(out)
    with pytest.raises(ForeignFileError, match=f"holds {MANIFEST}"):
        write_shards(X, y, str(out), 2)
    assert snapshot(out) == before and snapshot(victim) == {**outside, MANIFEST: snapshot(victim)[MANIFEST]}


def test_a_lock_left_by_a_killed_writer_neither_refuses_the_folder_nor_goes(tmp_path):
    out = tmp_path / "s"
    X, y = rows()
    write_shards(X, y, str(out), 2)
    (out / ownership.LOCK_NAME).write_text("pid 1 on elsewhere (dbn shard)\n")  # its writer was killed
    write_shards(X, y, str(out), 3)
    assert len(list_shards(str(out))) == 3 and (out / ownership.LOCK_NAME).is_file()


# ------------------------------------------------------------------ 5. one writer per shard folder

#: ``dbn shard`` whose shard writes wait until the file argv[1] exists ("-": they do not wait).
SHARD_HELD = """
import os, sys, time
import pyarrow.parquet as pq
real = pq.write_table
def held(*args, **kwargs):
    print("writing", flush=True)
    deadline = time.monotonic() + 60
    while sys.argv[1] != "-" and not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.02)
    real(*args, **kwargs)
pq.write_table = held
from dbn.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_two_dbn_shard_processes_into_one_folder_one_is_refused(tmp_path, victim):
    """The issue's case with real processes: while one ``dbn shard`` writes a folder (its writes
    held until the second has ended), a second of another input into it exits 2 with one line
    naming the folder and the first's pid; the first completes, and the folder holds its shards
    alone, as the manifest says."""
    out = tmp_path / "shards"
    X_a, y_a = rows(30, seed=1)
    X_b, y_b = rows(50, seed=2)
    np.savez(tmp_path / "a.npz", X=X_a, y=y_a)
    np.savez(tmp_path / "b.npz", X=X_b, y=y_b)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS_DIR), str(REPO), os.environ.get("PYTHONPATH", "")]))
    outside = snapshot(victim)

    def shard(source, n, wait_for):
        return [sys.executable, "-c", SHARD_HELD, wait_for, "shard", str(tmp_path / source), str(out), "--shards",
                str(n)]

    go = tmp_path / "go"
    first = subprocess.Popen(shard("a.npz", 3, str(go)), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "writing", first.communicate()  # it holds the folder now
        start = time.monotonic()
        second = subprocess.run(shard("b.npz", 4, "-"), cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=60)
        refused_after = time.monotonic() - start
        go.touch()
        stdout, stderr = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, stderr
    assert second.returncode == 2, (second.stdout, second.stderr)
    message = second.stderr.strip()
    assert "\n" not in message and message.startswith("dbn: error: "), second.stderr
    assert str(out) in message and f"pid {first.pid} on " in message
    assert refused_after < 20  # at once, while the first waits (python's start-up on a busy machine aside)
    shards = list_shards(str(out))
    assert [Path(u).name for u in shards] == [f"part-{i:05d}.parquet" for i in range(3)]
    np.testing.assert_array_equal(np.concatenate([read_shard(u).features for u in shards]), X_a)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["files"] == {Path(u).name: proof(Path(u)) for u in shards}
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, *(Path(u).name for u in shards)]  # no lock left
    assert snapshot(victim) == outside


def test_a_shard_folder_held_is_refused_in_process_and_let_go_after(tmp_path):
    """The same lock from one process: a second writer (another thread) is refused naming the
    holder; after the write, nothing of the lock stays in the folder."""
    out = tmp_path / "s"
    X, y = rows()
    fs = pafs.LocalFileSystem()
    with ownership.shard_folder(fs, str(out), str(out)):
        errors = []

        def second():
            try:
                write_shards(X, y, str(out), 2)
            except OutputBusy as exc:
                errors.append(str(exc))

        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
        assert len(errors) == 1 and str(out) in errors[0] and f"pid {os.getpid()}" in errors[0], errors
    write_shards(X, y, str(out), 2)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "part-00000.parquet", "part-00001.parquet"]


def test_a_remote_shard_folder_takes_the_create_if_absent_lock(tmp_path):
    """On a file system without flock (HDFS), the lock file is created only if absent: a live
    holder's lock refuses the write untouched; a lock of a process of this host that has ended
    is replaced."""
    out = tmp_path / "s"
    out.mkdir()
    fs = not_local()
    held = {"token": "t", "pid": os.getpid(), "host": socket.gethostname(), "since": "x",
            "app_id": None}
    (out / ownership.LOCK_NAME).write_text(json.dumps(held))
    before = snapshot(out)
    with pytest.raises(OutputBusy, match=f"{out}.*pid {os.getpid()}"):
        with ownership.shard_folder(fs, str(out), str(out)):
            pass
    assert snapshot(out) == before
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / ownership.LOCK_NAME).write_text(json.dumps({**held, "pid": int(gone.stdout)}))
    with ownership.shard_folder(fs, str(out), str(out)):
        assert json.loads((out / ownership.LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (out / ownership.LOCK_NAME).exists()


def not_local() -> pafs.FileSystem:
    """The local disk seen as a file system without flock (as HDFS is to the tool): fsspec's, through pyarrow."""
    import fsspec

    return pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("file")))


# ------------------------------------------------------------------ 13. the HDFS stale-lock replacement


class RacingFileSystem(pafs.LocalFileSystem):
    """pyarrow's LocalFileSystem on which another submission takes the lock ``lock`` (writing
    ``new``) at the worst moment: just before this process first changes the lock file (a
    delete, a move), after every read of it."""

    def __init__(self, lock: str, new: bytes):
        super().__init__()
        self.lock, self.new, self.raced = lock, new, False

    def _race(self, path):
        if path == self.lock and not self.raced:
            self.raced = True
            partial = self.lock + ".other-submission"
            Path(partial).write_bytes(self.new)
            os.replace(partial, self.lock)  # the new holder's create, already done

    def delete_file(self, path):
        self._race(path)
        return super().delete_file(path)

    def move(self, src, dest):
        self._race(src)
        return super().move(src, dest)


def gone_holder() -> dict:
    return {"token": "stale", "pid": 2**22 + 1, "host": "elsewhere", "since": "2020", "app_id": "application_1_0001"}


def new_holder() -> bytes:
    return json.dumps({"token": "new", "pid": 1, "host": "h", "since": "now", "app_id": "application_1_0002"}).encode()


def test_a_new_holders_lock_taken_just_before_the_delete_survives(tmp_path, victim):
    """The issue's race: the stale lock is read, its holder found gone, and another submission
    replaces the lock before this one deletes it: the new holder's lock stays byte-identical and
    this submission is refused (it asks about the new holder, which runs)."""
    lock = tmp_path / "out" / ownership.LOCK_NAME
    lock.parent.mkdir()
    lock.write_text(json.dumps(gone_holder()))
    fs = RacingFileSystem(str(lock), new_holder())
    asked = []

    def running(held):
        asked.append(held.get("token"))
        return None if held.get("token") == "stale" else f"application {held['app_id']} is RUNNING"

    outside = snapshot(victim)
    with pytest.raises(OutputBusy, match="application_1_0002 is RUNNING"):
        ownership.acquire_remote(fs, str(lock.parent), str(lock.parent), running=running)
    assert fs.raced and lock.read_bytes() == new_holder()
    assert asked == ["stale", "new"]
    assert sorted(p.name for p in lock.parent.iterdir()) == [ownership.LOCK_NAME]  # nothing set aside is left
    assert snapshot(victim) == outside


def test_a_new_holders_lock_taken_while_running_is_asked_survives(tmp_path):
    """The same race earlier: the lock replaced while ``running`` is asked about the stale one."""
    lock = tmp_path / "out" / ownership.LOCK_NAME
    lock.parent.mkdir()
    lock.write_text(json.dumps(gone_holder()))
    fs = pafs.LocalFileSystem()

    def running(held):
        if held.get("token") == "stale":
            lock.write_bytes(new_holder())
            return None
        return "it runs"

    with pytest.raises(OutputBusy, match="it runs"):
        ownership.acquire_remote(fs, str(lock.parent), str(lock.parent), running=running)
    assert lock.read_bytes() == new_holder()


def test_a_stale_lock_unchanged_is_replaced(tmp_path):
    lock = tmp_path / "out" / ownership.LOCK_NAME
    lock.parent.mkdir()
    lock.write_text(json.dumps(gone_holder()))
    taken = ownership.acquire_remote(pafs.LocalFileSystem(), str(lock.parent), str(lock.parent),
                                     running=lambda held: None)
    assert json.loads(lock.read_text())["token"] == taken.held["token"] != "stale"
    assert sorted(p.name for p in lock.parent.iterdir()) == [ownership.LOCK_NAME]
    taken.release()
    assert not lock.exists()


def proof(path: Path) -> dict:
    """What the manifest lists for a shard file the tool wrote: its size and the SHA-256 of its bytes."""
    return {"size": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


@pytest.mark.parametrize("listed", ["being written", "its size", "its size and another hash", "an old size"])
def test_a_copied_or_hand_written_manifest_proves_no_file_the_tools(tmp_path, capsys, listed):
    """Issue 64's probe: a person's part-00007.parquet and a manifest naming it (as being written,
    or with its size: what a copied manifest or a write cut short leaves) lost that file to
    `dbn shard data.npz S1 --shards 2`. Only the hash of its bytes proves a file the tool's."""
    folder = tmp_path / "S1"
    folder.mkdir()
    theirs = folder / "part-00007.parquet"
    theirs.write_bytes(b"PAR1 a person's own table" * 40)
    size = theirs.stat().st_size
    entry = {"being written": None, "its size": {"size": size, "sha256": "0" * 64},
             "its size and another hash": {"size": size, "sha256": hashlib.sha256(b"other").hexdigest()},
             "an old size": size}[listed]
    (folder / MANIFEST).write_text(json.dumps({"files": {"part-00007.parquet": entry}}))
    X, y = rows()
    np.savez(tmp_path / "data.npz", X=X, y=y)
    before = snapshot(folder)
    capsys.readouterr()
    assert main(["shard", str(tmp_path / "data.npz"), str(folder), "--shards", "2"]) == 2
    err = capsys.readouterr().err
    assert "part-00007.parquet, which this tool cannot prove it wrote" in err and "Traceback" not in err, err
    assert snapshot(folder) == before


def test_a_shard_the_tool_wrote_is_replaced_and_one_changed_since_is_not(tmp_path, capsys):
    X, y = rows()
    np.savez(tmp_path / "data.npz", X=X, y=y)
    folder = tmp_path / "S"
    assert main(["shard", str(tmp_path / "data.npz"), str(folder), "--shards", "3"]) == 0
    assert main(["shard", str(tmp_path / "data.npz"), str(folder), "--shards", "2"]) == 0  # its own: replaced
    assert sorted(p.name for p in folder.iterdir()) == [MANIFEST, "part-00000.parquet", "part-00001.parquet"]
    shard = folder / "part-00001.parquet"
    changed = bytearray(shard.read_bytes())
    changed[len(changed) // 2] ^= 0xFF  # one byte, the size unchanged
    shard.write_bytes(bytes(changed))
    capsys.readouterr()
    assert main(["shard", str(tmp_path / "data.npz"), str(folder), "--shards", "2"]) == 2
    assert "part-00001.parquet, which this tool cannot prove it wrote" in capsys.readouterr().err
    assert shard.read_bytes() == bytes(changed)


# ------------------------------------------------------------------ the manifest, whatever it holds


def test_a_name_that_is_not_plain_is_ignored_with_a_warning(tmp_path, victim, caplog):
    out = tmp_path / "s"
    out.mkdir()
    bad = ["../victim/thesis.tex", "/etc/passwd", "a/../../x", "", "..", "sub/part-00000.parquet", "x" * 300,
           "part-\udcff.parquet", "a\x00b"]
    good = {"size": 10, "sha256": "a" * 64}
    files = {name: good for name in bad} | {
        "part-00000.parquet": None, "part-00001.parquet": -1, "part-00002.parquet": "12", "part-00003.parquet": True,
        "part-00004.parquet": 10,  # an earlier version's bare size: no proof
        "part-00005.parquet": {"size": 10, "sha256": "not hex"}, "part-00006.parquet": {"size": -1, "sha256": "a" * 64},
        "part-00007.parquet": {**good, "more": 1}, "part-00008.parquet": good}
    (out / MANIFEST).write_text(json.dumps({"files": files, "notes": {"source": "s"}}))
    outside = snapshot(victim)
    with caplog.at_level(logging.WARNING, logger="iterreduce.storage.ownership"):
        manifest = ownership.read_manifest(pafs.LocalFileSystem(), str(out))
    assert manifest["files"] == {"part-00000.parquet": None, "part-00008.parquet": good}
    assert manifest["notes"] == {"source": "s"}
    said = "\n".join(r.getMessage() for r in caplog.records)
    for name in [*bad, *(f"part-0000{i}.parquet" for i in range(1, 8))]:
        assert repr(name)[:60] in said, (name, said)
    assert str(out / MANIFEST) in said
    assert snapshot(victim) == outside


def test_a_deeply_nested_or_huge_manifest_is_unreadable_not_a_crash(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    fs = pafs.LocalFileSystem()
    (out / MANIFEST).write_text("[" * 200_000)
    assert ownership.read_manifest(fs, str(out)) == {"files": {}, "notes": {}}
    (out / MANIFEST).write_text('{"files": {"part-00000.parquet": ' + "[" * 200_000 + "]}}")
    assert ownership.read_manifest(fs, str(out)) == {"files": {}, "notes": {}}


JUNK_NAMES = st.one_of(
    st.sampled_from(["..", ".", "", "/", "/etc/passwd", "a/../../x", "../victim/thesis.tex",
                     "../victim/part-00000.parquet", "sub/part-00000.parquet", "x" * 300, "\udcff",
                     "part-\udc80.parquet", "a\x00b", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet",
                     "notes.txt", MANIFEST, ownership.LOCK_NAME, "link.parquet", f".{MANIFEST}.0123abcd.tmp"]),
    st.text(max_size=12))
JUNK_SIZES = st.one_of(st.none(), st.integers(-3, 2**70), st.booleans(), st.floats(), st.text(max_size=4),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.none(), max_size=2))
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                   max_size=3), max_leaves=8)
MANIFESTS = st.one_of(
    st.builds(lambda files, notes: json.dumps({"files": files, "notes": notes}).encode(),
              st.dictionaries(JUNK_NAMES, JUNK_SIZES, max_size=6), JSONISH),
    st.builds(lambda files: json.dumps({"files": files}).encode(), JSONISH),
    st.builds(lambda doc: json.dumps(doc).encode(), JSONISH),
    st.binary(max_size=40),
    st.sampled_from([b"[" * 50_000, b'{"files": {"a": ' + b"[" * 50_000, b"\xff\xfe{}", b""]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=MANIFESTS, present=st.sets(st.sampled_from(["part-00000.parquet", "part-00001.parquet", "notes.txt",
                                                       "link.parquet", "sub"]), max_size=3),
       n=st.integers(1, 3))
@example(raw=b'{"files": {"part-00001.parquet": null}, "notes": null}', present=set(), n=1)  # listed, never written
def test_no_manifest_makes_the_shard_calls_touch_anything_outside_their_folder(raw, present, n):
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        victim = base / "victim"
        victim.mkdir()
        (victim / "thesis.tex").write_bytes(b"\\section{results}" * 40)
        (victim / "part-00000.parquet").write_bytes(b"x" * 10)
        out = base / "s"
        out.mkdir()
        for name in present:
            if name == "link.parquet":
                (out / name).symlink_to(victim / "part-00000.parquet")
            elif name == "sub":
                (out / name).mkdir()
                (out / name / "part-00000.parquet").write_bytes(b"x" * 10)
            else:
                (out / name).write_bytes(b"x" * 10)
        (out / MANIFEST).write_bytes(raw)
        outside = {rel: h for rel, h in snapshot(base).items() if not rel.startswith("s/") and rel != "s"}
        fs, names = pafs.LocalFileSystem(), [f"part-{i:05d}.parquet" for i in range(n)]
        try:
            ownership.read_manifest(fs, str(out))
            with ownership.shard_folder(fs, str(out), str(out)):
                ownership.start_shard_set(fs, str(out), str(out), names, "part")
                for name in names:
                    (out / f".{name}.0123abcd.tmp").write_bytes(name.encode() * 3)
                    ownership.commit_shard(fs, str(out), name, f".{name}.0123abcd.tmp")
                ownership.finish_shard_set(fs, str(out), names)
            manifest = ownership.read_manifest(fs, str(out))
            assert {name: manifest["files"][name] for name in names} == {name: proof(out / name) for name in names}
            assert all(ownership.plain_name(name) for name in manifest["files"])
            assert not (out / "link.parquet").exists() or (out / "link.parquet").is_symlink()
        except ForeignFileError as exc:
            assert str(out) in str(exc) and "\n" not in str(exc)
        except IterReduceError as exc:  # any other of the project's clear errors
            pytest.fail(f"unexpected {type(exc).__name__}: {exc}")
        after = {rel: h for rel, h in snapshot(base).items() if not rel.startswith("s/") and rel != "s"}
        assert after == outside


# ------------------------------------------------------------------ review of issue 51: links, races, names


def test_a_shard_folder_that_is_a_link_is_refused_untouched(tmp_path, victim):
    """A user's own shard set behind a link where shards are written (OUT/shards -> myshards):
    the write is refused naming the link, and the set it points to is byte-identical."""
    mine = tmp_path / "myshards"
    write_shards(*rows(seed=1), str(mine), 3)
    os.symlink(mine, tmp_path / "linked")
    before, victim_before = snapshot(mine), snapshot(victim)
    with pytest.raises(ForeignFileError, match=f"{tmp_path / 'linked'}.*link"):
        write_shards(*rows(seed=2), str(tmp_path / "linked"), 2)
    assert snapshot(mine) == before and snapshot(victim) == victim_before


def test_a_runs_shards_folder_that_is_a_link_is_refused_untouched(tmp_path):
    """``dbn train --local`` cutting ``[data] train`` into OUT/shards: a link there (to a shard
    set of the user's) is refused naming it, before anything is written or deleted through it."""
    from dbn.jobs.run import local_shards
    from dbn.jobs.spec import JobSpec

    X, y = rows(seed=3)
    np.savez(tmp_path / "train.npz", X=X, y=y)
    mine = tmp_path / "myshards"
    write_shards(*rows(seed=4), str(mine), 2)
    out = tmp_path / "OUT"
    out.mkdir()
    os.symlink(mine, out / "shards")
    spec = JobSpec.from_dict({"data": {"train": str(tmp_path / "train.npz")},
                              "model": {"hidden_layers": [4], "n_classes": 3}, "output": {"dir": str(out)}})
    before = snapshot(mine)
    with pytest.raises(ForeignFileError, match=f"{out / 'shards'}.*link"):
        local_shards(spec, out, 2)
    assert snapshot(mine) == before


@pytest.mark.parametrize("name", ["checkpoints", "logs"])
def test_a_link_at_a_run_folder_the_run_writes_into_is_refused(tmp_path, victim, name):
    """The folders a run writes into under its output folder (checkpoints, logs): a link there
    before the run is refused by the ownership check, which every run makes before writing."""
    out = tmp_path / "OUT"
    out.mkdir()
    os.symlink(victim, out / name)
    before = snapshot(victim)
    with pytest.raises(ForeignFileError, match=f"{out / name}.*link"):
        ownership.check_owned(out, ownership.RUN_FILES)
    assert snapshot(victim) == before


def test_an_append_never_goes_to_a_file_replaced_between_open_and_check(tmp_path, monkeypatch):
    """Two processes append to one log shared with another folder through a hard link: A opens
    the shared file; B replaces the name by its private copy; A then sees one link and must
    not append to the original (now the other folder's alone): it opens the name again."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    original.mkdir()
    copy.mkdir()
    (original / "log.jsonl").write_bytes(b'{"step": 1}\n')
    os.link(original / "log.jsonl", copy / "log.jsonl")
    before = snapshot(original)
    opened = durable._open_append_at
    raced = []

    def open_then_race(folder, path):
        fd = opened(folder, path)
        if not raced:  # process B, between A's open and A's check
            raced.append(True)
            durable._unshare_at(folder, path.name)
        return fd

    monkeypatch.setattr(durable, "_open_append_at", open_then_race)
    with durable.open_append(copy / "log.jsonl") as f:
        f.write(b'{"step": 2}\n')
    assert raced and snapshot(original) == before
    assert (copy / "log.jsonl").read_bytes() == b'{"step": 1}\n{"step": 2}\n'


def test_a_copy_of_a_running_folder_takes_its_own_lock(tmp_path):
    """``cp -al A B`` while A runs: B's lock file is A's (one file, two names). B's run takes a
    lock of its own and proceeds; A's lock file is byte-identical and still held by A."""
    original, copy = tmp_path / "A", tmp_path / "B"
    original.mkdir()
    copy.mkdir()
    code = (f"import sys, time; sys.path.insert(0, {str(REPO)!r})\n"
            f"from iterreduce.storage import ownership\n"
            f"with ownership.hold({str(original)!r}):\n    print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"held\n"
        os.link(original / ownership.LOCK_NAME, copy / ownership.LOCK_NAME)
        before = snapshot(original)
        with ownership.hold(copy):
            assert f"pid {os.getpid()} " in (copy / ownership.LOCK_NAME).read_text()
            assert snapshot(original) == before
        assert snapshot(original) == before
        with pytest.raises(OutputBusy, match=f"pid {proc.pid} "):  # A still holds its own
            with ownership.hold(original):
                pass
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("odd", ["²", "٣", "x1"])
def test_a_remote_previous_folder_with_an_odd_number_is_passed_over(tmp_path, odd):
    """A folder in a remote ``previous/`` whose name is a digit but not an ASCII number (``²``)
    is someone else's: passed over, never a traceback."""
    out = tmp_path / "out"
    (out / "previous" / odd).mkdir(parents=True)
    (out / "previous" / odd / "theirs").write_bytes(b"theirs")
    (out / "logs").mkdir()
    (out / "logs" / "a.log").write_bytes(b"a run's log")
    fs = not_local()
    ownership.remote_claim(fs, str(out), ["logs"])
    before = snapshot(out / "previous" / odd)
    folder = ownership.remote_set_aside(fs, str(out), ["logs"])
    assert folder == str(out / "previous" / "1")
    assert (out / "previous" / "1" / "logs" / "a.log").read_bytes() == b"a run's log"
    assert snapshot(out / "previous" / odd) == before
