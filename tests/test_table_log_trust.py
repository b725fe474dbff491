"""A table's log names files outside the table (issue 51, class 7).

A Delta Lake log's add action, or an Apache Iceberg manifest's entry, names the data files a job
reads. Read as written, ``../outside/private.parquet`` trained on a file beside the table. Here:
a relative path (percent-encoded, as the Delta protocol writes them, or not) stays in the table's
folder, always; an absolute path or URI (a Delta shallow clone's, an Iceberg table's by design)
is read only inside the table's folder, unless ``[data] allow_outside_files = true`` says the
user means it (a shallow clone of another table, files an Iceberg table adopted with
``add_files``). The refusal names the table, the log or manifest file and the entry, before
anything is read: each test holds a private file outside the table and asserts that it stays
byte-identical and unread, and that no model is written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dbn import DBN
from dbn.cli import main

from test_delta import job as model_job

SMALL_MODEL = """hidden_layers = [8]
pretrain_epochs = 1
finetune_epochs = 1
pretrain_batch_size = 20
finetune_batch_size = 20
"""
SECRET = "secret"  # the private file's only class: a model that has it was trained on that file


def rows(seed: int, n: int, labels: str = "ab") -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"f1": rng.normal(size=n), "f2": rng.normal(size=n),
                     "label": pa.array(np.asarray([labels] if len(labels) > 2 else list(labels))
                                       [rng.integers(0, 1 if len(labels) > 2 else len(labels), n)])})


def private_file(tmp_path: Path) -> tuple[Path, bytes]:
    """A file outside the table (another user's data, say) and its bytes."""
    path = tmp_path / "outside" / "private.parquet"
    path.parent.mkdir()
    pq.write_table(rows(9, 40, SECRET), path)
    return path, path.read_bytes()


def mark_unread(path: Path) -> None:
    """Set the access time of ``path`` far back, so that any read moves it (relatime updates an
    access time older than the file's change time)."""
    os.utime(path, (1_000_000, path.stat().st_mtime))


def unread(path: Path, before: bytes) -> bool:
    """Whether ``path`` holds ``before`` and was not read (where the file system keeps access times)."""
    probe = path.with_name("probe")
    probe.write_bytes(b"x")
    mark_unread(probe)
    probe.read_bytes()
    times_kept = probe.stat().st_atime != 1_000_000
    probe.unlink()
    after = path.stat().st_atime  # before reading the bytes back, which moves it
    return (not times_kept or after == 1_000_000) and path.read_bytes() == before


def job(tmp_path: Path, root, fmt: str, data: str = "") -> Path:
    """A job file of this module's small model (test_delta's job files), in ``tmp_path``, made if missing."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    return model_job(tmp_path, root, data, fmt=fmt, features=("f1", "f2"), model=SMALL_MODEL)


def refused(tmp_path: Path, capsys, root, fmt: str, data: str = "") -> str:
    assert main(["train", str(job(tmp_path, root, fmt, data)), "--quiet", "--no-ui"]) == 2
    assert not (tmp_path / "out" / "model.npz").exists()
    return capsys.readouterr().err


def trained(tmp_path: Path, root, fmt: str, data: str = "") -> tuple[dict, DBN]:
    assert main(["train", str(job(tmp_path, root, fmt, data)), "--quiet", "--no-ui"]) == 0
    out = tmp_path / "out"
    return json.loads((out / "result.json").read_text()), DBN.load(out / "model.npz", device="cpu")


# ------------------------------------------------------------------ Delta Lake


def delta_table(tmp_path: Path) -> Path:
    deltalake = pytest.importorskip("deltalake")
    root = tmp_path / "table"
    deltalake.write_deltalake(str(root), rows(0, 100))
    return root


def add_to_log(root: Path, entry: str, size: int, rows_: int) -> Path:
    """A commit whose one add action names ``entry`` (as a writer would lay it in the log)."""
    log = root / "_delta_log"
    version = max(int(p.stem) for p in log.glob("*.json")) + 1
    actions = [{"commitInfo": {"timestamp": 1_700_000_000_000 + version, "operation": "WRITE"}},
               {"add": {"path": entry, "partitionValues": {}, "size": size, "modificationTime": 1_700_000_000_000,
                        "dataChange": True, "stats": json.dumps({"numRecords": rows_})}}]
    commit = log / f"{version:020d}.json"
    commit.write_text("".join(json.dumps(action) + "\n" for action in actions))
    return commit


OUTSIDE_ENTRIES = {
    "relative": lambda private: "../outside/private.parquet",
    "percent-encoded": lambda private: "%2E%2E/outside/private.parquet",
    "encoded-deeper": lambda private: "day=1/%2e%2e/%2e%2e/outside/private.parquet",
    "absolute path": lambda private: str(private),
    "absolute URI": lambda private: f"file://{private}",
}


@pytest.mark.parametrize("kind", OUTSIDE_ENTRIES)
def test_a_delta_log_naming_a_file_outside_the_table_is_refused_before_anything_is_read(tmp_path, capsys, kind):
    root = delta_table(tmp_path)
    private, before = private_file(tmp_path)
    entry = OUTSIDE_ENTRIES[kind](private)
    commit = add_to_log(root, entry, len(before), 40)
    mark_unread(private)
    err = refused(tmp_path / "run", capsys, root, "delta")
    assert str(root) in err and commit.name in err and entry in err and "outside the table" in err, err
    assert unread(private, before)


@pytest.mark.parametrize("kind", ["relative", "percent-encoded"])
def test_a_relative_path_out_of_the_table_is_refused_even_where_outside_files_are_allowed(tmp_path, capsys, kind):
    root = delta_table(tmp_path)
    private, before = private_file(tmp_path)
    add_to_log(root, OUTSIDE_ENTRIES[kind](private), len(before), 40)
    mark_unread(private)
    err = refused(tmp_path / "run", capsys, root, "delta", "allow_outside_files = true")
    assert "outside the table" in err and unread(private, before)


def test_an_absolute_uri_inside_the_table_is_read(tmp_path):
    """A shallow clone's form (an absolute URI) of a file in the table's own folder."""
    root = delta_table(tmp_path)
    extra = root / "more" / "part-extra.parquet"
    extra.parent.mkdir()
    pq.write_table(rows(1, 30), extra)
    add_to_log(root, f"file://{extra}", extra.stat().st_size, 30)
    result, _ = trained(tmp_path / "run", root, "delta")
    assert result["n_train"] == 130


@pytest.mark.parametrize("kind", ["absolute path", "absolute URI"])
def test_allow_outside_files_reads_a_shallow_clones_files(tmp_path, kind):
    root = delta_table(tmp_path)
    private, before = private_file(tmp_path)
    add_to_log(root, OUTSIDE_ENTRIES[kind](private), len(before), 40)
    result, model = trained(tmp_path / "run", root, "delta", "allow_outside_files = true")
    assert result["n_train"] == 140 and SECRET in list(model.classes_)
    assert private.read_bytes() == before


def test_a_link_in_the_table_to_a_file_outside_it_is_refused(tmp_path, capsys):
    root = delta_table(tmp_path)
    private, before = private_file(tmp_path)
    (root / "linked").symlink_to(private.parent)
    commit = add_to_log(root, "linked/private.parquet", len(before), 40)
    mark_unread(private)
    err = refused(tmp_path / "run", capsys, root, "delta")
    assert commit.name in err and "linked/private.parquet" in err and unread(private, before)


# ------------------------------------------------------------------ Apache Iceberg


@pytest.fixture
def catalog(tmp_path):
    pytest.importorskip("pyiceberg")
    pytest.importorskip("sqlalchemy")
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("trust", uri=f"sqlite:///{tmp_path / 'catalog.db'}",
                         warehouse=f"file://{tmp_path / 'warehouse'}")
    catalog.create_namespace("db")
    return catalog


def iceberg_with_outside_file(catalog, private: Path):
    """A table of 100 rows that adopted ``private`` with ``add_files`` (its manifest names it by absolute path)."""
    table = catalog.create_table("db.adopting", schema=rows(0, 1).schema)
    table.append(rows(0, 100))
    table.add_files([str(private)])
    return catalog.load_table("db.adopting")


def test_an_iceberg_manifest_naming_a_file_outside_the_table_is_refused(tmp_path, capsys, catalog):
    private, before = private_file(tmp_path)
    table = iceberg_with_outside_file(catalog, private)
    where = table.location().removeprefix("file://")
    mark_unread(private)  # add_files read its footer
    err = refused(tmp_path / "run", capsys, where, "iceberg")
    manifests = [m.manifest_path for m in table.current_snapshot().manifests(table.io)]
    named = [m for m in manifests if Path(m).name in err]
    assert where in err and str(private) in err and "outside the table" in err and len(named) == 1, err
    assert "allow_outside_files" in err and unread(private, before)


def test_allow_outside_files_reads_the_files_an_iceberg_table_adopted(tmp_path, catalog):
    private, before = private_file(tmp_path)
    table = iceberg_with_outside_file(catalog, private)
    result, model = trained(tmp_path / "run", table.location().removeprefix("file://"), "iceberg",
                            "allow_outside_files = true")
    assert result["n_train"] == 140 and SECRET in list(model.classes_) and private.read_bytes() == before


def test_iceberg_metadata_naming_a_manifest_list_outside_the_table_is_refused(tmp_path, capsys, catalog):
    """The metadata file names its snapshots' manifest lists: one outside the table is not opened."""
    table = catalog.create_table("db.moved", schema=rows(0, 1).schema)
    table.append(rows(0, 100))
    table = catalog.load_table("db.moved")
    metadata = Path(table.metadata_location.removeprefix("file://"))
    listed = Path(table.current_snapshot().manifest_list.removeprefix("file://"))
    elsewhere = tmp_path / "outside" / listed.name
    elsewhere.parent.mkdir()
    shutil.copy(listed, elsewhere)
    before = elsewhere.read_bytes()
    mark_unread(elsewhere)
    doc = json.loads(metadata.read_text())
    for snapshot in doc["snapshots"]:
        snapshot["manifest-list"] = f"file://{elsewhere}"
    metadata.write_text(json.dumps(doc))
    err = refused(tmp_path / "run", capsys, str(metadata), "iceberg")
    assert str(elsewhere) in err and str(metadata) in err and "outside the table" in err, err
    assert unread(elsewhere, before)


def test_a_deletion_vector_stored_outside_the_table_is_refused_before_it_is_opened(tmp_path, capsys):
    """A deletion vector stored by absolute path (``storageType`` "p") outside the table is not handed
    to delta-rs to read (which would say what the file's first bytes are)."""
    deltalake = pytest.importorskip("deltalake")
    root = delta_table(tmp_path)
    private, before = private_file(tmp_path)
    deltalake.DeltaTable(str(root)).alter.add_feature([deltalake.table.TableFeatures.DeletionVectors],
                                                      allow_protocol_versions_increase=True)
    table = deltalake.DeltaTable(str(root))
    add = pa.table(table.get_add_actions(flatten=True)).to_pylist()[0]
    vector = {"storageType": "p", "pathOrInlineDv": f"file://{private}", "offset": 1, "sizeInBytes": 36,
              "cardinality": 2}
    stamp = add["modification_time"] + 1
    actions = [{"commitInfo": {"timestamp": stamp, "operation": "DELETE"}},
               {"remove": {"path": add["path"], "deletionTimestamp": stamp, "dataChange": True}},
               {"add": {"path": add["path"], "partitionValues": {}, "size": add["size_bytes"],
                        "modificationTime": stamp, "dataChange": True, "deletionVector": vector,
                        "stats": json.dumps({"numRecords": add["num_records"]})}}]
    commit = root / "_delta_log" / f"{table.version() + 1:020d}.json"
    commit.write_text("".join(json.dumps(action) + "\n" for action in actions))
    mark_unread(private)
    err = refused(tmp_path / "run", capsys, root, "delta")
    assert commit.name in err and f"file://{private}" in err and "outside the table" in err, err
    assert unread(private, before)


# ------------------------------------------------------------------ links, ``..`` and deletion vectors (review)


def linked_folder(tmp_path: Path, link: Path) -> Path:
    """``link``, a folder link in a table to ``tmp_path/elsewhere/deep``, whose ``..`` is ``elsewhere``."""
    deep = tmp_path / "elsewhere" / "deep"
    deep.mkdir(parents=True)
    link.symlink_to(deep)
    return deep.parent


@pytest.mark.parametrize("form", ["absolute path", "absolute URI"])
def test_a_delta_entry_through_a_link_then_dotdot_is_refused_where_the_kernel_would_leave_the_table(tmp_path, capsys,
                                                                                                     form):
    """``<table>/sub/../private.parquet``, ``sub`` a link out of the table: the text says inside, the
    kernel opens ``sub``'s target's parent. Checked as the kernel resolves it, it is refused unread."""
    root = delta_table(tmp_path)
    elsewhere = linked_folder(tmp_path, root / "sub")
    private = elsewhere / "private.parquet"
    pq.write_table(rows(9, 40, SECRET), private)
    before = private.read_bytes()
    entry = f"{root}/sub/../private.parquet"
    entry = entry if form == "absolute path" else f"file://{entry}"
    commit = add_to_log(root, entry, len(before), 40)
    mark_unread(private)
    err = refused(tmp_path / "run", capsys, root, "delta")
    assert commit.name in err and entry in err and "outside the table" in err, err
    assert unread(private, before)


def test_an_iceberg_entry_through_a_link_then_dotdot_is_refused(tmp_path, capsys, catalog):
    """An adopted file named ``<table>/data/l/../private.parquet``, ``l`` a link out of the table."""
    table = catalog.create_table("db.dotdot", schema=rows(0, 1).schema)
    table.append(rows(0, 100))
    where = Path(table.location().removeprefix("file://"))
    elsewhere = linked_folder(tmp_path, where / "data" / "l")
    private = elsewhere / "private.parquet"
    pq.write_table(rows(9, 40, SECRET), private)
    before = private.read_bytes()
    entry = f"{where}/data/l/../private.parquet"
    decoy = where / "data" / "private.parquet"  # pyiceberg's add_files reads the footer there (``..`` by text)
    shutil.copy(private, decoy)
    table.add_files([entry])
    decoy.unlink()
    mark_unread(private)
    err = refused(tmp_path / "run", capsys, str(where), "iceberg")
    assert entry in err and "outside the table" in err, err
    assert unread(private, before)


def test_an_iceberg_manifest_list_through_a_link_then_dotdot_is_not_opened(tmp_path, capsys, catalog):
    """The metadata names its manifest list ``<table>/metadata/l/../<list>``, ``l`` a link out of the table."""
    table = catalog.create_table("db.listdotdot", schema=rows(0, 1).schema)
    table.append(rows(0, 100))
    table = catalog.load_table("db.listdotdot")
    metadata = Path(table.metadata_location.removeprefix("file://"))
    listed = Path(table.current_snapshot().manifest_list.removeprefix("file://"))
    elsewhere = linked_folder(tmp_path, metadata.parent / "l")
    copy = elsewhere / listed.name
    shutil.copy(listed, copy)
    before = copy.read_bytes()
    mark_unread(copy)
    doc = json.loads(metadata.read_text())
    for snapshot in doc["snapshots"]:
        snapshot["manifest-list"] = f"file://{metadata.parent}/l/../{listed.name}"
    metadata.write_text(json.dumps(doc))
    err = refused(tmp_path / "run", capsys, str(metadata), "iceberg")
    assert f"l/../{listed.name}" in err and "outside the table" in err, err
    assert unread(copy, before)


def linked_partition_table(tmp_path: Path) -> tuple[Path, Path]:
    """A Delta table partitioned by ``p``, its folder ``p=a`` a link to another disk's (``disk2/p=a``)."""
    deltalake = pytest.importorskip("deltalake")
    root = tmp_path / "table"
    data = rows(0, 100).append_column("p", pa.array(["a", "b"] * 50))
    deltalake.write_deltalake(str(root), data, partition_by=["p"])
    moved = tmp_path / "disk2" / "p=a"
    moved.parent.mkdir()
    shutil.move(root / "p=a", moved)
    (root / "p=a").symlink_to(moved)
    return root, moved


def test_a_delta_partition_folder_linked_to_another_disk_is_refused_by_default_naming_the_link(tmp_path, capsys):
    root, moved = linked_partition_table(tmp_path)
    victim = next(moved.glob("*.parquet"))
    before = victim.read_bytes()
    mark_unread(victim)
    err = refused(tmp_path / "run", capsys, root, "delta")
    assert str(root / "p=a") in err and "link" in err and "allow_outside_files = true" in err, err
    assert "must stay in" not in err and unread(victim, before)


def test_allow_outside_files_reads_a_delta_partition_folder_linked_to_another_disk(tmp_path):
    root, _ = linked_partition_table(tmp_path)
    result, _ = trained(tmp_path / "run", root, "delta", "allow_outside_files = true")
    assert result["n_train"] == 100


Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85(data: bytes) -> str:
    """``data`` (a multiple of 4 bytes) in Z85, as the Delta protocol encodes a deletion vector's UUID."""
    out = ""
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        out += "".join(Z85[value // 85 ** k % 85] for k in range(4, -1, -1))
    return out


def with_deletion_vector(root: Path, vector: dict) -> Path:
    """A commit giving the table's one data file the deletion vector ``vector``."""
    deltalake = pytest.importorskip("deltalake")
    deltalake.DeltaTable(str(root)).alter.add_feature([deltalake.table.TableFeatures.DeletionVectors],
                                                      allow_protocol_versions_increase=True)
    table = deltalake.DeltaTable(str(root))
    add = pa.table(table.get_add_actions(flatten=True)).to_pylist()[0]
    stamp = add["modification_time"] + 1
    actions = [{"commitInfo": {"timestamp": stamp, "operation": "DELETE"}},
               {"remove": {"path": add["path"], "deletionTimestamp": stamp, "dataChange": True}},
               {"add": {"path": add["path"], "partitionValues": {}, "size": add["size_bytes"],
                        "modificationTime": stamp, "dataChange": True, "deletionVector": vector,
                        "stats": json.dumps({"numRecords": add["num_records"]})}}]
    commit = root / "_delta_log" / f"{table.version() + 1:020d}.json"
    commit.write_text("".join(json.dumps(action) + "\n" for action in actions))
    return commit


UUID = bytes(range(16))
UUID_TEXT = "00010203-0405-0607-0809-0a0b0c0d0e0f"


@pytest.mark.parametrize("allow", [False, True])
def test_a_uuid_deletion_vector_whose_prefix_leaves_the_table_is_refused_before_it_is_opened(tmp_path, capsys, allow):
    """``storageType`` "u": ``<prefix><z85 uuid>`` names ``<table>/<prefix>/deletion_vector_<uuid>.bin``; a
    prefix with ``..`` leads delta-rs out of the table. Relative, it is refused even where outside files are allowed."""
    root = delta_table(tmp_path)
    victim = tmp_path / "outside" / f"deletion_vector_{UUID_TEXT}.bin"
    victim.parent.mkdir()
    victim.write_bytes(b"\x01" + bytes(64))
    before = victim.read_bytes()
    entry = "../outside/" + z85(UUID)
    commit = with_deletion_vector(root, {"storageType": "u", "pathOrInlineDv": entry, "offset": 1,
                                         "sizeInBytes": 36, "cardinality": 2})
    mark_unread(victim)
    err = refused(tmp_path / "run", capsys, root, "delta", "allow_outside_files = true" if allow else "")
    assert unread(victim, before)
    assert commit.name in err and entry in err and "outside the table" in err, err


def test_a_path_deletion_vector_through_a_link_then_dotdot_is_refused(tmp_path, capsys):
    """``storageType`` "p", ``<table>/sub/../<file>``, ``sub`` a link out of the table: refused however
    the ``..`` is taken (by text, as a URL; after the link, as the kernel)."""
    root = delta_table(tmp_path)
    elsewhere = linked_folder(tmp_path, root / "sub")
    victim = elsewhere / "vector.bin"
    victim.write_bytes(b"\x01" + bytes(64))
    (root / "vector.bin").write_bytes(b"\x01" + bytes(64))
    before = victim.read_bytes()
    entry = f"file://{root}/sub/../vector.bin"
    commit = with_deletion_vector(root, {"storageType": "p", "pathOrInlineDv": entry, "offset": 1,
                                         "sizeInBytes": 36, "cardinality": 2})
    mark_unread(victim)
    err = refused(tmp_path / "run", capsys, root, "delta")
    assert commit.name in err and entry in err and "outside the table" in err, err
    assert unread(victim, before)


def with_v2_checkpoint(root: Path, vector: dict, sidecar: bool) -> Path:
    """A v2 checkpoint (``N.checkpoint.<uuid>.json``) of version 0 giving the table's one data file the
    deletion vector ``vector``, in the checkpoint itself or in a Parquet sidecar it names; the
    commit of version 0 stays as written, without one."""
    import uuid

    log = root / "_delta_log"
    actions = [json.loads(line) for line in (log / f"{0:020d}.json").read_text().splitlines()]
    features = ["deletionVectors", "v2Checkpoint"]
    kept = [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": features,
                          "writerFeatures": features}} if "protocol" in a else a
            for a in actions if "add" not in a and "commitInfo" not in a]
    add = next(a["add"] for a in actions if "add" in a)
    add = {**add, "dataChange": False, "deletionVector": vector}
    if sidecar:
        dv = pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string()), ("offset", pa.int32()),
                        ("sizeInBytes", pa.int32()), ("cardinality", pa.int64())])
        add_type = pa.struct([("path", pa.string()), ("partitionValues", pa.map_(pa.string(), pa.string())),
                              ("size", pa.int64()), ("modificationTime", pa.int64()), ("dataChange", pa.bool_()),
                              ("stats", pa.string()), ("deletionVector", dv)])
        name = f"{uuid.uuid4()}.parquet"
        (log / "_sidecars").mkdir()
        adds = pa.array([{**add, "partitionValues": []}], add_type)
        pq.write_table(pa.table({"add": adds}), log / "_sidecars" / name)
        kept.append({"sidecar": {"path": name, "sizeInBytes": (log / "_sidecars" / name).stat().st_size,
                                 "modificationTime": 1}})
    else:
        kept.append({"add": add})
    kept.append({"checkpointMetadata": {"version": 0}})
    checkpoint = log / f"{0:020d}.checkpoint.{uuid.uuid4()}.json"
    checkpoint.write_text("".join(json.dumps(action) + "\n" for action in kept))
    (log / "_last_checkpoint").write_text(json.dumps({"version": 0, "size": len(kept)}))
    return checkpoint


@pytest.mark.parametrize("sidecar", [False, True], ids=["in the checkpoint", "in a sidecar"])
def test_a_deletion_vector_outside_the_table_in_a_v2_checkpoint_is_refused_before_it_is_opened(tmp_path, capsys,
                                                                                               sidecar):
    """delta-rs takes the live files from a v2 checkpoint (and its sidecars): their deletion vectors are checked too."""
    root = delta_table(tmp_path)
    victim = tmp_path / "outside" / "vector.bin"
    victim.parent.mkdir()
    victim.write_bytes(b"\x01" + bytes(64))
    before = victim.read_bytes()
    entry = f"file://{victim}"
    checkpoint = with_v2_checkpoint(root, {"storageType": "p", "pathOrInlineDv": entry, "offset": 1,
                                           "sizeInBytes": 36, "cardinality": 2}, sidecar)
    mark_unread(victim)
    err = refused(tmp_path / "run", capsys, root, "delta")
    assert unread(victim, before)
    assert entry in err and "outside the table" in err and (checkpoint.name in err or "_sidecars" in err), err
