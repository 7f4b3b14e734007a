"""Change-stream ingest of a Spark DataFrame: the collapse runs on executors, the driver sees only metadata.

A Spark DataFrame has no row order, so the caller names the columns that put
each key's events in order (``order_by``: a Kafka offset, a Debezium LSN, a
sequence number). The same SQL as the embedded path
(:mod:`lineage.writes.changelog_sql`) runs in Spark SQL: the events of a key
are ranked by a window partitioned by key (a shuffle by key, no collect),
checked against the live images of the batch's keys, and collapsed to each
key's last event. On a table with a key index the driver looks the batch's
distinct keys up in it (as Spark appends check their keys) and hands the
images to Spark; without one, executors scan the key columns. The driver
receives the problem counts (and at most three example events), the distinct
keys (index only), the pointers of the removed images with their keys and
the descriptors of the data files the executors wrote; never whole rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from index.key_index import KeyIndex, KeyIndexChange
import lineage.spark as spark_io
from lineage.context import TableContext
from lineage.errors import InvalidArgumentError, KeyViolationError, SchemaMismatchError
from lineage.storage.fileio import local_path
from lineage.iceberg.schema import conform
from lineage.state import LiveFile, TableState
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID
from lineage.writes.live_images import hit_files, indexed_images
from lineage.writes.changelog_batch import OPERATION, check_batch_columns, order_columns, raise_problems, relaxed_schema
from lineage.writes.changelog_sql import OPS, POSITIVE, UPDATE_BEFORE, Relations, net_effects_sql, problems_sql
from lineage.writes.loop import run_write
from lineage.writes.plan import CommitInfo, Plan
from lineage.properties import MERGE_ON_READ
from lineage.writes.rows import REMOVED_COLS
from lineage.writes.stream_position import StreamPosition

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb


ROWS_PER_FILE = 2_000_000


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _events(table: TableContext, df: Any, op_column: str, order: Sequence[str]) -> Any:
    """The batch as the collapse SQL reads it: table columns, ``__op`` codes, order columns; validated by aggregates."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type, to_arrow_schema

    check_batch_columns(table, df.columns, op_column, order)
    if dict(df.dtypes)[op_column] != "string":
        raise SchemaMismatchError(f"operation column {op_column!r} must hold strings like '+I' or 'c', got type {dict(df.dtypes)[op_column]}")
    schema = table.arrow_schema
    present = [c for c in schema.names if c in df.columns]
    types = to_arrow_schema(df.select(*[_quote(c) for c in present]).schema)
    conform(types.empty_table(), relaxed_schema(table), table.key)  # column types, on the driver without a Spark job
    codes = F.create_map(*[x for name, code in OPS.items() for x in (F.lit(name), F.lit(code))])
    cols = [F.col(_quote(f.name)) if f.name in df.columns else F.lit(None).cast(from_arrow_type(f.type)).alias(f.name) for f in schema]
    extra = [F.col(_quote(c)) for c in order if c not in schema.names]
    events = df.select(*cols, codes[F.col(_quote(op_column))].alias("__op"), *extra)

    positive = F.col("__op").isin(*POSITIVE)
    required = [f.name for f in schema if not f.nullable and f.name not in table.key]
    checks = {
        "bad_op": F.col("__op").isNull(),
        "null_key": _any(F.col(_quote(k)).isNull() for k in table.key),
        "null_order": _any(F.col(_quote(c)).isNull() for c in order),
        **{f"required:{c}": positive & F.col(_quote(c)).isNull() for c in required},
        "before_images": F.col("__op") == UPDATE_BEFORE,
    }
    found = events.agg(*[F.sum(cond.cast("long")).alias(name) for name, cond in checks.items()]).first().asDict()
    if found["bad_op"]:
        unknown = codes[F.col(_quote(op_column))].isNull()
        values = [r[0] for r in df.filter(unknown).select(_quote(op_column)).distinct().limit(5).collect()]
        raise InvalidArgumentError(
            f"operation column {op_column!r} has {found['bad_op']} value(s) that are no change operation, e.g. "
            f"{', '.join(repr(v) for v in values)}; allowed: +I, -U, +U, -D (or INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE) "
            "and Debezium's c, u, d, r"
        )
    if found["null_key"]:
        raise KeyViolationError(f"key column(s) {table.key} are null in {found['null_key']} event(s)")
    if found["null_order"]:
        raise InvalidArgumentError(f"order_by column(s) {list(order)} are null in {found['null_order']} event(s); every event needs a position")
    for c in required:
        if found[f"required:{c}"]:
            raise SchemaMismatchError(f"column {c!r} is required but {found[f'required:{c}']} insert or update event(s) leave it null")
    return events, bool(found["before_images"])


def _any(conds: Any) -> Any:
    out = None
    for c in conds:
        out = c if out is None else (out | c)
    return out


def _start(spark: Any, state: TableState, files: list[LiveFile], keys: Any, key: list[str], columns: list[str], index: KeyIndex | None) -> Any:
    """The live images of the batch's distinct ``keys`` (a Spark DataFrame): ``columns``, lineage, ``__path``, ``__pos``.

    With a key index the driver looks the keys up in it: when ``columns`` are
    the key alone the images are the index entries (no table data read);
    otherwise executors read the files that hold a key of the batch, at the
    images' positions only. Without an index, executors scan the key columns
    of every live file.
    """
    if index is None:
        return spark_io.live_rows(spark, state, columns, files).join(keys, key, "left_semi")
    found = indexed_images(index, files, keys.toArrow())
    paths = pa.array([local_path(f.path) for f in files], pa.string())
    entries = spark.createDataFrame(found.append_column("__path", paths.take(found.column("__file_id"))).drop_columns(["__file_id"]))
    if columns == key:
        return entries
    rows = spark_io.live_rows(spark, state, columns, hit_files(files, found).at_live_positions)
    return rows.join(entries.select("__path", "__pos"), ["__path", "__pos"], "left_semi")


def apply_spark_changelog(
    table: TableContext,
    df: Any,
    *,
    op_column: str,
    upsert: bool,
    order_by: str | Sequence[str] | None,
    mode: str,
    properties: Mapping[str, str],
    expected_version: int | None,
    position: StreamPosition | None,
) -> CommitInfo:
    """Apply a Spark DataFrame of change events in one commit (merge-on-read; ``order_by`` required)."""
    if mode != MERGE_ON_READ:
        raise InvalidArgumentError("change streams from Spark DataFrames are merge-on-read only; pass mode='merge-on-read'")
    order = order_columns(order_by)
    if not order:
        raise InvalidArgumentError(
            "a Spark DataFrame has no row order: pass order_by= with the column(s) that order each key's events "
            "(e.g. a Kafka offset, a Debezium LSN or a sequence number)"
        )
    key = list(table.key)
    columns = table.arrow_schema.names
    spark = df.sparkSession
    events, has_before = _events(table, df, op_column, order)
    check_images = not upsert and has_before
    tag = uuid.uuid4().hex[:12]
    ev_view, start_view = f"__lineage_events_{tag}", f"__lineage_start_{tag}"
    rel = Relations(key, columns, order, ("__path", "__pos"), _quote, events=ev_view, start=start_view)

    def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        from pyspark.sql import functions as F

        if position is not None and position.applied_in(state):
            return Plan(OPERATION)
        files = state.live_files()
        index = KeyIndex.open(state)
        events.createOrReplaceTempView(ev_view)
        keys = events.select(*[_quote(k) for k in key]).distinct()
        _start(spark, state, files, keys, key, columns if check_images else key, index).createOrReplaceTempView(start_view)
        try:
            problems = spark.sql(problems_sql(rel, upsert=upsert, check_images=check_images, check_ties=True)).filter(
                "__problem IS NOT NULL"
            )
            counts = {r["__problem"]: r["count"] for r in problems.groupBy("__problem").count().collect()}

            def sample(condition: str) -> list[dict[str, Any]]:
                return [r.asDict() for r in problems.filter(condition).orderBy(*[_quote(c) for c in order]).limit(3).collect()]

            ignored = raise_problems(counts, sample, key, order, True)
            net = spark.sql(net_effects_sql(rel)).persist()
            try:
                pointers = net.filter("__start_live").select(
                    "__path", "__pos", "_row_id", "_row_created_at_version", "_row_last_updated_at_version", "__end_live", *[_quote(k) for k in key]
                ).toArrow()
                n_updates = int(pa.compute.sum(pointers.column("__end_live").cast(pa.int64())).as_py() or 0)
                cols = [F.col(_quote(c)) for c in columns]
                images = net.filter("__start_live AND __end_live").select(
                    *cols, F.col("_row_id").alias(HIDDEN_ROW_ID), F.col("_row_created_at_version").alias(HIDDEN_CREATED)
                )
                # images sorted by row id so their lineage compresses into runs
                written = (
                    spark_io.write_with_executors(table, images.coalesce(max(1, n_updates // ROWS_PER_FILE)).sortWithinPartitions(HIDDEN_ROW_ID))
                    if n_updates
                    else []
                )
                # a few files for inserts; the files' record counts tell how many there were
                new = spark_io.write_with_executors(table, net.filter("NOT __start_live AND __end_live").select(*cols).coalesce(2))
            finally:
                net.unpersist()
            n_inserts = sum(w.data_file.record_count for w in new)
        finally:
            spark.catalog.dropTempView(ev_view)
            spark.catalog.dropTempView(start_view)
        removed = spark_io.removed_images(files, pointers, key)
        change = KeyIndexChange(removed_keys=removed.select(key), index=index) if index is not None else None
        return Plan(
            OPERATION, files=files, removed=removed.select(REMOVED_COLS.split(", ")), prewritten=written + new, properties=dict(properties),
            inserted=n_inserts, updated=n_updates, deleted=pointers.num_rows - n_updates, ignored=ignored, key_index=change,
        )

    return run_write(table, plan, mode=MERGE_ON_READ, expected_version=expected_version)

