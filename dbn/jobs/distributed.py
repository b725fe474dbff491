"""Distributed training of a job on the local mini-cluster (``dbn train --local N``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from iterreduce.local import run_local
from iterreduce.shards import list_shards

from .spec import JobConfig
from ..data.sharding import count_classes, shard_dataset

PROGRAM = "dbn.jobs.program:DBNProgram"


def prepare_shards(cfg: JobConfig, n_shards: int) -> str:
    """The job's shard directory: ``[cluster] shards``, or ``[data] train`` cut into OUT/shards.

    Shards written here are reused by a later run (e.g. ``--resume``) of the same data.
    """
    if cfg.cluster.shards:
        return cfg.cluster.shards
    out = Path(cfg.output.dir) / "shards"
    source = {"train": cfg.data.train, "limit": cfg.data.limit, "shards": n_shards, "mnist_dir": cfg.data.mnist_dir}
    marker = out / "source.json"
    if marker.exists() and json.loads(marker.read_text()) == source:
        return str(out)
    shard_dataset(cfg.data.train, str(out), n_shards, split="train", mnist_dir=cfg.data.mnist_dir, limit=cfg.data.limit)
    marker.write_text(json.dumps(source))
    return str(out)


def program_config(cfg: JobConfig, n_classes: int | None = None) -> dict:
    """The DBN program's configuration for the runtime (``n_classes=None``: the master
    counts the classes in the shards' labels when the job starts)."""
    params = {k: v for k, v in cfg.dbn_params().items() if k != "device"}
    return {**params, "n_classes": n_classes, "sync_every": cfg.cluster.sync_every,
            "block_momentum": cfg.cluster.block_momentum,
            "pretrain_block_momentum": cfg.cluster.pretrain_block_momentum, "validation": cfg.cluster.validation}


def train_local(cfg: JobConfig, *, workers: int, resume: bool = False,
                on_record: Callable[[dict], None] | None = None) -> dict:
    """Train ``cfg`` on a local mini-cluster of ``workers`` processes; returns the run's figures."""
    out = Path(cfg.output.dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    uris = list_shards(prepare_shards(cfg, workers))
    start = time.perf_counter()
    run_local(
        program=PROGRAM, program_config=program_config(cfg, count_classes(uris)), shards=uris,
        workers=workers, output=str(out), seed=cfg.job.seed, resume=resume,
        max_restarts=cfg.cluster.max_restarts, device=cfg.job.device, float16_wire=cfg.cluster.float16_wire,
        heartbeat_timeout=cfg.cluster.heartbeat_timeout, on_record=on_record,
    )
    wall = time.perf_counter() - start
    return {**timings(out / "log.jsonl"), "wall_seconds": wall, "workers": workers,
            "sync_every": cfg.cluster.sync_every, "shards": len(uris), "model": str(out / "model.npz")}


def timings(log_path) -> dict:
    """Pre-training / fine-tuning time and the synchronisation share, from the master's log.

    Counts the last run in the log (after the last ``resumed`` event, the steps it ran).
    """
    steps = {}
    for line in Path(log_path).read_text().splitlines():
        record = json.loads(line)
        if "step" in record and "phase" in record:
            steps[record["step"]] = record  # a resumed run overwrites the steps it redid
    pre = [r for r in steps.values() if r["phase"] in ("pretrain", "transform")]
    fine = [r for r in steps.values() if r["phase"] == "finetune"]
    pre_s = sum(r["seconds"] for r in pre)
    return {
        "pretrain_seconds": pre_s,
        "finetune_seconds": sum(r["seconds"] for r in fine),
        "sync_fraction": sum(r["sync_seconds"] for r in pre) / pre_s if pre_s else None,
        "sync_seconds_pretrain": sum(r["sync_seconds"] for r in pre),
    }

