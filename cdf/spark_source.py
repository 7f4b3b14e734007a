"""The change feed as a Spark Structured Streaming source: ``spark.readStream.format("lineage_changes")``.

Register it once per session with :func:`cdf.spark.register_source`, then::

    (spark.readStream.format("lineage_changes")
        .option("table", "shop.orders").option("warehouse", "wh")
        .option("startingVersion", 12)
        .load())

**Offsets are table versions.** The offset after a micro-batch is the last
version it covers (``{"version": v}`` in Spark's offset log), and the batch
over ``(start, end]`` is exactly the per-version feed ``cdf.changes(table,
start, end)``, in its order. The driver plans no row: it cuts the batch
into units by the commit log's counts (:func:`cdf.spark_groups.stream_units`:
consecutive versions together while they hold at most ``rowsPerPartition``
images, a larger version alone in equal ranges of row ids) and sends each
Spark task one unit and the paths of the metadata it needs (index
segments, lineage segments, live files: :class:`cdf.spark_groups.FeedSource`).
The task builds the unit's pointers and plan with the embedded engine's
code and reads the values with its reader, in parts of at most
``rowsPerPartition`` rows (update pairs whole), so neither the driver nor a
task holds the pointers of the whole batch. A range of an immutable history is deterministic, so a
micro-batch replayed after a crash is the same rows, which is what Spark's
checkpoint needs for exactly-once delivery into an idempotent sink.

**Start.** ``startingVersion`` is inclusive, as in Delta Lake (12 reads the
changes of version 12 on, i.e. ``cdf.changes(table, 11)``), or ``latest``
(changes committed after the query's first batch); ``startingTimestamp``
starts at the first version committed at or after it. One of them is
required: unlike Delta, the stream does not begin with a snapshot of the
table. A query restarted from its checkpoint ignores them and goes on from
its offsets.

**Limits.** ``maxVersionsPerTrigger`` and ``maxRowsPerTrigger`` (soft:
counted from the commit log, a version is never split, the first is always
taken) bound a micro-batch; ``Trigger.AvailableNow`` reads up to the version
current when the query started, in batches that respect them. Spark hands
the limit to ``latestOffset`` as a ``ReadLimit``: ``ReadAllAvailable``
(``Trigger.Once``) means no limit, any other means the options' limits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxFiles, ReadMaxRows, SupportsTriggerAvailableNow

import cdf.groups as groups
from cdf.api import DEFAULT_BATCH_ROWS, data_schema
from cdf.groups import Unit
from cdf.spark_groups import FeedSource, cast_to, stream_units, unit_parts
from cdf.stream import row_bytes
from cdf.follow import next_end
from cdf.output import change_schema
from cdf.retention import resolve_range, timestamp_ms, version_at, window
from lineage.errors import FeedSchemaChangedError, HistoryGapError, InvalidArgumentError, RetentionError, UnknownVersionError
from lineage.memory import release_if_grown
from lineage.state import TableState
from lineage.table import Table, open_table

FORMAT = "lineage_changes"
NOT_PINNED = -1  # the offset of a "latest" query before its first batch pinned the version it starts after

OPTIONS = (
    "table", "path", "warehouse", "catalog", "startingVersion", "startingTimestamp", "maxVersionsPerTrigger",
    "maxRowsPerTrigger", "columns", "rowsPerPartition", "readChangeFeed",
)


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, checked (Spark hands them over as case-insensitive strings)."""

    table: str
    warehouse: str | None = None
    catalog: str | None = None
    catalog_properties: dict[str, str] = field(default_factory=dict)
    starting_version: int | None = None  # inclusive
    starting_latest: bool = False
    starting_timestamp: int | str | None = None
    max_versions: int | None = None
    max_rows: int | None = None
    columns: tuple[str, ...] | None = None
    rows_per_partition: int = DEFAULT_BATCH_ROWS

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Check ``options`` (keys in any case) and read them."""
        known = {k.lower(): k for k in OPTIONS}
        raw = {str(k).lower(): str(v) for k, v in options.items()}
        unknown = sorted(k for k in raw if k not in known and not k.startswith("catalog."))
        if unknown:
            raise InvalidArgumentError(f"unknown option(s) {unknown} of the {FORMAT} source; its options are {', '.join(OPTIONS)} and catalog.<property>")
        if raw.get("readchangefeed", "true").lower() != "true":
            raise InvalidArgumentError(f"the {FORMAT} source always reads the change feed: readChangeFeed may only be true")
        name = raw.get("table") or raw.get("path")
        if not name:
            raise InvalidArgumentError(f"the {FORMAT} source needs the table: .option('table', 'namespace.table') or .load('namespace.table')")
        props = {k[len("catalog."):]: v for k, v in raw.items() if k.startswith("catalog.")}
        if not raw.get("warehouse") and not raw.get("catalog") and not props:
            raise InvalidArgumentError(f"the {FORMAT} source needs the catalog: option warehouse (a local folder with the embedded "
                                       "catalog), or catalog (a pyiceberg catalog name) and/or catalog.<property> options")
        starts = [k for k in ("startingversion", "startingtimestamp") if k in raw]
        if len(starts) != 1:
            raise InvalidArgumentError(
                f"pass exactly one of startingVersion (a version, inclusive, or 'latest') and startingTimestamp, got {len(starts)}; "
                "the stream does not begin with a snapshot of the table as Delta's does without them"
            )
        version, latest, ts = None, False, None
        if "startingversion" in raw:
            text = raw["startingversion"].strip()
            if text.lower() == "latest":
                latest = True
            else:
                version = _number(text, "startingVersion", 0)
        else:
            text = raw["startingtimestamp"].strip()
            ts = int(text) if text.isdigit() else text
        columns = None
        if raw.get("columns"):
            columns = tuple(c.strip() for c in raw["columns"].split(",") if c.strip())
        return cls(
            table=name, warehouse=raw.get("warehouse") or None, catalog=raw.get("catalog") or None, catalog_properties=props,
            starting_version=version, starting_latest=latest, starting_timestamp=ts,
            max_versions=_number(raw["maxversionspertrigger"], "maxVersionsPerTrigger", 1) if "maxversionspertrigger" in raw else None,
            max_rows=_number(raw["maxrowspertrigger"], "maxRowsPerTrigger", 1) if "maxrowspertrigger" in raw else None,
            columns=columns,
            rows_per_partition=_number(raw.get("rowsperpartition", str(DEFAULT_BATCH_ROWS)), "rowsPerPartition", 1),
        )

    def open(self) -> Table:
        """The table, from the embedded catalog in ``warehouse`` or a pyiceberg catalog."""
        if self.catalog is None and not self.catalog_properties:
            return open_table(self.table, warehouse=self.warehouse)
        from pyiceberg.catalog import load_catalog

        props = dict(self.catalog_properties)
        if self.warehouse and "warehouse" not in props:
            props["warehouse"] = self.warehouse
        return open_table(self.table, catalog=load_catalog(self.catalog or "default", **props))


def _number(text: str, what: str, low: int) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise InvalidArgumentError(f"option {what} must be a whole number >= {low}, got {text!r}") from None
    if value < low:
        raise InvalidArgumentError(f"option {what} must be a whole number >= {low}, got {text!r}")
    return value


def feed_struct(table: Table, state: TableState, columns: tuple[str, ...] | None) -> Any:
    """The stream's Spark schema: the feed's columns (:func:`cdf.output.change_schema`), every one nullable."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructField, StructType

    schema = change_schema(data_schema(table, columns), bool(state.lineage.purged))
    return StructType([StructField(f.name, f.dataType, True) for f in from_arrow_schema(schema)])


class ChangeFeedPartition(InputPartition):
    """One part of a micro-batch: a unit of the feed (versions ``(lo, hi]``, a range of row ids) and where its
    metadata is, by path (:class:`cdf.spark_groups.FeedSource`); the task plans and reads it."""

    def __init__(self, source: FeedSource, unit: Unit, data: pa.Schema, batch_rows: int, width: int) -> None:
        super().__init__(None)
        self.source = source
        self.unit = unit
        self.data = data
        self.batch_rows = batch_rows
        self.width = width

    def __repr__(self) -> str:
        rows = "" if self.unit.rows is None else f", row ids {self.unit.rows[0]}..{self.unit.rows[1]}"
        return f"ChangeFeedPartition(versions {self.unit.lo + 1}..{self.unit.hi}{rows})"


class ChangeFeedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The stream reader: offsets, micro-batch planning (driver) and value reads (executors)."""

    def __init__(self, options: SourceOptions, schema: Any) -> None:
        self.options = options
        self.schema = schema
        self._table: Table | None = None  # opened on the driver's planner at first use; never pickled
        self._target: int | None = None  # Trigger.AvailableNow: the last version to read
        self._seen: int | None = None  # the table's version at the planner's last look

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_table": None}

    # ------------------------------------------------------------ driver side
    def _state(self) -> tuple[Table, TableState]:
        if self._table is None:
            self._table = self.options.open()
        state = self._table.state()  # refreshed: new commits, foreign ones reconciled
        self._seen = state.version
        found = feed_struct(self._table, state, self.options.columns)
        if found != self.schema:
            old, new = [f"{f.name} {f.dataType.simpleString()}" for f in self.schema], [f"{f.name} {f.dataType.simpleString()}" for f in found]
            raise FeedSchemaChangedError(
                f"the change feed of {self._table.name} now has the columns [{', '.join(new)}], but this streaming query "
                f"was started with [{', '.join(old)}] (the table's schema changed, or a first purge added _purged); the query "
                "stops so that no micro-batch changes its shape: restart it from its checkpoint to read on with the new columns "
                "(versions before the change then read with them too, as cdf.changes does)"
            )
        return self._table, state

    def initialOffset(self) -> dict:
        """The version a new query starts after (``NOT_PINNED`` for ``latest``: its first batch pins it)."""
        opts = self.options
        if opts.starting_latest:
            return {"version": NOT_PINNED}
        _, state = self._state()
        if opts.starting_version is not None:
            what, start = f"startingVersion {opts.starting_version}", max(opts.starting_version - 1, 0)
        else:
            what, start = f"startingTimestamp {opts.starting_timestamp}", _version_before(state, opts.starting_timestamp)
        inclusive = f"{what} (inclusive: the stream reads cdf.changes(table, {start}) on)"
        try:
            resolve_range(state, start, None)
        except HistoryGapError as exc:
            raise HistoryGapError(f"{inclusive}: {exc}") from exc
        except RetentionError as exc:
            raise RetentionError(f"{inclusive}: {exc}; a stream may start at version {window(state).oldest + 1} at the earliest") from exc
        except UnknownVersionError as exc:
            raise UnknownVersionError(f"{inclusive}: {exc}; a stream may start at version {state.version + 1} at the latest") from exc
        return {"version": start}

    def getDefaultReadLimit(self) -> ReadLimit:
        """Our limits as a ``ReadLimit`` Spark hands back to :meth:`latestOffset` (``ReadAllAvailable`` without limits)."""
        if self.options.max_rows is not None:
            return ReadMaxRows(self.options.max_rows)
        if self.options.max_versions is not None:
            return ReadMaxFiles(self.options.max_versions)  # a version is what Delta's sources count as a file
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: read up to the version current now, and no further."""
        _, state = self._state()
        self._target = state.version

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next micro-batch after ``start`` (``start`` itself when there is nothing new)."""
        _, state = self._state()
        current = state.version if self._target is None else min(state.version, self._target)
        if start["version"] == NOT_PINNED:  # "latest": the first batch is empty and ends at the current version
            return {"version": current}
        unlimited = isinstance(limit, ReadAllAvailable)
        end = next_end(state, int(start["version"]), max_versions=None if unlimited else self.options.max_versions,
                       max_rows=None if unlimited else self.options.max_rows, until=current)
        return {"version": end}

    def reportLatestOffset(self) -> dict | None:
        """The table's version at the last look, for the query's progress reports."""
        return None if self._seen is None else {"version": self._seen}

    def partitions(self, start: dict, end: dict) -> list[ChangeFeedPartition]:
        """The parts of the micro-batch over versions ``(start, end]``: the per-version feed, planned from metadata."""
        a, b = int(start["version"]), int(end["version"])
        if a == NOT_PINNED or b <= a:
            return []
        table, state = self._state()
        try:
            resolve_range(state, a, b)
        except RetentionError as exc:
            raise type(exc)(f"the stream's next micro-batch reads the changes after version {a} up to {b}: {exc}; a query "
                            "that fell out of the retention window cannot go on: start a new one (a new checkpoint)") from exc
        data = data_schema(table, self.options.columns)
        try:
            groups.check_files(state, a, b)  # a lost file fails the batch here, as planning it whole would
            source = FeedSource.of(state, a, b)
            width, _ = row_bytes(state, data, 0)
            units = stream_units(state, a, b, self.options.rows_per_partition)
        finally:
            release_if_grown()
        return [ChangeFeedPartition(source, unit, data, self.options.rows_per_partition, width) for unit in units]

    def commit(self, end: dict) -> None:
        """Nothing to release: the source keeps no state of its own between batches."""

    # ------------------------------------------------------------ executor side
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one part, as Arrow batches of the stream's schema (runs on an executor, which plans the part)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, ChangeFeedPartition)
        target = to_arrow_schema(self.schema, timezone="UTC")
        for rows in unit_parts(partition.source, partition.unit, partition.data, False, partition.batch_rows, partition.width):
            yield from cast_to(rows.select(target.names), target).to_batches()


def _version_before(state: TableState, ts: int | str | None) -> int:
    """The version a stream starting at timestamp ``ts`` starts after: the last one committed before ``ts``.

    A time in the future is refused: commits may still land before it, so the
    version is not known yet, and a query restarted before its first batch
    would pick another one.
    """
    ms = timestamp_ms(ts, "startingTimestamp")
    if ms > time.time() * 1000:
        raise InvalidArgumentError(f"startingTimestamp {ts} is in the future; pass a past time, or startingVersion 'latest'")
    return version_at(window(state), ms - 1, "startingTimestamp")


class ChangeFeedSource(DataSource):
    """The ``lineage_changes`` data source: a streaming read of a lineage table's change feed (see the module docs)."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.readStream.format("lineage_changes")``."""
        return FORMAT

    def schema(self) -> Any:
        """The feed's columns for this table and ``columns`` option, as the table is now."""
        opts = SourceOptions.parse(self.options)
        table = opts.open()
        return feed_struct(table, table.state(), opts.columns)

    def streamReader(self, schema: Any) -> ChangeFeedStreamReader:
        """The stream reader of a query with this schema."""
        return ChangeFeedStreamReader(SourceOptions.parse(self.options), schema)
