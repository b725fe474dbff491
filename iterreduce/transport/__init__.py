"""How tensors travel between the master and the workers: messages of tensors (:mod:`.wire`), the
workers' reduce among themselves (:mod:`.exchange`), shared memory on one host (:mod:`.sharedmem`),
and the token and TLS that guard every call (:mod:`.security`). The messages themselves are
:mod:`iterreduce.proto`'s."""
