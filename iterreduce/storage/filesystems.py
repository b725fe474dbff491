"""File systems by URI: plain paths, ``file://``, ``hdfs://`` (hdfs-native, logged in with a
Kerberos ticket, a keytab or a YARN container's delegation tokens) and any other scheme pyarrow
understands; and the one way this project writes a file (:func:`open_output_file`: whole or not
at all, never over a file it was not asked to replace)."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import posixpath
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from ..exceptions import OutputExists
from . import durable, hadoopconf, kerberos


#: The environment that names the Kerberos principal and keytab HDFS is reached as (:func:`kerberos_login`):
#: variables, so that this process's helper processes (spawned) reach it so too.
KEYTAB_LOGIN_VARS = ("ITERREDUCE_HDFS_PRINCIPAL", "ITERREDUCE_HDFS_KEYTAB")


def kerberos_login(principal: str | None, keytab: str | None) -> None:
    """Reach HDFS as ``principal``, logged in with ``keytab`` (``dbn submit --principal/--keytab``),
    instead of with the ticket cache (``kinit``), in this process and those it starts; both
    None: the ticket cache again."""
    if principal and keytab:
        os.environ.update(zip(KEYTAB_LOGIN_VARS, (principal, os.path.abspath(os.path.expanduser(keytab)))))
    else:
        for var in KEYTAB_LOGIN_VARS:
            os.environ.pop(var, None)


def keytab_login() -> tuple[str | None, str | None]:
    """The principal and keytab of :func:`kerberos_login`, or ``(None, None)`` (the ticket cache)."""
    principal, keytab = (os.environ.get(var) or None for var in KEYTAB_LOGIN_VARS)
    return (principal, keytab) if principal and keytab else (None, None)


#: What an HDFS client of this process depends on besides its NameNode: fsspec keeps one file system
#: (and its client) per set of values, so that one made for another configuration or login is not reused.
CLIENT_ENVIRONMENT = ("HADOOP_CONF_DIR", "HADOOP_HOME", "KRB5CCNAME", "KRB5_CONFIG", "HADOOP_TOKEN_FILE_LOCATION",
                      *KEYTAB_LOGIN_VARS)


def client_environment() -> tuple[str, ...]:
    """The values of :data:`CLIENT_ENVIRONMENT` in this process (empty for unset)."""
    return tuple(os.environ.get(var, "") for var in CLIENT_ENVIRONMENT)


def _hdfs_native(host: str, port: int | None):
    """hdfs-native's fsspec file system for a NameNode, logged in as :func:`kerberos_login` says,
    one per :data:`CLIENT_ENVIRONMENT` (a key of hdfs-native's configuration that nothing reads)."""
    import fsspec

    key = hashlib.sha256("\n".join(client_environment()).encode()).hexdigest()[:16]
    environment = {"iterreduce.client.environment": key}
    principal, keytab = keytab_login()
    if not (principal and keytab):
        return fsspec.filesystem("hdfs", host=host, port=port, **environment)
    return _keytab_hdfs_class()(host=host, port=port, kerberos=(principal, keytab), **environment)


@functools.lru_cache(maxsize=1)
def _keytab_hdfs_class():
    """hdfs-native's fsspec file system whose client logs in with a keytab (fsspec's
    ``storage_options`` reach only the client's configuration); made on first use, as
    hdfs-native is optional."""
    from hdfs_native import Client
    from hdfs_native.fsspec import HdfsFileSystem

    class KeytabHdfsFileSystem(HdfsFileSystem):
        def __init__(self, host=None, port=None, kerberos=("", ""), **storage_options):
            super().__init__(host, port, **storage_options)
            principal, keytab = kerberos
            self.client = Client(self.unstrip_protocol("/").rstrip("/"), storage_options or None,
                                 kerberos_principal=principal, kerberos_keytab=keytab)

    return KeytabHdfsFileSystem


class _HdfsHandler(pafs.FSSpecHandler):
    """pyarrow's handler of an fsspec file system, for hdfs-native's: a file that cannot be
    opened because HDFS refused (an expired token, no ticket) is said so, not reported missing
    (pyarrow's own asks fsspec's ``isfile``, which takes any failure for "no such file"), and
    every refusal is an :class:`~iterreduce.exceptions.HdfsAccessError` naming the file and
    saying what to do (:func:`iterreduce.storage.kerberos.hdfs_error`). ``base``: the URI's scheme and
    NameNode as the user wrote them, for messages."""

    def __init__(self, fs, base: str):
        super().__init__(fs)
        self.base = base

    def open_input_stream(self, path):
        return self._open(path)

    def open_input_file(self, path):
        return self._open(path)

    def _open(self, path):
        if self.fs.info(path)["type"] != "file":  # FileNotFoundError when it is not there
            raise IsADirectoryError(errno.EISDIR, "a folder, not a file", path)
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")


def _refusals_explained(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (RuntimeError, OSError) as exc:
            if isinstance(exc, OSError) and type(exc) is not OSError:
                raise  # "not found", "permission denied", ...: said as they are
            # hdfs-native's other errors: RuntimeError (RPC, GSSAPI), a bare OSError (connection)
            paths = [a for a in args if isinstance(a, str)] or [p for a in args if isinstance(a, list) for p in a[:1]]
            raise kerberos.hdfs_error(self.base + (paths[0] if paths else ""), exc) from None
    return call


for _name in ("get_file_info", "get_file_info_selector", "create_dir", "delete_dir", "delete_dir_contents",
              "delete_root_dir_contents", "delete_file", "move", "copy_file", "open_input_stream", "open_input_file",
              "open_output_stream", "open_append_stream"):
    setattr(_HdfsHandler, _name, _refusals_explained(getattr(_HdfsHandler, _name)))


@functools.lru_cache(maxsize=16)
def _check_kerberos_client(environment: tuple[str, ...]) -> None:
    """:func:`iterreduce.storage.kerberos.check_client`, once per :data:`CLIENT_ENVIRONMENT` (a refusal is not
    kept: it is checked again next time)."""
    kerberos.check_client(*keytab_login())


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system and path for ``uri``. An ``hdfs://`` URI's NameNode is reached
    as Hadoop names its delegation tokens (:func:`iterreduce.storage.hadoopconf.namenode_address`), so
    that a YARN container, which holds tokens and no Kerberos ticket, finds them."""
    parts = urlparse(uri)
    scheme = parts.scheme
    if scheme == "hdfs":
        try:
            import hdfs_native.fsspec  # noqa: F401  (registers fsspec's "hdfs" protocol)
        except ImportError:
            return pafs.FileSystem.from_uri(uri)  # libhdfs, from a Hadoop install
        _check_kerberos_client(client_environment())
        host, port = hadoopconf.namenode_address(parts.hostname or "", parts.port)
        return pafs.PyFileSystem(_HdfsHandler(_hdfs_native(host, port), f"hdfs://{parts.netloc}")), parts.path
    if scheme in ("", "file"):
        path = urlparse(uri).path if scheme == "file" else uri
        return pafs.LocalFileSystem(), str(path)
    return pafs.FileSystem.from_uri(uri)


#: How a file already at the path a command writes is refused (:func:`check_output_file`).
EXISTS_HINT = "pass --overwrite to replace it, or choose another --out"


def check_output_file(uri: str, *, overwrite: bool = False, resolve=None) -> None:
    """Refuse to write the file at ``uri`` (a path or URI) before anything is computed: a folder
    there raises :class:`IsADirectoryError`, and, unless ``overwrite``, a file there raises
    :class:`~iterreduce.exceptions.OutputExists`, naming it (Spark's ErrorIfExists, ``hdfs dfs
    -put`` without ``-f``): a user's own file, a table's part file, is never replaced unasked.
    Nothing is read, written or made. ``resolve`` (default :func:`filesystem`) maps ``uri`` to
    its file system and path. :func:`open_output_file` checks the same again when it starts
    and, without ``overwrite``, when it moves the finished file in."""
    if uri.endswith("/") or posixpath.basename(uri) in ("", ".", ".."):  # a folder's name: nothing is made
        raise IsADirectoryError(errno.EISDIR, "a folder's name: name the file to write", uri)
    fs, path = (resolve or filesystem)(uri)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.Directory:
        raise IsADirectoryError(errno.EISDIR, "a folder is there: name the file to write", uri)
    if kind != pafs.FileType.NotFound and not overwrite:
        raise OutputExists(f"{uri}: already exists; {EXISTS_HINT}")


@contextlib.contextmanager
def open_output_file(uri: str, *, resolve=None, overwrite: bool = True):
    """A stream that writes the file at ``uri`` (a path or URI), its folder made first where
    the path has one (a bare name is a file in the current folder).

    The bytes go to a hidden ``.tmp`` file beside it, moved to ``uri`` only when the ``with``
    block ends without an error: a failed write leaves no partial file, readers never see half
    a file, and an earlier file stays whole. The bytes are made durable and the move replaces
    an earlier file atomically where the file system allows it (:mod:`iterreduce.storage.durable`:
    local disk and HDFS do). ``overwrite=False`` (a file the user names, ``dbn predict --out``):
    a file already there is refused by :func:`check_output_file` before the stream opens, and
    one that appears while writing is left as it is (:func:`~iterreduce.storage.durable.place_new`),
    the new bytes discarded, with the same error. A folder at ``uri`` is always refused.
    ``resolve`` (default :func:`filesystem`) maps ``uri`` to its file system and path."""
    fs, path = (resolve or filesystem)(uri)
    durable.restore(fs, path)  # an earlier replacement cut short between its renames: its file back first
    check_output_file(uri, overwrite=overwrite, resolve=lambda _: (fs, path))
    folder, name = posixpath.split(path)
    if folder:
        fs.create_dir(folder, recursive=True)
    partial = durable.hidden_name(path, durable.PARTIAL_SUFFIX)
    try:
        with durable.output_stream(fs, partial) as stream:
            yield stream
        if overwrite:
            durable.replace(fs, partial, path)
        elif not durable.place_new(fs, partial, path):
            raise OutputExists(f"{uri}: already exists (it appeared while this file was written); {EXISTS_HINT}")
    except BaseException:
        with contextlib.suppress(OSError, pa.ArrowException):
            fs.delete_file(partial)
        raise


def join(base: str, name: str) -> str:
    """``name`` in folder ``base`` (a path or URI)."""
    return base.rstrip("/") + "/" + name
