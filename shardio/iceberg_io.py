"""pyiceberg's file access through this project's file systems (:func:`iterreduce.storage.filesystems.filesystem`).

pyiceberg reaches ``hdfs://`` through libhdfs (a Hadoop install and its JVM), which a client
here need not have; this reaches it as every other read of the project does: hdfs-native,
with the user's Kerberos ticket or keytab, and the NameNode as Hadoop's configuration names
it. Reads only: this project never writes a table's metadata, and reads what the metadata names
(manifest lists, manifests) only inside the table's folder unless the user allows more
(:func:`confined`). Imported by pyiceberg, by name (``py-io-impl``), so only where pyiceberg is
installed.
"""

from __future__ import annotations

import pyarrow.fs as pafs
from pyiceberg.io import FileIO, InputFile, OutputFile

from iterreduce.storage.filesystems import filesystem

from .lakehouse import inside_table, outside_table

#: pyiceberg's property that names the FileIO class a table reads with.
PROPERTIES = {"py-io-impl": f"{__name__}.FileSystemIO"}
#: The properties that confine a table's reads to its folder: the table as the user named it and
#: its metadata file, for errors, and the folder's path on its file system.
TABLE, METADATA, ROOT = "iterreduce.table", "iterreduce.metadata", "iterreduce.table-root"


def confined(uri: str, metadata: str, root: str, allow_outside: bool) -> dict:
    """pyiceberg's properties for reading the table at ``uri`` from its ``metadata`` file, its
    folder ``root`` (a path on its file system): its files are read only in that folder, unless
    ``allow_outside``."""
    return PROPERTIES if allow_outside else {**PROPERTIES, TABLE: uri, METADATA: metadata, ROOT: root}


class FileSystemInput(InputFile):
    """A file pyiceberg reads (metadata, manifest lists, manifests)."""

    def __init__(self, location: str):
        super().__init__(location)
        self._fs, self._path = filesystem(location)

    def __len__(self) -> int:
        return self._fs.get_file_info(self._path).size

    def exists(self) -> bool:
        return self._fs.get_file_info(self._path).type != pafs.FileType.NotFound

    def open(self, seekable: bool = True):
        return self._fs.open_input_file(self._path)


class FileSystemIO(FileIO):
    """pyiceberg's FileIO over :func:`~iterreduce.storage.filesystems.filesystem`: reads only."""

    def new_input(self, location: str) -> InputFile:
        """The file at ``location``; one outside the table's folder (:func:`confined`) is refused,
        a :class:`~iterreduce.exceptions.TableError` naming the table and the file, before it is opened."""
        found = FileSystemInput(location)
        root = self.properties.get(ROOT)
        if root is not None and not inside_table(found._path, root, found._fs):
            raise outside_table(self.properties[TABLE], f"the Apache Iceberg metadata {self.properties[METADATA]} "
                                f"(or a manifest list it names)", location, absolute=True)
        return found  # opened as checked: inside_table took its ``..`` and links as the kernel will

    def new_output(self, location: str) -> OutputFile:
        raise PermissionError(f"{location}: this project reads Apache Iceberg tables and never writes them")

    def delete(self, location) -> None:
        raise PermissionError(f"{getattr(location, 'location', location)}: this project never deletes a table's files")
