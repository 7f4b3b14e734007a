"""The plan of a keyed merge (``Table.upsert`` / ``Table.merge``): which live rows a batch updates or deletes.

:meth:`lineage.Table.merge` checks its arguments and hands the write loop
the planner :func:`merge_planner` returns. Each attempt plans in one of two
ways:

* through the key index (:mod:`lineage.writes.key_checks`): the matched rows'
  pointers and lineage come from the index, so a plain upsert reads no table
  data (with pre-image capture the write loop reads the removed rows back by
  position); with ``skip_unchanged`` only the files holding a batch key are
  scanned, since old values must be compared;
* by scanning the key columns of every live file (tables without an index).

This module never imports :mod:`lineage.table`; the table is passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from index.key_index import KeyIndex, KeyIndexChange
from lineage.context import TableContext
from lineage.errors import KeyViolationError
from lineage.sql.predicate import quote_ident
from lineage.read.scan import register_live_view
from lineage.iceberg.schema import projection_field_ids
from lineage.state import LiveFile, TableState
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID
from lineage.writes import chunked_upsert, key_checks
from lineage.writes.capture import old_names, old_values, split_old
from lineage.writes.plan import Plan
from lineage.properties import capture_preimages
from lineage.writes.rows import REMOVED_COLS, conform_images

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb


def merge_planner(
    table: TableContext, batch: pa.Table, dkeys: pa.Table | None, *, skip_unchanged: bool, operation: str, properties: dict[str, str]
) -> Callable[[TableState, duckdb.DuckDBPyConnection], Plan]:
    """The plan function of a merge of ``batch`` (upserts) and ``dkeys`` (keys to delete), both checked already.

    ``operation`` names the commit ("upsert" or "merge"); ``properties`` go
    into its snapshot summary and commit log entry.
    """
    key = table.key
    schema = table.arrow_schema
    on = " AND ".join(f"b.{quote_ident(k)} = l.{quote_ident(k)}" for k in key)
    same = " AND ".join(f"b.{quote_ident(c)} IS NOT DISTINCT FROM l.{quote_ident(c)}" for c in schema.names)
    bcols = ", ".join(f"b.{quote_ident(c)}" for c in schema.names)
    keys = ", ".join(quote_ident(k) for k in key)

    def scan_plan(state: TableState, files: list[LiveFile], con: duckdb.DuckDBPyConnection, index: KeyIndex | None) -> Plan:
        # One scan of the key columns of ``files`` finds every live row the batch touches;
        # everything below joins with that small set, never with the table again.
        register_live_view(con, "live", files, schema, projection_field_ids(state.iceberg.metadata), keys=("probe", key))
        con.execute("CREATE TEMP TABLE hits AS SELECT * FROM live")
        skip = f" AND NOT ({same})" if skip_unchanged else ""
        capture = capture_preimages(state.iceberg.metadata.properties)
        con.execute(
            f"CREATE TEMP TABLE matched AS SELECT {bcols}, l._row_id AS {HIDDEN_ROW_ID}, l._row_created_at_version AS {HIDDEN_CREATED}, "
            "l.__file_id, l.__pos, l._row_id, l._row_created_at_version, l._row_last_updated_at_version"
            f"{old_values(schema, 'l.') if capture else ''} FROM batch b JOIN hits l ON {on}{skip}"
        )
        removed, values = split_old(
            con.execute(f"SELECT {REMOVED_COLS}{key_checks.select_list(key)}{old_names(schema) if capture else ''} FROM matched").to_arrow_table(), schema
        )
        images = con.execute(f"SELECT {', '.join(quote_ident(c) for c in schema.names)}, {HIDDEN_ROW_ID}, {HIDDEN_CREATED} FROM matched").to_arrow_table()
        inserts = con.execute(f"SELECT {bcols} FROM batch b ANTI JOIN hits l ON {on}").to_arrow_table()
        images = conform_images(images, state.iceberg.schema(), key, "upsert")
        inserts = inserts.cast(schema)
        deleted = 0
        if dkeys is not None:
            gone, gone_values = split_old(
                con.execute(
                    f"SELECT {REMOVED_COLS}{key_checks.select_list(key)}{old_values(schema) if capture else ''} FROM hits l SEMI JOIN dkeys b ON {on}"
                ).to_arrow_table(), schema
            )
            deleted = gone.num_rows
            removed = pa.concat_tables([removed, gone.cast(removed.schema)])
            if values is not None and gone_values is not None:
                values = pa.concat_tables([values, gone_values])
        # the updated rows' keys are written again: only the deleted ones are tombstones (index.key_delta)
        change = KeyIndexChange(removed_keys=removed.select(key), index=index, tombstones=removed.select(key).slice(removed.num_rows - deleted)) \
            if index is not None else None
        return Plan(
            operation, files=files, removed=removed.select(REMOVED_COLS.split(", ")), removed_values=values, new_images=images, inserts=inserts,
            inserted=inserts.num_rows, updated=removed.num_rows - deleted, deleted=deleted, properties=properties, key_index=change,
        )

    def plan(state: TableState, con: duckdb.DuckDBPyConnection) -> Plan:
        files = state.live_files()
        index = KeyIndex.open(state)
        if dkeys is not None or index is None or skip_unchanged:  # DuckDB joins below; a plain indexed upsert needs none
            con.register("batch", batch)
            probe = f"SELECT {keys} FROM batch"
            if dkeys is not None:
                con.register("dkeys", dkeys)
                both = con.execute(f"SELECT b.* FROM dkeys b SEMI JOIN batch l ON {on} LIMIT 3").to_arrow_table()
                if both.num_rows:
                    raise KeyViolationError(f"keys both upserted and deleted: {both.to_pylist()}")
                probe += f" UNION ALL SELECT {keys} FROM dkeys"
            con.execute(f"CREATE TEMP TABLE probe AS {probe}")
        if index is None:
            return scan_plan(state, files, con, None)
        if skip_unchanged:
            # Old values are needed to compare: scan only the files the index says hold a batch key.
            hit = np.unique(key_checks.file_ids(files, index.lookup(con.execute("SELECT * FROM probe").to_arrow_table())))
            return scan_plan(state, [files[i] for i in hit], con, index)
        if chunked_upsert.uses_chunks(batch, index, skip_unchanged, files):
            return chunked_upsert.chunked_upsert(table, state, index, files, batch, dkeys, operation, properties)
        m = key_checks.match_upserts(index, files, batch, dkeys)
        images = m.images.append_column(pa.field(HIDDEN_ROW_ID, pa.int64(), False), m.row_ids).append_column(pa.field(HIDDEN_CREATED, pa.int64(), False), m.created)
        return Plan(
            operation, files=files, removed=m.removed, new_images=images, inserts=m.inserts, inserted=m.inserts.num_rows,
            updated=m.updated, deleted=m.deleted, properties=properties,
            key_index=KeyIndexChange(removed_keys=m.removed_keys, index=index, tombstones=m.removed_keys.slice(m.updated)),
        )

    return plan
