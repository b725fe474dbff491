"""``dbn mnist``: the MNIST evaluation, one command from the IDX files to a report.

Shards MNIST, trains on the local mini-cluster (or on YARN through ``dbn
submit``), evaluates once on the 10,000 test images and writes ``result.json``,
the per-epoch ``log.jsonl`` and PNG plots to the output directory. ``--sweep``
repeats it over layer sizes and worker counts and writes the paper's table.

A validation set, when asked for (``--validation N``, default 5,000 with
``--quick``), is the last N training images, never trained on: the master scores
it after every fine-tuning epoch for the plot. The full run trains on all 60,000
images by default, as the paper did.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from iterreduce.shards import filesystem, join, write_shards

from ..model.backend import resolve_device
from .spec import JobConfig, load_config
from ..data.mnist import load_mnist, scale_images
from ..model.estimator import DBN

#: Published test errors of 784-500-500-2000-10 on MNIST (see the README).
PUBLISHED = {(500, 500, 2000): {1: ("1.2 %", "Hinton & Salakhutdinov 2006"), 10: ("1.66 %", "PayPal 2014, 10 nodes")}}
SWEEP_LAYERS = ((300, 300, 1000), (500, 500, 2000), (1000, 1000, 2000))
SWEEP_WORKERS = (1, 10)
TRAIN_IMAGES = 60000
#: ``dbn mnist --quick``: a few minutes on 2 cores (with 2 workers, its default).
MNIST_QUICK = {"data.limit": 20000, "model.pretrain_epochs": 20, "model.finetune_epochs": 30}
QUICK_WORKERS = 2
#: Pre-training epochs of the full run on several workers: averaging N shards once per epoch
#: makes fewer, larger steps than one process, so the paper's 50 leave the RBMs under-trained.
DISTRIBUTED_PRETRAIN_EPOCHS = 100


def mnist_config(*, out: str, workers: int, quick: bool = False, seed: int = 0, data_dir: str | None = None,
                 layers: tuple[int, ...] | None = None, overrides: dict | None = None) -> JobConfig:
    """The paper's job (or its ``quick`` reduction) for ``workers`` workers, writing to ``out``.

    With several workers, fine-tuning uses block momentum 1 - 1/N (at most 0.9) and
    pre-training 1 - 1/N (at most 0.7) unless ``overrides`` set them: plain averaging of
    N shards slows SGD N-fold (measured on MNIST, 10 workers; see benchmarks/RESULTS.md).
    For the same reason the full run pre-trains 100 epochs a layer on several workers.
    """
    values = dict(MNIST_QUICK) if quick else {}
    if not quick and workers > 1:
        values["model.pretrain_epochs"] = DISTRIBUTED_PRETRAIN_EPOCHS
    values.update({"output.dir": out, "cluster.workers": workers, "job.seed": seed, "job.name": "mnist",
                   "cluster.block_momentum": min(0.9, 1 - 1 / workers),
                   "cluster.pretrain_block_momentum": min(0.7, 1 - 1 / workers)})
    if data_dir:
        values["data.mnist_dir"] = data_dir
    if layers:
        values["model.hidden_layers"] = list(layers)
    values.update(overrides or {})
    return load_config(None, values)


def _device_name(device: str) -> str:
    resolved = resolve_device(device)
    if resolved == "gpu":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        return f"gpu: {props['name'].decode() if isinstance(props['name'], bytes) else props['name']}"
    return f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def prepare_validation(cfg: JobConfig, n: int, where: str) -> JobConfig:
    """Hold out the last ``n`` training images as a validation shard under ``where``;
    returns the config training on the images before them only."""
    if n <= 0:
        return cfg
    if n >= TRAIN_IMAGES:
        raise ValueError(f"--validation {n}: must leave training images (MNIST has {TRAIN_IMAGES})")
    data = load_mnist(cfg.data.mnist_dir)
    uri = write_shards(data.x_train[-n:], data.y_train[-n:], join(where, "validation"), 1)[0]
    limit = min(cfg.data.limit or TRAIN_IMAGES, TRAIN_IMAGES - n)
    return replace(cfg, data=replace(cfg.data, limit=limit), cluster=replace(cfg.cluster, validation=uri))


def test_error(model: DBN, mnist_dir: str | None) -> float:
    """Error of ``model`` on the 10,000 MNIST test images."""
    data = load_mnist(mnist_dir)
    return 1.0 - model.score(scale_images(data.x_test), data.y_test)


def run(cfg: JobConfig, *, validation: int = 0, yarn_report_dir: str | None = None,
        on_record: Callable | None = None, log: Callable[[str], None] = print) -> dict:
    """Train ``cfg``, test once, write result.json and the plots; returns the result.

    On the local mini-cluster by default; with ``yarn_report_dir`` on YARN, where
    ``cfg.output.dir`` is the job's HDFS output and the report goes to ``yarn_report_dir``.
    """
    yarn = yarn_report_dir is not None
    out = Path(yarn_report_dir or cfg.output.dir).resolve()
    start = time.perf_counter()
    if yarn:
        cfg = prepare_validation(cfg, validation, cfg.output.dir)
        figures = _run_yarn(cfg, out, log)
    else:
        from .distributed import train_local

        out.mkdir(parents=True, exist_ok=True)
        cfg = prepare_validation(cfg, validation, str(out))
        (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        figures = train_local(cfg, workers=cfg.cluster.workers, on_record=on_record)
    model = DBN.load(out / "model.npz", device="cpu")
    result = {
        "test_error": test_error(model, cfg.data.mnist_dir),
        "layers": [model.n_features_in_, *model.hidden_layers, model.n_classes_],
        "workers": cfg.cluster.workers, "sync_every": cfg.cluster.sync_every,
        "block_momentum": cfg.cluster.block_momentum,
        "epochs": {"pretrain": cfg.model.pretrain_epochs, "finetune": cfg.model.finetune_epochs},
        "train_images": cfg.data.limit or TRAIN_IMAGES, "validation_images": validation,
        "wall_seconds": time.perf_counter() - start,
        "pretrain_seconds": figures.get("pretrain_seconds"), "finetune_seconds": figures.get("finetune_seconds"),
        "sync_fraction": figures.get("sync_fraction"),
        "seed": cfg.job.seed, "device": _device_name(cfg.job.device),
        "on": f"yarn ({figures['app_id']})" if yarn else "local mini-cluster",
        "commit": _commit(), "date": time.strftime("%Y-%m-%d"),
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    from .plots import plot_run

    result["plots"] = [str(p) for p in plot_run(out)]
    return result


def _run_yarn(cfg: JobConfig, local: Path, log) -> dict:
    """Submit through ``dbn submit``'s code, follow it, and fetch its outputs into ``local``."""
    from iterreduce.yarn import client as yarn

    from .distributed import timings
    from .yarn import prepare

    submission = prepare(cfg, log=log)
    client = yarn.connect(cfg.yarn.principal, cfg.yarn.keytab)
    app_id, url = yarn.submit(client, submission.spec)
    log(f"submitted {app_id} ({url or 'no tracking URL yet'})")
    st = yarn.wait(client, app_id, poll=5.0)
    if st.final_status != "SUCCEEDED":
        raise yarn.YarnError(f"{app_id} ended {st.final_status}: {st.diagnostics}; see `dbn logs {app_id}`")
    local.mkdir(parents=True, exist_ok=True)
    fs, base = filesystem(cfg.output.dir)
    for name in ("model.npz", "log.jsonl"):
        with fs.open_input_stream(join(base, name), compression=None) as src:
            (local / name).write_bytes(src.read())
    return {**timings(local / "log.jsonl"), "app_id": app_id}


def sweep(*, out: str, quick: bool, seed: int, data_dir: str | None, layers=None, workers=None,
          overrides: dict | None = None, validation: int = 0, on_record=None, log=print) -> str:
    """Run every (layers, workers) pair (default: SWEEP_LAYERS x SWEEP_WORKERS); write and
    return the Markdown table (``OUT/sweep.md``)."""
    rows = []
    for sizes in layers or SWEEP_LAYERS:
        for n in workers or SWEEP_WORKERS:
            name = f"{'-'.join(map(str, sizes))}_w{n}"
            log(f"sweep: {name}")
            cfg = mnist_config(out=str(Path(out) / name), workers=n, quick=quick, seed=seed, data_dir=data_dir,
                               layers=sizes, overrides=overrides)
            rows.append((sizes, n, run(cfg, validation=validation, on_record=on_record, log=log)))
            log(f"sweep: {name}: test error {100 * rows[-1][2]['test_error']:.2f} %")
    table = sweep_table(rows, quick=quick)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "sweep.md").write_text(table)
    return table


def sweep_table(rows, *, quick: bool) -> str:
    """The Markdown table of sweep results beside the published figures."""
    setting = ("quick ({:,} training images, {} + {} epochs)".format(*MNIST_QUICK.values()) if quick
               else f"full (60,000 images; 50 RBM epochs a layer on 1 worker, {DISTRIBUTED_PRETRAIN_EPOCHS} on "
                    f"several; 100 fine-tuning epochs)")
    lines = [f"MNIST test error, {setting}; measured {time.strftime('%Y-%m-%d')}", "",
             "| hidden layers | workers | test error | published | wall | pre-training | fine-tuning |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for sizes, n, r in rows:
        published = PUBLISHED.get(tuple(sizes), {}).get(n)
        pub = f"{published[0]} ({published[1]})" if published else "-"
        lines.append(f"| {'-'.join(map(str, sizes))} | {n} | **{100 * r['test_error']:.2f} %** | {pub} | "
                     f"{r['wall_seconds']:.0f} s | {r['pretrain_seconds']:.0f} s | {r['finetune_seconds']:.0f} s |")
    return "\n".join(lines) + "\n"
