"""Fingerprints of the models four small jobs train, to show a refactoring changed no bit.

Run it at two commits and compare the lines (the data are generated from fixed seeds):

    git stash; .venv/bin/python benchmarks/model_hashes.py > before.txt; git stash pop
    .venv/bin/python benchmarks/model_hashes.py > after.txt; diff before.txt after.txt

The cases: one process on a .npz file; --local 3 on it; a Parquet table read in place with
standard scaling, Gaussian visible units and string labels (--local 2); and a --local 2 run whose master is killed
(SIGKILL) mid-job and resumed with --resume, which must equal the same run undisturbed.
Each line is `case sha256`, the hash taken over the model's arrays (names, dtypes, shapes, bytes).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

DBN = [sys.executable, "-m", "dbn.cli"]
N_ROWS, N_FEATURES = 1200, 16


def model_hash(path: Path) -> str:
    """SHA-256 over every array of a saved model, in name order (the zip's own timestamps left out)."""
    digest = hashlib.sha256()
    with np.load(path, allow_pickle=False) as arrays:
        for name in sorted(arrays.files):
            value = arrays[name]
            digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def write_data(folder: Path) -> tuple[Path, Path]:
    """A .npz file and a Parquet table (two files, string labels, columns out of order) of one dataset."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    centres = rng.random((3, N_FEATURES))
    y = rng.integers(0, 3, N_ROWS)
    X = np.clip(centres[y] + 0.15 * rng.standard_normal((N_ROWS, N_FEATURES)), 0, 1).astype(np.float32)
    npz = folder / "train.npz"
    np.savez(npz, X=X, y=y)
    table = folder / "table"
    table.mkdir()
    names = np.array(["ant", "bee", "cat"])
    columns = {"label": pa.array(names[y])}
    for j in reversed(range(N_FEATURES)):
        columns[f"x{j}"] = pa.array(X[:, j] * 50.0 + 10.0)  # unscaled, so the scaler matters
    whole = pa.table(columns)
    pq.write_table(whole.slice(0, N_ROWS // 2), table / "part-00000.parquet")
    pq.write_table(whole.slice(N_ROWS // 2), table / "part-00001.parquet")
    return npz, table


def job(folder: Path, name: str, data: str, model: str = "") -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f"{data}\n[model]\n{model}hidden_layers = [12, 8]\npretrain_epochs = 4\nfinetune_epochs = 4\n"
                    f"[job]\nname = \"{name}\"\nseed = 3\ndevice = \"cpu\"\n")
    return path


def train(config: Path, out: Path, *extra: str) -> Path:
    subprocess.run([*DBN, "train", str(config), "--out", str(out), "--quiet", "--no-ui", *extra], check=True)
    return out / "model.npz"


def killed_and_resumed(config: Path, out: Path, kill_at: int) -> Path:
    """Train on 2 workers, SIGKILL the whole run when step ``kill_at`` is reported, then --resume it."""
    run = subprocess.Popen([*DBN, "train", str(config), "--out", str(out), "--no-ui", "--local", "2", "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    for line in run.stdout:
        if json.loads(line).get("step", -1) >= kill_at:
            os.killpg(run.pid, signal.SIGKILL)
            break
    run.wait()
    model = train(config, out, "--local", "2", "--resume")
    events = [json.loads(line).get("event") for line in (out / "log.jsonl").read_text().splitlines()]
    assert "resumed" in events, f"{out}: the run did not resume from a checkpoint"
    return model


def main() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        npz, table = write_data(folder)
        plain = job(folder, "plain", f'[data]\ntrain = "{npz}"')
        features = ", ".join(f'"x{j}"' for j in range(N_FEATURES))
        scaled = job(folder, "table", f'[data]\ntrain = "{table}"\nfeatures = [{features}]\nlabel = "label"\n'
                                      'scale = "standard"', model='visible = "gaussian"\n')
        cases = {
            "one-process": lambda: train(plain, folder / "one"),
            "local-3": lambda: train(plain, folder / "three", "--local", "3"),
            "table-standard-scaling-local-2": lambda: train(scaled, folder / "scaled", "--local", "2"),
            "local-2": lambda: train(plain, folder / "two", "--local", "2"),
            "local-2-killed-and-resumed": lambda: killed_and_resumed(plain, folder / "resumed", kill_at=9),
        }
        for name, run in cases.items():
            print(name, model_hash(run()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
