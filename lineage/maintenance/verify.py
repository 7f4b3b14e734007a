"""Consistency check of a table's lineage, indexes (deleted rows, keys) and Iceberg snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow.parquet as pq

from index.deleted_rows import read_index
from index.purged import read_purged
from lineage.context import HasContext, TableContext, context_of
from lineage.storage.deletes import positions_for
from lineage.errors import LineageError
from lineage.maintenance._common import snapshot_files
from lineage.maintenance.key_index import check_key_index
from lineage.storage.metadata import read_segment, segment_object
from lineage.retention import window
from lineage.storage.rle import decode_sequence
from lineage.state import TableState, state_at
import lineage.storage.files as store


@dataclass
class VerifyReport:
    """Problems found (empty when the table is consistent) and what was checked."""

    problems: list[str] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    # Facts that are not inconsistencies but limit the change feed: gaps (lineage.reconcile.gap).
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems


def _exists(path: str) -> bool:
    return store.exists(path)


def verify(table: TableContext | HasContext, check_row_ids: bool = True) -> VerifyReport:
    """Check that lineage metadata, the deleted-rows index and the snapshot agree and every pointed file exists."""
    table = context_of(table)

    report = VerifyReport()
    p = report.problems
    try:
        table.refresh()
        state: TableState = state_at(table.iceberg)
    except LineageError as exc:
        return VerifyReport([f"cannot read the current lineage state: {exc}"])
    snap = state.snapshot
    lst = state.lineage
    if snap is None:
        return report
    if lst.version != snap.sequence_number:
        p.append(f"lineage list is for version {lst.version} but the current snapshot is version {snap.sequence_number}")
    versions = [c.version for c in lst.commits]
    if versions != sorted(set(versions)):
        p.append("commit log versions are not strictly increasing")
    if versions and versions[-1] != snap.sequence_number:
        p.append(f"commit log ends at version {versions[-1]}, snapshot is version {snap.sequence_number}")
    previous = 0
    for c in lst.commits:
        if c.gap:
            report.notes.append(
                f"gap at version {c.version}: another engine expired the snapshots after version {previous} before this "
                f"library reconciled them; version {c.version} records their net change, and change-feed ranges crossing "
                f"it raise HistoryGapError (read from version {c.version} on)"
            )
        previous = c.version
    stamps = [c.timestamp_ms for c in lst.commits]
    if stamps != sorted(stamps):
        p.append("commit log timestamps go backwards")

    for seg in lst.segments:
        if not _exists(segment_object(seg)):
            p.append(f"lineage segment missing: {seg}")
    for path in lst.resolved_deletes or ():
        if not _exists(path):
            p.append(f"resolved equality deletes missing: {path} (readers would show rows an equality delete removed)")
    try:
        live = state.live_files()
    except LineageError as exc:
        p.append(str(exc))
        return report
    data_files, delete_files = snapshot_files(state)
    report.checked.update(data_files=len(data_files), delete_files=len(delete_files), segments=len(lst.segments))
    for f in data_files + delete_files:
        if not _exists(f.file_path):
            p.append(f"file referenced by the snapshot is missing: {f.file_path}")

    max_row_id = -1
    row_ids = []
    for f in live:
        ids = decode_sequence(f.lineage.row_ids)
        if len(ids):
            max_row_id = max(max_row_id, int(ids.max()))
        if check_row_ids and _exists(f.path):
            deleted = positions_for(f.path, [d for d in f.delete_paths if _exists(d)])
            keep = np.ones(len(ids), bool)
            keep[deleted[deleted < len(ids)]] = False
            row_ids.append(ids[keep])
    if max_row_id >= lst.next_row_id:
        p.append(f"next row id {lst.next_row_id} is not above the largest row id in use ({max_row_id})")
    if check_row_ids and row_ids:
        all_ids = np.concatenate(row_ids)
        uniq, counts = np.unique(all_ids, return_counts=True)
        if (counts > 1).any():
            p.append(f"{int((counts > 1).sum())} row id(s) belong to more than one live row, e.g. {uniq[counts > 1][:5].tolist()}")
        report.checked["live_rows"] = int(len(all_ids))

    oldest = window(state).oldest
    pointed = set()
    for c in lst.log.since(oldest):
        if not c.index:
            continue
        if not _exists(c.index):
            p.append(f"deleted-rows index segment of version {c.version} is missing: {c.index}")
            continue
        try:
            seg = read_index(table.iceberg.io, c.index, with_values=True)  # a captured segment's values are checked too
        except LineageError as exc:
            p.append(str(exc))
            continue
        for e in seg.entries():
            if e.valid_to != c.version:
                p.append(f"index segment of version {c.version} records removals at version {e.valid_to}")
            if seg.captured:
                continue  # the values are in the segment: the file it names may be gone
            pointed.add(e.file_path)
            if not _exists(e.file_path):
                p.append(
                    f"data file lost: {e.file_path} is missing, but the deleted-rows index of version {c.version} points "
                    f"at row images in it; change-feed ranges including version {c.version} raise LostFileError"
                )
            elif len(e.positions) and int(e.positions.max()) >= pq.ParquetFile(store.source(e.file_path)).metadata.num_rows:
                p.append(f"index of version {c.version} points past the end of {e.file_path}")
    report.checked.update(pinned_files=len(pointed))
    if lst.purged:
        try:
            report.checked["purged_rows"] = len(read_purged(table.iceberg.io, lst.purged))
        except LineageError as exc:
            p.append(str(exc))
    for seg in lst.segments:
        try:
            read_segment(table.iceberg.io, seg)
        except LineageError as exc:
            p.append(str(exc))
    key_problems, key_checked = check_key_index(state)
    p.extend(key_problems)
    report.checked.update(key_checked)
    return report
