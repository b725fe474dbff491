"""The DBN's live page: which curves and images it shows, and ``dbn view`` of a finished run.

The page itself is the runtime's (:mod:`iterreduce.webui`); this module says what a
DBN job draws on it: reconstruction error per layer, fine-tuning loss and errors per
epoch, and the first layer's filters.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from iterreduce.storage import runlog
from iterreduce.webui import ViewServer

from ..model import state
from ..model.estimator import DBN

#: The DBN's charts (record keys of its step records and of the in-process epoch records).
CHARTS = (
    {"title": "Reconstruction error (per pre-training epoch)", "phase": "pretrain", "x": "epoch1", "x_label": "epoch",
     "y": ["reconstruction_error"], "by": "layer", "label": "layer {layer1}"},
    {"title": "Fine-tuning loss", "phase": "finetune", "x": "epoch1", "x_label": "epoch", "y": ["loss"]},
    {"title": "Fine-tuning error (training, validation)", "phase": "finetune", "x": "epoch1", "x_label": "epoch",
     "y": ["train_error", "valid_error"]},
)
FILTERS = "filters"
FILTERS_SHOWN = 100


def view_spec(hidden_layers) -> dict:
    """The DBN's view spec (see :mod:`iterreduce.webui.snapshot`)."""
    return {"title": "DBN, hidden layers " + "-".join(map(str, hidden_layers)), "charts": [dict(c) for c in CHARTS],
            "images": {FILTERS: f"First layer's filters (the first {FILTERS_SHOWN})"},
            "position": ["layer", "epoch"]}


def filter_tiles(weights, n: int = FILTERS_SHOWN, image_shape=None) -> np.ndarray | None:
    """The first ``n`` filters of first-layer ``weights`` (n_visible, n_hidden) as one grey image:
    a grid of tiles, each scaled to its own min..max, one pixel of white between them. The
    tiles are square (n_visible a square number) unless ``image_shape`` says otherwise; None
    when the visible units cannot be shown as such images."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.ndim != 2:
        return None
    if image_shape is None:
        side = math.isqrt(weights.shape[0])
        if side * side != weights.shape[0] or side < 2:
            return None
        image_shape = (side, side)
    h, w = image_shape
    filters = weights.T[:n]  # one filter per row
    cols = math.ceil(math.sqrt(len(filters)))
    rows = math.ceil(len(filters) / cols)
    grid = np.ones((rows * (h + 1) + 1, cols * (w + 1) + 1))
    for i, f in enumerate(filters):
        span = f.max() - f.min()
        tile = (f - f.min()) / span if span > 0 else np.zeros_like(f)
        r, c = divmod(i, cols)
        grid[1 + r * (h + 1):1 + r * (h + 1) + h, 1 + c * (w + 1):1 + c * (w + 1) + w] = tile.reshape(h, w)
    return grid


def filters_of(parameters: dict) -> np.ndarray | None:
    """The filters image of a DBN's named parameters: the fine-tuned first layer once fine-tuning
    has begun, else the first RBM's (None before it exists or when it cannot be drawn)."""
    for name in (state.net_name(0, "weights"), state.rbm_name(0, "weights")):
        if name in parameters:
            return filter_tiles(parameters[name])
    return None


def serve_run(out_dir, host: str = "127.0.0.1", port: int = 0) -> ViewServer:
    """Serve the page of the run in ``out_dir`` from its ``log.jsonl`` (and the model's filters);
    returns the started server (its ``url``). Raises ``FileNotFoundError`` without a log."""
    out = Path(out_dir)
    log = runlog.log_path(out)
    if not log.is_file():
        raise FileNotFoundError(f"{out}: no {runlog.LOG_NAME} (is this a run's output directory?)")
    job = _job_of(out, runlog.read_records(log))
    model_file = out / "model.npz"
    images = None
    if model_file.is_file():
        model = DBN.load(model_file, device="cpu")
        image = filters_of(model.get_state())
        images = (lambda: {FILTERS: image}) if image is not None else None
    server = ViewServer(log, job=job, spec=view_spec(job["config"].get("hidden_layers", [])), images=images)
    server.start(host, port)
    return server


def _job_of(out: Path, records: list[dict]) -> dict:
    """What the page says of a finished run: from the master's ``job.json`` (a distributed run)
    or the log's ``start`` event (a run in one process)."""
    job_file = out / "job.json"
    if job_file.is_file():
        master = json.loads(job_file.read_text())
        return {"name": master.get("name") or out.name, "workers": master.get("workers"),
                "program": master.get("program"), "config": master.get("program_config", {})}
    start = next((r for r in records if r.get("event") == "start" and "config" in r), {})
    config = start.get("config", {})
    return {"name": config.get("job", {}).get("name") or out.name, "workers": 1, "program": "in one process",
            "config": config.get("model", {})}
