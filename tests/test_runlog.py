"""Tests for iterreduce.storage.runlog: writing, reading, tailing and summing a job's log.jsonl."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from iterreduce.storage import runlog

REPO = Path(__file__).resolve().parents[1]


def step(index, phase, seconds=1.0, compute=0.75, **fields):
    return runlog.step_record(index, 4, phase, fields, shards=2, shards_total=2,
                              seconds=seconds, compute_seconds=compute, reduce_seconds=0.01)


def test_step_and_event_records_have_the_documented_keys():
    rec = step(1, "train", seconds=2.0, compute=1.5, epoch=0, loss=0.5)
    assert list(rec) == ["step", "of", "phase", "epoch", "loss", "shards", "shards_total", "seconds",
                         "compute_seconds", "compute_seconds_min", "sync_seconds", "reduce_seconds", "reducers",
                         "updates", "time"]
    assert rec["sync_seconds"] == 0.5
    assert rec["updates"] == 2  # one a shard unless workers combined theirs
    assert runlog.step_record(0, 1, "train", {}, shards=2, shards_total=2, seconds=2.0, compute_seconds=1.5,
                              reduce_seconds=0.0, updates=1)["updates"] == 1
    assert rec["compute_seconds_min"] == 1.5  # one worker's figure unless the fastest is given
    assert runlog.step_record(0, 1, "train", {}, shards=2, shards_total=2, seconds=2.0, compute_seconds=1.5,
                              reduce_seconds=0.0, compute_seconds_min=0.5)["compute_seconds_min"] == 0.5
    assert step(0, "train", seconds=1.0, compute=2.0)["sync_seconds"] == 0.0  # never negative
    event = runlog.event_record("worker_lost", worker="w#1")
    assert list(event) == ["event", "time", "worker"] and event["time"] > 1e9
    assert runlog.event_record("start", time="2024-01-01")["time"] == "2024-01-01"  # a caller's time wins
    assert runlog.is_progress(rec) and not runlog.is_progress(event)
    assert runlog.is_progress({"event": "epoch", "phase": "train"})  # an in-process epoch record


def test_writer_reader_round_trip(tmp_path):
    path = runlog.log_path(tmp_path)
    assert path.name == runlog.LOG_NAME == "log.jsonl"
    written = []
    with runlog.RunLog(path) as log:
        written.append(log.event("worker_registered", worker="w#1", shards=[0, 1]))
        written.append(log.write(step(0, "train", epoch=0)))
    with runlog.RunLog(path) as log:  # a second writer appends
        written.append(log.event("done", steps=1))
    assert runlog.read_records(path) == written
    assert [json.loads(line) for line in path.read_text().splitlines()] == written  # one object per line
    assert runlog.read_progress(path) == [written[1]]


def _append_events(path, n):
    with runlog.RunLog(path) as log:
        for i in range(n):
            log.event("tick", i=i, pad="x" * 20000)  # longer than an io buffer


def test_concurrent_writers_never_mix_lines(tmp_path):
    """Two other processes (fresh interpreters: forking a process with gRPC threads is unsafe)
    and this one append long records to one log at once; every line stays whole."""
    path = runlog.log_path(tmp_path)
    script = (f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
              "from iterreduce.storage import runlog\n"
              "with runlog.RunLog(sys.argv[1]) as log:\n"
              "    for i in range(50):\n"
              "        log.event('tick', i=i, pad='x' * 20000)\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path)]) for _ in range(2)]
    _append_events(path, 50)
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert len(runlog.read_records(path)) == 150


def test_progress_keeps_the_last_run_of_a_resumed_step(tmp_path):
    records = [runlog.event_record("worker_registered"), step(0, "a", loss=1.0), step(1, "a", loss=0.9),
               runlog.event_record("resumed", step=1), step(1, "a", loss=0.8), step(2, "b", loss=0.7)]
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    got = runlog.read_progress(path)
    assert [r["step"] for r in got] == [0, 1, 2]  # step 1 once, in its place
    assert got[1]["loss"] == 0.8  # the later record won
    assert len(runlog.read_records(path)) == 6


def test_progress_keeps_every_record_without_a_step():
    epochs = [{"event": "epoch", "phase": "train", "epoch": e} for e in range(3)]
    records = [{"event": "start", "time": "now"}, *epochs, {"event": "summary", "test_error": 0.1}]
    assert runlog.progress(records) == epochs


def test_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(step(0, "a")) + "\n\n" + '{"step": 1, "pha\n')
    with pytest.raises(ValueError, match=r"log\.jsonl, line 3: not valid JSON"):
        runlog.read_records(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"log\.jsonl, line 1: expected a JSON object, got list"):
        runlog.read_progress(path)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        runlog.read_records(tmp_path / "nope.jsonl")


def test_follower_returns_only_complete_lines(tmp_path):
    path = runlog.log_path(tmp_path)
    follower = runlog.Follower(path)
    assert follower.poll() == []  # no log yet
    first, second = {"event": "a", "time": 1.0}, {"event": "b", "time": 2.0}
    with open(path, "w") as f:
        f.write(json.dumps(first) + "\n" + json.dumps(second)[:7])  # the second line is half written
    assert follower.poll() == [first]
    assert follower.poll() == []
    with open(path, "a") as f:
        f.write(json.dumps(second)[7:] + "\n\n")
    assert follower.poll() == [second]
    assert runlog.Follower.at_end(path).poll() == []  # skips what is there
    with open(path, "a") as f:
        f.write("not json\n")
    with pytest.raises(ValueError, match=r"log\.jsonl, byte \d+: not valid JSON"):
        follower.poll()


def test_seconds_by_phase_sums_the_last_run_of_each_step():
    records = runlog.progress([
        step(0, "a", seconds=1.0, compute=0.5), step(1, "a", seconds=2.0, compute=1.0),
        step(1, "a", seconds=3.0, compute=2.0),  # step 1 redone after a resume: counts once
        step(2, "b", seconds=4.0, compute=4.0),
        runlog.event_record("done", seconds=99.0),
        {"event": "epoch", "phase": "a", "seconds": 50.0},  # no step: not a master's step time
    ])
    assert runlog.seconds_by_phase(records) == {
        "a": {"steps": 2, "seconds": 4.0, "sync_seconds": 1.5},
        "b": {"steps": 1, "seconds": 4.0, "sync_seconds": 0.0},
    }
    assert runlog.seconds_by_phase([]) == {}
