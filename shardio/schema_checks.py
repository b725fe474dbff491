"""A table's columns checked against what a job asks of them, before any row is read: each
feature column numeric (:func:`feature_columns` expands globs), the label integer, string or
boolean (:func:`check_label`), a filter's columns there and comparable (:func:`check_filter`).
:func:`shardio.tables.resolve` checks a table's schema, :mod:`shardio.reading` each piece's; the
errors are :class:`~iterreduce.exceptions.ShardError` naming the file (or table) and column."""

from __future__ import annotations

import difflib
import fnmatch

import pyarrow as pa

from iterreduce.exceptions import ShardError

from .columns import feature_kind, some_columns
from .filters import RowFilter
from .labels import is_label_type

#: The characters that make a ``features`` entry a glob (where no column has that name).
GLOB_CHARS = "*?["
#: What pyarrow raises when an expression does not fit the table's types.
EXPRESSION_ERRORS = (pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowInvalid)
#: Field metadata of a piece's schema: a column the table has and the piece's file lacks (written
#: before the column was added), null in the file's rows (:func:`shardio.reading._open_piece`).
ABSENT = b"iterreduce.absent"


def is_absent(schema: pa.Schema, name: str) -> bool:
    """Whether column ``name`` of a piece's schema is one its file lacks (:data:`ABSENT`)."""
    metadata = schema.field(name).metadata
    return bool(metadata) and ABSENT in metadata


def feature_columns(source, schema: pa.Schema, stored: list[str], where: str,
                     found_in=lambda name: "") -> list[str]:
    """The feature columns of ``source`` in ``schema``, each checked to be numeric. Each entry of
    ``source.features`` (one string, or each of a list) names a column or, where no column has
    that name and it holds a glob character, is a glob over ``stored`` (the file's own columns)
    in their order, leaving out the label and the columns an earlier entry gave. ``source``: a
    :class:`~shardio.tables.TableSource` (its ``features`` and ``label``)."""
    entries = source.features if isinstance(source.features, tuple) else (source.features,)
    present = set(schema.names)  # sets, not lists: a wide table has thousands of columns
    names: dict[str, None] = {}  # in order, each once
    for entry in entries:
        if entry in present or not any(char in entry for char in GLOB_CHARS):
            names[entry] = None
            continue
        matched = [name for name in stored if fnmatch.fnmatchcase(name, entry) and name != source.label]
        if not matched:
            raise ShardError(f"{where}: no column matches features = {entry!r} ({some_columns(stored)})")
        names.update(dict.fromkeys(name for name in matched if name not in names))
    names = list(names)
    for name in names:
        check_feature_type(schema, name, where, found_in)
    return names


def check_feature_type(schema: pa.Schema, name: str, where: str, found_in=lambda name: "") -> None:
    """Refuse column ``name`` of ``schema`` unless it holds features, naming its type (and where it
    is found); a column of strings is named as one of categories."""
    type_ = column_type(schema, name, where)
    if feature_kind(type_) is not None or is_absent(schema, name):  # an absent column: its rows are refused if used
        return
    found = found_in(name)
    categories = pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_dictionary(type_)
    hint = (": a column of categories; encode it as numbers first (one 0/1 column a category, as "
            "Spark ML's OneHotEncoder writes), or leave it out of the features" if categories else "")
    raise ShardError(f"{where}: feature column {name!r} is {type_}{f' ({found})' if found else ''}: "
                     f"features must be numbers (int, float, bool), lists of numbers, or Spark ML vectors{hint}")


def column_type(schema: pa.Schema, name: str, where: str) -> pa.DataType:
    """The type of column ``name`` of ``schema``; a name it lacks is an error with the closest names."""
    # get_field_index is a lookup (schema.names a new list: thousands of columns made this quadratic);
    # -1 also means a name twice, which schema.field refuses below.
    if schema.get_field_index(name) < 0 and name not in schema.names:
        close = difflib.get_close_matches(name, schema.names, n=3)
        hint = (f"did you mean {' or '.join(map(repr, close))}?" if close else some_columns(schema.names))
        raise ShardError(f"{where}: no column {name!r} ({hint})")
    return schema.field(name).type


def check_label(schema: pa.Schema, name: str, where: str, found_in=lambda name: "") -> None:
    """Refuse label column ``name`` of ``schema`` unless it holds classes (integers, strings, booleans)."""
    type_ = column_type(schema, name, where)
    if not is_label_type(type_) and not is_absent(schema, name):
        found = found_in(name)
        raise ShardError(f"{where}: label column {name!r} is {type_}{f' ({found})' if found else ''}: "
                         f"labels must be integers, strings or booleans (one value per class)")


def check_filter(rows: RowFilter, schema: pa.Schema, where: str) -> None:
    """Refuse a filter on a column ``schema`` lacks or comparing values of other types."""
    for name in rows.columns:
        column_type(schema, name, f"{where}: filter {rows.text!r}")
    try:  # pyarrow checks the types when it evaluates: on no rows, that is all it does
        schema.empty_table().filter(rows.expression)
    except EXPRESSION_ERRORS as exc:
        types = ", ".join(f"{name} is {schema.field(name).type}" for name in rows.columns)
        raise ShardError(f"{where}: filter {rows.text!r} compares values of different types ({types}): {exc}") from None
