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

This module plans each write (the ``plan`` functions of :class:`Table`'s write
methods); the loop that writes and commits the plans, and the helpers it
needs, live in :mod:`lineage.writes`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError
from pyiceberg.exceptions import TableAlreadyExistsError as _IceExists
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table as IcebergTable

from index.key_index import KeyIndex, KeyIndexChange, defers_build, index_enabled
from lineage import duck, storage
from lineage.storage.fileio import store_io
from lineage.catalog import current_metadata_location, identifier, load_iceberg, resolve_catalog
from lineage.commit_log import USER_PROPERTY_PREFIXES
from lineage.errors import (
    BadPredicateError,
    InvalidArgumentError,
    KeyViolationError,
    LineageMetadataError,
    TableAlreadyExistsError,
    UnknownColumnError,
)
from lineage.outcome import has_commit, is_transient, reload
from lineage.predicate import parse_predicate, prunable_columns, quote_ident
from lineage.reconcile import reconcile_table
from lineage.scan import LINEAGE_SCHEMA, register_live_view
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
from lineage.spark import is_spark_dataframe
from lineage.state import SnapshotFiles, TableState, carried_memo, state_at
from lineage.writer import WrittenFile
from lineage.writes import keyed
from lineage.writes import spark as spark_writes
from lineage.writes.capture import old_values, split_old
from lineage.writes.checks import check_user_properties
from lineage.writes.loop import CommitInfo, Plan, ms_to_datetime, run_write
from lineage.writes.merge import merge_planner
from lineage.writes.update import update_planner
from lineage.writes.properties import (  # re-exported: the table properties keep their lineage.table names
    COPY_ON_WRITE,
    DEFAULT_RETRIES,
    MERGE_ON_READ,
    PROP_DELETE_GRANULARITY,
    PROP_DELETE_MODE,
    PROP_MERGE_MODE,
    PROP_RETRIES,
    PROP_UPDATE_MODE,
    capture_preimages,
    check_mode,
)
from lineage.writes.rows import REMOVED_COLS

PROP_LINEAGE = "lineage.enabled"
PROP_KEY_ENFORCE = "lineage.key.enforce"
_APPEND_HINT = f"use upsert to update existing rows (or set table property {PROP_KEY_ENFORCE}=false to skip this check)"
PROP_METADATA_DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"  # Iceberg's

__all__ = [
    "COPY_ON_WRITE",
    "DEFAULT_RETRIES",
    "MERGE_ON_READ",
    "PROP_DELETE_GRANULARITY",
    "PROP_DELETE_MODE",
    "PROP_KEY_ENFORCE",
    "PROP_LINEAGE",
    "PROP_MERGE_MODE",
    "PROP_RETRIES",
    "PROP_UPDATE_MODE",
    "USER_PROPERTY_PREFIXES",
    "CommitInfo",
    "Table",
    "create_table",
    "open_table",
]


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
    props = {PROP_LINEAGE: "true", "format-version": "2", PROP_DELETE_MODE: MERGE_ON_READ, PROP_UPDATE_MODE: MERGE_ON_READ, PROP_MERGE_MODE: MERGE_ON_READ,
             # Each commit writes the whole metadata JSON: keep only the last write.metadata.previous-versions-max (100)
             # of them on disk, or a table with N commits keeps O(N^2) bytes of old metadata files.
             PROP_METADATA_DELETE_AFTER_COMMIT: "true"}
    for k, v in (properties or {}).items():
        props[str(k)] = str(v)
    if props.get("format-version") != "2":
        raise InvalidArgumentError(f"format-version must be 2 (got {props['format-version']!r}); v1 has no delete files")
    for prop in (PROP_DELETE_MODE, PROP_UPDATE_MODE, PROP_MERGE_MODE):
        check_mode(props[prop], prop)
    capture_preimages(props)  # refuses a value other than true/false
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
    ice, full = load_iceberg(cat, name)
    if ice.metadata.properties.get(PROP_LINEAGE) != "true":
        raise InvalidArgumentError(
            f"table {full} is a plain Iceberg table, not a lineage table; make it one (no data is rewritten) with "
            f"lineage.adopt({full!r}, key=[...]) or `lineage adopt {full}`"
        )
    return Table(ice, cat)


class Table:
    """An Iceberg table whose rows carry ``_row_id`` and created/updated versions."""

    def __init__(self, iceberg: IcebergTable, catalog: Catalog) -> None:
        storage.register(iceberg.metadata.location, iceberg.io.properties)
        iceberg.io = store_io(iceberg.io, iceberg.metadata.location)
        self._iceberg = iceberg
        self._catalog = catalog
        # Files of the current snapshot planned or derived by this object (lineage.state.state_at);
        # a commit by anyone else changes the snapshot id and empties it.
        self._memo: dict[str, Any] = {}

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
        """The table's key columns (its Iceberg identifier fields, in schema order)."""
        schema = self._iceberg.schema()
        return [schema.find_column_name(fid) for fid in schema.identifier_field_ids]

    @property
    def arrow_schema(self) -> pa.Schema:
        """The data columns as a pyarrow schema."""
        return arrow_schema(self._iceberg.schema())

    @property
    def properties(self) -> dict[str, str]:
        """The Iceberg table properties."""
        return dict(self._iceberg.metadata.properties)

    def refresh(self) -> Table:
        """Reload the table's metadata from the catalog (only a look at the catalog's pointer when nothing moved).

        A transient catalog error is retried a few times.
        """

        def load() -> None:
            location = current_metadata_location(self._iceberg.catalog, self._iceberg.name())
            if location is None or location != self._iceberg.metadata_location:
                self._iceberg.refresh()

        error = reload(load, self.name, retry=is_transient)
        if error is not None:
            raise error
        return self

    @property
    def version(self) -> int:
        """The current version (0 before the first commit)."""
        self.refresh()
        snap = self._iceberg.metadata.current_snapshot()
        return snap.sequence_number if snap else 0

    def has_commit(self, snapshot_id: int) -> bool:
        """Whether the commit of snapshot ``snapshot_id`` landed on this table (also after the snapshot expired).

        After a :class:`~lineage.errors.CommitStateUnknownError`, ask this for
        the error's ``snapshot_ids`` before retrying the write.
        """
        if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int):
            raise InvalidArgumentError(f"snapshot_id must be an integer, got {snapshot_id!r}")
        self.refresh()
        return has_commit(self._iceberg, snapshot_id)

    def state(self, as_of: int | None = None) -> TableState:
        """The table's state at a version (current by default), for engines and tools."""
        self.refresh()
        return state_at(self._iceberg, as_of, memo=self._memo)

    def reconcile(self) -> list[int]:
        """Derive and store the lineage of other engines' commits (lineage.reconcile); their versions, oldest first."""
        self.refresh()
        self.state_in_hand(persist=True)  # through the memo: a snapshot this object planned is where reconciling starts
        return reconcile_table(self._iceberg)

    def state_in_hand(self, persist: bool = False) -> TableState:
        """The state of the metadata this object holds, without asking the catalog (write loops refresh themselves).

        ``persist``: a writer's state, whose foreign lineage is stored under the table's location (lineage.reconcile).
        """
        return state_at(self._iceberg, memo=self._memo, persist=persist)

    def history(self) -> list[CommitInfo]:
        """Every commit, oldest first, from the lineage commit log (survives snapshot expiry)."""
        lst = self.state().lineage
        return [
            CommitInfo(
                version=c.version,
                snapshot_id=c.snapshot_id,
                timestamp=ms_to_datetime(c.timestamp_ms),
                operation=c.operation,
                inserted=c.inserted,
                updated=c.updated,
                deleted=c.deleted,
                properties=dict(c.properties),
                foreign=c.foreign,
                gap=c.gap,
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
        pred = parse_predicate(where, probe, prunable_columns(schema))
        if columns is None:
            wanted = list(schema.names) + (list(LINEAGE_COLUMNS) if with_lineage else [])
        else:
            if isinstance(columns, str):
                raise InvalidArgumentError("columns must be a list of column names, not a string")
            unknown = [c for c in columns if c not in probe.names]
            if unknown:
                raise UnknownColumnError(f"columns {unknown} are not in the table (columns: {probe.names})")
            wanted = list(columns)
        con = duck.connect(isolated=True)
        try:
            duck.seal(con, register_live_view(con, "live", state.live_files(pred.prune), schema, self._field_ids()), exact_floats=pred.reads_floats)
            select = ", ".join(quote_ident(c) for c in wanted)
            try:
                result = duck.fetch_arrow(con, f"SELECT {select} FROM live WHERE {pred.sql}")
            except duckdb.IOException as exc:
                raise LineageMetadataError(f"a data or delete file of {self.name} could not be read (run verify): {exc}") from None
            except duckdb.Error as exc:
                failed = BadPredicateError(f"evaluating where {pred.sql!r} failed on the table's data: {exc}")
                raise duck.out_of_memory(exc) or failed from None
        finally:
            con.close()
        target = pa.schema([probe.field(c) for c in wanted])
        return result.cast(target) if result.schema != target else result

    def count(self, where: str | BooleanExpression | None = None, as_of: int | None = None) -> int:
        """Number of live rows at ``as_of`` (current by default) that match ``where`` (every row by default)."""
        return self.scan(where, columns=["_row_id"], as_of=as_of).num_rows

    # ------------------------------------------------------------------ writes
    def append(self, data: object) -> CommitInfo:
        """Append rows; each gets a fresh row id, created = updated = the new version.

        ``data`` is a pyarrow Table/RecordBatch/RecordBatchReader, a pandas
        DataFrame, or a Spark DataFrame (executors write the files).
        """
        if is_spark_dataframe(data):
            return spark_writes.append(self, data, check_keys=bool(self.key) and self._enforce_key())
        key = self.key
        batch = conform(to_arrow_table(data), self._iceberg.schema(), key, keep_offsets=True)
        check_keys = bool(key) and self._enforce_key()
        if check_keys:
            problem = null_or_duplicate_keys(batch, key)
            if problem:
                raise KeyViolationError(f"append rejected: {problem}")
        written: list[WrittenFile] = []

        def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
            index = KeyIndex.open(state) if check_keys else None
            if index is not None and defers_build(index, state.iceberg, batch.num_rows):
                # No live key to clash with (in-batch duplicates were refused above); the index is built on first use.
                return Plan("append", inserts=batch, inserted=batch.num_rows)
            if index is not None:
                keyed.reject_live_keys(index, batch.select(key), _APPEND_HINT)
                return Plan("append", inserts=batch, inserted=batch.num_rows, key_index=KeyIndexChange(index=index))
            files = state.live_files() if check_keys else []
            if files:  # an empty table has no key to clash with
                con.register("batch", batch.select(key))
                register_live_view(con, "live", files, self.arrow_schema, self._field_ids(), keys=("batch", key))
                names = ", ".join(quote_ident(k) for k in key)
                clash = duck.fetch_arrow(con, f"SELECT {names} FROM live LIMIT 3")
                if clash.num_rows:
                    raise KeyViolationError(f"append rejected: key value(s) already in the table, e.g. {clash.to_pylist()}; {_APPEND_HINT}")
            return Plan("append", inserts=batch, inserted=batch.num_rows)

        return run_write(self, plan, mode=MERGE_ON_READ, reuse_inserts=written)

    def delete(self, where: str | BooleanExpression, *, mode: str | None = None) -> CommitInfo:
        """Delete the live rows matching ``where`` (merge-on-read unless ``mode``/properties say otherwise)."""
        if where is None:
            raise InvalidArgumentError("where is required; use where='TRUE' to delete every row")
        pred = parse_predicate(where, self._probe_schema(), prunable_columns(self.arrow_schema))
        mode = self._mode(mode, PROP_DELETE_MODE)

        def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
            files = state.live_files(pred.prune)
            schema = self.arrow_schema
            duck.seal(con, register_live_view(con, "live", files, schema, self._field_ids()), exact_floats=pred.reads_floats)
            key = self.key if index_enabled(state.iceberg) else []
            old = old_values(schema) if self._capture() else ""
            rows, values = split_old(duck.fetch_arrow(con, f"SELECT {REMOVED_COLS}{keyed.select_list(key)}{old} FROM live WHERE ({pred.sql})"), schema)
            removed = rows.select(REMOVED_COLS.split(", "))
            change = KeyIndexChange(removed_keys=rows.select(key)) if key else None
            return Plan("delete", files=files, removed=removed, removed_values=values, deleted=removed.num_rows, key_index=change)

        return run_write(self, plan, mode=mode, isolated=True)  # the plan seals its connection

    def update(self, where: str | BooleanExpression | None, set: Mapping[str, str], *, mode: str | None = None) -> CommitInfo:  # noqa: A002
        """Set columns of the rows matching ``where`` to SQL expressions (evaluated on the old row).

        Updated rows keep their row id and created version; their updated
        version becomes the new version (plan: :mod:`lineage.writes.update`).
        """
        plan = update_planner(self, where, set, enforce_key=self._enforce_key())
        return run_write(self, plan, mode=self._mode(mode, PROP_UPDATE_MODE), isolated=True)  # the plan seals its connection

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
            return spark_writes.upsert(self, data, self._mode(mode, PROP_MERGE_MODE))
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
        extra = check_user_properties(properties)
        mode = self._mode(mode, PROP_MERGE_MODE)
        plan = merge_planner(self, batch, dkeys, skip_unchanged=skip_unchanged, operation=_operation, properties=extra)
        return run_write(self, plan, mode=mode, expected_version=expected_version)

    def reset_stream_position(self, stream_id: str, batch_id: int | None) -> None:
        """Record that change stream ``stream_id`` has applied every batch up to ``batch_id`` (an operator's word).

        For a stream whose position was lost (StreamPositionLostError: another
        engine expired snapshots before this library recorded them). Batches
        up to ``batch_id`` are then skipped, later ones apply; ``None`` says
        the stream applied nothing yet.
        """
        from lineage.writes.stream_position import reset_stream_position

        reset_stream_position(self._iceberg, stream_id, batch_id)
        self.refresh()

    def apply_changelog(
        self,
        data: object,
        *,
        op_column: str = "_op",
        upsert: bool = False,
        order_by: str | Sequence[str] | None = None,
        mode: str | None = None,
        properties: Mapping[str, str] | None = None,
        expected_version: int | None = None,
        stream: tuple[str, int] | None = None,
    ) -> CommitInfo:
        """Apply a batch of change events (Flink RowKind or Debezium codes in ``op_column``) in one commit.

        Events apply in batch order (row order, or ``order_by`` columns;
        required for a Spark DataFrame) and the commit holds each key's net
        effect. Strict mode (default) raises KeyViolationError, writing
        nothing, for events that do not fit the table; ``upsert=True`` lets
        ``+I``/``+U`` of a live key update it and ignores ``-U``/``-D`` of an
        absent key (``CommitInfo.ignored``). ``stream=(stream_id, batch_id)``
        records the batch atomically with the data; a batch at or below the
        stream's last committed batch id commits nothing. ``mode``,
        ``properties`` and ``expected_version`` work as in :meth:`merge`.
        See :mod:`lineage.writes.changelog`.
        """
        from lineage.writes.changelog import apply_changelog

        return apply_changelog(
            self, data, op_column=op_column, upsert=upsert, order_by=order_by, mode=self._mode(mode, PROP_MERGE_MODE),
            properties=properties, expected_version=expected_version, stream=stream,
        )

    # ------------------------------------------------------------------ maintenance
    def compact(self, target_file_size_bytes: int | None = None, min_file_size_bytes: int | None = None) -> Any:
        """Rewrite data files with deletes or small files (lineage kept, no change events)."""
        from lineage.maintenance import compact

        return compact(self, target_file_size_bytes, min_file_size_bytes)

    def rewrite_deletes(self, granularity: str | None = None) -> Any:
        """Merge position delete files into one per data file (or per partition)."""
        from lineage.maintenance import rewrite_deletes

        return rewrite_deletes(self, granularity)

    def convert_equality_deletes(self) -> Any:
        """CONVERT every equality delete file into position deletes (same answers; see lineage.maintenance.convert)."""
        from lineage.maintenance.convert import convert_table

        return convert_table(self)

    def expire_snapshots(self, older_than: Any = None, retain_last: int = 1) -> Any:
        """Expire old snapshots (the change feed does not need them)."""
        from lineage.maintenance import expire_snapshots

        return expire_snapshots(self, older_than, retain_last)

    def carry_files(self, snapshot_id: int, files: SnapshotFiles | None) -> None:
        """Keep the live files a commit of this object derived for its snapshot, so the next write does not plan them.

        Called by the write loop after each commit; they are dropped as soon
        as the table's current snapshot is another one (see :func:`lineage.state.state_at`).
        """
        self._memo = carried_memo(snapshot_id, files)

    def rewrite_manifests(self, dry_run: bool = False) -> Any:
        """Merge the current snapshot's manifests (for tables that already have many); see lineage.maintenance.upkeep."""
        from lineage.maintenance import rewrite_manifests

        return rewrite_manifests(self, dry_run)

    def maintain(self, dry_run: bool = False) -> Any:
        """Run the upkeep a long-lived table needs, as its properties say (see lineage.maintenance.upkeep).

        Returns a ``MaintenanceReport`` (``print`` it for a summary). With
        ``dry_run`` nothing changes and the report says what would run.
        """
        from lineage.maintenance import maintain

        report = maintain(self, dry_run)
        if not dry_run:
            self.state().files()  # plan the new snapshot's files now, not in the next write
        return report

    def vacuum(self, older_than: Any = None, dry_run: bool = False) -> Any:
        """Delete files nothing needs any more (pinned files inside the retention window are kept)."""
        from lineage.maintenance import vacuum
        from lineage.maintenance.vacuum import DEFAULT_ORPHAN_AGE

        return vacuum(self, DEFAULT_ORPHAN_AGE if older_than is None else older_than, dry_run)

    def rehome(self, max_live_fraction: float = 0.1) -> Any:
        """Copy still-needed images out of sparse pinned files so vacuum can release them."""
        from lineage.maintenance import rehome

        return rehome(self, max_live_fraction)

    def reindex(self) -> Any:
        """Rebuild the key index from a scan of the key columns (a maintenance commit; see index.key_index)."""
        from lineage.maintenance import reindex

        return reindex(self)

    def merge_key_index(self, full: bool = False) -> Any:
        """Merge key index segments per the table's merge policy (all into one with ``full``)."""
        from lineage.maintenance import merge_key_index

        return merge_key_index(self, full)

    def purge(self, where: str | BooleanExpression) -> Any:
        """Erase matching rows for good (GDPR): live data, pinned files, archives; see lineage.maintenance.purge."""
        from lineage.maintenance import purge

        return purge(self, where)

    # ------------------------------------------------------------------ Spark
    def to_spark(self, spark: Any, as_of: int | None = None, with_lineage: bool = True) -> Any:
        """The table at ``as_of`` as a Spark DataFrame with ``_row_id`` and the version columns."""
        from lineage import spark as spark_io

        return spark_io.to_spark(spark, self.state(as_of), with_lineage)

    # ------------------------------------------------------------------ internals
    def _probe_schema(self) -> pa.Schema:
        return pa.schema(list(self.arrow_schema) + LINEAGE_SCHEMA)

    def _field_ids(self) -> dict[str, int] | None:
        return projection_field_ids(self._iceberg.metadata)

    def _capture(self) -> bool:
        return capture_preimages(self._iceberg.metadata.properties)

    def _enforce_key(self) -> bool:
        raw = self._iceberg.metadata.properties.get(PROP_KEY_ENFORCE, "true").lower()
        if raw not in ("true", "false"):
            raise InvalidArgumentError(f"table property {PROP_KEY_ENFORCE} must be 'true' or 'false', got {raw!r}")
        return raw == "true"

    def _mode(self, mode: str | None, prop: str) -> str:
        if mode is None:
            return check_mode(self._iceberg.metadata.properties.get(prop, MERGE_ON_READ), f"table property {prop}")
        return check_mode(mode, "mode")


def _key_schema(table: Table) -> pa.Schema:
    """A schema with only the key columns, as required fields (for delete-key batches)."""
    from lineage.schema import iceberg_schema as _to_iceberg

    fields = [table.arrow_schema.field(k) for k in table.key]
    return _to_iceberg(pa.schema(fields), table.key)
