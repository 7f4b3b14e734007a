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

This module is the facade users call: it checks the arguments and hands each
write to its plan in :mod:`lineage.writes` (``append``, ``delete``,
``update``, ``merge_plan``, ``changelog``), which takes the table's
:class:`~lineage.context.TableContext`; the loop that writes and commits the
plans is :func:`lineage.writes.loop.run_write`.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError
from pyiceberg.exceptions import TableAlreadyExistsError as _IceExists
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table as IcebergTable

import lineage.iceberg.v3_tables as v3_tables
from lineage.read.batched_scan import DEFAULT_BATCH_ROWS, DEFAULT_GROUP_BYTES, BatchedScan, plan_scan, read_all, scan_batches
import lineage.properties as properties
from lineage.catalog import identifier, load_iceberg, resolve_catalog
import lineage.storage.files as storage_files
from lineage.storage.commit_log import USER_PROPERTY_PREFIXES
from lineage.errors import (
    InvalidArgumentError,
    KeyViolationError,
    TableAlreadyExistsError,
)
from lineage.context import TableContext
import lineage.maintenance as maintenance
import lineage.spark as spark_io
from lineage.maintenance import MaintenanceReport, MaintenanceResult
from lineage.maintenance.convert import ConvertResult, convert_table
from lineage.maintenance.vacuum import DEFAULT_ORPHAN_AGE
from lineage.outcome import has_commit
from lineage.properties import COPY_ON_WRITE, FORMAT_VERSION, MERGE_ON_READ, capture_preimages, check_mode
from lineage.sql.predicate import parse_predicate, prunable_columns
from lineage.reconcile import reconcile_table
from lineage.iceberg.schema import (
    conform,
    iceberg_schema,
    null_or_duplicate_keys,
    partition_spec,
    to_arrow_table,
)
from lineage.spark import is_spark_dataframe
from lineage.state import SnapshotFiles, TableState
from lineage.storage.writer import WrittenFile
from lineage.writes import spark as spark_writes
from lineage.writes import spark_rewrite
from lineage.writes.append import append_planner
from lineage.writes.changelog import apply_changelog
from lineage.writes.delete import delete_planner
from lineage.writes.checks import check_user_properties
from lineage.writes.loop import run_write
from lineage.writes.plan import CommitInfo, ms_to_datetime
from lineage.writes.merge_plan import merge_planner
from lineage.writes.update import update_planner
from lineage.writes.stream_position import reset_stream_position

# The table properties keep their lineage.table names (the registry, lineage.properties, defines them).
PROP_DELETE_MODE = properties.DELETE_MODE
PROP_UPDATE_MODE = properties.UPDATE_MODE
PROP_MERGE_MODE = properties.MERGE_MODE
PROP_DELETE_GRANULARITY = properties.DELETE_GRANULARITY
PROP_RETRIES = properties.COMMIT_RETRIES
DEFAULT_RETRIES = properties.registry[PROP_RETRIES].default
PROP_LINEAGE = properties.LINEAGE_ENABLED
PROP_KEY_ENFORCE = properties.KEY_ENFORCE
PROP_METADATA_DELETE_AFTER_COMMIT = properties.METADATA_DELETE_AFTER_COMMIT

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
    format_version: int | None = None,
) -> Table:
    """Create an Iceberg table (format version 2, or 3 with ``format_version=3``) whose rows carry lineage.

    ``key`` columns become the table's identifier fields (required, used by
    :meth:`Table.upsert`). ``partition_by`` takes Iceberg transforms such as
    ``"region"``, ``"day(ts)"``, ``"bucket(16, id)"``, ``"truncate(4, name)"``.
    On format version 3 the rows' ``_row_id`` are Iceberg's native row ids,
    which every v3 reader returns, and deletes are deletion vectors.
    """
    cat = resolve_catalog(warehouse, catalog)
    ns, tbl = identifier(name)
    ischema = iceberg_schema(schema, key)
    spec = partition_spec(ischema, partition_by)
    props = {PROP_LINEAGE: "true", FORMAT_VERSION: "2", PROP_DELETE_MODE: MERGE_ON_READ, PROP_UPDATE_MODE: MERGE_ON_READ, PROP_MERGE_MODE: MERGE_ON_READ,
             # Each commit writes the whole metadata JSON: keep only the last write.metadata.previous-versions-max (100)
             # of them on disk, or a table with N commits keeps O(N^2) bytes of old metadata files.
             PROP_METADATA_DELETE_AFTER_COMMIT: "true"}
    if format_version is not None:
        props[FORMAT_VERSION] = str(format_version)
    version = v3_tables.check_format_version((properties or {}).get(FORMAT_VERSION, props[FORMAT_VERSION]))
    for k, v in (properties or {}).items():
        props[str(k)] = str(v)
    props[FORMAT_VERSION] = "2"  # pyiceberg writes no v3 metadata: the table is upgraded right after creation
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
    if version >= 3:
        try:
            v3_tables.upgrade(ice, version)
        except BaseException:
            cat.drop_table((ns, tbl))
            raise
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



def _engine(engine: str) -> str:
    if engine not in ("duckdb", "spark"):
        raise InvalidArgumentError(f"engine must be 'duckdb' or 'spark', got {engine!r}")
    return engine

class Table:
    """An Iceberg table whose rows carry ``_row_id`` and created/updated versions.

    The facade users call: it holds a :class:`lineage.context.TableContext`
    (the pyiceberg table, its catalog, the files planned for the current
    snapshot) and hands it to the operations it runs.
    """

    def __init__(self, iceberg: IcebergTable, catalog: Catalog) -> None:
        from lineage.storage.store_fileio import store_io  # pyiceberg's pyarrow FileIO (pandas): not with the library
        storage_files.register(iceberg.metadata.location, iceberg.io.properties)
        iceberg.io = store_io(iceberg.io, iceberg.metadata.location)
        self._context = TableContext(iceberg, catalog)

    # ------------------------------------------------------------------ facts
    @property
    def context(self) -> TableContext:
        """What the operations (writes, maintenance, the change feed) get: see :class:`lineage.context.TableContext`."""
        return self._context

    @property
    def name(self) -> str:
        """The table's name, ``namespace.table``."""
        return self._context.name

    @property
    def iceberg(self) -> IcebergTable:
        """The underlying pyiceberg table (refreshed by :meth:`refresh`)."""
        return self._context.iceberg

    @property
    def catalog(self) -> Catalog:
        """The catalog the table lives in."""
        return self._context.catalog

    @property
    def key(self) -> list[str]:
        """The table's key columns (its Iceberg identifier fields, in schema order)."""
        return self._context.key

    @property
    def arrow_schema(self) -> pa.Schema:
        """The data columns as a pyarrow schema."""
        return self._context.arrow_schema

    @property
    def properties(self) -> dict[str, str]:
        """The Iceberg table properties."""
        return self._context.properties

    def refresh(self) -> Table:
        """Reload the table's metadata from the catalog (only a look at the catalog's pointer when nothing moved).

        A transient catalog error is retried a few times.
        """
        self._context.refresh()
        return self

    @property
    def version(self) -> int:
        """The current version (0 before the first commit)."""
        self.refresh()
        snap = self.iceberg.metadata.current_snapshot()
        return snap.sequence_number if snap else 0

    def has_commit(self, snapshot_id: int) -> bool:
        """Whether the commit of snapshot ``snapshot_id`` landed on this table (also after the snapshot expired).

        After a :class:`~lineage.errors.CommitStateUnknownError`, ask this for
        the error's ``snapshot_ids`` before retrying the write.
        """
        if isinstance(snapshot_id, bool) or not isinstance(snapshot_id, int):
            raise InvalidArgumentError(f"snapshot_id must be an integer, got {snapshot_id!r}")
        self.refresh()
        return has_commit(self.iceberg, snapshot_id)

    def state(self, as_of: int | None = None) -> TableState:
        """The table's state at a version (current by default), for engines and tools."""
        return self._context.state(as_of)

    def reconcile(self) -> list[int]:
        """Derive and store the lineage of other engines' commits (lineage.reconcile); their versions, oldest first."""
        self.refresh()
        self.state_in_hand(persist=True)  # through the memo: a snapshot this object planned is where reconciling starts
        return reconcile_table(self.iceberg)

    def state_in_hand(self, persist: bool = False) -> TableState:
        """The state of the metadata this object holds, without asking the catalog (write loops refresh themselves).

        ``persist``: a writer's state, whose foreign lineage is stored under the table's location (lineage.reconcile).
        """
        return self._context.state_in_hand(persist)

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
        plan = self._scan_plan(where, columns, as_of, with_lineage)
        return read_all(plan)

    def scan_batches(
        self,
        where: str | BooleanExpression | None = None,
        columns: Sequence[str] | None = None,
        as_of: int | None = None,
        with_lineage: bool = True,
        batch_rows: int = DEFAULT_BATCH_ROWS,
        group_bytes: int = DEFAULT_GROUP_BYTES,
    ) -> pa.RecordBatchReader:
        """The rows :meth:`scan` returns, as a ``pyarrow.RecordBatchReader`` read a group of files at a time.

        Memory stays bounded by ``group_bytes`` of decoded rows (default 128 MiB, estimated from the files'
        metadata; a larger file is read alone) whatever the table's size. Batches have at
        most ``batch_rows`` rows. The files are fixed when this returns (the
        snapshot of ``as_of``); they are read as the reader is consumed.
        """
        return scan_batches(self._scan_plan(where, columns, as_of, with_lineage), batch_rows, group_bytes)

    def _scan_plan(
        self, where: str | BooleanExpression | None, columns: Sequence[str] | None, as_of: int | None, with_lineage: bool
    ) -> BatchedScan:
        return plan_scan(self.name, self.state(as_of), self.arrow_schema, self._field_ids(), where, columns, with_lineage)

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
            return spark_writes.append(self._context, data, check_keys=bool(self.key) and self._context.enforce_key)
        key = self.key
        batch = conform(to_arrow_table(data), self.iceberg.schema(), key, keep_offsets=True)
        check_keys = bool(key) and self._context.enforce_key
        if check_keys:
            problem = null_or_duplicate_keys(batch, key)
            if problem:
                raise KeyViolationError(f"append rejected: {problem}")
        written: list[WrittenFile] = []
        return run_write(self._context, append_planner(self._context, batch, check_keys), mode=MERGE_ON_READ, reuse_inserts=written)

    def delete(self, where: str | BooleanExpression, *, mode: str | None = None, engine: str = "duckdb", spark: Any = None) -> CommitInfo:
        """Delete the live rows matching ``where`` (merge-on-read unless ``mode``/properties say otherwise).

        ``engine="spark"``: Spark executors find the rows (``spark``, or the active session).
        """
        if where is None:
            raise InvalidArgumentError("where is required; use where='TRUE' to delete every row")
        if _engine(engine) == "spark":
            return spark_rewrite.delete(self._context, where, self._mode(mode, PROP_DELETE_MODE), spark)
        pred = parse_predicate(where, self._probe_schema(), prunable_columns(self.arrow_schema))
        mode = self._mode(mode, PROP_DELETE_MODE)
        return run_write(self._context, delete_planner(self._context, pred, mode), mode=mode, isolated=True)  # the plan seals its connection

    def update(
        self, where: str | BooleanExpression | None, set: Mapping[str, str], *, mode: str | None = None,  # noqa: A002
        engine: str = "duckdb", spark: Any = None,
    ) -> CommitInfo:
        """Set columns of the rows matching ``where`` to SQL expressions (evaluated on the old row).

        Updated rows keep their row id and created version; their updated
        version becomes the new version (plan: :mod:`lineage.writes.update`).
        ``engine="spark"``: Spark executors find the rows and write the new
        images (``spark``, or the active session).
        """
        if _engine(engine) == "spark":
            return spark_rewrite.update(self._context, where, set, self._mode(mode, PROP_UPDATE_MODE), spark, self._context.enforce_key)
        mode = self._mode(mode, PROP_UPDATE_MODE)
        return run_write(self._context, update_planner(self._context, where, set, enforce_key=self._context.enforce_key, mode=mode), mode=mode, isolated=True)  # the plan seals its connection

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
            return spark_writes.upsert(self._context, data, self._mode(mode, PROP_MERGE_MODE))
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
        batch = conform(to_arrow_table(upserts), self.iceberg.schema(), key) if upserts is not None else schema.empty_table()
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
        plan = merge_planner(self._context, batch, dkeys, skip_unchanged=skip_unchanged, operation=_operation, properties=extra)
        return run_write(self._context, plan, mode=mode, expected_version=expected_version)

    def reset_stream_position(self, stream_id: str, batch_id: int | None) -> None:
        """Record that change stream ``stream_id`` has applied every batch up to ``batch_id`` (an operator's word).

        For a stream whose position was lost (StreamPositionLostError: another
        engine expired snapshots before this library recorded them). Batches
        up to ``batch_id`` are then skipped, later ones apply; ``None`` says
        the stream applied nothing yet.
        """
        reset_stream_position(self.iceberg, stream_id, batch_id)
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
        return apply_changelog(
            self._context, data, op_column=op_column, upsert=upsert, order_by=order_by, mode=self._mode(mode, PROP_MERGE_MODE),
            properties=properties, expected_version=expected_version, stream=stream,
        )

    # ------------------------------------------------------------------ maintenance
    def compact(self, target_file_size_bytes: int | None = None, min_file_size_bytes: int | None = None, *, engine: str = "duckdb",
                spark: Any = None) -> MaintenanceResult:
        """Rewrite data files with deletes or small files (lineage kept, no change events).

        ``engine="spark"``: Spark executors rewrite the files (``spark``, or the active session).
        """
        return maintenance.compact(self._context, target_file_size_bytes, min_file_size_bytes, engine=_engine(engine), spark=spark)

    def upgrade(self, format_version: int = 3, convert_deletes: bool = True) -> MaintenanceResult:
        """Make this v2 table an Iceberg v3 table in one commit (equality deletes converted first); every v3 reader then returns its ``_row_id``."""
        return maintenance.upgrade(self._context, format_version, convert_deletes)

    def rewrite_deletes(self, granularity: str | None = None) -> MaintenanceResult:
        """Merge position delete files into one per data file (or per partition)."""
        return maintenance.rewrite_deletes(self._context, granularity)

    def convert_equality_deletes(self) -> ConvertResult:
        """CONVERT every equality delete file into position deletes, deletion vectors on v3 (same answers; see lineage.maintenance.convert)."""
        return convert_table(self._context)

    def expire_snapshots(self, older_than: _dt.datetime | _dt.timedelta | None = None, retain_last: int = 1) -> MaintenanceResult:
        """Expire old snapshots (the change feed does not need them)."""
        return maintenance.expire_snapshots(self._context, older_than, retain_last)

    def carry_files(self, snapshot_id: int, files: SnapshotFiles | None) -> None:
        """Keep the live files a commit of this object derived for its snapshot, so the next write does not plan them.

        Called by the write loop after each commit; they are dropped as soon
        as the table's current snapshot is another one (see :func:`lineage.state.state_at`).
        """
        self._context.carry_files(snapshot_id, files)

    def rewrite_manifests(self, dry_run: bool = False) -> MaintenanceResult:
        """Merge the current snapshot's manifests (for tables that already have many); see lineage.maintenance.upkeep."""
        return maintenance.rewrite_manifests(self._context, dry_run)

    def maintain(self, dry_run: bool = False) -> MaintenanceReport:
        """Run the upkeep a long-lived table needs, as its properties say (see lineage.maintenance.upkeep).

        Returns a ``MaintenanceReport`` (``print`` it for a summary). With
        ``dry_run`` nothing changes and the report says what would run.
        """
        report = maintenance.maintain(self._context, dry_run)
        if not dry_run:
            self.state().files()  # plan the new snapshot's files now, not in the next write
        return report

    def vacuum(self, older_than: _dt.timedelta | None = None, dry_run: bool = False) -> MaintenanceResult:
        """Delete files nothing needs any more (pinned files inside the retention window are kept)."""
        return maintenance.vacuum(self._context, DEFAULT_ORPHAN_AGE if older_than is None else older_than, dry_run)

    def rehome(self, max_live_fraction: float = 0.1) -> MaintenanceResult:
        """Copy still-needed images out of sparse pinned files so vacuum can release them."""
        return maintenance.rehome(self._context, max_live_fraction)

    def reindex(self) -> MaintenanceResult:
        """Rebuild the key index from a scan of the key columns (a maintenance commit; see index.key_index)."""
        return maintenance.reindex(self._context)

    def merge_key_index(self, full: bool = False) -> MaintenanceResult:
        """Merge key index segments per the table's merge policy (all into one with ``full``)."""
        return maintenance.merge_key_index(self._context, full)

    def purge(self, where: str | BooleanExpression, *, engine: str = "duckdb", spark: Any = None) -> MaintenanceResult:
        """Erase matching rows for good (GDPR): live data, pinned files, archives; see lineage.maintenance.purge.

        ``engine="spark"``: Spark executors find the rows and rewrite the files (``spark``, or the active session).
        """
        return maintenance.purge(self._context, where, engine=_engine(engine), spark=spark)

    # ------------------------------------------------------------------ Spark
    def to_spark(self, spark: Any, as_of: int | None = None, with_lineage: bool = True) -> Any:
        """The table at ``as_of`` as a Spark DataFrame with ``_row_id`` and the version columns."""
        return spark_io.to_spark(spark, self.state(as_of), with_lineage)

    # ------------------------------------------------------------------ internals
    def _probe_schema(self) -> pa.Schema:
        return self._context.probe_schema

    def _field_ids(self) -> dict[str, int] | None:
        return self._context.field_ids()

    def _capture(self) -> bool:
        return self._context.capture_preimages

    def _mode(self, mode: str | None, prop: str) -> str:
        return self._context.mode(mode, prop)


def _key_schema(table: Table) -> pa.Schema:
    """A schema with only the key columns, as required fields (for delete-key batches)."""
    fields = [table.arrow_schema.field(k) for k in table.key]
    return iceberg_schema(pa.schema(fields), table.key)
