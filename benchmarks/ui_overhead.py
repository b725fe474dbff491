"""Does the live page slow training? The same job with the page watched, and without it.

Runs ``dbn mnist`` (``--quick`` unless ``--full``) ``--rounds`` times for each of ``--clients``,
in turn: ``browser``, the page open in headless Chromium on this machine (which polls it every
2 s, as a user's browser does); ``poller``, the same requests made from this script without a
browser (the master's serving cost alone, as when the browser runs on another machine); and
``none``, ``--no-ui``. Prints each run's training seconds (pre-training + fine-tuning, from
``result.json``), the master's and the browser's CPU seconds, and the ratios of the mean
training times to ``none``'s, measured in the same window. ``--screenshot FILE`` saves the
page once the job is ``--at`` of the way through (the README's).

    python benchmarks/ui_overhead.py [--rounds 2] [--clients browser,poller,none] [--full]
                                     [--screenshot docs/live-view.png] [--json]

Needs chromium, chromium-driver and selenium for ``browser`` (``bash bootstrap.sh test``
installs them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from browser import start_browser  # noqa: E402 - the tests' own headless Chromium

URL = re.compile(r"live view: (http://\S+)")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS


def browser_cpu_seconds() -> float:
    """CPU seconds of every Chromium process now running (the benchmark's own browser)."""
    total = 0.0
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if b"chromium" in (proc / "cmdline").read_bytes():
                total += cpu_seconds(int(proc.name)) or 0.0
        except OSError:
            continue
    return total


def poll_page(url: str, stop: threading.Event) -> int:
    """What the page's script fetches, without a browser: the state every 2 s, the images when
    the step changes. Returns the number of polls."""
    polls, last_step = 0, None
    while not stop.wait(2.0):
        try:
            with urllib.request.urlopen(url + "api/state", timeout=10) as r:
                state = json.loads(r.read())
            polls += 1
            if state["progress"]["steps_done"] != last_step:
                last_step = state["progress"]["steps_done"]
                for image in state["images"]:
                    urllib.request.urlopen(f"{url}images/{image['name']}.png", timeout=10).read()
        except OSError:
            continue
    return polls


def run(out: Path, *, client: str, full: bool, screenshot: Path | None = None, at: float = 0.7) -> dict:
    """One ``dbn mnist`` run. ``client``: "browser" (the page open in Chromium until the job
    ends), "poller" (the page's requests from a thread here, no browser) or "none" (--no-ui)."""
    ui = client != "none"
    args = [sys.executable, "-m", "dbn.cli", "mnist", "--out", str(out), "--overwrite"]
    args += [] if full else ["--quick"]
    args += [] if ui else ["--no-ui"]
    out.mkdir(parents=True, exist_ok=True)
    err_path = out.parent / f"{out.name}.stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, text=True)
    driver, polls, master_pid, master_cpu, browser_cpu = None, 0, None, None, None
    stop, poller, box = threading.Event(), None, {}
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            if master_pid is None and (out / "master.json").is_file():
                with contextlib.suppress(ValueError, KeyError):
                    master_pid = json.loads((out / "master.json").read_text())["pid"]
            if master_pid is not None:
                now = cpu_seconds(master_pid)
                if now is None and master_cpu is None:  # an earlier run's master.json: read it again
                    master_pid = None
                master_cpu = now or master_cpu
            if not ui:
                continue
            if driver is None and poller is None:
                match = URL.search(err_path.read_text())
                if match and client == "browser":
                    driver = start_browser(height=1250 if screenshot else 1000)
                    driver.get(match.group(1))
                elif match:
                    poller = threading.Thread(target=lambda: box.setdefault("polls", poll_page(match.group(1), stop)))
                    poller.start()
            elif screenshot is not None:
                fraction = driver.execute_script(
                    "const s = window.liveView.state; return s ? s.progress.fraction : 0;") or 0
                if fraction >= at:
                    time.sleep(3)  # a poll or two after the threshold, so every part is drawn
                    screenshot.parent.mkdir(parents=True, exist_ok=True)
                    driver.save_screenshot(str(screenshot))
                    screenshot = None
            if driver is not None:
                polls = driver.execute_script("return window.liveView.updates")
                browser_cpu = browser_cpu_seconds()
    finally:
        if driver is not None:
            driver.quit()
        if poller is not None:
            stop.set()
            poller.join()
            polls = box.get("polls", 0)
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise SystemExit(f"dbn mnist failed ({proc.returncode}): {err_path.read_text()[-2000:]}")
    result = json.loads((out / "result.json").read_text())
    return {"client": client, "train_seconds": result["pretrain_seconds"] + result["finetune_seconds"],
            "wall_seconds": result["wall_seconds"], "test_error": result["test_error"], "page_updates": polls,
            "master_cpu_seconds": master_cpu, "browser_cpu_seconds": browser_cpu}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="runs each way (default 2)")
    ap.add_argument("--clients", default="browser,none",
                    help="comma-separated, each run in turn every round: browser, poller, none (default browser,none)")
    ap.add_argument("--full", action="store_true", help="the full main job instead of --quick")
    ap.add_argument("--screenshot", type=Path, help="save the page's screenshot here (first run with the page)")
    ap.add_argument("--at", type=float, default=0.7, help="how far through the job the screenshot is taken")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dbn-ui-overhead")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    clients = args.clients.split(",")
    if set(clients) - {"browser", "poller", "none"}:
        ap.error(f"--clients: each of browser, poller, none; got {args.clients}")
    runs = []
    for i in range(args.rounds):
        for client in clients:
            shot = args.screenshot if client == "browser" and i == 0 else None
            runs.append(run(args.work / f"{client}-{i}", client=client, full=args.full, screenshot=shot, at=args.at))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    means = {c: statistics.mean(r["train_seconds"] for r in runs if r["client"] == c) for c in clients}
    summary = {"runs": runs, "mean_train_seconds": means}
    if "none" in means:
        summary["ratio_to_none"] = {c: means[c] / means["none"] for c in clients if c != "none"}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for r in runs:
            print(f"{r['client']:8} training {r['train_seconds']:7.1f} s  wall {r['wall_seconds']:7.1f} s  test error "
                  f"{100 * r['test_error']:.2f} %  page updates {r['page_updates']}  master CPU "
                  f"{r['master_cpu_seconds'] or 0:.1f} s  browser CPU {r['browser_cpu_seconds'] or 0:.1f} s")
        for client, ratio in summary.get("ratio_to_none", {}).items():
            print(f"training time, {client} / none: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
