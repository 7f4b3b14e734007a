"""Writes of Spark DataFrames: executors write the data files, the driver plans and commits through the write loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from index.key_index import KeyIndex, KeyIndexChange, read_file_keys
import lineage.spark as spark_io
from lineage.context import TableContext
from lineage.errors import InvalidArgumentError, KeyViolationError
from lineage.state import TableState
from lineage.storage.writer import WrittenFile
from lineage.writes import key_checks
from lineage.writes.loop import run_write
from lineage.writes.plan import CommitInfo, Plan
from lineage.properties import MERGE_ON_READ
from lineage.writes.spark_upsert import checked_keys, choose_strategy, plan_upsert

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb


def append(table: TableContext, df: Any, check_keys: bool) -> CommitInfo:
    """Append a Spark DataFrame; with ``check_keys`` its keys must be unique and not yet in the table."""
    spark_io.reject_bad_batch(table, df, keyed=check_keys)
    cache: list[WrittenFile] = []

    def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        index = KeyIndex.open(state) if check_keys else None
        if check_keys and index is None:
            clash = spark_io.existing_keys(df.sparkSession, state, df, table.key)
            if clash:
                raise KeyViolationError(f"append rejected: key value(s) already in the table, e.g. {clash}; use upsert")
        if not cache:
            cache.extend(spark_io.write_with_executors(table, df))
        rows = sum(w.data_file.record_count for w in cache)
        change = None
        if index is not None:
            # Executors wrote the files; their key columns (O(batch)) are checked against the index.
            written = {w.data_file.file_path: read_file_keys(table.iceberg.io, w.data_file.file_path, table.key) for w in cache}
            if written:
                key_checks.reject_live_keys(index, pa.concat_tables(written.values()), "use upsert")
            change = KeyIndexChange(index=index, written_keys=written)
        return Plan("append", prewritten=list(cache), reusable=True, inserted=rows, key_index=change)

    return run_write(table, plan, mode=MERGE_ON_READ, reuse_inserts=cache)


def upsert(table: TableContext, df: Any, mode: str, strategy: str = "auto") -> CommitInfo:
    """Upsert a Spark DataFrame by the table key (``mode``, the resolved merge mode, must be merge-on-read).

    ``strategy``: ``auto``, ``lookup`` (the key index) or ``join`` (see :mod:`lineage.writes.spark_upsert`).
    """
    if mode != MERGE_ON_READ:
        raise InvalidArgumentError("upserts of Spark DataFrames are merge-on-read only; pass mode='merge-on-read'")
    choose_strategy(strategy, True, 0)  # a bad strategy fails before any Spark job
    spark_io.check_spark_schema(table, df)
    keys = checked_keys(table, df, strategy)
    return run_write(table, lambda state, con: plan_upsert(table, state, df, strategy, keys), mode=MERGE_ON_READ)
