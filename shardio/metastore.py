"""Tables by name in the Hive metastore, as Spark's ``spark.table("sales.events")`` finds them.

A job names a table ``db.table`` (:func:`table_name`); the metastore (``[data] metastore``, else
``hive.metastore.uris`` of ``hive-site.xml``: :func:`metastore_uri`) says where it is, in what
format and which partitions it has (:func:`lookup`):

- an Apache Iceberg table (``table_type = ICEBERG``) is its metadata file now, a Delta Lake table
  (``spark.sql.sources.provider = delta``) its folder: both read as when named by location;
- a Parquet or ORC table without partition columns is the files of its folder;
- a partitioned one is exactly its registered partitions, each at its registered location
  (inside the table's folder or not), its partition columns' values those the metastore
  holds: a folder nobody registered is not in the table (:class:`RegisteredTable`, the reader
  :func:`shardio.tables.open_dataset` takes for such a table).

The client is the metastore's Thrift API (the bindings pyiceberg ships, ``hive_metastore``, and
``thrift``), with a timeout and with bounds on what a reply may make this process allocate.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from iterreduce.exceptions import ShardError, TableError
from iterreduce.storage import hadoopconf
from iterreduce.storage.filesystems import filesystem

from .folder_tables import SIDE_FILE_PREFIXES, FolderTable, with_merged_schema

#: Hive's setting of the metastores' addresses (a comma-separated list; the first is asked).
URIS_SETTING = "hive.metastore.uris"
#: Hive's setting of a Kerberos-secured (SASL) metastore.
SASL_SETTING = "hive.metastore.sasl.enabled"
#: A table's name: ``database.table``, each a Hive identifier.
NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")
#: Suffixes that make ``a.b`` a file's name, never a table's.
FILE_SUFFIXES = frozenset({"parquet", "orc", "csv", "npz", "json", "avro", "txt", "gz"})
#: Seconds a metastore call may take before the job is told it is unreachable.
TIMEOUT_S = 60
#: Bounds on one reply: a string (a location, a schema) and a list (columns, partitions).
MAX_STRING_BYTES = 16 * 2**20
MAX_LIST_ITEMS = 10_000_000
#: Partitions asked for in one call (a table may have hundreds of thousands).
PARTITION_BATCH = 1000
#: Hive's name of a null partition value.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: The Arrow type of a partition column of each Hive type (others are read as strings).
HIVE_TYPES = {"tinyint": pa.int8(), "smallint": pa.int16(), "int": pa.int32(), "integer": pa.int32(),
              "bigint": pa.int64(), "float": pa.float32(), "double": pa.float64(), "boolean": pa.bool_(),
              "string": pa.string(), "date": pa.date32()}


def table_name(value: str, base: Path | None = None) -> tuple[str, str] | None:
    """``(database, table)`` where ``value`` (``[data] train`` or ``test``) names a table in the
    metastore (``db.table``, no file or folder of that name here or in ``base``, the job file's
    folder), else None: it is a URI or a file."""
    found = NAME.fullmatch(value)
    if (found is None or found.group(2).lower() in FILE_SUFFIXES or os.path.exists(value)
            or (base is not None and (base / value).exists())):
        return None
    return found.group(1), found.group(2)


def metastore_uri(setting: str | None, name: str) -> str:
    """The metastore to ask for table ``name``: ``setting`` (``[data] metastore``), else the first
    of ``hive.metastore.uris`` in ``hive-site.xml`` (:func:`~iterreduce.storage.hadoopconf.hive_settings`)."""
    uri = setting or (hadoopconf.hive_settings().get(URIS_SETTING) or "").split(",")[0].strip()
    if not uri:
        raise TableError(f"{name}: names a table in a Hive metastore (db.table), and no metastore is set: set "
                         f"[data] metastore = \"thrift://HOST:9083\", or {URIS_SETTING} in the hive-site.xml of "
                         f"HIVE_CONF_DIR or HADOOP_CONF_DIR (a path or URI names files instead)")
    parsed = urlparse(uri)
    if parsed.scheme != "thrift" or not parsed.hostname:
        raise TableError(f"metastore {uri!r}: expected thrift://HOST:PORT")
    if hadoopconf.hive_settings().get(SASL_SETTING, "").lower() == "true":
        raise TableError(f"metastore {uri}: hive-site.xml sets {SASL_SETTING} (a Kerberos-secured metastore), and "
                         f"tables by name speak plain Thrift only: name the table by its location instead")
    return uri


@dataclass(frozen=True)
class Partition:
    """One registered partition: its columns' ``values`` as the metastore holds them (None: null)
    and its ``location``."""

    values: tuple
    location: str


@dataclass(frozen=True)
class MetastoreTable:
    """What the metastore says of a table: its ``format`` (one of :data:`shardio.tables.FORMATS`),
    its ``location`` (an Iceberg table's metadata file), its ``partition_columns`` ((name, Arrow
    type), ...) and, for a partitioned Parquet or ORC table, its ``partitions``."""

    name: str
    metastore: str
    format: str
    location: str
    partition_columns: tuple = ()
    partitions: tuple = ()

    @property
    def reference(self) -> str:
        """The table as one string, ``METASTORE/db.table`` (:func:`split_reference` reads it back)."""
        return f"{self.metastore.rstrip('/')}/{self.name}"


def split_reference(reference: str) -> tuple[str, str]:
    """``(metastore URI, db.table)`` of a :attr:`MetastoreTable.reference`."""
    metastore, _, name = reference.rpartition("/")
    if not metastore.startswith("thrift://") or NAME.fullmatch(name) is None:
        raise TableError(f"metastore table {reference!r}: expected thrift://HOST:PORT/db.table")
    return metastore, name


class MetastoreClient:
    """One connection to the metastore at ``uri``'s Thrift API: ``with MetastoreClient(uri) as client``
    gives the connected ``ThriftHiveMetastore.Client``, closed on exit."""

    def __init__(self, uri: str):
        try:
            from hive_metastore.ThriftHiveMetastore import Client
            from thrift.protocol import TBinaryProtocol
            from thrift.transport import TSocket, TTransport
        except ImportError as exc:
            raise TableError(f"metastore {uri}: reading tables by name needs the `hive` extra "
                             f"(pip install 'dbn-yarn[hive]': pyiceberg's metastore bindings and thrift): {exc}") from None
        parsed = urlparse(uri)
        self.uri = uri
        socket = TSocket.TSocket(parsed.hostname, parsed.port or 9083)
        socket.setTimeout(TIMEOUT_S * 1000)
        self.transport = TTransport.TBufferedTransport(socket)
        protocol = TBinaryProtocol.TBinaryProtocol(self.transport, string_length_limit=MAX_STRING_BYTES,
                                                   container_length_limit=MAX_LIST_ITEMS)
        self.client = Client(protocol)

    def __enter__(self):
        try:
            self.transport.open()
        except Exception as exc:
            raise TableError(f"metastore {self.uri}: cannot connect ({' '.join(str(exc).split())[:300]})") from None
        return self.client

    def __exit__(self, *exc) -> None:
        self.transport.close()


def lookup(uri: str, name: str, partitions: bool = True) -> MetastoreTable:
    """Table ``name`` (``db.table``) as the metastore at ``uri`` describes it now; without
    ``partitions``, its location, format and partition columns alone (a table may have hundreds
    of thousands of partitions: they are listed where they are read, :class:`RegisteredTable`)."""
    from hive_metastore.ttypes import GetTableRequest, NoSuchObjectException

    database, table = name.split(".")
    try:
        with MetastoreClient(uri) as client:
            found = client.get_table_req(GetTableRequest(dbName=database, tblName=table)).table
            names = client.get_partition_names(database, table, -1) if found.partitionKeys and partitions else []
            partitions = []
            for start in range(0, len(names), PARTITION_BATCH):
                partitions += client.get_partitions_by_names(database, table, names[start:start + PARTITION_BATCH])
    except NoSuchObjectException:
        raise TableError(f"{name}: no such table in the metastore {uri}") from None
    except TableError:
        raise
    except Exception as exc:  # thrift's transport and protocol errors, the metastore's own
        raise TableError(f"{name}: the metastore {uri} could not describe it "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:300]})") from None
    return described(uri, name, found, partitions)


def described(uri: str, name: str, table, partitions) -> MetastoreTable:
    """The :class:`MetastoreTable` of a Thrift ``Table`` and its ``Partition`` list (from the
    metastore at ``uri``, asked for ``name``); a table that is not read here is a :class:`TableError`."""
    params = table.parameters or {}
    sd = table.sd
    if table.tableType == "VIRTUAL_VIEW":
        raise TableError(f"{name}: a view in the metastore {uri}: name the tables it reads, or write it as a table")
    if params.get("transactional", "").lower() == "true":  # its delta folders are not plain files of rows
        raise TableError(f"{name}: a Hive ACID (transactional) table in the metastore {uri}, which is not read here: "
                         f"write it as a plain (external) table, or as Iceberg or Delta Lake")
    if params.get("table_type", "").upper() == "ICEBERG":
        if not params.get("metadata_location"):
            raise TableError(f"{name}: an Apache Iceberg table in the metastore {uri} without a metadata_location")
        return MetastoreTable(name, uri, "iceberg", params["metadata_location"])
    location = (sd.serdeInfo.parameters or {}).get("path") if sd and sd.serdeInfo else None
    location = location or (sd.location if sd else None)
    if not location:
        raise TableError(f"{name}: the metastore {uri} gives it no location (a view, or a table of another system)")
    provider = params.get("spark.sql.sources.provider", "").lower()
    if provider == "delta":
        return MetastoreTable(name, uri, "delta", location)
    serde = (sd.serdeInfo.serializationLib if sd.serdeInfo else None) or ""  # a reply's optional fields may be unset
    stored = " ".join(filter(None, [provider, sd.inputFormat or "", serde])).lower()
    fmt = "parquet" if "parquet" in stored else "orc" if "orc" in stored else None
    if fmt is None:
        raise TableError(f"{name}: stored as {sd.inputFormat or provider or 'unknown'} (metastore {uri}): only "
                         f"Parquet, ORC, Delta Lake and Apache Iceberg tables are read")
    columns = tuple((key.name, HIVE_TYPES.get((key.type or "string").split("(")[0].lower(), pa.string()))
                    for key in table.partitionKeys or ())
    if not all(isinstance(column, str) and column for column, _ in columns):
        raise TableError(f"{name}: the metastore {uri} gives it a partition column without a name")
    return MetastoreTable(name, uri, fmt, location, columns, _registered(uri, name, partitions, len(columns)))


def _registered(uri: str, name: str, partitions, n_columns: int) -> tuple:
    """The table's partitions as the reply lists them, each checked (its values, one a partition
    column, and its location) and each read once: a partition (by its values) listed twice is
    one partition, as Spark reads it."""
    found, seen = [], set()
    for k, partition in enumerate(partitions):
        values = tuple(partition.values or ())
        where = partition.sd.location if partition.sd else None
        if len(values) != n_columns or not all(isinstance(v, str) for v in values) or not where:
            what = "a location" if not where else f"its {n_columns} values (it gives {values!r})"
            raise TableError(f"{name}: the metastore {uri} lists its partition {k} without {what}")
        values = tuple(None if v == NULL_PARTITION else v for v in values)
        if values not in seen:
            seen.add(values)
            found.append(Partition(values, where))
    return tuple(found)


class RegisteredTable:
    """The reader of a Parquet or ORC table that the metastore names (``dataset``,
    ``version_number``, ``deleted_rows``, as :class:`~shardio.folder_tables.FolderTable`): its
    registered partitions' files, or its folder's where it has no partition columns."""

    def __init__(self, reference: str, file_format: str):
        self.reference = reference
        self.file_format = file_format

    def version_number(self, uri: str, version=None, allow_outside: bool = False) -> None:
        """None: the metastore keeps no versions of a table's partitions."""
        return None

    def deleted_rows(self, uri: str, version=None, allow_outside: bool = False) -> dict[str, np.ndarray]:
        """None: the files hold their rows."""
        return {}

    def dataset(self, uri: str, version=None, allow_outside: bool = False) -> ds.FileSystemDataset:
        """The table's data files now: those of its registered partitions, each file's partition
        columns the values the metastore holds for it, with the merged schema of the files."""
        table = lookup(*split_reference(self.reference))
        if not table.partition_columns:
            return FolderTable(self.file_format).dataset(table.location)
        fs, _ = filesystem(table.location)
        paths, expressions = [], []
        for partition in table.partitions:
            _check_location(table, partition.location)
            where, path = filesystem(partition.location)
            if where.type_name != fs.type_name:
                raise ShardError(f"{table.name}: partition {partition.location} is on another file system than the "
                                 f"table ({table.location}): a table's partitions are read through one")
            files = _data_files(where, path, partition.location)
            paths += files
            expressions += [partition_expression(table, partition)] * len(files)
        if not paths:
            raise ShardError(f"{table.name}: none of its {len(table.partitions)} registered partitions holds a data "
                             f"file (metastore {table.metastore})")
        file_format = ds.ParquetFileFormat() if self.file_format == "parquet" else ds.OrcFileFormat()
        first = ds.dataset(paths[0], format=file_format, filesystem=fs).schema
        schema = pa.schema([field for field in first if field.name not in dict(table.partition_columns)]
                           + [pa.field(name, type_) for name, type_ in table.partition_columns])
        found = ds.FileSystemDataset.from_paths(paths, schema=schema, format=file_format, filesystem=fs,
                                                partitions=expressions)
        return with_merged_schema(found)


def _check_location(table: MetastoreTable, location: str) -> None:
    """Refuse a partition's location that is relative: it would be read against this process's
    folder. (One on another file system than the table's is refused where its files are listed.)"""
    if "://" not in location and not location.startswith("/"):
        raise ShardError(f"{table.name}: partition {location!r} (metastore {table.metastore}) is not an absolute "
                         f"location: nothing is read from it")


def _data_files(fs, path: str, location: str) -> list[str]:
    """The data files under a partition's folder, sorted, Spark's and Hadoop's side files and
    folders left out (:data:`~shardio.folder_tables.SIDE_FILE_PREFIXES`); a missing folder is an error."""
    import pyarrow.fs as pafs

    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    except FileNotFoundError:
        raise ShardError(f"{location}: a registered partition's folder, and there is no such folder") from None
    files = []
    for info in infos:
        inner = info.path[len(path):].strip("/").split("/")
        if info.type == pafs.FileType.File and not any(part.startswith(SIDE_FILE_PREFIXES) for part in inner):
            files.append(info.path)
    return sorted(files)


def partition_expression(table: MetastoreTable, partition: Partition):
    """The expression that gives a partition's files the column values the metastore holds."""
    if len(partition.values) != len(table.partition_columns):
        raise ShardError(f"{table.name}: partition {partition.location} has {len(partition.values)} values for "
                         f"{len(table.partition_columns)} partition columns")
    expression = ds.scalar(True)
    for (name, type_), value in zip(table.partition_columns, partition.values):
        if value is None:
            expression = expression & ds.field(name).is_null()
            continue
        try:
            scalar = pa.scalar(value).cast(type_)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise ShardError(f"{table.name}: partition {partition.location}: {name} = {value!r} is not a {type_}") from None
        expression = expression & (ds.field(name) == scalar)
    return expression
