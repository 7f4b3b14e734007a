"""Tables with row lineage: create, open, write, read.

Every write follows the same three steps, repeated if another writer wins
the commit race:

1. **plan** against the current snapshot in DuckDB: which live images are
   removed, which new images replace them (same row id), which rows are new;
2. **write** Parquet files: new data files, and either position delete files
   (merge-on-read) or rewritten data files (copy-on-write);
3. **commit**: write the lineage segment, the deleted-rows index segment and
   the lineage list, then one Iceberg snapshot whose summary points at the
   list. The snapshot is the single atomic point.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException, NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError as _IceExists
from pyiceberg.expressions import BooleanExpression
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Operation

from index.deleted_rows import RemovedImages
from lineage import duck
from lineage.duck import duckdb_types
from lineage.catalog import identifier, resolve_catalog
from lineage.commit import CommitRequest, commit_change
from lineage.errors import (
    BadPredicateError,
    LineageMetadataError,
    SchemaMismatchError,
    CommitConflictError,
    VersionMovedError,
    InvalidArgumentError,
    KeyViolationError,
    TableAlreadyExistsError,
    TableNotFoundError,
    UnknownColumnError,
)
from lineage.predicate import expression_type, parse_predicate, quote_ident
from lineage.scan import LINEAGE_SCHEMA, register_live_view
from lineage.spark import is_spark_dataframe
from lineage.schema import (
    LINEAGE_COLUMNS,
    arrow_schema,
    conform,
    iceberg_schema,
    null_or_duplicate_keys,
    partition_spec,
    projection_field_ids,
    to_arrow_table,
)
from lineage.state import LiveFile, TableState, state_at
from lineage.writer import CREATED, ROW_ID, UPDATED, WrittenFile, write_data_files, write_position_deletes

log = logging.getLogger(__name__)

MERGE_ON_READ = "merge-on-read"
COPY_ON_WRITE = "copy-on-write"
_MODES = (MERGE_ON_READ, COPY_ON_WRITE)

# Table properties (Iceberg's own names where Iceberg has one).
PROP_DELETE_MODE = "write.delete.mode"
PROP_UPDATE_MODE = "write.update.mode"
PROP_MERGE_MODE = "write.merge.mode"
PROP_DELETE_GRANULARITY = "write.delete.granularity"
PROP_RETRIES = "commit.retry.num-retries"
PROP_LINEAGE = "lineage.enabled"
PROP_KEY_ENFORCE = "lineage.key.enforce"
DEFAULT_RETRIES = 20

_ICEBERG_OPERATION = {
    "append": Operation.APPEND,
    "delete": Operation.DELETE,
    "update": Operation.OVERWRITE,
    "upsert": Operation.OVERWRITE,
    "merge": Operation.OVERWRITE,
}
USER_PROPERTY_PREFIXES = ("lineage.user.", "mv.")


@dataclass(frozen=True)
class CommitInfo:
    """What one write did. ``committed`` is False for a write that matched nothing."""

    version: int
    snapshot_id: int | None
    timestamp: _dt.datetime
    operation: str
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    data_files_added: int = 0
    delete_files_added: int = 0
    data_files_removed: int = 0
    bytes_written: int = 0
    attempts: int = 1
    committed: bool = True
    properties: dict[str, str] = field(default_factory=dict)


@dataclass
class _Plan:
    """What a write does to the state it was planned against."""

    operation: str
    files: list[LiveFile] = field(default_factory=list)
    removed: pa.Table | None = None  # __file_id, __pos, _row_id, _row_created_at_version, _row_last_updated_at_version
    new_images: pa.Table | None = None  # data columns + ROW_ID, CREATED: updated images of existing rows
    inserts: pa.Table | None = None  # data columns: rows with fresh ids
    prewritten: list[WrittenFile] = field(default_factory=list)  # files an engine (Spark) already wrote
    reusable: bool = False  # prewritten files stay valid on a retry (appends): never cleaned up between attempts
    properties: dict[str, str] = field(default_factory=dict)  # extra snapshot summary / commit log properties
    inserted: int = 0
    updated: int = 0
    deleted: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.prewritten and not any(t is not None and t.num_rows for t in (self.removed, self.new_images, self.inserts))


def _ms_to_datetime(ms: int) -> _dt.datetime:
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc)


def create_table(
    name: str,
    schema: pa.Schema,
    key: Sequence[str] | None = None,
    partition_by: Sequence[str] | None = None,
    *,
    warehouse: str | os.PathLike[str] | None = None,
    catalog: Catalog | None = None,
    properties: Mapping[str, str] | None = None,
) -> Table:
    """Create an Iceberg (format v2) table whose rows carry lineage.

    ``key`` columns become the table's identifier fields (required, used by
    :meth:`Table.upsert`). ``partition_by`` takes Iceberg transforms such as
    ``"region"``, ``"day(ts)"``, ``"bucket(16, id)"``, ``"truncate(4, name)"``.
    """
    cat = resolve_catalog(warehouse, catalog)
    ns, tbl = identifier(name)
    ischema = iceberg_schema(schema, key)
    spec = partition_spec(ischema, partition_by)
    props = {PROP_LINEAGE: "true", "format-version": "2", PROP_DELETE_MODE: MERGE_ON_READ, PROP_UPDATE_MODE: MERGE_ON_READ, PROP_MERGE_MODE: MERGE_ON_READ}
    for k, v in (properties or {}).items():
        props[str(k)] = str(v)
    if props.get("format-version") != "2":
        raise InvalidArgumentError(f"format-version must be 2 (got {props['format-version']!r}); v1 has no delete files")
    for prop in (PROP_DELETE_MODE, PROP_UPDATE_MODE, PROP_MERGE_MODE):
        _check_mode(props[prop], prop)
    try:
        cat.create_namespace(ns)
    except NamespaceAlreadyExistsError:
        pass
    try:
        ice = cat.create_table((ns, tbl), schema=ischema, partition_spec=spec, properties=props)
    except _IceExists:
        raise TableAlreadyExistsError(f"table {ns}.{tbl} already exists; open it with lineage.open_table") from None
    return Table(ice, cat)


def open_table(name: str, *, warehouse: str | os.PathLike[str] | None = None, catalog: Catalog | None = None) -> Table:
    """Open a table created by :func:`create_table`."""
    cat = resolve_catalog(warehouse, catalog)
    ns, tbl = identifier(name)
    try:
        ice = cat.load_table((ns, tbl))
    except NoSuchTableError:
        raise TableNotFoundError(f"table {ns}.{tbl} does not exist in this catalog") from None
    if ice.metadata.properties.get(PROP_LINEAGE) != "true":
        raise InvalidArgumentError(f"table {ns}.{tbl} is a plain Iceberg table, not one created with lineage.create_table")
    return Table(ice, cat)


def _check_mode(mode: str, what: str) -> str:
    if mode not in _MODES:
        raise InvalidArgumentError(f"{what} must be one of {_MODES}, got {mode!r}")
    return mode


class Table:
    """An Iceberg table whose rows carry ``_row_id`` and created/updated versions."""

    def __init__(self, iceberg: IcebergTable, catalog: Catalog) -> None:
        self._iceberg = iceberg
        self._catalog = catalog

    # ------------------------------------------------------------------ facts
    @property
    def name(self) -> str:
        """The table's name, ``namespace.table``."""
        return ".".join(self._iceberg.name()[-2:])

    @property
    def iceberg(self) -> IcebergTable:
        """The underlying pyiceberg table (refreshed by :meth:`refresh`)."""
        return self._iceberg

    @property
    def catalog(self) -> Catalog:
        """The catalog the table lives in."""
        return self._catalog

    @property
    def key(self) -> list[str]:
        """The table's key columns (its Iceberg identifier fields)."""
        return list(self._iceberg.schema().identifier_field_names())

    @property
    def arrow_schema(self) -> pa.Schema:
        """The data columns as a pyarrow schema."""
        return arrow_schema(self._iceberg.schema())

    @property
    def properties(self) -> dict[str, str]:
        """The Iceberg table properties."""
        return dict(self._iceberg.metadata.properties)

    def refresh(self) -> Table:
        """Reload the table's metadata from the catalog."""
        self._iceberg = self._iceberg.refresh()
        return self

    @property
    def version(self) -> int:
        """The current version (0 before the first commit)."""
        self.refresh()
        snap = self._iceberg.metadata.current_snapshot()
        return snap.sequence_number if snap else 0

    def state(self, as_of: int | None = None) -> TableState:
        """The table's state at a version (current by default), for engines and tools."""
        self.refresh()
        return state_at(self._iceberg, as_of)

    def history(self) -> list[CommitInfo]:
        """Every commit, oldest first, from the lineage commit log (survives snapshot expiry)."""
        lst = self.state().lineage
        return [
            CommitInfo(
                version=c.version,
                snapshot_id=c.snapshot_id,
                timestamp=_ms_to_datetime(c.timestamp_ms),
                operation=c.operation,
                inserted=c.inserted,
                updated=c.updated,
                deleted=c.deleted,
                properties=dict(c.properties),
            )
            for c in lst.commits
        ]

    # ------------------------------------------------------------------ reads
    def scan(
        self,
        where: str | BooleanExpression | None = None,
        columns: Sequence[str] | None = None,
        as_of: int | None = None,
        with_lineage: bool = True,
    ) -> pa.Table:
        """Live rows at ``as_of`` (a version; current by default) with lineage columns."""
        state = self.state(as_of)
        schema = self.arrow_schema
        probe = pa.schema(list(schema) + LINEAGE_SCHEMA)
        pred = parse_predicate(where, probe)
        if columns is None:
            wanted = list(schema.names) + (list(LINEAGE_COLUMNS) if with_lineage else [])
        else:
            if isinstance(columns, str):
                raise InvalidArgumentError("columns must be a list of column names, not a string")
            unknown = [c for c in columns if c not in probe.names]
            if unknown:
                raise UnknownColumnError(f"columns {unknown} are not in the table (columns: {probe.names})")
            wanted = list(columns)
        con = duck.connect()
        try:
            register_live_view(con, "live", state.live_files(pred.prune), schema, self._field_ids())
            select = ", ".join(quote_ident(c) for c in wanted)
            try:
                result = duck.fetch_arrow(con, f"SELECT {select} FROM live WHERE ({pred.sql})")
            except duckdb.IOException as exc:
                raise LineageMetadataError(f"a data or delete file of {self.name} could not be read (run verify): {exc}") from None
            except duckdb.Error as exc:
                raise BadPredicateError(f"evaluating where {pred.sql!r} failed on the table's data: {exc}") from None
        finally:
            con.close()
        target = pa.schema([probe.field(c) for c in wanted])
        return result.cast(target) if result.schema != target else result

    def count(self, as_of: int | None = None) -> int:
        """Number of live rows at ``as_of``."""
        return self.scan(columns=["_row_id"], as_of=as_of).num_rows

    # ------------------------------------------------------------------ writes
    def append(self, data: object) -> CommitInfo:
        """Append rows; each gets a fresh row id, created = updated = the new version.

        ``data`` is a pyarrow Table/RecordBatch/RecordBatchReader, a pandas
        DataFrame, or a Spark DataFrame (executors write the files).
        """
        if is_spark_dataframe(data):
            return self._append_spark(data)
        key = self.key
        batch = conform(to_arrow_table(data), self._iceberg.schema(), key)
        check_keys = bool(key) and self._enforce_key()
        if check_keys:
            problem = null_or_duplicate_keys(batch, key)
            if problem:
                raise KeyViolationError(f"append rejected: {problem}")
        written: list[WrittenFile] = []

        def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> _Plan:
            if check_keys:
                con.register("batch", batch.select(key))
                register_live_view(con, "live", state.live_files(), self.arrow_schema, self._field_ids(), keys=("batch", key))
                names = ", ".join(quote_ident(k) for k in key)
                clash = duck.fetch_arrow(con, f"SELECT {names} FROM live LIMIT 3")
                if clash.num_rows:
                    raise KeyViolationError(
                        f"append rejected: key value(s) already in the table, e.g. {clash.to_pylist()}; use upsert to update "
                        f"existing rows (or set table property {PROP_KEY_ENFORCE}=false to skip this check)"
                    )
            return _Plan("append", inserts=batch, inserted=batch.num_rows)

        return self._write(plan, mode=MERGE_ON_READ, reuse_inserts=written)

    def delete(self, where: str | BooleanExpression, *, mode: str | None = None) -> CommitInfo:
        """Delete the live rows matching ``where`` (merge-on-read unless ``mode``/properties say otherwise)."""
        if where is None:
            raise InvalidArgumentError("where is required; use where='TRUE' to delete every row")
        pred = parse_predicate(where, self._probe_schema())
        mode = self._mode(mode, PROP_DELETE_MODE)

        def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> _Plan:
            files = state.live_files(pred.prune)
            register_live_view(con, "live", files, self.arrow_schema, self._field_ids())
            removed = duck.fetch_arrow(con, f"SELECT {_REMOVED_COLS} FROM live WHERE ({pred.sql})")
            return _Plan("delete", files=files, removed=removed, deleted=removed.num_rows)

        return self._write(plan, mode=mode)

    def update(self, where: str | BooleanExpression | None, set: Mapping[str, str], *, mode: str | None = None) -> CommitInfo:  # noqa: A002
        """Set columns of the rows matching ``where`` to SQL expressions (evaluated on the old row).

        Updated rows keep their row id and created version; their updated
        version becomes the new version.
        """
        schema = self.arrow_schema
        if not isinstance(set, Mapping) or not set:
            raise InvalidArgumentError("set must be a non-empty mapping of column name to SQL expression")
        unknown = [c for c in set if c not in schema.names]
        if unknown:
            raise UnknownColumnError(f"set names column(s) {unknown} that the table does not have (columns: {schema.names})")
        pred = parse_predicate(where, self._probe_schema())
        for col, expr in set.items():
            if not isinstance(expr, str) or not expr.strip():
                raise InvalidArgumentError(f"set[{col!r}] must be a SQL expression string, got {expr!r}")
            _check_expression(expr, self._probe_schema(), col)
        mode = self._mode(mode, PROP_UPDATE_MODE)
        key_set = any(k in set for k in self.key) and self._enforce_key()
        # Each expression is cast to its column's type, so `"1.5"`, `"NULL"` or `"'7'"` fit any compatible column.
        types = dict(duckdb_types(schema))
        select = ", ".join(
            f"CAST(({set[c]}) AS {types[c]}) AS {quote_ident(c)}" if c in set else quote_ident(c) for c in schema.names
        )

        def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> _Plan:
            files = state.live_files(pred.prune)
            register_live_view(con, "live", files, schema, self._field_ids())
            con.execute(
                f"CREATE TEMP TABLE matched AS SELECT {select}, _row_id AS {ROW_ID}, _row_created_at_version AS {CREATED}, "
                f"{_REMOVED_COLS} FROM live WHERE ({pred.sql})"
            )
            removed = con.execute(f"SELECT {_REMOVED_COLS} FROM matched").to_arrow_table()
            names = ", ".join(quote_ident(c) for c in schema.names)
            images = con.execute(f"SELECT {names}, {ROW_ID}, {CREATED} FROM matched").to_arrow_table()
            images = _conform_images(images, self._iceberg.schema(), self.key, "update")
            if key_set:
                _check_updated_keys(con, self.key)
            return _Plan("update", files=files, removed=removed, new_images=images, updated=removed.num_rows)

        return self._write(plan, mode=mode)

    def upsert(self, data: object, *, skip_unchanged: bool = False, mode: str | None = None) -> CommitInfo:
        """Insert-or-update by the table key.

        Rows whose key matches a live row update it (same row id and created
        version); the others are inserted with fresh row ids. A batch with
        null or duplicate keys is rejected. With ``skip_unchanged`` a matched
        row equal in every column is left alone instead of updated.
        """
        if not self.key:
            raise KeyViolationError(f"table {self.name} has no key; create it with key=[...] to upsert")
        if is_spark_dataframe(data):
            return self._upsert_spark(data, mode)
        return self.merge(data, skip_unchanged=skip_unchanged, mode=mode, _operation="upsert")

    def merge(
        self,
        upserts: object = None,
        deletes: object = None,
        *,
        skip_unchanged: bool = False,
        mode: str | None = None,
        properties: Mapping[str, str] | None = None,
        expected_version: int | None = None,
        _operation: str = "merge",
    ) -> CommitInfo:
        """Upsert some rows and delete others by key, in one commit.

        ``upserts`` is a batch like :meth:`upsert`'s; ``deletes`` holds key
        values (extra columns are ignored) whose live rows are deleted. A key
        may not be in both. ``properties`` are added to the snapshot summary
        and the commit log entry (keys must start with ``lineage.user.`` or
        ``mv.``), so a consumer can commit its own checkpoint atomically with
        the data it wrote. With ``expected_version`` the merge commits only
        if the table is still at that version (a compare-and-set: a consumer
        that computed the batch from that version gets
        :class:`~lineage.errors.VersionMovedError` instead of a re-planned
        commit on newer data).
        """
        key = self.key
        if not key:
            raise KeyViolationError(f"table {self.name} has no key; create it with key=[...] to merge")
        schema = self.arrow_schema
        batch = conform(to_arrow_table(upserts), self._iceberg.schema(), key) if upserts is not None else schema.empty_table()
        problem = null_or_duplicate_keys(batch, key)
        if problem:
            raise KeyViolationError(f"{_operation} batch rejected: {problem}")
        dkeys = None
        if deletes is not None:
            raw = to_arrow_table(deletes)
            missing = [k for k in key if k not in raw.column_names]
            if missing:
                raise KeyViolationError(f"deletes must carry the key column(s) {missing}")
            dkeys = conform(raw.select(key), _key_schema(self), key)
            problem = null_or_duplicate_keys(dkeys, key)
            if problem:
                raise KeyViolationError(f"deletes rejected: {problem}")
        extra = _check_user_properties(properties)
        mode = self._mode(mode, PROP_MERGE_MODE)
        on = " AND ".join(f"b.{quote_ident(k)} = l.{quote_ident(k)}" for k in key)
        same = " AND ".join(f"b.{quote_ident(c)} IS NOT DISTINCT FROM l.{quote_ident(c)}" for c in schema.names)
        bcols = ", ".join(f"b.{quote_ident(c)}" for c in schema.names)
        keys = ", ".join(quote_ident(k) for k in key)

        def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> _Plan:
            files = state.live_files()
            con.register("batch", batch)
            probe = f"SELECT {keys} FROM batch"
            if dkeys is not None:
                con.register("dkeys", dkeys)
                both = con.execute(f"SELECT b.* FROM dkeys b SEMI JOIN batch l ON {on} LIMIT 3").to_arrow_table()
                if both.num_rows:
                    raise KeyViolationError(f"keys both upserted and deleted: {both.to_pylist()}")
                probe += f" UNION ALL SELECT {keys} FROM dkeys"
            # One scan of the key columns finds every live row the batch touches;
            # everything below joins with that small set, never with the table again.
            con.execute(f"CREATE TEMP TABLE probe AS {probe}")
            register_live_view(con, "live", files, schema, self._field_ids(), keys=("probe", key))
            con.execute("CREATE TEMP TABLE hits AS SELECT * FROM live")
            skip = f" AND NOT ({same})" if skip_unchanged else ""
            con.execute(
                f"CREATE TEMP TABLE matched AS SELECT {bcols}, l._row_id AS {ROW_ID}, l._row_created_at_version AS {CREATED}, "
                "l.__file_id, l.__pos, l._row_id, l._row_created_at_version, l._row_last_updated_at_version "
                f"FROM batch b JOIN hits l ON {on}{skip}"
            )
            removed = con.execute(f"SELECT {_REMOVED_COLS} FROM matched").to_arrow_table()
            images = con.execute(f"SELECT {', '.join(quote_ident(c) for c in schema.names)}, {ROW_ID}, {CREATED} FROM matched").to_arrow_table()
            inserts = con.execute(f"SELECT {bcols} FROM batch b ANTI JOIN hits l ON {on}").to_arrow_table()
            images = _conform_images(images, self._iceberg.schema(), key, "upsert")
            inserts = inserts.cast(schema)
            deleted = 0
            if dkeys is not None:
                gone = con.execute(f"SELECT {_REMOVED_COLS} FROM hits l SEMI JOIN dkeys b ON {on}").to_arrow_table()
                deleted = gone.num_rows
                removed = pa.concat_tables([removed, gone.cast(removed.schema)])
            return _Plan(
                _operation, files=files, removed=removed, new_images=images, inserts=inserts,
                inserted=inserts.num_rows, updated=removed.num_rows - deleted, deleted=deleted, properties=extra,
            )

        return self._write(plan, mode=mode, expected_version=expected_version)

    # ------------------------------------------------------------------ maintenance
    def compact(self, target_file_size_bytes: int | None = None, min_file_size_bytes: int | None = None) -> Any:
        """Rewrite data files with deletes or small files (lineage kept, no change events)."""
        from lineage.maintenance import compact

        return compact(self, target_file_size_bytes, min_file_size_bytes)

    def rewrite_deletes(self, granularity: str | None = None) -> Any:
        """Merge position delete files into one per data file (or per partition)."""
        from lineage.maintenance import rewrite_deletes

        return rewrite_deletes(self, granularity)

    def expire_snapshots(self, older_than: Any = None, retain_last: int = 1) -> Any:
        """Expire old snapshots (the change feed does not need them)."""
        from lineage.maintenance import expire_snapshots

        return expire_snapshots(self, older_than, retain_last)

    def vacuum(self, older_than: Any = None, dry_run: bool = False) -> Any:
        """Delete files nothing needs any more (pinned files inside the retention window are kept)."""
        from lineage.maintenance import vacuum
        from lineage.maintenance.vacuum import DEFAULT_ORPHAN_AGE

        return vacuum(self, DEFAULT_ORPHAN_AGE if older_than is None else older_than, dry_run)

    def rehome(self, max_live_fraction: float = 0.1) -> Any:
        """Copy still-needed images out of sparse pinned files so vacuum can release them."""
        from lineage.maintenance import rehome

        return rehome(self, max_live_fraction)

    def purge(self, where: str | BooleanExpression) -> Any:
        """Erase matching rows for good (GDPR): live data, pinned files, archives; see lineage.maintenance.purge."""
        from lineage.maintenance import purge

        return purge(self, where)

    # ------------------------------------------------------------------ Spark
    def to_spark(self, spark: Any, as_of: int | None = None, with_lineage: bool = True) -> Any:
        """The table at ``as_of`` as a Spark DataFrame with ``_row_id`` and the version columns."""
        from lineage import spark as spark_io

        return spark_io.to_spark(spark, self.state(as_of), with_lineage)

    def _append_spark(self, df: Any) -> CommitInfo:
        from lineage import spark as spark_io

        check_keys = bool(self.key) and self._enforce_key()
        spark_io.reject_bad_batch(self, df, keyed=check_keys)
        cache: list[WrittenFile] = []

        def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> _Plan:
            if check_keys:
                clash = spark_io.existing_keys(df.sparkSession, state, df, self.key)
                if clash:
                    raise KeyViolationError(f"append rejected: key value(s) already in the table, e.g. {clash}; use upsert")
            if not cache:
                cache.extend(spark_io.write_with_executors(self, df))
            rows = sum(w.data_file.record_count for w in cache)
            return _Plan("append", prewritten=list(cache), reusable=True, inserted=rows)

        return self._write(plan, mode=MERGE_ON_READ, reuse_inserts=cache)

    def _upsert_spark(self, df: Any, mode: str | None) -> CommitInfo:
        from lineage import spark as spark_io

        if self._mode(mode, PROP_MERGE_MODE) != MERGE_ON_READ:
            raise InvalidArgumentError("upserts of Spark DataFrames are merge-on-read only; pass mode='merge-on-read'")
        spark_io.reject_bad_batch(self, df, keyed=True)

        def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> _Plan:
            files, removed, written, updated, inserted = spark_io.plan_upsert(df.sparkSession, self, state, df)
            return _Plan("upsert", files=files, removed=removed, prewritten=written, updated=updated, inserted=inserted)

        return self._write(plan, mode=MERGE_ON_READ)

    # ------------------------------------------------------------------ internals
    def _probe_schema(self) -> pa.Schema:
        return pa.schema(list(self.arrow_schema) + LINEAGE_SCHEMA)

    def _field_ids(self) -> dict[str, int] | None:
        return projection_field_ids(self._iceberg.metadata)

    def _enforce_key(self) -> bool:
        raw = self._iceberg.metadata.properties.get(PROP_KEY_ENFORCE, "true").lower()
        if raw not in ("true", "false"):
            raise InvalidArgumentError(f"table property {PROP_KEY_ENFORCE} must be 'true' or 'false', got {raw!r}")
        return raw == "true"

    def _mode(self, mode: str | None, prop: str) -> str:
        if mode is None:
            return _check_mode(self._iceberg.metadata.properties.get(prop, MERGE_ON_READ), f"table property {prop}")
        return _check_mode(mode, "mode")

    def _write(
        self,
        plan_fn: Callable[[TableState, duckdb.DuckDBPyConnection], _Plan],
        *,
        mode: str,
        reuse_inserts: list[WrittenFile] | None = None,
        expected_version: int | None = None,
    ) -> CommitInfo:
        """Plan, write and commit, re-planning after each lost commit race.

        With ``expected_version`` every attempt first checks the table is
        still at that version, so a lost race ends in VersionMovedError.
        """
        if expected_version is not None and (not isinstance(expected_version, int) or isinstance(expected_version, bool)):
            raise InvalidArgumentError(f"expected_version must be an integer version, got {expected_version!r}")
        retries = int(self._iceberg.metadata.properties.get(PROP_RETRIES, DEFAULT_RETRIES))
        for attempt in range(1, retries + 2):
            self.refresh()
            state = state_at(self._iceberg)
            if expected_version is not None and state.version != expected_version:
                if reuse_inserts:
                    _cleanup(self._iceberg, [w.data_file.file_path for w in reuse_inserts])
                raise VersionMovedError(self.name, expected_version, state.version)
            con = duck.connect()
            created: list[str] = []
            try:
                try:
                    plan = plan_fn(state, con)
                except duckdb.Error as exc:
                    # The user's predicate or expressions failed on the data (e.g. a cast); nothing was written.
                    raise InvalidArgumentError(f"evaluating the write's predicate or expressions failed: {exc}") from None
                if plan.is_empty:
                    return self._no_op(state, plan.operation, attempt)
                try:
                    return self._materialize_and_commit(state, plan, mode, con, created, attempt, reuse_inserts)
                except CommitFailedException as exc:
                    log.info("commit of %s lost a race (attempt %d): %s", plan.operation, attempt, exc)
                    _cleanup(self._iceberg, created)
            except _Committed as done:
                raise done.error from None
            except BaseException:
                # Nothing was committed (see _Committed): the files are ours to remove.
                _cleanup(self._iceberg, created + [w.data_file.file_path for w in reuse_inserts or []])
                raise
            finally:
                con.close()
            time.sleep(min(2.0, 0.01 * 2 ** min(attempt, 8)) * random.uniform(0.5, 1.5))
        if reuse_inserts:
            _cleanup(self._iceberg, [w.data_file.file_path for w in reuse_inserts])
        raise CommitConflictError(
            f"gave up after {retries + 1} attempts: other writers kept committing to {self.name}; nothing was committed. "
            f"Retry later or raise the table property {PROP_RETRIES}"
        )

    def _no_op(self, state: TableState, operation: str, attempt: int) -> CommitInfo:
        snap = state.snapshot
        ts = _ms_to_datetime(snap.timestamp_ms) if snap else _ms_to_datetime(self._iceberg.metadata.last_updated_ms)
        return CommitInfo(
            version=state.version, snapshot_id=snap.snapshot_id if snap else None, timestamp=ts, operation=operation, attempts=attempt, committed=False
        )

    def _materialize_and_commit(
        self,
        state: TableState,
        plan: _Plan,
        mode: str,
        con: duckdb.DuckDBPyConnection,
        created: list[str],
        attempt: int,
        reuse_inserts: list[WrittenFile] | None,
    ) -> CommitInfo:
        ice = self._iceberg
        version = ice.metadata.next_sequence_number()
        written: list[WrittenFile] = []
        delete_files: list[DataFile] = []
        removed_files: list[DataFile] = []
        removed_images: list[RemovedImages] = []

        # 1. removed images: position deletes, or rewritten files
        if plan.removed is not None and plan.removed.num_rows:
            groups = _group_removed(plan.removed)
            for fid, cols in groups.items():
                removed_images.append(
                    RemovedImages(plan.files[fid].path, cols["__pos"], cols["_row_id"], cols["_row_created_at_version"], cols["_row_last_updated_at_version"], version)
                )
            if mode == MERGE_ON_READ:
                granularity = ice.metadata.properties.get(PROP_DELETE_GRANULARITY, "file")
                if granularity not in ("file", "partition"):
                    raise InvalidArgumentError(f"table property {PROP_DELETE_GRANULARITY} must be 'file' or 'partition', got {granularity!r}")
                delete_files = write_position_deletes(ice, [(plan.files[fid].data_file, cols["__pos"]) for fid, cols in groups.items()], granularity)
                created.extend(f.file_path for f in delete_files)
            else:
                kept = _kept_rows(con, [plan.files[fid] for fid in groups], groups, self.arrow_schema, self._field_ids())
                rewritten = write_data_files(ice, kept.cast(_with_hidden(self.arrow_schema, (ROW_ID, CREATED, UPDATED))))
                created.extend(w.data_file.file_path for w in rewritten)
                written.extend(rewritten)
                removed_files = [plan.files[fid].data_file for fid in groups]

        # 2. new images of updated rows, then fresh inserts
        if plan.new_images is not None and plan.new_images.num_rows:
            images = plan.new_images.sort_by(ROW_ID)
            new = write_data_files(ice, images)
            created.extend(w.data_file.file_path for w in new)
            written.extend(new)
        if plan.inserts is not None and plan.inserts.num_rows:
            if reuse_inserts:
                written.extend(reuse_inserts)  # appends do not depend on the base snapshot
            else:
                new = write_data_files(ice, plan.inserts)
                if reuse_inserts is not None:
                    reuse_inserts.extend(new)
                else:
                    created.extend(w.data_file.file_path for w in new)
                written.extend(new)

        if plan.prewritten:
            if not plan.reusable:
                created.extend(w.data_file.file_path for w in plan.prewritten)
            written.extend(plan.prewritten)

        request = CommitRequest(
            operation=plan.operation,
            iceberg_operation=_ICEBERG_OPERATION[plan.operation],
            written=written,
            delete_files=delete_files,
            removed_files=removed_files,
            removed_images=removed_images,
            inserted=plan.inserted,
            updated=plan.updated,
            deleted=plan.deleted,
            properties=plan.properties,
        )
        result = commit_change(ice, state, request, created)
        try:
            self.refresh()
        except Exception as exc:  # the commit landed; never clean up its files
            raise _Committed(exc) from exc
        return CommitInfo(
            version=result.version,
            snapshot_id=result.snapshot_id,
            timestamp=_ms_to_datetime(result.timestamp_ms),
            operation=plan.operation,
            inserted=plan.inserted,
            updated=plan.updated,
            deleted=plan.deleted,
            data_files_added=len(written),
            delete_files_added=len(delete_files),
            data_files_removed=len(removed_files),
            bytes_written=result.bytes_written,
            attempts=attempt,
        )


def _key_schema(table: Table) -> pa.Schema:
    """A schema with only the key columns, as required fields (for delete-key batches)."""
    from lineage.schema import iceberg_schema as _to_iceberg

    fields = [table.arrow_schema.field(k) for k in table.key]
    return _to_iceberg(pa.schema(fields), table.key)


def _check_user_properties(properties: Mapping[str, str] | None) -> dict[str, str]:
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


class _Committed(Exception):
    """Wraps an error raised after the commit landed, so no written file is cleaned up."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


_REMOVED_COLS = "__file_id, __pos, _row_id, _row_created_at_version, _row_last_updated_at_version"


def _with_hidden(schema: pa.Schema, hidden: Sequence[str]) -> pa.Schema:
    return pa.schema(list(schema) + [pa.field(h, pa.int64(), nullable=False) for h in hidden])


def _kept_rows(
    con: duckdb.DuckDBPyConnection,
    files: list[LiveFile],
    groups: dict[int, dict[str, np.ndarray]],
    schema: pa.Schema,
    field_ids: dict[str, int],
) -> pa.Table:
    """Rows of ``files`` that stay live (copy-on-write), with their lineage, in file order."""
    register_live_view(con, "affected", files, schema, field_ids)
    removed = pa.table(
        {
            "__file_id": np.concatenate([np.full(len(g["__pos"]), i, np.int32) for i, g in enumerate(groups.values())]),
            "__pos": np.concatenate([g["__pos"] for g in groups.values()]),
        }
    )
    con.register("removed_now", removed)
    names = ", ".join(quote_ident(c) for c in schema.names)
    return duck.fetch_arrow(
        con,
        f"SELECT {names}, _row_id AS {ROW_ID}, _row_created_at_version AS {CREATED}, _row_last_updated_at_version AS {UPDATED} "
        "FROM affected l ANTI JOIN removed_now r ON r.__file_id = l.__file_id AND r.__pos = l.__pos "
        "ORDER BY l.__file_id, l.__pos",
    )


def _group_removed(removed: pa.Table) -> dict[int, dict[str, np.ndarray]]:
    """Split removed images by file id, each sorted by position."""
    removed = removed.sort_by([("__file_id", "ascending"), ("__pos", "ascending")])
    fid = removed.column("__file_id").to_numpy()
    bounds = np.flatnonzero(np.diff(fid)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(fid)]))
    cols = {c: removed.column(c).to_numpy().astype(np.int64) for c in removed.column_names if c != "__file_id"}
    return {int(fid[s]): {c: v[s:e] for c, v in cols.items()} for s, e in zip(starts, ends, strict=True)}


def _conform_images(images: pa.Table, schema, key: Sequence[str], what: str) -> pa.Table:  # type: ignore[no-untyped-def]
    """Cast new row images to the table schema (checking required columns), keeping hidden lineage columns."""
    data = conform(images.drop_columns([ROW_ID, CREATED]), schema, key)
    if what == "update" and key and any(images.column(k).null_count for k in key):
        raise KeyViolationError("update would set a key column to null")
    return data.append_column(pa.field(ROW_ID, pa.int64(), False), images.column(ROW_ID).cast(pa.int64())).append_column(
        pa.field(CREATED, pa.int64(), False), images.column(CREATED).cast(pa.int64())
    )


def _check_updated_keys(con: duckdb.DuckDBPyConnection, key: Sequence[str]) -> None:
    """Refuse an update that would leave two live rows with the same key."""
    cols = ", ".join(quote_ident(k) for k in key)
    clash = duck.fetch_arrow(
        con,
        f"SELECT {cols} FROM (SELECT {cols} FROM live l ANTI JOIN matched m ON m.__file_id = l.__file_id AND m.__pos = l.__pos "
        f"UNION ALL SELECT {cols} FROM matched) GROUP BY ALL HAVING count(*) > 1 LIMIT 3",
    )
    if clash.num_rows:
        raise KeyViolationError(f"update rejected: it would give several rows the same key, e.g. {clash.to_pylist()}")


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


def _check_expression(expr: str, schema: pa.Schema, column: str) -> None:
    try:
        produced = expression_type(expr, schema)
    except duckdb.BinderException as exc:
        if "not found" in str(exc):
            raise UnknownColumnError(f"set[{column!r}] = {expr!r} names a column the table does not have: {exc}") from None
        raise InvalidArgumentError(f"set[{column!r}] = {expr!r} is not a valid expression for this table: {exc}") from None
    except duckdb.Error as exc:
        raise InvalidArgumentError(f"set[{column!r}] = {expr!r} is not a valid SQL expression: {exc}") from None
    if produced is None:
        raise InvalidArgumentError(f"set[{column!r}] must be a single expression, got {expr!r}")
    expected = dict(duckdb_types(schema))[column]
    if expr.strip().upper() != "NULL" and not _compatible(produced, expected):  # DuckDB types a bare NULL as INTEGER
        raise SchemaMismatchError(f"set[{column!r}] = {expr!r} produces {produced}, but column {column!r} is {expected}")


def _cleanup(iceberg: IcebergTable, paths: Sequence[str]) -> None:
    """Best-effort removal of files written for a commit that did not land."""
    for path in paths:
        try:
            iceberg.io.delete(path)
        except Exception:
            log.debug("could not remove %s (vacuum will)", path)
