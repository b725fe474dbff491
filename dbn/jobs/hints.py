"""Job-file values and the type hints of the spec's fields: a value converted to (or refused by)
a field's hint, a command-line string parsed as TOML, a hint or a value named for an error."""

from __future__ import annotations

import datetime
import tomllib
import types
import typing
from typing import Any

def describe_value(value) -> str:
    """A value as an error names it, e.g. "integer 5"."""
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}
    return f"{kind.get(type(value), type(value).__name__)} {value!r}"


def members(hint) -> tuple:
    """The types a hint admits (the members of a union, else the hint itself)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def accepts(hint, kind) -> bool:
    """Whether ``hint`` admits values of ``kind``."""
    return any(m is kind or typing.get_origin(m) is kind for m in members(hint))


def parse_literal(text: str, nullable: bool):
    """A command-line value as TOML (5, 0.1, true, [1, 2], "x"); "a,b" as a list; else the text."""
    if nullable and text.lower() in ("none", "null"):
        return None
    for candidate in (text, f"[{text}]" if "," in text else None):
        if candidate is None:
            continue
        try:
            return tomllib.loads(f"v = {candidate}")["v"]
        except tomllib.TOMLDecodeError:
            pass
    return text


def quoted(text: str) -> str:
    """A string setting given quoted as in the job file (``--set 'job.name="run 1"'``) without
    its quotes; any other text as it is."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    return value if isinstance(value, str) else text


def convert(value, hint):
    """Return ``value`` converted to ``hint``, or raise TypeError(<what was expected>)."""
    if hint is Any:
        return value
    kinds = members(hint)
    if value is None:
        if type(None) in kinds:
            return None
        raise TypeError(hint_name(hint))
    for m in kinds:
        origin = typing.get_origin(m) or m
        if m is bool and isinstance(value, bool):
            return value
        if m is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if m is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if m is str and isinstance(value, str):
            return value
        if m is str and isinstance(value, (datetime.date, datetime.time)):  # TOML's unquoted times
            return value.isoformat()
        if origin in (list, tuple) and isinstance(value, (list, tuple)):
            return convert_list(value, m)
    raise TypeError(hint_name(hint))


def convert_list(value, hint):
    """A job file's array as the tuple ``hint`` stores, or raise TypeError(<what was expected>)."""
    args = [a for a in typing.get_args(hint) if a is not Ellipsis]
    if args == [str]:
        if all(isinstance(v, str) for v in value):
            return tuple(value)
        raise TypeError("an array of strings")
    if hint is tuple or args == [int]:  # hidden_layers (untyped, default a tuple of ints)
        if value and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            return tuple(value)
        raise TypeError("a non-empty array of positive integers")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return tuple(float(v) for v in value)
    raise TypeError("an array of numbers")


def hint_name(hint) -> str:
    """What a hint admits, in words, e.g. "an integer or none"."""
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "an array", tuple: "an array of positive integers", type(None): "none"}
    return " or ".join(names.get(typing.get_origin(m) or m, str(m)) for m in members(hint))
