"""Checks of write arguments: update expressions (validated, then typed against their column), and user commit properties."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

import lineage.sql.expressions as expressions
from lineage.duck import duckdb_types
from lineage.errors import InvalidArgumentError, SchemaMismatchError
from lineage.sql.predicate import expression_type
from lineage.storage.commit_log import USER_PROPERTY_PREFIXES


def check_user_properties(properties: Mapping[str, str] | None) -> dict[str, str]:
    """Commit properties a caller adds to a merge: strings under ``USER_PROPERTY_PREFIXES``."""
    if not properties:
        return {}
    if not isinstance(properties, Mapping):
        raise InvalidArgumentError(f"properties must be a mapping of strings, got {type(properties).__name__}")
    out = {}
    for k, v in properties.items():
        if not isinstance(k, str) or not k.startswith(USER_PROPERTY_PREFIXES):
            raise InvalidArgumentError(f"property {k!r} must start with one of {USER_PROPERTY_PREFIXES}")
        out[k] = str(v)
    return out


_TYPE_FAMILIES = {
    "numeric": ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
                "FLOAT", "DOUBLE", "DECIMAL"),
    "string": ("VARCHAR",),
    "time": ("DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "TIMESTAMP_NS", "TIMESTAMP_MS", "TIMESTAMP_S"),
    "boolean": ("BOOLEAN",),
    "binary": ("BLOB",),
}


def _family_of(duck_type: str) -> str:
    base = duck_type.split("(")[0].strip()
    for family, members in _TYPE_FAMILIES.items():
        if base in members:
            return family
    return duck_type


def _compatible(produced: str, expected: str) -> bool:
    """Whether a value of DuckDB type ``produced`` may be stored in a column of type ``expected``."""
    return produced in ('"NULL"', "NULL") or produced == expected or _family_of(produced) == _family_of(expected)


def check_expression(expr: str, schema: pa.Schema, column: str) -> str:
    """The checked SQL of ``set[column] = expr`` (:mod:`lineage.sql.expressions`), whose type fits the column.

    The returned text, DuckDB's rendering of the checked parse tree, is what
    the update runs; never ``expr`` itself.
    """
    import duckdb  # loaded with the first connection (lineage.duck)

    sql = expressions.check(expr, schema.names, f"set[{column!r}]").sql
    try:
        produced = expression_type(sql, schema)
    except duckdb.Error as exc:
        raise InvalidArgumentError(f"set[{column!r}] = {expr!r} is not a valid expression for this table: {exc}") from None
    expected = dict(duckdb_types(schema))[column]
    if expr.strip().upper() != "NULL" and not _compatible(produced, expected):  # DuckDB types a bare NULL as INTEGER
        raise SchemaMismatchError(f"set[{column!r}] = {expr!r} produces {produced}, but column {column!r} is {expected}")
    return sql
