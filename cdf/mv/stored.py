"""A view's stored definition, checked whole before any of it can run.

The definition lives in the view table's properties (``mv.definition``, and
``mv.source`` naming the source table). Anyone who can commit to the view
table can edit them, and the refresh builds SQL from the definition (DuckDB
SQL on the library's own connection, Spark SQL on the user's session). So
when a view is opened every field is checked against what the library itself
can have written, and the view is refused with a :class:`ViewQueryError`
naming the view, the field, the stored value and what is allowed:

* closed sets: ``shape`` is one of :data:`~cdf.mv.query.SHAPES`, each column's
  ``kind`` one of :data:`~cdf.mv.query.KINDS` (and ``expr`` only in a
  projection view), the format and its version are known, no field is
  unknown, every field has its JSON type;
* SQL fragments: each DuckDB fragment goes through the expression validator
  and is used in its re-rendered form; each Spark fragment is parsed, checked
  through its DuckDB rendering and re-rendered (one that fails, or is missing
  where its DuckDB twin is present, makes the view not refreshable with
  Spark); type names must be exactly one DuckDB type;
* the view table: the definition's columns (with the key and helper columns
  of its shape) must be the view table's columns, in order, and each stored
  type must be stored as the view table stores that column;
* the source table (:func:`check_source`, when a refresh opens it): every
  stored source column must be a data column of the source.

Nothing of a refused value reaches SQL: aggregates are named through
:data:`~cdf.mv.query.SQL_FUNCTIONS`, never through the stored ``kind``.
"""

from __future__ import annotations

import json
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot
from sqlglot.errors import SqlglotError

from cdf.mv.query import (
    DEFINITION_FORMAT,
    DEFINITION_VERSION,
    KINDS,
    SHAPES,
    ViewColumn,
    ViewQuery,
    ViewQueryError,
    _checked,
    _render,
    name_problem,
)
from cdf.mv.sql import esc
import lineage.duck as duck
from lineage.properties import MV_DEFINITION, MV_SOURCE
import lineage.sql.expressions as expressions
from lineage.catalog import identifier
from lineage.errors import InvalidArgumentError, UnsupportedFormatError
from lineage.iceberg.schema import arrow_schema, iceberg_schema

PROP_DEFINITION = MV_DEFINITION
PROP_SOURCE = MV_SOURCE

_FIELDS = frozenset({"format", "format-version", "query", "shape", "columns", "where", "source-columns", "spark-ok", "spark-problem",
                     "types"})
_COLUMN_FIELDS = frozenset({"name", "kind", "duckdb", "spark"})


def load(view: str, properties: dict[str, str], schema: pa.Schema) -> ViewQuery:
    """The definition stored in ``properties`` of the view table ``view`` (whose Arrow schema is ``schema``), checked whole."""
    raw = properties.get(PROP_DEFINITION)
    if raw is None:
        raise ViewQueryError(f"view {view}: the table has no {PROP_DEFINITION} property")
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise _refused(view, f"it is not valid JSON ({type(exc).__name__}: {_shown(str(exc))})") from None
    if not isinstance(obj, dict) or obj.get("format") != DEFINITION_FORMAT:
        raise _refused(view, f"it is not a materialized-view definition (format {_shown(obj.get('format') if isinstance(obj, dict) else obj)})")
    version = obj.get("format-version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _refused(view, _field("format-version", version, "a whole number from 1"))
    if version > DEFINITION_VERSION:
        raise UnsupportedFormatError(
            f"view {view}: the definition has format version {version}; this release reads up to {DEFINITION_VERSION} (upgrade the library)"
        )
    source = properties.get(PROP_SOURCE)
    try:
        identifier(source)  # type: ignore[arg-type]
    except InvalidArgumentError:
        raise _refused(view, _field(f"the table property {PROP_SOURCE}", source, "the source table's name, namespace.table")) from None
    _check_fields(view, obj)
    query = _rechecked(view, obj)
    _check_storage(view, query, schema)
    return query


def check_source(view: str, query: ViewQuery, source: str, columns: list[str]) -> None:
    """Refuse the view if it reads a column that the source table ``source`` (data columns ``columns``) does not have."""
    missing = [c for c in query.source_columns if c not in columns]
    if missing:
        raise _refused(
            view, f"source-columns names {_shown(missing)}, which the source table {source} does not have (its columns: {columns}); "
            "a source column the view reads was dropped or renamed: recreate the view"
        )


# ---------------------------------------------------------------- fields and their closed sets


def _refused(view: str, why: str) -> ViewQueryError:
    return ViewQueryError(f"view {view}: the stored definition (table property {PROP_DEFINITION}) is refused: {why}")


def _shown(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _field(name: str, value: object, allowed: str) -> str:
    return f"{name} is {_shown(value)}; allowed: {allowed}"


def _is_text(value: object, nullable: bool = False) -> bool:
    return (value is None and nullable) or (isinstance(value, str) and "\x00" not in value)


def _check_fields(view: str, obj: dict[str, Any]) -> None:
    """Every field of the definition has its JSON type and a value from its closed set."""
    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        raise _refused(view, f"it has fields this release does not know: {_shown(unknown)}")
    checks: list[tuple[str, object, bool, str]] = [
        ("query", obj.get("query"), _is_text(obj.get("query")), "the view's SQL text"),
        ("shape", obj.get("shape"), obj.get("shape") in SHAPES, ", ".join(SHAPES)),
        ("spark-ok", obj.get("spark-ok", True), isinstance(obj.get("spark-ok", True), bool), "true or false"),
        ("spark-problem", obj.get("spark-problem"), _is_text(obj.get("spark-problem"), nullable=True), "a text or null"),
    ]
    where = obj.get("where")
    ok = isinstance(where, dict) and set(where) == {"duckdb", "spark"} and all(_is_text(v, nullable=True) for v in where.values())
    checks.append(("where", where, ok, 'an object {"duckdb": SQL or null, "spark": SQL or null}'))
    used = obj.get("source-columns")
    ok = isinstance(used, list) and all(_is_text(c) and c for c in used) and len(set(used)) == len(used)
    checks.append(("source-columns", used, ok, "a list of distinct column names"))
    types = obj.get("types", {})
    ok = isinstance(types, dict) and all(_is_text(k) and _is_text(v) for k, v in types.items())
    checks.append(("types", types, ok, "an object of column name: DuckDB type"))
    columns = obj.get("columns")
    ok = isinstance(columns, list) and bool(columns) and all(isinstance(c, dict) for c in columns)
    checks.append(("columns", columns, ok, 'a non-empty list of {"name", "kind", "duckdb", "spark"} objects'))
    for name, value, good, allowed in checks:
        if not good:
            raise _refused(view, _field(name, value, allowed))
    projection = obj["shape"] == "projection"
    for i, c in enumerate(columns):
        kinds = ("expr",) if projection else KINDS
        at = f"columns[{i}]"
        if set(c) != _COLUMN_FIELDS:
            raise _refused(view, f"{at} has the fields {_shown(sorted(c))}; allowed: exactly {sorted(_COLUMN_FIELDS)}")
        if not _is_text(c["name"]) or not c["name"]:
            raise _refused(view, _field(f"{at}.name", c["name"], "a column name"))
        if c["kind"] not in kinds:
            shape = f" (in a {obj['shape']} view)" if projection else ""
            raise _refused(view, _field(f"{at}.kind", c["kind"], ", ".join(kinds) + shape))
        star = c["kind"] == "count_star"
        for dialect in ("duckdb", "spark"):
            value = c[dialect]
            good = value is None if star else _is_text(value, nullable=dialect == "spark")
            if not good:
                raise _refused(view, _field(f"{at}.{dialect}", value, "null for COUNT(*)" if star else "an SQL expression"))
    problem = name_problem([c["name"] for c in columns])
    if problem:
        raise _refused(view, problem)


# ---------------------------------------------------------------- SQL fragments


def _rechecked(view: str, obj: dict[str, Any]) -> ViewQuery:
    """The definition with every SQL fragment checked again; only the re-rendered fragments are kept."""
    used = tuple(obj["source-columns"])
    spark_problem = obj.get("spark-problem")

    def duck_sql(sql: str | None, what: str) -> str | None:
        try:
            return None if sql is None else expressions.check(sql, used, f"the stored {what}").sql
        except InvalidArgumentError as exc:
            raise _refused(view, str(exc)) from None

    def spark_sql(sql: str | None, twin: str | None, what: str) -> str | None:
        nonlocal spark_problem
        if sql is None:
            if twin is not None:
                spark_problem = spark_problem or f"the stored definition has no Spark SQL for {what}"
            return None
        if twin is None:
            spark_problem = spark_problem or f"the stored definition has Spark SQL but no DuckDB SQL for {what}"
            return None
        try:
            tree = sqlglot.parse_one(sql, read="spark")
            _checked(_render(tree, "duckdb"), used, f"the stored Spark {what}")
            return _render(tree, "spark")
        except (SqlglotError, InvalidArgumentError) as exc:
            spark_problem = spark_problem or f"the stored Spark SQL of {what} failed the check: {exc}"
            return None

    types: dict[str, str] = {}
    for name, t in obj.get("types", {}).items():
        try:
            types[name] = expressions.check_type(t)
        except InvalidArgumentError as exc:
            raise _refused(view, f"the stored type of view column {name!r} is refused: {exc}") from None
    columns = []
    for c in obj["columns"]:
        what = f"select item {c['name']!r}"
        duck_text = duck_sql(c["duckdb"], what)
        columns.append(ViewColumn(c["name"], c["kind"], duck_text, spark_sql(c["spark"], duck_text, what)))
    where_duck = duck_sql(obj["where"]["duckdb"], "WHERE")
    where_spark = spark_sql(obj["where"]["spark"], where_duck, "WHERE")
    return ViewQuery(
        text=obj["query"],
        shape=obj["shape"],
        columns=tuple(columns),
        where_duck=where_duck,
        where_spark=where_spark,
        source_columns=used,
        spark_ok=obj.get("spark-ok", True) and spark_problem is None,
        spark_problem=spark_problem,
        types=types,
    )


# ---------------------------------------------------------------- the view table


def storage_schema(con: duckdb.DuckDBPyConnection, types: dict[str, str], order: list[str]) -> pa.Schema:
    """The Arrow schema a view table is created with, for view columns ``order`` of DuckDB ``types`` (all nullable).

    ``con``'s time zone names the zone of TIMESTAMPTZ columns (Iceberg stores them in UTC whatever it is).
    """
    select = ", ".join(f'CAST(NULL AS {types[n]}) AS "{esc(n)}"' for n in order)
    schema = con.execute(f"SELECT {select} LIMIT 0").to_arrow_table().schema
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            t = pa.string()
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields)


def _check_storage(view: str, query: ViewQuery, schema: pa.Schema) -> None:
    """The definition describes the view table: its columns in order, and the types it stores them as."""
    expected = query.storage_columns()
    if expected != schema.names:
        raise _refused(view, f"it describes the columns {_shown(expected, 200)}, but the view table has {_shown(schema.names, 200)}")
    unknown = sorted(set(query.types) - set(expected))
    if unknown:
        raise _refused(view, f"types names columns the view does not have: {_shown(unknown)}")
    names = [n for n in expected if n in query.types]
    if not names:
        return
    try:
        with duck.scratch() as con:
            created = storage_schema(con, query.types, names)
        stored = arrow_schema(iceberg_schema(created, None))
    except Exception as exc:  # a type Iceberg cannot store
        raise _refused(view, f"types holds a type the view table cannot store ({type(exc).__name__}: {exc})") from None
    for name, f in zip(names, stored, strict=True):
        actual = schema.field(name).type
        if f.type != actual:
            raise _refused(view, _field(f"types[{name!r}]", query.types[name], f"a type the view table stores as {actual} (this one is {f.type})"))
