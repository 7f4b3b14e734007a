"""The plan of ``Table.delete``: remove the live rows a checked predicate matches.

Files whose column bounds cannot match are pruned before any is read; the
predicate runs in a sealed DuckDB connection over the remaining live rows.
The removed rows' keys go to the key index and, when the table captures
pre-images, their values to the deleted-rows index.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from index.key_index import KeyIndexChange, index_enabled
import lineage.duck as duck
from lineage.context import TableContext
from lineage.read.scan import register_live_view
from lineage.sql.predicate import Predicate
from lineage.state import TableState
from lineage.properties import MERGE_ON_READ
from lineage.writes import grouped, key_checks
from lineage.writes.capture import old_values, split_old
from lineage.writes.plan import Plan
from lineage.writes.rows import REMOVED_COLS

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb


def delete_planner(table: TableContext, pred: Predicate, mode: str) -> Callable[[TableState, duckdb.DuckDBPyConnection], Plan]:
    """The plan function of a delete of the rows ``pred`` matches (the plan seals its connection); merge-on-read
    deletes over more than one group of rows go group by group (:mod:`lineage.writes.grouped`)."""

    def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        files = state.live_files(pred.prune)
        schema = table.arrow_schema
        key = table.key if index_enabled(state.iceberg) else []
        old = old_values(schema) if table.capture_preimages else ""
        if mode == MERGE_ON_READ and grouped.is_grouped(files):
            query = grouped.GroupQuery(f"{REMOVED_COLS}{key_checks.select_list(key)}{old}", key)
            return grouped.grouped_plan(table, state, files, pred, query, "delete", bool(old), table.field_ids())
        duck.seal(con, register_live_view(con, "live", files, schema, table.field_ids()), exact_floats=pred.reads_floats)
        rows, values = split_old(duck.fetch_arrow(con, f"SELECT {REMOVED_COLS}{key_checks.select_list(key)}{old} FROM live WHERE ({pred.sql})"), schema)
        removed = rows.select(REMOVED_COLS.split(", "))
        change = KeyIndexChange(removed_keys=rows.select(key)) if key else None
        return Plan("delete", files=files, removed=removed, removed_values=values, deleted=removed.num_rows, key_index=change)

    return plan
