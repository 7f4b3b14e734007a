"""Compaction and purge's file rewrite on Spark executors.

The driver plans exactly as the embedded engine does (which files are
compacted together, which files a purge rewrites) and commits; executors read
and write the rows:

* :func:`compact_groups`: each compaction bin's live rows, with their row ids
  and both versions, are read by executors (:func:`lineage.spark.live_rows`)
  and written to new files of their own, in (file, position) order, so the
  new files' lineage stays a few runs;
* :func:`rewrite_copies`: each data file a purge rewrites is read by an
  executor, which nulls the values of the purged rows and writes the copy at
  the same positions (the driver finds the rows from the files' row-id runs).

What reaches the driver is one descriptor per written file (row ids and
versions as runs), never rows.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

import lineage.spark as spark_io
import lineage.iceberg.v3_metadata as v3_metadata
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID, HIDDEN_UPDATED
from lineage.context import TableContext
from lineage.errors import InvalidArgumentError
from lineage.sql.predicate import Predicate, quote_ident
from lineage.state import LiveFile, TableState
from lineage.storage.files import local_path
from lineage.storage.writer import WrittenFile


def session_for(engine: str, spark: Any) -> Any:
    """The Spark session a maintenance operation runs on: None for ``engine="duckdb"``; for ``"spark"``
    ``spark`` or the active session (InvalidArgumentError for another engine, or without a session)."""
    if engine not in ("duckdb", "spark"):
        raise InvalidArgumentError(f"engine must be 'duckdb' or 'spark', got {engine!r}")
    return spark_io.spark_session(spark) if engine == "spark" else None


def compact_groups(table: TableContext, state: TableState, groups: list[list[LiveFile]], spark: Any) -> list[WrittenFile]:
    """Executors write each group's live rows (lineage kept) to new data files; their descriptors."""
    from pyspark.sql import functions as F

    session = spark_io.spark_session(spark)
    files = [f for g in groups for f in g]
    if not files:
        return []
    names = table.arrow_schema.names
    live = spark_io.live_rows(session, state, names, files)
    order = session.createDataFrame(pa.table({
        "__opath": pa.array([local_path(f.path) for f in files], pa.string()),
        "__group": pa.array([i for i, g in enumerate(groups) for _ in g], pa.int64()),
        "__file": pa.array(range(len(files)), pa.int64()),
    }))
    rows = live.join(F.broadcast(order), F.col("__path") == F.col("__opath")).select(
        *[spark_io.column(c) for c in names],
        F.col("_row_id").alias(HIDDEN_ROW_ID),
        F.col("_row_created_at_version").alias(HIDDEN_CREATED),
        F.col("_row_last_updated_at_version").alias(HIDDEN_UPDATED),
        "__group", "__file", "__pos",
    )
    tasks = max(1, min(len(groups), session.sparkContext.defaultParallelism))
    ordered = rows.repartition(tasks, "__group").sortWithinPartitions("__group", "__file", "__pos").drop("__file", "__pos")
    return spark_io.write_with_executors(table, ordered, group="__group")


def rewrite_copies(table: TableContext, copies: list[tuple[LiveFile, np.ndarray, dict | None, Any]], spark: Any, copy_fn: Callable[..., Any]) -> list[Any]:
    """Executors rewrite files with some rows erased; the copies' data files, in the order of ``copies``.

    ``copies`` holds ``(file, erased positions, donors, lineage)`` and each executor
    calls ``copy_fn(target, path, schema, mask, data_file, donors, lineage)`` (purge's
    own function, shipped with the task) for its share of the files.
    """
    session = spark_io.spark_session(spark)
    if not copies:
        return []
    ice = table.iceberg
    specs = [(f.path, f.data_file.record_count, pos, f.data_file, donors, lineage) for f, pos, donors, lineage in copies]
    job = _CopyJob(v3_metadata.metadata_json(ice.metadata).decode(), dict(ice.io.properties), ice.metadata.location, table.arrow_schema, pickle.dumps(specs), copy_fn)
    index = session.createDataFrame(pa.table({"__i": pa.array(range(len(specs)), pa.int64())})).repartition(
        max(1, min(len(specs), session.sparkContext.defaultParallelism)))
    got = index.mapInArrow(job.run, "__i long, payload binary").collect()  # one row per copy
    written = {r["__i"]: pickle.loads(r["payload"]) for r in got}
    return [written[i] for i in range(len(specs))]


class _CopyJob:
    """What a purge's copy task needs (pickled with the task), and the task itself."""

    def __init__(self, metadata_json: str, io_properties: dict[str, str], location: str, schema: pa.Schema, specs: bytes, copy_fn: Callable[..., Any]) -> None:
        self.metadata_json, self.io_properties, self.location = metadata_json, io_properties, location
        self.schema, self.specs, self.copy_fn = schema, specs, copy_fn

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyiceberg.table.metadata import TableMetadataUtil

        wanted = [i for b in batches for i in b.column("__i").to_pylist()]
        if not wanted:
            return
        specs = pickle.loads(self.specs)
        target = spark_io.WriteTarget(TableMetadataUtil.parse_raw(self.metadata_json), spark_io.executor_io(self.io_properties, self.location))
        out = pa.schema([("__i", pa.int64()), ("payload", pa.binary())])
        for i in wanted:
            path, rows, positions, data_file, donors, lineage = specs[i]
            mask = np.zeros(rows, bool)
            mask[positions] = True
            copy = self.copy_fn(target, path, self.schema, mask, data_file, donors, lineage)
            yield pa.RecordBatch.from_pydict({"__i": [i], "payload": [pickle.dumps(copy)]}, schema=out)


def matching_rows(state: TableState, files: list[LiveFile], pred: Predicate, key: list[str], spark: Any) -> pa.Table:
    """``__file_id`` (index in ``files``), ``__pos``, ``_row_id`` and the ``key`` columns of the live rows ``pred`` matches, found by executors.

    The matches reach the driver (a purge records the purged row ids there): meant for the few rows a purge erases.
    """
    schema = spark_io.arrow_schema_of(state)
    out = pa.schema([pa.field("__path", pa.string()), pa.field("__pos", pa.int64()), pa.field("_row_id", pa.int64())]
                    + [schema.field(k).with_nullable(True) for k in key])
    select = ", ".join(quote_ident(c) for c in out.names)
    got = spark_io.evaluate(spark, state, files, pred, select, out).toArrow()
    index_of = {local_path(f.path): i for i, f in enumerate(files)}
    file_ids = pa.array([index_of[p] for p in got.column("__path").to_pylist()], pa.int32())
    return pa.Table.from_arrays([file_ids, *[got.column(c).cast(out.field(c).type) for c in out.names[1:]]],
                                names=["__file_id", *out.names[1:]])
