"""A live page for a running job, and the same page for a finished one.

The master serves it while the job runs (:class:`ViewServer`, started by
:meth:`iterreduce.master.master.Master.serve` when ``MasterConfig.ui`` is on); after the job, a
program's tool serves it from the job's ``log.jsonl`` (the DBN's: :func:`dbn.jobs.view.serve_run`). What it shows is built in
:mod:`iterreduce.webui.snapshot`; a program chooses its curves and images with
:meth:`iterreduce.program.Program.view` and :meth:`~iterreduce.program.Program.images`.
"""

from .server import ViewServer
from .snapshot import build, default_spec

__all__ = ["ViewServer", "build", "default_spec"]
