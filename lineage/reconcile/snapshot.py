"""Reconciling one foreign snapshot: its lineage list, derived from its parent's and its manifests.

The result is exactly what this library's own writer would have written for
the snapshot (lineage of every added data file, deleted-rows index entries,
key-index change, a commit log entry marked foreign, the next row id), and
it is written with the same code (:func:`lineage.commits.commit.build_lineage`),
under names derived from the snapshot id (``reconciled-<snapshot id>``), so
reconciling a snapshot twice, in any process, writes the same files.
Positions that the snapshot's equality deletes remove are written as a
resolved-delete file (:mod:`lineage.iceberg.equality`) that the list names.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Operation, Snapshot

from index.deleted_rows import RemovedImages
from index.key_index import KeyIndexChange, index_enabled, table_key
from lineage.commits.commit import CommitRequest, build_lineage
from lineage.storage.commit_log import user_properties
from lineage.iceberg.equality import write_resolved_deletes
from lineage.errors import KeyViolationError
from lineage.storage.fileio import overwriting
from lineage.storage.metadata import STRATEGY_EQUALITY as STRATEGY
from lineage.storage.metadata import SUMMARY_OPERATION, SUMMARY_STRATEGY, LineageList, lineage_dir
from lineage.reconcile.changes import snapshot_changes
from lineage.reconcile.images import derive_images, read_positions
from lineage.iceberg.planning import sequence_of
from lineage.reconcile.native import added_lineage, pair_by_row_id, with_native_ids
from lineage.reconcile.pairing import Pairs, pair_images
from lineage.storage.rle import decode_sequence, decode_values
from lineage.iceberg.schema import arrow_schema, projection_field_ids
from lineage.state import TableState, remember_files
from lineage.storage.writer import WrittenFile

log = logging.getLogger(__name__)


def reconciled_tag(snapshot_id: int) -> str:
    """The name prefix of every file the reconciliation of ``snapshot_id`` writes."""
    return f"reconciled-{snapshot_id}"


def reconciled_list_path(iceberg: IcebergTable, snapshot_id: int) -> str:
    """Where the reconciled lineage list of ``snapshot_id`` is kept."""
    return f"{lineage_dir(iceberg.metadata.location)}/{reconciled_tag(snapshot_id)}-list.json"


def engine_of(snapshot: Snapshot) -> str | None:
    """The engine that committed ``snapshot`` as its summary tells (None: this library's own equality strategy)."""
    props = snapshot.summary.additional_properties if snapshot.summary else {}
    if SUMMARY_OPERATION in props:
        return None
    if "flink.job-id" in props:  # before engine-name: a Flink job's commit may run in a JVM that also sets it
        return "flink"
    if props.get("engine-name"):
        return str(props["engine-name"])
    if "spark.app.id" in props:
        return "spark"
    return "unknown"


def assign_lineage(
    added: list[tuple[DataFile, np.ndarray, np.ndarray]],
    pairs: Pairs | None,
    r_rid: np.ndarray,
    r_created: np.ndarray,
    r_from: np.ndarray,
    version: int,
    next_row_id: int,
) -> tuple[list[WrittenFile], int, np.ndarray, np.ndarray, int]:
    """Lineage of every position of the ``added`` files (file, live positions, dead positions).

    ``pairs`` index the removed images (row id, created, valid-from in
    ``r_*``) and the added live images (in file order, then position): a
    paired image keeps the row id and created version, a move also its
    updated version. Unpaired live images and dead positions get fresh row ids,
    file by file, in position order. Returns the written files, the next row
    id, which removed images were paired, which were moves, and the number of
    updates.
    """
    n_added = int(sum(len(live_pos) for _, live_pos, _ in added))
    a_rid = np.full(n_added, -1, np.int64)
    a_created = np.full(n_added, version, np.int64)
    a_updated = np.full(n_added, version, np.int64)
    paired = np.zeros(len(r_rid), bool)
    moved = np.zeros(len(r_rid), bool)
    updates = 0
    if pairs is not None and len(pairs.added):
        a_rid[pairs.added] = r_rid[pairs.removed]
        a_created[pairs.added] = r_created[pairs.removed]
        a_updated[pairs.added] = np.where(pairs.move, r_from[pairs.removed], version)
        paired[pairs.removed] = True
        moved[pairs.removed[pairs.move]] = True
        updates = int((~pairs.move).sum())
    written: list[WrittenFile] = []
    offset = 0
    for f, live_pos, dead_pos in added:
        n, count = f.record_count, len(live_pos)
        rids = np.full(n, -1, np.int64)
        created = np.full(n, version, np.int64)
        updated = np.full(n, version, np.int64)
        rids[live_pos] = a_rid[offset : offset + count]
        created[live_pos] = a_created[offset : offset + count]
        updated[live_pos] = a_updated[offset : offset + count]
        fresh = np.flatnonzero(rids < 0)
        rids[fresh] = np.arange(next_row_id, next_row_id + len(fresh), dtype=np.int64)
        # Positions the snapshot deleted in its own files are never visible; version 0 keeps them out of every
        # change-feed range (the feed takes live images from lineage runs, not from delete files).
        created[dead_pos] = 0
        updated[dead_pos] = 0
        next_row_id += len(fresh)
        offset += count
        written.append(WrittenFile(f, rids, created, updated))
    return written, next_row_id, paired, moved, updates


def foreign_request(snapshot: Snapshot, **fields: Any) -> CommitRequest:
    """The commit request recording ``snapshot``: its operation and engine, plus ``fields``."""
    summary = snapshot.summary
    props = summary.additional_properties if summary else {}
    return CommitRequest(
        operation=props.get(SUMMARY_OPERATION) or (summary.operation.value if summary else "unknown"),
        iceberg_operation=summary.operation if summary else Operation.OVERWRITE,
        foreign=engine_of(snapshot),
        properties=user_properties(props),  # stream positions and checkpoints outlive the snapshot in the commit log
        **fields,
    )


def reconcile_snapshot(iceberg: IcebergTable, parent: TableState, snapshot: Snapshot) -> LineageList:
    """The lineage list of the foreign ``snapshot`` on top of ``parent`` (its parent's state); written once.

    When the parent's files were planned, the snapshot's files are derived
    from them and kept for the next step (:func:`lineage.state.remember_files`).
    """
    version = snapshot.sequence_number
    changes = snapshot_changes(iceberg, snapshot)
    images = derive_images(parent, changes)
    schema = arrow_schema(iceberg.schema())
    field_ids = projection_field_ids(iceberg.metadata)  # older files are read by field id
    columns = schema.names
    live = parent.files().files if parent.snapshot is not None else {}

    # Removed images, flat: (file, position, row id, created, valid-from) in file order.
    r_paths = sorted(images.removed)
    r_file = np.concatenate([np.full(len(images.removed[p]), i, np.int64) for i, p in enumerate(r_paths)]) if r_paths else np.zeros(0, np.int64)
    r_pos = np.concatenate([images.removed[p] for p in r_paths]) if r_paths else np.zeros(0, np.int64)
    r_rid, r_created, r_from = [], [], []
    for p in r_paths:
        fl = live[p].lineage
        pos = images.removed[p]
        r_rid.append(decode_sequence(fl.row_ids)[pos])
        r_created.append(decode_values(fl.created)[pos])
        r_from.append(decode_values(fl.updated)[pos])
    r_rid_a = np.concatenate(r_rid) if r_rid else np.zeros(0, np.int64)
    r_created_a = np.concatenate(r_created) if r_created else np.zeros(0, np.int64)
    r_from_a = np.concatenate(r_from) if r_from else np.zeros(0, np.int64)

    # Added live images, flat, in manifest order then position.
    a_counts = [len(live_pos) for _, live_pos, _ in images.added]
    keyed = bool(iceberg.schema().identifier_field_ids)
    key = [k.name for k in table_key(iceberg)] if keyed else []
    replace_op = snapshot.summary is not None and snapshot.summary.operation == Operation.REPLACE
    # Every image our equality changelog commit writes comes from an event: an unchanged row is an update,
    # as the position strategy records it, never a carried-over move. Its images pair by key alone, so only
    # the key columns are read.
    no_moves = _changelog_commit(snapshot) and bool(key) and not replace_op
    pair_columns = key if no_moves else columns
    index_keys = index_enabled(iceberg) and parent.snapshot is not None and keyed
    pairs = None
    native = added_lineage(iceberg, snapshot, images.added, {e.data_file.file_path: sequence_of(e) for e in changes.added})
    if native is not None:  # v3: the writer kept lineage
        pairs = pair_by_row_id(r_rid_a, r_from_a, native, images.added)
    removed_rows = None  # the removed images' pair_columns (or key columns), read once
    if len(r_pos) and ((sum(a_counts) and native is None) or index_keys):
        wanted = pair_columns if sum(a_counts) and native is None else key
        removed_rows = pa.concat_tables([read_positions(p, images.removed[p], wanted, schema, field_ids) for p in r_paths])
    if removed_rows is not None and sum(a_counts) and native is None:
        added_rows = pa.concat_tables([read_positions(f.file_path, pos, pair_columns, schema, field_ids) for f, pos, _ in images.added])
        pairs = pair_images(removed_rows, added_rows, [] if replace_op else key, pair_columns)
        if no_moves:
            pairs.move[:] = False
    n_added = int(sum(a_counts))
    written, next_row_id, paired_removed, moved_removed, updates = assign_lineage(
        images.added, pairs, r_rid_a, r_created_a, r_from_a, version, parent.lineage.next_row_id
    )
    if native is not None:
        written, next_row_id = with_native_ids(written, native, images.added), max(native.next_row_id, parent.lineage.next_row_id)
    inserted = n_added - (len(pairs.added) if pairs is not None else 0)
    deleted = int((~paired_removed).sum())
    if replace_op and (inserted or deleted):
        log.warning(
            "replace snapshot %s changed data: %d row(s) removed and %d added without an identical counterpart; "
            "they are recorded as deletes and inserts", snapshot.snapshot_id, deleted, inserted,
        )

    # Index entries: every removed image that is not a move (deletes and the old side of updates).
    keep = ~moved_removed
    removed_images = []
    for i, p in enumerate(r_paths):
        sel = np.flatnonzero((r_file == i) & keep)
        if len(sel):
            removed_images.append(RemovedImages(p, r_pos[sel], r_rid_a[sel], r_created_a[sel], r_from_a[sel], version))
    key_change = None
    if index_enabled(iceberg) and parent.snapshot is not None:
        removed_keys = None
        if removed_images and removed_rows is not None:
            # removed_images are the kept rows in file then position order: the order of removed_rows
            removed_keys = removed_rows.select(key).take(pa.array(np.flatnonzero(keep), pa.int64()))
        key_change = KeyIndexChange(removed_keys=removed_keys, index=images.index)

    resolved_path = None
    tag = reconciled_tag(snapshot.snapshot_id)
    created_files: list[str] = []
    if images.resolved:
        resolved_path = f"{lineage_dir(iceberg.metadata.location)}/{tag}-resolved-deletes.parquet"
        with overwriting():
            write_resolved_deletes(iceberg.io, resolved_path, images.resolved)

    def with_resolved(lst: LineageList) -> LineageList:
        if resolved_path is None:
            return lst
        return dataclasses.replace(lst, resolved_deletes=_live_resolved(lst, parent) + (resolved_path,))

    req = foreign_request(
        snapshot,
        written=written,
        delete_files=[e.data_file for e in changes.position_deletes],
        removed_files=list(changes.removed),
        removed_images=removed_images,
        inserted=inserted,
        updated=updates,
        deleted=deleted,
        transform_list=with_resolved,
        key_index=key_change,
        next_row_id=next_row_id,
    )
    kwargs = dict(version=version, snapshot_id=snapshot.snapshot_id, timestamp_ms=snapshot.timestamp_ms, tag=tag, created=created_files)
    with overwriting():  # names derived from the snapshot id, the same content whoever writes them
        try:
            built = build_lineage(iceberg, parent, req, **kwargs)  # type: ignore[arg-type]
        except KeyViolationError as exc:
            # Another engine may write duplicate keys; the table then has no key index until they are gone.
            log.warning("snapshot %s leaves duplicate keys (%s); the key index is dropped", snapshot.snapshot_id, exc)
            built = build_lineage(iceberg, parent, dataclasses.replace(req, key_index=None), **kwargs)  # type: ignore[arg-type]
    known = parent.files_if_known()
    if known is not None:
        added = [(w.data_file, fl) for w, fl in zip(written, built.lineages, strict=True)]
        new_deletes = [e.data_file for e in changes.position_deletes] + [d.delete_file for d in changes.equality_deletes]
        files = known.advance(snapshot.snapshot_id, added, built.segment_path, new_deletes, changes.removed + changes.removed_deletes, built.moved)
        if files is not None:
            remember_files(iceberg, files)
    return built.lineage_list


def _live_resolved(lst: LineageList, parent: TableState) -> tuple[str, ...]:
    """The parent's resolved-delete files that still name a live data file of the parent."""
    known = lst.resolved_deletes or ()
    if not known or parent.snapshot is None:
        return known
    live = parent.files().files
    return tuple(p for p in known if any(f.resolved and p in f.resolved for f in live.values()))


def _changelog_commit(snapshot: Snapshot) -> bool:
    """True for a commit of our equality change-stream strategy (lineage.writes.changelog_equality)."""
    return snapshot.summary is not None and snapshot.summary.additional_properties.get(SUMMARY_STRATEGY) == STRATEGY
