"""The live page (iterreduce.webui, dbn.jobs.view): what it shows, how it is served, and the page
itself in headless Chromium against a real local run."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import numpy as np
import pytest

from browser import console_errors, needs_browser, start_browser, wait_for
from conftest_runtime import SLOW_DBN, SOFTMAX, InProcessJob, blobs, kill_worker, read_log, run_job, subprocess_env
from iterreduce.storage import runlog
from iterreduce.webui import ViewServer, png, snapshot
from iterreduce.webui.server import to_json_bytes
from shardio.shards import write_shards
from threadwatch import NewThreads

# ------------------------------------------------------------------ helpers


def step(i, of, phase, seconds=1.0, sync=0.1, **fields):
    return {"step": i, "of": of, "phase": phase, "seconds": seconds, "sync_seconds": sync, "compute_seconds": 0.9,
            "shards": 2, "shards_total": 2, "time": 1000.0 + i, **fields}


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def decode_gray_png(data: bytes) -> np.ndarray:
    """The pixels of an 8-bit grey, filter-0 PNG (what png.encode_gray writes), read independently."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body)
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert (depth, color) == (8, 0)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, width + 1)
    assert (rows[:, 0] == 0).all()
    return rows[:, 1:]


# ------------------------------------------------------------------ snapshot


def test_a_chart_merges_the_parts_of_an_epoch_by_samples_and_splits_series_by_layer():
    records = [
        step(0, 9, "pretrain", layer=0, epoch=0, part=0, samples=300, reconstruction_error=10.0),
        step(1, 9, "pretrain", layer=0, epoch=0, part=1, samples=100, reconstruction_error=20.0),
        step(2, 9, "pretrain", layer=0, epoch=1, part=0, samples=100, reconstruction_error=float("nan")),
        step(3, 9, "pretrain", layer=1, epoch=0, part=0, samples=50, reconstruction_error=4.0),
        step(4, 9, "finetune", epoch=0, samples=10, loss=1.0, train_error=0.5),
        step(5, 9, "finetune", epoch=0, samples=30, loss=3.0, train_error=0.1, valid_error=0.2),
    ]
    chart = {"phase": "pretrain", "x": "epoch1", "y": ["reconstruction_error"], "by": "layer", "label": "layer {layer1}"}
    layer1, layer2 = snapshot.chart_series(records, chart)
    assert layer1["label"] == "layer 1" and layer1["x"] == [1, 2]
    assert layer1["y"]["reconstruction_error"] == [pytest.approx(12.5), None]  # (300*10 + 100*20) / 400; NaN left out
    assert layer2 == {"label": "layer 2", "x": [1], "y": {"reconstruction_error": [4.0]}}
    (fine,) = snapshot.chart_series(records, {"phase": "finetune", "x": "epoch", "y": ["loss", "train_error", "valid_error"]})
    assert fine["x"] == [0] and fine["y"]["loss"] == [2.5] and fine["y"]["train_error"] == [pytest.approx(0.2)]
    assert fine["y"]["valid_error"] == [0.2]  # only the record that has it


def test_the_default_spec_charts_every_numeric_metric_but_the_runtimes_own_keys():
    records = [step(0, 2, "train", samples=5, accuracy=0.5, loss=1.0, note="text", flag=True),
               {"event": "worker_lost", "worker": "w", "value": 3}]
    spec = snapshot.default_spec(records, "job")
    assert [c["y"] for c in spec["charts"]] == [["accuracy"], ["loss"]]
    state = snapshot.build(records, job={"name": "job"})
    assert [c["title"] for c in state["charts"]] == ["accuracy", "loss"]
    assert state["charts"][0]["series"] == [{"label": "train", "x": [0], "y": {"accuracy": [0.5]}}]


def test_progress_states_fraction_and_time_left_by_phase():
    job = {"schedule": [["a", 2], ["b", 2]], "steps": 4}
    assert snapshot.progress_of([], job, {})["state"] == "starting"
    records = [{"event": "start", "time": 990.0}, step(0, 4, "a", seconds=1.0, layer=0, epoch=3),
               step(1, 4, "a", seconds=3.0, layer=0, epoch=4)]
    p = snapshot.progress_of(records, job, {"position": ["layer", "epoch"]}, now=1010.0)
    assert p["state"] == "running" and p["steps_done"] == 2 and p["of"] == 4 and p["fraction"] == 0.5
    assert p["where"] == "a layer 1 epoch 5" and p["elapsed_s"] == 20.0
    assert p["remaining_s"] == pytest.approx(4.0)  # phase b not begun: the mean step so far, 2 s, twice
    records.append(step(2, 4, "b", seconds=10.0))
    assert snapshot.progress_of(records, job, {})["remaining_s"] == pytest.approx(10.0)  # b's own mean
    done = records + [step(3, 4, "b"), {"event": "done", "steps": 4, "seconds": 15.0, "time": 1005.0}]
    p = snapshot.progress_of(done, job, {}, now=2000.0)
    assert (p["state"], p["fraction"], p["remaining_s"], p["elapsed_s"]) == ("done", 1.0, 0.0, 15.0)
    failed = records + [{"event": "failed", "reason": "bad", "time": 1004.0}]
    assert snapshot.progress_of(failed, job, {})["state"] == "failed"
    again = failed + [{"event": "resumed", "step": 2, "time": 1006.0}]  # a resumed run runs again
    assert snapshot.progress_of(again, job, {})["state"] == "running"


def test_a_resumed_step_counts_once_and_sync_share_is_over_the_last_runs():
    records = [step(0, 3, "a", seconds=2.0, sync=1.0), step(1, 3, "a", seconds=2.0, sync=1.0),
               {"event": "resumed", "step": 1, "time": 1.0}, step(1, 3, "a", seconds=4.0, sync=1.0)]
    sync = snapshot.sync_of(records)
    assert sync == {"seconds": 2.0, "step_seconds": 6.0, "share": pytest.approx(1 / 3)}
    assert snapshot.progress_of(records, {}, {})["steps_done"] == 2


def test_every_runtime_event_reads_as_a_sentence_and_an_unknown_one_as_its_fields():
    events = [
        {"event": "worker_registered", "worker": "worker-0#1", "host": "h", "shards": [0]},
        {"event": "worker_lost", "worker": "worker-0#1", "reason": "no heartbeat", "shards_skipped": []},
        {"event": "worker_restarted", "worker": "worker-0", "exit": -9, "restart": 1, "error": "killed by SIGKILL"},
        {"event": "worker_gave_up", "worker": "worker-0", "exit": 1, "restarts": 3, "error": "boom"},
        {"event": "checkpoint", "step": 4, "path": "c"}, {"event": "resumed", "step": 4, "checkpoint": "c"},
        {"event": "exchange_failed", "step": 2, "round": 3, "reason": "peer gone"},
        {"event": "exchange_off", "step": 2, "failed": 2}, {"event": "stopped", "step": 3, "of": 9},
        {"event": "data_error", "worker": "w", "message": "NaN"}, {"event": "done", "steps": 4, "seconds": 2.0},
        {"event": "failed", "reason": "bad shard"},
        {"event": "container_lost", "container": "worker-1_2", "service": "worker-1", "cause": "preempted",
         "message": "Container preempted by scheduler", "counted": False},
        {"event": "containers_pending", "pending": 2, "running": 1, "queue": "q", "label": "", "seconds": 30},
        {"event": "resized", "workers": 1, "was": 3, "step": 6}, {"event": "worker_retired", "worker": "w", "wanted": 1},
        {"event": "worker_draining", "worker": "w", "reason": "its node is being decommissioned", "step": 3},
        {"event": "custom", "a": 1},
    ]
    assert set(snapshot.EVENT_TEXT) <= {e["event"] for e in events}  # every known event is tried
    texts = [e["text"] for e in snapshot.events_of([{**e, "time": 1.0} for e in events])]
    assert texts[0] == "worker-0#1 joined from h with shards [0]" and texts[-1] == "custom: a 1"
    assert not any("{" in t for t in texts)
    assert snapshot.events_of([{"event": "epoch", "phase": "x"}, {"event": "ui", "url": "u"}]) == []
    checkpoints = [{"event": "checkpoint", "step": i, "time": i} for i in range(1, 250)]
    assert [e["text"] for e in snapshot.events_of(checkpoints)] == ["checkpoint after step 249"]  # the newest
    lost = {"event": "worker_lost", "worker": "w", "reason": "r", "time": 0}
    texts = [e["text"] for e in snapshot.events_of([checkpoints[0], lost, *checkpoints[1:], lost])]
    assert texts == ["checkpoint after step 1", "w lost: r", "checkpoint after step 249", "w lost: r"]
    many = [{**lost, "worker": f"w{i}"} for i in range(250)]
    assert [e["text"] for e in snapshot.events_of(many)][-1] == "w249 lost: r"
    assert len(snapshot.events_of(many)) == snapshot.MAX_EVENTS


def test_the_workers_table_of_a_finished_job_comes_from_its_events():
    records = [{"event": "worker_registered", "worker": "worker-10#1", "host": "a", "shards": [10]},
               {"event": "worker_registered", "worker": "worker-2#2", "host": "b", "shards": [2]},
               {"event": "worker_lost", "worker": "worker-2#2", "reason": "x"},
               {"event": "worker_restarted", "worker": "worker-2", "restart": 1, "error": "x", "exit": 1},
               {"event": "worker_registered", "worker": "worker-2#3", "host": "c", "shards": [2], "local": 0.5},
               {"event": "done", "steps": 1, "seconds": 1.0}]
    table = snapshot.workers_from_log(records)
    assert [(w["name"], w["state"], w["host"], w["restarts"], w["local"]) for w in table] == [
        ("worker-2", "finished", "c", 1, 0.5), ("worker-10", "finished", "a", 0, None)]


# ------------------------------------------------------------------ images


@pytest.mark.parametrize("image", [np.arange(12, dtype=np.uint8).reshape(3, 4),
                                   np.linspace(-1, 1, 35).reshape(5, 7), np.full((2, 2), 7.0)])
def test_png_round_trips_the_grey_levels(image):
    pixels = decode_gray_png(png.encode_gray(image))
    np.testing.assert_array_equal(pixels, png.to_gray8(image))
    if image.dtype != np.uint8:
        assert pixels.min() == 0 and pixels.max() == (255 if np.ptp(image) else 0)


def test_png_refuses_what_is_not_an_image():
    with pytest.raises(ValueError, match="2-D"):
        png.encode_gray(np.zeros(4))
    with pytest.raises(ValueError, match="one pixel"):
        png.encode_gray(np.zeros((0, 3)))


def test_filter_tiles_scale_each_filter_and_need_a_square_visible_layer():
    from dbn.jobs import view

    rng = np.random.default_rng(0)
    weights = rng.standard_normal((16, 5))
    tiles = view.filter_tiles(weights)
    assert tiles.shape == (2 * 5 + 1, 3 * 5 + 1)  # 5 filters of 4x4: 2 rows of 3, 1-pixel borders
    first = tiles[1:5, 1:5]
    assert first.min() == 0 and first.max() == 1
    np.testing.assert_allclose(first.ravel(), (weights[:, 0] - weights[:, 0].min()) / np.ptp(weights[:, 0]))
    assert view.filter_tiles(rng.standard_normal((15, 3))) is None
    assert view.filters_of({"rbm.0.weights": weights}).shape == tiles.shape
    assert view.filters_of({}) is None


# ------------------------------------------------------------------ the server


def test_the_server_serves_the_page_its_state_and_images_and_nothing_else(tmp_path):
    log = tmp_path / "log.jsonl"
    with runlog.RunLog(log) as run:
        run.write(step(0, 2, "train", samples=4, loss=float("nan"), accuracy=0.5))
    server = ViewServer(log, job={"name": "j"}, images=lambda: {"pic": np.eye(3)},
                        spec={"title": "T", "charts": [{"x": "step", "y": ["loss"]}], "images": {"pic": "A picture"}})
    url = server.start()
    try:
        assert url.startswith("http://127.0.0.1:")
        status, kind, body = get(url)
        assert status == 200 and kind.startswith("text/html") and b"static/view.js" in body
        for name in ("view.js", "view.css", "uPlot.iife.min.js", "uPlot.min.css"):
            assert get(url + "static/" + name)[0] == 200, name
        status, kind, body = get(url + "api/state")
        state = json.loads(body)  # strict JSON: the NaN loss is null
        assert kind == "application/json" and state["title"] == "T"
        assert state["charts"][0]["series"][0]["y"]["loss"] == [None]
        assert state["images"] == [{"name": "pic", "title": "A picture"}]
        with runlog.RunLog(log) as run:  # appended records appear on the next poll
            run.write(step(1, 2, "train", samples=4, loss=1.0))
        assert json.loads(get(url + "api/state")[2])["progress"]["steps_done"] == 2
        status, kind, body = get(url + "images/pic.png")
        assert status == 200 and kind == "image/png"
        np.testing.assert_array_equal(decode_gray_png(body), png.to_gray8(np.eye(3)))
        for bad in ("images/none.png", "static/../server.py", "static/%2e%2e/server.py", "nothing", "api/other"):
            assert get(url + bad)[0] == 404, bad
    finally:
        server.stop()


def ask(port: int, target: str, host: str | None = "127.0.0.1:{port}", method: str = "GET") -> tuple[int, bytes]:
    """(status, body) of one raw request sent over a socket (urllib would quote or refuse odd targets)."""
    import http.client

    lines = [f"{method} {target} HTTP/1.1"] + ([f"Host: {host.format(port=port)}"] if host is not None else [])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(("\r\n".join(lines + ["Connection: close", "", ""])).encode("utf-8", "surrogateescape"))
        answer = http.client.HTTPResponse(conn, method=method)
        answer.begin()
        return answer.status, answer.read()


def small_log(tmp_path, steps: int = 1) -> Path:
    log = tmp_path / "log.jsonl"
    with runlog.RunLog(log) as run:
        for i in range(steps):
            run.write(step(i, 50, "train", samples=4, loss=1.0 / (i + 1)))
    return log


def test_odd_paths_get_404_or_400_and_static_names_come_from_the_page_folder_alone(tmp_path):
    """``/static/view.js%00`` was a 500 with a traceback (a NUL reached the file system): names are
    looked up in a fixed list of the page's files, and no path, however odd, gives a 5xx."""
    server = ViewServer(small_log(tmp_path), job={"name": "j"})
    server.start()
    try:
        for target in ("/static/view.js%00", "/static/view.js%00.css", "/static/%00", "/static/view.js\x00",
                       "/%ff", "/static/%c0%af", "/static/%ff.js", "//[x", "//[::1", "/static/../server.py",
                       "/static/%2e%2e/server.py", "/static/..%2fserver.py", "/static/", "/static/uPlot.LICENSE",
                       "/static/__init__.py", "/images/%00.png", "/images/..%2f..%2fx.png", "/api/state%00",
                       "/" + "a" * 5000, "http://[/", "*"):
            status, body = ask(server.port, target)
            assert status in (400, 404), (target, status, body)
            assert b"Traceback" not in body and b"Error" not in body, (target, body)
        assert ask(server.port, "/static/view.js")[0] == 200 and ask(server.port, "/static/view.js?v=1")[0] == 200
        assert ask(server.port, "/api/state", method="HEAD") == (200, b"")
        for method in ("POST", "PUT", "DELETE", "OPTIONS", "FOO"):
            assert ask(server.port, "/api/state", method=method)[0] == 405, method
    finally:
        server.stop()
    from iterreduce.webui.server import STATIC_FILES

    assert STATIC_FILES == {"index.html", "view.js", "view.css", "uPlot.iife.min.js", "uPlot.min.css"}


def test_the_page_answers_only_to_its_own_host_names(tmp_path):
    """A page of another site that rebinds its DNS name to 127.0.0.1 sends its own name as ``Host``:
    refused (421), as is a request with no ``Host`` or another port."""
    server = ViewServer(small_log(tmp_path), job={"name": "j"})
    server.start()
    try:
        for host in ("127.0.0.1:{port}", "localhost:{port}", "LocalHost:{port}", "[::1]:{port}"):
            assert ask(server.port, "/api/state", host=host)[0] == 200, host
        for host in ("evil.example:{port}", "evil.example", "127.0.0.1", "127.0.0.1:1{port}", "localhost.evil:{port}",
                     "127.0.0.2:{port}", "", None, "127.0.0.1:{port}@evil.example"):
            status, body = ask(server.port, "/api/state", host=host)
            assert status == 421 and b'"job"' not in body, (host, status)
        assert ask(server.port, "/", host="evil.example:{port}")[0] == 421
    finally:
        server.stop()
    # Bound to every address (`dbn view --host 0.0.0.0`): also this host's names and any IP address.
    server = ViewServer(small_log(tmp_path), job={"name": "j"})
    server.start("0.0.0.0")
    try:
        for host in ("127.0.0.1:{port}", f"{socket.gethostname()}:{{port}}", "10.1.2.3:{port}", "[fe80::1]:{port}"):
            assert ask(server.port, "/api/state", host=host)[0] == 200, host
        for host in ("evil.example:{port}", "10.1.2.3:1{port}", "10.1.2.3", None):
            assert ask(server.port, "/api/state", host=host)[0] == 421, host
    finally:
        server.stop()


def test_a_page_with_a_secret_is_served_under_it_alone(tmp_path):
    """On YARN the page has a secret path that only skein's proxy is told: without it, nothing."""
    server = ViewServer(small_log(tmp_path), job={"name": "j"}, secret="s3cr3t")
    url = server.start("127.0.0.1", advertise_host="node-7.cluster")  # as on YARN: the node's name is not where it listens
    try:
        assert url == f"http://127.0.0.1:{server.port}/s3cr3t/" and server.origin == f"http://127.0.0.1:{server.port}/"
        status, body = ask(server.port, "/s3cr3t/")
        assert status == 200 and b"static/view.js" in body
        assert json.loads(ask(server.port, "/s3cr3t/api/state")[1])["job"] == {"name": "j"}
        assert ask(server.port, "/s3cr3t/static/view.js")[0] == 200
        for target in ("/", "/api/state", "/static/view.js", "/s3cr3t", "/s3cr3T/api/state", "/s3cr3/api/state",
                       "/s3cr3tx/api/state", "/x/s3cr3t/api/state", "/%73%33cr3t/../api/state"):
            status, body = ask(server.port, target)
            assert status == 404 and b'"job"' not in body, (target, status)
    finally:
        server.stop()
    with pytest.raises(ValueError, match="secret"):
        ViewServer(small_log(tmp_path), job={}, secret="a/b")


def test_idle_connections_hold_at_most_the_cap_of_threads_and_are_closed_after_the_idle_timeout(tmp_path):
    """200 idle connections held 202 threads for ever (keep-alive, no timeout): now at most
    ``max_connections`` are served (the rest answered 503 and closed at once), and those are closed
    once idle for ``idle_timeout`` seconds; the page still answers meanwhile and after."""
    cap, idle = 8, 6.0  # longer than SYN retries (1 s, 3 s) of connections past the backlog
    server = ViewServer(small_log(tmp_path), job={"name": "j"}, max_connections=cap, idle_timeout=idle)
    started = NewThreads()
    server.start()
    conns = []
    try:
        for _ in range(200):
            conns.append(socket.create_connection(("127.0.0.1", server.port), timeout=idle + 10))
        opened = time.monotonic()
        time.sleep(0.5)
        assert started.count() <= 1 + cap, started.alive()  # serve_forever's thread and the cap
        answers = []
        for conn in conns:  # each is answered 503 at once, or served and closed once idle for `idle` s
            answer = b""
            while chunk := conn.recv(1024):
                answer += chunk
            answers.append(answer)
        assert time.monotonic() - opened < idle + 5
        # At most `cap` at a time: the rest are refused at once (a slot freed by an idle close
        # while the 200 are still being accepted, on a loaded machine, may serve a few more).
        refused = sum(a.startswith(b"HTTP/1.1 503 ") for a in answers)
        assert refused + answers.count(b"") == 200 and 200 - 2 * cap <= refused <= 200 - cap
        assert started.settle(1, seconds=5) == 1, started.alive()
        assert ask(server.port, "/api/state")[0] == 200
    finally:
        for conn in conns:
            conn.close()
        server.stop()


def test_the_state_and_images_are_built_once_per_new_log_record_however_many_ask(tmp_path, monkeypatch):
    """Every ``api/state`` rebuilt the whole snapshot (0.41 s of CPU at 20,000 records): now 100
    requests cost one build, a new record one more; the progress still moves with the clock and
    the live workers table is read on each request."""
    log = small_log(tmp_path, steps=3)
    drawn, tables = [], []
    server = ViewServer(log, job={"name": "j"}, images=lambda: drawn.append(1) or {"pic": np.eye(3)},
                        workers=lambda: tables.append(1) or [{"name": f"worker-{len(tables)}"}],
                        spec={"title": "T", "charts": [{"x": "step", "y": ["loss"]}], "images": {"pic": "P"}})
    url = server.start()
    try:
        states = [json.loads(get(url + "api/state")[2]) for _ in range(100)]
        pictures = {get(url + "images/pic.png")[2] for _ in range(100)}
        assert server.builds == 1 and len(drawn) == 1 and len(pictures) == 1
        assert len(tables) == 100 and states[-1]["workers"] == [{"name": "worker-100"}] and states[-1]["live"]
        assert states[0]["charts"] == states[-1]["charts"] and states[-1]["progress"]["steps_done"] == 3
        assert states[-1]["progress"]["elapsed_s"] > states[0]["progress"]["elapsed_s"]  # the clock moves on
        with runlog.RunLog(log) as run:
            run.write(step(3, 50, "train", samples=4, loss=0.2))
        state = json.loads(get(url + "api/state")[2])
        get(url + "images/pic.png")
        assert server.builds == 2 and len(drawn) == 2 and state["progress"]["steps_done"] == 4
        assert state["charts"][0]["series"][0]["x"] == [0, 1, 2, 3]
        fresh = json.loads(to_json_bytes(snapshot.build(runlog.read_records(log), job={"name": "j"}, spec=server.spec,
                                                        workers=state["workers"], images=["pic"])))
        assert {**state, "progress": None} == {**fresh, "progress": None}  # what a build from scratch shows
    finally:
        server.stop()


def test_a_torn_line_in_the_log_does_not_break_the_page(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps(step(0, 2, "a")) + "\n" + "{not json\n")
    server = ViewServer(log, job={})
    assert server.state()["progress"]["steps_done"] == 1
    with open(log, "a") as f:
        f.write(json.dumps(step(1, 2, "a")) + "\n")
    assert server.state()["progress"]["steps_done"] == 2


def test_to_json_bytes_has_no_nan_and_takes_numpy_scalars():
    data = json.loads(to_json_bytes({"a": float("inf"), "b": [np.float32(1.5), np.int64(2)], "c": (1, float("nan"))}))
    assert data == {"a": None, "b": [1.5, 2], "c": [1, None]}


# ------------------------------------------------------------------ the master serves it


def test_a_running_master_serves_its_page_with_the_live_workers_table(tmp_path):
    X, y = blobs(400)
    uris = write_shards(X, y, str(tmp_path / "shards"), 2)
    job = InProcessJob(tmp_path / "out", uris, workers=2, program=SOFTMAX,
                       program_config={"n_classes": 3, "epochs": 40}, name="softmax job")
    try:
        (ui,) = [r["url"] for r in read_log(tmp_path / "out") if r.get("event") == "ui"]
        assert ui == job.master.view.url and ui.startswith("http://127.0.0.1:")
        job.add_worker("worker-0")
        job.add_worker("worker-1")
        job.start()
        job.wait_for(lambda: job.master.current >= 3, what="a few steps")
        state = json.loads(get(ui + "api/state")[2])
        assert state["live"] and state["job"]["name"] == "softmax job" and state["job"]["workers"] == 2
        assert state["job"]["schedule"] == [["train", 40]] and "token" not in json.dumps(state)
        assert state["progress"]["state"] == "running" and state["progress"]["of"] == 40
        assert {w["name"] for w in state["workers"]} == {"worker-0", "worker-1"}
        assert all(w["heartbeat_age_s"] < 5 and w["restarts"] == 0 for w in state["workers"])
        assert any(w["samples_per_s"] for w in state["workers"])
        assert state["charts"] and state["charts"][0]["series"]  # the default spec: the program has none
        job.wait()
        assert json.loads(get(ui + "api/state")[2])["progress"]["state"] == "done"
    finally:
        job.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(ui + "api/state", timeout=5)  # closed with the job


def test_a_master_without_ui_serves_no_page(tmp_path):
    X, y = blobs(60)
    uris = write_shards(X, y, str(tmp_path / "shards"), 1)
    job = InProcessJob(tmp_path / "out", uris, workers=1, program=SOFTMAX, ui=False)
    job.run_to_end("worker-0")
    assert job.master.view is None
    assert not [r for r in read_log(tmp_path / "out") if r.get("event") == "ui"]


def test_dbn_view_serves_a_finished_run_from_its_output_directory(tmp_path, capsys):
    from dbn.cli import main
    from dbn.jobs.view import serve_run

    rng = np.random.default_rng(0)
    X = (rng.random((300, 16)) < 0.3).astype(np.float32)
    np.savez(tmp_path / "d.npz", X=X, y=rng.integers(0, 2, 300))
    out = tmp_path / "out"
    assert main(["train", "--set", f"data.train={tmp_path / 'd.npz'}", "--set", f"data.test={tmp_path / 'd.npz'}",
                 "--layers", "8", "--epochs", "3", "--finetune-epochs", "2", "--device", "cpu", "--local", "2",
                 "--out", str(out), "--quiet"]) == 0
    server = serve_run(out)
    try:
        state = json.loads(get(server.url + "api/state")[2])
        assert not state["live"] and state["progress"]["state"] == "done" and state["progress"]["fraction"] == 1.0
        recon, loss, errors = state["charts"]
        assert recon["series"][0]["label"] == "layer 1" and recon["series"][0]["x"] == [1, 2, 3]
        assert loss["series"][0]["x"] == [1, 2] and len(errors["series"][0]["y"]["train_error"]) == 2
        assert {w["name"] for w in state["workers"]} == {"worker-0", "worker-1"}
        assert state["images"][0]["name"] == "filters"
        assert "checkpoint after step 6" in [e["text"] for e in state["events"]]  # the last of one a step
        status, _, body = get(server.url + "images/filters.png")
        assert status == 200 and decode_gray_png(body).shape == (3 * 5 + 1, 3 * 5 + 1)  # 8 filters of 4x4
    finally:
        server.stop()
    # The command: a page per run given (to compare runs), until stopped.
    view = subprocess.Popen([sys.executable, "-m", "dbn.cli", "view", str(out), str(out)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        urls = [view.stdout.readline().split(": ", 1)[1].strip() for _ in range(2)]
        assert len(set(urls)) == 2
        for url in urls:
            assert json.loads(get(url + "api/state")[2])["progress"]["state"] == "done"
    finally:
        view.terminate()
        view.wait(10)
    with pytest.raises(FileNotFoundError, match="no log.jsonl"):
        serve_run(tmp_path)
    assert main(["view", str(tmp_path / "nowhere")]) == 2
    assert "no log.jsonl" in capsys.readouterr().err


def test_dbn_view_serves_a_run_trained_in_one_process(tmp_path):
    from dbn.cli import main
    from dbn.jobs.view import serve_run

    rng = np.random.default_rng(1)
    np.savez(tmp_path / "d.npz", X=(rng.random((120, 9)) < 0.4).astype(np.float32), y=rng.integers(0, 2, 120))
    out = tmp_path / "one"
    assert main(["train", "--set", f"data.train={tmp_path / 'd.npz'}", "--set", f"data.test={tmp_path / 'd.npz'}",
                 "--layers", "4", "--epochs", "2", "--finetune-epochs", "3", "--device", "cpu", "--out", str(out),
                 "--set", "job.name=solo", "--quiet"]) == 0
    server = serve_run(out)
    try:
        state = json.loads(get(server.url + "api/state")[2])
        assert state["job"]["name"] == "solo" and state["job"]["config"]["hidden_layers"] == [4]
        recon, loss, _ = state["charts"]
        assert recon["series"][0]["x"] == [1, 2] and loss["series"][0]["x"] == [1, 2, 3]
        assert state["workers"] == [] and state["progress"]["steps_done"] == 5
        assert state["progress"]["state"] == "done" and state["progress"]["fraction"] == 1.0
        assert decode_gray_png(get(server.url + "images/filters.png")[2]).shape == (2 * 4 + 1, 2 * 4 + 1)
    finally:
        server.stop()


# ------------------------------------------------------------------ in a real browser


@needs_browser
@pytest.mark.browser
def test_the_page_in_chromium_follows_a_real_local_run(tmp_path, monkeypatch):
    """A real local run (master and 2 worker processes), its page in headless Chromium: it loads
    with no console error, its progress and a curve advance as the job trains, a killed worker
    shows in its events and table, and its filters load."""
    side = 12
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 1200)
    X = (rng.random((1200, side * side)) < np.where(np.arange(side * side) % 3 == y[:, None], 0.7, 0.1))
    uris = write_shards(X.astype(np.float32), y, str(tmp_path / "shards"), 2)
    subprocess_env(monkeypatch, delay=0.15)  # about 0.2 s a step: a run of some 25 s
    config = {"hidden_layers": [32, 16], "pretrain_epochs": 30, "finetune_epochs": 40, "top_layer_epochs": 1,
              "pretrain_batch_size": 50, "finetune_batch_size": 50, "seed": 0}
    out = tmp_path / "out"
    box = {}
    runner = threading.Thread(target=lambda: box.setdefault("out", run_job(
        program=SLOW_DBN, program_config=config, shards=uris, workers=2, output=str(out), timeout=240)), daemon=True)
    runner.start()
    deadline = time.monotonic() + 60
    while not (urls := [r["url"] for r in read_log(out) if r.get("event") == "ui"]):
        assert time.monotonic() < deadline and runner.is_alive(), "the job logged no page address"
        time.sleep(0.1)
    driver = start_browser()
    try:
        driver.get(urls[0])
        first = wait_for(driver, "const s = window.liveView.state; return s && s.progress.steps_done >= 3 "
                                 "&& window.liveView.charts.length && [s.progress.steps_done, "
                                 "window.liveView.charts[0].points];")
        assert driver.title.startswith("DBN, hidden layers 32-16")
        kill_worker(out, "worker-1")
        wait_for(driver, f"const s = window.liveView.state; return s.progress.steps_done > {first[0]} && "
                         f"window.liveView.charts[0].points > {first[1]};")
        wait_for(driver, "return window.liveView.state.events.some(e => e.event === 'worker_restarted') && "
                         "window.liveView.state.workers.some(w => w.name === 'worker-1' && w.restarts >= 1);")
        assert driver.execute_script("return document.querySelector('#workers tbody').rows.length") == 2
        assert wait_for(driver, "const img = document.querySelector('.image img'); "
                                "return img && img.complete && img.naturalWidth;") == 6 * (side + 1) + 1  # 32 in 6 x 6
        assert driver.execute_script("return document.getElementById('bar-fill').style.width") != "0%"
        assert console_errors(driver) == []
        state = driver.execute_script("return window.liveView.state")
        assert state["progress"]["state"] == "running" and state["progress"]["remaining_s"] > 0
        driver.save_screenshot(str(tmp_path / "live-view.png"))
    finally:
        driver.quit()
        runner.join(240)
    assert box.get("out") == out.resolve()


def test_the_page_links_where_the_job_is_shown_beyond_it_web_addresses_only():
    from iterreduce.webui.snapshot import links_of

    records = [{"event": "links", "links": {"mlflow_run": "http://old/#/runs/1"}},
               {"event": "links", "links": {"mlflow_run": "https://mlflow.example.com/#/runs/2",
                                            "evil": "javascript:alert(1)", "odd": 7}}]
    assert links_of(records) == {"mlflow_run": "https://mlflow.example.com/#/runs/2"}
    assert links_of([{"event": "links", "links": "not a dict"}]) == {}
