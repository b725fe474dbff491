"""PNG report of a training run: reconstruction error, fine-tuning curves, first-layer filters.

Reads a run directory's ``log.jsonl`` (single-process records, or a distributed
master's step records) and ``model.npz``. Needs matplotlib (``pip install .[plots]``);
figures are drawn with the Agg backend on :class:`matplotlib.figure.Figure`, so no
pyplot state is touched.

Per-epoch aggregation: a distributed job that syncs every k minibatches logs one
record per ``part`` of an epoch, each with the mean metric over that part's
``samples``. Parts are combined by a samples-weighted mean, which is the epoch
mean a single-process run reports (a key missing from some parts, such as
``valid_error``, is averaged over the parts that have it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, MaxNLocator

from iterreduce.storage import durable
from iterreduce.storage.runlog import LOG_NAME, read_progress

from ..model.estimator import DBN

METRICS = ("reconstruction_error", "loss", "train_error", "valid_error")
#: The files :func:`plot_run` writes into a run's folder.
PLOT_FILES = RECONSTRUCTION_PNG, FINETUNE_PNG, FILTERS_PNG = "reconstruction.png", "finetune.png", "filters.png"


def read_log(path) -> list[dict]:
    """Training records of ``log.jsonl``: the progress records (those with a ``"phase"``,
    including a single-process run's ``"event": "epoch"`` records), without bare events.

    Records carrying a ``step`` (distributed runs) are deduplicated: when a resumed
    run logs a step again, the later record replaces the earlier one in place.
    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the
    file and line for a line that is not a JSON object.
    """
    return read_progress(path)


def per_epoch(records, phase: str, layer=None) -> dict[int, dict]:
    """``{epoch: {metric: value}}`` for one phase (and layer), parts of an epoch merged
    by a samples-weighted mean (records without ``samples`` weigh 1)."""
    sums: dict[int, dict] = {}
    for rec in records:
        if rec.get("phase") != phase or (layer is not None and rec.get("layer") != layer) or "epoch" not in rec:
            continue
        acc = sums.setdefault(int(rec["epoch"]), {})
        weight = float(rec.get("samples") or 1)
        for key in METRICS:
            if rec.get(key) is not None:
                total, weights = acc.get(key, (0.0, 0.0))
                acc[key] = (total + weight * float(rec[key]), weights + weight)
    return {epoch: {k: t / w for k, (t, w) in acc.items()} for epoch, acc in sorted(sums.items())}


def _save(fig: Figure, path) -> Path:
    """Save ``fig`` at ``path`` (its format from the suffix) as a new file renamed in: never
    written through a link, or into a file another name shares (a folder copied with ``cp -al``)."""
    FigureCanvasAgg(fig)
    image = Path(path).suffix.lstrip(".") or "png"
    durable.write_local(path, lambda f: fig.savefig(f, format=image, dpi=100))
    return Path(path)


def plot_reconstruction(records, path, sizes=None) -> Path:
    """Reconstruction error per pre-training epoch, one line per layer, on a log scale.

    ``sizes`` (e.g. ``[784, 500, 500, 2000]``: visible size then hidden sizes) labels
    the lines "layer 1 (784→500)"; without it they read "layer 1".
    """
    layers = sorted({r["layer"] for r in records if r.get("phase") == "pretrain" and "layer" in r})
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for layer in layers:
        epochs = per_epoch(records, "pretrain", layer)
        xs = [e + 1 for e, m in epochs.items() if "reconstruction_error" in m]
        ys = [m["reconstruction_error"] for m in epochs.values() if "reconstruction_error" in m]
        label = f"layer {layer + 1}"
        if sizes is not None and layer + 1 < len(sizes):
            label += f" ({sizes[layer]}→{sizes[layer + 1]})"
        ax.plot(xs, ys, marker="." if len(xs) < 30 else None, label=label)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    low, high = ax.get_ylim()
    if high < 20 * low:  # label 2..9 x 10^k too while that doesn't crowd the axis
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.set(title="RBM pre-training", xlabel="epoch",
           ylabel="reconstruction error\n(squared error per sample, log scale)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    ax.grid(True, which="both", alpha=0.3)
    if layers:
        ax.legend()
    fig.tight_layout()
    return _save(fig, path)


def plot_finetune(records, path) -> Path:
    """Fine-tuning loss per epoch (left axis) and error rate in % (right axis): validation
    error when logged, and the training error, measured with dropout on during training."""
    epochs = per_epoch(records, "finetune")
    xs = [e + 1 for e in epochs]
    fig = Figure(figsize=(7, 4.8), layout="constrained")
    ax = fig.add_subplot()
    lines = ax.plot(xs, [m.get("loss", np.nan) for m in epochs.values()], color="tab:blue",
                    label="loss (cross-entropy)")
    ax.set(title="Fine-tuning", xlabel="epoch", ylabel="loss (cross-entropy)")
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    right = ax.twinx()
    curves = [("train_error", "training error (dropout on)", "tab:orange", "--"),
              ("valid_error", "validation error", "tab:red", "-")]
    for key, label, color, style in curves:
        if any(key in m for m in epochs.values()):
            ys = [100 * m[key] if key in m else np.nan for m in epochs.values()]
            lines += right.plot(xs, ys, color=color, linestyle=style, label=label)
    right.set_ylabel("error (%)")
    right.set_ylim(bottom=0)
    fig.legend(lines, [line.get_label() for line in lines], loc="outside lower center", ncol=len(lines))
    return _save(fig, path)


def _first_layer_weights(model_or_weights) -> np.ndarray:
    """(n_visible, n_hidden) host array of a DBN's first RBM, an RBM, or an array as given."""
    rbms = getattr(model_or_weights, "rbms_", None)
    if rbms is not None:
        if not rbms:
            raise ValueError("the model has no pre-trained RBM layers to show filters of")
        model_or_weights = rbms[0]
    if hasattr(model_or_weights, "get_state"):
        return model_or_weights.get_state()["weights"]
    return np.asarray(model_or_weights)


def plot_filters(model_or_weights, path, n: int = 100, image_shape=(28, 28)) -> Path:
    """The first layer's first ``n`` filters (receptive fields) as a grid of grey images.

    ``model_or_weights``: a DBN (its first pre-trained RBM), an RBM, or a weight array of
    shape (n_visible, n_hidden) or (n_hidden, n_visible). Each filter is scaled to its
    own min..max. Raises ``ValueError`` when n_visible is not ``prod(image_shape)``.
    """
    weights = _first_layer_weights(model_or_weights)
    size = int(np.prod(image_shape))
    if weights.ndim != 2 or size not in weights.shape:
        raise ValueError(f"first-layer weights have shape {weights.shape}: visible size is not "
                         f"{size} = {'x'.join(map(str, image_shape))}, cannot show them as images")
    all_filters = weights.T if weights.shape[0] == size else weights  # one filter per row
    filters = all_filters[:n]
    cols = int(np.ceil(np.sqrt(len(filters))))
    rows = int(np.ceil(len(filters) / cols))
    fig = Figure(figsize=(cols * 0.8, rows * 0.8 + 0.5))
    fig.suptitle(f"First-layer filters, pre-trained RBM ({len(filters)} of {len(all_filters)})")
    for i, w in enumerate(filters):
        ax = fig.add_subplot(rows, cols, i + 1)
        span = np.ptp(w)
        ax.imshow(((w - w.min()) / span if span else np.zeros_like(w)).reshape(image_shape),
                  cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        ax.set_axis_off()
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=1 - 0.5 / (rows * 0.8 + 0.5), wspace=0.05, hspace=0.05)
    return _save(fig, path)


def plot_run(out_dir) -> list[Path]:
    """Write ``reconstruction.png``, ``finetune.png`` and ``filters.png`` into a run's
    directory, from its ``log.jsonl`` and ``model.npz``; a plot whose data is absent is
    skipped. Returns the paths written."""
    out_dir = Path(out_dir)
    log, model_path = out_dir / LOG_NAME, out_dir / "model.npz"
    if not log.exists() and not model_path.exists():
        raise FileNotFoundError(f"{out_dir}: no {LOG_NAME} or model.npz to plot")
    records = read_log(log) if log.exists() else []
    model = DBN.load(model_path, device="cpu") if model_path.exists() else None
    sizes = [model.n_features_in_, *model.hidden_layers] if model is not None else None
    written = []
    if any(r["phase"] == "pretrain" and r.get("reconstruction_error") is not None for r in records):
        written.append(plot_reconstruction(records, out_dir / RECONSTRUCTION_PNG, sizes))
    if any(r["phase"] == "finetune" for r in records):
        written.append(plot_finetune(records, out_dir / FINETUNE_PNG))
    if model is not None and model.rbms_:
        written.append(plot_filters(model, out_dir / FILTERS_PNG))
    return written
