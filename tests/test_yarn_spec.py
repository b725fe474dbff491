"""The YARN side that needs no cluster: skein specs, `dbn submit --dry-run`, locality, packing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from iterreduce.launch.yarn.skein_import import skein

from dbn.cli import main
from iterreduce.launch.yarn.appspec import YarnOptions, build_spec
from iterreduce.launch.yarn.container import attempt_number
from iterreduce.launch.yarn.envpack import EnvPackError, environment_kind, pack_environment
from iterreduce.launch.yarn.locality import Blocks, parse_fsck, place, slot_blocks
from iterreduce.master import MasterConfig

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "yarn.toml"

FSCK = """\
Connecting to namenode via http://nn:50070/fsck?ugi=me&files=1&blocks=1&locations=1&path=%2Fd
FSCK started by me (auth:SIMPLE) from /10.0.0.9 for path /d at Sat Nov 21 10:00:00 UTC 2026
/d <dir>
/d/part-00000.parquet 268435456 bytes, replicated: replication=3, 2 block(s):  OK
0. BP-92-10.0.0.1-14:blk_1073741825_1001 len=134217728 Live_repl=3  [DatanodeInfoWithStorage[10.0.0.5:50010,DS-a,DISK], DatanodeInfoWithStorage[10.0.0.6:50010,DS-b,DISK], DatanodeInfoWithStorage[10.0.0.7:50010,DS-c,DISK]]
1. BP-92-10.0.0.1-14:blk_1073741826_1002 len=134217728 Live_repl=3  [DatanodeInfoWithStorage[10.0.0.5:50010,DS-a,DISK], DatanodeInfoWithStorage[10.0.0.8:50010,DS-d,DISK], DatanodeInfoWithStorage[10.0.0.7:50010,DS-c,DISK]]

/d/part-00001.parquet 100 bytes, replicated: replication=1, 1 block(s):  OK
0. BP-92-10.0.0.1-14:blk_1073741827_1003 len=100 repl=1 [10.0.0.9:50010]

Status: HEALTHY
"""


def dry_run(capsys, *args) -> skein.ApplicationSpec:
    assert main(["submit", str(EXAMPLE), "--dry-run", *args]) == 0
    return skein.ApplicationSpec.from_yaml(capsys.readouterr().out)


def test_dry_run_prints_a_spec_skein_accepts_with_workers_resources_gpus_and_env(capsys):
    spec = dry_run(capsys, "--workers", "4", "--worker-memory", "6 GiB", "--worker-vcores", "3",
                   "--worker-gpus", "1", "--env", "hdfs:///envs/dbn.tar.gz", "--queue", "ml", "--node-label", "gpu")
    # a service a worker, and a spare one on any node (the relaxer's and dbn scale's)
    assert sorted(spec.services) == ["worker-0", "worker-1", "worker-2", "worker-3", "worker-any"]
    # skein restarts every container that ends; the master counts the job's own failures against 3
    assert all(s.instances == (0 if name == "worker-any" else 1) and s.max_restarts == -1 and not s.nodes
               for name, s in spec.services.items())
    assert spec.master.env["ITERREDUCE_MAX_RESTARTS"] == "3"
    worker = spec.services["worker-3"]
    assert (worker.resources.memory, worker.resources.vcores, worker.resources.gpus) == (6144, 3, 1)
    assert worker.files["environment"].source == "hdfs:///envs/dbn.tar.gz"
    assert str(worker.files["environment"].type) == "ARCHIVE"
    assert str(worker.files["environment"].visibility) == "PRIVATE"  # cached by each node across jobs
    assert worker.env["ITERREDUCE_DEVICE"] == "gpu" and worker.env["OMP_NUM_THREADS"] == "3"
    assert (spec.queue, spec.node_label, spec.max_attempts) == ("ml", "gpu", 2)
    assert "hdfs://namenode:8020" in spec.file_systems  # delegation tokens for the output's name service
    assert '"$PWD/environment/bin/python" -m iterreduce.launch.yarn.container master job.json' in spec.master.script
    assert "iterreduce.launch.yarn.container worker job.json" in worker.script
    job_file = Path(spec.master.files["job.json"].source.replace("file://", ""))
    assert job_file.is_file() and '"dbn.jobs.dbn_program:DBNProgram"' in job_file.read_text()


def test_a_validation_shard_on_another_name_service_gets_its_delegation_token(capsys):
    spec = dry_run(capsys, "--set", "cluster.validation=hdfs://other:8020/data/valid.parquet", "--set",
                   "model.early_stopping_patience=2")
    assert {"hdfs://namenode:8020", "hdfs://other:8020"} <= set(spec.file_systems)


def test_dry_run_with_python_ships_no_environment(capsys):
    spec = dry_run(capsys, "--python", "/opt/py/bin/python")
    assert "environment" not in spec.services["worker-0"].files
    assert "exec /opt/py/bin/python -m iterreduce.launch.yarn.container" in spec.master.script


def test_dry_run_without_env_names_the_archive_it_would_pack(capsys):
    spec = dry_run(capsys)
    assert spec.master.files["environment"].source.endswith(".tar.gz")
    assert len(spec.services) == 10 + 1  # examples/yarn.toml's workers, and the spare service


@pytest.mark.parametrize("args, message", [
    (["--worker-memory", "lots"], "invalid YARN application spec: Could not interpret 'lots'"),
    (["--worker-vcores", "0"], "worker_vcores: must be >= 1"),
    (["--worker-gpus", "-1"], "worker_gpus: must be >= 0"),
    (["--workers", "0"], "a YARN job needs workers"),
    (["--out", "runs/local"], "[output] dir (or --out) must be a URI every container can reach"),
    (["--set", "yarn.queues=x"], "unknown key 'queues' (did you mean 'queue'?)"),
    (["--principal", "me@X"], "Kerberos needs both --principal and --keytab"),
    (["--set", "cluster.validation=runs/valid.parquet"], "[cluster] validation must be a URI every container"),
    (["--set", "data.train=/data/events", "--set", "data.features=x*", "--set", "data.label=y"],
     "[data] train (a table the workers read in place) must be a URI every container can reach"),
    (["--set", "model.validation_fraction=0.1"], "validation_fraction = 0.1 holds out rows in one process only"),
    (["--set", "model.early_stopping_patience=2"], "early_stopping_patience needs a validation set"),
])
def test_submit_errors_name_the_setting_at_fault(capsys, args, message):
    code = main(["submit", str(EXAMPLE), *args] + ([] if "--principal" in args else ["--dry-run"]))
    assert code == 2
    assert message in capsys.readouterr().err


def test_build_spec_needs_a_python():
    with pytest.raises(ValueError, match="no Python for the containers"):
        build_spec("x", "/tmp/job.json", YarnOptions())


def test_a_log_level_set_at_submit_reaches_every_container(monkeypatch):
    from iterreduce import LOG_LEVEL_VAR

    opts = YarnOptions(env_archive="/tmp/env.tar.gz")
    monkeypatch.delenv(LOG_LEVEL_VAR, raising=False)
    spec = build_spec("x", "/tmp/job.json", opts)
    assert LOG_LEVEL_VAR not in spec.master.env and LOG_LEVEL_VAR not in spec.services["worker-0"].env
    monkeypatch.setenv(LOG_LEVEL_VAR, "debug")
    spec = build_spec("x", "/tmp/job.json", opts)
    assert spec.master.env[LOG_LEVEL_VAR] == spec.services["worker-1"].env[LOG_LEVEL_VAR] == "DEBUG"
    monkeypatch.setenv(LOG_LEVEL_VAR, "chatty")
    with pytest.raises(ValueError, match=f"{LOG_LEVEL_VAR}='chatty': not a log level"):
        build_spec("x", "/tmp/job.json", opts)


def test_spec_yaml_round_trip():
    spec = build_spec("x", "/tmp/job.json", YarnOptions(env_archive="/tmp/env.tar.gz", workers=3,
                                                        slot_hosts=["h1", "h2", ""]))
    again = skein.ApplicationSpec.from_yaml(spec.to_yaml())
    assert again.to_dict() == spec.to_dict()
    assert again.services["worker-0"].nodes == ["h1"] and not again.services["worker-0"].relax_locality
    assert again.services["worker-1"].nodes == ["h2"]
    assert again.services["worker-2"].nodes == []  # nothing known: YARN places it anywhere
    with pytest.raises(ValueError, match="2 worker hosts for 3 workers"):
        build_spec("x", "/tmp/job.json", YarnOptions(env_archive="/tmp/env.tar.gz", workers=3, slot_hosts=["h1", "h2"]))


def test_workers_ask_for_their_nodes_strictly_while_the_master_waits_else_as_a_preference():
    from iterreduce.launch.yarn.relax import SPARE_SERVICE, WAIT_VAR, strict_services

    base = dict(env_archive="/tmp/env.tar.gz", workers=2, slot_hosts=["h1", ""], max_restarts=3)
    spec = build_spec("x", "/tmp/job.json", YarnOptions(**base, locality_wait=20))
    assert strict_services(spec) == ["worker-0"] and spec.master.env[WAIT_VAR] == "20"
    spare = spec.services[SPARE_SERVICE]
    assert spare.instances == 0 and spare.nodes == [] and spare.max_restarts == -1  # as the workers
    assert spare.resources == spec.services["worker-0"].resources
    for opts in (YarnOptions(**base, locality_wait=0), YarnOptions(**base, worker_gpus=1),
                 YarnOptions(**{**base, "slot_hosts": []})):  # no wait, GPU workers, no data places: YARN's delay
        spec = build_spec("x", "/tmp/job.json", opts)
        assert strict_services(spec) == [] and WAIT_VAR not in spec.master.env
        assert spec.services[SPARE_SERVICE].instances == 0  # for dbn scale
        assert spec.services["worker-0"].relax_locality == bool(opts.slot_hosts)
    with pytest.raises(ValueError, match="locality_wait must be >= 0 seconds, got -1"):
        build_spec("x", "/tmp/job.json", YarnOptions(**base, locality_wait=-1))


class FakeApp:
    """The skein calls the relaxer makes, on a list of containers."""

    def __init__(self, containers):
        self.containers, self.killed, self.added = containers, [], []

    def get_containers(self, services, states):
        return [c for c in self.containers if c.service_name in services and c.state.lower() in states
                and c.id not in self.killed]

    def kill_container(self, id):
        self.killed.append(id)

    def add_container(self, service):
        self.added.append(service)


def test_a_worker_waiting_longer_than_the_wait_is_withdrawn_and_a_spare_asked_for():
    from types import SimpleNamespace

    from iterreduce.launch.yarn.relax import SPARE_SERVICE, Relaxer

    def container(id, state):
        return SimpleNamespace(id=id, service_name=id.split("_")[0], state=state)

    now = [100.0]
    app = FakeApp([container("worker-0_0", "RUNNING"), container("worker-1_0", "REQUESTED"),
                   container("worker-2_0", "REQUESTED")])
    relaxer = Relaxer(app, ["worker-0", "worker-1"], wait=10, clock=lambda: now[0])
    assert relaxer.check() == []  # first seen waiting now
    now[0] = 109.9
    assert relaxer.check() == []
    app.containers.append(container("worker-1_1", "REQUESTED"))  # e.g. a restart, seen from now on
    now[0] = 110.0
    assert relaxer.check() == ["worker-1_0"]  # worker-2 is not strict: not watched
    assert app.killed == ["worker-1_0"] and app.added == [SPARE_SERVICE]
    now[0] = 119.0
    assert relaxer.check() == []
    now[0] = 120.0
    assert relaxer.check() == ["worker-1_1"] and relaxer.withdrawn == ["worker-1_0", "worker-1_1"]


def test_the_master_relaxes_only_what_its_spec_and_environment_ask(monkeypatch):
    from types import SimpleNamespace

    from iterreduce.launch.yarn.relax import WAIT_VAR, Relaxer

    spec = build_spec("x", "/tmp/job.json", YarnOptions(env_archive="/tmp/env.tar.gz", workers=2, slot_hosts=["h1", "h2"]))
    app = SimpleNamespace(get_specification=lambda: spec)
    monkeypatch.setenv(WAIT_VAR, spec.master.env[WAIT_VAR])
    relaxer = Relaxer.from_container(app)
    assert relaxer.services == ["worker-0", "worker-1"] and relaxer.wait == 15
    for value in ("", "0", "soon"):
        monkeypatch.setenv(WAIT_VAR, value)
        assert Relaxer.from_container(app) is None


def test_a_spare_container_takes_the_free_slot_with_the_most_of_its_data_on_its_node():
    from iterreduce.launch.yarn.container import slot_order

    job = {"master": {"workers": 3}, "slots": [{"host": "a", "bytes": 10, "bytes_on": {"a": 10}},
                                               {"host": "b", "bytes": 10, "bytes_on": {"b": 10, "c": 4}},
                                               {"host": "c", "bytes": 10, "bytes_on": {"c": 10}}]}
    assert slot_order(job, "c", own=None) == [2, 1, 0]
    assert slot_order(job, "z", own=None) == [0, 1, 2]


def test_a_worker_container_names_its_slot():
    from iterreduce.launch.yarn.appspec import slot_of, worker_service

    assert [slot_of(c) for c in ("worker-0_0", "worker-12_3", worker_service(7) + "_1")] == [0, 12, 7]
    assert [slot_of(c) for c in ("worker_0", "master_0", "worker-x_0", "", "worker-_1")] == [None] * 5


def test_yarn_spec_files_are_valid_skein_specs():
    for path in (Path(__file__).resolve().parents[1] / "yarn_specs").glob("*.yaml"):
        spec = skein.ApplicationSpec.from_file(str(path))
        assert "iterreduce.launch.yarn.container" in spec.master.script, path


def test_fsck_locations_are_parsed_per_file_as_bytes_on_each_host():
    blocks = parse_fsck(FSCK)
    block = 134217728
    assert blocks == {"/d/part-00000.parquet": Blocks(2 * block, {"10.0.0.5": 2 * block, "10.0.0.6": block,
                                                                 "10.0.0.7": 2 * block, "10.0.0.8": block}),
                      "/d/part-00001.parquet": Blocks(100, {"10.0.0.9": 100})}
    assert blocks["/d/part-00000.parquet"].hosts() == ["10.0.0.5", "10.0.0.7", "10.0.0.6", "10.0.0.8"]
    assert blocks["/d/part-00000.parquet"].local_fraction("10.0.0.6") == 0.5
    assert blocks["/d/part-00000.parquet"].local_fraction("elsewhere") == 0.0
    assert Blocks().local_fraction("any") == 1.0  # nothing to read: nothing read remotely


def test_slot_blocks_add_up_the_shards_of_each_worker():
    uris = [f"hdfs://nn/d/part-{i}" for i in range(4)]
    blocks = {uris[0]: Blocks(10, {"a": 10, "b": 10}), uris[1]: Blocks(5, {"c": 5}), uris[2]: Blocks(4, {"b": 4})}
    assert slot_blocks(uris, 2, blocks) == [Blocks(14, {"a": 10, "b": 14}), Blocks(5, {"c": 5})]
    assert Blocks(10, {"a": 10, "b": 4}).part(0.5) == Blocks(5, {"a": 5, "b": 2})


def test_placement_puts_each_worker_where_most_of_its_bytes_are_spreading_over_replicas():
    # Replication 2 on 3 nodes: every worker's data is on two nodes; one node a worker, all local.
    slots = [Blocks(9, {"a": 9, "b": 9}), Blocks(9, {"a": 9, "b": 9}), Blocks(9, {"a": 9, "c": 9})]
    placed = place(slots)
    assert sorted(placed) == ["a", "b", "c"] and all(slot.local_fraction(h) == 1 for slot, h in zip(slots, placed))
    # Locality first: a worker goes where most of its bytes are, even to a node that has others.
    slots = [Blocks(10, {"a": 10}), Blocks(10, {"a": 8, "b": 2}), Blocks(10, {"a": 10}), Blocks(10, {"b": 10})]
    assert place(slots) == ["a", "a", "a", "b"]
    # Ties (replicas) spread: the least loaded of the hosts holding the most, fewest choices first.
    slots = [Blocks(6, {"a": 6, "b": 6, "c": 6}), Blocks(6, {"a": 6}), Blocks(6, {"a": 6, "b": 6})]
    assert place(slots) == ["c", "a", "b"]
    # Nowhere known: any node.
    assert place([Blocks(), Blocks(3, {"a": 3})]) == ["", "a"]
    assert place([Blocks(), Blocks()]) == ["", ""]


def test_attempt_number_from_the_container_id():
    assert attempt_number("container_1526134340424_0012_01_000001") == 1
    assert attempt_number("container_e17_1410901177871_0001_02_000005") == 2
    assert attempt_number("not-a-container") == 1


def test_pack_a_virtual_environment(tmp_path):
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    assert environment_kind(str(env)) == "venv"
    archive = pack_environment(str(tmp_path / "env.tar.gz"), prefix=str(env))
    import tarfile

    with tarfile.open(archive) as tar:
        assert "bin/python" in tar.getnames()


def test_pack_refuses_what_is_no_environment_naming_the_fix(tmp_path):
    with pytest.raises(EnvPackError, match="neither a virtual environment nor a conda environment.*--env ARCHIVE"):
        pack_environment(str(tmp_path / "x.tar.gz"), prefix=str(tmp_path))


def test_pack_refuses_an_editable_install_that_the_archive_would_miss(tmp_path):
    import dbn

    if Path(sys.prefix).resolve() in Path(dbn.__file__).resolve().parents:
        pytest.skip("the project lives inside the environment here")
    if not environment_kind():
        pytest.skip("not running in a virtual environment")
    with pytest.raises(EnvPackError, match=r"module 'dbn' is imported from .*outside the environment.*not -e"):
        pack_environment(str(tmp_path / "x.tar.gz"), require=("dbn",))


def test_the_yarn_specs_folder_is_what_the_dry_run_makes():
    """yarn_specs/ holds what `dbn submit examples/yarn.toml --dry-run` sends (regenerate.py),
    not a copy that drifts: a job file the containers can read, the AM's JVM options."""
    import importlib.util

    folder = Path(__file__).resolve().parents[1] / "yarn_specs"
    loader = importlib.util.spec_from_file_location("regenerate", folder / "regenerate.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    for name, text in module.generate().items():
        assert (folder / name).read_text() == text, f"{name} is stale: run python yarn_specs/regenerate.py"
    job = json.loads((folder / "mnist-job.json").read_text())
    assert MasterConfig.from_dict({**job["master"], "token": ""}).program == "dbn.jobs.dbn_program:DBNProgram"
    spec = skein.ApplicationSpec.from_file(str(folder / "mnist.yaml"))
    assert "--add-opens=java.base/java.util" in spec.master.env["JDK_JAVA_OPTIONS"]


def test_each_submission_gets_credentials_of_its_own_kept_for_the_user_alone(tmp_path, monkeypatch):
    """skein gave every application the user's own ``~/.skein`` key unless the spec named one:
    `submit` now gives each its own, keeps them 0600 (folders 0700) under skein's folder for
    `status`, connects to the application with them, and removes them once it has ended."""
    from iterreduce.transport.security import from_skein
    from iterreduce.launch.yarn import YarnError
    from iterreduce.launch.yarn import client as yarn_client

    monkeypatch.setenv("SKEIN_CONFIG", str(tmp_path / "skein"))
    monkeypatch.setattr(yarn_client, "check_fits", lambda client, spec: None)
    user = skein.Security.new_credentials()

    class Report:
        tracking_url, diagnostics, progress, final_status, queue = "http://rm/proxy/x/", "", 0.5, "UNDEFINED", "default"

        def __init__(self, state):
            self.state = state

    class FakeClient:  # skein's driver, as far as submit and status use it
        security, submitted, connected, state = user, [], [], "RUNNING"

        def submit(self, spec):
            self.submitted.append(spec)
            return f"application_1_000{len(self.submitted)}"

        def application_report(self, app_id):
            return Report(self.state)

        def connect(self, app_id, wait=True, security=None):
            self.connected.append(security)
            raise ConnectionError("no master here")

    client = FakeClient()
    job = tmp_path / "job.json"
    job.write_text("{}")
    ids = [yarn_client.submit(client, build_spec("j", str(job), YarnOptions(python="/usr/bin/python3")))[0]
           for _ in range(2)]
    first, second = (spec.master.security for spec in client.submitted)
    assert first.cert_bytes != second.cert_bytes and user.cert_bytes not in (first.cert_bytes, second.cert_bytes)
    for app_id, own in zip(ids, (first, second)):
        folder = yarn_client.application_dir(app_id)
        assert folder == tmp_path / "skein" / "applications" / app_id
        assert folder.stat().st_mode & 0o777 == 0o700 and folder.parent.stat().st_mode & 0o777 == 0o700
        assert {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir() if p.suffix in (".crt", ".pem")} == \
            {"skein.crt": 0o600, "skein.pem": 0o600}  # (and skein's empty lock file)
        assert from_skein(yarn_client.application_security(app_id)) == from_skein(own)
    assert yarn_client.status(client, ids[0]).state == "RUNNING"  # its progress asked with its own credentials
    assert from_skein(client.connected[-1]) == from_skein(first)
    client.state = "FINISHED"
    yarn_client.status(client, ids[0])
    assert not yarn_client.application_dir(ids[0]).exists() and yarn_client.application_dir(ids[1]).exists()
    assert yarn_client.application_security(ids[0]) is None  # ended: skein's own are tried, as for others' apps
    for bad in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(YarnError, match="not an application id"):
            yarn_client.application_dir(bad)


def test_a_worker_knows_the_share_of_its_data_on_its_host_from_the_job_file():
    from iterreduce.launch.yarn.container import placement

    job = {"slots": [{"host": "a", "bytes": 10, "bytes_on": {"a": 10, "b": 4}}, {"host": "", "bytes": 0,
                                                                                  "bytes_on": {}}]}
    assert placement(job, 0, "a", "worker-0_0") == {"container": "worker-0_0", "host": "a", "asked": "a", "local": 1.0}
    assert placement(job, 0, "b", "worker-0_1")["local"] == 0.4  # restarted where 4 of its 10 bytes are
    assert placement(job, 1, "c", "worker-1_0")["local"] == 1.0  # no bytes: nothing read remotely
    assert placement({}, 0, "a", "worker-0_0")["local"] is None  # no block places known (not on HDFS)


@pytest.mark.parametrize("resources, expected", [
    ('{"host": "a", "local": 0.75}', {"local": 0.75}),
    ('{"host": "a", "local": 1}', {"local": 1.0}),
    ('{"host": "a"}', {}),
    ('{"local": true}', {}),
    ('{"local": 1.5}', {}),
    ('{"local": -0.1}', {}),
    ('{"local": "0.5"}', {}),
    ('[0.5]', {}),
    ('not json', {}),
    ("", {}),
    ('{"local": 0.5, "pad": "' + "x" * 5000 + '"}', {}),  # oversized: not read at all
])
def test_the_master_logs_a_workers_local_share_only_when_it_is_a_plain_fraction(resources, expected):
    from iterreduce.master.service import _local_share

    assert _local_share(resources) == expected


def test_status_lists_each_running_workers_node_and_local_share():
    from iterreduce.launch.yarn import KV_SLOT
    from iterreduce.launch.yarn.client import Status, _placements

    slots = {f"{KV_SLOT}1": b'{"host": "n2", "local": 0.5}', f"{KV_SLOT}0": b'{"host": "n1", "local": 1.0}',
             f"{KV_SLOT}2": b'{"host": "n3", "local": null}', f"{KV_SLOT}x": b"{}", f"{KV_SLOT}3": b"garbage"}
    workers = _placements(slots)
    assert workers == [{"name": "worker-0", "host": "n1", "local": 1.0}, {"name": "worker-1", "host": "n2", "local": 0.5},
                       {"name": "worker-2", "host": "n3", "local": None}]
    text = Status("application_1_0001", "RUNNING", "UNDEFINED", 0.5, "", "", workers=workers).describe()
    assert "workers: worker-0 on n1 (100 % of its data there), worker-1 on n2 (50 % of its data there), " \
           "worker-2 on n3" in text


def test_a_container_takes_the_free_slot_whose_data_is_on_its_node_else_its_own():
    from iterreduce.launch.yarn.container import slot_order

    job = {"master": {"workers": 3}, "slots": [{"host": "a", "bytes": 10, "bytes_on": {"a": 10, "b": 10}},
                                               {"host": "b", "bytes": 10, "bytes_on": {"b": 10, "c": 10}},
                                               {"host": "c", "bytes": 10, "bytes_on": {"c": 5, "a": 10}}]}
    assert slot_order(job, "a", own=0) == [0, 2, 1]  # its own slot's data is here: that first
    assert slot_order(job, "c", own=0) == [1, 2, 0]  # placed on slot 1's node: slot 1 first
    assert slot_order(job, "z", own=2) == [2, 0, 1]  # no data here: its own slot
    assert slot_order({"master": {"workers": 2}}, "a", own=1) == [1, 0]  # no block places known


def test_status_says_what_the_job_waits_for_and_submit_wait_kills_one_yarn_never_starts(monkeypatch):
    """ACCEPTED: its application master's container waits (a full queue); RUNNING with pending
    worker containers: how many, in which queue. `dbn submit --wait` kills an application YARN has
    not started within [yarn] start_timeout, saying so."""
    from iterreduce.exceptions import YarnError
    from iterreduce.launch.yarn import client as yarn_client
    from iterreduce.launch.yarn.client import Status

    accepted = Status("application_1_0001", "ACCEPTED", "UNDEFINED", 0.0, "Queue's AM resource limit exceeded", "",
                      queue="small")
    assert accepted.waiting() == "waiting for YARN to start its application master in queue 'small'"
    assert accepted.describe().splitlines()[1] == "  waiting for YARN to start its application master in queue 'small'"
    running = Status("application_1_0001", "RUNNING", "UNDEFINED", 0.1, "", "", queue="small",
                     containers={"wanted": 3, "most": 3, "running": 1, "pending": 2, "queue": "small", "label": ""})
    assert running.waiting() == "1 of 3 workers running; 2 containers pending in queue 'small': YARN has no room for them yet"
    assert Status("a", "RUNNING", "UNDEFINED", 0.5, "", "", containers={"pending": 0}).waiting() == ""
    killed = []
    monkeypatch.setattr(yarn_client, "status", lambda client, app_id: accepted)
    monkeypatch.setattr(yarn_client, "kill", lambda client, app_id: killed.append(app_id))
    monkeypatch.setattr(yarn_client.time, "sleep", lambda s: None)
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(yarn_client.time, "monotonic", lambda: next(clock))
    shown = []
    with pytest.raises(YarnError, match=r"application_1_0001 was not started within 20 s, waiting for YARN to start "
                                        r"its application master in queue 'small' \(YARN: Queue's AM resource limit "
                                        r"exceeded\): killed"):
        yarn_client.follow(None, "application_1_0001", shown.append, start_timeout=20)
    assert killed == ["application_1_0001"] and len(shown) == 1  # one line while nothing changes


def test_yarns_refusal_of_a_submission_is_one_line_naming_the_reason():
    from iterreduce.launch.yarn.client import java_reason

    said = ("Failed to submit application, exception:\nFailed to submit application_1_0001 to YARN : "
            "org.apache.hadoop.security.AccessControlException: Queue root.small already has 0 applications, "
            "cannot accept submission of application: application_1_0001")
    assert java_reason(said) == ("Queue root.small already has 0 applications, cannot accept submission of "
                                 "application: application_1_0001")
    assert java_reason("plain words") == "plain words" and java_reason("") == ""


def test_the_master_reports_each_steps_progress_and_the_links_once_logged_and_nothing_for_other_events():
    from types import SimpleNamespace

    from iterreduce.launch.yarn import KV_LINKS, KV_PROGRESS
    from iterreduce.launch.yarn.container import _report
    from iterreduce.storage import runlog

    progress, kv = [], {}
    app = SimpleNamespace(set_progress=progress.append, kv=kv)
    _report(app, runlog.event_record("data", shards=2, rows=10))
    assert progress == [] and kv == {}
    step = runlog.step_record(1, 4, "train", {"loss": 0.5}, shards=2, shards_total=2, seconds=1.0,
                              compute_seconds=0.5, reduce_seconds=0.1)
    _report(app, step)
    assert progress == [0.5] and json.loads(kv[KV_PROGRESS]) == step and KV_LINKS not in kv
    _report(app, runlog.event_record("links", links={"mlflow_run": "http://m/#/runs/1"}))  # after the last step too
    assert json.loads(kv[KV_LINKS]) == {"mlflow_run": "http://m/#/runs/1"} and progress == [0.5]
