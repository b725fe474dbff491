"""IterativeReduce: a generic master/worker runtime for data-parallel iterative programs.

A master (:mod:`.master`) averages what workers (:mod:`.worker`) compute on their own
data shards (:mod:`.shards`), superstep by superstep, over gRPC, or has the workers average
among themselves, each its own rows (:mod:`.exchange`); a :class:`.program.Program` says
what a superstep is. The same code runs as a local mini-cluster of processes
(:mod:`.local`) or in YARN containers (:mod:`.yarn`). It knows nothing about DBNs.
"""

#: Environment variables that set a process's BLAS and OpenMP threads (read when the library loads).
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
