"""What runs inside the YARN containers: ``python -m iterreduce.launch.yarn.container {master,worker} job.json``.

Master (in the application master's container): serves on the container's host,
publishes its address and a fresh job token in skein's key-value store, reports
each superstep with ``set_progress`` (and the record under ``KV_PROGRESS`` for
``status``), checkpoints to the job's output URI (HDFS) and copies its outputs
there at the end. A new attempt of the application master resumes from the
newest checkpoint of its own submission (its run id: the application's id unless
the job file names one), never from another submission's checkpoints of the same
job in the same folder; without one of its own it starts at step 0. A job error (bad shards, bad config, no workers) ends the
application FAILED with the reason as its diagnostics; an unexpected crash
exits non-zero so YARN starts another attempt while attempts remain.

All master-worker gRPC is mutual TLS with the application's own certificate and
key (skein gives every container of an application the same self-signed pair, made
for this application alone when it was submitted: see :func:`iterreduce.launch.yarn.client.submit`,
so only this application's containers can connect); the job token is checked too.
The live page listens on the master container's loopback under a secret path, which
only skein's application master is told (:func:`register_page`).

Worker: waits for the master's address in the key-value store, claims a worker
slot there (a key it owns, so it vanishes when the container dies) and works as
``worker-K``. The slot, not skein's instance index (a restarted container gets a
new one), is what gives a worker its shards back after a restart.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path


from ...exceptions import STOPPED_ON_BAD_DATA, DataError, JobFailed
from ...master.config import MasterConfig
from ...master.master import JOB_ERRORS, Master
from ...program import reader_of
from ...storage import runlog
from ...storage.filesystems import filesystem, join, open_output_file
from ...transport.security import TlsCredentials, from_skein, new_token
from ...worker.worker import Worker
from . import KV_ADDRESS, KV_LINKS, KV_PROGRESS, KV_SLOT, KV_TOKEN, KV_UI, KV_WORKERS, locality
from .appspec import slot_of
from .drain import Drainer
from .keeper import Keeper
from .relax import SPARE_SERVICE, Relaxer
from .skein_import import skein
from .tokens import KV_TOKENS, TokenRefresher, remove_staged_keytab
from .tokens import follow as follow_tokens

log = logging.getLogger("iterreduce.yarn")

_CONTAINER_ID = re.compile(r"container_(?:e\d+_)?\d+_\d+_(\d+)_\d+")


def attempt_number(container_id: str | None = None) -> int:
    """The application attempt this container belongs to (1 for the first), from $CONTAINER_ID."""
    match = _CONTAINER_ID.match(container_id or os.environ.get("CONTAINER_ID", ""))
    return int(match.group(1)) if match else 1


def read_job(path: str) -> dict:
    """The job file that ``submit`` shipped with the application: ``{"master": the
    MasterConfig fields without the token, "slots": [{"host", "bytes", "bytes_on"}], ...}`` (a launcher may add
    keys of its own, such as the job spec it came from)."""
    try:
        job = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise JobFailed(f"{path}: unreadable job file: {exc}") from exc
    if not isinstance(job, dict) or not isinstance(job.get("master"), dict):
        raise JobFailed(f"{path}: not a job file (no 'master' section)")
    return job


def master_config(job: dict, local_out: Path, token: str, restart: bool, run_id: str = "") -> MasterConfig:
    """The master's configuration in a container: outputs written locally (and copied to the
    job's output URI at the end), checkpoints straight to the job's output URI. ``run_id``:
    this submission's identity (the job file's ``run_id`` wins); a ``restart`` (a later
    application attempt) resumes only checkpoints carrying it. A ``resume`` in the job file is
    the user's: the newest checkpoint of the job, whichever run wrote it."""
    fields = dict(job["master"])
    shards = fields["shards"]
    shards = reader_of(fields["program"]).list_shards(shards) if isinstance(shards, str) else list(shards)
    fields.update(shards=shards, output=str(local_out),
                  token=token, host="0.0.0.0", advertise_host=os.environ.get("NM_HOST") or socket.getfqdn(),
                  # The page on loopback only: skein's application master, in this container, serves it
                  # to YARN's web proxy alone (register_page), under a secret path only it knows.
                  ui_host="127.0.0.1",
                  checkpoint_dir=fields.get("checkpoint_dir") or join(fields["output"], "checkpoints"),
                  resume=bool(fields.get("resume")), resume_own=restart, run_id=fields.get("run_id") or run_id)
    return MasterConfig.from_dict(fields, source="job file")


def app_credentials(app: skein.ApplicationClient) -> TlsCredentials:
    """The application's certificate and key (its containers' ``.skein.crt`` / ``.skein.pem``),
    for mutual TLS between master and workers. Missing ones fail the job: never plaintext on YARN."""
    try:
        return from_skein(app.security)
    except (OSError, ValueError) as exc:
        raise JobFailed(f"no TLS credentials for the master-worker connection: {exc}") from exc


def upload_outputs(local_out: Path, output_uri: str) -> list[str]:
    """Copy the master's output files (model, log, ...) to ``output_uri``; returns their URIs.

    Each is written under a hidden temporary name and moved onto its own only once whole
    (:func:`~iterreduce.storage.filesystems.open_output_file`): a crash or an error part-way leaves an
    earlier attempt's file as it was, never a truncated one."""
    fs, base = filesystem(output_uri)
    fs.create_dir(base, recursive=True)
    written = []
    for path in sorted(local_out.iterdir()):
        if path.is_file() and not path.name.startswith("."):
            with open(path, "rb") as src, open_output_file(join(output_uri, path.name)) as dst:
                shutil.copyfileobj(src, dst, UPLOAD_CHUNK_BYTES)
            written.append(join(output_uri, path.name))
    return written


#: Bytes copied at a time by :func:`upload_outputs`.
UPLOAD_CHUNK_BYTES = 8 * 2**20


def run_master(job_file: str, app: skein.ApplicationClient) -> int:
    """The application master's job; returns the exit code (see the module docstring)."""
    attempt = attempt_number()
    job = read_job(job_file)
    output = job["master"]["output"]
    local_out = Path("output").resolve()
    refresher = relaxer = keeper = drainer = None
    # The credentials the container started with: skein's ResourceManager token is among them (the
    # refresher's new files hold HDFS tokens alone).
    am_tokens = os.environ.get("HADOOP_TOKEN_FILE_LOCATION")
    try:
        tls = app_credentials(app)
        # A job submitted with a keytab renews its HDFS tokens, first of all (a new attempt may
        # start after the submission's tokens expired).
        refresher = TokenRefresher.from_container(publish=lambda data: app.kv.put(KV_TOKENS, data))
        if refresher is not None:
            refresher.start()
        config = master_config(job, local_out, new_token(), restart=attempt > 1, run_id=app.id or "")
        master = Master(config)
        master.view_secret = new_token()  # told to skein's proxy alone (register_page), never logged
        master.listeners.append(lambda record: _report(app, record))
        if master.links:  # known already while the master started (a run made at submission): said now
            _report(app, runlog.event_record("links", links=master.links))

        def publish(address: str) -> None:
            app.kv[KV_TOKEN] = config.token.encode()
            app.kv[KV_ADDRESS] = address.encode()  # last: a worker that sees the address finds the token too
            log.info("attempt %d serving %d shards on %s; workers connect with mutual TLS (the application's "
                     "certificate)", attempt, len(master.shards), address)
            if master.view is not None:
                register_page(app, master.view.url)

        relaxer = Relaxer.from_container(app)  # workers waiting too long for their data's node go anywhere
        if relaxer is not None:
            relaxer.start()
        # Preempted or lost containers come back, only the job's own failures count, and as many
        # workers run as the job wants (dbn scale): iterreduce.launch.yarn.keeper.
        keeper = Keeper.from_container(app, master, grace=2 * master.heartbeat_timeout + 10).start()
        # Workers leave a node being decommissioned before YARN ends them: iterreduce.launch.yarn.drain.
        drainer = Drainer.from_container(app, master, am_tokens)
        if drainer is not None:
            drainer.start()
        master.serve_and_run(tls=tls, on_serving=publish)
        log.info("outputs written: %s", ", ".join(upload_outputs(local_out, output)))
        master.program.commit(output)
        if refresher is not None:
            remove_staged_keytab(app)
        app.shutdown("SUCCEEDED", diagnostics=f"done; outputs in {output}")
        return 0
    except DataError as exc:
        reason = f"{STOPPED_ON_BAD_DATA}: {exc}"
    except JOB_ERRORS as exc:
        waiting = keeper.waiting() if keeper is not None else ""
        reason = f"job failed: {exc}" + (f"; {waiting}" if waiting else "")
    except Exception as exc:  # noqa: BLE001 - a crash: another attempt may get further
        reason = f"master crashed: {type(exc).__name__}: {exc}"
        if attempt < _max_attempts(app):
            log.exception("%s; YARN will start attempt %d, which resumes from this submission's newest checkpoint",
                          reason, attempt + 1)
            return 1
        log.exception("the last attempt crashed")
    finally:
        if refresher is not None:
            refresher.stop()
        if relaxer is not None:
            relaxer.stop()
        if keeper is not None:
            keeper.stop()
        if drainer is not None:
            drainer.stop()
    log.error(reason)
    try:
        upload_outputs(local_out, output)  # the log says what happened up to the failure
    except Exception as exc:  # noqa: BLE001 - the failure itself matters more
        log.warning("could not copy the outputs to %s: %s", output, exc)
    if refresher is not None:
        remove_staged_keytab(app)
    app.shutdown("FAILED", diagnostics=reason[:4000])
    return 1


#: The live page's route in skein's web UI: ``<tracking URL>/pages/training/``.
UI_ROUTE = "training"


def register_page(app, url: str) -> str:
    """Put the live page behind skein's web UI (so behind YARN's proxy and the tracking URL),
    and its address in the key-value store for ``status``; returns that address ("" if it
    could not be registered: the job runs on without it).

    ``url`` is the page on this container's loopback with its secret path: skein's
    application master proxies ``<tracking URL>/pages/training/...`` to it, and serves its
    web UI only to YARN's web proxy (Hadoop's ``AmIpFilter``, set up by skein from the
    ResourceManager's configuration), so the page is read through the proxy alone, with the
    access controls of YARN. Neither the secret nor the URL is logged."""
    try:
        try:
            page = app.ui.add_page(UI_ROUTE, url, link_name="Training progress")
        except Exception:  # noqa: BLE001 - a new attempt of the application master: the route is taken
            app.ui.remove_page(UI_ROUTE)
            page = app.ui.add_page(UI_ROUTE, url, link_name="Training progress")
        app.kv[KV_UI] = page.address.encode()
        log.info("live view: %s", page.address)
        return page.address
    except Exception as exc:  # noqa: BLE001 - the page is informative; never fail the job for it
        log.warning("could not register the live view with YARN's web proxy: %s", exc)
        return ""


def _max_attempts(app) -> int:
    try:
        return int(app.get_specification().max_attempts)
    except Exception as exc:  # noqa: BLE001 - unknown: assume this is the last attempt
        log.warning("could not read the application's max_attempts (%s): taking this attempt for the last", exc)
        return 1


def _report(app, record: dict) -> None:
    """A step's progress to YARN (the RM's progress bar) and its record, and the job's links as soon
    as the master logs them, for `dbn status`; other events are the log's alone."""
    try:
        if runlog.is_progress(record):
            app.set_progress(min(1.0, (record["step"] + 1) / record["of"]))
            app.kv[KV_PROGRESS] = json.dumps(record).encode()
        elif record.get("event") == "links":
            app.kv[KV_LINKS] = json.dumps(record["links"]).encode()
    except Exception as exc:  # noqa: BLE001 - progress is informative; never fail the job for it
        log.warning("could not report progress: %s", exc)


def claim_slot(app, order: Callable[[], list[int]], where, timeout: float = 120.0) -> int | None:
    """Hold the first free worker slot of ``order()`` in the key-value store: a key owned by this
    container (YARN's end of the container removes it), whose value is ``where(slot)`` (JSON: the
    container, its host and the share of the slot's data there, which ``dbn status`` shows).
    A restarted container may start before YARN has released its predecessor's key, so this
    retries until ``timeout``. Returns the slot; None when none came free (the job wants fewer
    workers than run: this container is not needed)."""
    deadline = time.monotonic() + timeout
    while True:
        for slot in order():
            placed = where(slot)
            result = app.kv.transaction(conditions=[skein.kv.missing(f"{KV_SLOT}{slot}")], on_success=[
                skein.kv.put(f"{KV_SLOT}{slot}", value=json.dumps(placed).encode(), owner=placed["container"])])
            if result.succeeded:
                return slot
        if time.monotonic() > deadline:
            return None
        time.sleep(1.0)


def slot_order(job: dict, host: str, own: int | None, wanted: int | None = None) -> list[int]:
    """The worker slots in the order a container on ``host`` tries them: most of their data's bytes
    on this host first (YARN may place a container on another slot's node: it takes that slot,
    and the other container this one's), then its own service's slot (None: a spare container's),
    then by number. ``wanted``: the workers the job wants now (None: the job's ``workers``)."""
    workers = int(job["master"]["workers"]) if wanted is None else wanted
    return sorted(range(workers), key=lambda k: (-(placement(job, k, host, "")["local"] or 0.0), k != own, k))


def workers_wanted(app) -> int | None:
    """The workers the job wants now, as the application master's keeper publishes it (None before
    it did, or if it cannot be read)."""
    try:
        return int(json.loads(app.kv.get(KV_WORKERS) or b"null")["wanted"])
    except (ValueError, TypeError, KeyError):
        return None


def placement(job: dict, slot: int, host: str, container: str) -> dict:
    """Where worker ``slot`` runs: its container, host, the host the job asked for, and the share
    of its data's bytes stored on this host (``local``; None where the job could not know)."""
    slots = job.get("slots") or []
    asked = slots[slot] if slot < len(slots) else {}
    local = None
    if asked.get("bytes_on") is not None:
        local = round(locality.Blocks(int(asked.get("bytes", 0)), dict(asked["bytes_on"])).local_fraction(host), 4)
    return {"container": container, "host": host, "asked": asked.get("host", ""), "local": local}


def run_worker(job_file: str, app: skein.ApplicationClient) -> int:
    """A worker container's job; returns the exit code."""
    job = read_job(job_file)
    tls = app_credentials(app)
    follow_tokens(app)  # before any HDFS access: the master's tokens, where it renews them
    address = app.kv.wait(KV_ADDRESS).decode()
    token = app.kv.wait(KV_TOKEN).decode()
    host = os.environ.get("NM_HOST") or socket.getfqdn()
    container = os.environ.get("SKEIN_CONTAINER_ID", "")
    own = slot_of(container)
    spare = container.rsplit("_", 1)[0] == SPARE_SERVICE  # in the place of a worker withdrawn from its node
    if not spare and (own is None or own >= int(job["master"]["workers"])):
        raise JobFailed(f"container {container!r} is not one of the job's worker services "
                        f"(worker-0 to worker-{int(job['master']['workers']) - 1}, {SPARE_SERVICE})")
    slot = claim_slot(app, lambda: slot_order(job, host, own, workers_wanted(app)),
                      lambda k: placement(job, k, host, container))
    if slot is None:
        log.info("no worker slot came free: the job wants fewer workers than run, this container is not needed")
        return 0
    where = placement(job, slot, host, container)
    name = f"worker-{slot}"
    logging.getLogger().handlers[0].setFormatter(logging.Formatter(f"%(asctime)s {name} %(levelname)s %(message)s"))
    log.info("working as %s on %s for the master at %s%s", name, host, address,
             "" if where["local"] is None else f"; {100 * where['local']:.0f} % of its data's bytes are on this host")
    # Reducing on the workers: a Peer service on every interface, dialled by this host's name.
    peer = {"peer_host": host, "peer_bind": "0.0.0.0"} if job["master"].get("reduce") == "workers" else {}
    return Worker(address, token, name, os.environ.get("ITERREDUCE_DEVICE", "cpu"),
                  resources={**where, "container_id": os.environ.get("CONTAINER_ID")}, tls=tls, **peer).run()


def main(argv=None) -> int:
    """Entry point of the containers' scripts."""
    ap = argparse.ArgumentParser(prog="iterreduce.launch.yarn.container")
    ap.add_argument("role", choices=["master", "worker"])
    ap.add_argument("job", help="the job file shipped with the application")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.role} %(levelname)s %(message)s")
    log.info("Python %s (%s)", platform.python_version(), sys.executable)  # which of the node's Pythons runs
    app = skein.ApplicationClient.from_current()
    if args.role == "master":
        return run_master(args.job, app)
    try:
        return run_worker(args.job, app)
    except JOB_ERRORS as exc:
        log.error("%s", exc)
        return 1


if __name__ == "__main__":
    from ...process.stopping import run

    sys.exit(run(main))  # the NodeManager's SIGTERM: unwind, then end by the signal, with no traceback
