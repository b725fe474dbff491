"""The one base of plain data (iterreduce.specification.Specification): every class on it reads back
what it writes, through JSON, and names an unknown key with the key meant."""

import json

import numpy as np
import pytest

from dbn.errors import ConfigError
from dbn.jobs.spec import JobSpec, load_spec
from dbn.model.scaler import Scaler
from iterreduce.master.config import MasterConfig
from iterreduce.specification import Specification
from shardio.labels import LabelMap
from shardio.pieces import Piece
from shardio.table_shard import TableShard
from shardio.tables import TableSource

SOURCE = TableSource("/data/t", ("f_*", "age"), label="y", filter="age > 3", stored_names=(("age", "Age"),))
PIECE = Piece("/data/t/part-0.parquet", 1, 100, 50, (("day", "int32", 3),), (4, 7))
EXAMPLES = [
    MasterConfig(program="p:P", program_config={"layers": (5, 3)}, shards=["s0", "s1"], workers=2, token="t",
                 output="/out", min_workers=1),
    SOURCE,
    PIECE,
    TableShard(SOURCE, (PIECE,), 6, LabelMap(("a", "b")), (5, 1), uri="hdfs://nn/x.table.json"),
    LabelMap((0, 1, 2)),
    Scaler("min_max", np.array([0.5, 1.0]), np.array([2.0, 0.25])),
    load_spec(None),
]


@pytest.mark.parametrize("value", EXAMPLES, ids=[type(e).__name__ for e in EXAMPLES])
def test_every_specification_reads_back_what_it_writes_through_json(value):
    assert isinstance(value, Specification)
    written = value.to_dict()
    again = type(value).from_dict(json.loads(json.dumps(written)))
    assert again.to_dict() == written


def test_a_field_that_is_not_saved_stays_out_of_the_dict():
    share = EXAMPLES[3]
    assert "uri" not in share.to_dict() and share.uri == "hdfs://nn/x.table.json"


@pytest.mark.parametrize("kind, d, message", [
    (MasterConfig, {"wrokers": 2}, "job file: unknown key 'wrokers' (did you mean 'workers'?)"),
    (TableSource, {"uri": "/t", "features": "x", "lable": "y"}, "table source: unknown key 'lable' (did you mean 'label'?)"),
    (TableSource, {"uri": "/t"}, "table source: missing key 'features'"),
    (MasterConfig, ["a list"], "job file: expected a JSON object (a mapping of keys) of MasterConfig settings, got list"),
])
def test_keys_are_checked_on_the_way_in_naming_the_key(kind, d, message):
    with pytest.raises(kind.error) as err:
        kind.from_dict(d)
    assert str(err.value) == message


def test_a_job_files_key_in_the_wrong_section_names_the_section_it_belongs_in():
    doc = load_spec(None).to_dict()
    doc["model"]["workers"] = 3
    with pytest.raises(ConfigError, match=r"^job\.json: \[model\] unknown key 'workers' \(it belongs in \[cluster\]\)$"):
        JobSpec.from_dict(doc, origin="job.json")
