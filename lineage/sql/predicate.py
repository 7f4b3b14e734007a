"""``where`` predicates: SQL text or pyiceberg expressions, checked and translated.

A predicate is evaluated row by row in DuckDB as SQL: the rendering of its
checked parse tree (:mod:`lineage.sql.expressions`), never the caller's text.
From the same checked tree, :mod:`lineage.sql.pruning` derives a pyiceberg
expression that prunes data files by partition values and column statistics
before any file is opened; it never skips a file holding a row DuckDB would
select.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import itertools
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
from pyiceberg.expressions import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNaN,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    NotEqualTo,
    NotIn,
    NotNaN,
    NotNull,
    NotStartsWith,
    Or,
    StartsWith,
)

import lineage.duck as duck

import lineage.sql.expressions as expressions
from lineage.errors import BadPredicateError
from lineage.sql.pruning import prune_expression


@dataclass(frozen=True)
class Predicate:
    """A validated predicate: SQL for DuckDB plus an optional pruning expression."""

    sql: str
    prune: BooleanExpression
    reads_floats: bool = False  # it reads a floating-point column: evaluate it with duck.seal(..., exact_floats=True)

    @property
    def is_true(self) -> bool:
        """Whether the predicate matches every row."""
        return self.sql == "TRUE"


def quote_ident(name: str) -> str:
    """Quote an identifier for DuckDB."""
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value: object) -> str:
    """Render a Python value as a DuckDB SQL literal."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float, decimal.Decimal)):
        return repr(value) if not isinstance(value, decimal.Decimal) else f"{value}"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (bytes, bytearray)):
        return "'" + "".join(f"\\x{b:02x}" for b in value) + "'::BLOB"
    if isinstance(value, _dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, _dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, uuid.UUID):
        return f"'{value}'::UUID"
    raise BadPredicateError(f"cannot use a value of type {type(value).__name__} in a predicate")


def _literal_value(lit: object) -> object:
    return getattr(lit, "value", lit)


def expression_to_sql(expr: BooleanExpression) -> str:
    """Translate an unbound pyiceberg expression to DuckDB SQL."""
    if isinstance(expr, AlwaysTrue):
        return "TRUE"
    if isinstance(expr, AlwaysFalse):
        return "FALSE"
    if isinstance(expr, And):
        return f"({expression_to_sql(expr.left)} AND {expression_to_sql(expr.right)})"
    if isinstance(expr, Or):
        return f"({expression_to_sql(expr.left)} OR {expression_to_sql(expr.right)})"
    if isinstance(expr, Not):
        return f"(NOT {expression_to_sql(expr.child)})"
    term = getattr(expr, "term", None)
    name = getattr(term, "name", None)
    if name is None:
        raise BadPredicateError(f"unsupported predicate {expr!r}: pass an unbound pyiceberg expression or a SQL string")
    col = quote_ident(name)
    unary = {IsNull: f"{col} IS NULL", NotNull: f"{col} IS NOT NULL", IsNaN: f"isnan({col})", NotNaN: f"NOT isnan({col})"}
    for cls, sql in unary.items():
        if isinstance(expr, cls):
            return f"({sql})"
    if isinstance(expr, (In, NotIn)):
        values = ", ".join(sql_literal(_literal_value(v)) for v in expr.literals)
        return f"({col} {'IN' if isinstance(expr, In) else 'NOT IN'} ({values}))"
    binary = {
        EqualTo: "=",
        NotEqualTo: "<>",
        LessThan: "<",
        LessThanOrEqual: "<=",
        GreaterThan: ">",
        GreaterThanOrEqual: ">=",
    }
    for cls, op in binary.items():
        if isinstance(expr, cls):
            return f"({col} {op} {sql_literal(_literal_value(expr.literal))})"
    if isinstance(expr, StartsWith):
        return f"starts_with({col}, {sql_literal(_literal_value(expr.literal))})"
    if isinstance(expr, NotStartsWith):
        return f"(NOT starts_with({col}, {sql_literal(_literal_value(expr.literal))}))"
    raise BadPredicateError(f"unsupported predicate {expr!r}")


def parse_predicate(where: str | BooleanExpression | None, schema: pa.Schema, prunable: Iterable[str] = ()) -> Predicate:
    """Validate ``where`` against ``schema`` (data plus lineage columns).

    SQL text goes through :func:`lineage.sql.expressions.check` (one scalar
    expression from the allow-list, re-rendered from DuckDB's parse tree);
    the returned ``sql`` is that rendering, never the caller's text. A
    pyiceberg expression is translated to SQL by :func:`expression_to_sql`
    and checked the same way. The file filter ``prune`` is derived from the
    same checked tree (:mod:`lineage.sql.pruning`), over the columns named in
    ``prunable`` (the table's own data columns; none: no file is skipped).
    Raises UnknownColumnError for columns the table lacks and
    BadPredicateError for anything that is not a single boolean expression
    of the allowed kind.
    """
    if where is None:
        return Predicate("TRUE", AlwaysTrue())
    if isinstance(where, BooleanExpression):
        text = expression_to_sql(where)
    elif isinstance(where, str):
        if not where.strip():
            raise BadPredicateError("where is an empty string; pass None to match every row")
        text = where
    else:
        raise BadPredicateError(f"where must be a SQL string or a pyiceberg expression, got {type(where).__name__}")
    checked = expressions.check(text, schema.names, "where")
    tree = json.loads(checked.tree)
    # DuckDB 1.5 types a bare NULL as INTEGER in DESCRIBE; as a where it is an unknown condition, matching nothing.
    if not (tree.get("type") == "VALUE_CONSTANT" and tree.get("value", {}).get("is_null")):
        _check_boolean(checked.sql, text, schema)
    floats = any(pa.types.is_floating(schema.field(c).type) for c in checked.columns if c in schema.names)
    return Predicate(checked.sql, prune_expression(tree, schema, set(prunable)), floats)


def prunable_columns(data_schema: pa.Schema) -> tuple[str, ...]:
    """The columns of a table's own schema that may prune files: top-level primitives whose name pyiceberg reads as one field."""
    return tuple(
        f.name for f in data_schema if "." not in f.name and not pa.types.is_nested(f.type) and not pa.types.is_dictionary(f.type)
    )


def expression_type(sql: str, schema: pa.Schema) -> str:
    """DuckDB's type for the checked expression ``sql`` over rows of ``schema``, without data.

    ``sql`` must come from :func:`lineage.sql.expressions.check`. DuckDB's own
    errors (a type mismatch) propagate as ``duckdb.Error``.
    """
    name = f"__probe_{next(_PROBES)}"
    with duck.scratch() as con:
        con.register(name, pa.Table.from_batches([], schema=schema))
        try:
            return str(con.execute(f"DESCRIBE SELECT {sql} AS p FROM {name}").fetchall()[0][1])
        finally:
            con.unregister(name)


_PROBES = itertools.count()


def _check_boolean(sql: str, text: str, schema: pa.Schema) -> None:
    import duckdb  # loaded with the first connection (lineage.duck)

    try:
        kind = expression_type(sql, schema)
    except duckdb.Error as exc:
        raise BadPredicateError(f"where {text!r} is not a valid boolean expression: {exc}") from None
    if kind not in ("BOOLEAN", '"NULL"', "NULL"):
        raise BadPredicateError(f"where {text!r} is of type {kind}, not a boolean condition (e.g. write `amount <> 0`)")
