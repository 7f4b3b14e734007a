"""The Python API of the change data feed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

import cdf.captured as captured
import cdf.engine_duckdb as engine_duckdb
import cdf.engine_spark as engine_spark
import cdf.stream as stream
from cdf.output import encoded_change_schema
from cdf.retention import resolve_range, window
from cdf.stream import DEFAULT_BATCH_BYTES
import lineage.spark as spark_io
from lineage.errors import InvalidArgumentError, RetentionError, UnknownColumnError, VersionRangeError
from lineage.memory import release_at_end, release_if_grown
from lineage.state import TableState
from lineage.table import Table

DEFAULT_BATCH_ROWS = 1_000_000

ENGINES = ("duckdb", "spark")


# The data columns of a table's schema as Arrow, by (table uuid, schema id): an id never changes meaning
# (Iceberg adds a schema under a new id), so each is converted once, not at every feed call.
_ARROW_SCHEMAS: dict[tuple[str, int], pa.Schema] = {}
_ARROW_SCHEMAS_KEPT = 64


def _arrow_schema(table: Table) -> pa.Schema:
    meta = table.iceberg.metadata
    key = (meta.table_uuid.hex, meta.current_schema_id)
    schema = _ARROW_SCHEMAS.get(key)
    if schema is None:
        if len(_ARROW_SCHEMAS) >= _ARROW_SCHEMAS_KEPT:
            _ARROW_SCHEMAS.clear()
        schema = _ARROW_SCHEMAS[key] = table.arrow_schema
    return schema


def data_schema(table: Table, columns: Sequence[str] | None) -> pa.Schema:
    """The data columns a feed returns: the table's, or those of ``columns`` (checked, in that order)."""
    schema = _arrow_schema(table)
    if columns is None:
        return schema
    if isinstance(columns, str):
        raise InvalidArgumentError("columns must be a list of column names, not a string")
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise UnknownColumnError(f"columns {unknown} are not data columns of {table.name} (columns: {schema.names})")
    return pa.schema([schema.field(c) for c in columns])


def check_table(table: object) -> Table:
    """``table`` if it is a lineage table, else :class:`InvalidArgumentError`."""
    if not isinstance(table, Table):
        raise InvalidArgumentError(f"table must be a lineage.Table (from lineage.open_table), got {type(table).__name__}")
    return table


def _check_engine(engine: str, spark: Any) -> Any:
    """The Spark session of ``engine="spark"``: ``spark``, else the active session, as every Spark path of the library takes it."""
    if engine not in ENGINES:
        raise InvalidArgumentError(f"engine must be one of {ENGINES}, got {engine!r}")
    return spark_io.spark_session(spark) if engine == "spark" else spark


def changes(
    table: Table,
    from_version: int | None = None,
    to_version: int | None = None,
    *,
    net: bool = False,
    columns: Sequence[str] | None = None,
    engine: str = "duckdb",
    from_timestamp: object = None,
    to_timestamp: object = None,
    spark: Any = None,
) -> Any:
    """Changes that turn the table at ``from_version`` into the table at ``to_version``.

    The start is exclusive and the end inclusive; ``to_version=None`` means the
    current version. Timestamps (datetime, ISO string or epoch ms) select the
    version current at that instant. Returns a pyarrow Table (DuckDB engine)
    or a Spark DataFrame (``engine="spark"``) with the data columns followed by
    ``_change_type``, ``_commit_version``, ``_commit_timestamp``, ``_row_id``,
    ``_row_created_at_version``, ``_row_last_updated_at_version`` and
    ``_changed_columns``. ``net=True`` collapses each row id to its overall effect.
    In the pyarrow Table, ``_change_type`` is ``dictionary<int8, string>`` and
    ``_changed_columns`` ``list<dictionary<int32, string>>`` (the same values;
    :func:`cdf.decode_change_columns` gives ``string`` and ``list<string>``).
    """
    table = check_table(table)
    spark = _check_engine(engine, spark)
    state, a, b, data = _feed_args(table, from_version, to_version, net, columns, from_timestamp, to_timestamp)
    if engine == "spark":
        return engine_spark.changes(spark, state, a, b, data, net)
    try:
        assembled = None if net else captured.changes(state, a, b, data)  # a table that captures pre-images
        return engine_duckdb.changes(state, a, b, data, net) if assembled is None else assembled
    finally:
        release_if_grown(discount_kept=True)  # the row groups it kept for the next feed are no freed memory


def change_batches(
    table: Table,
    from_version: int | None = None,
    to_version: int | None = None,
    *,
    net: bool = False,
    columns: Sequence[str] | None = None,
    from_timestamp: object = None,
    to_timestamp: object = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    batch_bytes: int | None = DEFAULT_BATCH_BYTES,
) -> pa.RecordBatchReader:
    """The rows of :func:`changes` (embedded engine), in the same order, as a stream of record batches.

    For feeds too large to hold at once: memory holds the plan of one group
    of the feed (:mod:`cdf.groups`: at most 500,000 images, by row ids and
    version; 33 bytes per row while versions, file positions and row ids fit
    in 32 bits, up to 53 when they need 64) and one part of at most ``batch_rows`` rows and about
    ``batch_bytes`` bytes of output (64 MiB by default; None: rows only), one
    row more where that keeps an update pair together, instead of the whole
    result. A part is dropped, and freed memory returned to the system,
    before the next is read. The range is resolved and the feed planned by
    this call, so a bad range or a lost file raises here; each part's values
    are read when the reader gets to it. A part is a feed of its own (its
    pairs are compared, and in net mode dropped when equal, within it), so
    the rows are exactly those of :func:`changes`. Read the batches before a
    purge or vacuum of the table removes the files they point into.
    """
    table = check_table(table)
    if isinstance(batch_rows, bool) or not isinstance(batch_rows, int) or batch_rows < 1:
        raise InvalidArgumentError(f"batch_rows must be a whole number of rows >= 1, got {batch_rows!r}")
    if batch_bytes is not None and (isinstance(batch_bytes, bool) or not isinstance(batch_bytes, int) or batch_bytes < 1):
        raise InvalidArgumentError(f"batch_bytes must be a whole number of bytes >= 1, or None, got {batch_bytes!r}")
    state, a, b, data = _feed_args(table, from_version, to_version, net, columns, from_timestamp, to_timestamp)
    return feed_reader(state, a, b, data, net, batch_rows, batch_bytes)


def feed_reader(state: TableState, a: int, b: int, data: pa.Schema, net: bool, batch_rows: int,
                batch_bytes: int | None = DEFAULT_BATCH_BYTES) -> pa.RecordBatchReader:
    """:func:`change_batches` of a resolved range ``(a, b]`` of ``state``: planned now, values read part by part."""
    schema = encoded_change_schema(data, bool(state.lineage.purged))
    parts = stream.feed_parts(state, a, b, data, net, batch_rows, batch_bytes)  # the first group planned now

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            for part in parts:
                yield from part.to_batches()
                del part  # not held while the next part is read
        finally:
            release_at_end()

    return pa.RecordBatchReader.from_batches(schema, batches())


def _feed_args(table: Table, from_version: int | None, to_version: int | None, net: object, columns: Sequence[str] | None,
               from_timestamp: object, to_timestamp: object) -> tuple[TableState, int, int, pa.Schema]:
    """The checked arguments of a feed: the table's state, the resolved range ``(a, b]`` and the data schema."""
    if not isinstance(net, bool):
        raise InvalidArgumentError(f"net must be True or False, got {net!r}")
    state = table.state()  # refreshed first: the columns are those of the current schema
    data = data_schema(table, columns)
    a, b = resolve_range(state, from_version, to_version, from_timestamp=from_timestamp, to_timestamp=to_timestamp)
    return state, a, b, data


def deleted_rows(
    table: Table,
    since: int | None = None,
    until: int | None = None,
    *,
    columns: Sequence[str] | None = None,
    engine: str = "duckdb",
    spark: Any = None,
) -> Any:
    """Rows deleted after version ``since`` up to ``until`` (inclusive), with their last values.

    Defaults: ``since`` = the oldest version of the retention window, ``until``
    = the current version. Each deleted row appears once, with
    ``_row_deleted_at_version`` and its lineage. Rows removed by an update are
    not deleted rows (their row id lives on).
    """
    table = check_table(table)
    spark = _check_engine(engine, spark)
    data = data_schema(table, columns)
    state = table.state()
    win = window(state)
    since = win.oldest if since is None else since
    a, b = resolve_range(state, since, until)
    if engine == "spark":
        return engine_spark.deleted_rows(spark, state, a, b, data)
    try:
        return engine_duckdb.deleted_rows(state, a, b, data)
    finally:
        release_if_grown()


__all__ = ["changes", "change_batches", "deleted_rows", "RetentionError", "VersionRangeError"]
