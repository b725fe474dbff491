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
import time
from pathlib import Path
from typing import Callable

from iterreduce.exceptions import ForeignFileError
from iterreduce.storage import ownership
from iterreduce.storage.filesystems import join
from shardio.shards import write_shards

from ..data.mnist import load_mnist
from ..errors import UsageError
from ..model.persist import atomic_write
from .run import MODEL_FILE, RESULT_FILE, MiniCluster, Yarn, check_folder, why_another_job, run
from .spec import PAPER, QUICK, JobSpec, load_spec

#: Published test errors of 784-500-500-2000-10 on MNIST (see the README).
PUBLISHED = {(500, 500, 2000): {1: ("1.2 %", "Hinton & Salakhutdinov 2006"), 10: ("1.66 %", "PayPal 2014, 10 nodes")}}
SWEEP_LAYERS = ((300, 300, 1000), (500, 500, 2000), (1000, 1000, 2000))
SWEEP_WORKERS = (1, 10)
TRAIN_IMAGES = 60000
QUICK_WORKERS = 2  # ``dbn mnist --quick``: the QUICK preset on 2 workers
#: Pre-training epochs of the full run on several workers: averaging N shards once per epoch
#: makes fewer, larger steps than one process, so the paper's 50 leave the RBMs under-trained.
DISTRIBUTED_PRETRAIN_EPOCHS = 100
#: Fine-tuning epochs of the full run on several workers, the learning rate decaying to the
#: paper's last value: with once-per-epoch averaging its loss was still falling at 100
#: (benchmarks/RESULTS.md, "Issue 14").
DISTRIBUTED_FINETUNE_EPOCHS = 150
#: The quick run on more workers than QUICK_WORKERS: its small shards (2,000 images on 10
#: workers: 20 averaged steps an epoch) need this many times the preset's epochs, the learning
#: rate decaying to the same last value, to match one process (measured, benchmarks/RESULTS.md).
QUICK_DISTRIBUTED_EPOCH_FACTOR = 3


def mnist_config(*, out: str, workers: int, quick: bool = False, seed: int = 0, data_dir: str | None = None,
                 layers: tuple[int, ...] | None = None, overrides: dict | None = None) -> JobSpec:
    """The paper's job (or its ``quick`` reduction) for ``workers`` workers, writing to ``out``.

    With several workers the block momentum follows the worker count, as in every job
    (:meth:`~dbn.jobs.spec.ClusterSection.block_settings`), unless ``overrides`` set it:
    plain averaging of N shards slows SGD N-fold (measured on MNIST, 10 workers; see
    benchmarks/RESULTS.md). For the same reason the full run pre-trains 100 epochs a layer
    and fine-tunes 150 on several workers, and the quick run on more than QUICK_WORKERS
    trains three times the preset's epochs.
    """
    values = dict(QUICK) if quick else {}
    if not quick and workers > 1:
        values["model.pretrain_epochs"] = DISTRIBUTED_PRETRAIN_EPOCHS
        values["model.finetune_epochs"] = DISTRIBUTED_FINETUNE_EPOCHS
        values["model.finetune_lr_decay"] = PAPER["model.finetune_lr_decay"] ** (
            PAPER["model.finetune_epochs"] / DISTRIBUTED_FINETUNE_EPOCHS)
    if quick and workers > QUICK_WORKERS:
        factor = QUICK_DISTRIBUTED_EPOCH_FACTOR
        values["model.pretrain_epochs"] = factor * QUICK["model.pretrain_epochs"]
        values["model.finetune_epochs"] = factor * QUICK["model.finetune_epochs"]
        values["model.finetune_lr_decay"] = PAPER["model.finetune_lr_decay"] ** (1 / factor)
    values.update({"output.dir": out, "cluster.workers": workers, "job.seed": seed, "job.name": "mnist"})
    if data_dir:
        values["data.mnist_dir"] = data_dir
    if layers:
        values["model.hidden_layers"] = list(layers)
    values.update(overrides or {})
    return load_spec(None, values)


def prepare_validation(spec: JobSpec, n: int, where: str) -> JobSpec:
    """Hold out the last ``n`` training images as a validation shard under ``where``;
    returns the spec training on the images before them only."""
    if n <= 0:
        return spec
    if n >= TRAIN_IMAGES:
        raise ValueError(f"--validation {n}: must leave training images (MNIST has {TRAIN_IMAGES})")
    data = load_mnist(spec.data.mnist_dir)
    uri = write_shards(data.x_train[-n:], data.y_train[-n:], join(where, "validation"), 1)[0]
    limit = min(spec.data.limit or TRAIN_IMAGES, TRAIN_IMAGES - n)
    return spec.replace(data={"limit": limit}, cluster={"validation": uri})


def evaluate(spec: JobSpec, *, validation: int = 0, yarn_report_dir: str | None = None,
             on_record: Callable | None = None, log: Callable[[str], None] = print, overwrite: bool = False,
             resume: bool = False, keep_finished: bool = False) -> dict:
    """Train ``spec``, test once on the 10,000 test images, write result.json and the plots;
    returns the result. ``overwrite``: as for :func:`dbn.jobs.run.run`.

    On the local mini-cluster by default; with ``yarn_report_dir`` on YARN, where
    ``[output] dir`` is the job's HDFS output and the report goes to ``yarn_report_dir``.
    ``resume`` (local only) continues the same job's run in the output folder from its newest
    checkpoint (from the start when it has none); ``keep_finished`` returns the result of a
    finished run of the same job found there instead of training again. The (local) output
    folder's lock is held throughout, the validation shard and the plots included.
    """
    out = Path(yarn_report_dir if yarn_report_dir is not None else spec.output.dir).resolve()
    check_folder(out)
    with ownership.hold(out):
        return _evaluate(spec, validation=validation, yarn_report_dir=yarn_report_dir, on_record=on_record, log=log,
                         overwrite=overwrite, resume=resume, keep_finished=keep_finished)


def _evaluate(spec: JobSpec, *, validation: int, yarn_report_dir: str | None, on_record: Callable | None,
              log: Callable[[str], None], overwrite: bool, resume: bool, keep_finished: bool) -> dict:
    """:func:`evaluate`, its output folder's lock held."""
    if yarn_report_dir is not None:
        if resume or keep_finished:
            raise UsageError("--resume runs on the local mini-cluster; on YARN the application master "
                             "resumes itself (yarn.max_attempts)")
        spec = prepare_validation(spec, validation, spec.output.dir)
        launcher = Yarn(yarn_report_dir, log=log, overwrite=overwrite)
    else:
        spec = prepare_validation(spec, validation, str(Path(spec.output.dir).resolve()))
        launcher = MiniCluster(resume=resume)
    spec = spec.replace(data={"test": "mnist"})
    if keep_finished:
        done = finished_result(Path(launcher.output_dir(spec)), spec)
        if done is not None:
            log(f"{spec.output.dir}: finished before (test error {100 * done['test_error']:.2f} %): kept")
            return done
    from .plots import PLOT_FILES, plot_run  # matplotlib: only once a run is to be drawn

    out = Path(launcher.output_dir(spec)).resolve()
    ownership.check_owned(out, PLOT_FILES)  # before training: the plots replace only plots of a run
    result = run(spec, launcher, on_record=on_record, overwrite=overwrite,
                 extra={"train_images": spec.data.limit or TRAIN_IMAGES, "validation_images": validation})
    ownership.claim(out, PLOT_FILES)
    try:
        result["plots"] = [str(p) for p in plot_run(out)]
    finally:
        ownership.settle(out, PLOT_FILES)
    return result


def finished_result(out: Path, spec: JobSpec) -> dict | None:
    """The result of a finished run of ``spec`` in ``out`` (result.json beside model.npz, of the
    same job by its config.json), or None."""
    try:
        result = json.loads((out / RESULT_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not (out / MODEL_FILE).is_file() or why_another_job(out, spec) is not None or result.get("test_error") is None:
        return None
    return {**result, "plots": [str(p) for p in sorted(out.glob("*.png"))]}


def command(*, out: str | None, quick: bool, sweep_instead: bool = False, local: int | None, yarn_out: str | None,
            validation: int | None, seed: int, data_dir: str | None, overrides: dict, progress_for=None,
            log: Callable[[str], None] = print, overwrite: bool = False,
            resume: bool = False) -> tuple[str, dict | str]:
    """``dbn mnist``'s defaults and choice: returns (report dir, the result), or with
    ``sweep_instead`` (``--sweep``) the sweep's Markdown table instead of a result.
    ``progress_for(spec)`` makes the run's ``on_record`` callback; ``resume``: see :func:`evaluate`
    (a sweep always keeps its finished runs and resumes an interrupted one, unless ``overwrite``)."""
    tag = "-quick" if quick else ""
    out = out or str(Path("runs") / (f"mnist-sweep{tag}" if sweep_instead else f"mnist{tag}"))
    validation = validation if validation is not None else (5000 if quick else 0)
    if local is not None and local < 1:
        raise UsageError(f"--local {local}: a mini-cluster needs at least 1 worker (--local 1: one process)")
    if sweep_instead:
        if yarn_out:
            raise UsageError("--sweep runs on the local mini-cluster; drop --yarn")
        if local is not None:
            raise UsageError(f"--sweep trains each size on {' and '.join(map(str, SWEEP_WORKERS))} workers; "
                             f"drop --local")
        if "model.hidden_layers" in overrides:
            raise UsageError(f"--sweep trains its own sizes ({', '.join('-'.join(map(str, s)) for s in SWEEP_LAYERS)}): "
                             f"model.hidden_layers (from --recipe, --layers or --set) would replace them all; "
                             f"remove it")
        return out, sweep(out=out, quick=quick, seed=seed, data_dir=data_dir, overrides=overrides,
                          validation=validation, log=log, overwrite=overwrite)
    workers = local or (QUICK_WORKERS if quick else 10)
    spec = mnist_config(out=yarn_out or out, workers=workers, quick=quick, seed=seed, data_dir=data_dir,
                        overrides=overrides)
    log(f"{'-'.join(map(str, spec.model.hidden_layers))} on {'YARN' if yarn_out else 'the local mini-cluster'}, "
        f"{spec.cluster.workers} workers, {spec.model.pretrain_epochs} + {spec.model.finetune_epochs} epochs; "
        f"report in {out}")
    return out, evaluate(spec, validation=validation, yarn_report_dir=out if yarn_out else None,
                         on_record=progress_for and progress_for(spec), log=log, overwrite=overwrite, resume=resume)


def report_line(out: str, result: dict) -> str:
    """The last line of ``dbn mnist``: the test error and where the report is."""
    return (f"test error {100 * result['test_error']:.2f} % on the 10,000 MNIST test images "
            f"({result['wall_seconds']:.0f} s); report: {Path(out).resolve()}/result.json and "
            f"{', '.join(Path(p).name for p in result['plots'])}")


#: The file ``dbn mnist --sweep`` writes in its output folder, and the first line it gives it: a
#: file there is replaced only when it starts so (:func:`check_sweep_file`).
SWEEP_FILE = "sweep.md"
SWEEP_MARKER = "<!-- written by dbn mnist --sweep: each run of it replaces this file -->"


def sweep(*, out: str, quick: bool, seed: int, data_dir: str | None, layers=None, workers=None,
          overrides: dict | None = None, validation: int = 0, on_record=None, log=print,
          overwrite: bool = False) -> str:
    """Run every (layers, workers) pair (default: SWEEP_LAYERS x SWEEP_WORKERS); write and
    return the Markdown table (``OUT/sweep.md``).

    A full sweep takes hours, so the same command goes on where it stopped: a pair whose run
    finished in its folder is kept, an interrupted one continues from its newest checkpoint
    (``overwrite`` trains every pair afresh).

    ``OUT/sweep.md`` starts with :data:`SWEEP_MARKER`; a ``sweep.md`` there without it (the
    user's own, another tool's) is refused before anything is trained, left as it is, unless
    ``overwrite``."""
    check_sweep_file(Path(out) / SWEEP_FILE, overwrite=overwrite)
    rows = []
    for sizes in layers or SWEEP_LAYERS:
        for n in workers or SWEEP_WORKERS:
            name = f"{'-'.join(map(str, sizes))}_w{n}"
            log(f"sweep: {name}")
            cfg = mnist_config(out=str(Path(out) / name), workers=n, quick=quick, seed=seed, data_dir=data_dir,
                               layers=sizes, overrides=overrides)
            rows.append((sizes, n, evaluate(cfg, validation=validation, on_record=on_record, log=log,
                                            overwrite=overwrite, resume=not overwrite, keep_finished=not overwrite)))
            log(f"sweep: {name}: test error {100 * rows[-1][2]['test_error']:.2f} %")
    table = sweep_table(rows, quick=quick)
    check_sweep_file(Path(out) / SWEEP_FILE, overwrite=overwrite)  # (one may have been put there meanwhile)
    atomic_write(Path(out) / SWEEP_FILE, lambda f: f.write(f"{SWEEP_MARKER}\n{table}".encode()))
    return table


def check_sweep_file(path: Path, *, overwrite: bool = False) -> None:
    """Refuse ``path`` (``OUT/sweep.md``) where something is there that a sweep did not write
    (its first line is not :data:`SWEEP_MARKER`), unless ``overwrite``; a folder always."""
    if path.is_dir():
        raise ForeignFileError(f"{path}: a folder is there, where --sweep writes its table; it is left as it "
                               f"is: choose another --out, or move it away")
    if overwrite or not (path.exists() or path.is_symlink()):
        return
    with open(path, "rb") as f:
        first = f.readline(len(SWEEP_MARKER) + 2).rstrip(b"\r\n")
    if first != SWEEP_MARKER.encode():
        raise ForeignFileError(f"{path}: already exists, and dbn mnist --sweep did not write it (its first line "
                               f"is not {SWEEP_MARKER!r}); it is left as it is: choose another --out, move it "
                               f"away, or pass --overwrite to replace it (which also trains every size afresh)")


def sweep_table(rows, *, quick: bool) -> str:
    """The Markdown table of sweep results beside the published figures."""
    factor = QUICK_DISTRIBUTED_EPOCH_FACTOR
    setting = ("quick ({:,} training images, {} + {} epochs; ".format(*QUICK.values()) +
               f"{factor}x on more than {QUICK_WORKERS} workers)" if quick
               else f"full (60,000 images; 50 RBM epochs a layer and 100 fine-tuning epochs on 1 worker, "
                    f"{DISTRIBUTED_PRETRAIN_EPOCHS} and {DISTRIBUTED_FINETUNE_EPOCHS} on several)")
    lines = [f"MNIST test error, {setting}; measured {time.strftime('%Y-%m-%d')}", "",
             "| hidden layers | workers | test error | published | wall | pre-training | fine-tuning |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for sizes, n, r in rows:
        published = PUBLISHED.get(tuple(sizes), {}).get(n)
        pub = f"{published[0]} ({published[1]})" if published else "-"
        resumed = f" (resumed at step {r['resumed_at_step']})" if r.get("resumed_at_step") else ""
        lines.append(f"| {'-'.join(map(str, sizes))} | {n} | **{100 * r['test_error']:.2f} %** | {pub} | "
                     f"{r['wall_seconds']:.0f} s{resumed} | {r['pretrain_seconds']:.0f} s | {r['finetune_seconds']:.0f} s |")
    return "\n".join(lines) + "\n"
