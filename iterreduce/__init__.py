"""IterativeReduce: a generic master/worker runtime for data-parallel iterative programs.

The runtime (gRPC master and workers, the local mini-cluster, fault tolerance)
is the subject of the next milestone; it will know nothing about DBNs.
"""
