"""``python -m iterreduce.worker --master HOST:PORT --name NAME``: one worker
(:func:`iterreduce.worker.worker.main`)."""

from ..process.stopping import run
from .worker import main

raise SystemExit(run(main))  # SIGINT, SIGTERM: unwind (row files removed), then end by the signal, quietly
