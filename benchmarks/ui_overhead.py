"""Does the live page slow training? The same job with the page open in a browser, and without it.

Runs ``dbn mnist`` (``--quick`` unless ``--full``) ``--rounds`` times each way, alternating: with
the page served by the master and open in headless Chromium (which polls it every 2 s, as a
user's browser does), and with ``--no-ui``. Prints each run's training seconds (pre-training +
fine-tuning, from ``result.json``) and the ratio of the means, measured in the same window.
``--screenshot FILE`` saves the page once the job is ``--at`` of the way through (the README's).

    python benchmarks/ui_overhead.py [--rounds 2] [--full] [--screenshot docs/live-view.png] [--json]

Needs chromium, chromium-driver and selenium (``bash bootstrap.sh test`` installs them).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from browser import start_browser  # noqa: E402 - the tests' own headless Chromium

URL = re.compile(r"live view: (http://\S+)")


def run(out: Path, *, ui: bool, full: bool, screenshot: Path | None = None, at: float = 0.7) -> dict:
    """One ``dbn mnist`` run; with ``ui`` the page stays open in Chromium until the job ends."""
    args = [sys.executable, "-m", "dbn.cli", "mnist", "--out", str(out), "--overwrite"]
    args += [] if full else ["--quick"]
    args += [] if ui else ["--no-ui"]
    out.mkdir(parents=True, exist_ok=True)
    err_path = out.parent / f"{out.name}.stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, text=True)
    driver, polls = None, 0
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            if not ui:
                continue
            if driver is None:
                match = URL.search(err_path.read_text())
                if match:
                    driver = start_browser()
                    driver.get(match.group(1))
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
    finally:
        if driver is not None:
            driver.quit()
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise SystemExit(f"dbn mnist failed ({proc.returncode}): {err_path.read_text()[-2000:]}")
    result = json.loads((out / "result.json").read_text())
    return {"ui": ui, "train_seconds": result["pretrain_seconds"] + result["finetune_seconds"],
            "wall_seconds": result["wall_seconds"], "test_error": result["test_error"], "page_updates": polls}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="runs each way (default 2)")
    ap.add_argument("--full", action="store_true", help="the full main job instead of --quick")
    ap.add_argument("--screenshot", type=Path, help="save the page's screenshot here (first run with the page)")
    ap.add_argument("--at", type=float, default=0.7, help="how far through the job the screenshot is taken")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "dbn-ui-overhead")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    runs = []
    for i in range(args.rounds):
        for ui in (True, False):
            shot = args.screenshot if ui and i == 0 else None
            runs.append(run(args.work / f"{'ui' if ui else 'no-ui'}-{i}", ui=ui, full=args.full, screenshot=shot,
                            at=args.at))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    with_ui = [r["train_seconds"] for r in runs if r["ui"]]
    without = [r["train_seconds"] for r in runs if not r["ui"]]
    summary = {"runs": runs, "mean_train_seconds_ui": statistics.mean(with_ui),
               "mean_train_seconds_no_ui": statistics.mean(without),
               "ratio_ui_to_no_ui": statistics.mean(with_ui) / statistics.mean(without)}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for r in runs:
            print(f"{'page open' if r['ui'] else '--no-ui  '}  training {r['train_seconds']:7.1f} s  wall "
                  f"{r['wall_seconds']:7.1f} s  test error {100 * r['test_error']:.2f} %  page updates {r['page_updates']}")
        print(f"training time with the page / without: {summary['ratio_ui_to_no_ui']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
