"""``dbn submit``: run a DBN job on Hadoop YARN.

The job config is the same as for ``dbn train``; YARN needs two more things of
it: ``[output] dir`` must be a URI every container can reach (``hdfs://...``),
and the data must be Parquet shards there (``[cluster] shards``), or ``[data]
train`` is sharded and uploaded to ``OUTPUT/shards`` first. The application runs
the runtime's generic containers (:mod:`iterreduce.launch.yarn.container`) with the
DBN program.

An HDFS output folder is guarded as a local one is (:func:`claim_remote_output`): one job
at a time writes into it (a lock file created with HDFS's create-if-absent, naming the
application, whose state the ResourceManager tells), a folder holding a run of another job
is refused unless ``overwrite``, and only files a submission claimed are moved aside
(into ``previous/N``), never deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

from iterreduce.exceptions import ForeignFileError, YarnError
from iterreduce.launch.yarn import locality
from iterreduce.launch.yarn.appspec import YarnOptions, build_spec
from iterreduce.launch.yarn.envpack import pack_environment
from iterreduce.launch.yarn.skein_import import skein
from iterreduce.storage import ownership
from iterreduce.storage.filesystems import filesystem, join, open_output_file
from shardio.readers import list_shards, shard_info
from shardio.table_shard import TableShard

from ..data.validation import counted
from ..errors import ConfigError, UsageError
from .memory_plan import plan as plan_memory
from .spec import SHARDS_FOLDER, JobSpec
from ..user_cache import cache_dir
from .tracking import abandon_master_run, begin_master_run, master_settings

#: The cache's folder of submissions' job files (each in a folder of its own).
SUBMISSIONS = "submissions"



@dataclass
class Submission:
    """What ``dbn submit`` hands to YARN."""

    spec: object          # skein.ApplicationSpec
    job: dict             # the job file: {"master": MasterConfig fields, "slots": placement, "spec": the JobSpec}
    job_file: Path


def yarn_options(cfg: JobSpec) -> YarnOptions:
    """The YARN options of a job config ([yarn] and [cluster])."""
    y = cfg.yarn
    if cfg.cluster.workers < 1:
        raise ConfigError("a YARN job needs workers: set [cluster] workers or pass --workers N")
    return YarnOptions(
        workers=cfg.cluster.workers, worker_memory=y.worker_memory, worker_vcores=y.worker_vcores,
        worker_gpus=y.worker_gpus, master_memory=y.master_memory, queue=y.queue, node_label=y.node_label,
        max_restarts=cfg.cluster.max_restarts, max_attempts=y.max_attempts, locality_wait=y.locality_wait,
        decommission_check=y.decommission_check,
        env_archive=y.env, python=y.python,
        file_systems=list(y.file_systems), principal=y.principal, keytab=y.keytab)


def shared_uri(what: str, uri: str | None) -> str:
    """``uri`` without a trailing slash, when every container can reach it (not a local path);
    else :class:`ConfigError` naming ``what`` (the setting or option)."""
    if not uri or urlparse(uri).scheme in ("", "file"):
        raise ConfigError(f"{what} must be a URI every container can reach, such as "
                          f"hdfs://namenode:8020/user/me/runs/mnist; got {uri!r}")
    return uri.rstrip("/")


def name_services(uris: list[str]) -> list[str]:
    """The HDFS name services among ``uris`` (skein gets delegation tokens for them)."""
    found = []
    for uri in uris:
        parts = urlparse(uri)
        if parts.scheme in ("hdfs", "viewfs") and parts.netloc:
            found.append(f"{parts.scheme}://{parts.netloc}")
    return list(dict.fromkeys(found))


def prepare(cfg: JobSpec, *, dry_run: bool = False, log=print) -> Submission:
    """Build (and, unless ``dry_run``, stage) a YARN submission of ``cfg``.

    Staging shards ``[data] train`` to HDFS when no ``[cluster] shards`` is given and
    packs the current environment when no ``[yarn] env`` / ``python`` is given;
    ``dry_run`` does neither and touches no cluster.
    """
    cfg.check_distributed()  # before anything is staged
    opts = yarn_options(cfg)
    output = shared_uri("[output] dir (or --out)", cfg.output.dir)
    shards = cfg.cluster.shards and shared_uri("[cluster] shards", cfg.cluster.shards)
    validation = cfg.cluster.validation and shared_uri("[cluster] validation", cfg.cluster.validation)
    uris: list[str] = []
    blocks: dict[str, locality.Blocks] = {}
    data = cfg.training_data
    table = data.in_place  # the workers read the table itself: it must be on a file system they reach
    if table:
        shared_uri("[data] train (a table the workers read in place)", data.location)
    if not shards:  # cut into the job's own folder (a table: only its shares, naming its pieces)
        shards = join(output, SHARDS_FOLDER)
        if not dry_run:
            log(data.cut_message(opts.workers, shards))
            locate = _asked_once(locality.file_blocks)  # a table's shares are cut by where its files are
            uris = data.shards(shards, opts.workers, locate=locate)
            blocks = share_blocks(uris, locate) if table else {}
    elif not dry_run:
        uris = list_shards(shards)
    fewer = uris and cfg.why_fewer_shards(len(uris))
    if fewer:  # no container to hold idle: one worker a shard
        log(f"{fewer}: starting {counted(len(uris), 'worker container')}")
        opts.workers = len(uris)
    blocks = blocks or (locality.file_blocks(uris) if uris else {})
    slots = locality.slot_blocks(uris, opts.workers, blocks) if blocks else []
    placed = place_workers(opts, slots, log)
    opts.file_systems = list(dict.fromkeys([*opts.file_systems,
                                            *name_services([output, shards, *([validation] if validation else []),
                                                             *([data.location] if table else [])])]))

    stream = cfg.cluster.stream == "always"
    if uris:  # the shards are known: check the workers fit their containers, and stream if they must
        stream, _ = plan_memory(shard_info(uris), opts.workers, cfg.model.hidden_layers, choice=cfg.cluster.stream,
                                budget_bytes=skein.model.parse_memory(cfg.yarn.worker_memory) * 2**20,
                                budget_name="[yarn] worker_memory", exchange=cfg.reduce_on(True) == "workers")
        if stream:
            log("the workers' data will not fit their memory: they stream it from local disk")
    master = cfg.master_config(shards=shards, output=output, stream=stream, on_yarn=True,
                               n_shards=len(uris) if uris else None).to_dict()
    master["workers"] = opts.workers  # the containers started (fewer where the shards are fewer)
    master["min_workers"] = min(master["min_workers"], opts.workers)
    del master["token"]  # each application master attempt makes its own
    ship_environment(opts, dry_run=dry_run, log=log)
    tracked = master_settings(cfg)  # the application master records the run: it runs on when nobody waits
    if tracked:  # made now where it can be, so that its link is known from the job's start
        master["program_config"]["mlflow"] = tracked if dry_run else begin_master_run(tracked, log)
    job = {"master": master, "slots": placed, "spec": cfg.to_dict()}
    job_file = write_job_file(cfg.job.name, job)
    spec = build_spec(f"dbn-{cfg.job.name}", str(job_file), opts, device=cfg.job.device)
    return Submission(spec, job, job_file)


def place_workers(opts: YarnOptions, slots: list[locality.Blocks], log=print) -> list[dict]:
    """Each worker slot's node, from where its bytes are (``slots``; none known: any node), set in
    ``opts.slot_hosts`` and said in ``log`` with the share of the bytes read locally; returns the
    job file's ``"slots"``: ``[{"host", "bytes", "bytes_on"}]``."""
    opts.slot_hosts = locality.place(slots) if slots else []
    if any(opts.slot_hosts):
        local = sum(slot.on.get(host, 0) for host, slot in zip(opts.slot_hosts, slots))
        log(f"each worker asks for a node holding its data ({len(set(opts.slot_hosts) - {''})} nodes): "
            f"{100 * local / max(1, sum(s.size for s in slots)):.0f} % of the bytes they read are on their own nodes")
    return [{"host": host, "bytes": slot.size, "bytes_on": slot.on} for host, slot in zip(opts.slot_hosts, slots)]


def write_job_file(name: str, job: dict) -> Path:
    """Save a submission's job file (shipped with the application) in a folder of its own under
    the cache, readable by this user alone (0600 in a 0700 folder: it holds the job's settings as
    given, a password in a URI too); returns its path."""
    text = json.dumps(job, indent=2)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job_file = cache_dir(SUBMISSIONS) / f"{name}-{stamp}-{hashlib.sha256(text.encode()).hexdigest()[:8]}" / "job.json"
    job_file.parent.parent.mkdir(parents=True, exist_ok=True)
    job_file.parent.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(job_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return job_file


def ship_environment(opts: YarnOptions, *, dry_run: bool = False, log=print) -> None:
    """Without ``--env`` or ``--python``: pack this Python environment (once per environment, kept
    in the cache) and ship it (``dry_run``: only name the archive)."""
    if opts.python or opts.env_archive:
        return
    archive = cache_dir("environments") / f"{hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]}.tar.gz"
    if not dry_run:
        log(f"packing this Python environment ({sys.prefix}) into {archive}")
        pack_environment(str(archive), require=("iterreduce", "shardio", "dbn"))
    opts.env_archive = str(archive)


def share_blocks(uris: list[str], locate=locality.file_blocks) -> dict[str, locality.Blocks]:
    """``{share: Blocks}`` for a table's shares: where the bytes of its pieces are, a piece counted
    as its rows' part of its file (``{}`` off HDFS).
    ``locate``: :func:`~iterreduce.launch.yarn.locality.file_blocks`."""
    shares = {uri: TableShard.open(uri) for uri in uris}
    pieces = [(uri, piece) for uri, share in shares.items() for piece in share.pieces]
    if not pieces:
        return {}
    source = next(iter(shares.values())).source.uri  # every share is of the same table
    placed = locality.piece_blocks(source, [piece for _, piece in pieces], locate)
    if not any(b.on for b in placed):
        return {}
    found = {uri: locality.Blocks() for uri in shares}
    for (uri, _), blocks in zip(pieces, placed):
        found[uri] = found[uri] + blocks
    return found


def _asked_once(locate):
    """``locate`` that asks the cluster once for a given list of files (cutting a table's shares
    and then reporting where they are want the same ``hdfs fsck``)."""
    answers: dict[tuple[str, ...], dict] = {}

    def once(uris: list[str]) -> dict:
        key = tuple(uris)
        if key not in answers:
            answers[key] = locate(uris)
        return answers[key]
    return once


def submit(cfg: JobSpec, *, log=print, overwrite: bool = False):
    """Stage ``cfg`` (:func:`prepare`) and submit it to YARN; returns the submission, the
    application id, its tracking URL and the skein client, to follow the application with
    (without a running driver, each new client starts a Java driver: connect once).

    The output folder is claimed first (:func:`claim_remote_output`; ``overwrite`` replaces
    another job's run there): its lock then names the application."""
    from iterreduce.launch.yarn import client as yarn

    yarn.check_kerberos(cfg.yarn.principal, cfg.yarn.keytab)  # before any staging work
    shared_uri("[output] dir (or --out)", cfg.output.dir)
    client = yarn.connect(cfg.yarn.principal, cfg.yarn.keytab)
    lock = claim_remote_output(cfg, running=lambda held: holder_running(client, held), overwrite=overwrite, log=log)
    submission = None
    try:
        submission = prepare(cfg, log=log)
        app_id, url = yarn.submit(client, submission.spec)
    except BaseException:
        lock.release()
        if submission is not None:  # its run was made for a job that never started
            abandon_master_run(submission.job["master"]["program_config"].get("mlflow"))
        raise
    lock.name_holder(app_id=app_id)
    if cfg.yarn.priority:  # the job runs whatever comes of it: said either way
        try:
            granted = yarn.set_priority(app_id, cfg.yarn.priority)
            log(f"{app_id} has priority {granted} in queue {cfg.yarn.queue!r}" + (
                "" if granted == cfg.yarn.priority else f" (asked {cfg.yarn.priority}: the cluster's maximum)"))
        except YarnError as exc:
            log(f"priority {cfg.yarn.priority} not set ({exc}): {app_id} runs at its queue's default")
    return submission, app_id, url, client


#: The files a YARN job writes in its output folder (the master's outputs, uploaded, and its checkpoints).
REMOTE_RUN_NAMES = ("config.json", "model.npz", "result.json", "log.jsonl", "checkpoints", "job.json", "error.txt",
                    "master.json")
#: Application states in which a job may still write into its output folder.
ACTIVE_STATES = ("NEW", "NEW_SAVING", "SUBMITTED", "ACCEPTED", "RUNNING")


def holder_running(client, held: dict) -> str | None:
    """What still writes into an output folder whose lock names ``held`` (see
    :func:`iterreduce.storage.ownership.acquire_remote`), or None when it is gone: an application the
    ResourceManager reports finished, failed or killed (or no longer knows), a submission on
    this host whose process has ended. A submission on another host that named no application
    yet counts as running: its lock then has to be deleted by hand if it is gone."""
    app_id = held.get("app_id")
    if app_id:
        try:
            state = str(client.application_report(app_id).state).rsplit(".", 1)[-1]
        except Exception:  # noqa: BLE001 - an application the ResourceManager does not know has long ended
            return None
        return f"application {app_id} is {state}" if state in ACTIVE_STATES else None
    if not held:
        return "a lock file that is not readable (delete it if no job writes there)"
    if ownership.ended_here(held):
        return None
    return f"{ownership.describe_holder(held)}, which has not named its application yet (delete the lock if it is gone)"


def claim_remote_output(cfg: JobSpec, *, running, overwrite: bool = False, log=print) -> ownership.RemoteLock:
    """Take the HDFS output folder ``[output] dir`` for this submission, as a local run takes
    its folder: its lock (:func:`iterreduce.storage.ownership.acquire_remote`, asking ``running``
    whether a holder still writes); a file under :data:`REMOTE_RUN_NAMES` that no submission
    claimed is refused (:class:`~iterreduce.exceptions.ForeignFileError`, naming it); a run of
    another job (a model or checkpoints, and a ``config.json`` that differs or is missing) is
    refused unless ``overwrite``; an earlier run's files move into ``previous/N`` (nothing is
    deleted); then this job's ``config.json`` is written and its names claimed. Returns the
    lock (let go with its ``release`` when the submission fails)."""
    uri = cfg.output.dir.rstrip("/")
    cfg.check_inputs_outside(uri, (*REMOTE_RUN_NAMES, ownership.PREVIOUS))  # before anything is written
    fs, base = filesystem(uri)
    fs.create_dir(base, recursive=True)
    lock = ownership.acquire_remote(fs, base, uri, running=running)
    try:
        foreign = ownership.remote_foreign(fs, base, REMOTE_RUN_NAMES)
        if foreign is not None:
            raise ForeignFileError(f"{join(uri, foreign)}: in the way of this job's files, and not written by a job "
                                   f"of this tool (not claimed in {join(uri, ownership.RECORD_NAME)}); it is left as it "
                                   f"is: choose another output folder ([output] dir or --out), or move it away")
        why = _why_another_remote_job(fs, base, cfg)
        if why and not overwrite:
            raise UsageError(f"{uri}: holds a run of another job ({why}); pass --overwrite to replace it (the earlier "
                             f"run is kept in {join(uri, ownership.PREVIOUS)}), or choose another output folder "
                             f"([output] dir or --out)")
        aside = ownership.remote_set_aside(fs, base, REMOTE_RUN_NAMES)
        if aside:
            log(f"the earlier run in {uri} is kept in {aside}")
        ownership.remote_claim(fs, base, REMOTE_RUN_NAMES)
        with open_output_file(join(uri, "config.json")) as f:
            f.write((json.dumps(cfg.public_dict(), indent=2) + "\n").encode())
    except BaseException:
        lock.release()
        raise
    return lock


def _why_another_remote_job(fs, base: str, cfg: JobSpec) -> str | None:
    """Why the remote folder ``base`` holds a run of another job than ``cfg`` (as
    :func:`dbn.jobs.run.why_another_job` says of a local folder), or None."""

    def there(name: str) -> bool:
        return fs.get_file_info(join(base, name)).type != pafs.FileType.NotFound

    held = [name for name in ("model.npz", "result.json") if there(name)]
    if there("checkpoints") and any(e.base_name.startswith("ckpt-") for e in
                                    fs.get_file_info(pafs.FileSelector(join(base, "checkpoints")))):
        held.append("checkpoints")
    if not held:
        return None
    try:
        with fs.open_input_stream(join(base, "config.json"), compression=None) as f:
            earlier = json.loads(f.read())
    except FileNotFoundError:
        return f"{', '.join(held)} but no config.json saying of which job"
    except (OSError, ValueError) as exc:
        if not there("config.json"):
            return f"{', '.join(held)} but no config.json saying of which job"
        return f"{join(base, 'config.json')}: unreadable: {exc}"
    return cfg.differs_from(earlier)
