"""Keyed writes through the key index: find live rows by key without scanning the key column.

:class:`lineage.Table`'s write methods plan each write; for keyed tables these
helpers answer their key questions from :class:`index.key_index.KeyIndex` in
O(k log n):

* :func:`match_upserts`: which batch rows update a live row (its pointer and
  lineage come from the index entry, so a plain upsert reads no table data)
  and which are inserts; which delete keys hit a live row;
* :func:`reject_live_keys`: append's check that no key is live already;
* :func:`reject_clashing_keys`: update's check that new keys collide neither
  with each other nor with rows the update leaves alone.

Each returns what the commit needs for :class:`index.key_index.KeyIndexChange`
(the keys of the removed images). The scan of the key columns stays only as
the builder of a missing index (``KeyIndex.build``) and as the fallback of
tables without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from index.key_index import INPUT, KeyIndex
from index.key_segment import CREATED, FILE_PATH, POS, ROW_ID, UPDATED
from lineage.errors import KeyViolationError, LineageMetadataError
from lineage.sql.predicate import quote_ident
from lineage.iceberg.schema import null_or_duplicate_keys
from lineage.state import LiveFile

REMOVED_SCHEMA = pa.schema(
    [
        pa.field("__file_id", pa.int32()),
        pa.field("__pos", pa.int64()),
        pa.field("_row_id", pa.int64()),
        pa.field("_row_created_at_version", pa.int64()),
        pa.field("_row_last_updated_at_version", pa.int64()),
    ]
)


def select_list(key: Sequence[str]) -> str:
    """``", k1, k2"``: key columns to add to a SQL select list (empty without a key)."""
    return "".join(f", {quote_ident(k)}" for k in key)


def file_ids(files: Sequence[LiveFile], hits: pa.Table) -> np.ndarray:
    """Index into ``files`` of every hit's data file (the index must point into the snapshot)."""
    paths = pa.array([f.path for f in files], pa.string())
    ids = pc.index_in(hits.column(FILE_PATH), value_set=paths)
    if ids.null_count:
        missing = hits.column(FILE_PATH).filter(ids.is_null()).unique().to_pylist()[:3]
        raise LineageMetadataError(
            f"the key index points at data files that are not in the snapshot: {missing}; run `lineage verify` and "
            "`lineage reindex TABLE`"
        )
    return ids.to_numpy(zero_copy_only=False).astype(np.int32)


def removed_pointers(files: Sequence[LiveFile], hits: pa.Table) -> pa.Table:
    """The removed-images table a write plan carries, from index hits."""
    return pa.Table.from_arrays(
        [
            pa.array(file_ids(files, hits), pa.int32()),
            hits.column(POS),
            hits.column(ROW_ID),
            hits.column(CREATED),
            hits.column(UPDATED),
        ],
        schema=REMOVED_SCHEMA,
    )


@dataclass
class UpsertMatch:
    """An upsert/merge planned through the key index."""

    removed: pa.Table  # REMOVED_SCHEMA: images updated, then images deleted
    images: pa.Table  # batch rows that update a live row + ROW_ID / CREATED columns added by the caller
    row_ids: pa.Array  # row id of each image
    created: pa.Array  # created version of each image
    inserts: pa.Table  # batch rows with no live row
    removed_keys: pa.Table  # key values of ``removed``, row for row
    updated: int
    deleted: int


def match_upserts(index: KeyIndex, files: Sequence[LiveFile], batch: pa.Table, dkeys: pa.Table | None) -> UpsertMatch:
    """Match an upsert batch (and delete keys) with the live rows through the index."""
    key = index.names
    hits = index.lookup(batch.select(key))
    matched = hits.column(INPUT).to_numpy()
    is_match = np.zeros(batch.num_rows, bool)
    is_match[matched] = True
    removed = [removed_pointers(files, hits)]
    removed_keys = [hits.select(key)]
    deleted = 0
    if dkeys is not None and dkeys.num_rows:
        gone = index.lookup(dkeys)
        deleted = gone.num_rows
        removed.append(removed_pointers(files, gone))
        removed_keys.append(gone.select(key))
    return UpsertMatch(
        removed=pa.concat_tables(removed),
        images=batch.take(pa.array(matched)),
        row_ids=hits.column(ROW_ID),
        created=hits.column(CREATED),
        inserts=batch.filter(pa.array(~is_match)),
        removed_keys=pa.concat_tables(removed_keys),
        updated=hits.num_rows,
        deleted=deleted,
    )


def reject_live_keys(index: KeyIndex, keys: pa.Table, hint: str) -> None:
    """Raise KeyViolationError when any of ``keys`` is live already."""
    clash = index.lookup(keys)
    if clash.num_rows:
        raise KeyViolationError(f"append rejected: key value(s) already in the table, e.g. {clash.select(index.names).slice(0, 3).to_pylist()}; {hint}")


def reject_clashing_keys(index: KeyIndex, files: Sequence[LiveFile], new_keys: pa.Table) -> None:
    """Refuse an update whose new keys would give two live rows the same key.

    ``new_keys`` holds the key columns of every updated row's new image and
    ``__file_id``/``__pos`` (into ``files``) of the row it replaces. A new key
    may equal another new key never, and a live key only when the update
    moves that live row to another key as well.
    """
    key = index.names
    problem = null_or_duplicate_keys(new_keys.select(key), key)
    if problem:
        raise KeyViolationError(f"update rejected: it would give several rows the same key: {problem}")
    hits = index.lookup(new_keys.select(key))
    if not hits.num_rows:
        return
    ids = pc.index_in(hits.column(FILE_PATH), value_set=pa.array([f.path for f in files], pa.string()))
    owners = pa.table({"__file_id": ids.fill_null(-1).cast(pa.int32()), "__pos": hits.column(POS), "__k": pa.array(range(hits.num_rows))})
    updated = new_keys.select(["__file_id", "__pos"]).cast(pa.schema([("__file_id", pa.int32()), ("__pos", pa.int64())]))
    untouched = owners.join(updated, keys=["__file_id", "__pos"], join_type="left anti").column("__k").to_numpy()
    if len(untouched):
        sample = hits.take(pa.array(np.sort(untouched)[:3])).select(key).to_pylist()
        raise KeyViolationError(f"update rejected: it would give several rows the same key, e.g. {sample}")
