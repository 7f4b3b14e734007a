"""Materialized-view queries: parsing, validation and SQL generation.

A view is defined by one SQL ``SELECT`` over one source table, parsed with
sqlglot in the DuckDB dialect. Two shapes are maintained incrementally:

* **projection/filter**: ``SELECT col, expr AS name, ... FROM src [WHERE cond]``
  (``SELECT *`` expands to the source's columns);
* **aggregation**: ``SELECT key, ..., SUM(x), COUNT(*), COUNT(x), AVG(x),
  MIN(x), MAX(x) FROM src [WHERE cond] [GROUP BY key, ...]``: every select item
  is a group key or one aggregate call over a scalar expression.

Everything else (joins, subqueries, CTEs, set operations, window functions,
DISTINCT, HAVING, QUALIFY, ORDER BY, LIMIT, FILTER clauses, ROLLUP/CUBE, table
functions, non-deterministic functions, lineage columns) is refused with a
:class:`ViewQueryError` naming the construct, at creation.

The parsed query becomes a :class:`ViewQuery`: its columns with their kinds and
their argument expressions rendered for DuckDB and for Spark SQL (sqlglot
transpiles; column references are replaced by quoted source column names).
The refresh (:mod:`cdf.mv.sql`, :mod:`cdf.mv.view`) builds its SQL from these fragments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, SqlglotError, UnsupportedError

import lineage.sql.expressions as expressions
from lineage.errors import InvalidArgumentError

SHAPES = ("projection", "aggregate")
AGGREGATES = {exp.Sum: "sum", exp.Count: "count", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}
KINDS = ("expr", "sum", "count", "count_star", "avg", "min", "max")
# The SQL function of each aggregate kind: refresh SQL names an aggregate through this map, never through stored text.
SQL_FUNCTIONS = {"sum": "SUM", "count": "COUNT", "count_star": "COUNT", "avg": "AVG", "min": "MIN", "max": "MAX"}

# Columns the view table adds to the query's own columns.
SRC_ROW_ID = "_src_row_id"  # projection views: the source row id (the view's key)
GROUP_KEY = "_mv_key"  # aggregate views: canonical text of the group key values (the view's key)
GROUP_ROWS = "_mv_rows"  # aggregate views: COUNT(*) of the group (a group with 0 rows disappears)
HIDDEN_PREFIX = "_mv_"

# Non-deterministic functions sqlglot parses into nodes of their own (refused with a view-specific message; function names
# are checked against lineage.sql.allowlist when each clause goes through lineage.sql.expressions).
_NONDETERMINISTIC_NODES = tuple(
    getattr(exp, n)
    for n in ("Rand", "Randn", "Uuid", "CurrentTimestamp", "CurrentDate", "CurrentTime", "CurrentDatetime", "CurrentUser",
              "CurrentSchema", "CurrentRole", "CurrentCatalog", "SessionUser", "Localtime", "Localtimestamp", "CurrentTimestampLTZ")
    if hasattr(exp, n)
)
_REFUSED_NODES = {
    "Window": "window functions (OVER ...)",
    "Subquery": "subqueries",
    "Exists": "subqueries (EXISTS)",
    "Distinct": "DISTINCT",
    "Filter": "aggregate FILTER clauses",
    "Rollup": "ROLLUP",
    "Cube": "CUBE",
    "GroupingSets": "GROUPING SETS",
    "Lateral": "LATERAL",
    "Unnest": "UNNEST",
    "Placeholder": "parameters",
    "Parameter": "parameters",
    "Lambda": "lambda functions",
}
_SELECT_ARGS = {"expressions", "from_", "from", "where", "group", "kind"}
_TABLE_ARGS = {"this", "db", "catalog", "alias"}
DEFINITION_FORMAT = "lineage-mv-definition"
DEFINITION_VERSION = 1


class ViewQueryError(InvalidArgumentError):
    """A materialized-view query is not one of the supported shapes (the message says what is not)."""


@dataclass(frozen=True)
class ViewColumn:
    """One output column: a projected expression / group key (``expr``) or an aggregate."""

    name: str
    kind: str  # one of KINDS
    duck: str | None  # the expression (expr) or the aggregate's argument, DuckDB SQL; None for COUNT(*)
    spark: str | None  # the same in Spark SQL (None if it has no Spark translation, or COUNT(*))

    @property
    def is_aggregate(self) -> bool:
        """Whether the column is an aggregate (not a projected expression or group key)."""
        return self.kind != "expr"

    @property
    def function(self) -> str:
        """The aggregate's SQL function name (``SUM``, ``MIN``, ...), from the closed :data:`SQL_FUNCTIONS`."""
        try:
            return SQL_FUNCTIONS[self.kind]
        except KeyError:
            raise ViewQueryError(f"view column {self.name!r} has the kind {self.kind!r}, which is not an aggregate") from None

    def hidden(self) -> list[str]:
        """Helper columns stored for this aggregate: non-null count, and the sum for AVG."""
        if self.kind in ("sum", "avg"):
            names = [f"{HIDDEN_PREFIX}nn_{self.name}"]
            return ([f"{HIDDEN_PREFIX}sum_{self.name}"] + names) if self.kind == "avg" else names
        return []


@dataclass(frozen=True)
class ViewQuery:
    """A validated view query."""

    text: str
    shape: str
    columns: tuple[ViewColumn, ...]
    where_duck: str | None
    where_spark: str | None
    source_columns: tuple[str, ...]  # source data columns the query reads, in source order
    spark_ok: bool = True
    spark_problem: str | None = None
    types: dict[str, str] = field(default_factory=dict)  # view column (incl. hidden) -> DuckDB type

    @property
    def names(self) -> list[str]:
        """The query's output column names, in order."""
        return [c.name for c in self.columns]

    @property
    def keys(self) -> list[ViewColumn]:
        """Group keys (aggregate views) or projected columns (projection views)."""
        return [c for c in self.columns if not c.is_aggregate]

    @property
    def aggregates(self) -> list[ViewColumn]:
        """Aggregate columns (aggregate views)."""
        return [c for c in self.columns if c.is_aggregate]

    def storage_columns(self) -> list[str]:
        """The view table's columns, in order: the query's, then the key and helper columns of its shape."""
        if self.shape == "projection":
            return self.names + [SRC_ROW_ID]
        return self.names + [GROUP_KEY, GROUP_ROWS] + [h for c in self.aggregates for h in c.hidden()]

    @property
    def needs_recompute(self) -> bool:
        """Whether a delete can make a group undecidable (MIN/MAX)."""
        return any(c.kind in ("min", "max") for c in self.columns)

    def to_json(self) -> str:
        """The definition stored in the view table's properties."""
        return json.dumps(
            {
                "format": DEFINITION_FORMAT,
                "format-version": DEFINITION_VERSION,
                "query": self.text,
                "shape": self.shape,
                "columns": [{"name": c.name, "kind": c.kind, "duckdb": c.duck, "spark": c.spark} for c in self.columns],
                "where": {"duckdb": self.where_duck, "spark": self.where_spark},
                "source-columns": list(self.source_columns),
                "spark-ok": self.spark_ok,
                "spark-problem": self.spark_problem,
                "types": self.types,
            },
            sort_keys=True,
        )


# ---------------------------------------------------------------- parsing


def _refuse(what: str, query: str) -> ViewQueryError:
    return ViewQueryError(
        f"materialized views do not support {what} (query: {query!r}); a view is either "
        "SELECT cols/exprs FROM src [WHERE ...] or SELECT keys, SUM/COUNT/AVG/MIN/MAX(...) FROM src [WHERE ...] [GROUP BY keys]"
    )


def _func_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    try:
        return node.sql_name().lower()
    except Exception:  # pragma: no cover - every Func has a sql_name
        return type(node).__name__.lower()


def _check_nodes(tree: exp.Expression, query: str) -> None:
    """Refuse constructs no shape allows, anywhere in the tree."""
    for node in tree.walk():
        for cls_name, what in _REFUSED_NODES.items():
            cls = getattr(exp, cls_name, None)
            if cls is not None and isinstance(node, cls):
                raise _refuse(what, query)
        if isinstance(node, exp.Select) and node is not tree:
            raise _refuse("subqueries", query)
        if isinstance(node, _NONDETERMINISTIC_NODES):
            raise _refuse(f"the non-deterministic function {_func_name(node).upper()}", query)
        if isinstance(node, exp.AggFunc) and not isinstance(node, tuple(AGGREGATES)):
            raise _refuse(f"the aggregate function {_func_name(node).upper()} (only SUM, COUNT, AVG, MIN, MAX)", query)
        if isinstance(node, exp.Anonymous) and _func_name(node) in _KNOWN_AGGREGATES:
            raise _refuse(f"the aggregate function {_func_name(node).upper()} (only SUM, COUNT, AVG, MIN, MAX)", query)


# DuckDB aggregates sqlglot may parse as anonymous functions.
_KNOWN_AGGREGATES = {
    "any_value", "arbitrary", "arg_max", "arg_min", "argmax", "argmin", "array_agg", "avg", "bit_and", "bit_or", "bit_xor",
    "bool_and", "bool_or", "count_if", "countif", "entropy", "favg", "first", "fsum", "geomean", "histogram", "kurtosis",
    "last", "list", "mad", "max_by", "median", "min_by", "mode", "product", "quantile", "quantile_cont", "quantile_disc",
    "regr_avgx", "reservoir_quantile", "skewness", "stddev", "stddev_pop", "stddev_samp", "string_agg", "sumkahan",
    "var_pop", "var_samp", "variance", "approx_count_distinct", "approx_quantile", "group_concat", "listagg", "bitstring_agg",
}


def _source_table(select: exp.Select, source_name: str, query: str) -> set[str]:
    """Check the FROM clause names the source; return the qualifiers columns may use."""
    from_ = select.args.get("from_") or select.args.get("from")
    if from_ is None:
        raise _refuse("a query without FROM", query)
    table = from_.this
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        raise _refuse("a FROM clause that is not a plain table name (table functions, subqueries)", query)
    extra = [k for k, v in table.args.items() if v and k not in _TABLE_ARGS]
    if extra:
        raise _refuse(f"FROM clause options {extra}", query)
    parts = [p for p in (table.args.get("catalog"), table.args.get("db"), table.this) if p is not None]
    written = ".".join(p.name for p in parts).lower()
    full = source_name.lower()
    bare = full.split(".")[-1]
    if written not in (full, bare):
        raise ViewQueryError(
            f"the query reads {written!r} but the view's source table is {source_name!r}; write FROM {bare} (or FROM {source_name})"
        )
    qualifiers = {bare, full}
    alias = table.args.get("alias")
    if alias is not None and alias.name:
        if alias.args.get("columns"):
            raise _refuse("column aliases on the source table", query)
        qualifiers = {alias.name.lower()}
    return qualifiers


def _bind_columns(node: exp.Expression, columns: dict[str, str], qualifiers: set[str], query: str, used: set[str]) -> exp.Expression:
    """Replace every column reference with the quoted source column name (checking it exists)."""

    def visit(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column):
            if isinstance(n.this, exp.Star):
                raise _refuse("qualified * outside a plain SELECT *", query)
            qual = ".".join(p.name for p in (n.args.get("catalog"), n.args.get("db"), n.args.get("table")) if p is not None).lower()
            if qual and qual not in qualifiers and qual.split(".")[-1] not in qualifiers:
                raise ViewQueryError(f"column {n.sql()!r} is qualified by {qual!r}, which is not the source table")
            name = n.name
            real = columns.get(name.lower())
            if real is None:
                raise ViewQueryError(
                    f"column {name!r} is not a data column of the source table (columns: {sorted(columns.values())}); "
                    "lineage columns such as _row_id cannot be used in a view query"
                )
            used.add(real)
            return exp.Column(this=exp.to_identifier(real, quoted=True))
        return n

    return node.copy().transform(visit)


def _render(node: exp.Expression, dialect: str) -> str:
    if dialect == "spark" and node.find(exp.Format) is not None:
        # sqlglot renders DuckDB's format() as Spark's format_string(), which reads its format printf-style, not {}-style
        raise UnsupportedError("format() has no Spark translation (Spark's format_string reads '%5d', not '{:>5}')")
    return node.sql(dialect=dialect, unsupported_level=ErrorLevel.RAISE, comments=False)  # the stored query keeps them


def _checked(sql: str, columns: list[str] | tuple[str, ...], what: str) -> str:
    """``sql`` (one clause's expression, DuckDB dialect) through the validator every user expression passes (lineage.sql.expressions).

    The result is DuckDB's rendering of the checked parse tree: the text the refresh engine runs.
    """
    try:
        return expressions.check(sql, columns, what).sql
    except InvalidArgumentError as exc:
        raise ViewQueryError(f"the view query is refused: {exc}") from None


def _is_aggregate_call(node: exp.Expression) -> bool:
    return isinstance(node, tuple(AGGREGATES))


def _contains_aggregate(node: exp.Expression) -> bool:
    return any(isinstance(n, exp.AggFunc) for n in node.walk())


def _default_name(item: exp.Expression, kind: str | None, query: str) -> str:
    """An output name for a select item written without AS."""
    if kind is None:
        if isinstance(item, exp.Column):
            return item.name
        raise ViewQueryError(f"the select item {item.sql(dialect='duckdb')!r} needs a name: write it as <expression> AS <name>")
    if kind == "count_star":
        return "count"
    arg = item.this
    if isinstance(arg, exp.Column):
        return f"{kind}_{arg.name}"
    raise ViewQueryError(f"the select item {item.sql(dialect='duckdb')!r} needs a name: write it as <aggregate> AS <name>")


_RESERVED = (SRC_ROW_ID, "_row_id", "_row_created_at_version", "_row_last_updated_at_version")


def name_problem(names: list[str]) -> str | None:
    """What is wrong with a view's output column names (duplicates, bookkeeping names), or None."""
    lowered = [n.lower() for n in names]
    dupes = sorted({n for n in names if lowered.count(n.lower()) > 1})
    if dupes:
        return f"the view would have several columns named {dupes}"
    reserved = [n for n in names if n.lower().startswith(HIDDEN_PREFIX) or n.lower() in _RESERVED or n.startswith("__")
                or n.lower().startswith("_lineage")]
    if reserved:
        return f"the column names {reserved} are reserved for the view's bookkeeping"
    return None


def parse(query: str, source_name: str, source_columns: list[str]) -> ViewQuery:
    """Parse and validate ``query`` over the source (without types; see :func:`cdf.mv` for typing)."""
    if not isinstance(query, str) or not query.strip():
        raise ViewQueryError(f"query must be a non-empty SQL string, got {query!r}")
    try:
        statements = [s for s in sqlglot.parse(query, read="duckdb") if s is not None]
    except (ParseError, SqlglotError) as exc:
        raise ViewQueryError(f"the view query is not valid SQL: {exc}") from None
    if len(statements) != 1:
        raise ViewQueryError(f"the view query must be exactly one SELECT statement, got {len(statements)} statements")
    tree = statements[0]
    if not isinstance(tree, exp.Select):
        what = {"Union": "UNION", "Intersect": "INTERSECT", "Except": "EXCEPT"}.get(type(tree).__name__, f"{type(tree).__name__.upper()} statements")
        raise _refuse(what, query)
    if tree.args.get("with") or tree.args.get("with_"):
        raise _refuse("WITH (common table expressions)", query)
    for key, value in tree.args.items():
        if value and key not in _SELECT_ARGS:
            what = {"joins": "joins", "having": "HAVING", "order": "ORDER BY", "limit": "LIMIT", "offset": "OFFSET", "qualify": "QUALIFY",
                    "distinct": "DISTINCT", "windows": "WINDOW clauses", "laterals": "LATERAL", "sample": "TABLESAMPLE",
                    "pivots": "PIVOT", "into": "SELECT INTO", "settings": "SETTINGS", "locks": "locking clauses"}.get(key, key.upper())
            raise _refuse(what, query)
    qualifiers = _source_table(tree, source_name, query)
    _check_nodes(tree, query)
    by_lower = {c.lower(): c for c in source_columns}
    used: set[str] = set()

    # Expand SELECT * (projection views only).
    items: list[exp.Expression] = []
    for item in tree.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            if any(item.args.get(k) for k in ("except", "replace", "rename")):
                raise _refuse("SELECT * EXCLUDE/REPLACE", query)
            items.extend(exp.Column(this=exp.to_identifier(c, quoted=True)) for c in source_columns)
        else:
            items.append(item)

    group = tree.args.get("group")
    aggregated = group is not None or any(_contains_aggregate(i) for i in items)
    where = tree.args.get("where")
    where_node = None
    if where is not None:
        if _contains_aggregate(where.this):
            raise ViewQueryError("aggregates are not allowed in WHERE")
        where_node = _bind_columns(where.this, by_lower, qualifiers, query, used)

    columns: list[tuple[str, str, exp.Expression | None]] = []
    for item in items:
        alias = item.alias if isinstance(item, exp.Alias) else None
        body = item.this if isinstance(item, exp.Alias) else item
        if _is_aggregate_call(body):
            kind = AGGREGATES[type(body)]
            arg = body.this
            if kind == "count" and (arg is None or isinstance(arg, exp.Star)):
                kind, arg = "count_star", None
            extra = [k for k, v in body.args.items() if v and k not in ("this", "big_int")]
            if extra or (arg is not None and _contains_aggregate(arg)):
                raise _refuse(f"{kind.upper()} with extra arguments or nested aggregates", query)
            bound = _bind_columns(arg, by_lower, qualifiers, query, used) if arg is not None else None
            columns.append((alias or _default_name(body, kind, query), kind, bound))
        elif _contains_aggregate(body):
            raise ViewQueryError(
                f"the select item {item.sql(dialect='duckdb')!r} mixes an aggregate with other expressions; each select item "
                "must be a group key or exactly one SUM/COUNT/AVG/MIN/MAX call"
            )
        else:
            columns.append((alias or _default_name(body, None, query), "expr", _bind_columns(body, by_lower, qualifiers, query, used)))

    if aggregated:
        _check_group_by(tree, group, items, columns, by_lower, qualifiers, query)
    shape = "aggregate" if aggregated else "projection"

    problem = name_problem([c[0] for c in columns])
    if problem:
        raise ViewQueryError(f"{problem}; rename them with AS")

    out: list[ViewColumn] = []
    spark_problem = None
    for name, kind, node in columns:
        duck = _checked(_render(node, "duckdb"), source_columns, f"the select item {name!r}") if node is not None else None
        spark = None
        if node is not None:
            try:
                spark = _render(node, "spark")
            except SqlglotError as exc:
                spark_problem = spark_problem or f"{name}: {exc}"
        out.append(ViewColumn(name, kind, duck, spark))
    where_duck = _checked(_render(where_node, "duckdb"), source_columns, "WHERE") if where_node is not None else None
    where_spark = None
    if where_node is not None:
        try:
            where_spark = _render(where_node, "spark")
        except SqlglotError as exc:
            spark_problem = spark_problem or f"WHERE: {exc}"
    ordered_used = tuple(c for c in source_columns if c in used)
    return ViewQuery(
        text=query,
        shape=shape,
        columns=tuple(out),
        where_duck=where_duck,
        where_spark=where_spark,
        source_columns=ordered_used,
        spark_ok=spark_problem is None,
        spark_problem=spark_problem,
    )


def _check_group_by(
    tree: exp.Select,
    group: exp.Group | None,
    items: list[exp.Expression],
    columns: list[tuple[str, str, exp.Expression | None]],
    by_lower: dict[str, str],
    qualifiers: set[str],
    query: str,
) -> None:
    """Every GROUP BY key must be a selected non-aggregate item, and every such item a key."""
    keys = [i for i, c in enumerate(columns) if c[1] == "expr"]
    if group is None:
        if keys:
            raise ViewQueryError(
                f"the select items {[columns[i][0] for i in keys]} are neither aggregates nor in a GROUP BY; add GROUP BY"
            )
        return
    if group.args.get("all"):
        return
    extra = [k for k, v in group.args.items() if v and k != "expressions"]
    if extra:
        raise _refuse(f"GROUP BY {', '.join(e.upper() for e in extra)}", query)
    matched: set[int] = set()
    for g in group.expressions:
        hit = None
        if isinstance(g, exp.Literal) and not g.is_string:
            pos = int(g.this)
            if not 1 <= pos <= len(columns):
                raise ViewQueryError(f"GROUP BY {pos} is out of range: the query selects {len(columns)} columns")
            hit = pos - 1
        else:
            bound = _bind_columns(g, by_lower, qualifiers, query, set()) if not (
                isinstance(g, exp.Column) and g.name.lower() not in by_lower
            ) else None
            for i in keys:
                if bound is not None and columns[i][2] == bound:
                    hit = i
                    break
            if hit is None and isinstance(g, exp.Column) and not g.table:
                for i in keys:  # GROUP BY an output alias
                    if columns[i][0].lower() == g.name.lower():
                        hit = i
                        break
        if hit is None or columns[hit][1] != "expr":
            raise ViewQueryError(
                f"GROUP BY {g.sql(dialect='duckdb')} is not one of the selected columns; a view is keyed by its group keys, "
                "so select every GROUP BY expression (and group by selected, non-aggregate items only)"
            )
        matched.add(hit)
    missing = [columns[i][0] for i in keys if i not in matched]
    if missing:
        raise ViewQueryError(f"the select items {missing} are neither aggregates nor in the GROUP BY")
