"""The materialized view: its definition, its storage table, checkpoints, and exactly-once refresh.

See :mod:`cdf.mv` for the storage layout and the exactly-once argument.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa
from pyiceberg.exceptions import CommitFailedException

from cdf.mv.engines import Engine, SparkEngine, duckdb_connection
from cdf.mv.query import GROUP_KEY, GROUP_ROWS, SRC_ROW_ID, ViewQuery, ViewQueryError
from cdf.mv.stored import PROP_DEFINITION, PROP_SOURCE, check_source  # noqa: F401 - PROP_DEFINITION: kept importable here
from cdf.mv.sql import (
    aggregate_delta_sql,
    cast_list,
    esc,
    key_prefilter,
    key_text,
    name_list,
    projection_delta_sql,
    projection_sql,
    raw_aggregate_sql,
)
import lineage.duck as duck
from lineage.properties import MV_IDLE, MV_QUERY, MV_SHAPE, MV_SOURCE_UUID
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
from lineage.outcome import commit_metadata
from lineage.read.scan import file_paths, register_live_view
from lineage.iceberg.schema import projection_field_ids
from lineage.spark import spark_session
from lineage.table import Table, open_table

log = logging.getLogger("cdf.mv")

ENGINES = ("duckdb", "spark")

# View table properties (definition; mv.definition and mv.source are defined with their check in cdf.mv.stored)
# and commit properties (checkpoint).
PROP_QUERY = MV_QUERY
PROP_SOURCE_UUID = MV_SOURCE_UUID
PROP_SHAPE = MV_SHAPE
PROP_IDLE = MV_IDLE
CHECKPOINT = "mv.source-version"
CHECKPOINT_UUID = MV_SOURCE_UUID  # the commit carries the source uuid under the property's name
REFRESH_KIND = "mv.refresh"

MAX_ATTEMPTS = 5

# Fault injection for tests: called with a stage name at each step of a refresh
# ("feed", "delta", "commit", "committed"). Set it on this module (cdf.mv.view).
_FAULT_HOOK: Callable[[str], None] | None = None


def _fault(stage: str) -> None:
    if _FAULT_HOOK is not None:
        _FAULT_HOOK(stage)


class _ViewMoved(Exception):
    """The view's table is no longer at the version the refresh planned against."""

    def __init__(self, version: int) -> None:
        super().__init__(f"the view moved to version {version}")
        self.version = version


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
            spark = spark_session(spark)
            if not self._query.spark_ok:
                raise ViewQueryError(f"view {self.name} cannot be refreshed with Spark: {self._query.spark_problem}; use engine='duckdb'")
        started = time.perf_counter()
        for attempt in range(1, MAX_ATTEMPTS + 1):
            eng: Engine = SparkEngine(spark) if engine == "spark" else Engine()
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

    def _refresh_once(self, eng: Engine, engine: str, full: bool, started: float) -> RefreshResult:
        table = self._table
        table.refresh()
        state = table.state()
        expected = state.version
        cp = _read_checkpoint(table, state)
        source = self.source
        check_source(self.name, self._query, self.source_name, source.arrow_schema.names)  # before any of its SQL runs
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
        con = eng.con if eng.dialect == "duckdb" else duckdb_connection()
        try:
            # The view's fragments run on this connection: from here on it reads the source's and the view's files only.
            duck.seal(con, file_paths(src_state.live_files()) + file_paths(state.live_files()))
            if reason is not None or self.shape == "aggregate":
                # The view's rows at the version this refresh plans against (read in place, not materialised).
                field_ids = projection_field_ids(table.iceberg.metadata)
                register_live_view(con, "cur_live", state.live_files(), table.arrow_schema, field_ids)
                con.execute(f"CREATE OR REPLACE TEMP VIEW cur AS SELECT {name_list(table.arrow_schema.names)} FROM cur_live")
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
        log.info("view %s: %s to source version %d (view version %d)", self.name, status, b, info.version)
        return RefreshResult(status=status, committed=info.committed, view_version=info.version, inserted=info.inserted,
                             updated=info.updated, deleted=info.deleted, seconds=time.perf_counter() - started, **base)

    # ------------------------------------------------------------ deltas
    def _projection_delta(self, eng: Engine, con: duckdb.DuckDBPyConnection, types: dict[str, str]) -> tuple[pa.Table, pa.Table, int]:
        delta = eng.query(projection_delta_sql(self._query, eng.dialect, eng.name("feed"), eng.purged))
        con.register("pdelta", delta)
        upserts = con.execute(f"SELECT {cast_list(self._view_columns(), types, 'p')} FROM pdelta p WHERE __action = 'upsert'").to_arrow_table()
        deletes = con.execute(f'SELECT CAST(p."{SRC_ROW_ID}" AS BIGINT) AS "{SRC_ROW_ID}" FROM pdelta p WHERE __action = \'delete\'').to_arrow_table()
        return upserts, deletes, 0

    def _aggregate_delta(
        self, eng: Engine, con: duckdb.DuckDBPyConnection, source: Table, b: int, types: dict[str, str]
    ) -> tuple[pa.Table, pa.Table, int]:
        query = self._query
        keys, aggs = query.keys, query.aggregates
        delta = eng.query(aggregate_delta_sql(query, eng.dialect, eng.name("feed")))
        if delta.num_rows == 0:
            return _empty(self._table.arrow_schema), pa.table({GROUP_KEY: pa.array([], pa.string())}), 0
        con.register("delta", delta)
        typed_keys = [f'CAST(d."{esc(k.name)}" AS {types[k.name]})' for k in keys]
        key_cols = "".join(f'{t} AS "{esc(k.name)}", ' for t, k in zip(typed_keys, keys, strict=True))
        con.execute(f"CREATE TEMP TABLE d AS SELECT {key_cols}{key_text(typed_keys, [types[k.name] for k in keys])} AS __key, d.* EXCLUDE ({name_list(k.name for k in keys)}) FROM delta d"
                    if keys else "CREATE TEMP TABLE d AS SELECT '[]' AS __key, d.* FROM delta d")
        # The next raw state of each affected group (min/max NULL where undecidable).
        cols = [f'd."{esc(k.name)}"' for k in keys] + [f"c.{GROUP_KEY} IS NOT NULL AS __exists", "d.__key AS __key",
                                                    f"COALESCE(c.{GROUP_ROWS}, 0) + d.__d_rows AS {GROUP_ROWS}"]
        rows = f"(COALESCE(c.{GROUP_ROWS}, 0) + d.__d_rows)"
        flags = [f"{rows} < 0"]
        for i, c in enumerate(aggs):
            n = f'"{esc(c.name)}"'
            if c.kind == "sum":
                nn = f'"{esc(c.hidden()[0])}"'
                cols += [f"COALESCE(c.{n}, 0) + COALESCE(d.__d_sum{i}, 0) AS {n}", f"COALESCE(c.{nn}, 0) + d.__d_nn{i} AS {nn}"]
                flags.append(f"COALESCE(c.{nn}, 0) + d.__d_nn{i} < 0")
            elif c.kind == "avg":
                s, nn = (f'"{esc(h)}"' for h in c.hidden())
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

        recompute = con.execute(f"SELECT {name_list(k.name for k in keys) or '1 AS __none'} FROM nxt WHERE __recompute").to_arrow_table()
        recomputed = recompute.num_rows
        parts = [f"SELECT * FROM ({self._finalize_sql('nxt', types)}) WHERE __recompute_src = FALSE"]
        if recomputed:
            eng.source(source, b)
            if keys:
                rk = recompute.rename_columns([f"__rk{i}" for i in range(len(keys))])
                eng.register("rk", rk)
                prefilter = key_prefilter(keys, recompute) if eng.dialect == "duckdb" else None
                raw = eng.query(raw_aggregate_sql(query, eng.dialect, eng.name("src"), eng.name("rk"), prefilter))
            else:
                raw = eng.query(raw_aggregate_sql(query, eng.dialect, eng.name("src")))
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
        self, eng: Engine, con: duckdb.DuckDBPyConnection, source: Table, b: int, types: dict[str, str]
    ) -> tuple[pa.Table, pa.Table, int]:
        """The whole query at source version ``b``, diffed with the view's current rows."""
        eng.source(source, b)
        if self.shape == "projection":
            raw = eng.query(projection_sql(self._query, eng.dialect, eng.name("src")))
            con.register("raw", raw)
            con.execute(f"CREATE TEMP TABLE new AS SELECT {cast_list(self._view_columns(), types, 'r')} FROM raw r")
            key = SRC_ROW_ID
        else:
            raw = eng.query(raw_aggregate_sql(self._query, eng.dialect, eng.name("src")))
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
        typed_keys = [f'CAST(r."{esc(k.name)}" AS {types[k.name]})' for k in query.keys]
        for k, t in zip(query.keys, typed_keys, strict=True):
            exprs[k.name] = t
        for c in query.aggregates:
            n = f'r."{esc(c.name)}"'
            if c.kind == "sum":
                nn = f'r."{esc(c.hidden()[0])}"'
                exprs[c.name] = f"CASE WHEN COALESCE({nn}, 0) = 0 THEN NULL ELSE CAST({n} AS {types[c.name]}) END"
                exprs[c.hidden()[0]] = f"CAST(COALESCE({nn}, 0) AS BIGINT)"
            elif c.kind == "avg":
                s, nn = (f'r."{esc(h)}"' for h in c.hidden())
                exprs[c.name] = f"CASE WHEN COALESCE({nn}, 0) = 0 THEN NULL ELSE CAST(CAST({s} AS DOUBLE) / {nn} AS {types[c.name]}) END"
                exprs[c.hidden()[0]] = f"CASE WHEN COALESCE({nn}, 0) = 0 THEN NULL ELSE CAST({s} AS {types[c.hidden()[0]]}) END"
                exprs[c.hidden()[1]] = f"CAST(COALESCE({nn}, 0) AS BIGINT)"
            elif c.kind in ("count", "count_star"):
                exprs[c.name] = f"CAST(COALESCE({n}, 0) AS BIGINT)"
            else:
                exprs[c.name] = f"CAST({n} AS {types[c.name]})"
        exprs[GROUP_KEY] = key_text(typed_keys, [types[k.name] for k in query.keys]) if query.keys else "'[]'"
        exprs[GROUP_ROWS] = f"CAST(COALESCE(r.{GROUP_ROWS}, 0) AS BIGINT)"
        select = ", ".join(f'{exprs[name]} AS "{esc(name)}"' for name in self._view_columns())
        flag = ", r.__recompute AS __recompute_src" if with_flag else ""
        return f"SELECT {select}{flag} FROM {raw} r"


def _changed_rows(con: duckdb.DuckDBPyConnection, new: str, cur: str, key: str, columns: list[str]) -> pa.Table:
    """Rows of ``new`` that are missing from ``cur`` or differ from it in some column."""
    same = " AND ".join(f'n."{esc(c)}" IS NOT DISTINCT FROM c."{esc(c)}"' for c in columns)
    return duck.fetch_arrow(
        con, f'SELECT n.* FROM {new} n LEFT JOIN {cur} c ON c."{esc(key)}" = n."{esc(key)}" WHERE c."{esc(key)}" IS NULL OR NOT ({same})'
    )


def _empty(schema: pa.Schema) -> pa.Table:
    return pa.Table.from_batches([], schema=schema)


def _read_checkpoint(table: Table, state: Any) -> _Checkpoint:
    """The source version the view reflects at ``state`` (its last refresh commit, or a newer idle record)."""
    version, src_uuid = None, None
    for c in state.lineage.log.newest_first():
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

    def apply(ice: Any) -> None:
        with ice.transaction() as tx:
            tx.set_properties({PROP_IDLE: value})

    try:
        ice = table.refresh().iceberg
        current = ice.metadata.current_snapshot()
        if (current.snapshot_id if current is not None else None) != snap:
            return
        commit_metadata(ice, apply, lambda ice: ice.metadata.properties.get(PROP_IDLE) == value, f"view {table.name}: idle checkpoint")
    except (CommitFailedException, LineageError, OSError) as exc:
        log.info("view %s: could not record the idle checkpoint (%s); the next refresh re-reads the same changes", table.name, exc)
