"""Apache Iceberg tables read in place: the live data files of one snapshot, from the table's metadata.

An Iceberg table is data files plus a ``metadata/`` folder: each commit writes a new
``*.metadata.json`` naming the table's snapshots, and a snapshot's manifests list the files that
are the table then. Files an overwrite or a delete replaced stay on disk until snapshots
expire. The metadata is read with ``pyiceberg`` (the ``iceberg`` extra), on the client only:
the snapshot is pinned when the job starts and the workers' pieces name the files, read as any
other Parquet files.

The table is named by a metadata file (``.../metadata/00004-<uuid>.metadata.json``), by its
folder (the newest metadata file there: ``version-hint.text``'s, else the highest number), or
by its name in a catalog (:func:`catalog_table`: the catalog's current metadata file).
Read: the current snapshot, or one named by id or by time (``version``); positional delete
files (merge-on-read deletes) applied: the rows they name are left out of each piece. Refused,
naming the table and what to do: equality delete files, data files other than Parquet, columns
renamed since files were written (the files would hold them under their old names), and, unless
the user allows it, a manifest list, manifest, data or delete file outside the table's folder
(:func:`table_root`), naming the manifest and the entry. A snapshot is read with its own schema.
"""

from __future__ import annotations

import datetime
import functools
import posixpath
import re
from urllib.parse import urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from iterreduce.exceptions import ShardError, TableError
from iterreduce.storage.filesystems import filesystem

from .columns import plain_schema
from .counted import read_counted
from .lakehouse import inside_table, once_a_version, outside_table, parse_version

METADATA_SUFFIX = ".metadata.json"
#: What to run in Spark so that a table's deletes live in its data files again.
REWRITE_HINT = ("in Spark, CALL <catalog>.system.rewrite_data_files(table => '<table>', options => "
                "map('delete-file-threshold', '1')) rewrites the deletes into the data files")


def _pyiceberg():
    try:
        from pyiceberg.table import StaticTable
    except ImportError:
        raise TableError("reading an Apache Iceberg table needs the pyiceberg package: "
                         "pip install 'dbn-yarn[iceberg]'") from None
    return StaticTable


def catalog_table(catalog: str, identifier: str) -> str:
    """The metadata file of table ``identifier`` (``db.table``) in the catalog named ``catalog``,
    as pyiceberg's own configuration describes it (``~/.pyiceberg.yaml``, or
    ``PYICEBERG_CATALOG__<NAME>__URI`` and the like: a Hive metastore, a REST or SQL catalog)."""
    _pyiceberg()
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchTableError

    try:
        found = load_catalog(catalog)
    except Exception as exc:  # pyiceberg's errors vary: no such catalog, a missing library, no connection
        raise TableError(f"catalog {catalog!r}: cannot open it as pyiceberg's configuration describes it "
                         f"(~/.pyiceberg.yaml or PYICEBERG_CATALOG__{catalog.upper()}__URI ...): "
                         f"{' '.join(str(exc).split())[:300]}") from None
    try:
        return found.load_table(identifier).metadata_location
    except NoSuchTableError:
        raise TableError(f"{identifier}: no such table in the Apache Iceberg catalog {catalog!r}") from None
    except Exception as exc:
        raise TableError(f"{identifier}: cannot load it from the Apache Iceberg catalog {catalog!r}: "
                         f"{' '.join(str(exc).split())[:300]}") from None


def metadata_file(uri: str) -> str:
    """The metadata file that ``uri`` names: itself, or the newest in a table folder's ``metadata/``."""
    if uri.endswith(METADATA_SUFFIX):
        return uri
    fs, path = filesystem(uri)
    folder = posixpath.join(path, "metadata")
    hint = _read_text(fs, posixpath.join(folder, "version-hint.text"))
    if hint is not None and hint.strip().isdigit():
        named = posixpath.join(folder, f"v{hint.strip()}{METADATA_SUFFIX}")
        if fs.get_file_info(named).type == pafs.FileType.File:
            return _same_scheme(uri, path, named)
    found = [info.base_name for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
             if info.base_name.endswith(METADATA_SUFFIX)]
    if not found:
        raise TableError(f"{uri}: no Apache Iceberg table there (no metadata/*{METADATA_SUFFIX})")
    newest = max(found, key=_metadata_number)
    return _same_scheme(uri, path, posixpath.join(folder, newest))


def _metadata_number(name: str) -> int:
    """A metadata file's number: ``00004-<uuid>.metadata.json`` (catalogs) or ``v4.metadata.json``."""
    match = re.match(r"v?(\d+)", name)
    return int(match.group(1)) if match else -1


def _read_text(fs, path: str) -> str | None:
    try:
        with fs.open_input_stream(path) as stream:
            return stream.read(64).decode("ascii", "replace")
    except (FileNotFoundError, OSError):
        return None


def _same_scheme(uri: str, path: str, found: str) -> str:
    """``found`` (a path on ``uri``'s file system) as a URI of ``uri``'s form."""
    return uri[: len(uri) - len(path.rstrip("/"))] + found if uri.rstrip("/").endswith(path.rstrip("/")) else found


def table_root(location: str) -> str:
    """The folder of the table whose metadata file is at ``location`` (a path on its file system):
    the folder above its ``metadata/``, else the metadata file's own. What the metadata names
    (manifests, data and delete files) must lie in it (:func:`~shardio.lakehouse.inside_table`)."""
    folder = posixpath.dirname(location)
    return posixpath.dirname(folder) if posixpath.basename(folder) == "metadata" else folder


def _load(uri: str, version=None, allow_outside: bool = False):
    """``(table, snapshot)``: the Iceberg table ``uri`` names and its snapshot at ``version`` (an
    id, a time, or None for the current one), checked to be one this reader reads. Its manifest
    lists and manifests are read only inside the table's folder (:func:`table_root`), unless
    ``allow_outside``."""
    StaticTable = _pyiceberg()
    location = metadata_file(uri)
    from .iceberg_io import confined  # pyiceberg's FileIO: the optional extra, only here

    try:
        root = table_root(filesystem(location)[1])
        table = StaticTable.from_metadata(location, properties=confined(uri, location, root, allow_outside))
    except TableError:
        raise
    except Exception as exc:  # pyiceberg's errors vary with the fault (a missing file, bad JSON)
        raise TableError(f"{uri}: cannot read the Apache Iceberg table's metadata {location}: "
                         f"{' '.join(str(exc).split())[:300]}") from None
    when = parse_version(version)
    if when is None:
        snapshot = table.current_snapshot()
    elif isinstance(when, datetime.datetime):
        snapshot = table.snapshot_as_of_timestamp(int(when.timestamp() * 1000))
    else:
        snapshot = table.snapshot_by_id(when)
    if snapshot is None:
        have = ", ".join(str(s.snapshot_id) for s in table.snapshots()) or "none"
        raise TableError(f"{uri}: the Apache Iceberg table has no snapshot "
                         f"{'yet' if when is None else f'at version {version!r}'} (snapshots: {have})")
    _check_renames(uri, table)
    return table, snapshot


#: A version number's table, read once (:func:`~shardio.lakehouse.once_a_version`).
load = once_a_version(_load)


def _check_renames(uri: str, table) -> None:
    """Refuse a table whose columns were renamed: its older files hold them under the old names
    (Iceberg matches columns by id; this reader, by name)."""
    names: dict[int, set[str]] = {}
    for schema in table.metadata.schemas:
        for field in schema.fields:
            names.setdefault(field.field_id, set()).add(field.name)
    renamed = sorted(" / ".join(sorted(n)) for n in names.values() if len(n) > 1)
    if renamed:
        raise TableError(f"{uri}: columns of the Apache Iceberg table were renamed ({', '.join(renamed)}), and files "
                         f"written before hold the old names, which this reader does not map yet: write the "
                         f"snapshot to train on as a new table, or as plain Parquet")


def version_number(uri: str, version=None, allow_outside: bool = False) -> int:
    """The id of the snapshot the table at ``uri`` has at ``version`` (an id, a time, or None for
    the current one): what a job reads throughout, however the table changes meanwhile."""
    return load(uri, version, allow_outside)[1].snapshot_id


def dataset(uri: str, version: int, allow_outside: bool = False) -> ds.FileSystemDataset:
    """The table at ``uri`` at snapshot ``version`` as a ``pyarrow.dataset`` of its live data files
    (rows its positional delete files remove: :func:`deleted_rows`), with the snapshot's own
    schema (a column added since is not the snapshot's). A data file outside the table's folder
    is refused unless ``allow_outside`` (:func:`_paths`)."""
    table, snapshot = load(uri, version, allow_outside)
    tasks = _tasks(uri, table, snapshot)
    if not tasks:
        raise ShardError(f"{uri}: the Apache Iceberg table holds no data files at snapshot {snapshot.snapshot_id}")
    for task in tasks:
        if task.file.file_format.name != "PARQUET":
            raise TableError(f"{uri}: {task.file.file_path} is {task.file.file_format.name}: this reader reads "
                             f"Apache Iceberg tables of Parquet files")
    fs, _ = filesystem(uri)
    paths = _paths([task.file.file_path for task in tasks], uri, table, snapshot, allow_outside)
    schema = plain_schema(table.schemas().get(snapshot.schema_id, table.schema()).as_arrow())
    schema = pa.schema([field.remove_metadata() for field in schema])  # Parquet field ids: not the table's names
    return ds.FileSystemDataset.from_paths(paths, schema=schema, format=ds.ParquetFileFormat(), filesystem=fs)


def _tasks(uri: str, table, snapshot) -> list:
    """The snapshot's scan tasks (a data file and its delete files each), equality deletes refused."""
    tasks = list(table.scan(snapshot_id=snapshot.snapshot_id).plan_files())
    unsupported = {d.file_path: d for task in tasks for d in task.delete_files
                   if d.content.name != "POSITION_DELETES" or d.file_format.name != "PARQUET"}
    if unsupported:
        kinds = sorted({f"{d.content.name.lower().replace('_', ' ')} in {d.file_format.name}"
                        for d in unsupported.values()})
        raise TableError(f"{uri}: snapshot {snapshot.snapshot_id} of the Apache Iceberg table has "
                         f"{len(unsupported)} delete file{'s' if len(unsupported) > 1 else ''} of a kind this reader "
                         f"does not apply ({', '.join(kinds)}; it applies positional deletes in Parquet): "
                         f"{REWRITE_HINT}")
    return tasks


@functools.lru_cache(maxsize=4)
def deleted_rows(uri: str, version: int, allow_outside: bool = False) -> dict[str, np.ndarray]:
    """The rows of each data file (by its path on the table's file system) that the snapshot's
    positional delete files remove: a delete file lists (data file, position) pairs. A delete
    file outside the table's folder is refused, as a data file is (:func:`dataset`)."""
    table, snapshot = load(uri, version, allow_outside)
    readers: dict[str, list[str]] = {}  # delete file -> the data files it may name
    for task in _tasks(uri, table, snapshot):
        for delete in task.delete_files:
            readers.setdefault(delete.file_path, []).append(task.file.file_path)
    fs, _ = filesystem(uri)
    found: dict[str, list[np.ndarray]] = {}
    for location, path in zip(readers, _paths(list(readers), uri, table, snapshot, allow_outside)):
        data_files = readers[location]
        try:  # a batch at a time, counted: a footer claiming billions of rows allocates nothing for them
            pairs = read_counted(path, fs, ["file_path", "pos"])
        except (OSError, pa.ArrowException) as exc:
            raise ShardError(f"{location}: not a readable positional delete file ({type(exc).__name__}: {exc})") from exc
        for data_file, data_path in zip(data_files, _paths(data_files, uri, table, snapshot, allow_outside)):
            rows = pairs.filter(pc.equal(pairs.column("file_path"), data_file)).column("pos")
            found.setdefault(data_path, []).append(rows.to_numpy())
    return {path: np.unique(np.concatenate(parts)) for path, parts in found.items()}


def _paths(locations: list[str], uri: str, table, snapshot, allow_outside: bool) -> list[str]:
    """The paths on the table's file system of the data or delete files at ``locations`` (the
    metadata names them by full URIs), each refused where it lies outside the table's folder
    (:func:`table_root`) and not ``allow_outside``: :class:`TableError` naming the table, the
    manifest that lists it and the entry."""
    fs, metadata = filesystem(table.metadata_location)
    root = table_root(metadata)
    paths = []
    for location in locations:
        parts = urlparse(location)
        if (parts.scheme or "file") != (urlparse(uri).scheme or "file"):
            raise TableError(f"{uri}: the Apache Iceberg metadata names a data file on another file system: "
                             f"{location}")
        if not allow_outside and not inside_table(parts.path, root, fs):
            raise outside_table(uri, f"the Apache Iceberg manifest {_manifest_of(location, table, snapshot)}",
                                location, absolute=True)
        paths.append(parts.path)  # as checked: inside_table took its ``..`` and links as the kernel will
    return paths


def _manifest_of(location: str, table, snapshot) -> str:
    """The manifest of ``snapshot`` that lists the file at ``location``, for errors."""
    for manifest in snapshot.manifests(table.io):
        if any(entry.data_file.file_path == location for entry in manifest.fetch_manifest_entry(table.io)):
            return manifest.manifest_path
    return f"of snapshot {snapshot.snapshot_id} (in {snapshot.manifest_list})"
