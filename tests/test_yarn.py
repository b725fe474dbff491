"""`dbn submit` end to end on a real Hadoop 3 (tests/minihadoop.py): a real ResourceManager
and NodeManager whose containers are real processes, skein's own Java driver and application
master, and a real HDFS holding the shards, checkpoints, logs and model. Nothing is stood in for.

Faults are real too: the application master's container is killed with SIGKILL, and YARN and
skein do what they do on a cluster. A killed worker, a killed master that resumes, `dbn status`,
`dbn logs` and `dbn kill` are tested on the Kerberos-secured cluster (tests/test_kerberos_yarn.py),
where they must also work with delegation tokens alone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pyarrow.fs as pafs
import pytest
from iterreduce.launch.yarn.skein_import import skein

from browser import console_errors, needs_browser, start_browser, wait_for
from yarnjobs import N_FEATURES, TERMINAL, job_file, shipped_job, upload
from dbn import DBN
from dbn.cli import main
from iterreduce.launch.yarn import KV_ADDRESS
from iterreduce.launch.yarn import client as yarn_client
from iterreduce.launch.yarn.relax import SPARE_SERVICE
from iterreduce.master import checkpoint
from iterreduce.storage.ownership import MANIFEST_NAME

pytestmark = [pytest.mark.yarn, pytest.mark.hdfs, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A real virtual environment with dbn-yarn installed from this checkout (not editable), as a user has."""
    from pythons import project_source

    base = tmp_path_factory.mktemp("venv")
    source = project_source(base)  # a copy, so the build leaves nothing in the checkout
    path = base / "env"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    done = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           f"{source}[hdfs]"], capture_output=True, text=True, cwd=base)
    assert done.returncode == 0, done.stdout + done.stderr
    return path


@pytest.fixture(scope="module")
def env_archive(yarn, venv, tmp_path_factory):
    """That environment packed by the project's own code and put on HDFS once, for the other tests' jobs."""
    from iterreduce.launch.yarn.envpack import pack_environment

    local = pack_environment(str(tmp_path_factory.mktemp("pack") / "dbn-env.tar.gz"), prefix=str(venv))
    fs = yarn.hadoop.fs()
    fs.create_dir("/envs")
    with open(local, "rb") as src, fs.open_output_stream("/envs/dbn-env.tar.gz", compression=None) as dst:
        dst.write(src.read())
    return yarn.hadoop.uri("/envs/dbn-env.tar.gz")


def submit(capsys, *args) -> str:
    assert main(["submit", *args, "--quiet"]) == 0
    return capsys.readouterr().out.strip()


def dbn(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ a user's whole run


def test_submit_from_a_packed_virtualenv_trains_with_data_and_model_on_hdfs(yarn, venv, tmp_path, capsys):
    """`dbn submit --wait` run from a real venv: it shards the data onto HDFS, packs that venv
    with venv-pack, starts skein's driver itself; the NodeManager localizes the archive."""
    output = yarn.hadoop.uri("/user/test/packed")
    env = {**os.environ, "HOME": str(tmp_path / "home")}  # dbn's caches (job files, archive) go here
    env.pop("XDG_CACHE_HOME", None)  # ... under HOME, also where the suite runs with a cache folder of its own
    env.pop("ITERREDUCE_SKEIN_DRIVER")  # a driver of its own, as for a user
    env.pop("PYTHONPATH", None)  # the suite's (this checkout): the venv's dbn imports what it installed
    done = subprocess.run([str(venv / "bin" / "dbn"), "submit", job_file(tmp_path, output), "--wait"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    app_id = done.stdout.strip().splitlines()[-1]
    assert "packing this Python environment" in done.stderr
    assert f"{app_id}: FINISHED (SUCCEEDED), progress 100 %" in done.stderr
    assert "superstep" in done.stderr  # progress lines while it ran
    assert re.search(rf"live view: http://\S*/{app_id}/\S*/training/", done.stderr)  # the page, behind YARN's proxy
    archives = list((tmp_path / "home" / ".cache" / "dbn-yarn" / "environments").glob("*.tar.gz"))
    assert len(archives) == 1 and archives[0].stat().st_size > 10_000_000

    fs = yarn.hadoop.fs()
    shards = fs.get_file_info(pafs.FileSelector("/user/test/packed/shards"))
    assert sorted(s.base_name for s in shards) == [MANIFEST_NAME, "part-00000.parquet", "part-00001.parquet"]
    assert any(c.base_name.startswith("ckpt-") for c in fs.get_file_info(pafs.FileSelector("/user/test/packed/checkpoints")))
    assert yarn.hdfs_json_lines("/user/test/packed/log.jsonl")[-1]["event"] == "done"
    with fs.open_input_stream("/user/test/packed/model.npz") as f:
        (tmp_path / "model.npz").write_bytes(f.read())
    model = DBN.load(tmp_path / "model.npz")
    data = np.load(tmp_path / "train.npz")
    assert list(model.hidden_layers) == [12, 8] and model.score(data["X"], data["y"]) > 0.6

    # The containers ran the archive's own Python, and master and workers spoke mutual TLS.
    code, logs, _ = dbn(capsys, "logs", app_id)
    assert code == 0
    assert "environment/bin/python" in logs
    assert "with mutual TLS" in logs
    assert "working as worker-0" in logs and "working as worker-1" in logs


# ------------------------------------------------------------------ faults


def test_the_run_path_on_yarn_tests_the_model_and_writes_the_report_locally(yarn, env_archive, tmp_path):
    """run(spec, Yarn(...)), as `dbn mnist --yarn` uses it: the job trains in containers, the
    model and the log come back from HDFS, and result.json is the same object as elsewhere.
    The workers reduce among themselves (container to container, with the application's TLS)."""
    from dbn.jobs.run import Yarn, run
    from dbn.jobs.spec import load_spec

    output = yarn.hadoop.uri("/user/test/runpath")
    spec = load_spec(job_file(tmp_path, output, env=env_archive, cluster_extra='reduce = "workers"'),
                     {"data.test": str(tmp_path / "train.npz")})
    seen: list[dict] = []
    report = tmp_path / "report"
    result = run(spec, Yarn(str(report), log=lambda msg: None, poll=1.0), on_record=seen.append)

    assert result["on"].startswith("yarn (application_") and result["workers"] == 2
    assert result["layers"] == [N_FEATURES, 12, 8, 3] and 0 <= result["test_error"] < 0.4  # as the first test's bar
    assert result["n_train"] == 600 and result["pretrain_seconds"] > 0
    assert json.loads((report / "result.json").read_text())["test_error"] == result["test_error"]
    assert DBN.load(report / "model.npz").n_classes_ == 3
    assert any("step" in r for r in seen)  # the master's progress, followed while it ran
    steps = [r for r in seen if "step" in r and "event" not in r]
    assert steps and all(r["reducers"] == 2 for r in steps), steps[:2]  # every step, by both workers
    assert not [r for r in seen if r.get("event") == "exchange_failed"]


# A new application attempt resumes only its own submission's checkpoints (issue 36, item 4). Before,
# the second attempt resumed the newest checkpoint of the job (its fingerprint) in the folder, whoever
# wrote it: a submission whose first attempt died before its own first checkpoint went on from an
# earlier submission's checkpoint of the same job, here its last: it trained nothing.


def plant_another_submissions_checkpoint(job: dict, tmp_path) -> tuple[str, str]:
    """A checkpoint of the very same job, as an earlier submission into that output folder would
    have left it, at the job's last step; returns (its URI, the job's fingerprint)."""
    from iterreduce.master import Master
    from iterreduce.launch.yarn.container import master_config

    config = master_config(job, tmp_path / "planted", "token", restart=False, run_id="application_0_0001")
    master = Master(config)
    n_steps = len(master.steps)
    arrays = master.program.initial_parameters(config.seed, master.shards)
    uri = checkpoint.save(config.checkpoint_dir, n_steps, {"n_steps": n_steps, "seed": config.seed,
                                                           "program": config.program,
                                                           "fingerprint": master.fingerprint,
                                                           "run": "application_0_0001"}, arrays)
    return uri, master.fingerprint


def test_a_new_attempt_never_resumes_another_submissions_checkpoint_of_the_same_job(yarn, env_archive, tmp_path,
                                                                                    capsys):
    output = yarn.hadoop.uri("/user/test/own-checkpoints")
    app_id = submit(capsys, job_file(tmp_path, output, env=env_archive, epochs=6))
    planted, _ = plant_another_submissions_checkpoint(shipped_job(output), tmp_path)
    # Kill the first attempt as early as it can be seen: before its first checkpoint.
    am_container = f"container_{app_id.removeprefix('application_')}_01_000001"
    deadline = time.monotonic() + 120
    while not (pids := yarn.pids(am_container, "com.anaconda.skein.ApplicationMaster")):
        assert time.monotonic() < deadline, yarn.node_logs(app_id)
        time.sleep(0.2)
    os.killpg(os.getpgid(pids[0]), signal.SIGKILL)  # the whole container: skein's AM and our master

    report = yarn.wait(app_id, timeout=300)
    yarn.assert_succeeded(report, app_id)
    assert any(p.name.endswith("_02_000001") for p in yarn.hadoop.dir.glob(f"cluster/**/{app_id}/container_*"))
    records = yarn.hdfs_json_lines("/user/test/own-checkpoints/log.jsonl")
    resumed = [r for r in records if r.get("event") == "resumed"]
    assert all(r["checkpoint"] != planted for r in resumed), resumed
    steps = [r["step"] for r in records if "step" in r and "phase" in r]
    assert steps and steps[-1] == [r for r in records if "phase" in r][-1]["of"] - 1  # it trained to the end
    assert steps[0] == (resumed[0]["step"] if resumed else 0)  # from its own checkpoint, or from the start
    for r in resumed:  # a checkpoint this very submission wrote (its first attempt's), if any
        header, _ = checkpoint.load(r["checkpoint"])
        assert header["run"] == app_id, header
    finals = [r for r in records if r.get("event") == "checkpoint"]
    assert finals and checkpoint.load(finals[-1]["path"])[0]["run"] == app_id


def test_a_job_error_ends_the_application_failed_with_the_reason_in_status(yarn, env_archive, hdfs, tmp_path, capsys):
    from shardio.shards import write_shards

    X = np.random.default_rng(0).random((40, N_FEATURES), dtype=np.float32)
    write_shards(X, None, hdfs.uri("/user/test/unlabelled"), 2)  # no labels, but fine-tuning is asked for
    code, out, err = dbn(capsys, "submit", str(job_file(tmp_path, hdfs.uri("/user/test/bad"), env=env_archive)),
                         "--set", f"cluster.shards={hdfs.uri('/user/test/unlabelled')}", "--max-attempts", "1",
                         "--wait", "--quiet")
    assert code == 2, err  # bad data: the user's to fix, as on one machine
    app_id = out.strip()
    assert err.startswith(f"dbn: error: {app_id} ended FAILED: ") and "the job stopped on bad data" in err
    report = yarn.wait(app_id)
    assert str(report.final_status) == "FAILED"
    assert "the job stopped on bad data" in report.diagnostics and "no 'label' column" in report.diagnostics
    code, out, _ = dbn(capsys, "status", app_id)
    assert code == 0 and "FINISHED (FAILED)" in out and "no 'label' column" in out


# ------------------------------------------------------------------ the live page


@needs_browser
@pytest.mark.browser
def test_the_live_page_is_reached_through_the_tracking_url_in_a_real_browser(yarn, env_archive, tmp_path, capsys):
    """The ResourceManager's tracking URL leads to skein's web UI, whose link leads to the job's
    page through YARN's web proxy: in headless Chromium it loads with no console error, and its
    progress and curves advance while the job trains."""
    app_id = submit(capsys, job_file(tmp_path, yarn.hadoop.uri("/user/test/ui"), env=env_archive, epochs=400))
    yarn.wait_step(app_id, 2)
    tracking_url = yarn.report(app_id).tracking_url
    assert tracking_url and app_id in tracking_url
    driver = start_browser()
    try:
        driver.get(tracking_url)
        link = wait_for(driver, "return [...document.querySelectorAll('a')].find("
                                "a => a.textContent.includes('Training progress'));")
        driver.find_element("id", "servicePages").click()  # skein's "Service Pages" menu, then its link
        wait_for(driver, "return [...document.querySelectorAll('a')].some(a => a.textContent.includes("
                         "'Training progress') && a.offsetParent !== null);")
        link.click()
        first = wait_for(driver, "const s = window.liveView && window.liveView.state; return s && "
                                 "s.progress.steps_done >= 3 && window.liveView.charts.length && "
                                 "[s.progress.steps_done, window.liveView.charts[0].points];")
        assert f"/{app_id}/" in driver.current_url and driver.current_url.endswith("/training/")
        wait_for(driver, f"const s = window.liveView.state; return s.progress.steps_done > {first[0]} && "
                         f"window.liveView.charts[0].points > {first[1]};")
        state = driver.execute_script("return window.liveView.state")
        assert state["live"] and state["job"]["name"] == "e2e" and state["progress"]["state"] == "running"
        assert {w["name"] for w in state["workers"]} == {"worker-0", "worker-1"}
        assert wait_for(driver, "const img = document.querySelector('.image img'); "
                                "return img && img.complete && img.naturalWidth;") == 4 * (4 + 1) + 1  # 12 filters of 4x4: 4 columns
        assert console_errors(driver) == []
    finally:
        driver.quit()
        dbn(capsys, "kill", app_id)
    assert str(yarn.wait(app_id, timeout=60).state) == "KILLED"


# ------------------------------------------------------------------ GPUs


def test_gpu_workers_are_scheduled_against_the_declared_yarn_io_gpu(yarn, env_archive, tmp_path, capsys):
    app_id = submit(capsys, job_file(tmp_path, yarn.hadoop.uri("/user/test/gpus"), env=env_archive, epochs=400),
                    "--worker-gpus", "1")
    deadline = time.monotonic() + 120
    used = 0
    while used < 2:  # both workers hold one of the node's 2 units (the master none)
        node = yarn.client.get_nodes()[0]
        used = node.used_resources.gpus
        assert time.monotonic() < deadline and str(yarn.report(app_id).state) not in TERMINAL, \
            f"GPUs in use: {used}"
        time.sleep(0.2)
    assert node.total_resources.gpus == 2
    yarn.client.kill_application(app_id)
    yarn.wait(app_id, timeout=60)


@pytest.mark.parametrize("flags, message", [
    (["--worker-gpus", "3"], "each worker container asks for 3 GPUs (yarn.io/gpu), but the largest of the "
                             "cluster's 1 nodes has 2"),
    (["--worker-gpus", "1", "--workers", "3"], "needs 3 GPUs (yarn.io/gpu) at once (master and all workers), "
                                               "but the cluster's 1 nodes have 2 in all"),
], ids=["more-than-a-node", "more-than-the-cluster"])
def test_more_gpus_than_the_cluster_has_is_refused_with_a_clear_message(yarn, env_archive, tmp_path, capsys,
                                                                         flags, message):
    before = len(yarn.client.get_applications(states=list(skein.model.ApplicationState)))
    code, out, err = dbn(capsys, "submit", job_file(tmp_path, yarn.hadoop.uri("/user/test/toomany"), env=env_archive),
                         *flags)
    assert code == 2 and out == "" and message in err, err
    assert len(yarn.client.get_applications(states=list(skein.model.ApplicationState))) == before  # none submitted


# ------------------------------------------------------------------ security and locality


def listeners(pid: int) -> list[tuple[str, int]]:
    """The (address, port) of every TCP socket process ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address, port = fields[1].split(":")
                host = ".".join(str(b) for b in reversed(bytes.fromhex(address))) if len(address) == 8 else address
                found.append((host, int(port, 16)))
    return found


def http_get(host: str, port: int, path: str, source: str = "127.0.0.1", host_header: str | None = None):
    """(status, headers, body) of a plain GET from the address ``source``, or None when what
    listens there does not speak HTTP/1.1."""
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=10, source_address=(source, 0))
    try:
        conn.request("GET", path, headers={"Host": host_header or f"{host}:{port}"})
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    except (http.client.HTTPException, OSError):
        return None
    finally:
        conn.close()


def test_master_and_workers_talk_mutual_tls_and_refuse_outsiders(yarn, env_archive, tmp_path, capsys):
    """The application has credentials of its own: plaintext, another application's certificate and
    the user's own skein certificate (which every application of the user and skein's driver hold)
    are all refused by the application master (its key-value store holds the job's token), the
    master and the workers' peer services. The live page is read through the ResourceManager's
    proxy only: skein's web UI redirects a client from any other address to the proxy, and the
    page itself listens on the master container's loopback under a secret path. The job completes."""
    import urllib.request

    from iterreduce.proto import iterreduce_pb2 as pb
    from iterreduce.proto import iterreduce_pb2_grpc as pb_grpc
    from iterreduce.transport.security import channel_credentials, channel_options, from_skein, metadata

    output = yarn.hadoop.uri("/user/test/tls")
    app_id = submit(capsys, job_file(tmp_path, output, env=env_archive, epochs=30,
                                     cluster_extra='reduce = "workers"'))  # the workers serve their peer service
    yarn.wait_step(app_id, 1)
    own = yarn_client.application_security(app_id)
    folder = yarn_client.application_dir(app_id)
    assert own is not None and from_skein(own).cert != from_skein(yarn.client.security).cert  # not the user's
    assert folder.stat().st_mode & 0o777 == 0o700 and (folder / "skein.pem").stat().st_mode & 0o777 == 0o600
    app = yarn_client.application(yarn.client, app_id)
    address, token = app.kv[KV_ADDRESS].decode(), app.kv["iterreduce/token"].decode()  # the intruders get it even

    user = skein.Security.from_directory(os.environ["SKEIN_CONFIG"])  # the user's own skein credentials
    with pytest.raises((skein.exceptions.SkeinError, ConnectionError, grpc.RpcError)):
        yarn.client.connect(app_id, wait=False, security=user).kv.get("iterreduce/token")

    def call(target, credentials=None):
        """The status a Register call to ``target`` ends with."""
        channel = (grpc.insecure_channel(target) if credentials is None else
                   grpc.secure_channel(target, channel_credentials(credentials), channel_options(credentials)))
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.MasterStub(channel).Register(pb.RegisterRequest(worker_name="worker-0"), metadata=metadata(token),
                                                 timeout=10, wait_for_ready=False)
        channel.close()
        return info.value.code()

    am_container = app_id.replace("application_", "container_") + "_01_000001"
    container = "iterreduce.launch.yarn.container"
    workers = [pid for c in yarn.containers(app_id) for pid in yarn.pids(c.yarn_container_id, container)]
    peers = [f"127.0.0.1:{port}" for pid in workers for _, port in listeners(pid)]
    assert len(workers) == 2 and len(peers) >= 2, (workers, peers)
    outsiders = {"plaintext": None, "another application's": from_skein(skein.Security.new_credentials()),
                 "the user's": from_skein(user)}
    for target in [address, *peers]:
        for who, credentials in outsiders.items():
            assert call(target, credentials) == grpc.StatusCode.UNAVAILABLE, (target, who)  # no TLS handshake
    for target in peers:  # with the application's own certificate the handshake succeeds (a peer has no Register)
        assert call(target, from_skein(own)) == grpc.StatusCode.UNIMPLEMENTED, target

    # The page through the ResourceManager's proxy (the tracking URL): served.
    tracking_url = yarn.report(app_id).tracking_url
    with urllib.request.urlopen(tracking_url.rstrip("/") + "/pages/training/api/state", timeout=30) as answer:
        assert json.loads(answer.read())["job"]["name"] == "e2e"
    # skein's web UI, asked directly from another address than the proxy's: sent to the proxy.
    ams = yarn.pids(am_container, "com.anaconda.skein.ApplicationMaster")
    answers = [http_get("127.0.0.1", port, "/pages/training/api/state", source="127.0.0.2")
               for pid in ams for _, port in listeners(pid)]
    refused = [a for a in answers if a is not None and a[0] in (302, 303, 307, 403)]
    assert refused and all(re.search(f"^http://[^/]+/proxy/(redirect/)?{app_id}/pages/training/api/state$",
                                     a[1].get("Location", "")) for a in refused if a[0] != 403), answers
    assert not any(a is not None and a[0] == 200 and b"e2e" in a[2] for a in answers), answers
    # The page's own listener: loopback only, and nothing but 404 without the secret path.
    pages = [(host, port) for pid in yarn.pids(am_container, "iterreduce.launch.yarn.container")
             for host, port in listeners(pid) if not address.endswith(f":{port}")]
    assert pages and all(host == "127.0.0.1" for host, _ in pages), pages
    for _, port in pages:
        for path in ("/", "/api/state", "/static/view.js", "/pages/training/api/state"):
            answer = http_get("127.0.0.1", port, path)
            assert answer is not None and answer[0] == 404 and b"e2e" not in answer[2], (port, path, answer)

    report = yarn.wait(app_id)
    yarn.assert_succeeded(report, app_id)
    records = yarn.hdfs_json_lines("/user/test/tls/log.jsonl")
    assert sorted(r["worker"].split("#")[0] for r in records if r.get("event") == "worker_registered") == \
        ["worker-0", "worker-1"]  # the intruders never registered
    assert dbn(capsys, "status", app_id)[0] == 0 and not folder.exists()  # the ended application's are removed



def test_block_locations_come_from_the_real_namenode(yarn, hdfs, tmp_path):
    from shardio.shards import write_shards
    from iterreduce.launch.yarn import locality

    X = np.random.default_rng(0).random((90, N_FEATURES), dtype=np.float32)
    uris = write_shards(X, np.zeros(90, dtype=np.int64), hdfs.uri("/user/test/located"), 3)
    blocks = locality.file_blocks(uris)
    node_host = yarn.client.get_nodes()[0].id.split(":")[0]
    assert set(blocks) == set(uris), blocks
    assert all(b.hosts() == [node_host] and b.size > 0 and b.local_fraction(node_host) == 1 for b in blocks.values())
    assert locality.place(locality.slot_blocks(uris, 2, blocks)) == [node_host, node_host]

    # dbn submit turns them into the workers' preferred hosts.
    from dbn.jobs.spec import load_spec
    from dbn.jobs.yarn import prepare

    cfg = load_spec(job_file(tmp_path, hdfs.uri("/user/test/located-job"), env="hdfs:///x.tgz"),
                      {"cluster.shards": hdfs.uri("/user/test/located")})
    submission = prepare(cfg)
    assert [s["host"] for s in submission.job["slots"]] == [node_host, node_host]
    assert submission.spec.services["worker-0"].nodes == submission.spec.services["worker-1"].nodes == [node_host]


# ------------------------------------------------------------------ a table as Spark wrote it


def test_a_spark_table_on_hdfs_trains_in_place_on_yarn(yarn, env_archive, tmp_path):
    """Issue 16 on the real cluster: a job file naming a Spark-layout table on HDFS (partition
    folders, several part files, a vector column, a string label) trains with no conversion;
    the shares on HDFS are small JSON files, the workers prefer the hosts of the table's
    blocks, and the model predicts the test rows' labels from their raw values."""
    from test_table_jobs import ANIMALS, write_animals

    from dbn.jobs.run import Yarn, run
    from dbn.jobs.spec import load_spec
    from dbn.jobs.yarn import prepare

    rows = write_animals(tmp_path / "animals")
    fs = yarn.hadoop.fs()
    upload(fs, tmp_path / "animals", "/warehouse/animals")
    table = yarn.hadoop.uri("/warehouse/animals")
    output = yarn.hadoop.uri("/user/test/table-job")
    path = Path(job_file(tmp_path, output, env=env_archive, epochs=3, finetune=12))
    text = path.read_text()
    path.write_text(re.sub(r'\[data\]\ntrain = "[^"]*"\n', f'''[data]
train = "{table}"
filter = "split == 'train'"
test = "{table}"
test_filter = "split == 'test'"
features = ["vec", "x0", "x1", "x2", "x3"]
label = "animal"
''', text).replace("hidden_layers = [12, 8]", "hidden_layers = [24]"))
    spec = load_spec(str(path), {"model.finetune_learning_rate": 0.3})

    submission = prepare(spec)  # the shares, and the hosts of the table's blocks
    node_host = yarn.client.get_nodes()[0].id.split(":")[0]
    assert [s["host"] for s in submission.job["slots"]] == [node_host, node_host]
    assert all(s["bytes_on"] == {node_host: s["bytes"]} and s["bytes"] > 0 for s in submission.job["slots"])
    shares = fs.get_file_info(pafs.FileSelector("/user/test/table-job/shards"))
    assert sorted(s.base_name for s in shares) == [MANIFEST_NAME, "part-00000.table.json", "part-00001.table.json"]

    report = tmp_path / "report"
    result = run(spec, Yarn(str(report), log=lambda msg: None, poll=1.0))
    X_test, y_test = rows["test"]
    assert result["n_train"] == len(rows["train"][1]) and result["n_test"] == len(y_test)
    assert result["test_error"] < 0.1
    model = DBN.load(report / "model.npz")
    predicted = model.predict(X_test)
    assert set(predicted) <= set(ANIMALS)
    assert np.mean(predicted != y_test) == pytest.approx(result["test_error"])


def test_a_delta_table_on_hdfs_trains_its_current_version_on_yarn(yarn, env_archive, tmp_path):
    """Issue 39 on the real cluster: a Delta Lake table in the warehouse, overwritten, deleted from
    and updated, trains on YARN on exactly the rows its newest version holds (its old files
    stay in the folder); the client reads the log from HDFS, the containers read the files the
    pieces name, with no Delta library. Version 0 resolves from HDFS to the first version's files."""
    deltalake = pytest.importorskip("deltalake")
    from test_delta import write_versions

    from dbn.jobs.run import Yarn, run
    from dbn.jobs.spec import load_spec
    from shardio.pieces import pieces
    from shardio.tables import TableSource, open_dataset, with_version_fixed

    local = write_versions(tmp_path / "delta")
    fs = yarn.hadoop.fs()
    upload(fs, local, "/warehouse/delta-animals")
    table = yarn.hadoop.uri("/warehouse/delta-animals")
    now = deltalake.DeltaTable(str(local)).to_pyarrow_table()
    first = with_version_fixed(TableSource(table, ["vec", "f4", "f5"], label="label", format="delta", version=0))
    assert sum(p.rows for p in pieces(open_dataset(first))) == 600

    output = yarn.hadoop.uri("/user/test/delta-job")
    path = Path(job_file(tmp_path, output, env=env_archive, epochs=1, finetune=2))
    path.write_text(re.sub(r'\[data\]\ntrain = "[^"]*"\n', f'''[data]
train = "{table}"
format = "delta"
features = ["vec", "f4", "f5"]
label = "label"
''', path.read_text()).replace("hidden_layers = [12, 8]", "hidden_layers = [12]"))
    spec = load_spec(str(path))
    result = run(spec, Yarn(str(tmp_path / "report"), log=lambda msg: None, poll=1.0))
    assert result["n_train"] == now.num_rows < 600
    model = DBN.load(tmp_path / "report" / "model.npz")
    assert list(model.classes_) == sorted(set(now.column("label").to_pylist()))


def test_a_table_of_fewer_pieces_than_workers_asks_yarn_for_one_container_a_shard(yarn, env_archive, tmp_path):
    """A small table written as one row group makes one shard: the submission asks for one
    worker container, not the three the job names (the others would wait, holding memory),
    its master waits for that one, and it averages as one worker does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dbn.jobs.spec import load_spec
    from dbn.jobs.yarn import prepare

    rng = np.random.default_rng(0)
    local = tmp_path / "small"
    local.mkdir()
    pq.write_table(pa.table({**{f"x{i}": rng.random(50) for i in range(4)}, "label": rng.integers(0, 2, 50)}),
                   local / "part-0.parquet")
    upload(yarn.hadoop.fs(), local, "/warehouse/small")
    output = yarn.hadoop.uri("/user/test/small-job")
    path = Path(job_file(tmp_path, output, env=env_archive, workers=3))
    path.write_text(re.sub(r'\[data\]\ntrain = "[^"]*"\n', f'[data]\ntrain = "{yarn.hadoop.uri("/warehouse/small")}"\n'
                           f'features = "x*"\nlabel = "label"\n', path.read_text()))
    said = []
    submission = prepare(load_spec(str(path)), log=said.append)
    assert list(submission.spec.services) == ["worker-0", SPARE_SERVICE]  # one container (and a spare for later)
    assert submission.spec.services[SPARE_SERVICE].instances == 0
    assert submission.job["master"]["workers"] == 1
    assert submission.job["master"]["program_config"]["block_momentum"] == 0.0
    assert ("1 shard for the 3 workers asked (the table has 1 piece, a worker's unit of work (a Parquet row group, "
            "an ORC file): write it in smaller row groups or more files to train on more workers): starting 1 worker "
            "container") in said, said


def test_a_second_submission_into_a_running_jobs_hdfs_folder_is_refused(yarn, env_archive, tmp_path, capsys):
    """Issue 36: the HDFS output folder's lock (created with the NameNode's create-if-absent)
    names the running application; a second `dbn submit` into it exits 2 at once, naming the
    folder and the application, and stages nothing; once the ResourceManager reports the first
    ended, its lock is stale and the next submission takes the folder."""
    import time

    from iterreduce.storage import ownership

    out = yarn.hadoop.uri("/user/test/locked")
    first = submit(capsys, job_file(tmp_path, out, env=env_archive, epochs=400))
    yarn.wait_step(first, 1)
    start = time.monotonic()
    code, _, err = dbn(capsys, "submit", job_file(tmp_path, out, env=env_archive, epochs=3), "--quiet")
    refused_after = time.monotonic() - start
    with capsys.disabled():
        print(f"second submission refused after {refused_after:.2f} s")
    assert code == 2 and err.startswith("dbn: error: ") and out in err
    assert f"application {first} is RUNNING" in err and refused_after < 5
    assert str(yarn.report(first).state) == "RUNNING"

    assert dbn(capsys, "kill", first)[0] == 0
    assert str(yarn.wait(first, timeout=60).state) == "KILLED"
    second = submit(capsys, job_file(tmp_path, out, env=env_archive, epochs=400))  # the same job: no --overwrite
    fs = yarn.hadoop.fs()
    with fs.open_input_stream(f"/user/test/locked/{ownership.LOCK_NAME}") as f:
        assert json.loads(f.read())["app_id"] == second
    assert dbn(capsys, "kill", second)[0] == 0
