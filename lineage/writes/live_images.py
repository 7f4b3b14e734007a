"""Key lookup: the live images of given key values.

Write paths that work by key (change-stream ingest) ask one question of the
table: for these keys, which live image does each have? Everything they
need about the image comes back in one Arrow table, so the way the answer is
found lives in this one place:

* through the key index (:class:`index.key_index.KeyIndex`) when the table
  keeps one: O(k log n), no table data read unless the images' column values
  are asked for, and then only the row groups that hold one of the images
  (:func:`lineage.read.values.values_at`), without their delete files;
* otherwise (``lineage.key-index.enabled=false``, ``lineage.key.enforce=false``)
  one scan of the key columns of every live file, filtered by a semi join
  with the keys inside the Parquet scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from index.key_index import KeyIndex
import lineage.duck as duck
from lineage.sql.predicate import quote_ident
from lineage.read.scan import register_live_view
from lineage.iceberg.schema import arrow_schema, projection_field_ids
from lineage.state import LiveFile, TableState
from lineage.writes.key_checks import removed_pointers
from lineage.read.values import values_at

if TYPE_CHECKING:  # loaded with the first DuckDB connection (lineage.duck), not with the library
    import duckdb

LINEAGE_AND_POINTER = ("_row_id", "_row_created_at_version", "_row_last_updated_at_version", "__file_id", "__pos")


@dataclass(frozen=True)
class LiveImages:
    """Live images of some keys: ``images`` rows address ``files`` by ``__file_id`` (an index into it)."""

    files: list[LiveFile]
    images: pa.Table  # key columns, [data columns,] _row_id, created, updated, __file_id, __pos


def indexed_images(index: KeyIndex, files: Sequence[LiveFile], keys: pa.Table) -> pa.Table:
    """The live image of each of ``keys`` from the index: key columns, lineage and ``__file_id`` into ``files``, ``__pos``."""
    hits = index.lookup(keys)
    pointers = removed_pointers(files, hits)
    return pa.Table.from_arrays(
        [*hits.select(index.names).columns, *(pointers.column(c) for c in LINEAGE_AND_POINTER)],
        names=[*index.names, *LINEAGE_AND_POINTER],
    )


@dataclass(frozen=True)
class HitFiles:
    """The data files that hold one of the images found in the key index."""

    files: list[LiveFile]  # in the table's file order
    ids: np.ndarray  # each image's index into ``files``

    @property
    def at_live_positions(self) -> list[LiveFile]:
        """``files`` without their delete files, for reading the images at their positions only.

        The index names live images, which no delete file removes, so there
        is nothing to subtract (a table that commits often has many small
        delete files, and reading them is most of the cost of a scan). Write
        plans take ``files``, never these.
        """
        return [replace(f, deletes=(), resolved=()) for f in self.files]


def hit_files(files: Sequence[LiveFile], images: pa.Table) -> HitFiles:
    """The files that hold one of ``images`` (addressed by ``__file_id`` into ``files``)."""
    ids = images.column("__file_id").to_numpy()
    hit = np.unique(ids)
    return HitFiles([files[i] for i in hit], np.searchsorted(hit, ids).astype(np.int32))


def live_images_for_keys(
    state: TableState,
    con: duckdb.DuckDBPyConnection,
    keys: str | pa.Table,
    key: Sequence[str],
    *,
    values: bool = False,
    index: KeyIndex | None = None,
) -> LiveImages:
    """The live image of every key value in the relation ``keys`` of ``con``, or the Arrow table ``keys``
    (keys without one are absent).

    With ``values`` the images carry every data column too (for checks of
    before-images); otherwise only the key columns, lineage and pointers.
    ``index`` is the key index of ``state`` (None: scan the key columns).
    """
    files = state.live_files()
    if isinstance(keys, pa.Table):
        if index is not None:
            return _indexed(state, con, files, keys, key, values, index)
        con.register("__lookup_keys", keys)
        keys = "__lookup_keys"
    if index is not None:
        return _indexed(state, con, files, duck.fetch_arrow(con, f"SELECT * FROM {quote_ident(keys)}"), key, values, index)
    schema, field_ids, wanted = _projection(state, key, values)
    register_live_view(con, "__key_live", files, schema, field_ids, keys=(keys, key))
    return LiveImages(files, duck.fetch_arrow(con, f"SELECT {wanted} FROM __key_live"))


def _projection(state: TableState, key: Sequence[str], values: bool) -> tuple[pa.Schema, dict[str, int], str]:
    """The table's Arrow schema, its field ids, and the select list of the images asked for."""
    schema = arrow_schema(state.iceberg.schema())
    wanted = ", ".join(quote_ident(c) for c in [*(schema.names if values else key), *LINEAGE_AND_POINTER])
    return schema, projection_field_ids(state.iceberg.metadata), wanted


def _indexed(
    state: TableState, con: duckdb.DuckDBPyConnection, files: list[LiveFile], keys: pa.Table, key: Sequence[str], values: bool, index: KeyIndex
) -> LiveImages:
    """:func:`live_images_for_keys` through the key index, for the keys of an Arrow table."""
    found = indexed_images(index, files, keys)
    if not values:
        return LiveImages(files, found)
    schema, field_ids, wanted = _projection(state, key, values)
    hit = hit_files(files, found)
    data = values_at([f.path for f in hit.files], hit.ids, found.column("__pos").to_numpy(), schema, field_ids)
    if data is not None:  # only the row groups that hold the images, through a cache of decoded row groups
        pointers = [found.column(c) for c in LINEAGE_AND_POINTER[:3]] + [pa.array(hit.ids, pa.int32()), found.column("__pos")]
        return LiveImages(hit.files, pa.Table.from_arrays([*data.columns, *pointers], names=[*schema.names, *LINEAGE_AND_POINTER]))
    # Otherwise read the files that hold a key of the batch, only at the images' positions.
    con.register("__key_rows", pa.table({"__file_id": hit.ids, "__pos": found.column("__pos")}))
    register_live_view(con, "__key_live", hit.at_live_positions, schema, field_ids)
    sql = f"SELECT {wanted} FROM __key_live v SEMI JOIN __key_rows k ON k.__file_id = v.__file_id AND k.__pos = v.__pos"
    return LiveImages(hit.files, duck.fetch_arrow(con, sql))
