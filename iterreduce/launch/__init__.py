"""Starting a job's master and workers: as processes of this machine (:mod:`.local`, the local
mini-cluster) or in YARN containers (:mod:`.yarn`)."""
