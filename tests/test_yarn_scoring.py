"""`dbn predict --yarn` on the suite's real Hadoop (tests/minihadoop.py): a table of a million
rows on HDFS scored in place by three containers, one of them SIGKILLed mid-way, into Parquet
part files that appear whole: every row once, checked by its id."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from test_scoring import CLASSES, FEATURES, job_file, write_table
from dbn.cli import main

pytestmark = [pytest.mark.yarn, pytest.mark.hdfs, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

#: The bar's table: a million rows in 10 files of row groups of 25,000 (40 pieces).
ROWS, FILES, ROW_GROUP = 1_000_000, 10, 25_000


def write_big_table(fs, folder: str, seed: int = 1) -> None:
    """ROWS rows as test_scoring's tables, written straight to HDFS by pyarrow."""
    rng = np.random.default_rng(seed)
    per_file = ROWS // FILES
    for i in range(FILES):
        y = rng.integers(0, 3, per_file)
        X = np.clip(rng.normal(0.25 + 0.25 * y[:, None] * (np.arange(8) % 3 == y[:, None]), 0.15), 0, 1)
        table = pa.table({"id": pa.array(np.arange(i * per_file, (i + 1) * per_file), pa.int64()),
                          **{f: pa.array(X[:, j], pa.float32()) for j, f in enumerate(FEATURES)},
                          "label": pa.array(CLASSES[y])})
        with fs.open_output_stream(f"{folder}/part-{i:05d}.parquet") as out:
            pq.write_table(table, out, row_group_size=ROW_GROUP)


@pytest.fixture(scope="module")
def scoring_job(yarn, tmp_path_factory):
    """A classifier trained on a small local table (two hidden layers of 256, so that scoring takes
    a while), and a job file naming the million-row table on HDFS."""
    tmp = tmp_path_factory.mktemp("yarn-scoring")
    write_table(tmp / "small")
    train = job_file(tmp, str(tmp / "small"), str(tmp / "model"))
    train.write_text(train.read_text().replace("hidden_layers = [12]", "hidden_layers = [256, 256]")
                     .replace("finetune_epochs = 3", "finetune_epochs = 15"))
    assert main(["train", str(train), "--quiet"]) == 0
    write_big_table(yarn.hadoop.fs(), "/warehouse/big")
    job = tmp / "score.toml"
    job.write_text(train.read_text().replace(f'train = "{tmp / "small"}"', f'train = "{yarn.hadoop.uri("/warehouse/big")}"')
                   + f'[cluster]\nworkers = 3\nheartbeat_timeout = 6.0\n[yarn]\npython = "{sys.executable}"\n'
                     f'worker_memory = "1 GiB"\nworker_vcores = 1\nmaster_memory = "1 GiB"\n')
    return tmp / "model" / "model.npz", job


def scored_ids(yarn, folder: str) -> np.ndarray:
    table = ds.dataset(folder, filesystem=yarn.hadoop.fs(), format="parquet").to_table(columns=["id"])
    return np.sort(table.column("id").to_numpy())


def test_a_million_rows_scored_by_three_containers_one_killed_every_row_once(yarn, scoring_job, tmp_path, capsys):
    """Issue 41: a worker container SIGKILLed after the first steps: its share moves on (and it
    comes back), the output has exactly the table's rows; nothing is visible before the commit;
    a second run into the output is refused. Prints the throughput against one local process."""
    model, job = scoring_job
    out = yarn.hadoop.uri("/user/test/scores")
    assert main(["predict", str(model), str(job), "--out", out, "--yarn", "--keep", "id", "--part-rows", "25000",
                 "--quiet"]) == 0
    app_id = capsys.readouterr().out.strip()
    yarn.wait_step(app_id, 1)
    assert yarn.hadoop.fs().get_file_info("/user/test/scores").type == pafs.FileType.NotFound  # until the commit
    assert main(["status", app_id]) == 0
    status = capsys.readouterr().out
    assert re.search(r"superstep \d+ of 14: score", status) and "workers: worker-0 on " in status, status
    victim = next(c for c in yarn.containers(app_id, states=["RUNNING"]) if c.id == "worker-1_0")
    (pid,) = yarn.pids(victim.yarn_container_id, "iterreduce.launch.yarn.container worker")
    os.kill(pid, signal.SIGKILL)
    report = yarn.wait(app_id, timeout=400)
    yarn.assert_succeeded(report, app_id)

    fs = yarn.hadoop.fs()
    with fs.open_input_stream("/user/test/scores/_dbn/scoring.json") as f:
        record = json.loads(f.read())
    with fs.open_input_stream("/user/test/scores/_dbn/log.jsonl") as f:
        log = [json.loads(line) for line in f.read().decode().splitlines()]
    ids = scored_ids(yarn, "/user/test/scores")
    missing = np.setdiff1d(np.arange(ROWS), ids)
    assert np.array_equal(ids, np.arange(ROWS)), (  # every row, once
        len(ids), missing[:3], missing[-3:], record, [r for r in log if "event" in r], yarn.node_logs(app_id, 20000))
    assert record["rows"] == ROWS and record["error"] < 0.3, record
    assert fs.get_file_info("/user/test/scores/_SUCCESS").size == 0
    assert "worker_lost" in [r.get("event") for r in log]
    leftovers = [i.path for i in fs.get_file_info(pafs.FileSelector("/user/test", recursive=False))
                 if i.base_name.startswith(".scores")]
    assert not leftovers  # the staging folder became the output

    # Throughput: rows a container scored per second of its steps, against one local process.
    steps = [r for r in log if "step" in r and "of" in r and "samples" in r]
    busy = sum(r.get("seconds", 0) for r in steps)
    started = time.monotonic()
    assert main(["predict", str(model), str(job), "--out", str(tmp_path / "local.parquet"), "--keep", "id",
                 "--json"]) == 0
    local_s = time.monotonic() - started
    assert json.loads(capsys.readouterr().out)["error"] == record["error"]  # the same predictions
    with capsys.disabled():
        print(f"scoring: {ROWS} rows, 3 containers, {len(steps)} steps in {busy:.1f} s of steps; one local process "
              f"{local_s:.1f} s: per container {ROWS / 3 / max(busy, 1e-9):.0f} rows/s vs {ROWS / local_s:.0f} rows/s")

    assert main(["predict", str(model), str(job), "--out", out, "--yarn", "--quiet"]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
