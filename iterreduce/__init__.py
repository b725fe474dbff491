"""IterativeReduce: a generic master/worker runtime for data-parallel iterative programs.

A master (:mod:`.master`) averages what workers (:mod:`.worker`) compute on their own
data shards (:mod:`.shards`), superstep by superstep, over gRPC; a :class:`.program.Program`
says what a superstep is. The same code runs as a local mini-cluster of processes
(:mod:`.local`) or in YARN containers (:mod:`.yarn`). It knows nothing about DBNs.
"""
