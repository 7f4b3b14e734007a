"""File pruning terms derived from a checked ``where``: never more selective than DuckDB.

A ``where`` is evaluated row by row by DuckDB (the rendering of its checked
parse tree, :mod:`lineage.sql.expressions`). Before any file is opened, pyiceberg's
planner can skip data files whose partition values or column statistics rule
out every row, given a pyiceberg expression. That expression is built here
from the *same checked parse tree*, never from a second parse of the text, and
only from terms whose meaning is the same in both engines:

* ``column <op> literal`` (``=``, ``<>``, ``<``, ``<=``, ``>``, ``>=``,
  ``BETWEEN``, ``IN``) where the literal's type is exactly the column's kind:
  an integer literal (within the column's range) for an integer column, a
  string for a string column, a decimal with no more digits after the point
  than the column's scale for a decimal column, ``DATE '...'`` for a date
  column, ``TIMESTAMP '...'`` for a timestamp column without time zone, a
  boolean for a boolean column. DuckDB would cast anything else (``n > 2.6``
  on an integer column compares as decimals; pyiceberg would round 2.6 to 3),
  so anything else is not a term;
* on ``double`` columns only ``=``, ``<``, ``<=`` and ``IN`` of finite
  literals that a double holds exactly: DuckDB orders NaN above every number
  (``x > 5`` matches NaN) while Iceberg's bounds leave NaN out;
* ``IS NULL`` and ``IS NOT NULL`` on any data column;
* ``LIKE 'prefix%'`` and ``starts_with(column, 'prefix')`` on string columns
  when the prefix holds no ``%``, ``_`` or backslash (DuckDB's LIKE has no
  default escape character, so a backslash is an ordinary character there);
* ``AND`` of anything (a part that is not a term keeps every file), ``OR`` of
  terms only.

Everything else (NOT, functions, casts of columns, lineage columns, struct
fields, ILIKE, ...) gives :class:`AlwaysTrue`: every file is kept. A term may
only ever keep more files than needed, never fewer.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import math
from functools import lru_cache
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    LessThanOrEqual,
    NotEqualTo,
    NotNull,
    Or,
    StartsWith,
)

import lineage.duck as duck

_COMPARISONS = {
    "COMPARE_EQUAL": EqualTo,
    "COMPARE_NOTEQUAL": NotEqualTo,
    "COMPARE_LESSTHAN": LessThan,
    "COMPARE_LESSTHANOREQUALTO": LessThanOrEqual,
    "COMPARE_GREATERTHAN": GreaterThan,
    "COMPARE_GREATERTHANOREQUALTO": GreaterThanOrEqual,
}
_MIRRORED = {  # literal <op> column reads as column <mirrored op> literal
    "COMPARE_EQUAL": "COMPARE_EQUAL",
    "COMPARE_NOTEQUAL": "COMPARE_NOTEQUAL",
    "COMPARE_LESSTHAN": "COMPARE_GREATERTHAN",
    "COMPARE_LESSTHANOREQUALTO": "COMPARE_GREATERTHANOREQUALTO",
    "COMPARE_GREATERTHAN": "COMPARE_LESSTHAN",
    "COMPARE_GREATERTHANOREQUALTO": "COMPARE_LESSTHANOREQUALTO",
}
_DOUBLE_OPS = {"COMPARE_EQUAL", "COMPARE_LESSTHAN", "COMPARE_LESSTHANOREQUALTO"}  # NaN never satisfies these in DuckDB
_INTEGER_LITERALS = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT"}
_NO_TERM = object()  # a literal that cannot be a term for the column


def prune_expression(item: dict[str, Any], schema: pa.Schema, prunable: set[str]) -> BooleanExpression:
    """The pyiceberg expression that keeps every file which may hold a row ``item`` selects.

    ``item`` is the checked parse tree of a ``where`` (DuckDB's JSON form, as
    :attr:`lineage.sql.expressions.Checked.tree` holds it), ``schema`` the arrow
    schema it was checked against and ``prunable`` the names of the columns
    pyiceberg can bind (the table's own top-level data columns).
    """
    term = _term(item, schema, prunable)
    return AlwaysTrue() if term is None else term


def _term(node: dict[str, Any], schema: pa.Schema, prunable: set[str]) -> BooleanExpression | None:
    """A term for ``node``, or None: no term (keep every file)."""
    cls, kind = node.get("class"), node.get("type")
    if cls == "CONJUNCTION" and kind == "CONJUNCTION_AND":
        parts = [t for t in (_term(c, schema, prunable) for c in node.get("children") or []) if t is not None]
        return _fold(And, parts) if parts else None
    if cls == "CONJUNCTION" and kind == "CONJUNCTION_OR":
        parts = [_term(c, schema, prunable) for c in node.get("children") or []]
        return None if not parts or any(p is None for p in parts) else _fold(Or, parts)  # type: ignore[arg-type]
    if cls == "COMPARISON" and kind in _COMPARISONS:
        return _comparison(kind, node.get("left") or {}, node.get("right") or {}, schema, prunable)
    if cls == "BETWEEN":
        low = _comparison("COMPARE_GREATERTHANOREQUALTO", node.get("input") or {}, node.get("lower") or {}, schema, prunable)
        high = _comparison("COMPARE_LESSTHANOREQUALTO", node.get("input") or {}, node.get("upper") or {}, schema, prunable)
        parts = [t for t in (low, high) if t is not None]
        return _fold(And, parts) if parts else None
    if cls == "OPERATOR" and kind in ("OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL"):
        children = node.get("children") or []
        name = _column(children[0], prunable) if len(children) == 1 else None
        if name is None:
            return None
        return IsNull(name) if kind == "OPERATOR_IS_NULL" else NotNull(name)
    if cls == "OPERATOR" and kind == "COMPARE_IN":
        return _in(node.get("children") or [], schema, prunable)
    if cls == "FUNCTION":
        return _prefix(node, schema, prunable)
    return None


def _fold(op: type, parts: list[BooleanExpression]) -> BooleanExpression:
    out = parts[0]
    for p in parts[1:]:
        out = op(out, p)
    return out


def _column(node: dict[str, Any], prunable: set[str]) -> str | None:
    """The column ``node`` names, if it is a bare reference to a prunable column."""
    if node.get("class") != "COLUMN_REF":
        return None
    names = node.get("column_names") or []
    return names[0] if len(names) == 1 and names[0] in prunable else None


def _comparison(kind: str, left: dict[str, Any], right: dict[str, Any], schema: pa.Schema, prunable: set[str]) -> BooleanExpression | None:
    name = _column(left, prunable)
    if name is None:
        name, left, right, kind = _column(right, prunable), right, left, _MIRRORED[kind]
    if name is None:
        return None
    arrow_type = schema.field(name).type
    if pa.types.is_floating(arrow_type) and kind not in _DOUBLE_OPS:
        return None
    value = literal_for(right, arrow_type)
    return None if value is _NO_TERM else _COMPARISONS[kind](name, value)


def _in(children: list[dict[str, Any]], schema: pa.Schema, prunable: set[str]) -> BooleanExpression | None:
    name = _column(children[0], prunable) if children else None
    if name is None:
        return None
    arrow_type = schema.field(name).type
    values = []
    for child in children[1:]:
        if _is_null(child):
            continue  # x IN (1, NULL) selects what x IN (1) selects: NULL is never true
        value = literal_for(child, arrow_type)
        if value is _NO_TERM:
            return None
        values.append(value)
    return In(name, values) if values else None


def _prefix(node: dict[str, Any], schema: pa.Schema, prunable: set[str]) -> BooleanExpression | None:
    """``column LIKE 'abc%'`` or ``starts_with(column, 'abc')`` as StartsWith."""
    function = str(node.get("function_name", "")).lower()
    children = node.get("children") or []
    if function not in ("~~", "starts_with") or len(children) != 2:
        return None
    name = _column(children[0], prunable)
    if name is None or not _is_string(schema.field(name).type):
        return None
    pattern = _constant(children[1], "VARCHAR")
    if not isinstance(pattern, str):
        return None
    if function == "starts_with":
        return StartsWith(name, pattern) if pattern else None
    if "\\" in pattern or "_" in pattern:
        return None
    body = pattern.rstrip("%")
    if "%" in body:
        return None  # a wildcard inside: not a prefix
    if body == pattern:
        return EqualTo(name, pattern)  # no wildcard at all: LIKE is equality
    return StartsWith(name, body) if body else None


def _is_string(arrow_type: pa.DataType) -> bool:
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def _is_null(node: dict[str, Any]) -> bool:
    return node.get("class") == "CONSTANT" and bool((node.get("value") or {}).get("is_null"))


def _constant(node: dict[str, Any], type_id: str) -> object:
    """The value of a constant of DuckDB type ``type_id`` (``_NO_TERM`` for anything else)."""
    if node.get("class") != "CONSTANT":
        return _NO_TERM
    value = node.get("value") or {}
    if value.get("is_null") or (value.get("type") or {}).get("id") != type_id:
        return _NO_TERM
    return value.get("value")


def _cast_constant(node: dict[str, Any], type_id: str) -> str | None:
    """The text of ``CAST('text' AS <type_id>)`` (how DuckDB parses ``DATE '...'``), else None."""
    if node.get("class") != "CAST" or node.get("try_cast") or (node.get("cast_type") or {}).get("id") != type_id:
        return None
    text = _constant(node.get("child") or {}, "VARCHAR")
    return text if isinstance(text, str) else None


def literal_for(node: dict[str, Any], arrow_type: pa.DataType) -> object:
    """The Python value of the literal ``node`` if its type is exactly ``arrow_type``'s kind, else a sentinel.

    Exposed for tests; callers inside this module compare with ``_NO_TERM``.
    """
    if pa.types.is_integer(arrow_type):
        return _integer(node, arrow_type)
    if _is_string(arrow_type):
        value = _constant(node, "VARCHAR")
        return value if isinstance(value, str) else _NO_TERM
    if pa.types.is_boolean(arrow_type):
        return _cast_value(node, "BOOLEAN", bool)  # TRUE parses as CAST('t' AS BOOLEAN)
    if pa.types.is_decimal(arrow_type):
        return _decimal(node, arrow_type.scale)
    if pa.types.is_float64(arrow_type):
        return _double(node)
    if pa.types.is_date32(arrow_type):
        return _cast_value(node, "DATE", _dt.date)
    if pa.types.is_timestamp(arrow_type) and arrow_type.tz is None and arrow_type.unit == "us":
        value = _cast_value(node, "TIMESTAMP", _dt.datetime)
        return value if value is _NO_TERM or value.tzinfo is None else _NO_TERM  # type: ignore[union-attr]
    return _NO_TERM


def _integer(node: dict[str, Any], arrow_type: pa.DataType) -> object:
    if node.get("class") != "CONSTANT":
        return _NO_TERM
    value = node.get("value") or {}
    if value.get("is_null") or (value.get("type") or {}).get("id") not in _INTEGER_LITERALS:
        return _NO_TERM
    number = value.get("value")
    if isinstance(number, dict):  # HUGEINT: {"upper": ..., "lower": ...}
        try:
            number = (int(number["upper"]) << 64) + int(number["lower"])
        except (KeyError, TypeError, ValueError):
            return _NO_TERM
    if not isinstance(number, int) or isinstance(number, bool):
        return _NO_TERM
    info = _int_range(arrow_type)
    return number if info[0] <= number <= info[1] else _NO_TERM


def _int_range(arrow_type: pa.DataType) -> tuple[int, int]:
    bits = arrow_type.bit_width
    if pa.types.is_signed_integer(arrow_type):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def _decimal_of(node: dict[str, Any]) -> decimal.Decimal | None:
    """The value of a DECIMAL constant (DuckDB stores the unscaled integer and the scale)."""
    if node.get("class") != "CONSTANT":
        return None
    value = node.get("value") or {}
    kind = value.get("type") or {}
    if value.get("is_null") or kind.get("id") != "DECIMAL" or not isinstance(value.get("value"), int):
        return None
    scale = (kind.get("type_info") or {}).get("scale")
    if not isinstance(scale, int):
        return None
    return decimal.Decimal(value["value"]).scaleb(-scale)


def _decimal(node: dict[str, Any], scale: int) -> object:
    value = _decimal_of(node)
    if value is None:
        whole = _integer(node, pa.int64())
        return _NO_TERM if whole is _NO_TERM else decimal.Decimal(whole)  # type: ignore[arg-type]
    return value if -value.as_tuple().exponent <= scale else _NO_TERM  # type: ignore[operator]


def _double(node: dict[str, Any]) -> object:
    """A finite literal that a double holds exactly (so DuckDB's cast and Python's agree)."""
    if node.get("class") == "CAST":  # the checker renders every DOUBLE constant as CAST('...' AS DOUBLE)
        number = _cast_value(node, "DOUBLE", float)
    else:
        exact = _decimal_of(node)
        if exact is None:
            whole = _integer(node, pa.int64())
            exact = None if whole is _NO_TERM else decimal.Decimal(whole)  # type: ignore[arg-type]
        if exact is None or decimal.Decimal(float(exact)) != exact:
            return _NO_TERM
        number = float(exact)
    return number if isinstance(number, float) and math.isfinite(number) else _NO_TERM


def _cast_value(node: dict[str, Any], type_id: str, python_type: type) -> object:
    """The value DuckDB itself gives ``CAST('text' AS <type_id>)`` (``_NO_TERM`` if ``node`` is not one)."""
    text = _cast_constant(node, type_id)
    if text is None:
        return _NO_TERM
    value = _duckdb_cast(text, type_id)
    return value if isinstance(value, python_type) else _NO_TERM


@lru_cache(maxsize=4096)
def _duckdb_cast(text: str, type_id: str) -> object:
    with duck.scratch() as con:
        import duckdb  # loaded: the connection is open

        try:
            return con.execute(f"SELECT CAST(? AS {type_id})", [text]).fetchone()[0]  # type: ignore[index]
        except duckdb.Error:
            return None
