"""Foreign snapshots of Iceberg v3 tables: their writers kept row lineage, so it is read, not guessed.

A v3 writer (Spark, Trino, DuckDB) gives every row a ``_row_id`` that
survives updates, merges and rewrites, and a ``_last_updated_sequence_number``
that changes only when the row does (spec, "Row Lineage"). Reconciling such
a snapshot needs no pairing by key or by value: an added row whose
``_row_id`` is that of a removed row is the same row, updated when its
sequence number is the snapshot's and moved (rewritten unchanged) when it
kept an older one; every other added row is new and keeps its native id.
Only what v3 has no field for is carried from the parent: each row's created
version.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

import lineage.storage.manifests_v3 as manifests_v3
from lineage.iceberg.planning import is_v3
from lineage.iceberg.row_lineage import LAST_UPDATED, ROW_ID, NativeFile, read_row_lineage
from lineage.reconcile.pairing import Pairs
from lineage.storage.writer import WrittenFile


@dataclass(frozen=True)
class NativeAdded:
    """Native ``_row_id`` and ``_last_updated_sequence_number`` of every position of each added file, in order."""

    row_ids: list[np.ndarray]
    updated: list[np.ndarray]
    next_row_id: int  # the table's next-row-id after the snapshot


def added_lineage(iceberg: IcebergTable, snapshot: Snapshot, added: list[tuple[DataFile, np.ndarray, np.ndarray]],
                  seqs: Mapping[str, int]) -> NativeAdded | None:
    """The native lineage of the snapshot's added files, or None when the table is not v3 or a file has no row ids.

    ``seqs`` are the added files' data sequence numbers by path (rows with a
    null ``_last_updated_sequence_number`` read them).
    """
    if not is_v3(iceberg):
        return None
    ids, updated = [], []
    top = -1
    for f, _, _ in added:
        first = manifests_v3.first_row_id(f)
        if first is None:
            return None
        values = read_row_lineage(NativeFile(f, seqs.get(f.file_path, snapshot.sequence_number), first, None))
        rid = values.column(ROW_ID).to_numpy()
        ids.append(rid)
        updated.append(values.column(LAST_UPDATED).to_numpy())
        if len(rid):
            top = max(top, int(rid.max()))
    after = (snapshot.first_row_id or 0) + (snapshot.added_rows or 0) if snapshot.first_row_id is not None else 0
    return NativeAdded(ids, updated, max(after, top + 1))


def pair_by_row_id(r_rid: np.ndarray, r_from: np.ndarray, native: NativeAdded,
                   added: list[tuple[DataFile, np.ndarray, np.ndarray]]) -> Pairs:
    """Pairs of removed images (row ids ``r_rid``, valid from ``r_from``) and added live images with the same ``_row_id``.

    A pair is a move when the added image kept the removed image's sequence
    number (rewritten unchanged), else an update.
    """
    if not len(r_rid) or not added:
        return Pairs()
    a_rid = np.concatenate([ids[live] for ids, (_, live, _) in zip(native.row_ids, added, strict=True)])
    a_upd = np.concatenate([upd[live] for upd, (_, live, _) in zip(native.updated, added, strict=True)])
    order = np.argsort(r_rid, kind="stable")
    at = np.searchsorted(r_rid[order], a_rid)
    at = np.minimum(at, len(order) - 1)
    hit = r_rid[order][at] == a_rid
    added_idx = np.flatnonzero(hit).astype(np.int64)
    removed_idx = order[at[hit]].astype(np.int64)
    return Pairs(removed_idx, added_idx, a_upd[added_idx] == r_from[removed_idx])


def with_native_ids(written: list[WrittenFile], native: NativeAdded,
                    added: list[tuple[DataFile, np.ndarray, np.ndarray]]) -> list[WrittenFile]:
    """``written`` with the native values: every position's ``_row_id``, and each live row's sequence number as its
    updated version (a created version never later than it)."""
    out = []
    for w, ids, upd, (_, live, _) in zip(written, native.row_ids, native.updated, added, strict=True):
        updated = np.array(w.updated, np.int64, copy=True)
        created = np.array(w.created, np.int64, copy=True)
        updated[live] = upd[live]
        created[live] = np.minimum(created[live], updated[live])
        out.append(replace(w, row_ids=ids, created=created, updated=updated))
    return out
