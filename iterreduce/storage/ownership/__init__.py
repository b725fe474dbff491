"""Ownership of output folders: the runtime deletes, moves or overwrites only files it wrote
itself and can prove it, and one run at a time writes into an output folder.

Every rule is written once, over one interface to a folder (:mod:`.folders`: local disk, where
no link is followed at any depth, and any pyarrow file system, HDFS):

- :mod:`.locks`: the **lock** :data:`LOCK_NAME` of a run's output folder (:func:`hold`) or of a
  shard folder (:func:`shard_folder`): an exclusive ``flock`` on local disk, let go by the kernel
  however the process ends; on HDFS, where there is no ``flock``, the create-if-absent lock of
  :mod:`.remote_locks` (:func:`acquire_remote`). A second writer is refused at once
  (:class:`~iterreduce.exceptions.OutputBusy`) naming the folder and the holder (:mod:`.holders`).
- :mod:`.records`: the **run record** :data:`RECORD_NAME` in a run's output folder and in every
  ``previous/N``: the names a run claimed (written while it holds the lock) and, once it ends,
  every file it left under them with its size and time. An entry naming anything outside its
  folder, or a file without its size and time, is ignored with a warning.
- :mod:`.claims`: which file under a run's names is not provably the runtime's
  (:func:`foreign_file`, :func:`check_owned`: never moved, overwritten or deleted), claiming and
  settling names, deleting only what a record proves (:func:`remove_owned`).
- :mod:`.previous`: an earlier run's files kept in ``previous/N`` (:func:`set_aside`), pruned to
  the newest :data:`KEEP_PREVIOUS` (:func:`prune_previous`).
- :mod:`.inputs`: no input of a run lies inside what it may delete, move or overwrite
  (:func:`check_inputs_outside`).
- :mod:`.shardsets`: the **shard manifest** :data:`MANIFEST_NAME` beside a set of shards: a later
  write replaces only files it lists with the SHA-256 their bytes still have; a folder holding
  anything else is refused, touching no byte.

None of these is written, and nothing in a folder is deleted, through a symbolic link at any
depth; a link is never the runtime's. The lock and the record are never changed in place while
they share their bytes with another name through hard links (a folder copied with ``cp -al``):
they are replaced.
"""

from ...exceptions import OutputBusy
from .claims import check_owned, claim, foreign_file, remote_claim, remote_foreign, remove_owned, settle
from .folders import ArrowFolder, Entry, Folder, LocalFolder, check_not_link, folder_on
from .holders import describe_holder, ended_here, holder_text
from .inputs import check_inputs_outside, check_not_within, within
from .locks import hold, holder, shard_folder
from .names import BOOKKEEPING, LOCK_NAME, MANIFEST_NAME, PREVIOUS, RECORD_NAME, RUN_FILES, STALE_SUFFIX
from .previous import KEEP_PREVIOUS, prune_previous, remote_set_aside, set_aside
from .records import RunRecord
from .remote_locks import RemoteLock, acquire_remote, create_exclusive, shard_writer_running
from .shardsets import commit_shard, finish_shard_set, plain_name, read_manifest, set_shard_note, shard_note, start_shard_set

__all__ = [
    "ArrowFolder", "BOOKKEEPING", "Entry", "Folder", "KEEP_PREVIOUS", "LOCK_NAME", "LocalFolder", "MANIFEST_NAME",
    "OutputBusy", "PREVIOUS", "RECORD_NAME", "RUN_FILES", "RemoteLock", "RunRecord", "STALE_SUFFIX", "acquire_remote",
    "check_inputs_outside", "check_not_link", "commit_shard", "check_not_within", "check_owned", "claim", "create_exclusive", "describe_holder", "ended_here", "finish_shard_set",
    "folder_on", "foreign_file", "hold", "holder", "holder_text", "plain_name", "prune_previous", "read_manifest",
    "remote_claim", "remote_foreign", "remote_set_aside", "remove_owned", "set_aside", "set_shard_note", "settle",
    "shard_folder", "shard_note", "shard_writer_running", "start_shard_set", "within",
]
