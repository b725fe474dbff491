"""``python -m iterreduce.master JOB.json``: serve one job (:func:`iterreduce.master.master.main`)."""

from ..process.stopping import run
from .master import main

raise SystemExit(run(main))  # SIGINT, SIGTERM: unwind, then end by the signal, with no traceback
