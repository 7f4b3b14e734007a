"""The Python API of the change data feed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from cdf import engine_duckdb
from cdf.retention import resolve_range, window
from lineage.errors import InvalidArgumentError, RetentionError, UnknownColumnError, VersionRangeError
from lineage.memory import release_if_grown
from lineage.table import Table

ENGINES = ("duckdb", "spark")


def _data_schema(table: Table, columns: Sequence[str] | None) -> pa.Schema:
    schema = table.arrow_schema
    if columns is None:
        return schema
    if isinstance(columns, str):
        raise InvalidArgumentError("columns must be a list of column names, not a string")
    unknown = [c for c in columns if c not in schema.names]
    if unknown:
        raise UnknownColumnError(f"columns {unknown} are not data columns of {table.name} (columns: {schema.names})")
    return pa.schema([schema.field(c) for c in columns])


def _check_table(table: object) -> Table:
    if not isinstance(table, Table):
        raise InvalidArgumentError(f"table must be a lineage.Table (from lineage.open_table), got {type(table).__name__}")
    return table


def _check_engine(engine: str, spark: Any) -> None:
    if engine not in ENGINES:
        raise InvalidArgumentError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "spark" and spark is None:
        raise InvalidArgumentError("engine='spark' needs spark=<SparkSession>")


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
    """
    table = _check_table(table)
    _check_engine(engine, spark)
    if not isinstance(net, bool):
        raise InvalidArgumentError(f"net must be True or False, got {net!r}")
    data = _data_schema(table, columns)
    state = table.state()
    a, b = resolve_range(state, from_version, to_version, from_timestamp=from_timestamp, to_timestamp=to_timestamp)
    if engine == "spark":
        from cdf import engine_spark

        return engine_spark.changes(spark, state, a, b, data, net)
    try:
        return engine_duckdb.changes(state, a, b, data, net)
    finally:
        release_if_grown()


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
    table = _check_table(table)
    _check_engine(engine, spark)
    data = _data_schema(table, columns)
    state = table.state()
    win = window(state)
    since = win.oldest if since is None else since
    a, b = resolve_range(state, since, until)
    if engine == "spark":
        from cdf import engine_spark

        return engine_spark.deleted_rows(spark, state, a, b, data)
    try:
        return engine_duckdb.deleted_rows(state, a, b, data)
    finally:
        release_if_grown()


__all__ = ["changes", "deleted_rows", "RetentionError", "VersionRangeError"]
