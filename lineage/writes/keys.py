"""Key lookup: the live images of given key values.

Write paths that work by key (change-stream ingest) ask one question of the
table: for these keys, which live image does each have? Everything they
need about the image comes back in one Arrow table, so the way the answer is
found can change in this one place (today: one scan of the key columns,
filtered by a semi join with the keys inside the Parquet scan; later the
persistent key index of DESIGN section 8).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from lineage import duck
from lineage.predicate import quote_ident
from lineage.scan import register_live_view
from lineage.schema import arrow_schema, projection_field_ids
from lineage.state import LiveFile, TableState

LINEAGE_AND_POINTER = ("_row_id", "_row_created_at_version", "_row_last_updated_at_version", "__file_id", "__pos")


@dataclass(frozen=True)
class LiveImages:
    """Live images of some keys: ``images`` rows address ``files`` by ``__file_id`` (an index into it)."""

    files: list[LiveFile]
    images: pa.Table  # key columns, [data columns,] _row_id, created, updated, __file_id, __pos


def live_images_for_keys(
    state: TableState, con: duckdb.DuckDBPyConnection, keys: str, key: Sequence[str], *, values: bool = False
) -> LiveImages:
    """The live image of every key value in the relation ``keys`` of ``con`` (keys without one are absent).

    With ``values`` the images carry every data column too (for checks of
    before-images); otherwise only the key columns, lineage and pointers.
    """
    schema = arrow_schema(state.iceberg.schema())
    files = state.live_files()
    register_live_view(con, "__key_live", files, schema, projection_field_ids(state.iceberg.metadata), keys=(keys, key))
    wanted = list(schema.names) if values else list(key)
    select = ", ".join(quote_ident(c) for c in [*wanted, *LINEAGE_AND_POINTER])
    return LiveImages(files, duck.fetch_arrow(con, f"SELECT {select} FROM __key_live"))
