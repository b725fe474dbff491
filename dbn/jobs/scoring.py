"""Scoring a table where it lives: ``dbn predict MODEL JOB --out URI --yarn`` (or ``--local N``).

A job of the IterativeReduce runtime, as training is, with a program of its own. The table's
pieces are cut into one share a worker (by where their blocks are stored, as training's are);
the schedule is up to :data:`CHUNKS` steps (each part file at least :data:`PART_ROWS` rows where the
shares allow), and in step k every share's k-th chunk of pieces is
scored by whichever worker holds the share, into one Parquet part file named by share and
step (``part-SSSSS-KKKKK.parquet``). Each file is written under a hidden name and renamed once
whole, so a worker killed mid-way leaves no part file, and its share, moved to another worker,
writes the same names again: every row is in the output once. The master counts the rows (and
the wrong predictions, where the table has the label) in its parameters, checkpointed like a
model's, so a new attempt of the master counts on.

All of it is written into a staging folder beside the output, ``.NAME.dbn-RUN``, made visible
at the end by one rename of that folder onto the output (:func:`commit`): readers see the whole
output or none. The output holds the part files, ``_SUCCESS``, and the job's own files in
``_dbn/`` (its log, ``scoring.json``: what was scored, the rows, the part files, which is what
lets a later ``--overwrite`` prove the folder is a scoring output before replacing it).
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs

from iterreduce.exceptions import ForeignFileError, OutputExists
from iterreduce.launch.local import run_local as run_job
from iterreduce.launch.yarn import locality
from iterreduce.master import MasterConfig, new_run_id
from iterreduce.program import Program, Step, Update, WorkerProgram
from iterreduce.storage import durable
from iterreduce.storage.filesystems import filesystem, join, open_output_file
from shardio.pieces import assign, table_pieces
from shardio.table_shard import TableShard

from ..data.sharding import RowsWriter
from ..data.table_data import check_kept, score_piece, scored_table
from ..data.validation import DataError
from ..model.estimator import DBN
from .run import load_classifier

#: The most steps a scoring job has (its progress moves a step at a time); fewer where the
#: shares have fewer pieces, or fewer rows than PART_ROWS a step.
CHUNKS = 20
#: The rows a part file holds at least, where the shares allow (``--part-rows``): closing a file
#: on HDFS costs a NameNode round trip and often half a second of waiting for the block's report,
#: so a part file a few thousand rows long would take longer to close than to score.
PART_ROWS = 250_000
#: The job's own files inside the output (readers of the table skip names starting with "_").
JOB_DIR = "_dbn"
#: What a finished output holds besides its part files and JOB_DIR: Hadoop's commit marker.
SUCCESS = "_SUCCESS"
#: The job's record in JOB_DIR: the table, the rows, the part files.
RESULT = "scoring.json"
#: The model's file name in every YARN container (shipped with the application).
SHIPPED_MODEL = "model.npz"
WRITTEN_BY = "dbn predict"


def part_name(share: int, chunk: int) -> str:
    """The part file of share ``share``'s chunk ``chunk``."""
    return f"part-{share:05d}-{chunk:05d}.parquet"


#: What a staging folder holds, all of it written by the run: part files, a killed writer's
#: unfinished one (:func:`iterreduce.storage.durable.hidden_name`'s ``.NAME.<8 hex>.tmp``), the job's
#: folder, the marker.
PART = re.compile(r"part-\d{5,}-\d{5,}\.parquet")
UNFINISHED_PART = re.compile(r"\.part-\d{5,}-\d{5,}\.parquet\.[0-9a-f]{8}\.tmp")


def chunk_of(pieces: tuple, chunk: int, chunks: int) -> tuple:
    """Chunk ``chunk`` of ``chunks`` nearly equal runs of ``pieces`` (empty where they are fewer)."""
    n = len(pieces)
    return pieces[n * chunk // chunks:n * (chunk + 1) // chunks]


def staging_uri(out: str, run_id: str, what: str = "dbn") -> str:
    """The hidden folder beside ``out`` that a run writes into (``what``: "dbn"), or into which it
    moves the output it replaces ("replaced")."""
    parent, _, name = out.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.{what}-{run_id}" if parent else f".{name}.{what}-{run_id}"


class ScoringProgram(Program):
    """The master's side: the steps, the row counts, the record and the commit.

    ``config``: ``model`` (path), ``stage`` and ``out`` (URIs), ``overwrite``, ``run_id``, ``keep``
    (columns copied as stored), ``features`` (transform instead of predict), ``label`` (the table's
    label column, or None), ``table``, ``filter``, ``chunks`` (steps)."""

    worker_class = "dbn.jobs.scoring:ScoringWorker"
    reader = "shardio.readers:ShardFiles"
    every_shard_every_step = True  # a chunk skipped would be rows missing from the output
    COUNTS = ("rows", "wrong")

    def initial_parameters(self, seed, shards):
        return {name: np.zeros(1, np.int64) for name in self.COUNTS}

    def schedule(self, shards):
        chunks = int(self.config["chunks"])
        for chunk in range(chunks):
            yield Step("score", {"chunk": chunk, "of": chunks}, self.COUNTS)

    def reduce(self, step, parameters, updates):
        return {name: parameters[name] + sum(u.arrays[name] for u in updates) for name in self.COUNTS}

    def finalize(self, parameters, output_dir):
        """``scoring.json``: what was scored, by what, the rows and the error, and the part files."""
        rows, wrong = int(parameters["rows"][0]), int(parameters["wrong"][0])
        if not rows:
            raise DataError(f"{self.config['table']}: no row to predict" + (
                f" (filter {self.config['filter']!r})" if self.config.get("filter") else ""))
        fs, stage = filesystem(self.config["stage"])
        parts = sorted(info.base_name for info in fs.get_file_info(pafs.FileSelector(stage))
                       if info.base_name.startswith("part-") and info.type == pafs.FileType.File)
        label = self.config.get("label")
        result = {"written_by": WRITTEN_BY, "run_id": self.config["run_id"], "table": self.config["table"],
                  "filter": self.config.get("filter"), "out": self.config["out"], "rows": rows,
                  "error": wrong / rows if label else None, "label": label, "parts": parts}
        text = json.dumps(result, indent=2).encode()
        durable.write_local(Path(output_dir, RESULT), lambda f: f.write(text))  # replaced, never written through

    def commit(self, output):
        commit(self.config["stage"], self.config["out"], overwrite=bool(self.config.get("overwrite")),
               run_id=self.config["run_id"])


class ScoringWorker(WorkerProgram):
    """A worker's side: a share's chunk of pieces scored into one part file."""

    def __init__(self, config, device="cpu"):
        super().__init__(config, device)
        self._model = None

    @property
    def model(self):
        if self._model is None:
            path = self.config["model"]
            self._model = (DBN.load(path, device=self.device) if self.config.get("features")
                           else load_classifier(path, device=self.device))
        return self._model

    def load_shard(self, uri, index):
        return index, TableShard.open(uri)

    def run(self, step, parameters, shard, seed):
        index, share = shard
        pieces = chunk_of(share.pieces, int(step.info["chunk"]), int(step.info["of"]))
        label, keep = self.config.get("label"), tuple(self.config.get("keep") or ())
        features = bool(self.config.get("features"))
        rows = wrong = 0
        parts = [part for piece in pieces
                 if (part := score_piece(self.model, share.source, piece, label, keep, features))]
        if parts:
            uri = join(self.config["stage"], part_name(index, int(step.info["chunk"])))
            with open_output_file(uri) as stream:  # whole or not at all; a second writer's is the same
                writer = RowsWriter(stream, "parquet")
                for part in parts:
                    writer.write(part.table)
                    rows, wrong = rows + part.rows, wrong + part.wrong
                writer.close()
        return Update(index, rows, {"rows": np.array([rows], np.int64), "wrong": np.array([wrong], np.int64)},
                      {"rows": rows})


# ------------------------------------------------------------------ the commit


def read_result(out: str) -> dict | None:
    """The ``scoring.json`` of the scoring output at ``out`` (None where there is none to read)."""
    fs, path = filesystem(out)
    try:
        with fs.open_input_stream(f"{path}/{JOB_DIR}/{RESULT}") as f:
            result = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) and result.get("written_by") == WRITTEN_BY else None


def check_replaceable(out: str) -> None:
    """Refuse to replace ``out`` unless it is a scoring output this tool wrote: its
    ``_dbn/scoring.json``, and nothing beside it but the part files that record names,
    ``_SUCCESS`` and ``_dbn`` (:class:`~iterreduce.exceptions.ForeignFileError` naming the file)."""
    fs, path = filesystem(out)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.NotFound:
        return
    if kind != pafs.FileType.Directory:
        raise OutputExists(f"{out}: a file is there, not an earlier scoring output: refusing to replace it")
    result = read_result(out)
    if result is None:
        raise ForeignFileError(f"{out}: not an output of {WRITTEN_BY} (no {JOB_DIR}/{RESULT} of its own): "
                               f"refusing to replace it")
    ours = {SUCCESS, JOB_DIR, *result.get("parts", [])}
    for info in fs.get_file_info(pafs.FileSelector(path)):
        if info.base_name not in ours:
            raise ForeignFileError(f"{out}/{info.base_name}: not written by the {WRITTEN_BY} run that wrote {out}: "
                                   f"refusing to replace the folder")


def check_output(out: str, overwrite: bool) -> None:
    """Before anything is computed: refuse an existing ``out`` unless ``overwrite``, and then one
    that is not a scoring output of this tool."""
    fs, path = filesystem(out)
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return
    if not overwrite:
        raise OutputExists(f"{out}: already exists; pass --overwrite to replace an earlier scoring output")
    check_replaceable(out)


def check_stage(stage: str) -> list:
    """The entries of the staging folder ``stage``, refused (:class:`ForeignFileError`, nothing
    moved or deleted) where one is not a name the run writes there."""
    fs, path = filesystem(stage)
    entries = fs.get_file_info(pafs.FileSelector(path))
    for info in entries:
        if not (PART.fullmatch(info.base_name) or UNFINISHED_PART.fullmatch(info.base_name)
                or info.base_name in (JOB_DIR, SUCCESS)):
            raise ForeignFileError(f"{stage}/{info.base_name}: not written by this scoring run, in its staging "
                                   f"folder: nothing moved or deleted")
    return entries


def commit(stage: str, out: str, *, overwrite: bool, run_id: str) -> None:
    """Make the staged output visible at ``out`` in one rename: ``_SUCCESS`` written into the
    stage, the stage's hidden leftovers (a killed writer's unfinished files) removed, the stage
    renamed onto ``out`` (:func:`check_stage` first: only the run's own names). An earlier output there (with ``overwrite``, proven a scoring output by
    :func:`check_replaceable`) is first renamed aside and removed after. A commit this run made
    already (a new attempt of the master after it) only removes the stage again."""
    fs, stage_path = filesystem(stage)
    _, out_path = filesystem(out)
    done = read_result(out)
    if done is not None and done.get("run_id") == run_id:
        if fs.get_file_info(stage_path).type != pafs.FileType.NotFound:
            check_stage(stage)
            fs.delete_dir(stage_path)
        return
    for info in check_stage(stage):
        if UNFINISHED_PART.fullmatch(info.base_name):
            fs.delete_file(info.path)
    with fs.open_output_stream(f"{stage_path}/{SUCCESS}"):
        pass
    if fs.get_file_info(out_path).type == pafs.FileType.NotFound:
        fs.move(stage_path, out_path)
        return
    check_output(out, overwrite)
    _, aside = filesystem(staging_uri(out, run_id, "replaced"))
    fs.move(out_path, aside)
    fs.move(stage_path, out_path)
    fs.delete_dir(aside)


# ------------------------------------------------------------------ the plan


@dataclasses.dataclass
class ScoringPlan:
    """A scoring job ready to run: its master's configuration, and where each share's bytes are."""

    master: MasterConfig
    blocks: list[locality.Blocks]
    stage: str

    @property
    def program_config(self) -> dict:
        return self.master.program_config


def plan(model, model_path: str, data, out: str, *, workers: int, table=None, filter=None, keep=(),
         features=False, overwrite=False, part_rows: int = PART_ROWS, locate=None, cluster=None,
         name="scoring") -> ScoringPlan:
    """Cut the table ``model`` scores (:func:`~dbn.data.table_data.scored_table`) into one share a
    worker, saved in a new staging folder beside ``out``, and the master's configuration for
    scoring it. ``locate``: where files' blocks are (:func:`iterreduce.launch.yarn.locality.file_blocks`),
    so each share's pieces are stored on one host where the replicas allow; ``cluster``: the job's
    ``[cluster]`` section (heartbeats); ``part_rows``: the rows a part file holds at least, where
    the shares allow (the steps are fewer: :data:`PART_ROWS`)."""
    if part_rows < 1:
        raise DataError(f"--part-rows {part_rows}: a part file holds at least one row")
    check_kept(tuple(keep), features)
    check_output(out, overwrite)
    scored = scored_table(model, data, table=table, filter=filter, features=features)
    pieces = list(table_pieces(scored.source, scored.dataset))
    if not pieces:
        raise scored.nothing()
    located = locality.piece_blocks(scored.source.uri, pieces, locate) if locate else None
    homes = [b.on for b in located] if located else None
    shares = [share for share in assign(pieces, workers, homes) if share]
    run_id = new_run_id()
    stage = staging_uri(out, run_id)
    uris = []
    for k, share in enumerate(shares):
        uri = join(stage, f"{JOB_DIR}/shares/share-{k:05d}{TableShard.suffix}")
        TableShard(scored.source, tuple(share), model.n_features_in_).save(uri)
        uris.append(uri)
    where = dict(zip(pieces, located or ()))  # each piece's Blocks
    blocks = [sum((where[p] for p in share), locality.Blocks()) for share in shares] if located else []
    most = max(sum(p.rows for p in share) for share in shares)
    chunks = max(1, min(CHUNKS, max(len(share) for share in shares), most // part_rows))
    program_config = {"model": model_path, "stage": stage, "out": out, "overwrite": overwrite, "run_id": run_id,
                      "keep": list(keep), "features": features, "label": scored.label, "table": scored.uri,
                      "filter": scored.filter, "chunks": chunks}
    extra = {} if cluster is None else {"heartbeat_timeout": cluster.heartbeat_timeout}
    master = MasterConfig(program=f"{ScoringProgram.__module__}:{ScoringProgram.__name__}",
                          program_config=program_config, shards=uris, workers=len(uris), token="",
                          output=join(stage, JOB_DIR), checkpoint_dir=join(stage, f"{JOB_DIR}/checkpoints"),
                          run_id=run_id, name=name, ui=False, **extra)
    return ScoringPlan(master, blocks, stage)


def run_local(model_path: str, data, out: str, *, workers: int, device: str = "cpu", table=None, filter=None,
              keep=(), features=False, overwrite=False, part_rows: int = PART_ROWS, on_record=None) -> dict:
    """Score on the local mini-cluster of ``workers`` processes; returns ``scoring.json``'s record."""
    from iterreduce.launch.yarn.container import upload_outputs  # skein's: not for a worker's import of this module

    model = DBN.load(model_path, device="cpu") if features else load_classifier(model_path, device="cpu")
    job = plan(model, str(Path(model_path).resolve()), data, out, workers=workers, table=table, filter=filter,
               keep=keep, features=features, overwrite=overwrite, part_rows=part_rows)
    with tempfile.TemporaryDirectory(prefix="dbn-scoring-") as local:
        config = dataclasses.replace(job.master, output=local)
        run_job(config, device=device, on_record=on_record)
        upload_outputs(Path(local), job.master.output)
    ScoringProgram(job.program_config).commit(out)
    return read_result(out)


def progress_printer(say):
    """An ``on_record`` for the local mini-cluster: a line a step, with the rows scored so far."""
    scored = [0]

    def show(record: dict) -> None:
        if "step" in record and "of" in record:
            scored[0] += int(record.get("samples", 0))
            say(f"step {record['step'] + 1} of {record['of']}: {scored[0]} rows scored")
    return show


def describe(record: dict) -> str:
    """One line for a finished scoring job's record (``scoring.json``)."""
    error = "" if record.get("error") is None else f"  (error {100 * record['error']:.2f} % against '{record['label']}')"
    return f"{record['rows']} rows of {record['table']} scored -> {record['out']} ({len(record['parts'])} part files){error}"


def submit(cfg, model_path: str, out: str, *, table=None, filter=None, keep=(), features=False, overwrite=False,
           part_rows: int = PART_ROWS, log=print):
    """Submit a scoring job to YARN: the shares cut (by where the table's blocks are) into the
    staging folder beside ``out`` (an ``hdfs://`` URI), the model shipped to every container,
    ``[cluster] workers`` containers each asked for on the node holding its share. Returns the
    application id, its tracking URL and the skein client to follow it with."""
    # skein's, through these: imported here, not by every scoring worker that imports this module
    from iterreduce.launch.yarn import client as yarn
    from iterreduce.launch.yarn.appspec import build_spec

    from .yarn import name_services, place_workers, shared_uri, ship_environment, write_job_file, yarn_options

    yarn.check_kerberos(cfg.yarn.principal, cfg.yarn.keytab)  # before any staging work
    out = shared_uri("--out", out)
    model = DBN.load(model_path, device="cpu") if features else load_classifier(model_path, device="cpu")
    opts = yarn_options(cfg)
    job = plan(model, SHIPPED_MODEL, cfg.data, out, workers=opts.workers, table=table, filter=filter, keep=keep,
               features=features, overwrite=overwrite, part_rows=part_rows, locate=locality.file_blocks,
               cluster=cfg.cluster, name=cfg.job.name)
    opts.workers = job.master.workers  # one a share (fewer where the table has fewer pieces)
    slots = place_workers(opts, job.blocks, log)
    opts.files = {SHIPPED_MODEL: str(Path(model_path).resolve())}
    opts.file_systems = list(dict.fromkeys([*opts.file_systems, *name_services([out, job.program_config["table"]])]))
    master = job.master.to_dict()
    del master["token"]  # each application master attempt makes its own
    job_file = write_job_file(f"{cfg.job.name}-scoring", {"master": master, "slots": slots})
    ship_environment(opts, log=log)
    spec = build_spec(f"dbn-score-{cfg.job.name}", str(job_file), opts, device=cfg.job.device)
    client = yarn.connect(cfg.yarn.principal, cfg.yarn.keytab)
    app_id, url = yarn.submit(client, spec)
    return app_id, url, client
