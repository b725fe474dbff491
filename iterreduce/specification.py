"""Plain data read and written one way: dataclasses with :class:`Specification` as their base, as
skein's ``Specification`` is for its specs. A section of settings (the master's job file, a table
source, a job file's section) is one, and so is what a run saves to read back (a table's share, a
model's label map and scaler).

A field may say what it means (:func:`setting`: read by the generated references, written once).
:meth:`Specification.from_dict` refuses a key the class does not have, naming it (and the key
meant, when one is close) and where it came from, and a missing one; :meth:`Specification.to_dict`
writes what ``from_dict`` reads back, in plain JSON types.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar


def setting(default: Any = dataclasses.MISSING, *, help: str, **field_options) -> Any:
    """A dataclass field of a settings section, with what it means (``help``): written once, here,
    and read by :meth:`Specification.help` (the job file's reference, the command line)."""
    return dataclasses.field(default=default, metadata={"help": help}, **field_options)


def unsaved(default: Any, **field_options) -> Any:
    """A dataclass field that :meth:`Specification.to_dict` leaves out (e.g. where a file was read
    from) and that equality ignores."""
    return dataclasses.field(default=default, compare=False, metadata={"unsaved": True}, **field_options)


def plain(value: Any) -> Any:
    """``value`` in JSON's types: tuples as lists, sections as dicts, NumPy arrays as lists."""
    if isinstance(value, Specification):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # a NumPy array or scalar
        return value.tolist()
    return value


def did_you_mean(word: str, choices) -> str:
    """``" (did you mean 'x'?)"`` with the choice closest to ``word``; "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def counted_names(kind: str, names) -> str:
    """``"key 'a'"`` or ``"keys 'a', 'b'"``: names in a message, as Python writes them."""
    names = list(names)
    return f"{kind}{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"


class Specification:
    """The base of plain data (a dataclass): one way to read it from a dict (a JSON object, a TOML
    table) with its keys checked, and to write it back."""

    #: what a section's bad keys raise (a subclass names its own kind of error)
    error: ClassVar[type[Exception]] = ValueError
    #: where a section's dict comes from, in errors, unless :meth:`from_dict` is told
    source_name: ClassVar[str] = "settings"

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The keys, in their order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def help(cls, name: str) -> str:
        """What setting ``name`` means ("" where :func:`setting` gave it no meaning)."""
        field = next((f for f in dataclasses.fields(cls) if f.name == name), None)
        return "" if field is None else field.metadata.get("help", "")

    @classmethod
    def close_key(cls, key: str) -> str:
        """The hint after an unknown ``key``: the key it may be a typo of."""
        return did_you_mean(key, cls.names())

    @classmethod
    def check_keys(cls, d: Any, where: str, hint: Callable[[str], str] | None = None,
                   required: bool = True) -> None:
        """Raise :attr:`error` when ``d`` is not a mapping, holds a key the section does not have
        (a typo must not be silently ignored) or, with ``required``, lacks one without a default;
        ``where`` begins the message (``"job.json:"``), ``hint`` says more about one unknown key
        (:meth:`close_key` by default)."""
        if not isinstance(d, Mapping):
            raise cls.error(f"{where} expected a JSON object (a mapping of keys) of {cls.__name__} settings, "
                            f"got {type(d).__name__}")
        unknown = sorted(set(d) - set(cls.names()))
        if unknown:
            more = (hint or cls.close_key)(unknown[0]) if len(unknown) == 1 else ""
            raise cls.error(f"{where} unknown {counted_names('key', unknown)}{more}")
        if required:
            needed = [f.name for f in dataclasses.fields(cls)
                      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
            missing = sorted(set(needed) - set(d))
            if missing:
                raise cls.error(f"{where} missing {counted_names('key', missing)}")

    @classmethod
    def from_dict(cls, d: Mapping, source: str | None = None):
        """The section of ``d`` (as :meth:`to_dict` writes it, a JSON or TOML file's), its keys
        checked (:meth:`check_keys`); ``source`` names where it came from in errors
        (:attr:`source_name` by default)."""
        cls.check_keys(d, f"{source or cls.source_name}:")
        return cls(**d)

    def to_dict(self) -> dict:
        """The settings as a JSON-friendly dict (what :meth:`from_dict` reads back)."""
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self) if not f.metadata.get("unsaved")}
