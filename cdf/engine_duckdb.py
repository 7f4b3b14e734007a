"""The change feed in DuckDB, the embedded default engine.

Pointers (metadata) select the images; their values are read from the Parquet
files with row-group granularity; the feed itself is the SQL of
:mod:`cdf.plan` rendered for DuckDB.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from cdf.dialect import DUCKDB
from cdf.output import change_schema, commits_table, conform, deleted_schema
from cdf.plan import changes_sql
from cdf.pointers import change_pointers, deletion_pointers, fetch_values
from lineage import duck
from lineage.state import TableState


def images_table(pointers: pa.Table, data: pa.Schema) -> pa.Table:
    """Pointers joined with the values they point at (same row order)."""
    values = fetch_values(pointers, data.names)
    out = pointers.drop_columns(["file_path", "pos"])
    keep = pc.invert(out.column("_purged")) if "_purged" in out.column_names else None
    for field in data:
        col = values.column(field.name).cast(field.type) if values.num_columns else pa.nulls(0, field.type)
        if keep is not None:  # erased images: every data column reads as null
            col = pc.if_else(keep, col, pa.nulls(len(col), field.type))
            field = field.with_nullable(True)
        out = out.append_column(field, col)
    return out


def changes(state: TableState, a: int, b: int, data: pa.Schema, net: bool) -> pa.Table:
    """The change feed over ``(a, b]`` as an Arrow table."""
    images = images_table(change_pointers(state, a, b), data)
    extra = ["_purged"] if "_purged" in images.column_names else []
    con = duck.connect()
    try:
        con.register("images", images)
        con.register("commits", commits_table(state.lineage.log.since(a)))
        result = con.execute(changes_sql(DUCKDB, "images", "commits", data.names, str(a), str(b), net, extra)).to_arrow_table()
    finally:
        con.close()
    return conform(result, change_schema(data, bool(extra)))


def deleted_rows(state: TableState, since: int, until: int, data: pa.Schema) -> pa.Table:
    """Rows deleted in ``(since, until]`` with their last values."""
    pointers = deletion_pointers(state, since, until)
    images = images_table(pointers, data)
    commits = commits_table(state.lineage.log.since(since))
    con = duck.connect()
    try:
        con.register("images", images)
        con.register("commits", commits)
        cols = "".join(f'i."{c}", ' for c in data.names)
        result = con.execute(
            f"SELECT {cols} i._valid_to AS _row_deleted_at_version, c._commit_timestamp AS _row_deleted_at_timestamp, "
            "i._row_id, i._row_created_at_version, i._valid_from AS _row_last_updated_at_version"
            + (", i._purged " if "_purged" in images.column_names else " ")
            + "FROM images i LEFT JOIN commits c ON c.__version = i._valid_to ORDER BY i._valid_to, i._row_id"
        ).to_arrow_table()
    finally:
        con.close()
    return conform(result, deleted_schema(data, "_purged" in images.column_names))
