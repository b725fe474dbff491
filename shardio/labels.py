"""The classes of a label column: :class:`LabelMap` maps label values (integers, strings,
booleans, categorical) to class indices 0..K-1 and back; shards and tables keep it with their rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iterreduce.exceptions import ShardError, TableError
from iterreduce.specification import Specification


@dataclass(frozen=True)
class LabelMap(Specification):
    """The classes of a label column, sorted; class i is ``classes[i]``. Integer labels
    0..K-1 are their own classes; other values map to their place in the sorted classes."""

    classes: tuple

    def __post_init__(self):
        classes = tuple(self.classes)
        object.__setattr__(self, "classes", classes)
        if not classes:
            raise TableError("label classes: none (an empty label column?)")
        ints = all(isinstance(c, int) and not isinstance(c, bool) for c in classes)
        if not ints and not all(isinstance(c, str) for c in classes):
            raise TableError(f"label classes must be all integers or all strings, got {list(classes)[:10]!r}")
        if any(a >= b for a, b in zip(classes, classes[1:])):
            raise TableError("label classes must be sorted and distinct")

    def __len__(self) -> int:
        return len(self.classes)

    @property
    def _type(self) -> pa.DataType:
        return pa.string() if isinstance(self.classes[0], str) else pa.int64()

    def encode(self, values, where: str = "labels") -> np.ndarray:
        """The int64 class of each value (a pyarrow or NumPy array, or a list); a value that is
        not a class, or a null, raises :class:`ShardError` naming it."""
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if not isinstance(values, pa.Array):
            values = pa.array(np.asarray(values).tolist() if isinstance(values, np.ndarray) else values)
        values = label_values(values)
        strings = isinstance(self.classes[0], str)
        if len(values) and not (is_label_type(values.type) and strings != pa.types.is_integer(values.type)):
            raise ShardError(f"{where}: labels of type {values.type}, but the classes are "
                             f"{'strings' if strings else 'integers'}")
        found = pc.index_in(values.cast(self._type), value_set=pa.array(self.classes, self._type))
        if found.null_count:
            first = int(np.argmax(found.is_null().to_numpy(zero_copy_only=False)))
            raise ShardError(f"{where}: label {values[first].as_py()!r} (at {first}) is not one of the "
                             f"{len(self)} classes {_some_classes(self.classes)}")
        return found.to_numpy().astype(np.int64)

    def decode(self, indices) -> np.ndarray:
        """The label value of each class index (the inverse of :meth:`encode`)."""
        indices = np.asarray(indices)
        if indices.size and (indices.dtype.kind not in "iu" or indices.min() < 0 or indices.max() >= len(self)):
            raise TableError(f"class indices must be integers in 0..{len(self) - 1}")
        return np.asarray(self.classes)[indices]

    @classmethod
    def from_dict(cls, d: dict) -> LabelMap:
        """The map :meth:`to_dict` wrote."""
        if not isinstance(d, dict) or set(d) != {"classes"} or not isinstance(d["classes"], list):
            raise TableError(f"label map: expected {{'classes': [...]}}, got {d!r}")
        return cls(tuple(d["classes"]))


def _some_classes(classes: tuple, shown: int = 10) -> str:
    return repr(list(classes[:shown]))[:-1] + (", ...]" if len(classes) > shown else "]")


def is_label_type(type_: pa.DataType) -> bool:
    """Whether a column of ``type_`` can hold labels: integers, booleans or strings (categorical too)."""
    if pa.types.is_dictionary(type_):  # categorical: judged by its values
        type_ = type_.value_type
    return (pa.types.is_integer(type_) or pa.types.is_boolean(type_) or pa.types.is_string(type_)
            or pa.types.is_large_string(type_))


def label_values(column: pa.Array) -> pa.Array:
    """A label column's values as classes are made of: a categorical one decoded, booleans
    (a yes/no outcome) as the integers 0 and 1, as NumPy reads them from a .npz."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column.cast(pa.int64()) if pa.types.is_boolean(column.type) else column
