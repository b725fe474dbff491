"""A worker: it holds its shards and computes their updates, step by step (:mod:`.worker`), through
its link to the master (:mod:`.masterlink`) and, where the workers reduce among themselves, its
share of that reduce (:mod:`.collective`). ``python -m iterreduce.worker ...`` runs one."""

from .worker import EXIT_MASTER_GONE, Worker, main

__all__ = ["EXIT_MASTER_GONE", "Worker", "main"]
