"""Fuzz tests (hypothesis) of the inputs a user writes: row filters and job files.

- the row filter parser (``shardio.filters.row_filter``) and the check of a filter against a
  table's types (``shardio.schema_checks.check_filter``, where pyarrow evaluates it): column
  names, literals and operators in any order, random text, and nesting thousands deep;
- the job file reader (``dbn.jobs.spec.load_spec``): TOML of known and unknown sections,
  keys and values of any type, maybe mutated; TOML that nests deep or holds huge numbers;
  random bytes.

Any input gives either a well-formed result (an expression over the table's columns; a
``JobSpec`` whose job's name is a safe file name) or the project's own error (``TableError``
or ``ShardError`` naming the filter; a ``DBNError`` naming the file, the section or the
option), never another exception and never a hang. Rare finds are kept as explicit examples.
The harness and the profiles (``HYPOTHESIS_PROFILE``): ``tests/fuzzing.py``.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from hypothesis import example, given
from hypothesis import strategies as st

from dbn.errors import DBNError
from fuzzing import Sample, fuzz, mutated, outcome, within
from iterreduce.exceptions import ShardError

# ====================================================================== filters

FILTER_COLUMNS = ["a", "b", "c", "`m 3`", "`x`", "`", "None", "True", "__column_0__"]
FILTER_LITERALS = st.one_of(
    st.integers(-(2**70), 2**70).map(str), st.floats(allow_nan=False).map(repr), st.sampled_from(
        ["'NL'", '"x"', "'\\x00'", "True", "None", "1e999", "-1", "0x10", "1_000", "'", "b'x'", "f'{a}'", "...",
         "1" * 30, "9" * 5000, "2**70", "[]", "()", "(1,)", "[1, 'x']", "{1}", "lambda: 1", "__import__('os')"]))
FILTER_OPS = ["==", "!=", "<", "<=", ">", ">=", "in", "not in", "is", "is not", "and", "or", "not", "+", "-", "*",
              "(", ")", "[", "]", ",", ":", "=", ";", "\n", "\\", "#", "@", "if", "else", "`"]


@st.composite
def filter_texts(draw) -> str:
    """Filter texts: sequences of column names, literals and operators (often valid, more often
    not), random text, and prefixes repeated thousands of times (deep nesting)."""
    kind = draw(st.sampled_from(["valid", "tokens", "tokens", "text", "deep"]))
    if kind == "valid":  # conditions joined by and, or, not: mostly parsed, some of mismatched types
        conditions = draw(st.lists(st.tuples(st.sampled_from(FILTER_COLUMNS[:5]), st.sampled_from(FILTER_OPS[:6]),
                                             FILTER_LITERALS), min_size=1, max_size=4))
        joins = draw(st.lists(st.sampled_from([" and ", " or ", " and not ", " or not "]),
                              min_size=len(conditions), max_size=len(conditions)))
        return "".join(f"{join if i else ''}{' '.join(c)}" for i, (join, c) in enumerate(zip(joins, conditions)))
    if kind == "text":
        return draw(st.text(max_size=80))
    if kind == "deep":
        prefix = draw(st.sampled_from(["not ", "-", "(", "[", "~", "a < ", "not (", "a == 1 and ", "a in ("]))
        return prefix * draw(st.integers(0, 4000)) + draw(st.sampled_from(["a == 1", "1", "a", ""]))
    parts = draw(st.lists(st.one_of(st.sampled_from(FILTER_COLUMNS), FILTER_LITERALS, st.sampled_from(FILTER_OPS)),
                          max_size=12))
    return " ".join(parts)


FILTER_SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.float64()), ("c", pa.string()), ("m 3", pa.int8()),
                           ("x", pa.bool_())])


@fuzz()
@given(text=filter_texts())
@example(text="a == " + "1" * 30)             # OverflowError escaped (issue 36)
@example(text="not " * 3000 + "a == 1")       # RecursionError escaped (issue 36)
@example(text="not " * 2400 + "a == 1")       # within the length limit: Python's parser recursion
@example(text="-" * 9000 + "1 == a")          # MemoryError from Python's parser
@example(text="a == 1 and " * 900 + "a == 1")  # a long flat chain: nested log n deep, not n
@example(text="a == 18446744073709551615")    # a uint64 literal pyarrow refuses
def test_filter_parser_gives_an_expression_or_a_table_error(text):
    """``row_filter`` (the parse) and the check against a table's types (where pyarrow evaluates
    the expression): any text gives a result or the runtime's own error naming the filter."""
    from shardio import filters, schema_checks, tables
    from iterreduce.exceptions import IterReduceError

    try:
        with within("parse_filter"):
            rows = filters.row_filter(text)
            expression, columns = rows.expression, rows.columns
            schema_checks.check_filter(rows, FILTER_SCHEMA, "table")
    except IterReduceError as exc:  # TableError for the text; ShardError for columns or types the table lacks
        assert isinstance(exc, (tables.TableError, ShardError)), type(exc)
        assert "filter" in str(exc), str(exc)
        outcome(exc)
        return
    outcome("parsed")
    assert isinstance(expression, pa.compute.Expression) and set(columns) <= set(FILTER_SCHEMA.names)


# ====================================================================== job files

JOB_KEYS = {
    "data": ["train", "test", "mnist_dir", "limit", "features", "label", "filter", "format", "scale", "nonsense"],
    "model": ["hidden_layers", "pretrain_epochs", "finetune_epochs", "dropout", "cd_k", "pretrain_learning_rate",
              "visible", "pretrain_batch_size", "early_stopping_patience", "seed", "callback"],
    "output": ["dir", "plots", "checkpoint_every"],
    "job": ["name", "seed", "device"],
    "cluster": ["workers", "shards", "reduce", "stream", "heartbeat_timeout", "sync_every", "max_restarts"],
    "yarn": ["queue", "worker_memory", "worker_vcores", "keytab", "file_systems", "max_attempts"],
    "source": ["x"], "nonsense": ["x"], "": ["x"],
}
TOML_SCALARS = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, -1, 2**63 - 1, 10**18]), st.floats(),
    st.booleans(), st.text(max_size=8),
    st.sampled_from(["mnist", "../../etc", "a/b", "..", "run 1", "x*", "a == 1", "not " * 3000 + "a == 1",
                     "a == " + "1" * 30, "hdfs://nn/x", "cpu", "gpu", "auto", "workers", "master", "", "\x00"]))
TOML_VALUES = st.recursive(TOML_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=3), inner, max_size=2), max_leaves=5)


@st.composite
def job_files(draw) -> Sample:
    """The bytes of a job file: TOML of known and unknown sections, keys and values of any type,
    maybe mutated; or TOML text that nests deep or holds huge numbers; or random bytes."""
    kind = draw(st.sampled_from(["toml", "toml", "toml", "deep", "bytes"]))
    if kind == "bytes":
        data = draw(st.binary(max_size=200))
        return Sample(data, f"bytes {data!r}")
    if kind == "deep":
        text = draw(st.sampled_from(["a = " + "[" * 3000, "[model]\nhidden_layers = " + "[" * 500 + "]" * 500,
                                     "x = " + "{y=" * 2000, "[data]\nlimit = 1" + "0" * 5000, "[data]\nlimit = 1e99999",
                                     "[" + "a." * 5000 + "b]", "[model]\n" + "cd_k = 1\n" * 3]))
        return Sample(text.encode(), f"text {text[:60]!r}")
    doc = {}
    for section in draw(st.lists(st.sampled_from(sorted(JOB_KEYS)), max_size=4, unique=True)):
        keys = draw(st.lists(st.sampled_from(JOB_KEYS[section]) | st.text(max_size=5), max_size=4, unique=True))
        doc[section] = {key: draw(TOML_VALUES) for key in keys}
    import tomli_w

    data = tomli_w.dumps(doc).encode()
    how = f"TOML {doc!r}"[:300]
    if draw(st.integers(0, 3)) == 0:
        data, mutation = draw(mutated(data))
        how += f", {mutation}"
    return Sample(data, how)


@fuzz()
@given(sample=job_files())
@example(sample=Sample(b"a = " + b"[" * 3000, "arrays nested 3000 deep"))  # RecursionError escaped tomllib
@example(sample=Sample(b"[data]\nlimit = 1" + b"0" * 5000, "a 5001-digit integer"))  # ValueError escaped
@example(sample=Sample(b'[job]\nname = "../../outside"', "a name that leaves the output folder"))
def test_job_file_reader_gives_a_spec_or_a_config_error(sample, tmp_path_factory):
    """``dbn.jobs.spec.load_spec``: any bytes give a JobSpec whose job's name is a safe file name,
    or a DBNError (ConfigError) naming the file, the section or the option at fault."""
    from dbn.jobs import spec as job_spec

    path = tmp_path_factory.mktemp("jobs", numbered=True) / "job.toml"
    path.write_bytes(sample.data)
    try:
        with within(f"load_spec({str(path)!r})"):
            loaded = job_spec.load_spec(path)
    except DBNError as exc:
        assert str(exc).strip()
        assert str(path) in str(exc) or str(exc).startswith("[job] name"), str(exc)
        outcome(exc, str(path))
        return
    outcome("loaded")
    assert isinstance(loaded, job_spec.JobSpec)
    assert job_spec.name_problem(loaded.job.name) is None
    assert Path(loaded.output.dir).name  # runs/<name>: a folder of its own
