"""What a run's ``result.json`` says beside its model and test error: how close training came to
this machine's FLOP limit (:func:`flop_figures`), the hardware it ran on, the time of each phase and
the share of it spent synchronising, and the code's commit."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from pathlib import Path

from iterreduce.storage import runlog

from ..model import flops
from ..model.backend import Backend, resolve_device
from ..model.estimator import DBN


#: Runs of fewer flops (about 2 minutes on 2 cores) report no ratio to the limit: measuring
#: the sgemm rate (about 5 s) would cost more than it tells.
LIMIT_MIN_FLOPS = 1e13
#: sgemm measurements after training, of which the median is the rate: on a shared VM one
#: measurement (the best of 3 products) ranged from 71 to 146 GFLOP/s within a minute.
SGEMM_MEASUREMENTS = 7


def flop_figures(out: Path, model: DBN, spec, train_seconds: float, *, measure: bool = True) -> dict:
    """How close training came to this machine's FLOP limit: ``flops`` (the products of the
    steps in the run's log), ``sgemm_gflops`` (this machine's rate on the job's device, the
    GPU's for ``device = "gpu"``, else the CPU's with all BLAS threads: the median of :data:`SGEMM_MEASUREMENTS` right after training), ``flop_limit_seconds`` (the flops at that rate) and
    ``ratio_to_limit``: the training's wall time (``train_seconds``: data preparation,
    start-up, every step, the model written) over the limit. Without ``measure``, or
    under :data:`LIMIT_MIN_FLOPS`, only the flops. A resumed run's log also counts the
    steps of the run before, so its ratio reads low."""
    sizes = [model.n_features_in_, *model.hidden_layers, model.learned("n_classes_") or 1]
    total = flops.job_flops(runlog.read_progress(out / runlog.LOG_NAME), sizes, cd_k=spec.model.cd_k,
                            persistent=spec.model.persistent, top_layer_epochs=spec.model.top_layer_epochs)
    sgemm = None
    if measure and total >= LIMIT_MIN_FLOPS:
        backend = Backend(resolve_device(spec.job.device), seed=0)  # the limit of what trained
        sgemm = statistics.median(flops.sgemm_gflops(backend) for _ in range(SGEMM_MEASUREMENTS))
    limit = total / (sgemm * 1e9) if sgemm else None
    return {"flops": total, "sgemm_gflops": sgemm, "flop_limit_seconds": limit, "train_wall_seconds": train_seconds,
            "ratio_to_limit": train_seconds / limit if limit else None}


def device_name(device: str) -> str:
    """The hardware a device setting resolves to, e.g. "cpu: x86_64, 2 cores"."""
    if resolve_device(device) == "gpu":
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        return f"gpu: {name.decode() if isinstance(name, bytes) else name}"
    return f"cpu: {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def commit() -> str | None:
    """The short hash of the checkout's HEAD (the code that trains), None outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def phase_timings(records: list[dict]) -> dict:
    """Pre-training (transform + pretrain) and fine-tuning seconds and the share of
    pre-training spent in synchronisation, from a master's step records."""
    by_phase = runlog.seconds_by_phase(records)

    def total(phases, key):
        return sum(by_phase.get(p, {}).get(key, 0.0) for p in phases)

    pre, pre_sync = total(("pretrain", "transform"), "seconds"), total(("pretrain", "transform"), "sync_seconds")
    return {"pretrain_seconds": pre, "finetune_seconds": total(("finetune",), "seconds"),
            "sync_fraction": pre_sync / pre if pre else None, "sync_seconds_pretrain": pre_sync}
