"""Reading training rows where they are: Parquet shards (:mod:`shardio.shards`) and tables as Spark,
Hive, Delta Lake and Iceberg write them, read in place (:mod:`shardio.tables`), each a shard URI
that :mod:`shardio.readers` opens; :class:`shardio.readers.ShardFiles` is what the runtime sees of
them. Errors name the file, row and column at fault."""
