"""Materialized views over one lineage table, refreshed incrementally from its change feed.

A view is defined by a query over one source table (see :mod:`cdf.mv_query`
for the two supported shapes) and stored in a lineage table of its own, so it
has row lineage and a change feed too (views can be chained)::

    import cdf.mv
    v = cdf.mv.create("shop.totals", orders,
                      "SELECT region, SUM(amount) AS total, COUNT(*) AS n, MAX(amount) AS top FROM orders GROUP BY region")
    v.refresh()                     # applies the source's net change feed since the view's checkpoint
    v.scan()                        # the query's columns only

**Storage.** Projection views keep one row per qualifying source row, keyed by
``_src_row_id`` (the source ``_row_id``). Aggregate views keep one row per
group, keyed by ``_mv_key`` (canonical text of the group key values, so null
and floating-point keys work), with ``_mv_rows`` (the group's COUNT(*)) and
helper columns ``_mv_nn_<col>`` (non-null count of a SUM/AVG argument) and
``_mv_sum_<col>`` (AVG's running sum). The definition is stored in the view
table's properties (``mv.definition``, ``mv.query``, ``mv.source``, ...).

**Refresh.** The source's net feed ``(checkpoint, current]`` is read (DuckDB or
Spark), turned into a delta by the same engine (projection: upserts and
deletes by source row id; aggregates: per-group signed sums and counts, plus
the smallest/largest removed and added MIN/MAX arguments) and applied to the
view in ONE :meth:`lineage.Table.merge` whose commit carries
``mv.source-version``. Groups whose MIN/MAX became undecidable (the removed
value was the extreme and no added value beats it) are recomputed from the
source at the new version; groups whose COUNT(*) drops to 0 are deleted.

**Exactly once.** The checkpoint is the ``mv.source-version`` of the view's own
last commit, so data and checkpoint land together or not at all: a crash
anywhere before the commit leaves the old view and the old checkpoint, and
the next refresh redoes the work. A refresh plans against the view version it
read; its merge is guarded so that any attempt (including the merge's own
re-plan after a lost commit race) that finds the view at another version
aborts without writing. The loser of a race then reports ``status="concurrent"``.
A refresh whose delta is empty writes no snapshot; it records
``mv.idle-checkpoint`` (bound to the view's current snapshot id) in the view
table's properties, so the next refresh starts from the newer source version.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import decimal
import json
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException

from cdf.mv_query import GROUP_KEY, GROUP_ROWS, SRC_ROW_ID, ViewColumn, ViewQuery, ViewQueryError, parse
from lineage import duck
from lineage.catalog import identifier, resolve_catalog
from lineage.duck import duckdb_types
from lineage.errors import (
    CommitConflictError,
    InvalidArgumentError,
    LineageError,
    RetentionError,
    TableNotFoundError,
    UnknownVersionError,
    VersionMovedError,
)
from lineage.predicate import sql_literal
from lineage.scan import register_live_view
from lineage.schema import projection_field_ids
from lineage.table import Table, create_table, open_table

log = logging.getLogger("cdf.mv")

ENGINES = ("duckdb", "spark")

# View table properties (definition) and commit properties (checkpoint).
PROP_DEFINITION = "mv.definition"
PROP_QUERY = "mv.query"
PROP_SOURCE = "mv.source"
PROP_SOURCE_UUID = "mv.source-uuid"
PROP_SHAPE = "mv.shape"
PROP_IDLE = "mv.idle-checkpoint"
CHECKPOINT = "mv.source-version"
CHECKPOINT_UUID = "mv.source-uuid"
REFRESH_KIND = "mv.refresh"

MAX_ATTEMPTS = 5

# Fault injection for tests: called with a stage name at each step of a refresh.
_FAULT_HOOK: Callable[[str], None] | None = None


def _fault(stage: str) -> None:
    if _FAULT_HOOK is not None:
        _FAULT_HOOK(stage)


class ViewNotFoundError(TableNotFoundError):
    """The named table does not exist or is not a materialized view."""


class _ViewMoved(Exception):
    """The view's table is no longer at the version the refresh planned against."""

    def __init__(self, version: int) -> None:
        super().__init__(f"the view moved to version {version}")
        self.version = version


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class RefreshResult:
    """What one refresh did.

    ``status`` is ``"refreshed"`` (incremental commit), ``"rebuilt"`` (full
    rebuild), ``"unchanged"`` (the source changed, the view did not: no
    snapshot), ``"up-to-date"`` (the source has no new version) or
    ``"concurrent"`` (another refresh moved the view first; this one wrote nothing).
    """

    view: str
    status: str
    committed: bool
    from_version: int | None  # the source version the view reflected before
    to_version: int  # the source version the view reflects after this refresh
    view_version: int  # the view table's version after this refresh
    engine: str
    full: bool = False
    reason: str | None = None  # why a full rebuild ran
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    groups_recomputed: int = 0
    feed_rows: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        frm = "-" if self.from_version is None else str(self.from_version)
        text = f"{self.view}: {self.status} (source {frm} -> {self.to_version}, view version {self.view_version}"
        if self.committed:
            text += f", +{self.inserted} ~{self.updated} -{self.deleted} rows"
        if self.groups_recomputed:
            text += f", {self.groups_recomputed} group(s) recomputed"
        if self.reason:
            text += f"; full rebuild: {self.reason}"
        return text + f", {self.seconds:.2f} s, {self.engine})"

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (for the CLI's ``--json``)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class _Checkpoint:
    version: int | None
    source_uuid: str | None
    idle: bool = False


# ---------------------------------------------------------------- SQL helpers


def _q(name: str, dialect: str) -> str:
    if dialect == "spark":
        return "`" + name.replace("`", "``") + "`"
    return '"' + name.replace('"', '""') + '"'


def _expr(col: ViewColumn, dialect: str) -> str:
    return col.spark if dialect == "spark" else col.duck  # type: ignore[return-value]


def _where(query: ViewQuery, dialect: str) -> str:
    text = query.where_spark if dialect == "spark" else query.where_duck
    return f"({text})" if text else "TRUE"


def _raw_aggregate_sql(query: ViewQuery, dialect: str, src: str, keys_view: str | None = None, prefilter: str | None = None) -> str:
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
            select.append(f"{c.kind.upper()}({arg}) AS {q(c.name)}")
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


def _projection_sql(query: ViewQuery, dialect: str, src: str) -> str:
    """The projection view's rows over ``src`` (which has ``_row_id``)."""
    q = lambda n: _q(n, dialect)  # noqa: E731
    cols = ", ".join(f"{_expr(c, dialect)} AS {q(c.name)}" for c in query.columns)
    return f"SELECT {cols}, _row_id AS {q(SRC_ROW_ID)} FROM {src} WHERE {_where(query, dialect)}"


def _projection_delta_sql(query: ViewQuery, dialect: str, feed: str, purged: bool = False) -> str:
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


def _aggregate_delta_sql(query: ViewQuery, dialect: str, feed: str) -> str:
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
            fn = c.kind.upper()
            outer += [f"{fn}(CASE WHEN __sign > 0 THEN __a{i} END) AS __post{i}", f"{fn}(CASE WHEN __sign < 0 THEN __a{i} END) AS __pre{i}"]
    sql = f"SELECT {', '.join(outer)} FROM (SELECT {', '.join(inner)} FROM {feed} WHERE COALESCE({_where(query, dialect)}, FALSE)) f"
    if keys:
        sql += " GROUP BY " + ", ".join(f"__k{i}" for i in range(len(keys)))
    return sql + " HAVING COUNT(*) > 0"


# ---------------------------------------------------------------- engines


class _Engine:
    """Where the feed, the delta and source recomputations are evaluated."""

    dialect = "duckdb"
    purged = False  # whether the feed has a _purged column (the source was ever purged)

    def __init__(self) -> None:
        self.con = _connect()

    def name(self, logical: str) -> str:
        return logical

    def feed(self, source: Table, a: int, b: int, columns: list[str]) -> int:
        import cdf

        tbl = cdf.changes(source, a, b, net=True, columns=columns)
        self.con.register("feed", tbl)
        self.purged = "_purged" in tbl.column_names
        return tbl.num_rows

    def source(self, source: Table, b: int) -> None:
        state = source.state(b)
        field_ids = projection_field_ids(source.iceberg.metadata)
        register_live_view(self.con, "src", state.live_files(), source.arrow_schema, field_ids)

    def register(self, name: str, data: pa.Table) -> None:
        self.con.register(name, data)

    def query(self, sql: str) -> pa.Table:
        return duck.fetch_arrow(self.con, sql)  # queries may read the `src` live view

    def close(self) -> None:
        self.con.close()


class _SparkEngine(_Engine):
    """Spark computes the feed, the delta and recomputations; the (small) results are collected."""

    dialect = "spark"

    def __init__(self, spark: Any) -> None:
        self.con = None  # type: ignore[assignment]
        self.spark = spark
        self.tag = uuid.uuid4().hex[:10]
        self.views: list[str] = []

    def name(self, logical: str) -> str:
        return f"__mv_{logical}_{self.tag}"

    def _view(self, logical: str, df: Any) -> None:
        df.createOrReplaceTempView(self.name(logical))
        self.views.append(self.name(logical))

    def feed(self, source: Table, a: int, b: int, columns: list[str]) -> int:
        import cdf

        df = cdf.changes(source, a, b, net=True, columns=columns, engine="spark", spark=self.spark)
        self._view("feed", df)
        self.purged = "_purged" in df.columns
        return -1  # not counted: counting would run the feed twice

    def source(self, source: Table, b: int) -> None:
        self._view("src", source.to_spark(self.spark, as_of=b))

    def register(self, name: str, data: pa.Table) -> None:
        self._view(name, self.spark.createDataFrame(data))

    def query(self, sql: str) -> pa.Table:
        return self.spark.sql(sql).toArrow()

    def close(self) -> None:
        for v in self.views:
            try:
                self.spark.catalog.dropTempView(v)
            except Exception:  # pragma: no cover - best effort
                pass


def _connect() -> duckdb.DuckDBPyConnection:
    con = duck.connect()
    con.execute("SET TimeZone = 'UTC'")  # group keys of timestamptz columns render the same everywhere
    return con


# ---------------------------------------------------------------- the view


class MaterializedView:
    """A materialized view: its definition, its storage table, and refresh."""

    def __init__(self, table: Table, query: ViewQuery) -> None:
        self._table = table
        self._query = query

    # ------------------------------------------------------------ facts
    @property
    def name(self) -> str:
        """The view's table name, ``namespace.table``."""
        return self._table.name

    @property
    def table(self) -> Table:
        """The lineage table that stores the view (with helper columns)."""
        return self._table

    @property
    def query(self) -> str:
        """The view's SQL text."""
        return self._query.text

    @property
    def definition(self) -> ViewQuery:
        """The parsed definition."""
        return self._query

    @property
    def shape(self) -> str:
        """``"projection"`` or ``"aggregate"``."""
        return self._query.shape

    @property
    def columns(self) -> list[str]:
        """The query's output columns (what :meth:`scan` returns)."""
        return self._query.names

    @property
    def source_name(self) -> str:
        """The source table's name."""
        return self._table.properties[PROP_SOURCE]

    @property
    def source(self) -> Table:
        """The source table, opened from the view's catalog."""
        try:
            return open_table(self.source_name, catalog=self._table.catalog)
        except TableNotFoundError:
            raise TableNotFoundError(f"the source table {self.source_name} of view {self.name} no longer exists") from None

    @property
    def checkpoint(self) -> int | None:
        """The source version the view currently reflects (None before the first refresh)."""
        self._table.refresh()
        return _read_checkpoint(self._table, self._table.state()).version

    def scan(self, as_of: int | None = None) -> pa.Table:
        """The view's rows (the query's columns only) at a version of the view table."""
        return self._table.scan(columns=self.columns, as_of=as_of)

    def __repr__(self) -> str:
        return f"MaterializedView({self.name!r}, shape={self.shape!r}, source={self.source_name!r})"

    # ------------------------------------------------------------ refresh
    def refresh(self, engine: str = "duckdb", full: bool = False, *, spark: Any = None) -> RefreshResult:
        """Bring the view up to the source's current version, exactly once.

        Reads the source's net change feed since the checkpoint and applies it
        in one commit that also stores the new checkpoint. ``full=True``
        recomputes the whole query (also done automatically for the first
        refresh, when the checkpoint has left the source's retention window, or
        when the source was re-created). ``engine="spark"`` computes the feed,
        the delta and any recomputation in Spark (``spark=`` a session, or the
        active one) and collects only the delta to the driver.
        """
        if engine not in ENGINES:
            raise InvalidArgumentError(f"engine must be one of {ENGINES}, got {engine!r}")
        if not isinstance(full, bool):
            raise InvalidArgumentError(f"full must be True or False, got {full!r}")
        if engine == "spark":
            spark = _spark_session(spark)
            if not self._query.spark_ok:
                raise ViewQueryError(f"view {self.name} cannot be refreshed with Spark: {self._query.spark_problem}; use engine='duckdb'")
        started = time.perf_counter()
        for attempt in range(1, MAX_ATTEMPTS + 1):
            eng: _Engine = _SparkEngine(spark) if engine == "spark" else _Engine()
            try:
                return self._refresh_once(eng, engine, full, started)
            except _ViewMoved as moved:
                before: _Checkpoint | None = getattr(moved, "checkpoint", None)
                self._table.refresh()
                now = _read_checkpoint(self._table, self._table.state())
                if before is None or (now.version, now.source_uuid) != (before.version, before.source_uuid):
                    log.info("view %s was refreshed concurrently (now at view version %d): this refresh wrote nothing", self.name, moved.version)
                    return RefreshResult(
                        self.name, "concurrent", False, before.version if before else None,
                        now.version if now.version is not None else -1, moved.version, engine, full,
                        seconds=time.perf_counter() - started,
                    )
                log.info("view %s moved without a new checkpoint (attempt %d); planning again", self.name, attempt)
            finally:
                eng.close()
        raise CommitConflictError(f"view {self.name} kept changing during {MAX_ATTEMPTS} refresh attempts; nothing was committed")

    def _refresh_once(self, eng: _Engine, engine: str, full: bool, started: float) -> RefreshResult:
        table = self._table
        table.refresh()
        state = table.state()
        expected = state.version
        cp = _read_checkpoint(table, state)
        source = self.source
        src_state = source.state()
        b = src_state.version
        src_uuid = str(source.iceberg.metadata.table_uuid)
        reason = None
        if full:
            reason = "requested (full=True)"
        elif cp.version is None:
            reason = "initial build (the view has no checkpoint yet)"
        elif cp.source_uuid is not None and cp.source_uuid != src_uuid:
            reason = f"the source table {self.source_name} was re-created (its table uuid changed)"
        elif cp.version > b:
            reason = f"the checkpoint (source version {cp.version}) is ahead of the source's current version {b}"
        elif cp.version == b:
            return RefreshResult(self.name, "up-to-date", False, cp.version, b, expected, engine, seconds=time.perf_counter() - started)

        feed_rows = 0
        columns = list(self._query.source_columns)  # net pairs equal in these columns cannot change the view
        if reason is None:
            try:
                feed_rows = eng.feed(source, cp.version, b, columns)  # type: ignore[arg-type]
            except RetentionError as exc:
                reason = f"the checkpoint (source version {cp.version}) is older than the source's change-feed retention window ({exc})"
            except UnknownVersionError as exc:
                reason = f"the checkpoint (source version {cp.version}) is not a version of the source ({exc})"
        if reason is None and eng.purged and self.shape == "aggregate":
            hit = eng.query(f"SELECT COUNT(*) AS n FROM {eng.name('feed')} WHERE _purged").column(0)[0].as_py()
            if hit:
                reason = f"{hit} source row(s) in the range were purged (their values are gone, so their deltas are unknown)"
        _fault("feed")
        if reason is not None:
            level = logging.INFO if (full or cp.version is None) else logging.WARNING
            log.log(level, "view %s: full rebuild at source version %d: %s", self.name, b, reason)

        # DuckDB engine: one connection for everything; Spark: a local one for applying the collected delta.
        con = eng.con if eng.dialect == "duckdb" else _connect()
        try:
            if reason is not None or self.shape == "aggregate":
                # The view's rows at the version this refresh plans against (read in place, not materialised).
                field_ids = projection_field_ids(table.iceberg.metadata)
                register_live_view(con, "cur_live", state.live_files(), table.arrow_schema, field_ids)
                con.execute(f"CREATE OR REPLACE TEMP VIEW cur AS SELECT {_names(table.arrow_schema.names)} FROM cur_live")
            types = self._types()
            if reason is not None:
                upserts, deletes, recomputed = self._rebuild(eng, con, source, b, types)
            elif self.shape == "projection":
                upserts, deletes, recomputed = self._projection_delta(eng, con, types)
            else:
                upserts, deletes, recomputed = self._aggregate_delta(eng, con, source, b, types)
        finally:
            if con is not eng.con:
                con.close()
        _fault("delta")

        status = "rebuilt" if reason is not None else "refreshed"
        base = dict(view=self.name, from_version=cp.version, to_version=b, engine=engine, full=reason is not None, reason=reason,
                    groups_recomputed=recomputed, feed_rows=max(feed_rows, 0))
        if upserts.num_rows == 0 and deletes.num_rows == 0:
            _record_idle(table, state, b, src_uuid)
            return RefreshResult(status=status if reason is not None else "unchanged", committed=False, view_version=expected,
                                 seconds=time.perf_counter() - started, **base)
        properties = {CHECKPOINT: str(b), CHECKPOINT_UUID: src_uuid, REFRESH_KIND: "full" if reason is not None else "incremental"}
        _fault("commit")
        try:
            # Commits only while the view is still at the version this delta was computed against.
            info = table.merge(
                upserts if upserts.num_rows else None, deletes if deletes.num_rows else None,
                properties=properties, expected_version=expected,
            )
        except VersionMovedError as exc:
            moved = _ViewMoved(exc.actual)
            moved.checkpoint = cp  # type: ignore[attr-defined]
            raise moved from None
        _fault("committed")
        table.refresh()
        log.info("view %s: %s to source version %d (view version %d)", self.name, status, b, info.version)
        return RefreshResult(status=status, committed=info.committed, view_version=info.version, inserted=info.inserted,
                             updated=info.updated, deleted=info.deleted, seconds=time.perf_counter() - started, **base)

    # ------------------------------------------------------------ deltas
    def _projection_delta(self, eng: _Engine, con: duckdb.DuckDBPyConnection, types: dict[str, str]) -> tuple[pa.Table, pa.Table, int]:
        delta = eng.query(_projection_delta_sql(self._query, eng.dialect, eng.name("feed"), eng.purged))
        con.register("pdelta", delta)
        upserts = con.execute(f"SELECT {_cast_list(self._view_columns(), types, 'p')} FROM pdelta p WHERE __action = 'upsert'").to_arrow_table()
        deletes = con.execute(f'SELECT CAST(p."{SRC_ROW_ID}" AS BIGINT) AS "{SRC_ROW_ID}" FROM pdelta p WHERE __action = \'delete\'').to_arrow_table()
        return upserts, deletes, 0

    def _aggregate_delta(
        self, eng: _Engine, con: duckdb.DuckDBPyConnection, source: Table, b: int, types: dict[str, str]
    ) -> tuple[pa.Table, pa.Table, int]:
        query = self._query
        keys, aggs = query.keys, query.aggregates
        delta = eng.query(_aggregate_delta_sql(query, eng.dialect, eng.name("feed")))
        if delta.num_rows == 0:
            return _empty(self._table.arrow_schema), pa.table({GROUP_KEY: pa.array([], pa.string())}), 0
        con.register("delta", delta)
        typed_keys = [f'CAST(d."{_e(k.name)}" AS {types[k.name]})' for k in keys]
        key_cols = "".join(f'{t} AS "{_e(k.name)}", ' for t, k in zip(typed_keys, keys, strict=True))
        con.execute(f"CREATE TEMP TABLE d AS SELECT {key_cols}{_key_text(typed_keys, [types[k.name] for k in keys])} AS __key, d.* EXCLUDE ({_names(k.name for k in keys)}) FROM delta d"
                    if keys else "CREATE TEMP TABLE d AS SELECT '[]' AS __key, d.* FROM delta d")
        # The next raw state of each affected group (min/max NULL where undecidable).
        cols = [f'd."{_e(k.name)}"' for k in keys] + [f"c.{GROUP_KEY} IS NOT NULL AS __exists", "d.__key AS __key",
                                                    f"COALESCE(c.{GROUP_ROWS}, 0) + d.__d_rows AS {GROUP_ROWS}"]
        rows = f"(COALESCE(c.{GROUP_ROWS}, 0) + d.__d_rows)"
        flags = [f"{rows} < 0"]
        for i, c in enumerate(aggs):
            n = f'"{_e(c.name)}"'
            if c.kind == "sum":
                nn = f'"{_e(c.hidden()[0])}"'
                cols += [f"COALESCE(c.{n}, 0) + COALESCE(d.__d_sum{i}, 0) AS {n}", f"COALESCE(c.{nn}, 0) + d.__d_nn{i} AS {nn}"]
                flags.append(f"COALESCE(c.{nn}, 0) + d.__d_nn{i} < 0")
            elif c.kind == "avg":
                s, nn = (f'"{_e(h)}"' for h in c.hidden())
                cols += [f"COALESCE(c.{s}, 0) + COALESCE(d.__d_sum{i}, 0) AS {s}", f"COALESCE(c.{nn}, 0) + d.__d_nn{i} AS {nn}"]
                flags.append(f"COALESCE(c.{nn}, 0) + d.__d_nn{i} < 0")
            elif c.kind == "count":
                cols.append(f"COALESCE(c.{n}, 0) + d.__d_nn{i} AS {n}")
                flags.append(f"COALESCE(c.{n}, 0) + d.__d_nn{i} < 0")
            elif c.kind == "count_star":
                cols.append(f"COALESCE(c.{n}, 0) + d.__d_rows AS {n}")
            else:
                better, worse = ("<", ">") if c.kind == "min" else (">", "<")
                pick = "least" if c.kind == "min" else "greatest"
                undecidable = (f"(d.__pre{i} IS NOT NULL AND (c.{n} IS NULL OR (d.__pre{i} {better}= c.{n} "
                               f"AND (d.__post{i} IS NULL OR d.__post{i} {worse} c.{n}))))")
                # A group left with no rows needs no extreme (it disappears, or a global aggregate shows NULL).
                undecidable = f"({rows} > 0 AND {undecidable})"
                cols.append(f"CASE WHEN {rows} = 0 OR {undecidable} THEN NULL ELSE {pick}(c.{n}, d.__post{i}) END AS {n}")
                flags.append(undecidable)
        cols.append(f"({' OR '.join(flags)}) AS __recompute")
        con.execute(f"CREATE TEMP TABLE nxt AS SELECT {', '.join(cols)} FROM d LEFT JOIN cur c ON c.{GROUP_KEY} = d.__key")

        recompute = con.execute(f"SELECT {_names(k.name for k in keys) or '1 AS __none'} FROM nxt WHERE __recompute").to_arrow_table()
        recomputed = recompute.num_rows
        parts = [f"SELECT * FROM ({self._finalize_sql('nxt', types)}) WHERE __recompute_src = FALSE"]
        if recomputed:
            eng.source(source, b)
            if keys:
                rk = recompute.rename_columns([f"__rk{i}" for i in range(len(keys))])
                eng.register("rk", rk)
                prefilter = _key_prefilter(keys, recompute) if eng.dialect == "duckdb" else None
                raw = eng.query(_raw_aggregate_sql(query, eng.dialect, eng.name("src"), eng.name("rk"), prefilter))
            else:
                raw = eng.query(_raw_aggregate_sql(query, eng.dialect, eng.name("src")))
            con.register("rec_raw", raw)
            con.execute(f"CREATE TEMP TABLE rec AS {self._finalize_sql('rec_raw', types, with_flag=False)}")
            parts.append("SELECT *, FALSE AS __recompute_src FROM rec")
        # Groups that stay: non-empty ones (a global aggregate's single row always stays).
        keep = f"{GROUP_ROWS} > 0" if keys else "TRUE"
        con.execute(f"CREATE TEMP TABLE new AS SELECT * EXCLUDE (__recompute_src) FROM ({' UNION ALL BY NAME '.join(parts)}) WHERE {keep}")
        upserts = _changed_rows(con, "new", "cur", GROUP_KEY, self._table.arrow_schema.names)
        deletes = con.execute(
            f"SELECT __key AS {GROUP_KEY} FROM nxt WHERE __exists AND __key NOT IN (SELECT {GROUP_KEY} FROM new)"
        ).to_arrow_table()
        return upserts, deletes, recomputed

    def _rebuild(
        self, eng: _Engine, con: duckdb.DuckDBPyConnection, source: Table, b: int, types: dict[str, str]
    ) -> tuple[pa.Table, pa.Table, int]:
        """The whole query at source version ``b``, diffed with the view's current rows."""
        eng.source(source, b)
        if self.shape == "projection":
            raw = eng.query(_projection_sql(self._query, eng.dialect, eng.name("src")))
            con.register("raw", raw)
            con.execute(f"CREATE TEMP TABLE new AS SELECT {_cast_list(self._view_columns(), types, 'r')} FROM raw r")
            key = SRC_ROW_ID
        else:
            raw = eng.query(_raw_aggregate_sql(self._query, eng.dialect, eng.name("src")))
            con.register("raw", raw)
            con.execute(f"CREATE TEMP TABLE new AS {self._finalize_sql('raw', types, with_flag=False)}")
            if self._query.keys:
                con.execute(f"DELETE FROM new WHERE {GROUP_ROWS} = 0")
            key = GROUP_KEY
        upserts = _changed_rows(con, "new", "cur", key, self._table.arrow_schema.names)
        deletes = duck.fetch_arrow(con, f'SELECT c."{key}" FROM cur c ANTI JOIN new n ON n."{key}" = c."{key}"')
        return upserts, deletes, 0

    def _types(self) -> dict[str, str]:
        """DuckDB types of the view table's columns (from the definition, else from the table)."""
        names = self._view_columns()
        if all(n in self._query.types for n in names):
            return dict(self._query.types)
        return dict(duckdb_types(self._table.arrow_schema))

    def _view_columns(self) -> list[str]:
        return self._table.arrow_schema.names

    def _finalize_sql(self, raw: str, types: dict[str, str], with_flag: bool = True) -> str:
        """View rows (MV schema order) from a raw per-group state relation."""
        query = self._query
        exprs: dict[str, str] = {}
        typed_keys = [f'CAST(r."{_e(k.name)}" AS {types[k.name]})' for k in query.keys]
        for k, t in zip(query.keys, typed_keys, strict=True):
            exprs[k.name] = t
        for c in query.aggregates:
            n = f'r."{_e(c.name)}"'
            if c.kind == "sum":
                nn = f'r."{_e(c.hidden()[0])}"'
                exprs[c.name] = f"CASE WHEN COALESCE({nn}, 0) = 0 THEN NULL ELSE CAST({n} AS {types[c.name]}) END"
                exprs[c.hidden()[0]] = f"CAST(COALESCE({nn}, 0) AS BIGINT)"
            elif c.kind == "avg":
                s, nn = (f'r."{_e(h)}"' for h in c.hidden())
                exprs[c.name] = f"CASE WHEN COALESCE({nn}, 0) = 0 THEN NULL ELSE CAST(CAST({s} AS DOUBLE) / {nn} AS {types[c.name]}) END"
                exprs[c.hidden()[0]] = f"CASE WHEN COALESCE({nn}, 0) = 0 THEN NULL ELSE CAST({s} AS {types[c.hidden()[0]]}) END"
                exprs[c.hidden()[1]] = f"CAST(COALESCE({nn}, 0) AS BIGINT)"
            elif c.kind in ("count", "count_star"):
                exprs[c.name] = f"CAST(COALESCE({n}, 0) AS BIGINT)"
            else:
                exprs[c.name] = f"CAST({n} AS {types[c.name]})"
        exprs[GROUP_KEY] = _key_text(typed_keys, [types[k.name] for k in query.keys]) if query.keys else "'[]'"
        exprs[GROUP_ROWS] = f"CAST(COALESCE(r.{GROUP_ROWS}, 0) AS BIGINT)"
        select = ", ".join(f'{exprs[name]} AS "{_e(name)}"' for name in self._view_columns())
        flag = ", r.__recompute AS __recompute_src" if with_flag else ""
        return f"SELECT {select}{flag} FROM {raw} r"


# ---------------------------------------------------------------- helpers


def _e(name: str) -> str:
    return name.replace('"', '""')


def _names(names: Sequence[str] | Any) -> str:
    return ", ".join(f'"{_e(n)}"' for n in names)


def _cast_list(names: Sequence[str], types: dict[str, str], alias: str) -> str:
    return ", ".join(f'CAST({alias}."{_e(n)}" AS {types[n]}) AS "{_e(n)}"' for n in names)


def _key_text(typed_keys: list[str], key_types: list[str]) -> str:
    """Canonical text of group key values (the aggregate view's key column)."""
    parts = []
    for expr, t in zip(typed_keys, key_types, strict=True):
        if t in ("FLOAT", "DOUBLE", "REAL"):
            expr = f"({expr} + 0)"  # -0.0 and 0.0 are one group
        parts.append(f"CAST({expr} AS VARCHAR)")
    return f"to_json([{', '.join(parts)}]::VARCHAR[])"


_PREFILTER_MAX = 2000
_PLAIN_COLUMN = re.compile(r'^"(?:[^"]|"")+"$')


def _key_prefilter(keys: list[ViewColumn], groups: pa.Table) -> str | None:
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


def _changed_rows(con: duckdb.DuckDBPyConnection, new: str, cur: str, key: str, columns: list[str]) -> pa.Table:
    """Rows of ``new`` that are missing from ``cur`` or differ from it in some column."""
    same = " AND ".join(f'n."{_e(c)}" IS NOT DISTINCT FROM c."{_e(c)}"' for c in columns)
    return duck.fetch_arrow(
        con, f'SELECT n.* FROM {new} n LEFT JOIN {cur} c ON c."{_e(key)}" = n."{_e(key)}" WHERE c."{_e(key)}" IS NULL OR NOT ({same})'
    )


def _empty(schema: pa.Schema) -> pa.Table:
    return pa.Table.from_batches([], schema=schema)


def _read_checkpoint(table: Table, state: Any) -> _Checkpoint:
    """The source version the view reflects at ``state`` (its last refresh commit, or a newer idle record)."""
    version, src_uuid = None, None
    for c in reversed(state.lineage.commits):
        if CHECKPOINT in c.properties:
            version = int(c.properties[CHECKPOINT])
            src_uuid = c.properties.get(CHECKPOINT_UUID)
            break
    raw = state.iceberg.metadata.properties.get(PROP_IDLE)
    if raw:
        try:
            idle = json.loads(raw)
            snap = state.snapshot.snapshot_id if state.snapshot is not None else None
            if idle.get("snapshot-id") == snap and (version is None or int(idle["source-version"]) > version):
                if src_uuid is None or idle.get("source-uuid") == src_uuid:
                    return _Checkpoint(int(idle["source-version"]), idle.get("source-uuid"), idle=True)
        except (ValueError, KeyError, TypeError):
            log.warning("view %s: ignoring a malformed %s property", table.name, PROP_IDLE)
    return _Checkpoint(version, src_uuid)


def _record_idle(table: Table, state: Any, b: int, src_uuid: str) -> None:
    """Record that the view at its current snapshot also reflects source version ``b`` (no snapshot is written).

    The record names the snapshot it is about, so it is ignored once the view
    moves on; losing a race here only costs re-reading the same feed next time.
    """
    snap = state.snapshot.snapshot_id if state.snapshot is not None else None
    value = json.dumps({"snapshot-id": snap, "source-version": b, "source-uuid": src_uuid})
    try:
        ice = table.iceberg.refresh()
        current = ice.metadata.current_snapshot()
        if (current.snapshot_id if current is not None else None) != snap:
            return
        with ice.transaction() as tx:
            tx.set_properties({PROP_IDLE: value})
        table.refresh()
    except (CommitFailedException, LineageError, OSError) as exc:
        log.info("view %s: could not record the idle checkpoint (%s); the next refresh re-reads the same changes", table.name, exc)


def _spark_session(spark: Any) -> Any:
    if spark is not None:
        return spark
    try:
        from pyspark.sql import SparkSession
    except ImportError:  # pragma: no cover - pyspark is a dependency
        raise InvalidArgumentError("engine='spark' needs pyspark") from None
    active = SparkSession.getActiveSession()
    if active is None:
        raise InvalidArgumentError("engine='spark' needs spark=<SparkSession> (no active session found)")
    return active


def _view_schema(query: ViewQuery, source: Table) -> tuple[pa.Schema, dict[str, str]]:
    """The view table's Arrow schema and DuckDB types, from DuckDB's binding of the query over the source schema."""
    probe = pa.schema(list(source.arrow_schema) + [pa.field("_row_id", pa.int64())])
    con = _connect()
    try:
        con.register("src", pa.Table.from_batches([], schema=probe))

        def typeof(sql: str, what: str) -> str:
            try:
                return con.execute(f"DESCRIBE SELECT {sql} AS x FROM src").fetchall()[0][1]
            except duckdb.Error as exc:
                raise ViewQueryError(f"{what} does not work on the source's columns: {exc}") from None

        if query.where_duck:
            t = typeof(query.where_duck, f"WHERE {query.where_duck}")
            if t not in ("BOOLEAN", '"NULL"', "NULL"):
                raise ViewQueryError(f"WHERE {query.where_duck} is of type {t}, not a boolean condition")
        types: dict[str, str] = {}
        for c in query.columns:
            if c.kind == "expr":
                t = typeof(c.duck, f"the select item {c.name!r}")  # type: ignore[arg-type]
            elif c.kind in ("count", "count_star"):
                if c.duck:
                    typeof(f"COUNT({c.duck})", f"the select item {c.name!r}")
                t = "BIGINT"
            else:
                t = typeof(f"{c.kind.upper()}({c.duck})", f"the select item {c.name!r}")
                if c.kind == "sum" and t in ("HUGEINT", "UHUGEINT"):
                    t = "BIGINT"  # sums of integer columns are stored as 64-bit integers
                if c.kind == "avg":
                    st = typeof(f"SUM({c.duck})", f"the select item {c.name!r}")
                    types[c.hidden()[0]] = "BIGINT" if st in ("HUGEINT", "UHUGEINT") else st
            if t in ('"NULL"', "NULL"):
                raise ViewQueryError(f"the select item {c.name!r} is always NULL; give it a type with CAST(... AS <type>)")
            types[c.name] = t
            if c.kind == "sum":
                types[c.hidden()[0]] = "BIGINT"
            if c.kind == "avg":
                types[c.hidden()[1]] = "BIGINT"
        if query.shape == "projection":
            types[SRC_ROW_ID] = "BIGINT"
            order = query.names + [SRC_ROW_ID]
        else:
            types[GROUP_KEY] = "VARCHAR"
            types[GROUP_ROWS] = "BIGINT"
            order = query.names + [GROUP_KEY, GROUP_ROWS] + [h for c in query.aggregates for h in c.hidden()]
        select = ", ".join(f'CAST(NULL AS {types[n]}) AS "{_e(n)}"' for n in order)
        schema = con.execute(f"SELECT {select} LIMIT 0").to_arrow_table().schema
    finally:
        con.close()
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            t = pa.string()
        fields.append(pa.field(f.name, t, nullable=True))
    return pa.schema(fields), {n: types[n] for n in order}


# ---------------------------------------------------------------- public API


def create(
    name: str,
    source: Table,
    query: str,
    *,
    warehouse: str | os.PathLike[str] | None = None,
    catalog: Catalog | None = None,
) -> MaterializedView:
    """Define a materialized view ``name`` over ``source`` (a :class:`lineage.Table`).

    The query is validated now (unsupported shapes raise
    :class:`~cdf.mv_query.ViewQueryError`, an ``InvalidArgumentError``); the
    view's table is created empty, and the first :meth:`MaterializedView.refresh`
    fills it. The view lives in the source's catalog unless ``warehouse`` or
    ``catalog`` names another view of the same catalog.
    """
    if not isinstance(source, Table):
        raise InvalidArgumentError(f"source must be a lineage.Table (from lineage.open_table), got {type(source).__name__}")
    cat = resolve_catalog(warehouse, catalog) if (warehouse is not None or catalog is not None) else source.catalog
    try:
        same = open_table(source.name, catalog=cat)
    except TableNotFoundError:
        raise InvalidArgumentError(
            f"the source table {source.name} is not in the view's catalog; create the view in the source's catalog"
        ) from None
    if str(same.iceberg.metadata.table_uuid) != str(source.iceberg.metadata.table_uuid):
        raise InvalidArgumentError(f"the view's catalog has another table named {source.name}; create the view in the source's catalog")
    ns, tbl = identifier(name)
    if f"{ns}.{tbl}" == source.name:
        raise InvalidArgumentError("a view cannot have the same name as its source table")
    parsed = parse(query, source.name, source.arrow_schema.names)
    schema, types = _view_schema(parsed, source)
    parsed = dataclasses.replace(parsed, types=types)
    key = [SRC_ROW_ID] if parsed.shape == "projection" else [GROUP_KEY]
    props = {
        PROP_DEFINITION: parsed.to_json(),
        PROP_QUERY: parsed.text,
        PROP_SOURCE: source.name,
        PROP_SOURCE_UUID: str(source.iceberg.metadata.table_uuid),
        PROP_SHAPE: parsed.shape,
        # Idle checkpoints are property updates: keep the metadata log short.
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "20",
    }
    try:
        table = create_table(f"{ns}.{tbl}", schema, key=key, catalog=cat, properties=props)
    except LineageError:
        raise
    except Exception as exc:  # a column type Iceberg cannot store
        raise ViewQueryError(f"the view's columns {schema} cannot be stored in an Iceberg table: {exc}") from None
    log.info("created view %s (%s) over %s", table.name, parsed.shape, source.name)
    return MaterializedView(table, parsed)


def open_view(name: str, *, warehouse: str | os.PathLike[str] | None = None, catalog: Catalog | None = None) -> MaterializedView:
    """Open a view created by :func:`create`."""
    try:
        table = open_table(name, warehouse=warehouse, catalog=catalog)
    except TableNotFoundError:
        raise ViewNotFoundError(f"materialized view {name} does not exist in this catalog") from None
    raw = table.properties.get(PROP_DEFINITION)
    if raw is None:
        raise ViewNotFoundError(f"table {table.name} is not a materialized view (it has no {PROP_DEFINITION} property)")
    return MaterializedView(table, ViewQuery.from_json(raw))


def refresh(
    name: str,
    *,
    warehouse: str | os.PathLike[str] | None = None,
    catalog: Catalog | None = None,
    engine: str = "duckdb",
    full: bool = False,
    spark: Any = None,
) -> RefreshResult:
    """Open the view ``name`` and refresh it (see :meth:`MaterializedView.refresh`)."""
    return open_view(name, warehouse=warehouse, catalog=catalog).refresh(engine=engine, full=full, spark=spark)


def spark_refresh_job(spark: Any, name: str, warehouse: str | os.PathLike[str], *, full: bool = False) -> RefreshResult:
    """Spark job entry point: refresh view ``name`` of ``warehouse`` with the Spark engine.

    Run it from a driver script under ``spark-submit``::

        from pyspark.sql import SparkSession
        import cdf.mv
        spark = SparkSession.builder.appName("refresh shop.totals").getOrCreate()
        print(cdf.mv.spark_refresh_job(spark, "shop.totals", "/data/warehouse"))

    Executors read the source's files for the change feed (and for any
    recomputation); the driver collects only the view's delta and commits it
    with the checkpoint. Returns the :class:`RefreshResult` (its ``str`` is a
    one-line log summary).
    """
    result = refresh(name, warehouse=warehouse, engine="spark", full=full, spark=spark)
    log.info("%s", result)
    return result


# ---------------------------------------------------------------- cron entry point


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cdf.mv refresh NAME --warehouse PATH [--full] [--engine duckdb|spark] [--json]``."""
    parser = argparse.ArgumentParser(prog="python -m cdf.mv", description="Materialized views over lineage tables.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("refresh", help="refresh a view from its source's change feed (exactly once; safe to run from cron)")
    p.add_argument("name", help="the view, namespace.table")
    p.add_argument("--warehouse", required=True, help="the warehouse folder (embedded SQLite catalog)")
    p.add_argument("--engine", choices=ENGINES, default="duckdb")
    p.add_argument("--full", action="store_true", help="recompute the whole query instead of applying the change feed")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for noisy in ("pyiceberg", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    spark = None
    try:
        if args.engine == "spark":
            from pyspark.sql import SparkSession

            spark = SparkSession.builder.appName(f"refresh {args.name}").getOrCreate()
        result = refresh(args.name, warehouse=args.warehouse, engine=args.engine, full=args.full, spark=spark)
    except LineageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json()) if args.json else str(result))
    return 0


__all__ = [
    "MaterializedView",
    "RefreshResult",
    "ViewNotFoundError",
    "ViewQueryError",
    "create",
    "main",
    "open_view",
    "refresh",
    "spark_refresh_job",
]

if __name__ == "__main__":
    sys.exit(main())
