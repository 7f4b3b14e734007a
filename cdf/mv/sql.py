"""SQL builders of materialized-view refresh: deltas from a net change feed, raw aggregate state, projections.

Each builder renders one statement for DuckDB or Spark SQL (``dialect``) from a
parsed :class:`~cdf.mv.query.ViewQuery`; the ``esc``/``name_list``/``cast_list``/
``key_text`` helpers build the DuckDB SQL that applies a delta to the view.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from cdf.mv.query import GROUP_ROWS, SRC_ROW_ID, ViewColumn, ViewQuery
from lineage.sql.predicate import sql_literal


def _q(name: str, dialect: str) -> str:
    if dialect == "spark":
        return "`" + name.replace("`", "``") + "`"
    return '"' + name.replace('"', '""') + '"'


def _expr(col: ViewColumn, dialect: str) -> str:
    return col.spark if dialect == "spark" else col.duck  # type: ignore[return-value]


def _where(query: ViewQuery, dialect: str) -> str:
    text = query.where_spark if dialect == "spark" else query.where_duck
    return f"({text})" if text else "TRUE"


def raw_aggregate_sql(query: ViewQuery, dialect: str, src: str, keys_view: str | None = None, prefilter: str | None = None) -> str:
    """Per-group raw state (keys, _mv_rows, sums, non-null counts, extremes) over ``src``.

    With ``keys_view`` only the groups listed there (columns ``__rk<i>``) are computed;
    ``prefilter`` (a superset condition on plain key columns) lets the scan skip other rows early.
    """
    q = lambda n: _q(n, dialect)  # noqa: E731
    keys = query.keys
    select = [f"{_expr(k, dialect)} AS {q(k.name)}" for k in keys] + [f"COUNT(*) AS {q(GROUP_ROWS)}"]
    for c in query.aggregates:
        arg = _expr(c, dialect)
        if c.kind == "sum":
            select += [f"SUM({arg}) AS {q(c.name)}", f"COUNT({arg}) AS {q(c.hidden()[0])}"]
        elif c.kind == "avg":
            select += [f"SUM({arg}) AS {q(c.hidden()[0])}", f"COUNT({arg}) AS {q(c.hidden()[1])}"]
        elif c.kind == "count":
            select.append(f"COUNT({arg}) AS {q(c.name)}")
        elif c.kind == "count_star":
            select.append(f"COUNT(*) AS {q(c.name)}")
        else:
            select.append(f"{c.function}({arg}) AS {q(c.name)}")
    source = src
    if keys_view is not None and keys:
        join = "LEFT SEMI JOIN" if dialect == "spark" else "SEMI JOIN"
        cond = " AND ".join(f"({_expr(k, dialect)}) IS NOT DISTINCT FROM rk.__rk{i}" for i, k in enumerate(keys))
        source = f"{src} {join} {keys_view} rk ON {cond}"
    sql = f"SELECT {', '.join(select)} FROM {source} WHERE {_where(query, dialect)}"
    if prefilter:
        sql += f" AND {prefilter}"
    if keys:
        sql += " GROUP BY " + ", ".join(_expr(k, dialect) for k in keys)
    return sql


def projection_sql(query: ViewQuery, dialect: str, src: str) -> str:
    """The projection view's rows over ``src`` (which has ``_row_id``)."""
    q = lambda n: _q(n, dialect)  # noqa: E731
    cols = ", ".join(f"{_expr(c, dialect)} AS {q(c.name)}" for c in query.columns)
    return f"SELECT {cols}, _row_id AS {q(SRC_ROW_ID)} FROM {src} WHERE {_where(query, dialect)}"


def projection_delta_sql(query: ViewQuery, dialect: str, feed: str, purged: bool = False) -> str:
    """Upserts and deletes by source row id from a net feed (``__action`` says which).

    With ``purged`` the feed has a ``_purged`` flag: a purged row's images carry no values, so it is
    deleted from the view by row id whatever the filter says of its nulls.
    """
    q = lambda n: _q(n, dialect)  # noqa: E731
    ok = f"COALESCE({_where(query, dialect)}, FALSE)"
    if purged:
        ok = f"CASE WHEN _purged THEN _change_type IN ('delete', 'update_preimage') ELSE {ok} END"
    exprs = "".join(f", {_expr(c, dialect)} AS __c{i}" for i, c in enumerate(query.columns))
    same = " AND ".join(f"p.__c{i} IS NOT DISTINCT FROM o.__c{i}" for i in range(len(query.columns))) or "TRUE"
    outs = ", ".join(f"p.__c{i} AS {q(c.name)}" for i, c in enumerate(query.columns))
    return (
        f"WITH f AS (SELECT _row_id, _change_type IN ('insert', 'update_postimage') AS __post, "
        f"{ok} AS __ok{exprs} FROM {feed}) "
        f"SELECT COALESCE(p._row_id, o._row_id) AS {q(SRC_ROW_ID)}, "
        "CASE WHEN COALESCE(p.__ok, FALSE) THEN 'upsert' ELSE 'delete' END AS __action, "
        f"{outs} "
        "FROM (SELECT * FROM f WHERE __post) p FULL OUTER JOIN (SELECT * FROM f WHERE NOT __post) o ON p._row_id = o._row_id "
        f"WHERE (COALESCE(p.__ok, FALSE) AND NOT (COALESCE(o.__ok, FALSE) AND {same})) "
        "OR (COALESCE(o.__ok, FALSE) AND NOT COALESCE(p.__ok, FALSE))"
    )


def aggregate_delta_sql(query: ViewQuery, dialect: str, feed: str) -> str:
    """Per-group signed deltas from a net feed: post-images count +1, pre-images -1."""
    q = lambda n: _q(n, dialect)  # noqa: E731
    keys = query.keys
    inner = ["CASE WHEN _change_type IN ('insert', 'update_postimage') THEN 1 ELSE -1 END AS __sign"]
    inner += [f"{_expr(k, dialect)} AS __k{i}" for i, k in enumerate(keys)]
    inner += [f"{_expr(c, dialect)} AS __a{i}" for i, c in enumerate(query.aggregates) if c.kind != "count_star"]
    outer = [f"__k{i} AS {q(k.name)}" for i, k in enumerate(keys)] + ["SUM(__sign) AS __d_rows"]
    for i, c in enumerate(query.aggregates):
        nn = f"SUM(CASE WHEN __a{i} IS NOT NULL THEN __sign ELSE 0 END) AS __d_nn{i}"
        if c.kind in ("sum", "avg"):
            outer += [f"SUM(__sign * __a{i}) AS __d_sum{i}", nn]
        elif c.kind == "count":
            outer.append(nn)
        elif c.kind in ("min", "max"):
            fn = c.function
            outer += [f"{fn}(CASE WHEN __sign > 0 THEN __a{i} END) AS __post{i}", f"{fn}(CASE WHEN __sign < 0 THEN __a{i} END) AS __pre{i}"]
    sql = f"SELECT {', '.join(outer)} FROM (SELECT {', '.join(inner)} FROM {feed} WHERE COALESCE({_where(query, dialect)}, FALSE)) f"
    if keys:
        sql += " GROUP BY " + ", ".join(f"__k{i}" for i in range(len(keys)))
    return sql + " HAVING COUNT(*) > 0"


def esc(name: str) -> str:
    """``name`` escaped for a double-quoted DuckDB identifier."""
    return name.replace('"', '""')


def name_list(names: Sequence[str] | Any) -> str:
    """Quoted, comma-separated column names."""
    return ", ".join(f'"{esc(n)}"' for n in names)


def cast_list(names: Sequence[str], types: dict[str, str], alias: str) -> str:
    """``CAST(alias.col AS type) AS col`` for each name, with its DuckDB type from ``types``."""
    return ", ".join(f'CAST({alias}."{esc(n)}" AS {types[n]}) AS "{esc(n)}"' for n in names)


def key_text(typed_keys: list[str], key_types: list[str]) -> str:
    """Canonical text of group key values (the aggregate view's key column)."""
    parts = []
    for expr, t in zip(typed_keys, key_types, strict=True):
        if t in ("FLOAT", "DOUBLE", "REAL"):
            expr = f"({expr} + 0)"  # -0.0 and 0.0 are one group
        parts.append(f"CAST({expr} AS VARCHAR)")
    return f"to_json([{', '.join(parts)}]::VARCHAR[])"


_PREFILTER_MAX = 2000
_PLAIN_COLUMN = re.compile(r'^"(?:[^"]|"")+"$')


def key_prefilter(keys: list[ViewColumn], groups: pa.Table) -> str | None:
    """``col IN (...)`` conditions on the plain-column group keys of ``groups`` (a superset of their rows).

    The semi join on the key values stays exact; this condition is pushed into the Parquet scan, so a
    MIN/MAX recomputation of a few groups does not run the whole source through the live view's joins.
    """
    parts = []
    for i, k in enumerate(keys):
        if not _PLAIN_COLUMN.match(k.duck or ""):
            continue
        values = set(groups.column(i).to_pylist())
        if len(values) > _PREFILTER_MAX:
            return None
        if not all(v is None or isinstance(v, (str, int, decimal.Decimal, _dt.date)) and not isinstance(v, (bool, _dt.datetime))
                   for v in values):
            continue  # floats (nan, -0.0), timestamps: only the exact semi join
        lits = [sql_literal(v) for v in values if v is not None]
        cond = [f"{k.duck} IN ({', '.join(lits)})"] if lits else []
        if None in values:
            cond.append(f"{k.duck} IS NULL")
        parts.append("(" + " OR ".join(cond) + ")")
    return " AND ".join(parts) or None
