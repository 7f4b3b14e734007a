"""Row-level helpers of the write paths: removed images by file, kept rows of copy-on-write, new images."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import lineage.duck as duck
from lineage.errors import KeyViolationError
from lineage.sql.predicate import quote_ident
from lineage.read.scan import register_live_view
from lineage.iceberg.schema import conform
from lineage.read.values import values_at
from lineage.state import LiveFile
from lineage.storage.deletes import positions_for
from lineage.storage.rle import decode_sequence, decode_values
from lineage.columns import HIDDEN_CREATED, HIDDEN_ROW_ID, HIDDEN_UPDATED, REMOVED_COLUMNS

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb

# The columns of a removed image: where it is (file id, position) and its lineage.
REMOVED_COLS = ", ".join(REMOVED_COLUMNS)  # a removed image: its file and position, its lineage


def with_hidden(schema: pa.Schema, hidden: Sequence[str]) -> pa.Schema:
    """``schema`` plus the hidden lineage columns ``hidden`` (required int64)."""
    return pa.schema(list(schema) + [pa.field(h, pa.int64(), nullable=False) for h in hidden])


def kept_rows(
    con: duckdb.DuckDBPyConnection,
    files: list[LiveFile],
    groups: dict[int, dict[str, np.ndarray]],
    schema: pa.Schema,
    field_ids: dict[str, int],
    copies: Mapping[str, str] | None = None,
) -> pa.Table:
    """Rows of ``files`` that stay live (copy-on-write), with their lineage, in file order (``copies``: local copies of
    remote files, read instead; see :func:`lineage.storage.prefetch.local_copies`)."""
    by_position = _kept_by_position(files, groups, schema, field_ids, copies or {})
    if by_position is not None:
        return by_position
    register_live_view(con, "affected", files, schema, field_ids, copies=copies)
    removed = pa.table(
        {
            "__file_id": np.concatenate([np.full(len(g["__pos"]), i, np.int32) for i, g in enumerate(groups.values())]),
            "__pos": np.concatenate([g["__pos"] for g in groups.values()]),
        }
    )
    con.register("removed_now", removed)
    names = ", ".join(quote_ident(c) for c in schema.names)
    return duck.fetch_arrow(
        con,
        f"SELECT {names}, _row_id AS {HIDDEN_ROW_ID}, _row_created_at_version AS {HIDDEN_CREATED}, _row_last_updated_at_version AS {HIDDEN_UPDATED} "
        "FROM affected l ANTI JOIN removed_now r ON r.__file_id = l.__file_id AND r.__pos = l.__pos "
        "ORDER BY l.__file_id, l.__pos",
    )


# Files of at most this many rows in all have their kept rows read by position (the small files a merge-on-read
# write folds); larger ones (a copy-on-write rewrite) are read by a DuckDB scan.
BY_POSITION_MAX_ROWS = 200_000


def _kept_by_position(
    files: list[LiveFile], groups: dict[int, dict[str, np.ndarray]], schema: pa.Schema, field_ids: dict[str, int],
    copies: Mapping[str, str],
) -> pa.Table | None:
    """:func:`kept_rows` read at the kept positions of each file (no query to plan), with the lineage the files carry;
    None when the files are too large, have equality or resolved deletes, or cannot be read by position."""
    if sum(int(f.data_file.record_count) for f in files) > BY_POSITION_MAX_ROWS or any(f.equality_deletes or f.resolved for f in files):
        return None
    ids, positions, lineage = [], [], []
    for i, (f, g) in enumerate(zip(files, groups.values(), strict=True)):
        keep = np.ones(int(f.data_file.record_count), bool)
        keep[positions_for(f.path, [d.file_path for d in f.deletes], copies)] = False
        keep[g["__pos"]] = False
        pos = np.flatnonzero(keep)
        ids.append(np.full(len(pos), i, np.int64))
        positions.append(pos)
        lin = f.lineage
        lineage.append((decode_sequence(lin.row_ids)[pos], decode_values(lin.created)[pos], decode_values(lin.updated)[pos]))
    values = values_at([copies.get(f.path, f.path) for f in files], np.concatenate(ids), np.concatenate(positions), schema, field_ids)
    if values is None:
        return None
    for i, name in enumerate((HIDDEN_ROW_ID, HIDDEN_CREATED, HIDDEN_UPDATED)):
        values = values.append_column(name, pa.array(np.concatenate([part[i] for part in lineage]), pa.int64()))
    return values


def group_removed(removed: pa.Table) -> dict[int, dict[str, np.ndarray]]:
    """Split removed images by file id, each sorted by position; ``__row`` is each image's row in ``removed``."""
    removed = removed.append_column("__row", pa.array(np.arange(removed.num_rows, dtype=np.int64)))
    removed = removed.sort_by([("__file_id", "ascending"), ("__pos", "ascending")])
    fid = removed.column("__file_id").to_numpy()
    bounds = np.flatnonzero(np.diff(fid)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [len(fid)]))
    cols = {c: removed.column(c).to_numpy().astype(np.int64) for c in removed.column_names if c != "__file_id"}
    return {int(fid[s]): {c: v[s:e] for c, v in cols.items()} for s, e in zip(starts, ends, strict=True)}


def by_row_id(parts: list[pa.Table]) -> pa.Table:
    """The rows of ``parts`` (tables of new images with the hidden row id column; the list is emptied) in row id
    order, as ``sort_by`` orders them.

    No copy when they are already in order, as the images of rows matched in
    file order mostly are; otherwise sorted a column at a time, each source
    column dropped once copied: when the caller holds no other reference to
    the parts (a buffer of new images about to be written), the copy costs
    one column beside them, not a second copy of every column.
    """
    images = pa.concat_tables(parts)
    parts.clear()
    order = pc.sort_indices(images.column(HIDDEN_ROW_ID))  # ascending, nulls last: as sort_by
    if order.null_count == 0 and bool((np.diff(order.to_numpy()) == 1).all()):
        return images
    schema, columns = images.schema, []
    while images.num_columns:
        columns.append(images.column(0).take(order))
        images = images.remove_column(0)
    return pa.Table.from_arrays(columns, schema=schema)


def conform_images(images: pa.Table, schema, key: Sequence[str], what: str) -> pa.Table:  # type: ignore[no-untyped-def]
    """Cast new row images to the table schema (checking required columns), keeping hidden lineage columns."""
    data = conform(images.drop_columns([HIDDEN_ROW_ID, HIDDEN_CREATED]), schema, key)
    if what == "update" and key and any(images.column(k).null_count for k in key):
        raise KeyViolationError("update would set a key column to null")
    return data.append_column(pa.field(HIDDEN_ROW_ID, pa.int64(), False), images.column(HIDDEN_ROW_ID).cast(pa.int64())).append_column(
        pa.field(HIDDEN_CREATED, pa.int64(), False), images.column(HIDDEN_CREATED).cast(pa.int64())
    )


def check_updated_keys(con: duckdb.DuckDBPyConnection, key: Sequence[str]) -> None:
    """Refuse an update that would leave two live rows with the same key."""
    cols = ", ".join(quote_ident(k) for k in key)
    clash = duck.fetch_arrow(
        con,
        f"SELECT {cols} FROM (SELECT {cols} FROM live l ANTI JOIN matched m ON m.__file_id = l.__file_id AND m.__pos = l.__pos "
        f"UNION ALL SELECT {cols} FROM matched) GROUP BY ALL HAVING count(*) > 1 LIMIT 3",
    )
    if clash.num_rows:
        raise KeyViolationError(f"update rejected: it would give several rows the same key, e.g. {clash.to_pylist()}")
