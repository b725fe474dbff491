"""Running an IterativeReduce job on Hadoop YARN through skein.

The master and the workers are the same code as on the local mini-cluster; only
how the processes start and find each other differs:

- :mod:`.spec` builds the skein application spec (the application master's script
  starts the iterreduce master; a service ``worker-K`` of one container a worker);
- :mod:`.envpack` packs the current Python environment for the containers;
- :mod:`.container` is what runs inside the containers (rendezvous through skein's
  key-value store, progress, checkpoints and outputs on HDFS, exit status);
- :mod:`.client` submits, watches, fetches logs of and kills applications;
- :mod:`.locality` finds how many of each worker's bytes every host holds and picks its node.
"""

from ...exceptions import YarnError  # noqa: F401 - re-exported

# Keys of skein's key-value store that the master and the workers share.
KV_ADDRESS = "iterreduce/master"      # host:port of the master's gRPC server
KV_TOKEN = "iterreduce/token"         # the job token workers present
KV_PROGRESS = "iterreduce/progress"   # the newest superstep record (JSON), for `status`
KV_UI = "iterreduce/ui"               # the live page's address through YARN's proxy
KV_LINKS = "iterreduce/links"         # where the job is shown beyond its page (JSON: {name: URL}), for `status`
KV_SLOT = "iterreduce/worker/worker/"        # + K: held (owned) by the container working as worker-K
KV_WORKERS = "iterreduce/workers"     # what the job wants now (JSON: {"wanted": N, "most": shards}); the keeper's
KV_WORKERS_ASKED = "iterreduce/workers-asked"  # a number of workers `dbn scale` asks for

