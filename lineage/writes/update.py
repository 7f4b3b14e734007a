"""The plan of ``Table.update``: set columns of the rows a predicate matches to SQL expressions.

Updated rows keep their row id and created version. The expressions are
checked (:func:`lineage.writes.checks.check_expression`) and cast to their
column's type before any plan runs; a change to a key column is checked
against the live keys through the key index, or by a scan without one.

This module never imports :mod:`lineage.table`; the table is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
from pyiceberg.expressions import BooleanExpression

from index.key_index import KeyIndex, KeyIndexChange, index_enabled
import lineage.duck as duck
from lineage.context import TableContext
from lineage.duck import duckdb_types
from lineage.errors import InvalidArgumentError, UnknownColumnError
from lineage.sql.predicate import Predicate, parse_predicate, prunable_columns, quote_ident
from lineage.read.scan import LINEAGE_SCHEMA, register_live_view
from lineage.iceberg.schema import projection_field_ids
from lineage.state import TableState
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID
from lineage.writes import grouped, key_checks
from lineage.writes.capture import old_names, old_values, split_old
from lineage.writes.checks import check_expression
from lineage.writes.plan import Plan
from lineage.properties import MERGE_ON_READ, capture_preimages
from lineage.writes.rows import REMOVED_COLS, check_updated_keys, conform_images

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb


def checked_set(schema: pa.Schema, where: str | BooleanExpression | None, set_: Mapping[str, str]) -> tuple[Predicate, str]:
    """The checked ``where`` and the SELECT list of an update's new images (every data column, in order).

    Each checked expression is cast to its column's type, so ``"1.5"``,
    ``"NULL"`` or ``"'7'"`` fit any compatible column.
    """
    if not isinstance(set_, Mapping) or not set_:
        raise InvalidArgumentError("set must be a non-empty mapping of column name to SQL expression")
    unknown = [c for c in set_ if c not in schema.names]
    if unknown:
        raise UnknownColumnError(f"set names column(s) {unknown} that the table does not have (columns: {schema.names})")
    probe = pa.schema(list(schema) + LINEAGE_SCHEMA)
    pred = parse_predicate(where, probe, prunable_columns(schema))
    checked: dict[str, str] = {}
    for col, expr in set_.items():
        if not isinstance(expr, str) or not expr.strip():
            raise InvalidArgumentError(f"set[{col!r}] must be a SQL expression string, got {expr!r}")
        checked[col] = check_expression(expr, probe, col)
    types = dict(duckdb_types(schema))
    return pred, ", ".join(f"CAST({checked[c]} AS {types[c]}) AS {quote_ident(c)}" if c in checked else quote_ident(c) for c in schema.names)


def update_planner(
    table: TableContext, where: str | BooleanExpression | None, set_: Mapping[str, str], *, enforce_key: bool, mode: str
) -> Callable[[TableState, duckdb.DuckDBPyConnection], Plan]:
    """Check the arguments of an update and return its plan function (``enforce_key``: the table's key check is on).

    A merge-on-read update over more than one group of rows that sets no key column goes group by group
    (:mod:`lineage.writes.grouped`)."""
    schema = table.arrow_schema
    pred, select = checked_set(schema, where, set_)
    key_set = any(k in set_ for k in table.key) and enforce_key

    def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        index = KeyIndex.open(state) if key_set else None
        # Without an index the key check scans every file, so the plan must not prune any.
        files = state.live_files(pred.prune if index is not None or not key_set else None)
        key = table.key if index_enabled(state.iceberg) else []
        # The removed images' keys for the key index (named apart from capture's __old_<i> values).
        old_keys = "".join(f", live.{quote_ident(k)} AS {quote_ident(f'__old_key_{i}')}" for i, k in enumerate(key))
        capture = capture_preimages(state.iceberg.metadata.properties)
        if mode == MERGE_ON_READ and not key_set and grouped.is_grouped(files):
            query = grouped.GroupQuery(
                f"{select}, _row_id AS {HIDDEN_ROW_ID}, _row_created_at_version AS {HIDDEN_CREATED}, {REMOVED_COLS}{old_keys}"
                f"{old_values(schema, 'live.') if capture else ''}",
                [f"__old_key_{i}" for i in range(len(key))], [*schema.names, HIDDEN_ROW_ID, HIDDEN_CREATED],
            )
            return grouped.grouped_plan(table, state, files, pred, query, "update", capture, projection_field_ids(state.iceberg.metadata))
        duck.seal(con, register_live_view(con, "live", files, schema, projection_field_ids(state.iceberg.metadata)), exact_floats=pred.reads_floats)
        con.execute(
            f"CREATE TEMP TABLE matched AS SELECT {select}, _row_id AS {HIDDEN_ROW_ID}, _row_created_at_version AS {HIDDEN_CREATED}, "
            f"{REMOVED_COLS}{old_keys}{old_values(schema, 'live.') if capture else ''} FROM live WHERE ({pred.sql})"
        )
        removed, values = split_old(con.execute(f"SELECT {REMOVED_COLS}{old_names(schema) if capture else ''} FROM matched").to_arrow_table(), schema)
        names = ", ".join(quote_ident(c) for c in schema.names)
        images = con.execute(f"SELECT {names}, {HIDDEN_ROW_ID}, {HIDDEN_CREATED} FROM matched").to_arrow_table()
        images = conform_images(images, state.iceberg.schema(), table.key, "update")
        if index is not None:
            new_keys = duck.fetch_arrow(con, f"SELECT {key_checks.select_list(table.key)[2:]}, __file_id, __pos FROM matched")
            key_checks.reject_clashing_keys(index, files, new_keys)
        elif key_set:
            check_updated_keys(con, table.key)
        change = None
        if key:
            gone = con.execute(f"SELECT {', '.join(quote_ident(f'__old_key_{i}') for i in range(len(key)))} FROM matched").to_arrow_table()
            change = KeyIndexChange(removed_keys=gone.rename_columns(key), index=index)
        return Plan("update", files=files, removed=removed, removed_values=values, new_images=images, updated=removed.num_rows, key_index=change)

    return plan
