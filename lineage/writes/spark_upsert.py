"""Upserts of Spark DataFrames: a lookup in the key index for batches up to a million rows, a join on executors for larger ones.

Two ways to find the live image each batch row replaces:

* **lookup** (the table has a key index): the batch's keys are collected to
  the driver and looked up in the key index
  (:meth:`index.key_index.KeyIndex.lookup`, O(batch log table)); the hits
  (key, row id, created version) are broadcast to the executors, which join
  the batch with them. No data file of the table is read. The driver holds
  the batch's keys and their hits, so this is only chosen for batches of at
  most :data:`LOOKUP_MAX_ROWS` rows.
* **join** (a larger batch, or no key index): executors read the key columns
  of every live row once and join them with the batch; the removed images'
  delete files and index segment are written by executors
  (:mod:`lineage.writes.spark_removed`), so nothing the size of the batch
  reaches the driver. The batch rows with no live image (the inserts) are
  found against the matched rows, kept by Spark, not by reading the table
  again.

``auto`` takes the lookup whenever the table has a key index and the batch
has at most :data:`LOOKUP_MAX_ROWS` rows, whatever its share of the table:
both ways read the batch, but the join also reads the key columns of every
live row through the Python readers and shuffles them, so the lookup costs
less even for a batch that is most of the table (measured with
``benchmarks/spark_upsert.py``, and with ``benchmarks/large.py``: a
1,000,000-row batch into a 10,000,000-row table, 10 % of it, took 2.8x longer
by join than by lookup).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from index.key_index import KeyIndex, KeyIndexChange, index_enabled
import lineage.spark as spark_io
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID
from lineage.context import TableContext
from lineage.errors import InvalidArgumentError, KeyViolationError
from lineage.iceberg.schema import null_or_duplicate_keys
from lineage.properties import capture_preimages
from lineage.state import LiveFile, TableState
from lineage.storage.writer import WrittenFile
from lineage.writes.key_checks import removed_pointers
from lineage.writes.plan import Plan
from lineage.writes.spark_removed import KEY_PREFIX, OLD_PREFIX, POINTER_COLUMNS, write_removed

LOOKUP_MAX_ROWS = 1_000_000  # the lookup collects the batch's keys to the driver: never more than this many
STRATEGIES = ("auto", "lookup", "join")
ROWS_PER_FILE = 2_000_000  # rows per written file (Spark partitions coalesced to about this many rows)


def choose_strategy(strategy: str, index_ready: bool, batch_rows: int) -> str:
    """``lookup`` or ``join`` for a batch of ``batch_rows`` rows (see the module docstring)."""
    if strategy not in STRATEGIES:
        raise InvalidArgumentError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if strategy == "lookup" and not index_ready:
        raise InvalidArgumentError("strategy='lookup' needs the table's key index (lineage.key-index.enabled, and a built index)")
    if strategy != "auto":
        return strategy
    return "lookup" if index_ready and batch_rows <= LOOKUP_MAX_ROWS else "join"


def checked_keys(table: TableContext, batch: Any, strategy: str) -> pa.Table | None:
    """Reject a batch with null or duplicate keys; its keys when it may take the lookup, else None.

    Unless ``strategy`` is ``join``, one Spark job collects up to
    :data:`LOOKUP_MAX_ROWS` + 1 of the batch's keys: a batch that small is
    whole on the driver, checked there and its keys kept for the lookup (the
    batch is not read again to count it, to check it and to collect its keys).
    A larger batch is checked by executors (aggregates only reach the driver).
    """
    key = table.key
    if strategy != "join":
        keys = batch.select(*[spark_io.column(k) for k in key]).limit(LOOKUP_MAX_ROWS + 1).toArrow()
        if keys.num_rows <= LOOKUP_MAX_ROWS:
            problem = null_or_duplicate_keys(keys, key)
            if problem:
                raise KeyViolationError(f"upsert batch rejected: {problem}")
            return keys
    problem = spark_io.check_spark_keys(batch, key)
    if problem:
        raise KeyViolationError(f"upsert batch rejected: {problem}")
    return None


def plan_upsert(table: TableContext, state: TableState, batch: Any, strategy: str = "auto", keys: pa.Table | None = None) -> Plan:
    """The write loop's plan of an upsert of the Spark DataFrame ``batch`` (checked already) on ``state``.

    ``keys``: the batch's keys from :func:`checked_keys` (None: the batch has more than :data:`LOOKUP_MAX_ROWS` rows).
    """
    index = KeyIndex.open(state, build=False) if index_enabled(state.iceberg) else None
    files = state.live_files()
    batch_rows = keys.num_rows if keys is not None else LOOKUP_MAX_ROWS + 1
    if choose_strategy(strategy, index is not None, batch_rows) == "lookup":
        return _by_lookup(table, index, files, batch, keys)
    return _by_join(table, state, files, batch, index_enabled(state.iceberg))


def _by_lookup(table: TableContext, index: KeyIndex, files: list[LiveFile], batch: Any, keys: pa.Table | None) -> Plan:
    """Look the batch's keys up in the key index on the driver; executors join the batch with the broadcast hits."""
    from pyspark.sql import functions as F

    key, columns = table.key, table.arrow_schema.names
    session = batch.sparkSession
    if keys is None:  # strategy="lookup" for a batch over LOOKUP_MAX_ROWS rows
        keys = batch.select(*[spark_io.column(k) for k in key]).toArrow()  # O(batch) on the driver
    hits = index.lookup(keys)
    found = session.createDataFrame(pa.Table.from_arrays(
        [hits.column(k) for k in key] + [hits.column("_row_id"), hits.column("_row_created_at_version")],
        names=[f"{KEY_PREFIX}{i}" for i in range(len(key))] + [HIDDEN_ROW_ID, HIDDEN_CREATED],
    ))
    cond = None
    for i, k in enumerate(key):
        c = spark_io.column(k) == F.col(f"{KEY_PREFIX}{i}")
        cond = c if cond is None else (cond & c)
    b = batch.select(*[spark_io.column(c) for c in columns])
    images = b.join(F.broadcast(found), cond, "inner").select(*[spark_io.column(c) for c in columns], HIDDEN_ROW_ID, HIDDEN_CREATED)
    # the batch's keys are unique (checked): every one without a hit is an insert
    written, (inserted, new) = _write_both(table, images, hits.num_rows, b.join(F.broadcast(found), cond, "left_anti"),
                                           keys.num_rows - hits.num_rows)
    return Plan("upsert", files=files, removed=removed_pointers(files, hits), prewritten=written + new, updated=hits.num_rows,
                inserted=inserted, key_index=KeyIndexChange.of_removal(hits.select(key), rewritten=True, index=index))


def _by_join(table: TableContext, state: TableState, files: list[LiveFile], batch: Any, indexed: bool) -> Plan:
    """Join the batch with the key columns of every live row on executors; executors write everything."""
    from pyspark.sql import functions as F

    key, schema = table.key, table.arrow_schema
    columns = schema.names
    capture = capture_preimages(state.iceberg.metadata.properties)
    read = list(columns) if capture else list(key)
    # Spark sizes the live rows by the small list of files they are read from and would broadcast all of them
    # (10M rows: "Not enough memory to build and broadcast the table"): join them by sort-merge instead
    live = spark_io.live_rows(batch.sparkSession, state, read, files).hint("merge").alias("l")
    b = batch.select(*[spark_io.column(c) for c in columns]).alias("b")
    matched = b.join(live, _equal(key, "b", "l"), "inner").select(
        *[F.col(f"b.`{c}`").alias(c) for c in columns],
        *[F.col(f"l.`{c}`").alias(c) for c in POINTER_COLUMNS],
        *([F.col(f"l.`{k}`").alias(f"{KEY_PREFIX}{i}") for i, k in enumerate(key)] if indexed else []),
        *([F.col(f"l.`{c}`").alias(f"{OLD_PREFIX}{i}") for i, c in enumerate(columns)] if capture else []),
    ).persist()
    try:
        removed = write_removed(table, state, files, matched, key if indexed else [], capture)
        images = matched.select(*[spark_io.column(c) for c in columns], F.col("_row_id").alias(HIDDEN_ROW_ID),
                                F.col("_row_created_at_version").alias(HIDDEN_CREATED))
        # the batch rows no live row has: those matched kept no key of (keys are unique on both sides), so the
        # live rows are not read and shuffled again
        m = matched.select(*[spark_io.column(k) for k in key]).alias("m")
        unmatched = b.join(m, _equal(key, "b", "m"), "left_anti")
        written, (inserted, new) = _write_both(table, images, removed.images, unmatched, unmatched.count())
    finally:
        matched.unpersist()
    change = KeyIndexChange.of_removal(removed.removed_keys, rewritten=True) if indexed else None
    return Plan("upsert", prewritten_deletes=removed.delete_files, prewritten_index=removed.index, prewritten_replaced=removed.replaced,
                prewritten=written + new,
                updated=removed.images, inserted=inserted, key_index=change)


def _equal(key: list[str], left: str, right: str) -> Any:
    """The join condition: every key column of the DataFrame aliased ``left`` equals the one of ``right``."""
    from pyspark.sql import functions as F

    cond = None
    for k in key:
        c = F.col(f"{left}.`{k}`") == F.col(f"{right}.`{k}`")
        cond = c if cond is None else (cond & c)
    return cond


def _write_both(table: TableContext, images: Any, image_rows: int, inserts: Any, insert_rows: int) -> tuple[list[WrittenFile], tuple[int, list[WrittenFile]]]:
    """Executors write the new images (sorted by row id) and the inserts: two Spark jobs at once.

    Each is coalesced to about :data:`ROWS_PER_FILE` rows a file, so a batch
    under that is one task each: submitted together (Spark runs jobs of
    different driver threads side by side) both cores work, and no file is
    split in two to keep them busy.
    """
    with ThreadPoolExecutor(2, thread_name_prefix="lineage-upsert") as pool:
        written = pool.submit(_write, table, images.coalesce(max(1, image_rows // ROWS_PER_FILE)).sortWithinPartitions(HIDDEN_ROW_ID), image_rows)
        new = pool.submit(_inserts, table, inserts, insert_rows)
        return written.result(), new.result()


def _write(table: TableContext, df: Any, rows: int) -> list[WrittenFile]:
    return spark_io.write_with_executors(table, df) if rows else []


def _inserts(table: TableContext, inserts: Any, n: int) -> tuple[int, list[WrittenFile]]:
    """Executors write the ``n`` batch rows no live row has (fresh row ids); their count and files."""
    new = _write(table, inserts.coalesce(max(1, n // ROWS_PER_FILE)), n)
    return sum(w.data_file.record_count for w in new), new
