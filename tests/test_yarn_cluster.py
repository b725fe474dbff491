"""Against a real YARN cluster: skipped unless one is configured.

On an edge node (``java`` and ``yarn`` on PATH, ``HADOOP_CONF_DIR`` set, a Kerberos
ticket if the cluster needs one), from a virtual environment with dbn-yarn installed
(not editable, so it can be packed):

    DBN_YARN_TEST=hdfs:///user/$USER/dbn-test .venv/bin/python -m pytest -m yarn

``DBN_YARN_TEST`` is an HDFS directory the tests may write into. Optional:
``DBN_YARN_QUEUE`` (default "default").
"""

import json
import os
import time
import uuid

import numpy as np
import pytest

from dbn import DBN
from dbn.cli import main

BASE = os.environ.get("DBN_YARN_TEST")
pytestmark = [pytest.mark.yarn,
              pytest.mark.skipif(not BASE, reason="no YARN cluster configured (set DBN_YARN_TEST=hdfs:///dir)")]


def job(tmp_path, output: str) -> str:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    X = (rng.random((400, 20)) < np.where(y[:, None] == 1, 0.7, 0.2)).astype(np.float32)
    np.savez(tmp_path / "train.npz", X=X, y=y)
    path = tmp_path / "job.toml"
    path.write_text(f"""
[data]
train = "train.npz"
[model]
hidden_layers = [16]
pretrain_epochs = 3
finetune_epochs = 3
[output]
dir = "{output}"
[cluster]
workers = 2
[yarn]
queue = "{os.environ.get('DBN_YARN_QUEUE', 'default')}"
worker_memory = "1 GiB"
worker_vcores = 1
[job]
name = "dbn-yarn-test"
device = "cpu"
""")
    return str(path)


def test_submit_runs_to_success_and_writes_the_model_to_hdfs(tmp_path, capsys):
    from iterreduce.shards import filesystem

    output = f"{BASE.rstrip('/')}/{uuid.uuid4().hex[:8]}"
    assert main(["submit", job(tmp_path, output), "--wait"]) == 0
    app_id = capsys.readouterr().out.strip().splitlines()[0]
    assert main(["status", app_id, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["final_status"] == "SUCCEEDED"
    fs, path = filesystem(output)
    with fs.open_input_stream(f"{path}/model.npz") as src:
        (tmp_path / "model.npz").write_bytes(src.read())
    assert list(DBN.load(tmp_path / "model.npz").hidden_layers) == [16]
    for _ in range(30):  # log aggregation finishes after the application
        if main(["logs", app_id]) == 0 and "working as worker-" in capsys.readouterr().out:
            break
        time.sleep(10)
    else:
        pytest.fail(f"no aggregated worker logs for {app_id}")


def test_kill(tmp_path, capsys):
    output = f"{BASE.rstrip('/')}/{uuid.uuid4().hex[:8]}"
    assert main(["submit", job(tmp_path, output), "--set", "model.pretrain_epochs=500"]) == 0
    app_id = capsys.readouterr().out.strip().splitlines()[0]
    assert main(["kill", app_id]) == 0
    capsys.readouterr()
    assert main(["status", app_id]) == 0
    assert "KILLED" in capsys.readouterr().out
