"""Where the runtime's files live and how it writes them: local disk and HDFS behind one file-system
call (:mod:`.filesystems`, with :mod:`.hadoopconf` and :mod:`.kerberos`), whole files put in place
atomically (:mod:`.durable`), only over what the job itself wrote (:mod:`.ownership`), read within
limits (:mod:`.npzfile`, :mod:`.rowfile`), and the job's log (:mod:`.runlog`)."""
