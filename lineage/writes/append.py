"""The plan of ``Table.append``: new rows with fresh row ids, refused when a key value is already live.

The batch is conformed and checked for null or duplicate keys by the caller
(:meth:`lineage.table.Table.append`); the plan checks the batch's keys
against the live rows, through the key index when the table has one, or by
a scan of the live key columns without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

from index.key_index import KeyIndex, KeyIndexChange, defers_build
import lineage.duck as duck
from lineage.context import TableContext
from lineage.errors import KeyViolationError
from lineage.properties import KEY_ENFORCE
from lineage.read.scan import register_live_view
from lineage.sql.predicate import quote_ident
from lineage.state import TableState
from lineage.writes import key_checks
from lineage.writes.plan import Plan

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb

HINT = f"use upsert to update existing rows (or set table property {KEY_ENFORCE}=false to skip this check)"


def append_planner(table: TableContext, batch: pa.Table, check_keys: bool) -> Callable[[TableState, duckdb.DuckDBPyConnection], Plan]:
    """The plan function of an append of ``batch`` (``check_keys``: refuse keys that are already live)."""
    key = table.key

    def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        index = KeyIndex.open(state) if check_keys else None
        if index is not None and defers_build(index, state.iceberg, batch.num_rows):
            # No live key to clash with (in-batch duplicates were refused by the caller); the index is built on first use.
            return Plan("append", inserts=batch, inserted=batch.num_rows)
        if index is not None:
            key_checks.reject_live_keys(index, batch.select(key), HINT)
            return Plan("append", inserts=batch, inserted=batch.num_rows, key_index=KeyIndexChange(index=index))
        files = state.live_files() if check_keys else []
        if files:  # an empty table has no key to clash with
            con.register("batch", batch.select(key))
            register_live_view(con, "live", files, table.arrow_schema, table.field_ids(), keys=("batch", key))
            names = ", ".join(quote_ident(k) for k in key)
            clash = duck.fetch_arrow(con, f"SELECT {names} FROM live LIMIT 3")
            if clash.num_rows:
                raise KeyViolationError(f"append rejected: key value(s) already in the table, e.g. {clash.to_pylist()}; {HINT}")
        return Plan("append", inserts=batch, inserted=batch.num_rows)

    return plan
