"""The change feed in Spark: the same plan (:mod:`cdf.plan`), values read and compared by executors.

:func:`changes` and :func:`deleted_rows` are planned by executors, one group
of row ids per task (:mod:`cdf.spark_groups`): the driver names metadata
files and cuts the row ids from the commit log's counts, so its memory does
not grow with the changed rows; every task builds its group's pointers,
plan and values with the embedded engine's code (for ``deleted_rows``, the
deletes of the per-version feed), and Spark orders the rows as the feed is
ordered. The driver never collects table data.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

import cdf.groups as groups
import cdf.spark_groups as spark_groups
import cdf.stream as stream
from cdf.output import change_schema, deleted_schema
from lineage.state import TableState
import lineage.storage.spark_read as spark_read

TASK_IMAGES = 500_000  # images a task of the Spark feed plans (its group of row ids), by the commit log's counts
SPREAD_IMAGES = 50_000  # a feed of this many images gets a task per core at least


def changes(spark: Any, state: TableState, a: int, b: int, data: pa.Schema, net: bool) -> Any:
    """The change feed over ``(a, b]`` as a Spark DataFrame, planned and read by executors one group of row ids per task.

    The driver checks that the files the feed needs exist, cuts the row ids
    into groups from the commit log's counts and names the metadata files
    (:mod:`cdf.spark_groups`); it builds no pointer and reads no row id.
    """
    schema = change_schema(data, bool(state.lineage.purged))
    out = spark_groups.spark_schema(schema.append(pa.field(spark_groups.AFTER, pa.int8())))
    df = _grouped(spark, state, a, b, data, net, out, deleted=False)
    return df.orderBy("_commit_version", "_row_id", spark_groups.AFTER).select(*[f"`{n}`" for n in schema.names])


def deleted_rows(spark: Any, state: TableState, since: int, until: int, data: pa.Schema) -> Any:
    """Rows deleted in ``(since, until]`` as a Spark DataFrame, planned and read by executors one group of row ids per task.

    The rows are the deletes of the per-version feed (rows an update removed live on), each group's read by the
    task that plans it, so the driver holds no pointer and no row id, as for :func:`changes`.
    """
    schema = deleted_schema(data, bool(state.lineage.purged))
    df = _grouped(spark, state, since, until, data, False, spark_groups.spark_schema(schema), deleted=True)
    return df.orderBy("_row_deleted_at_version", "_row_id").select(*[f"`{n}`" for n in schema.names])


def _grouped(spark: Any, state: TableState, a: int, b: int, data: pa.Schema, net: bool, out: Any, deleted: bool) -> Any:
    """The unordered rows of the feed (or of ``deleted_rows``) over ``(a, b]``: one task per group of row ids.

    The driver checks that the files the feed needs exist and cuts the row ids from the commit log's counts.
    """
    groups.check_files(state, a, b)
    source = spark_groups.FeedSource.of(state, a, b)
    images = groups.logged_images(state, a, b)
    least = spark.sparkContext.defaultParallelism if images >= SPREAD_IMAGES else 1
    ranges = groups.even_ranges(state, a, b, TASK_IMAGES, least)
    width, _ = stream.row_bytes(state, data, 0)
    fn = spark_read.with_settings(spark_groups.group_reader(source, ranges, a, b, data, net, width, out, deleted))
    return spark.range(0, len(ranges), 1, len(ranges)).mapInArrow(fn, out)
