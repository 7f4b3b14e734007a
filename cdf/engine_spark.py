"""The change feed in Spark: the same plan (:mod:`cdf.plan`), values read and compared by executors.

:func:`changes` is planned by executors, one group of row ids per task
(:mod:`cdf.spark_groups`): the driver names metadata files and cuts the row
ids from the commit log's counts, so its memory does not grow with the
changed rows; every task builds its group's pointers, plan and values with
the embedded engine's code, and Spark orders the rows as the feed is ordered.

:func:`deleted_rows` computes its skeleton on the driver (which image each
row shows, its version and place in the order) and ships it as a small
DataFrame: one row per deleted row, metadata only, files named by number.
Executors read the values: from data files inside ``mapInArrow``, with the
embedded engine's value reader (only the row groups holding the skeleton's
rows, columns matched by field id); from index segments that captured them,
as value lists exploded in SQL and joined to the skeleton
(``_metadata.file_path`` / ``_metadata.row_index`` locate an entry;
:func:`lineage.spark.file_index` turns Spark's file URIs into numbers).
The driver never collects table data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import cdf.groups as groups
import cdf.plan as plan
import cdf.spark_groups as spark_groups
import cdf.stream as stream
from cdf.output import TIMESTAMP, change_schema, deleted_schema
from cdf.pointers import Pointers, change_pointers
from index.deleted_rows import VALUE_PREFIX
from lineage.arrays import unique
from lineage.storage.fileio import local_path
from lineage.spark import file_index
from lineage.state import TableState
import lineage.storage.files as store
import lineage.storage.spark_read as spark_read

TASK_IMAGES = 500_000  # images a task of the Spark feed plans (its group of row ids), by the commit log's counts
SPREAD_IMAGES = 50_000  # a feed of this many images gets a task per core at least

# Up to this many skeleton rows are broadcast to every executor instead of shuffling the data rows.
BROADCAST_POINTERS = 5_000_000

def _skeleton(p: Pointers, sk: plan.Skeleton, file_no: np.ndarray, seg_no: np.ndarray) -> pa.Table:
    """The skeleton as shipped: order, where the values are, and the output's metadata columns.

    ``file_no`` numbers the pointers' files (``p.files``) and ``seg_no`` their
    captured segments (``p.captured``) as the executors' reads do; -1 for
    those not read.
    """
    n = len(sk)
    ptr = sk.pointer
    source, loc = p.source[ptr], p.loc[ptr]
    from_file = source >= 0
    seg_row = np.zeros(n, np.int64)
    seg_k = np.zeros(n, np.int64)
    for k in unique(source[~from_file]):
        seg = p.captured[-int(k) - 1]
        idx = np.flatnonzero(source == k)
        first = np.searchsorted(seg.file_index, seg.file_index, side="left")
        seg_row[idx] = seg.file_index[loc[idx]]
        seg_k[idx] = loc[idx] - first[loc[idx]]
    pair = np.arange(n, dtype=np.int64)
    post = np.flatnonzero(sk.change == plan.POSTIMAGE)
    pair[post] = post - 1  # both images of an update share the pre-image's row number
    ms = np.array([p.commit_ms.get(int(v), -1) for v in sk.version], np.int64) if n else np.zeros(0, np.int64)
    cols = {
        "__ord": np.arange(n, dtype=np.int64),
        "__pair": pair,
        "__file": np.where(from_file, np.append(file_no, -1)[np.where(from_file, source, -1)], -1).astype(np.int32),
        "__pos": np.where(from_file, loc, -1),
        "__seg": np.where(from_file, -1, np.append(seg_no, -1)[np.where(from_file, -1, -source - 1)]).astype(np.int32),
        "__segrow": seg_row,
        "__k": seg_k,
        "__change": sk.change.astype(np.int32),
        "_commit_version": sk.version,
        "__ms": pa.array(ms, pa.int64(), mask=ms < 0),  # the commit timestamp, made a timestamp in Spark
        "_row_id": p.row_id[ptr],
        "_row_created_at_version": p.created[ptr],
        "_row_last_updated_at_version": p.valid_from[ptr],
    }
    if p.purged is not None:
        cols["_purged"] = pa.array(p.purged[ptr], pa.bool_())
    return pa.table(cols)


def _captured_values(spark: Any, segments: list[str], data: pa.Schema, field_ids: dict[str, int]) -> Any:
    """Executors read the values index segments captured: one row per entry, keyed by (segment number, row, list index)."""
    from pyspark.sql import functions as F

    if any(store.is_remote(s) for s in segments):  # executors read through pyarrow: no hadoop-aws on the cluster
        footers = [store.parquet_file(s).schema_arrow for s in segments]
        merged = pa.unify_schemas(footers, promote_options="permissive")
        df = spark_read.read_files(spark, segments, merged, [[n if n in f.names else None for n in merged.names] for f in footers])
        where, segrow = F.col(spark_read.FILE), F.col(spark_read.POS)
    else:
        df = spark.read.option("mergeSchema", "true").parquet(*segments)
        where, segrow = F.col("_metadata.file_path").alias("__uri"), F.col("_metadata.row_index")
    present = set(df.columns)
    types = spark.createDataFrame(data.empty_table()).schema  # Spark's names of the columns' types
    lists = []
    for i, c in enumerate(data.names):
        typ = types[c].dataType.simpleString()
        name = f"{VALUE_PREFIX}{field_ids[c]}"
        # a column added after a segment was written: its list is missing (null once schemas merge), and
        # arrays_zip of a null list is null, which would drop the segment's entries; nulls, as in the data file
        nulls = F.array_repeat(F.lit(None).cast(typ), F.size("row_ids"))
        lists.append((F.coalesce(F.col(f"`{name}`").cast(f"array<{typ}>"), nulls) if name in present else nulls).alias(str(i)))
    exploded = df.select(where, segrow.alias("__vsegrow"), F.posexplode(F.arrays_zip(*lists)).alias("__vk", "__v"))
    if "__uri" in exploded.columns:
        exploded = exploded.join(F.broadcast(file_index(spark, df, segments)), "__uri")
    exploded = exploded.withColumnRenamed("__file", "__vseg")
    values = [F.col(f"__v.`{i}`").alias(c) for i, c in enumerate(data.names)]
    return exploded.select("__vseg", "__vsegrow", "__vk", *values)


def _value_reader(paths: list[str], data: pa.Schema, field_ids: dict[str, int]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: skeleton rows in (``__file``, ``__pos`` name an image), the same rows with ``data``'s values out.

    Each task reads only the row groups holding its rows, with the value
    reader of the embedded engine (:func:`lineage.read.values.read_at`: columns
    matched by field id, each row group decoded once).
    """

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from lineage.read.values import read_at

        got = list(batches)
        rows = pa.Table.from_batches(got) if got else None
        if rows is None or rows.num_rows == 0:
            return
        values = read_at(paths, rows.column("__file").to_numpy(), rows.column("__pos").to_numpy(), data, field_ids, cache=False)
        yield from pa.Table.from_arrays([*values.columns, *rows.columns], names=[*data.names, *rows.column_names]).to_batches()

    return read


def images_df(spark: Any, state: TableState, p: Pointers, sk: plan.Skeleton, data: pa.Schema) -> Any:
    """The skeleton joined with the values of the images it shows (executors read them)."""
    from pyspark.sql import functions as F

    sources = p.source[sk.pointer]
    from_file = sources >= 0
    read = unique(sources[from_file]).astype(np.int64)
    captured = (-unique(sources[~from_file]) - 1).astype(np.int64)
    file_no = np.full(len(p.files), -1, np.int64)
    file_no[read] = np.arange(len(read))
    seg_no = np.full(len(p.captured), -1, np.int64)
    seg_no[captured] = np.arange(len(captured))
    skel = _skeleton(p, sk, file_no, seg_no)
    field_ids = {f.name: f.field_id for f in state.iceberg.schema().fields}
    meta = [c for c in skel.column_names if c != "__ms"]
    timestamp = F.timestamp_millis(F.col("__ms")).alias("_commit_timestamp")
    if skel.num_rows == 0:
        empty = pa.schema(list(data) + [f for f in skel.schema if f.name != "__ms"] + [pa.field("_commit_timestamp", TIMESTAMP)])
        return spark.createDataFrame(pa.Table.from_batches([], schema=empty))
    parts = []
    if len(read):
        # sorted by file and position: a task's rows share row groups, and few row groups are read by two tasks
        mine = skel.filter(pc.greater_equal(skel.column("__file"), 0))
        mine = mine.take(pa.array(np.lexsort((mine.column("__pos").to_numpy(), mine.column("__file").to_numpy()))))
        out = spark.createDataFrame(pa.Table.from_batches([], schema=pa.schema(list(data) + list(mine.schema)))).schema
        fn = spark_read.with_settings(_value_reader([local_path(p.files[int(i)]) for i in read], data, field_ids))
        parts.append(spark.createDataFrame(mine).mapInArrow(fn, out).select(*data.names, *meta, timestamp))
    if len(captured):
        wanted = spark.createDataFrame(skel.filter(pc.greater_equal(skel.column("__seg"), 0)))
        vals = _captured_values(spark, [local_path(p.captured[int(i)].path) for i in captured], data, field_ids)
        wanted = F.broadcast(wanted) if skel.num_rows <= BROADCAST_POINTERS else wanted
        on = (vals["__vseg"] == wanted["__seg"]) & (vals["__vsegrow"] == wanted["__segrow"]) & (vals["__vk"] == wanted["__k"])
        parts.append(vals.join(wanted, on).select(*data.names, *meta, timestamp))
    images = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    if p.purged is not None:  # erased images read as null
        images = images.select(*[F.when(~F.col("_purged"), F.col(f"`{c}`")).alias(c) for c in data.names], *meta, "_commit_timestamp")
    return images


def changes(spark: Any, state: TableState, a: int, b: int, data: pa.Schema, net: bool) -> Any:
    """The change feed over ``(a, b]`` as a Spark DataFrame, planned and read by executors one group of row ids per task.

    The driver checks that the files the feed needs exist, cuts the row ids
    into groups from the commit log's counts and names the metadata files
    (:mod:`cdf.spark_groups`); it builds no pointer and reads no row id.
    """
    groups.check_files(state, a, b)
    source = spark_groups.FeedSource.of(state, a, b)
    images = groups.logged_images(state, a, b)
    least = spark.sparkContext.defaultParallelism if images >= SPREAD_IMAGES else 1
    ranges = groups.even_ranges(state, a, b, TASK_IMAGES, least)
    schema = change_schema(data, bool(state.lineage.purged))
    out = spark_groups.spark_schema(schema.append(pa.field(spark_groups.AFTER, pa.int8())))
    width, _ = stream.row_bytes(state, data, 0)
    fn = spark_read.with_settings(spark_groups.group_reader(source, ranges, a, b, data, net, width, out))
    df = spark.range(0, len(ranges), 1, len(ranges)).mapInArrow(fn, out)
    return df.orderBy("_commit_version", "_row_id", spark_groups.AFTER).select(*[f"`{n}`" for n in schema.names])


def deleted_rows(spark: Any, state: TableState, since: int, until: int, data: pa.Schema) -> Any:
    """Rows deleted in ``(since, until]`` as a Spark DataFrame."""
    p = change_pointers(state, since, until)
    sk = plan.deleted(p, since, until)
    images = images_df(spark, state, p, sk, data)
    purged = ["_purged"] if p.purged is not None else []
    df = images.orderBy("__ord").select(
        *[f"`{c}`" for c in data.names], images["_commit_version"].alias("_row_deleted_at_version"),
        images["_commit_timestamp"].alias("_row_deleted_at_timestamp"), "_row_id", "_row_created_at_version",
        "_row_last_updated_at_version", *purged,
    )
    return df.select(*[f"`{n}`" for n in deleted_schema(data, p.purged is not None).names])
