"""The master's live page: what it says of the job (:func:`job_summary`), the workers' table and the
program's images, served from the job's log (:func:`start_view`)."""

from __future__ import annotations

import time

from ..storage import runlog
from ..webui import ViewServer
from .config import MasterConfig


def start_view(master) -> ViewServer:
    """Serve ``master``'s live page (``config.ui_host``/``ui_port``, under ``master.view_secret`` when
    set); logs a ``ui`` event with its URL (without the secret: the log may be read by others; the
    server's ``url`` has it)."""
    config = master.config
    job = job_summary(config, config.name or master.out.name, len(master.shards), master.steps)
    view = ViewServer(runlog.log_path(master.out), job=job, spec=master.program.view(),
                      workers=lambda: workers_table(master), images=lambda: program_images(master),
                      secret=master.view_secret)
    view.start(config.ui_host, config.ui_port, advertise_host=config.advertise_host)
    master.event("ui", url=view.origin)
    return view


def workers_table(master) -> list[dict]:
    """The live workers table: each worker name's newest process."""
    now = time.monotonic()
    with master.lock:
        return master.members.table(finished=master.done, now=now)


def program_images(master) -> dict:
    """The program's images of the current parameters (a copy of the dict: steps replace values)."""
    return master.program.images(dict(master.parameters))


def job_summary(config: MasterConfig, name: str, shards: int, steps: list) -> dict:
    """What the live page says of job ``name``: workers asked for, program and its config, the
    schedule as runs of one phase (for the time left)."""
    runs: list[list] = []
    for step in steps:
        if runs and runs[-1][0] == step.phase:
            runs[-1][1] += 1
        else:
            runs.append([step.phase, 1])
    return {"name": name, "workers": config.workers, "program": config.program, "seed": config.seed,
            "shards": shards, "steps": len(steps), "schedule": runs, "config": config.program_config}
