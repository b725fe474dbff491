"""Row filters of a table source, e.g. ``year >= 2020 and country == 'NL'``: a small expression
language (comparisons of columns with literals, ``in``, ``is None``, ``and``, ``or``, ``not``)
parsed with Python's own parser into a pyarrow dataset expression, bounded in length and depth."""

from __future__ import annotations

import ast
import functools
import operator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from iterreduce.exceptions import TableError

_COMPARISONS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
                ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
#: the longest filter text read, and the deepest nesting of its parts (parentheses, not, and, or,
#: comparisons): a filter is a few conditions, and bounding it bounds the parser's time, memory and
#: recursion (Python's own parser and pyarrow's expressions recurse as deep as the text nests)
MAX_FILTER_CHARS = 10_000
MAX_FILTER_DEPTH = 50
#: what Python's parser and pyarrow raise for a text too deep, too large or of literals out of range
#: (a 30-digit integer, ``not`` nested 3000 deep): all become a TableError naming the filter
_PARSE_ERRORS = (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, OverflowError, pa.ArrowException)
_FILTER_HELP = ("a filter compares columns with literals (year >= 2020, country != 'NL', "
                "day in ('2024-01-01', '2024-01-02'), income is not None), joined by and, or, not; "
                "a column name that is not a Python name goes in backticks (`m 3` > 0)")


@dataclass(frozen=True, eq=False)
class RowFilter:
    """A filter parsed (:func:`row_filter`): its text, as a job file and a table's share hold it, the
    ``pyarrow.dataset`` expression and the columns it reads, in order of first use."""

    text: str
    expression: ds.Expression
    columns: tuple[str, ...]


#: parsed filters kept (a job has one or two; a few texts bound the memory)
_KEPT_FILTERS = 32


def row_filter(text: str) -> RowFilter:
    """The filter ``text`` parsed (:func:`parse_filter` says what it may hold): once a process for each
    text, however many places of a job read it (checking the source, its columns, the pieces to
    read, each piece's rows)."""
    if not isinstance(text, str):  # what FilterParser refuses, naming it, before any cache sees it
        FilterParser(text)
    return _parsed(text)


@functools.lru_cache(maxsize=_KEPT_FILTERS)
def _parsed(text: str) -> RowFilter:
    expression, columns = FilterParser(text).parse()
    return RowFilter(text, expression, tuple(columns))


def parse_filter(text: str) -> ds.Expression:
    """The ``pyarrow.dataset`` expression of a filter such as ``"year >= 2020 and country ==
    'NL'"``. Only comparisons (``== != < <= > >=``, chained too), ``in`` / ``not in`` a literal
    tuple or list, ``is None`` / ``is not None`` (a missing value: null, or NaN in a float
    column), ``and``, ``or``, ``not``, column names and literals (strings, numbers, booleans)
    are allowed; anything else raises :class:`TableError` naming the part. A column name that
    is not a Python name goes in backticks, as in pandas' ``query``: ```m 3` is not None``.
    The text is parsed, never evaluated."""
    return row_filter(text).expression


def filter_columns(text: str) -> list[str]:
    """The column names a filter reads, in order of first use."""
    return list(row_filter(text).columns)


class FilterParser:
    """Parses one filter text (see :func:`parse_filter`): any text gives an expression or a
    :class:`TableError` naming the filter."""

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise TableError(f"filter {text!r}: a {type(text).__name__}, not a text; {_FILTER_HELP}")
        if len(text) > MAX_FILTER_CHARS:
            raise TableError(f"filter {text[:40]!r}...: {len(text)} characters, at most {MAX_FILTER_CHARS} are read")
        self.text = text.strip()  # Python refuses leading blanks in an expression
        self.columns: list[str] = []
        # What Python parses: each `quoted name` replaced by a placeholder name (self.quoted: -> the name).
        self.source, self.quoted = self._unquote(self.text)

    def _unquote(self, text: str) -> tuple[str, dict[str, str]]:
        out, quoted, i, quote = [], {}, 0, None
        while i < len(text):
            char = text[i]
            if quote:  # inside a string literal: copied as it is
                out.append(text[i:i + 2] if char == "\\" else char)
                i += 2 if char == "\\" else 1
                quote = None if char == quote else quote
                continue
            if char == "`":
                end = text.find("`", i + 1)
                if end < 0 or end == i + 1:
                    raise TableError(f"filter {text!r}: {'an empty' if end > 0 else 'an unclosed'} `column name` "
                                     f"at character {i + 1}; {_FILTER_HELP}")
                placeholder = f"__column_{len(quoted)}__"
                quoted[placeholder] = text[i + 1:end]
                out.append(placeholder)
                i = end + 1
                continue
            quote = char if char in "'\"" else None
            out.append(char)
            i += 1
        return "".join(out), quoted

    def parse(self) -> tuple[ds.Expression, list[str]]:
        """The filter's expression and the columns it reads."""
        try:
            tree = ast.parse(self.source, mode="eval")
        except _PARSE_ERRORS as exc:  # SyntaxError; RecursionError or MemoryError for a text nested too deep
            why = (exc.msg if isinstance(exc, SyntaxError) else "nested too deep for Python's parser"
                   if isinstance(exc, (RecursionError, MemoryError)) else f"{type(exc).__name__}: {exc}")
            raise TableError(f"filter {self.text!r}: not an expression ({why}); {_FILTER_HELP}") from None
        depth = _depth(tree.body)
        if depth > MAX_FILTER_DEPTH:
            raise TableError(f"filter {self.text!r}: nested {depth} deep, at most {MAX_FILTER_DEPTH}; {_FILTER_HELP}")
        try:
            return self.condition(tree.body), list(dict.fromkeys(self.columns))
        except TableError:
            raise
        except _PARSE_ERRORS as exc:  # e.g. pyarrow's OverflowError for an integer beyond 64 bits
            raise TableError(f"filter {self.text!r}: cannot be read ({type(exc).__name__}: {exc}); "
                             f"{_FILTER_HELP}") from None

    def condition(self, node: ast.AST) -> ds.Expression:
        if isinstance(node, ast.BoolOp):
            join = operator.and_ if isinstance(node.op, ast.And) else operator.or_
            return _balanced(join, [self.condition(value) for value in node.values])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ~self.condition(node.operand)
        if isinstance(node, ast.Compare):  # a < b < c is a < b and b < c, as in Python
            lefts = [node.left, *node.comparators[:-1]]
            return _balanced(operator.and_, [self.comparison(left, op, right) for left, op, right
                                             in zip(lefts, node.ops, node.comparators)])
        raise self.not_allowed(node, "expected a comparison, 'and', 'or' or 'not'")

    def comparison(self, left: ast.AST, op: ast.cmpop, right: ast.AST) -> ds.Expression:
        if isinstance(op, (ast.In, ast.NotIn)):
            if not isinstance(left, ast.Name):
                raise self.not_allowed(left, "expected a column name before 'in'")
            test = self.operand(left).isin(self.literals(right))
            return ~test if isinstance(op, ast.NotIn) else test
        if isinstance(op, (ast.Is, ast.IsNot)):
            if not isinstance(left, ast.Name):
                raise self.not_allowed(left, "expected a column name before 'is'")
            if not (isinstance(right, ast.Constant) and right.value is None):
                raise self.not_allowed(right, "'is' and 'is not' take None: a missing value")
            missing = self.operand(left).is_null(nan_is_null=True)
            return ~missing if isinstance(op, ast.IsNot) else missing
        return _COMPARISONS[type(op)](self.operand(left), self.operand(right))

    def operand(self, node: ast.AST) -> ds.Expression:
        if isinstance(node, ast.Name):
            name = self.quoted.get(node.id, node.id)
            self.columns.append(name)
            return pc.field(name)
        return pc.scalar(self.literal(node))

    def literal(self, node: ast.AST):
        negative = isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub)
        value_node = node.operand if negative else node
        if isinstance(value_node, ast.Constant):
            value = value_node.value
            if type(value) in ((int, float) if negative else (str, int, float, bool)):
                value = -value if negative else value
                if type(value) is int and not -(1 << 63) <= value < (1 << 63):
                    raise self.not_allowed(node, "an integer beyond 64 bits (-2**63 to 2**63 - 1)")
                return value
        raise self.not_allowed(node, "expected a column name or a literal string, number or boolean")

    def literals(self, node: ast.AST) -> list:
        if not isinstance(node, (ast.Tuple, ast.List)) or not node.elts:
            raise self.not_allowed(node, "expected a non-empty tuple or list of literals after 'in'")
        values = [self.literal(element) for element in node.elts]
        if len({str if isinstance(v, str) else bool if isinstance(v, bool) else float for v in values}) > 1:
            raise self.not_allowed(node, "the values of an 'in' list must be all strings, all numbers or all booleans")
        return values

    def not_allowed(self, node: ast.AST, hint: str) -> TableError:
        """The error that names ``node``'s text in the filter, with ``hint``."""
        part = ast.get_source_segment(self.source, node) or type(node).__name__
        for placeholder, name in self.quoted.items():
            part = part.replace(placeholder, f"`{name}`")
        return TableError(f"filter {self.text!r}: {part!r} is not allowed here ({hint}); {_FILTER_HELP}")


def _depth(tree: ast.AST) -> int:
    """How deep ``tree``'s nodes nest (walked without recursion: the tree may be deeper than Python's stack)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _balanced(join, items: list):
    """``items`` joined by ``join`` as a balanced tree (a and b and ... of n terms nests log n deep,
    not n: pyarrow evaluates an expression by recursion)."""
    while len(items) > 1:
        items = [join(items[i], items[i + 1]) if i + 1 < len(items) else items[i] for i in range(0, len(items), 2)]
    return items[0]
