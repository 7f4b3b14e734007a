"""``where`` predicates: SQL text or pyiceberg expressions, checked and translated.

A predicate is evaluated row by row in DuckDB as SQL. When it can also be read
as a pyiceberg expression it is used, in addition, to prune data files by
partition values and column statistics before any file is opened.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import uuid
from dataclasses import dataclass

import duckdb
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
from pyiceberg.expressions import parser as iceberg_parser

from lineage import duck
from lineage.errors import BadPredicateError, UnknownColumnError


@dataclass(frozen=True)
class Predicate:
    """A validated predicate: SQL for DuckDB plus an optional pruning expression."""

    sql: str
    prune: BooleanExpression

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


def parse_predicate(where: str | BooleanExpression | None, schema: pa.Schema) -> Predicate:
    """Validate ``where`` against ``schema`` (data plus lineage columns).

    Raises UnknownColumnError for columns the table lacks and BadPredicateError
    for anything that is not a single boolean SQL expression.
    """
    if where is None:
        return Predicate("TRUE", AlwaysTrue())
    if isinstance(where, BooleanExpression):
        sql = expression_to_sql(where)
        prune: BooleanExpression = where
    elif isinstance(where, str):
        if not where.strip():
            raise BadPredicateError("where is an empty string; pass None to match every row")
        sql = where
        try:
            prune = iceberg_parser.parse(where)
        except Exception:
            prune = AlwaysTrue()  # fine: DuckDB still evaluates it; we only lose file pruning
    else:
        raise BadPredicateError(f"where must be a SQL string or a pyiceberg expression, got {type(where).__name__}")
    _check_sql(sql, schema)
    return Predicate(sql, prune)


def expression_type(expr: str, schema: pa.Schema) -> str | None:
    """DuckDB's type for the SQL expression ``expr`` over rows of ``schema``, without data.

    ``None`` when ``expr`` is not a single expression (e.g. ``1); DROP ...``);
    DuckDB's own errors (unknown column, syntax) propagate as ``duckdb.Error``.
    """
    con = duck.connect()
    try:
        con.register("__probe", pa.Table.from_batches([], schema=schema))
        statement = f"SELECT ({expr}) AS p FROM __probe"
        if len(con.extract_statements(statement)) != 1:
            return None
        return str(con.execute(f"DESCRIBE {statement}").fetchall()[0][1])
    finally:
        con.close()


def _check_sql(sql: str, schema: pa.Schema) -> None:
    try:
        kind = expression_type(sql, schema)
    except duckdb.BinderException as exc:
        message = str(exc)
        if "not found" in message and ("column" in message.lower() or "Referenced" in message):
            raise UnknownColumnError(f"where {sql!r} names a column the table does not have: {message}") from None
        raise BadPredicateError(f"where {sql!r} is not a valid boolean expression: {message}") from None
    except duckdb.Error as exc:
        raise BadPredicateError(f"where {sql!r} is not a valid boolean expression: {exc}") from None
    if kind is None:
        raise BadPredicateError(f"where {sql!r} must be a single expression")
    if kind not in ("BOOLEAN", '"NULL"', "NULL"):
        raise BadPredicateError(f"where {sql!r} is of type {kind}, not a boolean condition (e.g. write `amount <> 0`)")
