"""The change feed in Spark: the same SQL definition, rendered for Spark SQL.

The driver computes pointer *runs* from metadata (lineage runs and index
bitmaps) and ships them as a small DataFrame; executors expand them, read the
Parquet files themselves (``_metadata.file_path`` / ``_metadata.row_index``
give positions) and join. The driver never collects table rows.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa

from cdf.dialect import SPARK
from cdf.output import change_schema, commits_table, deleted_schema
from cdf.plan import changes_sql
from cdf.pointers import change_pointers, deletion_pointers, pointer_runs
from lineage.fileio import local_path
from lineage.state import TableState

# Up to this many pointers are broadcast to every executor instead of shuffling the data rows.
BROADCAST_POINTERS = 5_000_000

# Spark reports local files as file:/path or file:///path; Iceberg may store either or a bare path.
_NORMALIZE = r"^file:(//)?"


def _normalize(path: str) -> str:
    return local_path(path)


def _spark_fields(spark: Any, schema: pa.Schema) -> Any:
    """The Spark schema of an Arrow schema (via an empty DataFrame)."""
    return spark.createDataFrame(pa.Table.from_batches([], schema=schema)).schema


def read_positions(spark: Any, paths: list[str], columns: list[str]) -> Any:
    """Executors read the data files, adding ``__path`` and ``__pos`` for every row."""
    from pyspark.sql import functions as F

    df = spark.read.option("recursiveFileLookup", "true").parquet(*[_normalize(p) for p in paths])
    return df.select(
        *[F.col(f"`{c}`") for c in columns],
        F.regexp_replace(F.col("_metadata.file_path"), _NORMALIZE, "").alias("__path"),
        F.col("_metadata.row_index").alias("__pos"),
    )


def images_df(spark: Any, pointers: pa.Table, data: pa.Schema) -> Any:
    """Row images (data columns + lineage) for the pointers, computed by executors."""
    from pyspark.sql import functions as F

    runs = pointer_runs(pointers)
    extra = ["_purged"] if "_purged" in pointers.column_names else []
    if runs.num_rows == 0:
        empty = pa.schema(list(data) + [pa.field("_row_id", pa.int64()), pa.field("_row_created_at_version", pa.int64()),
                                       pa.field("_valid_from", pa.int64()), pa.field("_valid_to", pa.int64())]
                          + [pa.field(c, pa.bool_()) for c in extra])
        return spark.createDataFrame(pa.Table.from_batches([], schema=empty))
    paths = sorted(set(runs.column("file_path").to_pylist()))
    runs = runs.set_column(0, "file_path", pa.array([_normalize(p) for p in runs.column("file_path").to_pylist()], pa.string()))
    expanded = (
        spark.createDataFrame(runs)
        .withColumn("__i", F.explode(F.sequence(F.lit(0).cast("long"), F.col("length") - 1)))
        .select(
            F.col("file_path").alias("__ppath"),
            (F.col("pos_start") + F.col("__i")).alias("__ppos"),
            (F.col("row_id_start") + F.col("__i")).alias("_row_id"),
            "_row_created_at_version",
            "_valid_from",
            "_valid_to",
            *extra,
        )
    )
    rows = read_positions(spark, paths, data.names)
    if pointers.num_rows <= BROADCAST_POINTERS:
        expanded = F.broadcast(expanded)  # the pointers are small: no shuffle of the table's rows
    joined = rows.join(expanded, (rows["__path"] == expanded["__ppath"]) & (rows["__pos"] == expanded["__ppos"]))
    values = [
        (F.when(~F.col("_purged"), F.col(f"`{c}`")) if extra else F.col(f"`{c}`")).alias(c)  # erased images read as null
        for c in data.names
    ]
    return joined.select(*values, "_row_id", "_row_created_at_version", "_valid_from", "_valid_to", *extra)


def _views(spark: Any, images: Any, state: TableState, after: int) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:12]
    images_view, commits_view = f"__lineage_images_{tag}", f"__lineage_commits_{tag}"
    images.createOrReplaceTempView(images_view)
    spark.createDataFrame(commits_table(state.lineage.log.since(after))).createOrReplaceTempView(commits_view)
    return images_view, commits_view


def changes(spark: Any, state: TableState, a: int, b: int, data: pa.Schema, net: bool) -> Any:
    """The change feed over ``(a, b]`` as a Spark DataFrame."""
    pointers = change_pointers(state, a, b)
    extra = ["_purged"] if "_purged" in pointers.column_names else []
    images = images_df(spark, pointers, data)
    images_view, commits_view = _views(spark, images, state, a)
    df = spark.sql(changes_sql(SPARK, images_view, commits_view, data.names, str(a), str(b), net, extra))
    return df.select(*[f"`{n}`" for n in change_schema(data, bool(extra)).names])


def deleted_rows(spark: Any, state: TableState, since: int, until: int, data: pa.Schema) -> Any:
    """Rows deleted in ``(since, until]`` as a Spark DataFrame."""
    pointers = deletion_pointers(state, since, until)
    purged = "_purged" in pointers.column_names
    images = images_df(spark, pointers, data)
    images_view, commits_view = _views(spark, images, state, since)
    cols = "".join(f"i.`{c}`, " for c in data.names)
    df = spark.sql(
        f"SELECT {cols} i._valid_to AS _row_deleted_at_version, c._commit_timestamp AS _row_deleted_at_timestamp, "
        "i._row_id, i._row_created_at_version, i._valid_from AS _row_last_updated_at_version"
        + (", i._purged " if purged else " ")
        + f"FROM {images_view} i LEFT JOIN {commits_view} c ON c.__version = i._valid_to ORDER BY i._valid_to, i._row_id"
    )
    return df.select(*[f"`{n}`" for n in deleted_schema(data, purged).names])
